"""Files: an agent's instructions and skills, by path, with versions that never come back.

A path is ONE object, for its whole life: a JSON header line
``{"v": N, "path": ...}`` and the file's bytes while it exists, or the header
``{"v": N, "path": ..., "gone": true}`` alone once it is removed (a
tombstone).  Every change is one conditional write on that object, so one
write settles each race:

* Of several writers of one version, the store lets exactly one win.
* Removal replaces the file with a tombstone that keeps its version, never
  deletes it; a file made again updates the tombstone and takes its version
  + 1.  So a version never comes back, without a second object whose read
  could race with the write (the floor object of the earlier design), and
  nothing here needs a conditional delete (which fake-gcs-server ignores).

The version is a counter this driver keeps, not the backend's token, so it
is the same integer on S3 (which has nothing like generations), GCS and a
folder.  Tombstones are permanent by design: a bucket lifecycle rule must
never expire them (see deploy/README.md).

What a listing shows (docs/design.md, "What a file listing shows").  Every
backend's listing gives each object's stored size (frame included), and
nothing else of its body a reader could use on S3.  So the size says the
state: the header line is padded with spaces (JSON allows them; drivers of
the older layout read these bodies as they are) until the stored size is
``LIVE_RESIDUE`` modulo ``SIZE_MODULUS`` for a live file and ``GONE_RESIDUE``
for a tombstone.  The size is a fact about the body the object holds now,
written by the same conditional write that set the body, so it cannot be
out of date.  Bodies written before this layout have any size, so they are
told apart by a *ledger* (``AgentKeys.file_ledger``): made once per agent,
it names every file object there was when it was made with the state its
body then held, by the object's version.  A listed object the ledger names
at that version has that state (a fact: versions never come back); one it
names at another version, or one whose size says neither state, is read;
any other object was written since the ledger, in this layout, and its size
says its state.  A ledger of this layout also says whether any file key of
0.4's layout (keys.py) was there: where none, no op looks for one (a hint
taken back by whichever op meets one, ``Files._met_old``).  A
hashed path's real path is in its header only: a live one is read once
(then remembered by version), a tombstone never.

Moved stubs (docs/admin.md, "Upgrading and rolling back").  Drivers of 0.4
(eafe802, 83cc396) know no store format and read a path at its old key only
(``keys.old_path_part``).  Where that key would be empty or stale they
answer wrong (a file that exists read as null, a version given again), so
it holds a *stub* instead: a header whose ``"v"`` is no integer and which
names no ``"path"``, so every file op of 0.4 on it fails with an error
naming what to do (``int(header["v"])``, ``header["path"]``).  These
drivers, and 0.5.0's, read a stub only where the path's new key has no
object or a listing cannot tell it from a file, and take it as "nothing
here" (``is_stub``): it carries no version (a path whose new key has no
object starts at version 1, as it would with no stub), and its size says
neither state (0.5.0 reads it only where no new key shadows it).
``migrate --in-place`` leaves one at each old key it moves; a driver of
this layout creates one beside each new path it creates.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeGuard, TypeVar

from ..generations import (
    HISTORY,
    AlreadyExists,
    Create,
    Listed,
    Object,
    PreconditionFailed,
    StoreRefused,
    StoreUnavailable,
    Update,
    backoff_sleep,
    frame,
)
from ..runtime import metrics
from ..runtime.pools import ContextPool
from .cache import Bounded
from .keys import PART_MAX, AgentKeys, is_old_file_part
from .model import FILE_MAX, FILES_MAX, Agent, RequestError, compact
from .space import CAS_ROUNDS, KEEP, Contention, Space

T = TypeVar("T")

log = logging.getLogger("cloudstore")

#: Bytes of a file object's payload that always hold its whole header line.
HEADER_MAX = 8192
#: What a process keeps of which agents have no file key of 0.4's layout left (their ledgers say so).
CLEAN_BUDGET = 1024 * 1024
#: A ledger of this layout says ``"layout": LEDGER_LAYOUT`` and whether any key of 0.4's layout was listed.
LEDGER_LAYOUT = 2
#: A file object's stored size (frame included) modulo this says its state (see the module docstring).
SIZE_MODULUS = 32
LIVE_RESIDUE = 0
GONE_RESIDUE = 1
#: A moved stub's (``stub_body``): neither state, so a listing of 0.4.1 reads it, and fails on it.
STUB_RESIDUE = 2
#: What a process keeps of agents' ledgers (never changed once made, so kept as long as the budget allows).
LEDGER_BUDGET = 4 * 1024 * 1024
_NONCE_STANDIN = "0" * 32  # a frame's length does not depend on its nonce's digits, only on its lineage


def _split(payload: bytes) -> tuple[dict[str, Any], bytes]:
    head, _, data = payload.partition(b"\n")
    return json.loads(head), data


def _join(header: dict[str, Any], data: bytes = b"") -> bytes:
    """A body of the layout before sizes said states (tests write these to stand for an old store)."""
    return compact(header).encode("ascii") + b"\n" + data


def body(header: dict[str, Any], data: bytes, lineage: tuple[str, ...]) -> bytes:
    """The payload of a file object whose stored size, framed with ``lineage``, says its state.

    The header line is padded with spaces before its newline: the stored
    size is then ``GONE_RESIDUE`` (mod ``SIZE_MODULUS``) for a tombstone and
    ``LIVE_RESIDUE`` for a live file, which a listing shows on every backend.
    """
    want = GONE_RESIDUE if header.get("gone", False) else LIVE_RESIDUE
    return _padded(compact(header).encode("ascii"), data, lineage, want)


def _padded(head: bytes, data: bytes, lineage: tuple[str, ...], want: int) -> bytes:
    """``head``, spaces, a newline and ``data``: stored with ``lineage``'s frame, ``want`` modulo ``SIZE_MODULUS``."""
    framed = len(frame(_NONCE_STANDIN, b"", lineage[:HISTORY]))
    pad = (want - (framed + len(head) + 1 + len(data))) % SIZE_MODULUS
    return head + b" " * pad + b"\n" + data


def state_of_size(size: int | None) -> bool | None:
    """Whether a body of this layout with this stored size is live (True), a tombstone (False), or neither."""
    if size is None:
        return None
    residue = size % SIZE_MODULUS
    return True if residue == LIVE_RESIDUE else False if residue == GONE_RESIDUE else None


#: A moved stub's ``"v"``: 0.4's drivers fail on ``int()`` of it with this text in their error.
MOVED = "moved to the layout of cloudstore 0.5+ (store format 3): roll forward"


def stub_body(lineage: tuple[str, ...]) -> bytes:
    """A moved stub's payload (module docstring), its stored size saying neither state (``STUB_RESIDUE``).

    No ``"path"``: 0.4's listing reads every object's path from its header
    and fails on it; 83cc396's reads an object whose size says neither state,
    so it fails too (with a size saying "gone" it would skip the stub and
    list the new keys as paths ending in ``%``).  Drivers of 0.5 and later
    never judge an old key by its size: a listing skips the old keys the new
    ones shadow, and reads the others.
    """
    return _padded(compact({"v": MOVED, "moved": 3}).encode("ascii"), b"", lineage, STUB_RESIDUE)


def is_stub(header: Any) -> bool:
    """Whether a parsed header is a moved stub's: nothing here, the path's new key is the truth."""
    return isinstance(header, dict) and "moved" in header and not isinstance(header.get("v"), int)


def parsed(obj: Object | None) -> tuple[dict[str, Any] | None, bytes]:
    """(header, data) of a file object; (None, b"") for no object and for a moved stub alike."""
    if obj is None:
        return None, b""
    header, data = _split(obj.data)
    return (None, b"") if is_stub(header) else (header, data)


def ledger_body(before: dict[str, Any], old: bool) -> bytes:
    """A ledger's body: its facts, and whether any file key of 0.4's layout was there (keys.py).

    A ledger that says none was there (and was made by this layout: older
    ledgers say nothing of it; moved stubs do not count) tells a driver that
    no old key is expected for the agent: its file ops then do not look for
    one.  A hint for cost only: a driver of 0.4 run afterwards (a rollback,
    a mixed fleet) writes old keys anyway, and the op that meets one (a
    listing, a first write's stub create, a read that looked) marks the
    ledger again (``Files._met_old``).
    """
    return compact({"before": before, "layout": LEDGER_LAYOUT, "old": old}).encode("ascii")


def is_clean(record: Any) -> bool:
    """Whether a ledger's record says no file key of 0.4's layout was there when it was made."""
    return isinstance(record, dict) and record.get("layout") == LEDGER_LAYOUT and record.get("old") is False


def _live(header: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return header is not None and not header.get("gone", False)


def _summary(obj: Object) -> tuple[bool, str]:
    """What a listing needs of a file object: whether it is live, and its path (a moved stub: not live, no path)."""
    header = json.loads(obj.data.partition(b"\n")[0])
    if is_stub(header):
        return False, ""
    return _live(header), header["path"]


def _old_summary(obj: Object) -> tuple[bool, str, bool]:
    """``_summary`` of an object at a key of 0.4's layout, and whether it is a moved stub."""
    header = json.loads(obj.data.partition(b"\n")[0])
    if is_stub(header):
        return False, "", True
    return _live(header), header["path"], False


def ledger_facts(store: Any, files_prefix: str) -> tuple[dict[str, list[Any]], bool]:
    """What a ledger says of an agent's files below ``files_prefix``: facts by key part, and whether any
    key of 0.4's layout holding a file (not a moved stub) is there.  One listing, then every object's head
    read (16 at once); shared by the drivers (``Files._made``) and ``migrate --in-place``.
    """
    listed = store.list(files_prefix)
    # A pool of its own: a maker may itself run on the space's pool (a writer there), whose tasks
    # must never wait on tasks of that pool.
    with ContextPool(max_workers=16) as pool:
        objects = list(pool.map(lambda item: store.get(item.key, HEADER_MAX), listed))
    before: dict[str, list[Any]] = {}
    old = False
    for item, obj in zip(listed, objects, strict=True):
        if obj is None:
            continue  # gone since the listing
        live, path, stub = _old_summary(obj)
        part = item.key[len(files_prefix):]
        if stub:
            continue  # nothing here
        old = old or is_old_file_part(part)
        if obj.version is not None:  # of no known version: read whenever listed
            before[part] = [obj.version, live, path]
    return before, old


#: What a ledger holds of one object: (its version, live, its path), by its key below the agent's ``f/``.
Facts = dict[str, tuple[str, bool, str]]


def as_facts(before: Mapping[str, Any]) -> Facts:
    """A ledger's ``before`` (as ``ledger_facts`` makes it, or as a stored ledger holds it) as ``Facts``."""
    return {k: (str(v[0]), bool(v[1]), str(v[2])) for k, v in before.items()}


class Files:
    """file_read, file_list, file_write, file_remove, file_append."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.store = space.store
        self._ledgers: Bounded[str, Facts] = Bounded(LEDGER_BUDGET)
        self._clean: Bounded[str, bool] = Bounded(CLEAN_BUDGET)  # agents whose ledger says no old key is left
        self._marked: Bounded[str, bool] = Bounded(CLEAN_BUDGET)  # agents whose ledger this process marked
        self._making = threading.Lock()

    @staticmethod
    def _next_version(header: dict[str, Any] | None) -> int:
        """The version a write gives: one past the object's (live or tombstone), 1 where none ever was."""
        return 1 if header is None else int(header["v"]) + 1

    def _change(self, agent: Agent, path: str,
                change: Callable[[dict[str, Any] | None, bytes], tuple[Any, T]]) -> T:
        """One compare-and-set on the path's object: ``change(header, data)`` gives ``((header, data), result)``
        or ``(KEEP, result)``; the body written is padded (``body``) for the lineage of the write that makes it.

        A loop of its own, not ``Space.update``: the padding depends on the
        write's lineage (its frame's length), known only once the mode is.

        A path's first write in this layout also guards its old key (0.4's,
        where it is inline) with a moved stub, so that a driver of 0.4 run
        after it (a rollback) fails there instead of answering from nothing.
        Where the old key held a file of 0.4, the new key takes it over, then
        the stub replaces it at the version read (the other order would lose
        the file to a failure between; once per path).  Otherwise, where the
        agent's ledger is known to exist (read beside the old key, ``_seed``:
        so 0.5.0, which fails on a stub, never makes one beside it), the
        stub's create goes beside the new key's: one PUT more, no round trip
        more.  An agent with no ledger yet (its first file) gets it after the
        reply, once the ledger is made.
        """
        keys = self.space.keys(agent)
        key = keys.file(path)
        old_key = keys.old_file(path)
        if old_key is not None and any(len(p.encode("utf-8")) > PART_MAX for p in old_key.split("/")):
            old_key = None  # a key path-based servers refuse (0.4's writes there too): no stub, read as ever
        for attempt in range(CAS_ROUNDS):
            obj = self.store.get(key)
            seed = None
            if obj is None:  # the new key takes over an old one's state
                seed = self._seed(keys, path, old_key is not None)
            header, data = parsed(obj if obj is not None else seed)
            new, result = change(header, data)
            if new is KEEP:
                return result
            mode = Create() if obj is None else Update.of(obj)
            new_header, new_data = new
            payload = body(new_header, new_data, mode.lineage)
            try:
                if obj is not None or old_key is None or (seed is not None and header is None):
                    written = self.store.put(key, payload, mode)  # an old key that needs no guard, or has one
                elif seed is not None:  # a file of 0.4: the new key takes it over, then its old key is a stub
                    written = self.store.put(key, payload, mode)
                    there = self._stub_over(old_key, seed)
                    if there is not None:  # 0.4 wrote it again meanwhile: built on that instead
                        return self._rebuilt(keys, key, old_key, written, there, change)
                elif self._ledgers.get(keys.base) is not None or self._clean.get(keys.base):
                    guard: Object | None
                    written, guard = self.space.at_once(partial(self.store.put, key, payload, mode),
                                                        partial(self._guard, old_key))
                    if guard is not None:  # a file of 0.4 the ledger's word hid: built on it instead
                        return self._rebuilt(keys, key, old_key, written, guard, change)
                else:
                    written = self.store.put(key, payload, mode)
                    self.space.defer(lambda: self._guard_later(keys, old_key))
            except (AlreadyExists, PreconditionFailed):
                metrics.CAS_LOST.inc(self.store.label, metrics.current_op())
                backoff_sleep(attempt)
                continue
            if written.version is not None:  # a listing then knows a hashed path without a read
                self.space.remember_seen(key, written.version, 0, (_live(new_header), path))
            if obj is None:  # an agent's first file: its ledger, so its first listing costs no reads
                self.space.defer(lambda: self._make_ledger(keys))
            return result
        raise Contention(f"gave up after {CAS_ROUNDS} lost compare-and-set rounds on one object")

    def _seed(self, keys: AgentKeys, path: str, guarded: bool) -> Object | None:
        """``_old``; where the path's old key is one a stub guards and this process knows no ledger of the
        agent, the ledger is read beside it (one GET more, no round trip more: a first write reads it
        anyway, after its reply), so that the stub's create can go beside the new key's."""
        if not guarded or self._clean.get(keys.base) or self._ledgers.get(keys.base) is not None:
            return self._old(keys, path)
        seed, _ = self.space.at_once(partial(self._old, keys, path), partial(self._ledger_known, keys))
        if parsed(seed)[0] is not None:  # the ledger, read beside, may have said clean: not so
            self._met_old(keys)
        return seed  # type: ignore[no-any-return]

    def _stub_over(self, old_key: str, there: Object) -> Object | None:
        """Replace a file of 0.4 at ``old_key`` (as read: ``there``) with a moved stub; the object there
        instead when another write of 0.4 came between (None once a stub is there, by this or another writer).

        Only after the path's new key holds the file: the other order would
        lose the file to a failure between the two writes.
        """
        try:
            self.store.put(old_key, stub_body(Update.of(there).lineage), Update.of(there))
            return None
        except (AlreadyExists, PreconditionFailed):
            now = self.store.get(old_key)
            return now if now is not None and parsed(now)[0] is not None else None

    def _guard(self, old_key: str) -> Object | None:
        """Create a moved stub at ``old_key`` unless one is there; the object there when it holds a file of 0.4.

        Path-based servers (SeaweedFS) refuse an object where a folder of its
        name holds objects: the old key then reads as nothing, and 0.4 is
        refused it the same way, so there is nothing to guard.
        """
        try:
            self.store.put(old_key, stub_body(Create().lineage), Create())
            return None
        except StoreRefused:  # a key this server refuses (a part too long...): 0.4 is refused it as well
            return None
        except AlreadyExists:
            there = self.store.get(old_key)
            return there if there is not None and parsed(there)[0] is not None else None

    def _guard_later(self, keys: AgentKeys, old_key: str) -> None:
        """``_guard`` after the reply, once the agent's ledger exists (so no ledger is ever made beside a stub
        by 0.5.0, which would fail on it); a file of 0.4 found there only marks the ledger."""
        self._ledger(keys)
        if self._guard(old_key) is not None:
            self._met_old(keys)

    def _rebuilt(self, keys: AgentKeys, key: str, old_key: str, written: Object, there: Object,
                 change: Callable[[dict[str, Any] | None, bytes], tuple[Any, T]]) -> T:
        """The new key was just created from nothing, but the old key holds a file of 0.4 (written after this
        process learnt the agent's ledger said none was left): redo the op on that file, before answering.

        The new key is rewritten at the version just created, to the op's
        outcome on the old file (or the old file itself where the op changes
        nothing), and the old key becomes a stub at the version read, both at
        once.  Either write losing means another driver wrote meanwhile: an
        error saying the outcome is unknown, never a wrong answer.
        """
        self._met_old(keys)
        header, data = parsed(there)
        new, result = change(header, data)
        if new is KEEP:  # the op changes nothing: the new key holds the old file as it is
            new = (dict(header or {}), data)
        if written.version is None:
            raise StoreUnavailable("a file of 0.4's layout was found beside this write; outcome unknown",
                                   outcome_unknown=True)
        mode = Update.of(written)
        try:
            self.space.at_once(lambda: self.store.put(key, body(new[0], new[1], mode.lineage), mode),
                               lambda: self.store.put(old_key, stub_body(Update.of(there).lineage), Update.of(there)))
        except (AlreadyExists, PreconditionFailed) as exc:
            raise StoreUnavailable(f"a driver of 0.4 wrote this path beside this one ({exc}); outcome unknown",
                                   outcome_unknown=True) from exc
        return result

    def _old(self, keys: AgentKeys, path: str) -> Object | None:
        """The path's object in 0.4's layout (keys.py), read only where its key of this layout has none.

        Not read where this process knows the agent's ledger says no file of
        0.4 is left (a hint for cost: a listing that meets one, and any op
        that finds one, take the hint back, ``_met_old``).  A file of 0.4
        found here marks the ledger so: a new key shadows an old one only
        once a driver of this layout has written the path.
        """
        old = keys.old_file(path)
        if old is None or self._clean.get(keys.base):
            return None
        obj = self.store.get(old)
        if obj is not None and parsed(obj)[0] is not None:
            self._met_old(keys)
        return obj

    def _met_old(self, keys: AgentKeys) -> None:
        """A file of 0.4's layout is at an old key no new key shadows: no op may skip old keys from now on.

        Forgotten here at once; the ledger in the store is rewritten to say
        an old key is there (``"old": true``, its facts kept) after the
        reply, once per agent and process, so that every process that reads
        it from then on looks too.
        """
        was_clean = self._clean.pop(keys.base) is not None
        if (self._ledgers.get(keys.base) is not None and not was_clean) or self._marked.get(keys.base):
            return  # the ledger this process read already says an old key is there; or it was marked
        self._marked.put(keys.base, True, len(keys.base))
        self.space.defer(lambda: self._mark_old(keys))

    def _mark_old(self, keys: AgentKeys) -> None:
        def change(raw: bytes | None) -> tuple[Any, None]:
            if raw is None:
                return KEEP, None  # no ledger: its maker will find the old key
            record = json.loads(raw)
            if not is_clean(record):
                return KEEP, None
            return ledger_body(record["before"], True), None

        self.space.update(keys.file_ledger(), change, raw=True)

    def read(self, agent: Agent, path: str) -> dict[str, Any] | None:
        keys = self.space.keys(agent)
        obj = self.store.get(keys.file(path))
        if obj is None:
            obj = self._old(keys, path)
        header, data = parsed(obj)
        if not _live(header):
            return None
        return {"data": base64.b64encode(data).decode("ascii"), "version": int(header["v"])}

    def write(self, agent: Agent, path: str, data: bytes, version: int) -> dict[str, Any]:
        def change(header: dict[str, Any] | None, _: bytes) -> tuple[Any, dict[str, Any]]:
            now = int(header["v"]) if _live(header) else 0
            if now != version:
                return KEEP, {"reply": "stale", "version": now}
            new = self._next_version(header)
            return ({"v": new, "path": path}, data), {"reply": "wrote", "version": new}

        return self._change(agent, path, change)

    def remove(self, agent: Agent, path: str, version: int) -> bool:
        def change(header: dict[str, Any] | None, _: bytes) -> tuple[Any, bool]:
            if not _live(header) or int(header["v"]) != version:
                return KEEP, False
            return ({"v": version, "path": path, "gone": True}, b""), True

        return self._change(agent, path, change)

    def append(self, agent: Agent, path: str, data: bytes) -> int:
        def change(header: dict[str, Any] | None, old: bytes) -> tuple[Any, int]:
            kept = old if _live(header) else b""
            if len(kept) + len(data) > FILE_MAX:
                raise RequestError(f"the append would grow the file past {FILE_MAX} bytes; the file is unchanged")
            new = self._next_version(header)
            return ({"v": new, "path": path}, kept + data), new

        return self._change(agent, path, change)

    # -- listing

    def listing(self, agent: Agent, folder: str) -> list[str]:
        """Live files under ``folder``: two listings and the agent's ledger, all at once (one round trip).

        Each listed object's state comes from the ledger (objects older than
        this layout, by version) or from its size; only objects neither
        settles, and live hashed paths not seen before, are read (their heads).
        An old key (0.4's) is skipped where its path's new key is listed
        beside it, and otherwise never judged by its size (0.4 wrote it
        unpadded, or it is a moved stub): read, once per version, and where
        it holds a file the ledger's "no old key" is taken back.
        """
        keys = self.space.keys(agent)
        under = folder.rstrip("/") + "/"
        ledger, inline, hashed = self.space.at_once(
            lambda: self._ledger_known(keys), lambda: self.store.list(keys.folder(folder)),
            lambda: self.store.list(keys.hashed_files()))
        if ledger is None:  # a read: the ledger it makes is kept only where reads write back (an admin tool's: not)
            ledger = self._ledger(keys, keep=self.space.reads_write_back)
        base = keys.files()
        listed_keys = {item.key for item in inline + hashed}
        judged: list[tuple[Listed, bool | None, str | None]] = []
        olds: list[Listed] = []  # old keys no new key shadows, and no ledger fact settles
        for i, item in enumerate(inline + hashed):
            is_hashed = i >= len(inline)
            is_old = not is_hashed and is_old_file_part(item.key[len(base):])
            if is_old and self._shadowed(keys, item, listed_keys):
                continue  # an old layout's key its path's key of this layout shadows (``_old``)
            live, path = self._judge(item, ledger.get(item.key[len(base):]))
            if is_old and ledger.get(item.key[len(base):]) is None:
                olds.append(item)  # 0.4 wrote it unpadded, or it is a stub: its size says nothing
                continue
            if path is None and not is_hashed:
                path = keys.path_of(item.key)
            judged.append((item, live, path))
        for item, summary in zip(olds, self.space.listed_values(olds, _old_summary, head=HEADER_MAX, kind="old"),
                                 strict=True):
            if summary is None or summary[2]:
                continue  # gone since the listing, or a moved stub: nothing here
            self._met_old(keys)  # a file of 0.4 written since the ledger: reads and writes must find it too
            judged.append((item, summary[0], keys.path_of(item.key)))
        unsure = [item for item, live, path in judged if live is None or (live and path is None)]
        read = dict(zip((item.key for item in unsure),
                        self.space.listed_values(unsure, _summary, head=HEADER_MAX), strict=True))
        paths: list[str] = []
        for item, live, path in judged:
            if item.key in read:
                summary = read[item.key]
                if summary is None:  # gone since the listing: not a file now
                    continue
                live, path = summary[0], (path if path is not None else summary[1])
            if live and path is not None and path.startswith(under):
                paths.append(path)
        if len(paths) > FILES_MAX:
            raise RequestError(f"the folder holds more than {FILES_MAX} files; a list is never cut short")
        return sorted(paths, key=lambda p: p.encode("utf-8"))

    @staticmethod
    def _shadowed(keys: AgentKeys, item: Listed, listed_keys: set[str]) -> bool:
        """Whether an old layout's key is shadowed by its path's key of this layout, listed beside it."""
        try:
            return keys.file(keys.path_of(item.key)) in listed_keys
        except UnicodeDecodeError:  # a key no driver wrote: judged as any other
            return False

    @staticmethod
    def _judge(item: Listed, fact: tuple[str, bool, str] | None) -> tuple[bool | None, str | None]:
        """(live, path) of a listed object as far as the listing and the ledger tell; None where they don't.

        A ledger entry at the listed version is a fact about that very body;
        an entry at another version says the object was rewritten since, by
        either layout, so it is read.  An object the ledger does not name was
        written in this layout: its size says its state.
        """
        if fact is not None:
            if item.version is not None and fact[0] == item.version:
                return fact[1], fact[2]
            return None, None
        return state_of_size(item.size), None

    def _ledger_known(self, keys: AgentKeys) -> Facts | None:
        """The agent's ledger: remembered (it never changes once made), else read; None when it has none yet."""
        known = self._ledgers.get(keys.base)
        if known is not None:
            return known
        obj = self.store.get(keys.file_ledger())
        return None if obj is None else self._keep(keys, obj.data)

    def _keep(self, keys: AgentKeys, raw: bytes) -> Facts:
        record = json.loads(raw)
        facts = as_facts(record["before"])
        self._ledgers.put(keys.base, facts, len(keys.base) + len(raw) * 4)
        if is_clean(record):
            self._clean.put(keys.base, True, len(keys.base))
        return facts

    def _make_ledger(self, keys: AgentKeys) -> None:
        """``_ledger`` for its making alone (work left for after a reply)."""
        self._ledger(keys)

    def _ledger(self, keys: AgentKeys, keep: bool = True) -> Facts:
        """The agent's ledger, made when it has none: every file object it holds, read once, by version.

        Made by the first writer of a file of the agent (after its reply) or
        the first listing that finds none.  Two makers race with a create-if-
        absent; both of their ledgers are true (each entry is a fact about one
        version of one object), so whichever wins is kept.  An object written
        after the listing that made the ledger is of this layout (only drivers
        of this layout write once a ledger exists): its size says its state.

        ``keep`` False makes it for this answer alone, neither written nor
        remembered (an admin tool's listing, ``Space.reads_write_back``); a
        writer's making (``_make_ledger``, ``_guard_later``) always keeps it.
        """
        with self._making:  # one maker at a time in a process: the others then find it made
            known = self._ledger_known(keys)
            if known is not None:
                return known
            return self._made(keys, keep)

    def _made(self, keys: AgentKeys, keep: bool) -> Facts:
        before, old = ledger_facts(self.store, keys.files())
        if not keep:  # true, only not kept (nor remembered)
            return as_facts(before)
        raw = ledger_body(before, old)
        try:
            self.store.put(keys.file_ledger(), raw, Create())
        except AlreadyExists:
            obj = self.store.get(keys.file_ledger())
            if obj is not None:
                return self._keep(keys, obj.data)
        except StoreUnavailable as exc:  # still true, only not kept: the next listing makes it again
            log.warning("the agent's file ledger could not be written (%s); this listing read every object", exc)
            return as_facts(before)
        return self._keep(keys, raw)

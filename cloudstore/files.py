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
0.4's layout (keys.py) was there: where none, no op looks for one.  A
hashed path's real path is in its header only: a live one is read once
(then remembered by version), a tombstone never.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

from . import metrics
from .cache import Bounded
from .generations import (
    HISTORY,
    AlreadyExists,
    Create,
    Listed,
    Object,
    PreconditionFailed,
    StoreUnavailable,
    Update,
    backoff_sleep,
    frame,
)
from .keys import AgentKeys, is_old_file_part
from .space import CAS_ROUNDS, KEEP, Contention, ContextPool, Space
from .validate import FILE_MAX, FILES_MAX, Agent, RequestError, compact

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
    head = compact(header).encode("ascii")
    framed = len(frame(_NONCE_STANDIN, b"", lineage[:HISTORY]))
    want = GONE_RESIDUE if header.get("gone", False) else LIVE_RESIDUE
    pad = (want - (framed + len(head) + 1 + len(data))) % SIZE_MODULUS
    return head + b" " * pad + b"\n" + data


def state_of_size(size: int | None) -> bool | None:
    """Whether a body of this layout with this stored size is live (True), a tombstone (False), or neither."""
    if size is None:
        return None
    residue = size % SIZE_MODULUS
    return True if residue == LIVE_RESIDUE else False if residue == GONE_RESIDUE else None


def ledger_body(before: dict[str, Any], old: bool) -> bytes:
    """A ledger's body: its facts, and whether any file key of 0.4's layout was there (keys.py).

    A ledger that says none was there (and was made by this layout: older
    ledgers say nothing of it) tells a driver that no old key can exist for
    the agent, since only drivers of 0.4 wrote them and those do not run
    beside these: its file ops then never look for an old key.
    """
    return compact({"before": before, "layout": LEDGER_LAYOUT, "old": old}).encode("ascii")


def is_clean(record: Any) -> bool:
    """Whether a ledger's record says no file key of 0.4's layout was there when it was made."""
    return isinstance(record, dict) and record.get("layout") == LEDGER_LAYOUT and record.get("old") is False


def _live(header: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return header is not None and not header.get("gone", False)


def _summary(obj: Object) -> tuple[bool, str]:
    """What a listing needs of a file object: whether it is live, and its path."""
    header = json.loads(obj.data.partition(b"\n")[0])
    return _live(header), header["path"]


#: What a ledger holds of one object: (its version, live, its path), by its key below the agent's ``f/``.
Facts = dict[str, tuple[str, bool, str]]


class Files:
    """file_read, file_list, file_write, file_remove, file_append."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.store = space.store
        self._ledgers: Bounded[str, Facts] = Bounded(LEDGER_BUDGET)
        self._clean: Bounded[str, bool] = Bounded(CLEAN_BUDGET)  # agents whose ledger says no old key is left
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
        """
        keys = self.space.keys(agent)
        key = keys.file(path)
        for attempt in range(CAS_ROUNDS):
            obj = self.store.get(key)
            seed = obj if obj is not None else self._old(keys, path)  # the new key takes over an old one's state
            header, data = (None, b"") if seed is None else _split(seed.data)
            new, result = change(header, data)
            if new is KEEP:
                return result
            mode = Create() if obj is None else Update.of(obj)
            new_header, new_data = new
            try:
                written = self.store.put(key, body(new_header, new_data, mode.lineage), mode)
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

    def _old(self, keys: AgentKeys, path: str) -> Object | None:
        """The path's object in 0.4's layout (keys.py), read only where its key of this layout has none.

        Once the path is written in this layout its new key shadows the old
        one, which no driver writes again (``migrate --in-place`` deletes it).
        """
        old = keys.old_file(path)
        if old is None or self._clean.get(keys.base):
            return None
        return self.store.get(old)

    def read(self, agent: Agent, path: str) -> dict[str, Any] | None:
        keys = self.space.keys(agent)
        obj = self.store.get(keys.file(path))
        if obj is None:
            obj = self._old(keys, path)
        if obj is None:
            return None
        header, data = _split(obj.data)
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
        """
        keys = self.space.keys(agent)
        under = folder.rstrip("/") + "/"
        ledger, inline, hashed = self.space.at_once(
            lambda: self._ledger_known(keys), lambda: self.store.list(keys.folder(folder)),
            lambda: self.store.list(keys.hashed_files()))
        if ledger is None:
            ledger = self._ledger(keys)
        base = keys.files()
        listed_keys = {item.key for item in inline + hashed}
        judged: list[tuple[Listed, bool | None, str | None]] = []
        for i, item in enumerate(inline + hashed):
            is_hashed = i >= len(inline)
            if not is_hashed and is_old_file_part(item.key[len(base):]) and self._shadowed(keys, item, listed_keys):
                continue  # an old layout's key its path's key of this layout shadows (``_old``)
            live, path = self._judge(item, ledger.get(item.key[len(base):]))
            if path is None and not is_hashed:
                path = keys.path_of(item.key)
            judged.append((item, live, path))
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
        facts: Facts = {k: (str(v[0]), bool(v[1]), str(v[2])) for k, v in record["before"].items()}
        self._ledgers.put(keys.base, facts, len(raw) * 4)
        if is_clean(record):
            self._clean.put(keys.base, True, 256)
        return facts

    def _make_ledger(self, keys: AgentKeys) -> None:
        """``_ledger`` for its making alone (work left for after a reply)."""
        self._ledger(keys)

    def _ledger(self, keys: AgentKeys) -> Facts:
        """The agent's ledger, made when it has none: every file object it holds, read once, by version.

        Made by the first writer of a file of the agent (after its reply) or
        the first listing that finds none.  Two makers race with a create-if-
        absent; both of their ledgers are true (each entry is a fact about one
        version of one object), so whichever wins is kept.  An object written
        after the listing that made the ledger is of this layout (only drivers
        of this layout write once a ledger exists): its size says its state.
        """
        with self._making:  # one maker at a time in a process: the others then find it made
            known = self._ledger_known(keys)
            if known is not None:
                return known
            return self._made(keys)

    def _made(self, keys: AgentKeys) -> Facts:
        listed = self.store.list(keys.files())
        # A pool of its own: a maker may itself run on the space's pool (a writer there), whose tasks
        # must never wait on tasks of that pool.
        with ContextPool(max_workers=16) as pool:
            objects = list(pool.map(lambda item: self.store.get(item.key, HEADER_MAX), listed))
        base = keys.files()
        before: dict[str, list[Any]] = {}
        for item, obj in zip(listed, objects, strict=True):
            if obj is None or obj.version is None:
                continue  # gone since the listing; or of no known version: read whenever listed
            live, path = _summary(obj)
            before[item.key[len(base):]] = [obj.version, live, path]
        old = any(is_old_file_part(item.key[len(base):]) for item in listed)
        raw = ledger_body(before, old)
        try:
            self.store.put(keys.file_ledger(), raw, Create())
        except AlreadyExists:
            obj = self.store.get(keys.file_ledger())
            if obj is not None:
                return self._keep(keys, obj.data)
        except StoreUnavailable as exc:  # still true, only not kept: the next listing makes it again
            log.warning("the agent's file ledger could not be written (%s); this listing read every object", exc)
            return {k: (str(v[0]), bool(v[1]), str(v[2])) for k, v in before.items()}
        return self._keep(keys, raw)

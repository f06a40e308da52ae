"""``migrate --in-place``: move the files 0.4's layout keyed without a last ``%`` to the keys of this one.

Why.  0.4 (eafe802) kept a file at ``f/<path>``, so a file ``skills/a`` was
an object beside the folder of ``skills/a/inner.md``, and a path part could
be 400 bytes.  Path-based S3 servers (MinIO, SeaweedFS) refuse both; this
layout keys a file ``f/<path>%`` (keys.py).  Drivers of this layout read an
old key where the new one has no object, so a store keeps working without
this; the move empties the old keys (and saves the GET more a missing file
costs while a file may be left at one).

What it does, per old key (every key below an agent's ``f/`` that is inline
and does not end in ``%``): read it (a moved stub: done before, counted);
write its header and bytes at the path's key of this layout, only if
absent, padded as files.py pads (``files.body``: the stored size says its
state, so the ledger is not needed for it); read the new key back and check
it holds that version and those bytes, or a later version (a driver wrote
the path since); then overwrite the old key, only at the version read, with
a *moved stub* (files.py), never delete it.  Versions travel in the header,
so none comes back.  Why a stub: drivers of 0.4 know no store format and
read a path at its old key only, so an empty old key would let one, after a
rollback, read a file that exists as null and give its versions again; the
stub makes each of their file ops fail with an error that says to roll
forward.  Drivers of 0.5 and later read a stub as "nothing here".  An old
key with a part over 255 bytes (path-based servers refuse such a key) is
deleted as before, unguarded.  Then every path of this layout whose old key
is empty (0.5.0 made no stubs) gets a stub, so a rollback after this run
finds every path guarded: run it before rolling back to 0.4, and again
before rolling forward (it moves what 0.4 wrote meanwhile).
Last, each agent's file ledger, where no old key holding a file is left, is
rewritten to say so (``clean_ledger``), or made where the agent has none
(so that no driver of 0.5.0, which fails on a stub when it makes a ledger,
ever makes one): drivers then stop looking for old keys.

Resumable and idempotent: a rerun finds moved keys stubbed and half-moved
ones (written, not yet stubbed) verified at their new key, and stubs those.
It refuses nothing it can settle; an old key whose header names another
path than its key spells, or whose new key holds an older version, is left
where it is and named (exit 1): an operator decides.  Drivers may run
meanwhile (one at a time writes a path's new key, seeded from the old), but
run it while the drivers are stopped, as a ``migrate`` between stores is.
0.5.0's own ``migrate --in-place`` names every stub as a key it cannot move
and changes nothing (exit 1): use this release's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..generations import AlreadyExists, Create, NotFound, Overwrite, PreconditionFailed, StoreRefused, Update
from ..store.files import HEADER_MAX, body, is_clean, is_stub, ledger_body, ledger_facts, stub_body
from ..store.keys import FILE_END, PART_MAX, decode_path, is_old_file_part, old_path_part, path_part
from .progress import Progress
from .walk import WORKERS, Key, Opened, bounded, list_all, open_url


@dataclass
class Moved:
    """What a run did."""

    url: str
    moved: int = 0  # written at the new key and the old one made a stub
    resumed: int = 0  # found written (by a run cut short, or a driver) and the old one made a stub
    gone: int = 0  # listed, gone before it was read
    stubs: int = 0  # old keys found holding a stub already (moved before)
    orphans: int = 0  # stubs whose path's new key held nothing, deleted
    guarded: int = 0  # paths of this layout whose empty old key was given a stub
    ledgers: int = 0  # agents' ledgers rewritten, or made, to say no old key is left
    left: list[str] = field(default_factory=list)  # old keys left in place, with why

    @property
    def ok(self) -> bool:
        return not self.left

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "moved": self.moved, "resumed": self.resumed, "gone": self.gone,
                "stubs": self.stubs, "orphans": self.orphans, "guarded": self.guarded, "ledgers": self.ledgers,
                "left": self.left, "ok": self.ok}


def old_file_keys(keys: list[Key]) -> list[Key]:
    """The keys of files in 0.4's layout: below an agent's ``f/``, inline, not ending in ``%``."""
    return [k for k in keys if k.kind == "file" and is_old_file_part("/".join(k.parts[4:]))]


def new_key_of(key: Key, path: str) -> str:
    """The key of this layout for ``path`` of the agent that owns ``key``."""
    base = key.key[: len(key.key) - len("/".join(key.parts[4:]))]
    return base + path_part(path)


def _header(raw: bytes) -> tuple[dict[str, Any], bytes]:
    head, _, data = raw.partition(b"\n")
    return json.loads(head), data


def move_one(opened: Opened, key: Key) -> tuple[str, str]:
    """Move one old key; (outcome, detail): ``moved``, ``resumed``, ``gone``, ``stubs``, ``orphans`` or ``left``."""
    store = opened.store
    old = store.get(key.key)
    if old is None:
        return "gone", key.key
    try:
        header, data = _header(old.data)
        if is_stub(header):
            return _stub_found(opened, key, old.version)
        int(header["v"])
    except (ValueError, TypeError, KeyError, RecursionError):
        return "left", f"{key.key}: no file object a driver wrote (its header is no {{v, path}})"
    path = header.get("path")
    if not isinstance(path, str) or path_part_of_old(key) != path:
        return "left", f"{key.key}: its header names {path!r}, not the path its key spells"
    target = new_key_of(key, path)
    outcome = "moved"
    try:
        store.put(target, body(header, data, Create().lineage), Create())
    except AlreadyExists:
        outcome = "resumed"
    now = store.get(target)
    if now is None:
        return "left", f"{key.key}: {target} could not be read back"
    new_header, new_data = _header(now.data)
    if not _carries(header, data, new_header, new_data):
        return "left", f"{key.key}: {target} holds version {new_header.get('v')}, not {header['v']} or later"
    if any(len(p.encode("utf-8")) > PART_MAX for p in key.parts):
        return _delete(opened, key, old.version, outcome, target)  # a key path-based servers refuse: none kept
    try:
        store.put(key.key, stub_body(Update.of(old).lineage), Update.of(old))
    except (PreconditionFailed, AlreadyExists):  # rewritten since it was read (an old driver still runs?)
        now_old = store.get(key.key)
        if now_old is None or not is_stub(_header(now_old.data)[0]):
            return "left", f"{key.key}: rewritten while it was moved (an old driver still runs?)"
    return outcome, target


def _stub_found(opened: Opened, key: Key, version: str | None) -> tuple[str, str]:
    """A moved stub: ``stubs`` where its path's new key holds the path; an orphan (a driver's stub create
    landed and its new key's create did not) is deleted at its version: ``orphans``.

    0.5.0 fails on a stub no new key shadows (it reads it); the path never
    held a file here, so no version of it can come back.
    """
    target = new_key_of(key, path_part_of_old(key))
    if opened.store.get(target, HEADER_MAX) is not None:
        return "stubs", key.key
    return _delete(opened, key, version, "orphans", key.key)


def _delete(opened: Opened, key: Key, version: str | None, outcome: str, target: str) -> tuple[str, str]:
    """Delete an old key at the version read (no stub: its part is over 255 bytes, which path-based servers
    refuse; on the others a rolled-back 0.4 could write that path again, docs/admin.md says so)."""
    try:
        opened.store.delete(key.key, version)
    except NotFound:
        pass
    except PreconditionFailed:  # rewritten since it was read; or gone (SeaweedFS: a conditional DELETE of
        if opened.store.get(key.key) is not None:  # a missing key is 412, not 404)
            return "left", f"{key.key}: rewritten while it was moved (an old driver still runs?)"
    return outcome, target


def _carries(old: dict[str, Any], data: bytes, new: dict[str, Any], new_data: bytes) -> bool:
    """Whether the new key holds the old one's file, or what a driver made of it since.

    The same version, state and bytes (what this run, or one cut short,
    wrote); a later version (a driver's write or append); or the same
    version removed (a driver's removal: it keeps the version).
    """
    if new.get("path") != old.get("path"):
        return False
    v, new_v = int(old["v"]), int(new["v"])
    gone, new_gone = bool(old.get("gone", False)), bool(new.get("gone", False))
    return (new_v == v and gone == new_gone and new_data == data) or new_v > v or (new_v == v and new_gone)


def path_part_of_old(key: Key) -> str:
    """The path an old inline key spells."""
    return decode_path("/".join(key.parts[4:]))


def relayout(url: str, workers: int = WORKERS) -> Moved:
    """Move every old file key of the store at ``url`` (see the module docstring)."""
    opened = open_url(url)
    summary = Moved(url)
    todo = old_file_keys(list_all(opened))
    moving = Progress(len(todo), what="files", sized=False, phase="relayout move")
    for outcome, detail in bounded(lambda k: move_one(opened, k), todo, workers, done=moving.tick):
        if outcome == "left":
            summary.left.append(detail)
        else:
            setattr(summary, outcome, getattr(summary, outcome) + 1)
    moving.close()
    after = list_all(opened)
    listed = {k.key for k in after}
    files = [k for k in after if k.kind == "file"]
    guarding = Progress(len(files), what="files", sized=False, phase="relayout guard")
    summary.guarded = sum(bounded(lambda k: guard_one(opened, k, listed), files, workers, done=guarding.tick))
    guarding.close()
    still = [k for k, real in zip(old_file_keys(after), bounded(lambda k: _holds_file(opened, k),
                                                                 old_file_keys(after), workers), strict=True)
             if real]
    if not summary.left and still:
        summary.left.append("old keys were written while this ran (an old driver still runs?): run it again")
    unmoved = {k.agent for k in still}
    ledgers = {k.agent for k in after if k.agent is not None and k.parts[3:] == ["ledger"]}
    for key in after:
        if key.agent is not None and key.agent not in unmoved and key.parts[3:] == ["ledger"]:
            summary.ledgers += clean_ledger(opened, key)
    for key in after:  # an agent with files and no ledger: one made now, before any 0.5.0 makes one
        if key.kind == "file" and key.agent is not None and key.agent not in unmoved | ledgers:
            ledgers.add(key.agent)
            summary.ledgers += make_ledger(opened, key)
    return summary


def _holds_file(opened: Opened, key: Key) -> bool:
    """Whether an old key holds a file of 0.4 (not a moved stub, not gone)."""
    obj = opened.store.get(key.key, HEADER_MAX)
    return obj is not None and not is_stub(_header(obj.data)[0])


def guard_one(opened: Opened, key: Key, listed: set[str]) -> int:
    """Give a path of this layout a moved stub at its old key where that is empty; 1 if it did.

    Paths 0.5.0 made have none.  A hashed key's path is in its header (one
    GET); a path whose old key is hashed too has one key only, nothing to
    guard; a key a path-based server refuses (a part over 255 bytes, an
    object beside a folder of its name) is refused to 0.4 as well.
    """
    part = "/".join(key.parts[4:])
    base = key.key[: len(key.key) - len(part)]
    if is_old_file_part(part):
        return 0
    if part.endswith(FILE_END):
        path = decode_path(part)
    else:
        obj = opened.store.get(key.key, HEADER_MAX)
        header = None if obj is None else _header(obj.data)[0]
        if not isinstance(header, dict) or not isinstance(header.get("path"), str):
            return 0
        path = header["path"]
    old = base + old_path_part(path)
    if old == key.key or old in listed or not is_old_file_part(old[len(base):]):
        return 0
    if any(len(p.encode("utf-8")) > PART_MAX for p in old.split("/")):
        return 0
    try:
        opened.store.put(old, stub_body(Create().lineage), Create())
    except (AlreadyExists, StoreRefused):
        return 0
    return 1


def make_ledger(opened: Opened, key: Key) -> int:
    """Make the ledger of the agent owning file key ``key`` (files.py ``ledger_facts``); 1 if this made it."""
    files_prefix = key.key[: len(key.key) - len("/".join(key.parts[4:]))]
    before, old = ledger_facts(opened.store, files_prefix)
    ledger = files_prefix[: -len("f/")] + "ledger"
    try:
        opened.store.put(ledger, ledger_body(before, old), Create())
    except AlreadyExists:
        return 0
    return 1


def clean_ledger(opened: Opened, key: Key) -> int:
    """Rewrite an agent's file ledger (files.py) to say no old key is left, its other facts kept; 1 if it did.

    Drivers that read it then never look for an old key (one GET less for a
    missing file).  A driver still holding the ledger it read before goes on
    looking, which costs it only that GET.  Its facts about objects this run
    did not move (hashed paths keep their keys) stay true: they are by version.
    """
    obj = opened.store.get(key.key)
    if obj is None:
        return 0
    record = json.loads(obj.data)
    if is_clean(record):
        return 0
    before = {part: fact for part, fact in record["before"].items() if not is_old_file_part(part)}
    opened.store.put(key.key, ledger_body(before, False), Overwrite())
    return 1


def text(summary: Moved) -> str:
    lines = [f"in place: {summary.url}",
             f"moved {summary.moved}, already at their new keys {summary.resumed}, gone {summary.gone}, "
             f"stubs already {summary.stubs}, orphan stubs deleted {summary.orphans}; "
             f"paths given a stub {summary.guarded}; "
             f"ledgers marked clean or made {summary.ledgers}"]
    lines += [f"left: {why}" for why in summary.left]
    lines.append("ok: every file key of the old layout is a moved stub" if summary.ok else "NOT DONE: see 'left'")
    return "\n".join(lines)

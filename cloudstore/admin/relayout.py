"""``migrate --in-place``: move the files 0.4's layout keyed without a last ``%`` to the keys of this one.

Why.  0.4 (eafe802) kept a file at ``f/<path>``, so a file ``skills/a`` was
an object beside the folder of ``skills/a/inner.md``, and a path part could
be 400 bytes.  Path-based S3 servers (MinIO, SeaweedFS) refuse both; this
layout keys a file ``f/<path>%`` (keys.py).  Drivers of this layout read an
old key where the new one has no object, so a store keeps working without
this; the move removes the old keys (and the GET more a missing file costs
while any may be left) and makes the store one a path-based server holds.

What it does, per old key (every key below an agent's ``f/`` that is inline
and does not end in ``%``): read it; write its header and bytes at the path's key of
this layout, only if absent, padded as files.py pads (``files.body``: the
stored size says its state, so the ledger is not needed for it); read the
new key back and check it holds that version and those bytes, or a later
version (a driver wrote the path since); then delete the old key, only at
the version read.  Versions travel in the header, so none comes back.

Resumable and idempotent: a rerun finds moved keys gone and half-moved ones
(written, not yet deleted) verified at their new key, and deletes those.  It
refuses nothing it can settle; an old key whose header names another path
than its key spells, or whose new key holds an older version, is left where
it is and named (exit 1): an operator decides.  Drivers may run meanwhile
(one at a time writes a path's new key, seeded from the old), but a read
racing the move of its own file may find neither key: run it while the
drivers are stopped, as a ``migrate`` between stores is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..files import body
from ..generations import AlreadyExists, Create, NotFound, PreconditionFailed
from ..keys import decode_path, is_old_file_part, path_part
from .walk import WORKERS, Key, Opened, bounded, list_all, open_url


@dataclass
class Moved:
    """What a run did."""

    url: str
    moved: int = 0  # written at the new key and the old one deleted
    resumed: int = 0  # found written (by a run cut short, or a driver) and the old one deleted
    gone: int = 0  # listed, gone before it was read
    left: list[str] = field(default_factory=list)  # old keys left in place, with why

    @property
    def ok(self) -> bool:
        return not self.left

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "moved": self.moved, "resumed": self.resumed, "gone": self.gone,
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
    """Move one old key; (outcome, detail): ``moved``, ``resumed``, ``gone`` or ``left``."""
    store = opened.store
    old = store.get(key.key)
    if old is None:
        return "gone", key.key
    header, data = _header(old.data)
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
    same = int(new_header["v"]) == int(header["v"]) and new_header.get("gone", False) == header.get("gone", False)
    if new_header.get("path") != path or not ((same and new_data == data) or int(new_header["v"]) > int(header["v"])):
        return "left", f"{key.key}: {target} holds version {new_header.get('v')}, not {header['v']} or later"
    try:
        store.delete(key.key, old.version)
    except NotFound:
        pass
    except PreconditionFailed:  # rewritten since it was read; or gone (SeaweedFS: a conditional DELETE of
        if store.get(key.key) is not None:  # a missing key is 412, not 404)
            return "left", f"{key.key}: rewritten while it was moved (an old driver still runs?)"
    return outcome, target


def path_part_of_old(key: Key) -> str:
    """The path an old inline key spells."""
    return decode_path("/".join(key.parts[4:]))


def relayout(url: str, workers: int = WORKERS) -> Moved:
    """Move every old file key of the store at ``url`` (see the module docstring)."""
    opened = open_url(url)
    summary = Moved(url)
    todo = old_file_keys(list_all(opened))
    for outcome, detail in bounded(lambda k: move_one(opened, k), todo, workers):
        if outcome == "left":
            summary.left.append(detail)
        else:
            setattr(summary, outcome, getattr(summary, outcome) + 1)
    if not summary.left and old_file_keys(list_all(opened)):
        summary.left.append("old keys were written while this ran (an old driver still runs?): run it again")
    return summary


def text(summary: Moved) -> str:
    lines = [f"in place: {summary.url}",
             f"moved {summary.moved}, already at their new keys {summary.resumed}, gone {summary.gone}"]
    lines += [f"left: {why}" for why in summary.left]
    lines.append("ok: no file key of the old layout is left" if summary.ok else "NOT DONE: see 'left'")
    return "\n".join(lines)

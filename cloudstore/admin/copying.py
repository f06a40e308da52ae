"""What a copy of one store into another writes, key by key: the stored bytes, translated where they must be.

``migrate`` copies by these and ``verify`` checks a copy by the same ones, so both live here, below
both: kept in migrate.py, verify had to import it inside a function to dodge the cycle (migrate
runs verify at its end). ``Raw`` talks to a backend beneath ``RetryingStore`` (a copy keeps each
object's own frame: nonce and lineage); ``translator`` moves a job record's due-index entry to the
destination's prefix; ``refusal`` says which source objects must not be copied as they are. Why each
exists is told in migrate.py's docstring ("How it copies", "Hostile records").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..generations import (
    AlreadyExists,
    Create,
    Overwrite,
    RetryPolicy,
    StoreUnavailable,
    Transient,
    frame,
    retry_transient,
    unframe,
)
from ..store.keys import due_root, is_due_entry_of_part
from ..store.model import compact
from .walk import Key, Opened


class Raw:
    """One store's framed bytes as stored, with the seam's retry policy (no re-framing).

    ``RetryingStore`` frames every payload it writes with a fresh nonce; a copy
    must keep the object's own frame, so it talks to the backend directly.
    """

    def __init__(self, opened: Opened, policy: RetryPolicy = RetryPolicy()) -> None:
        self.backend = opened.store.backend
        self.policy = policy

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return retry_transient(self.policy, fn)
        except Transient as exc:
            raise StoreUnavailable(f"the store kept failing ({what}: {exc})", True) from exc

    def get(self, key: str) -> bytes | None:
        got = self._retry(lambda: self.backend.get(key), "get")
        return None if got is None else got[0]

    def create(self, key: str, raw: bytes) -> bool:
        """Write if absent; False when something is there (perhaps our own retried write: compare)."""
        try:
            self._retry(lambda: self.backend.put(key, raw, Create()), "put")
            return True
        except AlreadyExists:
            return False

    def overwrite(self, key: str, raw: bytes) -> None:
        self._retry(lambda: self.backend.put(key, raw, Overwrite()), "put")


def translator(src_root: str, dst_root: str) -> Callable[[Key, bytes], bytes]:
    """What the destination must hold for a source object: its bytes, job records' entry keys moved."""
    old, new = due_root(src_root), due_root(dst_root)

    def translate(key: Key, raw: bytes) -> bytes:
        if old == new or key.kind != "job" or not raw.startswith(b"cs2 "):
            return raw
        nonce, history, payload = unframe(raw)
        try:
            same = frame(nonce, payload, history) == raw
        except UnicodeEncodeError:  # a frame holding bytes no frame of ours holds
            same = False
        if not same:
            return raw  # a frame this code cannot reproduce: keep it (verification will say)
        try:
            record = json.loads(payload)
        except (ValueError, RecursionError):
            return raw
        if not isinstance(record, dict) or compact(record).encode("ascii") != payload:
            return raw
        places = record.get("places")
        if not isinstance(places, dict):
            return raw  # a record no driver wrote: copied as it is (drivers answer it as malformed)
        changed = False
        for entry in places.values():
            if isinstance(entry, dict) and isinstance(entry.get("entry"), str) and entry["entry"].startswith(old):
                entry["entry"] = new + entry["entry"][len(old):]
                changed = True
        return frame(nonce, compact(record).encode("ascii"), history) if changed else raw

    return translate


def refusal(root: str, key: Key, raw: bytes) -> str | None:
    """Why a source object must not be copied as it is (None: copy it): a job record naming, as its due
    entry, any key but one of its own agent's own job in the source's due index."""
    if key.kind != "job" or key.agent is None:
        return None
    _, _, payload = unframe(raw)
    try:
        record = json.loads(payload)
    except (ValueError, RecursionError):
        return None  # no JSON: names no key (the drivers answer it as a malformed job record)
    places = record.get("places") if isinstance(record, dict) else None
    if not isinstance(places, dict):
        return None
    token, job_part = f"{key.agent[0]}/{key.agent[1]}", key.parts[4]
    for place, held in places.items():
        entry = held.get("entry") if isinstance(held, dict) else None
        if entry is not None and not is_due_entry_of_part(root, token, job_part, entry):
            return (f"the job record {key.rel} names, in its {str(place)[:20]!r} place, a due entry that is not "
                    "a key of its own job; not copied")
    return None


def expectation(src: Opened, dst: Opened, src_keys: list[Key]) -> Callable[[Key], bytes | None]:
    """For a destination key, the bytes it must hold: its source object's, translated (None: no source)."""
    by_rel = {k.rel: k for k in src_keys}
    raw_src, translate = Raw(src), translator(src.root, dst.root)

    def expected(key: Key) -> bytes | None:
        src_key = by_rel.get(key.rel)
        raw = None if src_key is None else raw_src.get(src_key.key)
        return None if raw is None or src_key is None else translate(src_key, raw)

    return expected

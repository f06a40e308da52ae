"""Leases: who runs a conversation's turn, one JSON object per conversation.

Taken with a create-if-absent, taken over or renewed with a write that names
the version read (the Hudi / Litestream lock design), released by a
conditional overwrite with a tombstone rather than a delete, since
fake-gcs-server ignores preconditions on delete.  Every body holds fresh
times (and the seam adds a nonce), so S3 ETags always change.

A taker whose conditional write loses re-reads: if another holder has the
lease now, that holder won the race and this one is told ``held``, even if
``lapse_ms`` is so short the new lease could already be called lapsed.  So of
several takers at once exactly one succeeds.

Lapse is judged to the millisecond, by this driver's clock, in one place:
``lapsed()``.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from .space import KEEP, Space
from .validate import Agent


def now_ms() -> int:
    """The driver's clock in whole milliseconds since 1970."""
    return time.time_ns() // 1_000_000


def lapsed(lease: dict, lapse_ms: int, now: int) -> bool:
    """The one judgment of lapse: not renewed for ``lapse_ms`` or more."""
    return now - int(lease["renewed"]) >= lapse_ms


def _live(lease: Optional[dict]) -> bool:
    return lease is not None and not lease.get("ended", False)


class Leases:
    """take, renew, end, leases."""

    def __init__(self, space: Space) -> None:
        self.space = space

    def take(self, agent: Agent, thread: str, holder: str, lapse_ms: int) -> str:
        keys = self.space.keys(agent)
        lost_once = [False]

        def change(lease: Optional[dict]) -> tuple[Any, str]:
            now = now_ms()
            if _live(lease):
                assert lease is not None
                if lease["holder"] == holder:
                    return {**lease, "renewed": now}, "took"
                if lost_once[0] or not lapsed(lease, lapse_ms, now):
                    return KEEP, "held"
                lost_once[0] = True
                return {"thread": thread, "holder": holder, "started": now, "renewed": now}, "lapsed"
            lost_once[0] = True
            return {"thread": thread, "holder": holder, "started": now, "renewed": now}, "took"

        return self.space.update(keys.lease(thread), change)

    def renew(self, agent: Agent, thread: str, holder: str) -> bool:
        keys = self.space.keys(agent)

        def change(lease: Optional[dict]) -> tuple[Any, bool]:
            if not _live(lease) or lease["holder"] != holder:  # type: ignore[index]
                return KEEP, False
            return {**lease, "renewed": now_ms()}, True  # type: ignore[dict-item]

        return self.space.update(keys.lease(thread), change)

    def end(self, agent: Agent, thread: str, holder: str) -> None:
        keys = self.space.keys(agent)

        def change(lease: Optional[dict]) -> tuple[Any, None]:
            if not _live(lease) or lease["holder"] != holder:  # type: ignore[index]
                return KEEP, None
            return {"thread": thread, "ended": True, "at": now_ms()}, None

        self.space.update(keys.lease(thread), change)

    def forget(self, agent: Agent, thread: str) -> None:
        """Drop the lease with its conversation (``remove``)."""
        self.space.store.delete(self.space.keys(agent).lease(thread))

    def leases(self, agent: Agent, lapse_ms: int) -> list[dict]:
        keys = self.space.keys(agent)
        listed = self.space.store.list(keys.leases())
        now = now_ms()
        out = []
        for lease in self.space.listed_json(listed):
            if _live(lease):
                out.append({
                    "thread": lease["thread"],
                    "holder": lease["holder"],
                    "started": lease["started"] / 1000,
                    "renewed": lease["renewed"] / 1000,
                    "lapsed": lapsed(lease, lapse_ms, now),
                })
        out.sort(key=lambda item: item["thread"].encode("utf-8", "surrogatepass"))
        return out

"""Removing a conversation: one write commits it, the rest is cleanup a crash cannot show.

``remove`` forgets a conversation's events and its lease.  It commits with
one compare-and-set on the conversation's head (heads.py): the epoch bumped
(every event key lives under its epoch, so the old events vanish from every
read at once) and the lease ended, in the same write.  The head then names
the removed epoch in ``removed``: ``{"epoch", "at", "fence"}``.

Then two things remain, each finished by whoever reads the head next if a
crash cuts the remover short (roll forward):

* **The fence.**  A ``serve`` process that still remembers the old epoch
  appends into it with one create-if-absent.  The remover creates the old
  epoch's next event number itself, so that append fails, and the appender
  reads the head again and answers against the new epoch.  The fence's
  number goes into the head's record; fences are never deleted.
* **The deletion**, deferred.  A process may remember an old epoch whose
  last number is *behind* the real one (other machines appended since); its
  append then meets an existing event and is refused, as long as those
  events exist.  Processes trust what they remember of an epoch for at most
  ``TRUST_SECONDS`` (store time) after reading the head; the old epoch's
  events are deleted only ``PURGE_AFTER_MS`` after the removal, when no
  process can still trust that memory.  Until then they are invisible (no
  read looks in a dead epoch); after, the first reader of the head deletes
  them (or the admin's gc does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..generations import AlreadyExists, Create
from .heads import Heads, epoch_of, packed_last, without_lease
from .keys import AgentKeys, EpochKeys
from .space import KEEP, Contention, Space

#: How long a process trusts its memory of a conversation's epoch without reading the head (local monotonic
#: seconds: a purge is judged by the earliest plausible store time, 90 s on, so no clock fault overlaps them).
TRUST_SECONDS = 30.0
#: When a removed epoch's events may go: past any trusted memory, with the clocks' bound to spare.
PURGE_AFTER_MS = 90_000
#: What a remover writes at its old epoch's next number.  Never an event: no JSON event is this
#: and has no ``seq``; readers that meet it know the epoch died under them.
FENCE = b'{"fence":true}'

#: Rounds of fencing the next number before giving up (each lost one means an appender got there first).
FENCE_ROUNDS = 64

LastIn = Callable[[EpochKeys, int], int]
Layout = Callable[[AgentKeys, str, int], bool]


class Removals:
    """remove, and the roll-forward of what a remove left to do."""

    def __init__(self, space: Space, heads: Heads, last_in: LastIn, newest_first: Layout) -> None:
        self.space = space
        self.store = space.store
        self.heads = heads
        self.last_in = last_in  # the last number of an epoch, fences included
        self.layout = newest_first  # whether an epoch keeps its events newest first (keys.py): one listing

    def remove(self, keys: AgentKeys, thread: str) -> None:
        at = self.store.clock.now_ms()

        def bump(head: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
            epoch = epoch_of(head)
            # "known": how far the dying epoch's events are known to exist, so its fencer lists from there.
            record = {"epoch": epoch, "at": at, "fence": None, "known": packed_last(head)}
            new = {**without_lease(head), "epoch": epoch + 1, "removed": [*head.get("removed", []), record]}
            return new, new

        self.roll_forward(keys, thread, self.heads.update(keys, thread, bump))

    def roll_forward(self, keys: AgentKeys, thread: str, head: dict[str, Any]) -> None:
        """Fence every removed epoch not fenced yet, and purge those old enough; cheap when none."""
        for record in head.get("removed", []):
            epoch = int(record["epoch"])
            if record.get("fence") is None:
                self._fence(EpochKeys(keys, thread, epoch, self.layout(keys, thread, epoch)),
                            int(record.get("known", 0)))
            elif int(record["at"]) <= self.store.clock.earliest_ms() - PURGE_AFTER_MS:  # never early
                self._purge(EpochKeys(keys, thread, epoch, self.layout(keys, thread, epoch)), int(record["fence"]))

    def _fence(self, at: EpochKeys, known: int) -> None:
        """Take the old epoch's next number (events 1..known are known to exist), then write its number
        into the head's record."""
        for _ in range(FENCE_ROUNDS):
            seq = self.last_in(at, known) + 1
            try:
                self.store.put(at.event(seq), FENCE, Create())
                break
            except AlreadyExists:  # an appender (or another fencer) got there first: fence the next
                known = seq
        else:
            raise Contention("a removed conversation's old events kept growing while it was fenced; "
                             "the next read of it fences again")
        self._change_record(at, lambda record: {**record, "fence": record.get("fence") or seq})

    def _purge(self, at: EpochKeys, fence: int) -> None:
        """Delete a dead epoch's events and segments, below its fence; then forget its record."""
        below = [item.key for item in self.store.list(at.events()) if _below(at, item.key, fence)]
        doomed = below + [item.key for item in self.store.list(at.segments())]
        list(self.space.pool.map(self.store.delete, doomed))
        self._change_record(at, lambda record: None)

    def _change_record(self, at: EpochKeys, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        """Replace (or, for None, drop) the head's record of a removed epoch."""
        epoch = at.epoch
        def on_head(head: dict[str, Any]) -> tuple[Any, None]:
            records = head.get("removed", [])
            mine = [r for r in records if int(r["epoch"]) == epoch]
            if not mine:
                return KEEP, None
            new = change(mine[0])
            if new == mine[0]:
                return KEEP, None
            rest = [r for r in records if int(r["epoch"]) != epoch] + ([new] if new is not None else [])
            rest.sort(key=lambda r: int(r["epoch"]))
            body = {k: v for k, v in head.items() if k != "removed"}
            return ({**body, "removed": rest} if rest else body), None

        self.heads.update(at.agent, at.thread, on_head, cached=True)



def _below(at: EpochKeys, key: str, fence: int) -> bool:
    """Whether a listed key of a dead epoch is an event below its fence (a key that is no event's: kept)."""
    try:
        return at.seq_of(key) < fence
    except ValueError:
        return False

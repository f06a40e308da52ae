"""Conversations: numbered events, one object each, written only if absent.

Of any number of writers of one ``seq``, the store's create-if-absent lets
exactly one win.  ``seq`` must be last + 1: the writer checks that event
``seq - 1`` exists before creating ``seq``; events are never changed or
removed one by one, so that check cannot be undone by anyone but ``remove``.

Finding the last number without a request per event: every 64th event, its
writer also packs events ``end-63..end`` into a segment object.  ``last``
lists the (few) segment keys, then the event keys after the last segment:
three small requests however long the conversation.  ``read`` fetches whole
segments and only the tail's single events, all in parallel.

``remove`` bumps the conversation's epoch and ends its lease in one
conditional write on its head (heads.py); removal.py says what follows (a
fence, a deferred deletion) and why.  All keys of events live under their
epoch, so a conversation made again starts clean.

A ``serve`` process remembers, per conversation, the epoch, the last number
it saw and the latest events: its next append is then one conditional write
in the common case, and a loss (``taken``) drops the memory.  It trusts that
memory for ``TRUST_SECONDS`` after reading the head, then reads it again.
A memory gone stale by a removal on another machine meets the remover's
fence (or an event still there): its create fails, it reads the head again,
and answers against the new epoch, writing there if the number is free.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Optional

from .cache import Bounded
from .generations import AlreadyExists, Create, Listed, Overwrite, StoreError, frame
from .heads import Heads, epoch_of
from .keys import AgentKeys, SEQ_DIGITS, name_part
from .removal import FENCE, TRUST_SECONDS, Removals
from .space import Contention, Space
from .validate import Agent, compact

SEGMENT = 64
#: What a serve process keeps of conversations' latest events: part of cache.MEMORY_BUDGET.
RECENT_BUDGET = 16 * 1024 * 1024
#: Rounds of reading again when an epoch dies under a read (a removal racing it).
EPOCH_ROUNDS = 8

log = logging.getLogger("cloudstore")

#: A fence's stored size: a listed last event of another size is no fence, and costs no read.
_FENCE_SIZE = len(frame("0" * 32, FENCE, Create().lineage))


@dataclass
class ThreadMemory:
    """What one process knows of one conversation (within one epoch)."""

    epoch: int
    last: int
    confirmed: float  # store time of the head read this memory stands on
    recent: dict[int, str] = field(default_factory=dict)  # seq -> event JSON

    @property
    def size(self) -> int:
        """Bytes it holds, as the memory budget charges them."""
        return sum(len(raw) + 64 for raw in self.recent.values())

    def remember(self, seq: int, raw: str) -> None:
        self.recent[seq] = raw
        self.last = max(self.last, seq)
        for old in [s for s in self.recent if s <= self.last - SEGMENT]:
            del self.recent[old]


class Conversations:
    """append, read, last, threads, remove: see the module docstring."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.store = space.store
        self.memory: Bounded[str, ThreadMemory] = Bounded(RECENT_BUDGET)  # thread key prefix -> memory
        self.heads = Heads(space)
        self.removals = Removals(space, self.heads, self._last_in)
        self.clock = space.store.clock

    # -- epochs

    def _epoch(self, keys: AgentKeys, thread: str) -> int:
        """The conversation's epoch, finishing first what a removal left to do (roll forward)."""
        head = self.heads.read(keys, thread)
        if head.get("removed"):
            self.removals.roll_forward(keys, thread, head)
        return epoch_of(head)

    def _last_in(self, keys: AgentKeys, thread: str, epoch: int, known: int = 0) -> int:
        """The last number in an epoch: after the last segment (or ``known``), the last event key."""
        last, _ = self._last_listed(keys, thread, epoch, known)
        return last

    def _last_listed(self, keys: AgentKeys, thread: str, epoch: int, known: int = 0) -> tuple[int, Optional[Listed]]:
        base = keys.epoch(thread, epoch)
        start = known
        if known == 0:
            segments = self.store.list(base + "seg/")
            if segments:
                start = int(segments[-1].key[-SEQ_DIGITS:])
        after = self.store.list(base + "ev/", start_after=keys.event(thread, epoch, start) if start else None)
        return (int(after[-1].key[-SEQ_DIGITS:]), after[-1]) if after else (start, None)

    def _fenced(self, item: Optional[Listed]) -> bool:
        """Whether a listed last event is a removal's fence: the epoch died after its head was read."""
        if item is None or (item.size is not None and item.size != _FENCE_SIZE):
            return False
        obj = self.store.get(item.key)
        return obj is not None and obj.data == FENCE

    def _fresh(self, keys: AgentKeys, thread: str) -> ThreadMemory:
        """Read the epoch and last number from the store, and remember them."""
        for _ in range(EPOCH_ROUNDS):
            confirmed = self.clock.now()
            epoch = self._epoch(keys, thread)
            mem = self.memory.get(keys.thread(thread))
            same = mem is not None and mem.epoch == epoch
            last, item = self._last_listed(keys, thread, epoch, mem.last if same else 0)  # type: ignore[union-attr]
            if self._fenced(item):
                continue  # removed between the head and the listing: the head says so now
            mem = ThreadMemory(epoch, last, confirmed, mem.recent if same else {})  # type: ignore[union-attr]
            self.memory.put(keys.thread(thread), mem, mem.size)
            return mem
        raise Contention("the conversation kept being removed while it was read; read again")

    def _trusted(self, keys: AgentKeys, thread: str, seq: int) -> Optional[ThreadMemory]:
        """What this process remembers of the conversation, if recent enough to append ``seq`` on."""
        mem = self.memory.get(keys.thread(thread))
        if mem is None or mem.last != seq - 1 or self.clock.now() - mem.confirmed > TRUST_SECONDS:
            return None
        return mem

    # -- ops

    def append(self, agent: Agent, thread: str, event: dict, seq: int) -> dict:
        keys = self.space.keys(agent)
        raw = compact(event)
        mem = self._trusted(keys, thread, seq)
        for _ in range(EPOCH_ROUNDS):
            if mem is None:
                mem = self._fresh(keys, thread)
                if mem.last != seq - 1:
                    return {"reply": "taken", "last": mem.last}
            if seq == 1:  # the name before the thing it names: a crash never hides a conversation
                self.space.remember_name(keys, name_part(thread), thread)
            try:
                self.store.put(keys.event(thread, mem.epoch, seq), raw.encode("ascii"), Create())
                break
            except AlreadyExists:  # taken, or the epoch died (a fence): read again, and maybe write there
                self.memory.pop(keys.thread(thread))
                mem = None
        else:
            raise Contention("the conversation kept being removed while appending; nothing of this append was kept")
        mem.remember(seq, raw)
        self.memory.put(keys.thread(thread), mem, mem.size)
        if seq % SEGMENT == 0:
            try:
                self._pack(keys, thread, mem, seq)
            except (StoreError, Contention) as exc:  # the event is stored: packing only speeds reads
                log.warning("packing events %d-%d left for later: %s", seq - SEGMENT + 1, seq, exc)
        return {"reply": "done"}

    def _pack(self, keys: AgentKeys, thread: str, mem: ThreadMemory, end: int) -> None:
        """Write the segment ending at ``end``: the same bytes whoever writes it."""
        first = end - SEGMENT + 1
        missing = [s for s in range(first, end + 1) if s not in mem.recent]
        got = self.space.get_many(keys.event(thread, mem.epoch, s) for s in missing)
        events = dict(mem.recent)
        for s, obj in zip(missing, got):
            if obj is None:
                return  # removed under us: nothing to pack
            events[s] = obj.data.decode("ascii")
        body = "[" + ",".join(events[s] for s in range(first, end + 1)) + "]"
        self.store.put(keys.segment(thread, mem.epoch, end), body.encode("ascii"), Overwrite())

    def last(self, agent: Agent, thread: str) -> int:
        keys = self.space.keys(agent)
        return self._fresh(keys, thread).last

    def read(self, agent: Agent, thread: str, first: int) -> list[str]:
        """Event JSON texts numbered ``first`` and on, in order."""
        keys = self.space.keys(agent)
        for _ in range(EPOCH_ROUNDS):
            events = self._read_epoch(keys, thread, first, self._fresh(keys, thread))
            if events is not None:
                return events
        raise Contention("the conversation kept being removed while it was read; read again")

    def _read_epoch(self, keys: AgentKeys, thread: str, first: int, mem: ThreadMemory) -> Optional[list[str]]:
        """The events of the epoch ``mem`` stands on; None if it died while they were fetched."""
        if first > mem.last:
            return []
        segments = {
            int(item.key[-SEQ_DIGITS:])
            for item in self.store.list(keys.epoch(thread, mem.epoch) + "seg/")
        }
        wanted: list[str] = []  # keys to fetch, in order
        plan: list[tuple[str, int]] = []  # ("seg", events of it to skip) / ("ev", seq)
        seq = first
        while seq <= mem.last:
            end = ((seq - 1) // SEGMENT + 1) * SEGMENT
            if seq not in mem.recent and end in segments and end <= mem.last:
                plan.append(("seg", seq - (end - SEGMENT + 1)))  # from seq on, whatever came before
                wanted.append(keys.segment(thread, mem.epoch, end))
                seq = end + 1
            else:
                if seq not in mem.recent:
                    wanted.append(keys.event(thread, mem.epoch, seq))
                plan.append(("ev", seq))
                seq += 1
        fetched = iter(self.space.get_many(wanted))
        out: list[str] = []
        for kind, value in plan:
            if kind == "ev" and value in mem.recent:
                out.append(mem.recent[value])
                continue
            obj = next(fetched)
            if obj is None or obj.data == FENCE:
                self.memory.pop(keys.thread(thread))
                return None  # removed (and perhaps purged) while read: read the head again
            if kind == "ev":
                out.append(obj.data.decode("ascii"))
            else:
                out.extend(compact(e) for e in json.loads(obj.data)[value:])
        return out

    def threads(self, agent: Agent) -> list[dict]:
        keys = self.space.keys(agent)
        parts = self.store.list_dirs(keys.conversations())
        names = self.space.names_of(keys, parts)
        pairs = [(n, p) for n, p in zip(names, parts) if n is not None]
        lasts = list(self.space.pool.map(lambda np: self.last(agent, np[0]), pairs))
        found = [{"thread": n, "last": last} for (n, _), last in zip(pairs, lasts) if last > 0]
        found.sort(key=lambda t: t["thread"].encode("utf-8", "surrogatepass"))
        return found

    def remove(self, agent: Agent, thread: str) -> None:
        """One write commits it (removal.py): the head's epoch bumped and its lease ended together."""
        keys = self.space.keys(agent)
        self.removals.remove(keys, thread)
        self.memory.pop(keys.thread(thread))

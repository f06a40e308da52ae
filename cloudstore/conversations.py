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

``remove`` bumps the conversation's epoch (a head object written with a
condition) and then deletes the old epoch's objects; all keys of events live
under their epoch, so a conversation made again starts clean even if the
deletion is cut short.

A ``serve`` process remembers, per conversation, the epoch, the last number
it saw and the latest events: its next append is then one conditional write
in the common case, and a loss (``taken``) drops the memory.  The memory can
be stale only if another machine removes the conversation while this one
appends to it; that append is then kept in the old epoch and read by nobody
(see the README's note on removal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from .generations import AlreadyExists, Create, Overwrite
from .keys import AgentKeys, SEQ_DIGITS, name_part
from .space import Contention, Space
from .validate import Agent, compact

SEGMENT = 64


@dataclass
class ThreadMemory:
    """What one process knows of one conversation (within one epoch)."""

    epoch: int
    last: int
    recent: dict[int, str] = field(default_factory=dict)  # seq -> event JSON

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
        self.memory: dict[str, ThreadMemory] = {}  # thread key prefix -> memory

    # -- epochs

    def _epoch(self, keys: AgentKeys, thread: str) -> int:
        _, head = self.space.get_json(keys.head(thread))
        return 0 if head is None else int(head["epoch"])

    def _last_in(self, keys: AgentKeys, thread: str, epoch: int, known: int = 0) -> int:
        """The last number in an epoch: after the last segment (or ``known``), the last event key."""
        base = keys.epoch(thread, epoch)
        start = known
        if known == 0:
            segments = self.store.list(base + "seg/")
            if segments:
                start = int(segments[-1].key[-SEQ_DIGITS:])
        after = self.store.list(base + "ev/", start_after=keys.event(thread, epoch, start) if start else None)
        return int(after[-1].key[-SEQ_DIGITS:]) if after else start

    def _fresh(self, keys: AgentKeys, thread: str) -> ThreadMemory:
        """Read the epoch and last number from the store, and remember them."""
        epoch = self._epoch(keys, thread)
        mem = self.memory.get(keys.thread(thread))
        known = mem.last if mem is not None and mem.epoch == epoch else 0
        mem = ThreadMemory(epoch, self._last_in(keys, thread, epoch, known),
                           mem.recent if mem is not None and mem.epoch == epoch else {})
        self.memory[keys.thread(thread)] = mem
        return mem

    # -- ops

    def append(self, agent: Agent, thread: str, event: dict, seq: int) -> dict:
        keys = self.space.keys(agent)
        mem = self.memory.get(keys.thread(thread))
        if mem is None or mem.last != seq - 1:
            mem = self._fresh(keys, thread)
            if mem.last != seq - 1:
                return {"reply": "taken", "last": mem.last}
        raw = compact(event)
        try:
            self.store.put(keys.event(thread, mem.epoch, seq), raw.encode("ascii"), Create())
        except AlreadyExists:
            self.memory.pop(keys.thread(thread), None)
            return {"reply": "taken", "last": self._fresh(keys, thread).last}
        mem.remember(seq, raw)
        if seq == 1:
            self.space.remember_name(keys, name_part(thread), thread)
        if seq % SEGMENT == 0:
            self._pack(keys, thread, mem, seq)
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
        mem = self._fresh(keys, thread)
        if first > mem.last:
            return []
        segments = {
            int(item.key[-SEQ_DIGITS:])
            for item in self.store.list(keys.epoch(thread, mem.epoch) + "seg/")
        }
        wanted: list[str] = []  # keys to fetch, in order
        plan: list[tuple[str, Any]] = []  # ("seg", (end, key)) / ("ev", seq)
        seq = first
        while seq <= mem.last:
            end = ((seq - 1) // SEGMENT + 1) * SEGMENT
            if seq not in mem.recent and end in segments and end <= mem.last:
                key = keys.segment(thread, mem.epoch, end)
                plan.append(("seg", end))
                wanted.append(key)
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
            if obj is None:
                raise Contention("the conversation changed while it was read (removed?); read again")
            if kind == "ev":
                out.append(obj.data.decode("ascii"))
            else:
                events = json.loads(obj.data)
                skip = max(0, first - (value - SEGMENT + 1))
                out.extend(compact(e) for e in events[skip:])
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
        """Bump the epoch, then delete the old epoch's objects (best effort)."""
        keys = self.space.keys(agent)

        def bump(head: Optional[dict]) -> tuple[dict, int]:
            epoch = 0 if head is None else int(head["epoch"])
            return {"epoch": epoch + 1}, epoch

        epoch = self.space.update(keys.head(thread), bump)
        self.memory.pop(keys.thread(thread), None)
        old = self.store.list(keys.epoch(thread, epoch))
        list(self.space.pool.map(lambda item: self.store.delete(item.key), old))

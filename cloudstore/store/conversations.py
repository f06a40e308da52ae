"""Conversations: numbered events, one object each, written only if absent.

Of any number of writers of one ``seq``, the store's create-if-absent lets
exactly one win.  ``seq`` must be last + 1: the writer checks that event
``seq - 1`` exists before creating ``seq``; events are never changed or
removed one by one, so that check cannot be undone by anyone but ``remove``.

Reading many events in few objects: every aligned block of 32, 64 ... 4,096
events is also written packed (packing.py), by whoever appended its last
event, after the reply when it runs as a driver, and the events after the
last block of 32 as a tail, by the first reader that fetched them one by
one (packing.py, "Tails"); a read fetches a few whole blocks and the tail,
all at once.  Finding the last number without a request per event:
event keys sort newest first (keys.py), so the conversation's first key is
its newest event; ``last`` reads the head and lists that one key at once,
two requests in one round trip however long the conversation, and a read
fetches its blocks one round trip after.  A long conversation's head also
names how far it is packed (moved on every ``PREFETCH_HINT_EVERY`` events,
after the reply, by the packer): a read asks for those blocks as soon as the
head is in, while the listing is still on its way, so the bulk of a long read
travels (and is parsed) beside the listing and only its tail after it.
Conversations 0.3.0 began keep its
oldest-first layout: the head names how far their events are packed
(refreshed every ``HINT_EVERY`` events), and ``last`` lists the event keys
after that, a round trip later.

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

What is read back is believed only as its key allows (stored.py): an event
is strict JSON whose ``seq`` is its key's number, a packed block a list of
exactly the events of its range, each with its number (a block lying about
its range is not used: its halves are read instead); heads are checked by
heads.py.  Every key a read fetches is built by keys.py from the request's
agent and thread; what stored objects and keys name is only numbers, and a
number no conversation can reach (a key or a hint past what one read can
answer) costs at most ``GATHER_WINDOW`` requests a round and
``PREFETCH_MAX`` asked ahead, never a list as long as the number.  Anything
else makes the op answer an error naming the object's kind.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..generations import AlreadyExists, Create, Listed, Object, Overwrite, StoreError, frame
from . import packing, stored
from .cache import Bounded
from .heads import Heads, epoch_of, packed_last, packed_newest, with_packed
from .keys import AgentKeys, EpochKeys, conversation_key, name_part
from .model import Agent, RequestError, compact
from .packing import Piece, cover, packed_at
from .removal import FENCE, TRUST_SECONDS, Removals
from .space import KEEP, Contention, Space

#: The latest events a serve process keeps of a conversation it writes (blocks up to this are packed from memory).
RECENT_KEPT = 128
#: The head's packing hint moves on every this many events: a head write that often, a listing at most this long.
HINT_EVERY = 64
#: In the newest-first layout the hint moves on every this many events (a head write that often): a read
#: fetches the blocks up to it beside the listing, and at most this many events' blocks after it.
PREFETCH_HINT_EVERY = 512
#: What a serve process keeps of conversations' latest events: part of cache.CACHE_BUDGET.
RECENT_BUDGET = 16 * 1024 * 1024
#: Rounds of reading again when an epoch dies under a read (a removal racing it).
EPOCH_ROUNDS = 8
#: Pieces one round of a read asks for at most: a missing block's halves come first in the next
#: round, so a read of a range that was never written stops at its first missing event quickly.
GATHER_WINDOW = 256
#: Blocks a read asks for from the head's hint before the listing is in, at most.
PREFETCH_MAX = 256
#: Events one read answers at most: past any reply a line can carry (and what a stray key may claim).
READ_SPAN_MAX = 2**24
EVENT = "conversation event"
NAME = "conversation name record"

log = logging.getLogger("cloudstore")

#: A fence's stored size: a listed last event of another size is no fence, and costs no read.
_FENCE_SIZE = len(frame("0" * 32, FENCE, Create().lineage))


@dataclass
class Early:
    """Blocks a read asked for before it knew the last number: of one epoch, by piece, each (object, parsed)."""

    epoch: int
    blocks: dict[Piece, Future[tuple[Object | None, Any]]]


@dataclass
class ThreadMemory:
    """What one process knows of one conversation (within one epoch)."""

    epoch: int
    last: int
    confirmed: float  # local monotonic time of the head read this memory stands on: no clock estimate moves it
    recent: dict[int, str] = field(default_factory=dict)  # seq -> event JSON
    newest_first: bool = True  # its keys' layout (keys.py): False for conversations 0.3.0 began
    size: int = field(init=False)  # bytes it holds, as the memory budget charges them (kept with ``recent``)

    def __post_init__(self) -> None:
        self.size = _charged(self.recent)

    def remember(self, seq: int, raw: str) -> None:
        """Keep ``seq``'s text.  The dict is replaced, never changed in place: the answerers of one
        process share memories (``shared_memory``), and a packer may still be reading the old one.
        The size follows what is dropped and added, not summed again over 128 events each append."""
        last = max(self.last, seq)
        floor = last - RECENT_KEPT
        kept = {s: text for s, text in self.recent.items() if s > floor}
        dropped = [text for s, text in self.recent.items() if s <= floor or s == seq]
        kept[seq] = raw
        self.recent = kept
        self.size += len(raw) + 64 - sum(len(text) + 64 for text in dropped)
        self.last = last


def _charged(recent: dict[int, str]) -> int:
    return sum(len(raw) + 64 for raw in recent.values())


#: Per backend object (one SDK client): the memory of every ``Conversations`` on it, see ``shared_memory``.
_SHARED: weakref.WeakKeyDictionary[Any, Bounded[str, ThreadMemory]] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_memory(backend: Any) -> Bounded[str, ThreadMemory]:
    """The conversation memory of every ``Conversations`` of this process on ``backend``.

    The Python API answers calls from many threads with a pool of services
    on one backend, any of which may take a conversation's next append: a
    memory of its own per service made most appends of eight writers read
    the head and list again (and pack from reads), 1.5 requests an append
    and 0.6-0.7 times raw creates' throughput (issue 26).  One memory per
    backend is what one ``serve`` process has.  Keys carry the store's
    prefix, so two prefixes on one backend never meet.
    """
    with _SHARED_LOCK:
        try:
            memory = _SHARED.get(backend)
        except TypeError:  # a backend that takes no weak reference: a memory of its own
            return Bounded(RECENT_BUDGET)
        if memory is None:
            memory = Bounded(RECENT_BUDGET)
            _SHARED[backend] = memory
        return memory


class Conversations:
    """append, read, last, threads, remove: see the module docstring."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.store = space.store
        # thread key prefix -> memory, shared by this process's services on one backend
        self.memory: Bounded[str, ThreadMemory] = shared_memory(getattr(space.store, "backend", space.store))
        self.heads = Heads(space)
        self.removals = Removals(space, self.heads, self._last_in, self._epoch_layout)
        self.clock = space.store.clock

    # -- epochs

    def _head(self, keys: AgentKeys, thread: str) -> dict[str, Any]:
        """The conversation's head, finishing first what a removal left to do (roll forward)."""
        head = self.heads.read(keys, thread)
        if head.get("removed"):
            self.removals.roll_forward(keys, thread, head)
        return head

    def _last_in(self, at: EpochKeys, known: int = 0) -> int:
        """The last number in an epoch (a removal's fencer asks this of a dying one)."""
        return self._last_listed(at, known)[0]

    def _epoch_layout(self, keys: AgentKeys, thread: str, epoch: int) -> bool:
        """Whether an epoch keeps its events newest first: every epoch but those 0.3.0 began.

        An epoch's layout is fixed by its first event, and this driver writes
        the first event of an epoch in the new layout always (``_fresh``), so
        an epoch is in 0.3.0's layout when it has a 0.3.0 event key and none
        of the new layout.  Both listings, at once: a 0.3.0 driver beside
        this one reads a newest-first epoch as empty and writes stray events
        of its own layout into it (issue 41, finding 3); the epoch's
        appenders are still this layout's, so that is the layout its removal
        must fence (0.5.0 and before fenced the old one, and answered an
        append from memory ``done`` into the removed epoch).
        """
        newest, oldest = self.space.together(lambda: self.store.list(keys.events(thread, epoch, True), limit=1),
                                             lambda: self.store.list(keys.events(thread, epoch, False), limit=1))
        return bool(newest) or not oldest

    def _newest(self, keys: AgentKeys, thread: str) -> Listed | None:
        """The first key below the conversation: its newest epoch's newest event (keys.py), if any."""
        first = self.store.list(keys.thread(thread), limit=1)
        return first[0] if first else None

    def _last_listed(self, at: EpochKeys, known: int) -> tuple[int, Listed | None]:
        """The last event key of an epoch and its number (events 1..known are known to exist)."""
        if at.newest_first:
            newest = self.store.list(at.events(), limit=1)
            return (_seq_of(at, newest[0].key), newest[0]) if newest else (0, None)
        start = at.event(known) if known else None
        after = self.store.list(at.events(), start_after=start)
        return (_seq_of(at, after[-1].key), after[-1]) if after else (known, None)

    def _fenced(self, item: Listed | None) -> bool:
        """Whether a listed last event is a removal's fence: the epoch died after its head was read."""
        if item is None or (item.size is not None and item.size != _FENCE_SIZE):
            return False
        obj = self.store.get(item.key)
        return obj is not None and obj.data == FENCE

    def _fresh(self, keys: AgentKeys, thread: str,
               on_head: Callable[[dict[str, Any]], None] | None = None) -> ThreadMemory:
        """Read the epoch and last number from the store, and remember them.

        The head and the conversation's first key (its newest event) are read
        at once: one round trip.  Why that answers ``last`` at a moment within
        it, whichever request the store served first: an epoch's events are
        written only while it is the head's, so newest events of the head's
        epoch were its last at the listing's moment; none of it listed means
        it was empty at the later of the bump and the listing; an epoch
        newer than the head's, or a fence, means a removal came between:
        read both again.  ``on_head`` is told of each head as soon as it is
        in (a read starts fetching blocks then).
        """
        prefix = keys.thread(thread)

        def head_then() -> dict[str, Any]:
            head = self._head(keys, thread)
            if on_head is not None:
                on_head(head)
            return head

        seen: set[tuple[int, str]] = set()  # (head's epoch, why read again): the same every round is no race
        for _ in range(EPOCH_ROUNDS):
            confirmed = time.monotonic()
            newest, head = self.space.together(lambda: self._newest(keys, thread), head_then)
            epoch = epoch_of(head)
            mem = self.memory.get(prefix)
            same = mem is not None and mem.epoch == epoch
            found = None if newest is None else conversation_key(newest.key[len(prefix):])
            if newest is not None and found is None:  # never transient: no driver writes such a key there
                raise stored.Malformed(EVENT, "a key below the conversation is no event's nor block's")
            item: Listed | None = None
            newest_first = True
            if found is not None and not found.newest_first:  # 0.3.0 began it: list the epoch from the hint
                known = max(packed_last(head), mem.last if same else 0)  # type: ignore[union-attr]
                last, item = self._last_listed(EpochKeys(keys, thread, epoch, False), known)
                newest_first = last == 0  # an epoch 0.3.0 wrote no event in starts in the new layout
            elif found is None or found.kind != "event" or found.epoch < epoch:
                last = 0  # no event in this epoch at the listing's moment
            elif found.epoch > epoch:
                seen.add((epoch, "an event key of an epoch past its head's"))
                continue  # removed since the head was read
            else:
                last, item = found.seq, newest
            if self._fenced(item):
                seen.add((epoch, "a fence as the newest event of its head's epoch"))
                continue  # removed between the head and the listing: the head says so now
            keep = mem.recent if same else {}  # type: ignore[union-attr]
            mem = ThreadMemory(epoch, last, confirmed, keep, newest_first)
            self.memory.put(prefix, mem, mem.size)
            return mem
        if len(seen) == 1:  # every round met the same head and the same stray key: no removal racing us
            raise stored.Malformed(EVENT, next(iter(seen))[1])
        raise Contention("the conversation kept being removed while it was read; read again")

    def _trusted(self, keys: AgentKeys, thread: str, seq: int) -> ThreadMemory | None:
        """What this process remembers of the conversation, if recent enough to append ``seq`` on."""
        mem = self.memory.get(keys.thread(thread))
        if mem is None or mem.last != seq - 1 or time.monotonic() - mem.confirmed > TRUST_SECONDS:
            return None
        return mem

    # -- ops

    def append(self, agent: Agent, thread: str, event: dict[str, Any], seq: int) -> dict[str, Any]:
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
                self.store.put(keys.event(thread, mem.epoch, seq, mem.newest_first), raw.encode("ascii"), Create())
                break
            except AlreadyExists:  # taken, or the epoch died (a fence): read again, and maybe write there
                self.memory.pop(keys.thread(thread))
                mem = None
        else:
            raise Contention("the conversation kept being removed while appending; nothing of this append was kept")
        mem.remember(seq, raw)
        self.memory.put(keys.thread(thread), mem, mem.size)
        if packed_at(seq):
            at = EpochKeys(keys, thread, mem.epoch, mem.newest_first)
            recent = dict(mem.recent)
            self.space.defer(lambda: self._pack_quietly(at, seq, recent))  # packing waits for the reply
        return {"reply": "done"}

    def _pack_quietly(self, at: EpochKeys, end: int, recent: dict[int, str]) -> None:
        try:
            self._pack(at, end, recent)
        except (StoreError, Contention) as exc:  # the events are stored: packing only speeds reads
            log.warning("packing events up to %d left for later: %s", end, exc)

    def _pack(self, at: EpochKeys, end: int, recent: dict[int, str]) -> None:
        """Write every block ending at ``end`` (packing.py), smallest first: the same bytes whoever writes them.

        A block's right half is the block just written; its left half comes
        from memory when the process still holds those events, else from the
        store (one object, or its halves).
        """
        right: list[str] = []
        for size in packed_at(end):
            first = end - size + 1
            if size == packing.PACK_MIN:  # the smallest block: from its single events
                got = self._gather(at, [Piece(s, 1) for s in range(first, end + 1)], recent)
            else:  # a left half, then the right half just written
                left = self._gather(at, [Piece(end - size // 2, size // 2)], recent)
                got = None if left is None else left + right
            if got is None:
                return  # removed under us: nothing to pack
            body = "[" + ",".join(got) + "]"
            self.store.put(at.segment(end, size), body.encode("ascii"), Overwrite())
            right = got
        due = end % (PREFETCH_HINT_EVERY if at.newest_first else HINT_EVERY) == 0  # after every block it names
        if due and self.heads.hint_due(at.agent, at.thread):  # never sooner than a second after our last write
            self.heads.update(at.agent, at.thread,
                              lambda head: (with_packed(head, at.epoch, end, at.newest_first) or KEEP, None),
                              cached=True)

    def last(self, agent: Agent, thread: str) -> int:
        keys = self.space.keys(agent)
        return self._fresh(keys, thread).last

    def read(self, agent: Agent, thread: str, first: int) -> list[Any]:
        """The events numbered ``first`` and on, in order, as JSON values (each object parsed once:
        a packed block straight from its bytes, never split into texts and parsed again)."""
        keys = self.space.keys(agent)
        early: Early | None = None  # of the last head read: the one the listing is judged against

        def prefetch(head: dict[str, Any]) -> None:
            nonlocal early
            early = self._prefetch(keys, thread, first, head)

        for _ in range(EPOCH_ROUNDS):
            mem = self._fresh(keys, thread, prefetch)
            events = self._read_epoch(keys, thread, first, mem, early)
            if events is not None:
                return events
        raise Contention("the conversation kept being removed while it was read; read again")

    def _prefetch(self, keys: AgentKeys, thread: str, first: int, head: dict[str, Any]) -> Early | None:
        """Ask for the blocks the head says are packed from ``first`` on, without waiting for them.

        Why blocks fetched before the listing answer as well as after it: a
        block's bytes are those of its events whoever packed it, and events
        stay while their epoch lives; they are used only if the listing then
        finds the same epoch alive, and only where ``cover`` of the real last
        number names the same block.  With the hint current (less than
        ``PREFETCH_HINT_EVERY`` behind the last) it names every one: a block
        that fits before the last fits before the hint, both being multiples
        of the interval.  A stale hint (its write failed) costs a few blocks
        asked for and not used.
        """
        hint = packed_newest(head)
        if hint < first or hint - first >= READ_SPAN_MAX:
            return None
        at = EpochKeys(keys, thread, epoch_of(head), True)

        def fetch(key: str) -> tuple[Object | None, Any]:
            obj = self.store.get(key)
            try:  # parsed here, beside the listing; a block that is no JSON is left to _gather to judge
                return obj, None if obj is None else stored.loads(obj.data, EVENT)
            except stored.Malformed:
                return obj, None

        mem = self.memory.get(keys.thread(thread))
        held = mem.recent if mem is not None and mem.epoch == at.epoch else {}
        pieces = [p for p in cover(first, hint) if p.size > 1 and not _held(p, held)][:PREFETCH_MAX]
        return Early(at.epoch, {p: self.space.pool.submit(fetch, at.segment(p.end, p.size)) for p in pieces})

    def _read_epoch(self, keys: AgentKeys, thread: str, first: int, mem: ThreadMemory,
                    early: Early | None = None) -> list[Any] | None:
        """The events of the epoch ``mem`` stands on; None if it died while they were fetched."""
        if first > mem.last:
            return []
        if mem.last - first >= READ_SPAN_MAX:
            raise RequestError(f"the conversation's last event is {mem.last}: one read answers at most "
                               f"{READ_SPAN_MAX} events (ask from a later 'first'); nothing was changed")
        pieces = cover(first, mem.last)
        at = EpochKeys(keys, thread, mem.epoch, mem.newest_first)
        usable = early.blocks if early is not None and early.epoch == mem.epoch and mem.newest_first else {}
        after = packing.tail_boundary(mem.last)
        singles = [p for p in pieces if p.size == 1 and p.end > after]  # a suffix of ``pieces``: cover's
        tail = self._ask_tail(at, after, singles, mem.recent)
        events = self._gather(at, pieces[:len(pieces) - len(singles)], mem.recent, parse=True, early=usable)
        rest = None if events is None else self._tail_events(at, after, singles, mem.recent, tail)
        if events is None or rest is None:
            self.memory.pop(keys.thread(thread))
            return None  # removed (and perhaps purged) while read: read the head again
        events += rest
        return events[first - pieces[0].first:]

    def _ask_tail(self, at: EpochKeys, after: int, singles: list[Piece],
                  recent: dict[int, str]) -> Future[Object | None] | None:
        """Ask for the tail after ``after`` (packing.py, "Tails") if a single event it may hold is not in memory.

        Sent before the blocks are, so it travels in their round.
        """
        if not at.newest_first or all(p.end in recent for p in singles):
            return None
        return self.space.pool.submit(self.store.get, at.tail(after))

    def _tail_events(self, at: EpochKeys, after: int, singles: list[Piece], recent: dict[int, str],
                     asked: Future[Object | None] | None) -> list[Any] | None:
        """The events of ``singles`` (the single events after the last block), parsed, in order.

        From memory, then from the tail, then fetched one by one (a round
        more, only for events the tail does not hold yet); None if one is
        missing or a fence (the epoch died).  A reader that fetched any
        writes the tail again once its reply is out, with every event after
        ``after`` up to its last, when it holds them all (``Space.reads_write_back``).
        """
        if not singles:
            return []
        held = _tail_of(asked.result(), after) if asked is not None else {}
        have: dict[int, Any] = {}
        fetch: list[Piece] = []
        for p in singles:
            if p.end in recent:
                have[p.end] = json.loads(recent[p.end])
            elif p.end in held:
                have[p.end] = held[p.end]
            else:
                fetch.append(p)
        if fetch:
            got = self._gather(at, fetch, {}, parse=True)
            if got is None:
                return None
            have.update(zip((p.end for p in fetch), got, strict=True))
            last = singles[-1].end
            if asked is not None and self.space.reads_write_back and all(s in have for s in range(after + 1, last + 1)):
                run = [compact(have[s]) for s in range(after + 1, last + 1)]
                self.space.defer(lambda: self._write_tail(at, after, run))
        return [have[p.end] for p in singles]

    def _write_tail(self, at: EpochKeys, after: int, run: list[str]) -> None:
        """Write the tail after ``after``: a failure only leaves the next reader fetching singly."""
        body = "[" + ",".join(run) + "]"
        if len(body) > packing.TAIL_BYTES_MAX:
            return
        try:
            self.store.put(at.tail(after), body.encode("ascii"), Overwrite())
        except StoreError as exc:  # a read-only credential, a throttled bucket: the events are all stored
            log.warning("the tail after event %d left for the next reader: %s", after, exc)

    def _gather(self, at: EpochKeys, pieces: list[Piece], recent: dict[int, str], parse: bool = False,
                early: dict[Piece, Future[tuple[Object | None, Any]]] | None = None) -> list[Any] | None:
        """Every event of ``pieces``, in order: all fetched at once, a missing block read as its halves.

        As compact JSON texts (to pack them), or with ``parse`` as JSON values
        (to answer a read: a block's bytes are parsed once, whole; re-encoding
        each of 10,000 events to text and parsing it again cost more than
        the requests).  None when a single event is missing or is a fence:
        the epoch died.  ``early``: blocks already asked for (``_prefetch``),
        taken from there instead of asked for again.
        """
        leaf: Callable[[str], Any] = json.loads if parse else (lambda text: text)
        got: dict[Piece, list[Any]] = {}
        todo = list(pieces)
        while todo:
            wanted: list[Piece] = []
            later: list[Piece] = []
            for p in todo:
                if _held(p, recent):
                    got[p] = [leaf(recent[s]) for s in range(p.first, p.end + 1)]
                elif len(wanted) < GATHER_WINDOW or (early and p in early):
                    wanted.append(p)
                else:
                    later.append(p)  # past this round's window: asked for once those before it are in
            asked = [p for p in wanted if not (early and p in early)]
            fetched = dict(zip(asked, self.space.get_many(
                at.event(p.end) if p.size == 1 else at.segment(p.end, p.size) for p in asked), strict=True))
            todo = []
            for p in wanted:
                obj, parsed = early.pop(p).result() if early and p in early else (fetched[p], None)
                if p.size == 1:
                    if obj is None or obj.data == FENCE:
                        return None
                    event = _event(stored.loads(obj.data, EVENT), p.end)
                    got[p] = [event if parse else compact(event)]
                elif obj is None:
                    todo.extend(p.halves())  # not packed (yet): its halves, next round
                else:
                    block = _block(obj.data if parsed is None else parsed, p)
                    if block is None:
                        todo.extend(p.halves())  # not a whole block of its range (never written so): its halves
                        continue
                    got[p] = block if parse else [compact(e) for e in block]
            todo.extend(later)
        return [event for p in _leaves(pieces, got) for event in got[p]]

    def threads(self, agent: Agent) -> list[dict[str, Any]]:
        keys = self.space.keys(agent)
        parts = self.store.list_dirs(keys.conversations())
        try:
            with stored.parsing(NAME):
                names = self.space.names_of(keys, parts)
        except (TypeError, KeyError, AssertionError, ValueError) as exc:  # a record that is no {"name": ...}
            if isinstance(exc, stored.Malformed):
                raise
            raise stored.Malformed(NAME, "it is not {name}, or a key part is no name") from None
        for name, part in zip(names, parts, strict=True):  # a name record must be of its own key's name
            if name is not None:
                stored.text(name, NAME, "its name")
                stored.expect(name_part(name) == part, NAME, "it names another conversation than its key")
        pairs = [(n, p) for n, p in zip(names, parts, strict=False) if n is not None]
        lasts = list(self.space.pool.map(lambda np: self.last(agent, np[0]), pairs))
        found: list[dict[str, Any]] = [
            {"thread": n, "last": last} for (n, _), last in zip(pairs, lasts, strict=False) if last > 0
        ]
        found.sort(key=lambda t: t["thread"].encode("utf-8", "surrogatepass"))
        return found

    def remove(self, agent: Agent, thread: str) -> None:
        """One write commits it (removal.py): the head's epoch bumped and its lease ended together."""
        keys = self.space.keys(agent)
        self.removals.remove(keys, thread)
        self.memory.pop(keys.thread(thread))


def _seq_of(at: EpochKeys, key: str) -> int:
    """The number of a listed event key; a key below an epoch's events that is none is ``Malformed``."""
    try:
        return at.seq_of(key)
    except ValueError:
        raise stored.Malformed(EVENT, "a key below a conversation's events is no event's") from None


def _event(value: Any, seq: int) -> dict[str, Any]:
    """A stored single event, as ``append`` wrote it: a JSON object whose ``seq`` is its key's number."""
    stored.obj(value, EVENT)
    stored.expect(value.get("seq") == seq and stored.validate_int(value.get("seq")), EVENT,
                  "its seq is not its key's number")
    return value  # type: ignore[no-any-return]


def _block(data: Any, piece: Piece) -> list[Any] | None:
    """A packed block's events, only if they are exactly those of its range (each its number, in order);
    None otherwise (a block lying about its range, or no JSON: the caller reads its halves)."""
    if isinstance(data, bytes):
        try:
            data = stored.loads(data, EVENT)
        except stored.Malformed:
            return None
    if not isinstance(data, list) or len(data) != piece.size or not _is_run(data, piece.first):
        return None
    return data


def _is_run(events: list[Any], first: int) -> bool:
    """Whether ``events`` are JSON objects numbered ``first``, ``first + 1``, ... (a block's, a tail's)."""
    return all(isinstance(event, dict) and event.get("seq") == seq and stored.validate_int(event.get("seq"))
               for seq, event in enumerate(events, start=first))


def _tail_of(obj: Object | None, after: int) -> dict[int, Any]:
    """A stored tail's events by number: only a run ``after+1, after+2, ...`` of events each with its
    number, shorter than a block (packing.py, "Tails"); anything else is no tail (its events are fetched)."""
    if obj is None:
        return {}
    try:
        data = stored.loads(obj.data, EVENT)
    except stored.Malformed:
        return {}
    if not isinstance(data, list) or not 0 < len(data) < packing.PACK_MIN or not _is_run(data, after + 1):
        return {}
    return dict(enumerate(data, start=after + 1))


def _held(piece: Piece, recent: dict[int, str]) -> bool:
    """Whether a process's memory holds every event of ``piece`` (it is then never fetched)."""
    return all(s in recent for s in range(piece.first, piece.end + 1))


def _leaves(pieces: list[Piece], got: dict[Piece, list[Any]]) -> Iterator[Piece]:
    """The pieces whose events were got, in order: a piece not got stands for its halves."""
    for p in pieces:
        if p in got:
            yield p
        else:
            yield from _leaves(p.halves(), got)

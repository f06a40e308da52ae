"""Which call gets a driver place next: a fair share for every agent, at one agent's speed.

A bridge has ``total`` driver places (4) for every agent it serves. By
default a driver process is started with its agent's ``LNK_STORE_DIR`` (the
agent's own chats/, store-interface.txt "LNK_STORE_DIR") and may keep what it
read of that folder, so it serves its agent only: another agent's call cannot
reuse it, it needs a place of its own and a process started there. So sharing
places is deciding who gets the next free place, and how long one agent keeps
one. Which processes may serve a call is its grant's ``kind``: its agent by
default; with shared drivers (``Limits.shared_drivers``) one kind for every
agent, so a place handed to another agent's call hands its process on too.
Fairness is counted by agent whatever the kind: calls in flight are shared,
processes are reused.

The rules, applied whenever a place frees while calls wait:

* **A share each.** Among the agents with calls under way or waiting, each is
  owed ``max(1, total // agents)`` places. A place freed by an agent at or over
  its share goes to a waiting agent below it, if any: one agent with 8 calls
  in flight no longer holds all 4 drivers while another waits.
* **Round-robin across agents, FIFO within one.** Agents are served in the
  order they started waiting, each moved to the back once served; an agent's
  own calls go oldest first. Waiters are handed their place directly (no
  stampede, no newcomer jumping the queue).
* **A turn of ``quantum`` calls.** An agent below its share keeps its freed
  driver for its own next waiting call, up to ``quantum`` calls in a row, so
  with more agents than places a driver is started once a turn, not once a
  call; then the place moves on round-robin. With shared drivers a place
  handed on keeps its process, so a turn saves no start and the bridge runs
  them with a turn of one call (``SHARED_QUANTUM``): strict round-robin.

A process goes idle (kept for its kind's next call) only when nobody waits;
an idle process of another kind is stopped when a call needs its place.
This class holds no process of its own making: ``P`` is anything with
``alive()`` (``ServeProcess``, or a test's stand-in), so the rules can be
driven step by step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ..errors import CloudstoreError

QUANTUM = 8  # calls in a row on one driver for one agent: an agent's calls at once (the seed's limit)
SHARED_QUANTUM = 1  # with shared drivers: a hand-off starts no process, so no agent keeps a place for a turn


class Process(Protocol):
    def alive(self) -> bool: ...


P = TypeVar("P", bound=Process)


class NoPlace(CloudstoreError):
    """No place was handed to the call before its deadline."""


class PlacesClosed(CloudstoreError):
    """The bridge is stopping."""


@dataclass
class Grant(Generic[P]):
    """A place handed to one call: a process of its kind to reuse (or None: start one),
    processes to stop first (outside any lock), and how many calls in a row of
    this agent the place has served (to be given back with it).

    ``key`` is the agent, whose share the place counts in; ``kind`` says which
    processes may serve the call (None: the agent's own, ``key``)."""

    key: Hashable
    proc: P | None = None
    drop: list[P] = field(default_factory=list)
    turns: int = 1
    granted: bool = False
    kind: Hashable = None

    def __post_init__(self) -> None:
        if self.kind is None:
            self.kind = self.key


class Places(Generic[P]):
    """The places and the queue of calls waiting for one (thread-safe)."""

    def __init__(self, total: int, quantum: int = QUANTUM) -> None:
        self.total = total
        self.quantum = quantum
        self._cond = threading.Condition()
        self._free = total  # places holding no process and no call
        self._idle: list[tuple[Hashable, P]] = []  # (kind, process), longest idle first; only while nobody waits
        self._held: dict[Hashable, int] = {}  # places held by calls, per agent
        self._queues: dict[Hashable, deque[Grant[P]]] = {}  # waiting calls per agent, oldest first
        self._order: deque[Hashable] = deque()  # agents with waiting calls, next to serve first
        self._closed = False

    # -- taking --------------------------------------------------------------

    def take(self, key: Hashable, deadline: float, kind: Hashable = None) -> Grant[P]:
        """A place for one call of agent ``key``, served by a process of ``kind`` (None:
        the agent's own), waiting at most until ``deadline`` (NoPlace)."""
        kind = key if kind is None else kind
        with self._cond:
            grant = self._take_now(key, kind)
            if grant is not None:
                return grant
            grant = Grant(key, kind=kind)
            queue = self._queues.setdefault(key, deque())
            if not queue:
                self._order.append(key)
            queue.append(grant)
            while not grant.granted:
                if self._closed:
                    self._unqueue(grant)
                    raise PlacesClosed("the bridge is stopping")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._unqueue(grant)
                    raise NoPlace(f"no driver place came free within the call's time ({self.total} places)")
                self._cond.wait(remaining)
            return grant

    def _take_now(self, key: Hashable, kind: Hashable) -> Grant[P] | None:
        """Under the lock: a place at once, when nobody waits and one is there."""
        if self._closed:
            raise PlacesClosed("the bridge is stopping")
        if self._order:
            return None  # others wait: places go to them first, in turn
        drop: list[P] = []
        for i, (k, proc) in enumerate(self._idle):
            if k == kind:
                del self._idle[i]
                if proc.alive():
                    self._hold(key)
                    return Grant(key, proc, drop, 1, True, kind)
                drop.append(proc)  # it died while idle (killed, crashed): its place is free
                self._free += 1
                break
        if self._free > 0:
            self._free -= 1
        elif self._idle:
            drop.append(self._idle.pop(0)[1])  # the longest idle of a kind nobody waits for
        else:
            return None
        self._hold(key)
        return Grant(key, None, drop, 1, True, kind)

    def _hold(self, key: Hashable) -> None:
        self._held[key] = self._held.get(key, 0) + 1

    def _unqueue(self, grant: Grant[P]) -> None:
        queue = self._queues[grant.key]
        queue.remove(grant)
        if not queue:
            del self._queues[grant.key]
            self._order.remove(grant.key)

    # -- giving back ---------------------------------------------------------

    def give(self, key: Hashable, proc: P | None, turns: int = 1, kind: Hashable = None) -> P | None:
        """End a call's hold of its place: ``proc`` is its healthy process (of ``kind``,
        None: the agent's own) to pass on or keep (None when it has none, or it
        failed and was stopped). Returns the process for the caller to stop when
        nobody may keep it (stopping)."""
        kind = key if kind is None else kind
        with self._cond:
            left = self._held[key] - 1
            if left:
                self._held[key] = left
            else:
                del self._held[key]
            nxt, reused = self._next(key, proc is not None, turns)
            if nxt is None:
                if proc is not None and not self._closed:
                    self._idle.append((kind, proc))
                    return None
                self._free += 1
                return proc
            self._unqueue(nxt)
            if reused:
                nxt.proc, nxt.turns = proc, turns + 1
            elif nxt.kind == kind and proc is not None:
                nxt.proc, nxt.turns = proc, 1  # a process of its kind (its own, or shared), a new turn
            else:
                nxt.proc, nxt.turns = None, 1
                if proc is not None:
                    nxt.drop.append(proc)  # stopped by the call it passes to, outside the lock
            nxt.granted = True
            self._hold(nxt.key)
            self._cond.notify_all()
            return None

    def _next(self, key: Hashable, has_proc: bool, turns: int) -> tuple[Grant[P] | None, bool]:
        """Under the lock: the waiting call a freed place goes to (the module's rules),
        and whether it goes on the freeing agent's turn."""
        if not self._order or self._closed:
            return None, False
        share = self.share()
        if key in self._queues and has_proc and self._held.get(key, 0) < share and turns < self.quantum:
            return self._queues[key][0], True  # its turn goes on: no driver start
        if key in self._queues:  # its turn is over: it goes to the back of the round
            self._order.remove(key)
            self._order.append(key)
        pick = next((k for k in self._order if self._held.get(k, 0) < share), self._order[0])
        self._order.remove(pick)
        self._order.append(pick)  # served: to the back of the round
        return self._queues[pick][0], False

    def share(self) -> int:
        """Under the lock: places owed to each agent with calls under way or waiting."""
        agents = len(self._held.keys() | self._queues.keys())
        return max(1, self.total // max(1, agents))

    # -- the end -------------------------------------------------------------

    def close(self) -> list[P]:
        """Take no more calls; the idle processes, to be stopped by the caller."""
        with self._cond:
            self._closed = True
            idle = [p for _, p in self._idle]
            self._free += len(idle)
            self._idle.clear()
            self._cond.notify_all()
            return idle

    def counts(self) -> dict[str, int]:
        """Places held by calls, idle processes, calls waiting (for tests and logs)."""
        with self._cond:
            held = sum(self._held.values())
            return {
                "places": held + len(self._idle),
                "held": held,
                "idle": len(self._idle),
                "waiting": sum(len(q) for q in self._queues.values()),
            }

    def held_by(self, key: Hashable) -> int:
        with self._cond:
            return self._held.get(key, 0)

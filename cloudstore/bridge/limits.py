"""How much a bridge takes on at once, and the counters that hold it to that.

Calls over a limit are answered ``busy`` at once rather than queued: a caller
that is told to come back later can decide what to do, one left waiting in a
queue behind a stuck driver cannot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Hashable

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """The contract's limits (store-interface.txt, "Its limits"), settable for tests."""

    max_calls: int = 16  # proved calls at once, every agent together
    max_calls_per_agent: int = 8
    max_drivers: int = 4  # driver processes at once, kept or run once
    request_timeout: float = 5.0  # from connecting to the proof, and from the proof to the request line
    call_timeout: float = 30.0  # one driver call; also the longest wait for a free driver
    max_pending: int = 64  # connections not yet proved; more are answered busy
    max_proof_bytes: int = 1 * MiB
    max_request_bytes: int = 16 * MiB  # a 4 MiB file as base64 in JSON fits with room


class Busy(Exception):
    """A limit is reached; the message says which."""


class CallSlots:
    """Proved calls under way, counted in total and per agent."""

    def __init__(self, total: int, per_agent: int) -> None:
        self.total = total
        self.per_agent = per_agent
        self._lock = threading.Lock()
        self._count = 0
        self._by_agent: dict[Hashable, int] = {}

    def take(self, agent: Hashable) -> None:
        """Hold one slot for ``agent``, or raise Busy without holding any."""
        with self._lock:
            mine = self._by_agent.get(agent, 0)
            if mine >= self.per_agent:
                raise Busy(f"this agent already has {mine} calls under way, the most it may")
            if self._count >= self.total:
                raise Busy(f"the bridge already has {self._count} calls under way, the most it takes")
            self._count += 1
            self._by_agent[agent] = mine + 1

    def give_back(self, agent: Hashable) -> None:
        with self._lock:
            self._count -= 1
            left = self._by_agent[agent] - 1
            if left:
                self._by_agent[agent] = left
            else:
                del self._by_agent[agent]

    def under_way(self, agent: Hashable | None = None) -> int:
        """Calls holding a slot: all of them, or one agent's."""
        with self._lock:
            return self._count if agent is None else self._by_agent.get(agent, 0)


class Counter:
    """A bounded count of things under way (connections not yet proved)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._count = 0

    def take(self) -> bool:
        with self._lock:
            if self._count >= self.most:
                return False
            self._count += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._count -= 1

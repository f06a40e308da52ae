"""What a ``serve`` process remembers, bounded by bytes: least recently used out.

A serve process keeps what it has read and written (records by version, the
latest events of conversations) so the common request costs one round trip.
An agent can make it hold anything it likes (many conversations, big
records), so every such memory is a ``Bounded`` map: a byte budget, each
entry charged its size, the least recently used dropped first.  The
budgets add up to ``MEMORY_BUDGET``, the bound the README states.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: Every byte budget below together: what a serve process keeps at the most.
MEMORY_BUDGET = 64 * 1024 * 1024
#: What an entry costs beyond its own bytes (keys, tuples, dict slots).
ENTRY_OVERHEAD = 200


class Bounded(Generic[K, V]):
    """A map holding at most ``budget`` bytes of entries (each charged its ``size``), LRU out."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V, size: int) -> None:
        """Keep ``value`` (charged ``size`` bytes); one larger than the whole budget is not kept."""
        cost = size + ENTRY_OVERHEAD
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.used -= old[1]
            if cost > self.budget:
                return
            self._items[key] = (value, cost)
            self.used += cost
            while self.used > self.budget:
                _, (_, dropped) = self._items.popitem(last=False)
                self.used -= dropped

    def pop(self, key: K) -> V | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is None:
                return None
            self.used -= old[1]
            return old[0]

    def __len__(self) -> int:
        return len(self._items)

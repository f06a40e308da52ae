"""What a ``serve`` process remembers, bounded by bytes: least recently used out.

A serve process keeps what it has read and written (records by version, the
latest events of conversations) so the common request costs one round trip,
and small facts of the agents and keys it met (which mark shard it wrote
last, when it last wrote a head, which index entries it found live, file
ledgers).  An agent can make it hold anything it likes (many conversations,
big records, a hundred thousand agents), so every such memory is a
``Bounded`` map: a byte budget, each entry charged its size, the least
recently used dropped first; losing an entry costs a request or a little
spreading, never a wrong answer.  The caches' budgets add up to
``CACHE_BUDGET``, the rest to ``BOOKKEEPING_BUDGET``, and the two to
``MEMORY_BUDGET``, the bound docs/design.md states ("Memory of a serve
process" lists each budget; tests/test_memory_bounds.py holds every
``Bounded`` of the package to that list).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MIB = 1024 * 1024
#: What the caches of what was read and written keep at the most: conversations' recent events
#: (``conversations.RECENT_BUDGET``), records by version (``space.SEEN_BUDGET``), objects written
#: (``space.WRITTEN_BUDGET``).
CACHE_BUDGET = 64 * MIB
#: What the memories of agents and keys keep at the most: file ledgers and marks (``files``), old marks
#: refused and the shard picker (``job_mark``), heads written (``heads``), index entries found live
#: (``confirmed``), encoded names (``keys``).
BOOKKEEPING_BUDGET = 16 * MIB
#: Every byte budget together: what a serve process keeps at the most, whatever its agents do.
MEMORY_BUDGET = CACHE_BUDGET + BOOKKEEPING_BUDGET
#: What an entry costs beyond the bytes it is charged (the key's and the value's objects, the map's slot and
#: links): measured up to 290 bytes with tracemalloc beyond the key's length (a float or a shared value, keys
#: of 1 to 400 characters, the map full and churning), so every budget holds what it says
#: (tests/test_memory_bounds.py).
ENTRY_OVERHEAD = 320


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

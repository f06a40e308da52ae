"""What an index reader found live lately: entries it need not read again for a while.

Both shared indexes (due_index.py for waiting jobs, claim_index.py for jobs in
firing) judge an old entry by reading its job's record; an entry found live
is not read again for ``CONFIRMED_FOR`` monotonic seconds, so a job nobody
acts on does not cost every poll a read.  At most ``CONFIRMED_BUDGET`` bytes
of entries are kept (each charged its key, which names any agent and job:
counting them would not bound the bytes), the least recently confirmed
forgotten first: a few reads more, never a wrong answer.
"""

from __future__ import annotations

import time

from .cache import Bounded

CONFIRMED_FOR = 30.0  # an entry found live is not read again for this long (monotonic seconds)
#: Bytes of entries remembered as confirmed, per index reader: part of ``cache.BOOKKEEPING_BUDGET``.
CONFIRMED_BUDGET = 512 * 1024


class Confirmed:
    """Keys found live, each with when (monotonic)."""

    def __init__(self) -> None:
        self._at: Bounded[str, float] = Bounded(CONFIRMED_BUDGET)

    def fresh(self, key: str) -> bool:
        """Whether ``key`` was found live less than ``CONFIRMED_FOR`` seconds ago."""
        at = self._at.get(key)
        return at is not None and time.monotonic() - at < CONFIRMED_FOR

    def add(self, key: str) -> None:
        self._at.put(key, time.monotonic(), len(key))

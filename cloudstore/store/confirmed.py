"""What an index reader found live lately: entries it need not read again for a while.

Both shared indexes (due_index.py for waiting jobs, claim_index.py for jobs in
firing) judge an old entry by reading its job's record; an entry found live
is not read again for ``CONFIRMED_FOR`` monotonic seconds, so a job nobody
acts on does not cost every poll a read.  At most ``CONFIRMED_MAX`` are kept:
past that the memory starts afresh (a few reads more, never a wrong answer).
"""

from __future__ import annotations

import time

CONFIRMED_FOR = 30.0  # an entry found live is not read again for this long (monotonic seconds)
CONFIRMED_MAX = 4096  # entries remembered as confirmed, at most


class Confirmed:
    """Keys found live, each with when (monotonic)."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def fresh(self, key: str) -> bool:
        """Whether ``key`` was found live less than ``CONFIRMED_FOR`` seconds ago."""
        at = self._at.get(key)
        return at is not None and time.monotonic() - at < CONFIRMED_FOR

    def add(self, key: str) -> None:
        if len(self._at) >= CONFIRMED_MAX:
            self._at.clear()
        self._at[key] = time.monotonic()

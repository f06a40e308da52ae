"""Log lines that a flood cannot multiply.

An unproved caller can make the bridge refuse, evict or time out as often as
it likes; one log line each would let it fill the disk and spend the
bridge's time writing (220,066 accept warnings in seconds were measured). A
``RateLog`` writes one line per kind of event per period, and the next line
of that kind says how many it left out.
"""

from __future__ import annotations

import logging
import threading
import time


class RateLog:
    """At most one line per key every ``every`` seconds; the rest are counted."""

    def __init__(self, logger: logging.Logger, every: float = 10.0) -> None:
        self.logger = logger
        self.every = every
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def __call__(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless a line of ``key`` was logged lately; whether it was logged."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                self._dropped[key] = self._dropped.get(key, 0) + 1
                return False
            self._last[key] = now
            dropped = self._dropped.pop(key, 0)
        if dropped:
            msg += " (and %d more like it in the last %g s, not logged)"
            args = (*args, dropped, self.every)
        self.logger.log(level, msg, *args)
        return True

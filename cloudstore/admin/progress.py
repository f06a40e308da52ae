"""Progress on stderr: a bar redrawn in place on a terminal, a plain line now and then otherwise.

Stdout carries the program's output only (tables, JSON, the summary); a
pipe or a log file gets counts every few seconds instead of carriage returns.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from .walk import is_tty

BAR = 30
PLAIN_EVERY = 5.0  # seconds between plain lines
DRAW_EVERY = 0.1


class Progress:
    """Counts objects and bytes done out of a total, and shows them (bytes only where ``sized``:
    inspect counts agents, whose bytes it does not add up as it goes)."""

    def __init__(self, total: int, what: str = "objects", stream: TextIO | None = None, sized: bool = True) -> None:
        self.total = total
        self.what = what
        self.sized = sized
        self.stream = stream or sys.stderr
        self.tty = is_tty(self.stream)
        self.done = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = 0.0
        self._lock = threading.Lock()

    def add(self, objects: int = 1, size: int = 0) -> int:
        """Count work done; the new object count."""
        with self._lock:
            self.done += objects
            self.bytes += size
            done = self.done
            now = time.monotonic()
            if now - self._shown >= (DRAW_EVERY if self.tty else PLAIN_EVERY):
                self._shown = now
                self._show(now)
        return done

    def _show(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-9)
        if self.tty:
            filled = BAR * self.done // max(self.total, 1)
            size = f"{self.bytes / 1e6:.1f} MB, " if self.sized else ""
            self.stream.write(f"\r[{'#' * filled}{'.' * (BAR - filled)}] {self.done}/{self.total} {self.what}, "
                              f"{size}{rate:.0f}/s ")
        else:
            size = f"{self.bytes} bytes, " if self.sized else ""
            self.stream.write(f"{self.done}/{self.total} {self.what}, {size}{rate:.0f}/s\n")
        self.stream.flush()

    def close(self) -> None:
        with self._lock:
            self._show(time.monotonic())
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()

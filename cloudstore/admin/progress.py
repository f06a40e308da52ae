"""Progress on stderr: a bar redrawn in place on a terminal, a log line at a steady cadence otherwise.

Stdout carries the program's output only (tables, JSON, the summary).  A
pipe, a log file or a log shipper gets, every ``LNK_PROGRESS_EVERY``
seconds (``--progress-every``; default 5), one record of the program's log:
logger ``cloudstore.admin``, level INFO, ``event`` ``progress``, with the
``phase`` (``copy``, ``verify``, ``inspect``, ``gc judge``, ``gc delete``,
``relayout move``, ``relayout guard``),
``what`` is counted, ``done``, ``total``, ``bytes`` where counted,
``per_second``, ``seconds`` and ``finished``.  So with JSON logs it is a
line of the one schema (``runtime.jsonlog``), with text logs a line of the
same text format as the program's other lines, never a third shape.  Each
phase ends with a line (``finished``: true) whatever the cadence, and a
cadence of 0 writes a line for every unit of work (the tests see several
lines that way without waiting on a clock).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TextIO, TypeVar

from ..errors import SettingError
from .walk import WORKERS, is_tty, parallel

T = TypeVar("T")
R = TypeVar("R")

BAR = 30
#: The environment setting of the cadence (seconds between lines); ``--progress-every`` overrides it.
EVERY_SETTING = "LNK_PROGRESS_EVERY"
PLAIN_EVERY = 5.0  # seconds between lines, by default
DRAW_EVERY = 0.1  # seconds between redraws of a terminal's bar

log = logging.getLogger("cloudstore.admin")
_chosen: float | None = None  # the command line's cadence (``choose``), over the environment's


def parse_every(value: str, setting: str = EVERY_SETTING) -> float:
    """Seconds between progress lines, from text: a finite number >= 0; SettingError naming ``setting``."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise SettingError(f"{setting} must be a number of seconds >= 0 (0: a line for every unit of work), "
                           f"not {value!r}")
    return seconds


def choose(seconds: float | None) -> None:
    """Set the cadence from the command line (None: back to ``LNK_PROGRESS_EVERY``, else the default)."""
    global _chosen
    _chosen = seconds


def cadence() -> float:
    """Seconds between progress lines: the command line's, else ``LNK_PROGRESS_EVERY``, else ``PLAIN_EVERY``."""
    if _chosen is not None:
        return _chosen
    value = os.environ.get(EVERY_SETTING, "").strip()
    return parse_every(value) if value else PLAIN_EVERY


class Progress:
    """Counts units of work done out of a total, and shows them (bytes only where ``sized``:
    inspect counts agents, whose bytes it does not add up as it goes).

    ``stream``: plain lines written there instead of log records (a caller of its own, a test).
    """

    def __init__(self, total: int, what: str = "objects", stream: TextIO | None = None, sized: bool = True,
                 phase: str = "copy") -> None:
        self.total = total
        self.what = what
        self.sized = sized
        self.phase = phase
        self.stream = stream
        self.tty = is_tty(stream or sys.stderr)
        self.every = DRAW_EVERY if self.tty else cadence()
        self.done = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = -math.inf
        self._lock = threading.Lock()

    def add(self, objects: int = 1, size: int = 0) -> int:
        """Count work done; the new count."""
        with self._lock:
            self.done += objects
            self.bytes += size
            done = self.done
            now = time.monotonic()
            if now - self._shown >= self.every and (self.tty or done < self.total):  # the last: ``close``'s
                self._shown = now
                self._show(now, finished=False)
        return done

    def tick(self) -> None:
        """One unit done (for ``walk.parallel``'s ``done``)."""
        self.add()

    def _show(self, now: float, finished: bool) -> None:
        elapsed = now - self.started
        rate = self.done / max(elapsed, 1e-9)
        if self.tty:
            out = self.stream or sys.stderr
            filled = BAR * min(self.done, self.total) // max(self.total, 1)
            size = f"{self.bytes / 1e6:.1f} MB, " if self.sized else ""
            out.write(f"\r[{'#' * filled}{'.' * (BAR - filled)}] {self.done}/{self.total} {self.what}, "
                      f"{size}{rate:.0f}/s {self.phase} ")
            out.flush()
            return
        size = f"{self.bytes} bytes, " if self.sized else ""
        message = f"{self.done}/{self.total} {self.what}, {size}{rate:.0f}/s ({self.phase}, {elapsed:.0f} s)"
        if self.stream is not None:
            self.stream.write(message + "\n")
            self.stream.flush()
            return
        fields = {"event": "progress", "phase": self.phase, "what": self.what, "done": self.done,
                  "total": self.total, **({"bytes": self.bytes} if self.sized else {}),
                  "per_second": round(rate, 1), "seconds": round(elapsed, 3), "finished": finished}
        log.info("%s", message, extra=fields)

    def close(self) -> None:
        """The phase's last line (whatever the cadence); a terminal's bar ends its line.  A phase with
        nothing to do says nothing (gc's claim index of a store without jobs, say)."""
        with self._lock:
            if not self.total and not self.done:
                return
            self._show(time.monotonic(), finished=True)
            if self.tty:
                out = self.stream or sys.stderr
                out.write("\n")
                out.flush()


def parallel_shown(fn: Callable[[T], R], items: Iterable[T], what: str, phase: str,
                   workers: int = WORKERS) -> list[R]:
    """``walk.parallel``, with the count of items done shown as ``phase``'s progress (of ``what``)."""
    items = list(items)
    progress = Progress(len(items), what=what, sized=False, phase=phase)
    try:
        return parallel(fn, items, workers, done=progress.tick)
    finally:
        progress.close()

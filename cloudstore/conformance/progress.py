"""Checks done out of the total, on stderr at a steady cadence while a run lasts.

A full run takes a minute on a folder and several on a cloud store (the
4,097-file list alone, one check, minutes on moto): with the result lines
on stdout only as each check ends, a pipe or a CI log showed nothing for
that long.  A line is said when a check ends and at least ``every``
seconds passed since the last, and by a ticker thread on the same cadence
while one check runs long, naming it.  ``every`` 0 says one after each
check (a test's deterministic cadence); the ticker then stays off.

Lines go through ``say`` (the CLI's logger, so ``LNK_LOG_FORMAT=json``
makes them records of the one log schema, their counts as fields).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .harness import Result

#: Seconds between progress lines by default (the admin tool's plain-line cadence).
EVERY = 5.0

Say = Callable[[str, dict[str, Any]], None]


class Progress:
    """Counts the checks of one run as they start and end, and says how far it is."""

    def __init__(self, say: Say | None = None, every: float = EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if every < 0:
            raise ValueError("the progress cadence must be 0 seconds or more")
        self.say = say
        self.every = every
        self.clock = clock
        self.total = 0
        self.done = 0
        self.failed = 0
        self.running = ""
        self.started = clock()
        self._shown = self.started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def planned(self, total: int) -> None:
        """The run will have ``total`` results; the ticker starts (with a cadence above 0)."""
        with self._lock:
            self.total += total
        if self.say is not None and self.every > 0 and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="lnk-store-check progress", daemon=True)
            self._ticker.start()

    def starting(self, label: str) -> None:
        with self._lock:
            self.running = label

    def finished(self, result: Result) -> None:
        with self._lock:
            self.done += 1
            self.failed += not result.passed and not result.unjudged
            self.running = ""
        self._show_if_due()

    def line(self) -> tuple[str, dict[str, Any]]:
        """The progress line and its fields (done, total, failed, seconds, running)."""
        with self._lock:
            fields: dict[str, Any] = {"done": self.done, "total": self.total, "failed": self.failed,
                                      "seconds": round(self.clock() - self.started, 1), "running": self.running}
        text = f"progress: {fields['done']}/{fields['total']} checks done, {fields['failed']} failed, " \
               f"{fields['seconds']:.0f} s"
        return (text + f"; running {fields['running']}" if fields["running"] else text), fields

    def _show_if_due(self) -> None:
        if self.say is None:
            return
        now = self.clock()
        with self._lock:
            if now - self._shown < self.every:
                return
            self._shown = now
        text, fields = self.line()
        self.say(text, fields)

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self._show_if_due()

    def close(self) -> None:
        """Stop the ticker (the run's own summary follows)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

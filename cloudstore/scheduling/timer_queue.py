"""Work handed to a pool at a time of its own: one thread waits for the soonest, none sleeps per item.

The runner paces a job's finish a second after its claim (``claiming.FINISH_PACE``): at
ten jobs a second a thread sleeping per finish would be ten threads, and a pool of
sleepers would cap finishes at its size a second.  Here one thread keeps a heap by
time and submits each item to the pool when its time comes; ``close`` submits what
is left at once (a runner stopping finishes what it fired rather than leave it to
recovery) and waits for the pool.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class TimerQueue:
    """``at(when, fn)``: ``fn`` runs on one of ``workers`` pool threads once ``time.monotonic()`` reaches ``when``."""

    def __init__(self, workers: int, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties by arrival, and never a comparison of two callables
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"{name}-timer", daemon=True)
        self._thread.start()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Queue ``fn`` for ``when``; once closed, run it here and now (nothing is dropped)."""
        with self._wake:
            if not self._closed:
                heapq.heappush(self._heap, (when, next(self._order), fn))
                self._wake.notify()
                return
        fn()

    def pending(self) -> int:
        """Items not yet handed to the pool."""
        with self._wake:
            return len(self._heap)

    def _loop(self) -> None:
        with self._wake:
            while not self._closed:
                now = time.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    self._pool.submit(heapq.heappop(self._heap)[2])
                self._wake.wait(None if not self._heap else self._heap[0][0] - now)

    def close(self) -> None:
        """Hand every pending item to the pool now and wait for all of them to end."""
        with self._wake:
            self._closed = True
            left, self._heap = self._heap, []
            self._wake.notify()
        self._thread.join(5)
        for _, _, fn in sorted(left):
            self._pool.submit(fn)
        self._pool.shutdown(wait=True)

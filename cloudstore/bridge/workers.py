"""A bounded pool of threads for proved calls.

A thread per connection let a flood of connections make thousands of
threads (2,653 measured), and one failed thread start raised out of the
accept loop and ended it. Here threads are started only as calls need them,
never more than ``most`` (the bridge's ``max_calls``: a call holds a slot
while it waits here, so there is never more work than threads), and a thread
that cannot be started costs that one call a ``busy`` answer, nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ..errors import CloudstoreError

log = logging.getLogger("cloudstore.bridge")

Job = Callable[[], None]


class PoolBusy(CloudstoreError):
    """No thread can take the job now (none idle, and none could be started)."""


class WorkerPool:
    """Runs jobs on at most ``most`` threads, started lazily and kept until ``close``."""

    def __init__(self, most: int, name: str = "bridge-call") -> None:
        self.most = most
        self.name = name
        self._cond = threading.Condition()
        self._jobs: deque[Job] = deque()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._closed = False

    def _start_thread(self, thread: threading.Thread) -> None:
        """Start one worker thread (its own method, so a test can make it fail)."""
        thread.start()

    def submit(self, job: Job) -> None:
        """Run ``job`` on a worker soon, or raise PoolBusy without keeping it.

        Never raises anything else: the caller is the accept loop, which must
        outlive every failure of a single call.
        """
        with self._cond:
            if self._closed:
                raise PoolBusy("the bridge is stopping")
            if self._idle > len(self._jobs):
                self._jobs.append(job)
                self._cond.notify()
                return
            if len(self._threads) >= self.most:
                raise PoolBusy(f"all {self.most} call threads are busy")
            thread = threading.Thread(target=self._run, name=f"{self.name}-{len(self._threads)}", daemon=True)
            self._threads.add(thread)
            self._jobs.append(job)
        try:
            self._start_thread(thread)
        except BaseException as exc:  # RuntimeError("can't start new thread"), MemoryError, ...
            with self._cond:
                self._threads.discard(thread)
                try:
                    self._jobs.remove(job)
                except ValueError:
                    return  # an idle worker freed up meanwhile and took it: it runs
            log.warning("cannot start a call thread: %s", exc)
            raise PoolBusy(f"cannot start a thread for the call ({type(exc).__name__})") from exc

    def _run(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._cond:
                    self._idle += 1
                    try:
                        while not self._jobs and not self._closed:
                            self._cond.wait()
                        if not self._jobs:
                            return
                        job = self._jobs.popleft()
                    finally:
                        self._idle -= 1
                try:
                    job()
                except BaseException:  # a bug in one call must cost that call, never the worker
                    log.exception("a call failed")
        finally:
            with self._cond:
                self._threads.discard(me)
                self._cond.notify_all()

    def threads(self) -> int:
        """Worker threads alive now."""
        with self._cond:
            return len(self._threads)

    def close(self, deadline: float | None = None) -> None:
        """Let queued and running jobs finish, then end every worker; wait until ``deadline``
        (a time.monotonic() value; None: without end)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            while self._threads:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)

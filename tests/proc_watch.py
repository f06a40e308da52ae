"""What a process holds, read from /proc: resident memory, descriptors, threads, children.

For the soak test (tests/test_soak.py) and benchmarks/agent_memory.py: a
``Sampler`` thread reads a process every few seconds while a workload runs,
and ``growth`` says how much each figure rose after a warm-up.  Linux only
(the callers skip where /proc has no ``status``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

HAS_PROC = os.path.exists("/proc/self/status")


def status(pid: int, field: str) -> int:
    """A number of /proc/PID/status (kB for memory); 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return 0


def children(pid: int) -> dict[int, str]:
    """The processes ``pid``'s threads started, with their state letter (``Z``: a zombie not yet reaped)."""
    found: dict[int, str] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.update((int(child), "?") for child in f.read().split())
    except (FileNotFoundError, ProcessLookupError):
        return {}
    for child in found:
        try:
            with open(f"/proc/{child}/stat") as f:
                text = f.read()
            found[child] = text[text.rindex(")") + 2]  # after "pid (comm) ": the state
        except (FileNotFoundError, ProcessLookupError):
            found[child] = "gone"
    return found


def stop(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """SIGTERM ``proc`` unless it has ended, and wait for it (killed past ``timeout``): its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@dataclass(frozen=True)
class Sample:
    """One look at a process: when (seconds since the sampler began), and what it held."""

    at: float
    rss_kib: int
    fds: int
    threads: int
    children: int
    zombies: tuple[int, ...]
    progress: int  # what the workload had done by then (agents served, jobs put): the caller's count
    children_rss_kib: int = 0


def look(pid: int, at: float, progress: int) -> Sample:
    kids = children(pid)
    return Sample(at, status(pid, "VmRSS"), fds(pid), status(pid, "Threads"), len(kids),
                  tuple(sorted(k for k, state in kids.items() if state == "Z")), progress,
                  sum(status(k, "VmRSS") for k in kids))


class Sampler:
    """Samples ``pid`` every ``every`` seconds on a thread of its own until ``stop``."""

    def __init__(self, pid: int, every: float, progress: Callable[[], int]) -> None:
        self.pid = pid
        self.every = every
        self.progress = progress
        self.samples: list[Sample] = []
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append(look(self.pid, time.monotonic() - self.began, self.progress()))
            if self._stop.wait(self.every):
                return

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        self.samples.append(look(self.pid, time.monotonic() - self.began, self.progress()))
        return self.samples


def table(samples: list[Sample], rows: int = 24) -> str:
    """Some of ``samples`` (evenly spread, the last included) as lines to print with a failure."""
    step = max(1, len(samples) // rows)
    shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
    lines = ["  s       rss MiB  fds  threads  children  zombies  progress  children's rss MiB"]
    lines += [f"  {s.at:6.1f}  {s.rss_kib / 1024:8.1f}  {s.fds:3d}  {s.threads:7d}  {s.children:8d}  "
              f"{len(s.zombies):7d}  {s.progress:8d}  {s.children_rss_kib / 1024:8.1f}" for s in shown]
    return "\n".join(lines)

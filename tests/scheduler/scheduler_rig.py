"""Helpers of the scheduler tests: runner processes, the jobs they fire, and checks of what fired.

``Rig`` starts runners (``python -m cloudstore.scheduler`` with a JSON config),
puts jobs through a driver of its own, and reads back what the fire command
(``fire_record.py``) recorded; ``intervals``, ``overlaps`` and ``refires`` judge
it from the command's side (with the runners' logs for the ends of the fires
they killed, ``killed_ends``).  A runner can be stopped for a while
(``RunnerProc.pause``: SIGSTOP, SIGCONT) and the machine starved of CPU
(``starved``): the pauses of issue 44 (``benchmarks/scheduler_pauses.py`` uses
them too).  A module of its own name (not conftest) so
that tests import it unambiguously beside other test folders' conftests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from support import wait_for as support_wait_for

from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling.fire import FireResult
from cloudstore.scheduling.log import read_events

FIRE = [sys.executable, "-S", str(Path(__file__).with_name("fire_record.py"))]
AGENTS = [{"owner": None, "id": "a"}, {"owner": "o", "id": "b"}]


@dataclass(frozen=True)
class Backend:
    """A store for one test: the driver program and the settings that reach a fresh prefix."""

    name: str
    driver: str
    env: dict[str, str]
    scale: float  # job counts are multiplied by this (emulators are slower than a folder)


@dataclass
class RunnerProc:
    proc: subprocess.Popen
    log: Path

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The runner's JSON log lines (stderr), those of event ``name`` only if given."""
        return read_events(self.log, name)

    def pause(self, seconds: float) -> None:
        """Stop the runner process itself (SIGSTOP, as a VM stall or a swap storm does) for ``seconds``, then
        let it go on (SIGCONT); its drivers and its fires' commands run on meanwhile."""
        self.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.proc.send_signal(signal.SIGCONT)


@contextmanager
def starved(processes: int | None = None) -> Iterator[list[subprocess.Popen]]:
    """A machine starved of CPU: one busy-loop process per core (or ``processes``), ended on leaving."""
    loops = [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"], stdin=subprocess.DEVNULL)
             for _ in range(processes or os.cpu_count() or 1)]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()


@dataclass
class Rig:
    backend: Backend
    root: Path
    store: ServeProcess
    runners: list[RunnerProc] = field(default_factory=list)

    @property
    def record(self) -> Path:
        return self.root / "fired.jsonl"

    def start_runner(self, env: dict[str, str] | None = None, **settings: Any) -> RunnerProc:
        """One runner process for both agents, its config JSON made of ``settings`` (``env``: more of
        its environment)."""
        n = len(self.runners)
        config = {
            "agents": AGENTS,
            "driver": self.backend.driver,
            "driver_env": self.backend.env,
            "fire": FIRE + [str(self.record)],
            "poll_interval": 1.0,  # a nudge wakes the runners for puts made here; polls only load the emulator
            **settings,
        }
        path = self.root / f"runner{n}.json"
        path.write_text(json.dumps(config))
        log = self.root / f"runner{n}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cloudstore.scheduler", "--config", str(path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                env=None if env is None else {**os.environ, **env},
            )
        runner = RunnerProc(proc, log)
        self.runners.append(runner)
        return runner

    def wait_started(self, timeout: float = 30.0) -> None:
        wait_for(lambda: all(r.events("started") for r in self.runners), timeout, "runners to start")

    def put(self, agent: dict[str, Any], job_id: str, due: float, spec: Any = None, place: str = "waiting") -> None:
        reply = self.store.request({"op": "job_put", "agent": agent, "place": place,
                                    "job": {"id": job_id, "spec": spec, "due": due}})
        assert reply == {"reply": "done"}, reply

    def count(self, agent: dict[str, Any], place: str) -> int:
        return self.store.request({"op": "job_count", "agent": agent, "place": place})["count"]

    def listing(self, agent: dict[str, Any], place: str) -> list[dict[str, Any]]:
        return self.store.request({"op": "job_list", "agent": agent, "place": place})["jobs"]

    def empty(self) -> bool:
        """Every job of both agents has left waiting, firing and ending."""
        return all(self.count(a, p) == 0 for a in AGENTS for p in ("waiting", "firing", "ending"))

    def records(self, ev: str | None = None) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        lines = [json.loads(line) for line in self.record.read_text().splitlines()]
        return [r for r in lines if ev is None or r["ev"] == ev]

    def stop_all(self, hurry: bool = False) -> None:
        """SIGTERM every runner still alive and wait: their 'stopped' events get written.  ``hurry``: a
        second SIGTERM a moment later, which kills the fires under way instead of waiting for them (a
        test whose fires sleep long has asserted what it needed by then)."""
        for r in self.runners:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)  # one stopped (``pause``) would not see the SIGTERM
                r.proc.send_signal(signal.SIGTERM)
        if hurry:
            time.sleep(0.5)  # the first signal handled: two at once would be one
            for r in self.runners:
                if r.proc.poll() is None:
                    r.proc.send_signal(signal.SIGTERM)
        for r in self.runners:
            try:
                r.proc.wait(15)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


#: The tests' one hang guard (tests/support.py), polling a runner's files every 0.1 s.
wait_for = partial(support_wait_for, every=0.1)


def key(record: dict[str, Any]) -> tuple[str | None, str, str]:
    """A firing's job as (owner, agent, job id)."""
    return (record["owner"], record["agent"], record["job"])


def intervals(
    records: list[dict[str, Any]], cut: dict[int, float] | None = None,
    killed: dict[tuple[int, tuple], list[float]] | None = None,
) -> dict[tuple, list[tuple[float, float]]]:
    """Each job's firings as (start, end) from its start/end records, matched by the firing process.

    Each start is ended by the first end after it of the same runner and job:
    an end record, or a kill the runner logged (``killed``, from
    ``killed_ends``: a command killed with SIGKILL records no end).  A start
    with no end belongs to a fire killed with its runner: ``cut`` gives when
    that runner (by pid) was killed, which ends it; any other open one is
    taken to run on forever (so it overlaps whatever comes after it).
    """
    starts: dict[tuple, dict[int, list[float]]] = {}
    ends: dict[tuple, dict[int, list[float]]] = {}
    for r in records:
        side = starts if r["ev"] == "start" else ends
        side.setdefault(key(r), {}).setdefault(r["ppid"], []).append(r["t"])
    out: dict[tuple, list[tuple[float, float]]] = {}
    for job, by_runner in starts.items():
        for ppid, ts in by_runner.items():
            left = sorted(ends.get(job, {}).get(ppid, []) + (killed or {}).get((ppid, job), []))
            for t0 in sorted(ts):
                t1 = next((t for t in left if t >= t0), None)
                if t1 is None:
                    t1 = (cut or {}).get(ppid, float("inf"))
                else:
                    left.remove(t1)
                out.setdefault(job, []).append((t0, t1))
    return out


def killed_ends(runners: list[RunnerProc]) -> dict[tuple[int, tuple], list[float]]:
    """When each fire its runner killed (a claim fenced or lost, a timeout) ended, by (runner pid, job), from the
    runner's ``fired`` events (started + duration)."""
    out: dict[tuple[int, tuple], list[float]] = {}
    for r in runners:
        for e in r.events("fired"):
            if e.get("killed"):
                out.setdefault((r.proc.pid, key(e)), []).append(e["started"] + e["duration_ms"] / 1000)
    return out


Span = tuple[float, float]


def overlaps(spans: dict[tuple, list[Span]]) -> list[tuple[tuple, Span, Span]]:
    """Every firing that began while another firing of its job still ran: (job, that one, this one)."""
    out = []
    for job, runs in spans.items():
        runs = sorted(runs)
        for i, later in enumerate(runs):
            running = [earlier for earlier in runs[:i] if later[0] < earlier[1]]
            if running:
                out.append((job, running[0], later))
    return out


def refires(records: list[dict[str, Any]]) -> int:
    """Firings beyond each job's first (from the start records)."""
    starts = Counter(key(r) for r in records if r["ev"] == "start")
    return sum(n - 1 for n in starts.values())


def assert_no_overlap(spans: dict[tuple, list[Span]]) -> None:
    """No job was being fired by two runners at the same time."""
    for job, (s0, e0), (s1, e1) in overlaps(spans)[:1]:
        raise AssertionError(f"job {job} fired twice at once: {s0:.3f}-{e0:.3f} and {s1:.3f}-{e1:.3f}")


class QuickFire:
    """A fire that ends at once with exit 0, counting its runs: for tests of what happens around a fire."""

    def __init__(self) -> None:
        self.fired = 0

    def run(self, *args: object) -> FireResult:
        self.fired += 1
        return FireResult(started=0.0, exit=0, duration=0.0, killed=None)

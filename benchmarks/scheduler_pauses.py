#!/usr/bin/env python3
"""Double and overlapping fires per 1,000 jobs when the store is slow, the machine starved, a runner stopped (issue 44).

    python benchmarks/scheduler_pauses.py [--tree PATH] [--jobs 100] [--lapses 3,10,30]
        [--modes slow,starved,stopped] [--delay 0.3] [--runners 3] [--fire-seconds 1] [--rate 2] [--seed 44]

For each lapse and each mode, ``--runners`` runner processes (``python -m
cloudstore.scheduler``, started as tests/scheduler/scheduler_rig.py starts
them, two agents each) serve one fresh prefix of moto's S3 server through
the fault proxy (tests/faults/http_proxy.py), which holds every request
``--delay`` seconds (``latency``: half on the way in, half on the way out).
``--jobs`` jobs are put ahead of time, straight to moto (the puts are not
what is measured), due ``--rate`` a second, each a fire of
``--fire-seconds`` (``fire_record.py``: a line when the command starts and
when it ends, or is stopped with SIGTERM).  The modes:

* ``slow``: the slow store alone;
* ``starved``: the slow store AND one busy-loop process per core for the
  whole run (the machine's runners, drivers and emulator get what is left);
* ``stopped``: no delay at the proxy, and ``--stops`` times (at seeded moments
  while jobs are due) the runner firing a long job (due 2 s before, one more
  job put for each stop, lasting past the stop) is stopped (SIGSTOP) for
  the lapse plus ``--stop-extra`` seconds, then continued (SIGCONT): issue
  44's third case, a runner stopped while its command runs (on a slow store
  a fire that long is fenced before any stop: see ``slow`` with
  ``--fire-seconds 3``).

Once every job has fired and the store holds none in waiting, firing or
ending (or ``--patience`` seconds past the last due), printed per run, from
the command's side: jobs put, jobs fired, **double fires** (firings beyond a
job's first, however far apart) and **overlapping fires** (firings that
began while another firing of the same job still ran), each also per 1,000
jobs put; from the runners' logs, fires killed (``fenced`` / ``lost``) and
``lost_job`` events; and the longest stall a probe thread of this process
saw (a 10 ms sleep that woke late), a measure of the starving.  A table
for benchmarks/README.md ends the output.

The code measured is the one ``python -m cloudstore.scheduler`` and the
drivers import: ``--tree PATH`` (a checkout: its folder goes first on their
``PYTHONPATH``), else the ``PYTHONPATH`` this runs with, else this checkout
(never whatever an editable install points at).  The rig, the proxy and the
fire command are always this checkout's.  Figures, not assertions: they are
counts of rare events on a shared machine; run the same command on two trees
to compare them.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "scheduler")]  # this checkout's rig

from emulators import Emulator, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy  # noqa: E402
from scheduler_rig import AGENTS, Backend, Rig, intervals, key, killed_ends, overlaps, refires, starved  # noqa: E402

from cloudstore.protocol.client import ServeProcess  # noqa: E402

MODES = ("slow", "starved", "stopped")
LONG_LEAD = 2.0  # seconds a stop's long job is due before the stop


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Result:
    lapse: float
    mode: str
    put: int
    fired: int
    doubles: int
    overlapping: int
    killed: int
    lost_jobs: int
    stops: int
    stall: float  # the longest late wake-up of the probe thread, seconds
    finished: bool

    def per_1000(self, n: int) -> str:
        return f"{n * 1000 / self.put:.0f}" if self.put else "-"


class Probe:
    """A thread that sleeps 10 ms at a time and keeps the longest it overslept: how starved this machine is."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            time.sleep(0.01)
            self.worst = max(self.worst, time.monotonic() - began - 0.01)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measured_tree(tree: str | None) -> str:
    """Point the runners' and drivers' imports at the measured tree; which it is."""
    chosen = tree or os.environ.get("PYTHONPATH") or str(ROOT)
    os.environ["PYTHONPATH"] = str(Path(chosen.split(os.pathsep)[0]).resolve()) if tree else chosen
    found = subprocess.run([sys.executable, "-c", "import cloudstore, os; print(os.path.dirname(cloudstore.__file__))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "-C", found, "log", "-1", "--format=%h %cs"], capture_output=True, text=True)
    return f"{found} ({head.stdout.strip() or 'not a git checkout'})"


@contextmanager
def stops_while_due(rig: Rig, times: list[float], seconds: float, rng: random.Random,
                    first: float) -> Iterator[list[str]]:
    """At each of ``times`` (time.time()), SIGSTOP for ``seconds`` the runner firing the long job put for it (else
    one firing any job, else any); what was stopped, when (seconds after ``first``, the first due)."""
    done: list[str] = []
    quit_ = threading.Event()

    def run() -> None:
        for k, at in enumerate(times):
            if quit_.wait(max(0.0, at - time.time())):
                return
            live = [r for r in rig.runners if r.proc.poll() is None]
            firing = firing_now(rig)
            chosen = ([r for r in live if r.proc.pid in firing.get(f"long{k}", set())]
                      or [r for r in live if any(r.proc.pid in pids for pids in firing.values())] or live)
            if not chosen:
                return
            runner = rng.choice(sorted(chosen, key=lambda r: r.proc.pid))
            done.append(f"runner {rig.runners.index(runner)} at +{time.time() - first:.1f} s"
                        f"{'' if runner.proc.pid in firing.get(f'long{k}', set()) else ' (not firing its long job)'}")
            runner.pause(seconds)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        quit_.set()
        thread.join()


def firing_now(rig: Rig) -> dict[str, set[int]]:
    """Job id -> the runners (pids) firing it now: started and not ended, from the command's side."""
    records, now = rig.records(), time.time()
    by = {(key(r), r["t"]): r["ppid"] for r in records if r["ev"] == "start"}
    spans = intervals(records, killed=killed_ends(rig.runners))
    out: dict[str, set[int]] = {}
    for job, runs in spans.items():
        for t0, t1 in runs:
            if t0 <= now < t1:
                out.setdefault(job[2], set()).add(by[(job, t0)])
    return out


def one_run(em: Emulator, lapse: float, mode: str, args: argparse.Namespace, rng: random.Random) -> Result:
    delay = 0.0 if mode == "stopped" else args.delay
    progress(f"lapse {lapse:g} s, {mode}: {args.jobs} jobs, {args.runners} runners, store {delay:g} s a request")
    prefix = f"pauses-{uuid.uuid4().hex[:10]}"
    direct = {**em.env, "LNK_BUCKET_URL": f"s3://{em.bucket}/{prefix}"}
    with ExitStack() as stack:
        if args.keep:
            root = Path(args.keep) / f"lapse{lapse:g}-{mode}-{prefix}"
            root.mkdir(parents=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        proxy = stack.enter_context(FaultProxy(em.env["AWS_ENDPOINT_URL_S3"], flavor="s3", latency=delay))
        putter = ServeProcess("lnk-bucket-store", direct, stderr=subprocess.DEVNULL)
        stack.callback(putter.close)
        rig = Rig(Backend("moto", "lnk-bucket-store", proxy.redirect(direct), 1.0), root, putter)
        stack.callback(rig.stop_all)
        loops = stack.enter_context(starved() if mode == "starved" else nullcontext([]))
        probe = stack.enter_context(Probe())
        for n in range(args.runners):
            rig.start_runner(lapse=lapse, runner=f"r{n}")
        rig.wait_started(120)
        first = time.time() + 2.0 + 0.05 * args.jobs  # due once the puts are surely in
        span = args.jobs / args.rate
        for i in range(args.jobs):
            rig.put(AGENTS[i % 2], f"j{i}", first + i / args.rate, {"sleep": args.fire_seconds})
        stop_times = sorted(first + rng.uniform(0, span) for _ in range(args.stops if mode == "stopped" else 0))
        stop = lapse + args.stop_extra
        for k, at in enumerate(stop_times):  # a job whose fire outlasts the stop, started just before it
            rig.put(AGENTS[k % 2], f"long{k}", at - LONG_LEAD, {"sleep": stop + LONG_LEAD + 2.0})
        stopped = stack.enter_context(stops_while_due(rig, stop_times, stop, rng, first))
        deadline = first + span + args.patience + 3 * lapse
        finished = False
        while time.time() < deadline:
            time.sleep(1.0)
            started = {key(r) for r in rig.records("start")}
            if len(started) >= args.jobs + len(stop_times) and time.time() > first + span and rig.empty():
                finished = True
                break
        time.sleep(args.fire_seconds + 1.0)  # the last fires' ends
        records = rig.records()
        spans = intervals(records, killed=killed_ends(rig.runners))
        killed = sum(1 for r in rig.runners for e in r.events("fired") if e.get("killed"))
        lost_jobs = sum(len(r.events("lost_job")) for r in rig.runners)
        result = Result(lapse, mode, args.jobs + len(stop_times), len({key(r) for r in records if r["ev"] == "start"}),
                        refires(records), len(overlaps(spans)), killed, lost_jobs, len(stopped), probe.worst,
                        finished)
        progress(f"  {'' if finished else 'NOT FINISHED: '}fired {result.fired} of {result.put}, double fires "
                 f"{result.doubles}, overlapping {result.overlapping}, killed {killed}, lost_job {lost_jobs}, "
                 f"stops {stopped}, busy loops {len(loops)}, longest stall {probe.worst:.2f} s, "
                 f"{proxy.count()} store requests")
        return result


def table(results: list[Result], args: argparse.Namespace) -> str:
    modes = {"slow": f"{args.delay:g} s store", "starved": f"{args.delay:g} s store + starved",
             "stopped": f"no delay + {args.stops} SIGSTOPs of lapse + {args.stop_extra:g} s"}
    lines = ["| lapse | store / machine | jobs put | fired | double fires (per 1,000) | overlapping fires "
             "(per 1,000) | fires killed | lost_job | longest stall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.lapse:g} s | {modes[r.mode]} | {r.put} | {r.fired}{'' if r.finished else ' (unfinished)'} "
                     f"| {r.doubles} ({r.per_1000(r.doubles)}) | {r.overlapping} ({r.per_1000(r.overlapping)}) "
                     f"| {r.killed} | {r.lost_jobs} | {r.stall:.2f} s |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--tree", default=None, help="the checkout whose runners and drivers are measured")
    parser.add_argument("--jobs", type=int, default=100, help="jobs put per run")
    parser.add_argument("--lapses", default="3,10,30", help="lease lapses, seconds, comma-separated")
    parser.add_argument("--modes", default="slow,starved,stopped", help=f"of {', '.join(MODES)}, comma-separated")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds the proxy holds each request")
    parser.add_argument("--runners", type=int, default=3)
    parser.add_argument("--fire-seconds", type=float, default=1.0, help="how long each fire's command runs")
    parser.add_argument("--rate", type=float, default=2.0, help="jobs due a second")
    parser.add_argument("--stops", type=int, default=2, help="SIGSTOPs of a runner per 'stopped' run")
    parser.add_argument("--stop-extra", type=float, default=3.0, help="a stop lasts the lapse plus this")
    parser.add_argument("--patience", type=float, default=60.0, help="seconds past the last due to wait for")
    parser.add_argument("--seed", type=int, default=44, help="chooses the stops' moments and runners")
    parser.add_argument("--keep", default=None, help="keep each run's runner logs and fire record below this folder")
    args = parser.parse_args(argv)
    args.lapse_list = [float(x) for x in args.lapses.split(",")]
    args.mode_list = [m.strip() for m in args.modes.split(",")]
    if not set(args.mode_list) <= set(MODES):
        parser.error(f"--modes: of {', '.join(MODES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    progress(f"measuring {measured_tree(args.tree)}; {os.cpu_count()} cores")
    rng = random.Random(args.seed)
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as wake:
        os.environ["LNK_WAKE_DIR"] = wake  # this run's runners and putters only: none of another's nudges
        em = start_moto()
        try:
            for lapse in args.lapse_list:
                for mode in args.mode_list:
                    results.append(one_run(em, lapse, mode, args, rng))
        finally:
            em.stop()
    print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

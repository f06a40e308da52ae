"""How late lnk-cloud-scheduler fires jobs, and how many store requests a fired job costs.

Three runner processes share two agents (one without owner, one with) on a
store; N jobs are put ahead of time, due evenly over a few seconds; each
firing's lateness is measured from its due to the moment the fire command
itself started (it records ``time.time()`` first thing, so a process start is
included) and, from the runner's ``fired`` log, to just before the runner
started it.

Requests: each runner counts what it sends through its StoreClient (its one
driver process) and logs it on exit; the benchmark adds them up over the
burst (idle ``job_mark`` polls during the burst included) and divides by the
jobs fired.  These are CLIENT requests to the driver: how many bucket
requests (GET/PUT/LIST) each one makes inside the driver is not visible from
outside the driver.

    python benchmarks/scheduler_lateness.py                   # file:// and moto
    python benchmarks/scheduler_lateness.py --backends file,moto,gcs --jobs 150

Prints a table on stdout; runner logs go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling.log import read_events
from cloudstore.scheduling.runner import WORKERS

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from emulators import Emulator, start_fake_gcs, start_moto  # noqa: E402  (tests/emulators.py: not installed)

AGENTS = [{"owner": None, "id": "a"}, {"owner": "o", "id": "b"}]
RECORDER = (
    "import json,os,sys,time\n"
    "t=time.time()\n"
    "line=json.dumps({'job':os.environ['LNK_JOB_ID'],'agent':os.environ['LNK_AGENT_ID'],"
    "'due':json.loads(os.environ['LNK_JOB_DUE']),'t':t})+'\\n'\n"
    "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_APPEND|os.O_CREAT,0o644)\n"
    "os.write(fd,line.encode())\n"
)


def store_for(name: str, stack: ExitStack, folder: Path) -> tuple[str, dict[str, str]]:
    """(driver, env) reaching a fresh prefix of ``name``'s store; emulators stopped with ``stack``."""
    prefix = uuid.uuid4().hex
    if name == "file":
        (folder / "store").mkdir()
        return "lnk-bucket-store", {"LNK_BUCKET_URL": (folder / "store").as_uri()}
    start = {"moto": start_moto, "gcs": start_fake_gcs}[name]
    em: Emulator = start()
    stack.callback(em.stop)
    if name == "moto":
        return "lnk-bucket-store", {**em.env, "LNK_BUCKET_URL": f"s3://{em.bucket}/{prefix}"}
    return "lnk-gcs", {**em.env, "LNK_GCS_URL": f"gs://{em.bucket}/{prefix}"}


BUCKET_LINE = re.compile(r"DEBUG op=\S+ reply=\S+ requests=(\d+)")


def start_runners(folder: Path, driver: str, env: dict[str, str], record: Path, n: int,
                  workers: int) -> list[tuple[subprocess.Popen, Path]]:
    runners = []
    for i in range(n):
        config = folder / f"runner{i}.json"
        config.write_text(json.dumps({
            # The driver logs each request's bucket requests on stderr (the runner's log).
            "agents": AGENTS, "driver": driver, "driver_env": {**env, "LNK_STORE_LOG": "debug"},
            "fire": [sys.executable, "-S", "-c", RECORDER, str(record)], "workers": workers,
        }))
        log = folder / f"runner{i}.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        runners.append((proc, log))
    return runners




def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.1)


def put_jobs(store: ServeProcess, jobs: int, spread: float) -> None:
    """Put ``jobs`` jobs due over ``spread`` s, starting once they are all surely in (timed from a warm-up)."""
    clock = time.monotonic()
    for i in range(5):  # warm-up: how long a put takes here
        store.request({"op": "job_put", "agent": {"id": "warm", "owner": None}, "place": "waiting",
                       "job": {"id": f"w{i}", "spec": None, "due": time.time() + 3600}})
    per_put = (time.monotonic() - clock) / 5
    for i in range(5):
        store.request({"op": "job_remove", "agent": {"id": "warm", "owner": None}, "place": "waiting", "id": f"w{i}"})
    first = time.time() + 1.0 + 2.0 * per_put * jobs
    for i in range(jobs):
        due = first + spread * i / max(1, jobs - 1)
        reply = store.request({"op": "job_put", "agent": AGENTS[i % 2], "place": "waiting",
                               "job": {"id": f"j{i}", "spec": {"n": i}, "due": due}})
        assert reply == {"reply": "done"}, reply
    if time.time() > first:
        print(f"  (warning: puts ran past the first due by {time.time() - first:.2f}s)", file=sys.stderr)


def run_one(name: str, jobs: int, spread: float, runners_n: int, workers: int) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"sched-{name}-")))
        driver, env = store_for(name, stack, folder)
        record = folder / "fired.jsonl"
        store = ServeProcess(driver, env, stderr=subprocess.DEVNULL)
        stack.callback(store.close)
        runners = start_runners(folder, driver, env, record, runners_n, workers)
        try:
            wait_until(lambda: all(read_events(log, "started") for _, log in runners), 60, "runners to start")
            put_jobs(store, jobs, spread)
            wait_until(lambda: record.exists() and len(record.read_text().splitlines()) >= jobs,
                       120 + spread, "every job to fire")
            time.sleep(1.0)  # let the last ones finish (shift to ending, remove, end lease)
        finally:
            for proc, _ in runners:
                proc.send_signal(signal.SIGTERM)
            for proc, _ in runners:
                proc.wait(30)
        fired = [json.loads(line) for line in record.read_text().splitlines()]
        logged = [e for _, log in runners for e in read_events(log, "fired")]
        stopped = [e for _, log in runners for e in read_events(log, "stopped")]
        bucket = sum(int(m.group(1)) for _, log in runners
                     for m in BUCKET_LINE.finditer(log.read_text(errors="replace")))
        by_op: Counter[str] = Counter()
        for e in stopped:
            by_op.update(e["by_op"])
        late = sorted((r["t"] - r["due"]) * 1000 for r in fired)
        runner_late = sorted(e["lateness_ms"] for e in logged)
        return {
            "backend": name,
            "jobs": jobs,
            "fired": len(fired),
            "distinct": len({(r["agent"], r["job"]) for r in fired}),
            "median_ms": statistics.median(late),
            "p90_ms": late[int(0.9 * (len(late) - 1))],
            "worst_ms": late[-1],
            "runner_median_ms": statistics.median(runner_late),
            "runner_worst_ms": runner_late[-1],
            "requests": sum(by_op.values()),
            "bucket": bucket,
            "by_op": dict(by_op),
            "per_runner": Counter(e["runner"] for e in logged),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="file,moto", help="comma-separated: file, moto, gcs")
    p.add_argument("--jobs", type=int, help="jobs per backend (default: 150 on file, 60 on an emulator)")
    p.add_argument(
        "--spread", type=float, help="seconds the dues are spread over (default: 5 on file, 10 on an emulator)"
    )
    p.add_argument("--runners", type=int, default=3)
    p.add_argument("--workers", type=int, default=WORKERS, help="jobs each runner fires at once")
    args = p.parse_args(argv)
    results = []
    for name in (n.strip() for n in args.backends.split(",")):
        # An emulator is one process on the same cores as everything else: at file's rate it only
        # measures its own backlog, so it gets a rate it sustains.
        jobs = args.jobs or (150 if name == "file" else 60)
        spread = args.spread or (5.0 if name == "file" else 10.0)
        print(f"# {name}: {args.runners} runners, 2 agents, {jobs} jobs due over {spread}s, "
              f"{args.workers} worker(s) each", file=sys.stderr)
        results.append(run_one(name, jobs, spread, args.runners, args.workers))
        results[-1]["spread"] = spread
    print(f"{'backend':8} {'jobs':>5} {'jobs/s':>6} {'fired':>5} {'median ms':>10} {'p90 ms':>8} {'worst ms':>9} "
          f"{'runner med/worst ms':>20} {'requests/job':>13} {'w/o job_mark':>13} {'bucket req/job':>15}")
    for r in results:
        print(
            f"{r['backend']:8} {r['jobs']:5d} {r['jobs'] / r['spread']:6.1f} {r['fired']:5d} "
            f"{r['median_ms']:10.1f} {r['p90_ms']:8.1f} "
            f"{r['worst_ms']:9.1f} {r['runner_median_ms']:9.1f}/{r['runner_worst_ms']:<10.1f} "
            f"{r['requests'] / max(1, r['fired']):13.2f} "
            f"{(r['requests'] - r['by_op'].get('job_mark', 0)) / max(1, r['fired']):13.2f} "
            f"{r['bucket'] / max(1, r['fired']):15.2f}"
        )
    for r in results:
        per_job = {op: round(n / max(1, r["fired"]), 2) for op, n in sorted(r["by_op"].items())}
        print(f"{r['backend']}: client requests per fired job by op: {per_job}; "
              f"fired per runner: {sorted(r['per_runner'].values())}; duplicates: {r['fired'] - r['distinct']}")
    print("Lateness: due -> fire command's first line (process start included); 'runner': due -> just before "
          "spawning it. Requests: counted by each runner's StoreClient (requests to its driver) from start to "
          "stop, so idle job_mark polls (2 agents / 0.25 s = 8/s a runner, whether or not jobs come) are in "
          "'requests/job' and left out of 'w/o job_mark'. 'bucket req/job': the object-store requests the "
          "drivers made for all of it (their LNK_STORE_LOG=debug lines), idle polls included.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

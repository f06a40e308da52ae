"""What lnk-cloud-scheduler costs at a cloud's round trips: idle requests, requests per fired job, lateness.

Every bucket request of the runners goes through a latency-adding,
request-counting proxy (``tests/faults/http_proxy.py``, RTT a setting,
20 ms by default) in front of the emulator, so the counts are taken outside
the drivers.  Jobs are put by a driver of the benchmark's own that reaches
the emulator directly (not counted) and nudges no runner (another wake
folder): as if put from another machine.

* Idle: one runner with 1, 10, 100 agents (one waiting job due in a day, so
  the index is not empty) and nothing due: requests a minute after start-up,
  by kind, and what a day of that costs at list prices (GCS and S3 alike:
  $5 per million writes and lists, $0.40 per million reads; deletes free).
* Jobs: 3 runners (``--runners``) sharing 2 agents, jobs due at ``--rate`` a second: bucket
  requests per fired job (everything the runners sent from the first due to
  the last job finished, idle polls included), and lateness from due to the
  fire command's first line (median, p90, worst).
* A put due now from "another machine" while every runner sleeps, and one
  through a driver on the runners' machine (it nudges them): the put's reply
  -> the fire command's first line, and the same from when the put was sent
  (the put itself reaches the emulator directly, uncounted: 3 requests for a
  new job id), median and worst of ``--puts`` tries each, once a warm-up
  burst has taught the runners each other (so each job has an owner among them).

    python benchmarks/scheduler_cost.py                        # moto and gcs, 20 ms
    python benchmarks/scheduler_cost.py --backends moto --agents 1,10 --idle-seconds 20 --jobs 60

Figures, not assertions: prints a table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/faults, tests/emulators.py: not installed

from emulators import Emulator, start_fake_gcs, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy, Seen  # noqa: E402
from scheduler_lateness import RECORDER, wait_until  # noqa: E402  (benchmarks/: the fire command that records its start)

PRICE_WRITE_LIST = 5.0 / 1e6  # $ per PUT/POST/LIST (GCS class A, S3 PUT/LIST)
PRICE_READ = 0.40 / 1e6  # $ per GET/HEAD (GCS class B, S3 GET)
BACKENDS = {
    "moto": ("lnk-bucket-store", "LNK_BUCKET_URL", "s3", "AWS_ENDPOINT_URL_S3", "s3", start_moto),
    "gcs": ("lnk-gcs", "LNK_GCS_URL", "gs", "STORAGE_EMULATOR_HOST", "gcs", start_fake_gcs),
}


def progress(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def kind(seen: Seen) -> str:
    """A request's price class: list, write, read or delete (free)."""
    if seen.method == "DELETE":
        return "delete"
    if seen.method in ("PUT", "POST", "PATCH"):
        return "write"
    target = seen.target
    path = target.split("?", 1)[0]
    if "list-type=" in target or path.rstrip("/").endswith("/o") or ("prefix=" in target and path.count("/") <= 1):
        return "list"
    return "read"


def what(seen: Seen) -> str:
    """A request as ``METHOD kind-of-key`` (lease, job record, mark, due entry...), for the breakdown."""
    from urllib.parse import unquote

    path, _, query = seen.target.partition("?")
    target = unquote(unquote(path))
    named = re.search(r"(?:^|&)name=([^&]*)", query)  # a GCS upload names its object in the query...
    if named:
        target += "/" + unquote(unquote(named.group(1)))
    else:  # ...or in the metadata part of a multipart body
        in_body = re.search(rb'"name":\s*"([^"]*)"', seen.content)
        if in_body:
            target += "/" + in_body.group(1).decode("utf-8", "replace")
    in_conversation = re.search(r"/c/[^/]+/(p\d+/|e\d+/seg/)|/c/[^/]+/(d\d+/|e\d+/ev/)", target)
    if in_conversation:  # keys.py: p (0.3.0: e/seg) a packed block, d (0.3.0: e/ev) one event
        return f"{seen.method} {'segment' if in_conversation.group(1) else 'event'}"
    named_parts = (("/l/", "lease"), ("/j/", "job"), ("/mark", "mark"), ("_due/", "due"), ("/day", "day"))
    for part, name in named_parts:
        if part in target:
            return f"{seen.method} {name}"
    return f"{seen.method} {kind(seen)}"


def cost_per_day(kinds: dict[str, int], seconds: float) -> float:
    scale = 86400.0 / seconds
    return scale * (
        (kinds.get("list", 0) + kinds.get("write", 0)) * PRICE_WRITE_LIST + kinds.get("read", 0) * PRICE_READ
    )


def by_kind(seen: list[Seen]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in seen:
        out[kind(s)] = out.get(kind(s), 0) + 1
    return out


class Fleet:
    """Runner processes on one store, their drivers through the proxy."""

    def __init__(self, folder: Path, program: str, via: dict[str, str], record: Path) -> None:
        self.folder, self.program, self.via, self.record = folder, program, via, record
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, agents: list[dict[str, Any]], **timing: Any) -> None:
        i = len(self.procs)
        config = self.folder / f"runner{i}.json"
        config.write_text(json.dumps({
            "agents": agents, "driver": self.program, "driver_env": self.via,
            "fire": [sys.executable, "-S", "-c", RECORDER, str(self.record)], **timing,
        }))
        log = self.folder / f"runner{i}.log"
        env = {**os.environ, "LNK_WAKE_DIR": str(self.folder / "wake")}
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        self.procs.append((proc, log))

    def started(self) -> bool:
        return all(any(line.startswith("{") and json.loads(line).get("event") == "started"
                       for line in log.read_text(errors="replace").splitlines()) for _, log in self.procs)

    def stop(self) -> None:
        for proc, _ in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()

    def fired(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]


def agents_of(n: int) -> list[dict[str, Any]]:
    return [{"owner": "bench", "id": f"agent{i}"} for i in range(n)]


def put(store: ServeProcess, agent: dict[str, Any], job_id: str, due: float) -> None:
    reply = store.request({"op": "job_put", "agent": agent, "place": "waiting",
                           "job": {"id": job_id, "spec": {"n": job_id}, "due": due}}, timeout=60)
    assert reply == {"reply": "done"}, reply


def claim_floor(name: str, em: Emulator, proxy: FaultProxy, folder: Path, tries: int) -> dict[str, float]:
    """What any claim of three round trips costs before its fire starts, with nothing of ours in the way.

    The raw SDK, in this process, through the same proxy: two small
    requests at once (a create and a GET: the lease, the record), then two
    more at once (the mark and the claim-index entry), then one more (the
    record), then the runner's own
    ``FireCommand`` starts the benchmark's fire command (the recorder); from
    the first request to the command's first line, median and worst of
    ``tries``.
    """
    from concurrent.futures import ThreadPoolExecutor

    from cloud_round_trips import BACKENDS as RAW_BACKENDS
    from cloud_round_trips import RawSDK

    from cloudstore.scheduling.fire import FireCommand
    from cloudstore.scheduling.store_client import Agent

    raw = RawSDK(RAW_BACKENDS[name], proxy.url, em.env, em.bucket)
    prefix = f"floor-{uuid.uuid4().hex[:8]}/"
    raw.create(prefix + "record", b"{}")
    record = folder / "floor.jsonl"
    fire = FireCommand([sys.executable, "-S", "-c", RECORDER, str(record)], timeout=60)
    took: list[float] = []
    with ThreadPoolExecutor(max_workers=3) as pool:
        for i in range(tries):
            time.sleep(0.3)
            start = time.time()
            for round_calls in (((raw.create, f"{prefix}lease{i}", b"{}"), (raw.get, prefix + "record")),
                                ((raw.create, f"{prefix}mark{i}", b"{}"), (raw.create, f"{prefix}claim{i}", b""))):
                for future in [pool.submit(*call) for call in round_calls]:  # one round: sent at once, all awaited
                    future.result()
            raw.create(f"{prefix}record{i}", b"{}")
            fire.run(Agent(owner=None, id="floor"), {"id": f"floor{i}", "spec": None, "due": start}, False,
                     lambda: None)
            line = [json.loads(x) for x in record.read_text().splitlines() if x.strip()][-1]
            took.append((line["t"] - start) * 1000)
    return {"median_ms": statistics.median(took), "worst_ms": max(took)}


def run_backend(name: str, args: argparse.Namespace) -> dict[str, Any]:
    program, setting, scheme, endpoint_var, flavor, start = BACKENDS[name]
    out: dict[str, Any] = {"backend": name, "idle": [], "jobs": None, "prompt": None, "floor": None}
    with ExitStack() as stack:
        progress(f"{name}: starting the emulator")
        em: Emulator = start()
        stack.callback(em.stop)
        proxy = stack.enter_context(FaultProxy(em.env[endpoint_var], flavor=flavor, latency=args.rtt_ms / 1000))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"schedcost-{name}-")))

        def fresh() -> tuple[dict[str, str], dict[str, str]]:
            url = f"{scheme}://{em.bucket}/{uuid.uuid4().hex[:10]}"
            direct = {**em.env, setting: url, "LNK_WAKE_DIR": str(folder / "elsewhere")}
            return direct, proxy.redirect({**em.env, setting: url})

        # -- idle
        for n in (args.agents if "idle" in args.parts else []):
            direct, via = fresh()
            store = ServeProcess(program, direct, stderr=subprocess.DEVNULL)
            put(store, agents_of(1)[0], "tomorrow", time.time() + 86400)
            store.close()
            fleet = Fleet(folder, program, via, folder / f"idle{n}.jsonl")
            fleet.start(agents_of(n))
            try:
                wait_until(fleet.started, 120, "the runner to start")
                time.sleep(args.settle)  # start-up: every agent's firing listed once
                proxy.clear()
                time.sleep(args.idle_seconds)
                kinds = by_kind(proxy.requests())
            finally:
                fleet.stop()
            total = sum(kinds.values())
            out["idle"].append({"agents": n, "per_minute": total * 60 / args.idle_seconds, "kinds": kinds,
                                "per_day_usd": cost_per_day(kinds, args.idle_seconds)})
            progress(f"{name}: idle, {n} agents: {total * 60 / args.idle_seconds:.1f} requests/min {kinds}")

        if "jobs" not in args.parts:
            return out
        # -- jobs at a rate
        direct, via = fresh()
        agents = agents_of(2)
        record = folder / "jobs.jsonl"
        fleet = Fleet(folder, program, via, record)
        for _ in range(args.runners):
            fleet.start(agents)
        store = ServeProcess(program, direct, stderr=subprocess.DEVNULL)
        stack.callback(store.close)
        try:
            wait_until(fleet.started, 120, "the runners to start")
            clock = time.monotonic()  # how long a put takes here, so that every put is in before the first due
            for i in range(5):
                put(store, agents[0], f"warm{i}", time.time() + 86400)
            per_put = (time.monotonic() - clock) / 5
            first = time.time() + 2.0 + 2.0 * per_put * args.jobs
            for i in range(args.jobs):
                put(store, agents[i % 2], f"j{i}", first + i / args.rate)
            if time.time() > first - 0.5:
                progress("warning: the puts ran close to the first due")
            time.sleep(max(0.0, first - 0.5 - time.time()))
            proxy.clear()
            wait_until(lambda: len(fleet.fired()) >= args.jobs, 120 + args.jobs / args.rate, "every job to fire")
            wait_until(lambda: store.request({"op": "job_count", "agent": agents[0], "place": "ending"})["count"] == 0
                       and store.request({"op": "job_count", "agent": agents[1], "place": "ending"})["count"] == 0
                       and store.request({"op": "job_count", "agent": agents[0], "place": "firing"})["count"] == 0
                       and store.request({"op": "job_count", "agent": agents[1], "place": "firing"})["count"] == 0,
                       60, "every job to finish")
            seen = proxy.requests()
        finally:
            fleet.stop()
        fired = fleet.fired()
        late = sorted((r["t"] - r["due"]) * 1000 for r in fired)
        out["jobs"] = {
            "jobs": args.jobs,
            "rate": args.rate,
            "fired": len(fired),
            "runners": args.runners,
            "duplicates": len(fired) - len({r["job"] for r in fired}),
            "per_job": len(seen) / max(1, len(fired)),
            "kinds": by_kind(seen),
            "breakdown": {
                k: round(v / max(1, len(fired)), 2) for k, v in sorted(Counter(what(x) for x in seen).items())
            },
            "median_ms": statistics.median(late),
            "p90_ms": late[int(0.9 * (len(late) - 1))],
            "worst_ms": late[-1],
        }
        progress(f"{name}: jobs: {out['jobs']}")

        # -- a put due now from another machine, and from this one, every runner asleep (and, after a
        # warm-up burst, knowing each other: each due job has an owner among them)
        direct, via = fresh()
        record = folder / "prompt.jsonl"
        fleet = Fleet(folder, program, via, record)
        for _ in range(3):
            fleet.start(agents)
        elsewhere = ServeProcess(program, direct, stderr=subprocess.DEVNULL)
        here = ServeProcess(program, {**direct, "LNK_WAKE_DIR": str(folder / "wake")}, stderr=subprocess.DEVNULL)
        stack.callback(elsewhere.close)
        stack.callback(here.close)
        took: dict[str, list[float]] = {"elsewhere": [], "here": []}  # from the put sent
        replied: dict[str, list[float]] = {"elsewhere": [], "here": []}  # from the put's reply

        def fired_at(job_id: str) -> float | None:
            return next((r["t"] for r in fleet.fired() if r["job"] == job_id), None)

        try:
            wait_until(fleet.started, 120, "the runners to start")
            warm = time.time() + 0.5
            for i in range(30):
                put(elsewhere, agents[i % 2], f"warm{i}", warm + i * 0.05)
            wait_until(lambda: len(fleet.fired()) >= 30, 120, "the warm-up jobs to fire")
            for where, store in (("elsewhere", elsewhere), ("here", here)):
                for i in range(args.puts):
                    time.sleep(1.0 + (i * 0.37) % 1.0)  # land at varied points of the runners' poll
                    job_id, at = f"{where}{i}", time.time()
                    put(store, agents[i % 2], job_id, at)
                    done = time.time()
                    wait_until(lambda job_id=job_id: fired_at(job_id) is not None, 60, "the job put due now to fire")
                    took[where].append(((fired_at(job_id) or at) - at) * 1000)
                    replied[where].append(((fired_at(job_id) or done) - done) * 1000)
        finally:
            fleet.stop()
        out["floor"] = claim_floor(name, em, proxy, folder, args.puts)
        out["prompt"] = {where: {"median_ms": statistics.median(ms), "worst_ms": max(ms), "tries": len(ms),
                                 "reply_median_ms": statistics.median(replied[where]),
                                 "reply_worst_ms": max(replied[where])}
                         for where, ms in took.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="moto,gcs", help="comma-separated: moto, gcs")
    p.add_argument("--rtt-ms", type=float, default=20.0, help="latency the proxy adds to every request")
    p.add_argument("--agents", default="1,10,100", help="agent counts for the idle figure")
    p.add_argument("--idle-seconds", type=float, default=60.0, help="how long idle requests are counted")
    p.add_argument("--settle", type=float, default=5.0, help="seconds after start-up before idle counting")
    p.add_argument("--jobs", type=int, default=240, help="jobs fired for the per-job figures")
    p.add_argument("--rate", type=float, default=12.0, help="jobs due a second")
    p.add_argument("--parts", default="idle,jobs", help="what to measure: idle, jobs (with the put-due-now figure)")
    p.add_argument("--runners", type=int, default=3, help="runners sharing the agents for the per-job figures")
    p.add_argument("--puts", type=int, default=7, help="puts due now timed, from each place")
    args = p.parse_args(argv)
    args.agents = [int(n) for n in args.agents.split(",")]
    args.parts = set(args.parts.split(","))
    results = [run_backend(name.strip(), args) for name in args.backends.split(",")]
    print(f"RTT {args.rtt_ms:g} ms at the proxy; requests counted there.")
    print(f"{'backend':8} {'agents':>6} {'idle req/min':>12} {'$/day (list prices)':>20}  by kind")
    for r in results:
        for row in r["idle"]:
            print(f"{r['backend']:8} {row['agents']:6d} {row['per_minute']:12.1f} "
                  f"{row['per_day_usd']:20.4f}  {row['kinds']}")
    print(f"{'backend':8} {'runners':>7} {'jobs':>5} {'jobs/s':>6} {'fired':>5} {'dup':>4} {'req/job':>8} "
          f"{'median ms':>10} {'p90 ms':>8} {'worst ms':>9}  by kind")
    for r in results:
        j = r["jobs"]
        if j is None:
            continue
        print(
            f"{r['backend']:8} {j['runners']:7d} {j['jobs']:5d} {j['rate']:6.1f} {j['fired']:5d} {j['duplicates']:4d} "
            f"{j['per_job']:8.2f} {j['median_ms']:10.1f} {j['p90_ms']:8.1f} {j['worst_ms']:9.1f}  {j['kinds']}"
        )
    for r in results:
        if r["jobs"] is not None:
            print(f"{r['backend']}: bucket requests per fired job by request and key: {r['jobs']['breakdown']}")
    for r in results:
        if r["prompt"] is None:
            continue
        for where, words in (("elsewhere", "from another machine"), ("here", "on the runners' machine (nudged)")):
            q = r["prompt"][where]
            print(f"{r['backend']}: a job put due now {words}, runners asleep: fired "
                  f"{q['reply_median_ms']:.0f} ms median, {q['reply_worst_ms']:.0f} ms worst after the put's reply; "
                  f"{q['median_ms']:.0f} / {q['worst_ms']:.0f} ms after it was sent ({q['tries']} tries)")
        f = r["floor"]
        print(f"{r['backend']}: the floor of a three-round claim (raw SDK: 2 requests at once, 2 at once, then 1) "
              f"and the same fire command's start: {f['median_ms']:.0f} ms median, {f['worst_ms']:.0f} ms worst")
    return 0


if __name__ == "__main__":
    sys.exit(main())

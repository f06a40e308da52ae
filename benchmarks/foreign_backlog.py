"""A runner beside another agent's backlog in the shared due index: its requests per poll and its lateness.

Issue 25, case 2.  An agent no runner serves leaves ``--foreign`` entries in
the store's shared due index (10,000 by default), due in 1970 (``old``) or
due now (``now``), written straight to the emulator (uncounted).  One runner
serves another agent; its driver reaches the emulator through the
latency-adding, request-counting proxy (``tests/faults/http_proxy.py``), so
every figure is counted outside the driver:

* idle: bucket requests a minute, and LISTs a minute (a poll is one job_due,
  one LIST), once start-up is over;
* lateness: ``--puts`` jobs of the served agent put due now "from another
  machine" (a driver of the benchmark's own, no nudge), one every 1-2 s: from
  the put's due to the fire command's first line, median and worst, and how
  many fired at all within ``--wait`` seconds.

    python benchmarks/foreign_backlog.py                          # moto, both backlogs
    python benchmarks/foreign_backlog.py --backends moto,gcs --foreign 10000 --puts 10
    PYTHONPATH=/path/to/old/checkout python benchmarks/foreign_backlog.py   # the same against older code

Figures, not assertions: a table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from scheduler_cost import BACKENDS, Fleet, by_kind, progress, put  # benchmarks/

from cloudstore.protocol.client import ServeProcess


def plant(direct: dict[str, str], setting: str, count: int, due_at: float) -> None:
    """``count`` waiting jobs of agents nobody serves, put in-process through the seam, 32 at once (uncounted)."""
    import os

    from cloudstore.protocol.service import Service
    from cloudstore.protocol.validate import Agent
    from cloudstore.settings import open_store, parse_location
    from cloudstore.store.space import Space

    saved = dict(os.environ)
    os.environ.update(direct)
    try:
        loc = parse_location(setting, direct[setting], ("gs", "s3", "file"))
        service = Service(Space(open_store(loc), loc.prefix))
        # 100 agents nobody serves: one agent's puts would all queue on its job mark.
        strangers = [Agent(owner="stranger", id=f"nobody-serves-me-{n}") for n in range(100)]

        def one(i: int) -> None:
            job = {"id": f"backlog-{i:06d}", "spec": None, "due": due_at + i * 1e-6}
            service.jobs.put(strangers[i % len(strangers)], "waiting", job)

        with ThreadPoolExecutor(32) as pool:
            list(pool.map(one, range(count)))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(name: str, backlog: str, args: argparse.Namespace) -> dict[str, Any]:
    program, setting, scheme, endpoint_var, flavor, start = BACKENDS[name]
    from faults.http_proxy import FaultProxy

    with ExitStack() as stack:
        em = start()
        stack.callback(em.stop)
        proxy = stack.enter_context(FaultProxy(em.env[endpoint_var], flavor=flavor, latency=args.rtt_ms / 1000))
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"backlog-{name}-")))
        url = f"{scheme}://{em.bucket}/{uuid.uuid4().hex[:10]}"
        direct = {**em.env, setting: url, "LNK_WAKE_DIR": str(folder / "elsewhere")}
        via = proxy.redirect({**em.env, setting: url})
        progress(f"{name}/{backlog}: planting {args.foreign} foreign entries")
        t = time.time()
        plant(direct, setting, args.foreign, 100.0 if backlog == "old" else time.time())
        progress(f"{name}/{backlog}: planted in {time.time() - t:.0f} s")
        mine = {"owner": "bench", "id": "served"}
        record = folder / "fired.jsonl"
        fleet = Fleet(folder, program, via, record)
        fleet.start([mine])
        elsewhere = ServeProcess(program, direct, stderr=subprocess.DEVNULL)
        stack.callback(elsewhere.close)
        try:
            deadline = time.time() + 120
            while not fleet.started() and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(args.settle)
            proxy.clear()
            time.sleep(args.idle_seconds)
            idle = by_kind(proxy.requests())
            put_at: dict[str, float] = {}
            for i in range(args.puts):
                time.sleep(1.0 + (i * 0.37) % 1.0)
                job_id = f"mine{i}"
                put_at[job_id] = time.time()
                put(elsewhere, mine, job_id, put_at[job_id])
            end = time.time() + args.wait
            while time.time() < end and len({r["job"] for r in fleet.fired()}) < args.puts:
                time.sleep(0.2)
        finally:
            fleet.stop()
        fired = {r["job"]: r["t"] for r in fleet.fired()}
        late = sorted((fired[j] - at) * 1000 for j, at in put_at.items() if j in fired)
    per_minute = {k: v * 60 / args.idle_seconds for k, v in idle.items()}
    return {"backend": name, "backlog": backlog, "foreign": args.foreign, "idle_per_min": sum(per_minute.values()),
            "lists_per_min": per_minute.get("list", 0.0), "fired": len(late), "puts": args.puts,
            "median_ms": statistics.median(late) if late else None, "worst_ms": late[-1] if late else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="moto", help="comma-separated: moto, gcs")
    p.add_argument("--backlogs", default="old,now", help="comma-separated: old (due in 1970), now (due now)")
    p.add_argument("--foreign", type=int, default=10_000, help="entries of the agent nobody serves")
    p.add_argument("--rtt-ms", type=float, default=20.0, help="latency the proxy adds to every request")
    p.add_argument("--settle", type=float, default=10.0, help="seconds after start-up before idle counting")
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--puts", type=int, default=8, help="jobs of the served agent put due now, from elsewhere")
    p.add_argument("--wait", type=float, default=60.0, help="seconds after the last put to wait for fires")
    args = p.parse_args(argv)
    rows = [run(b, kind, args) for b in args.backends.split(",") for kind in args.backlogs.split(",")]
    print("| backend | backlog | foreign | idle req/min | LISTs/min | fired | lateness median / worst ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        late = "-" if r["median_ms"] is None else f"{r['median_ms']:.0f} / {r['worst_ms']:.0f}"
        print(f"| {r['backend']} | {r['backlog']} | {r['foreign']} | {r['idle_per_min']:.1f} | "
              f"{r['lists_per_min']:.1f} | {r['fired']}/{r['puts']} | {late} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How often an agent's mark shards meet GCS's per-object limit, by shard count (issue 26, case 1).

    python benchmarks/mark_shards.py [--shards 32,64,128,256] [--rate 10] [--claimers 12]
        [--seconds 20] [--seeds 20]

A model, seeded and replayable, of the writes that reach the mark at one
agent's ``--rate`` jobs a second: each job's put (one putter process) and
its claim (one of ``--claimers`` driver processes, 0.05-0.3 s after the put)
each write one shard, picked by that process's own ``job_mark.ShardPicker``
(the drivers' code: the shard it wrote least recently, ties at random), a
refused write moving at once (one 20 ms round trip later) to the next of its
``TRIES`` shards, as ``job_mark.bump`` does.  The limit is the fault proxy's
own ``RateLimit`` (1 write a second per object name, burst 2) on a stepped
clock, so a run takes no real time and a seed replays exactly.

Printed per shard count: refused shard writes per run (mean and worst over
``--seeds`` runs) and per 1,000 mark writes, and writes that used every try
(the last waits the throttle out: a delay, never an error).  The proxied
benchmark (``throttle_scheduler.py``) measures the same on fake-gcs-server
with real processes; this one shows the curve behind the choice of
``job_mark.SHARDS`` without minutes of runs per point.  Goal: no refusal.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/faults: not installed

from faults.http_proxy import RateLimit  # noqa: E402

from cloudstore.store import job_mark  # noqa: E402

RTT = 0.02  # seconds between a refused try and the next shard's


class Clock:
    """The model's time: stepped by the run, read by the pickers and the limit."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def one_run(shards: int, rate: float, claimers: int, seconds: float, seed: int) -> tuple[int, int, int]:
    """(refused writes, mark writes sent, changes that used every try) of one seeded run."""
    rng = random.Random(seed)
    clock = Clock()
    limit = RateLimit("gcs-object", rate=1.0, burst=2.0, clock=clock)
    pickers = [job_mark.ShardPicker(shards, rng=random.Random(rng.random()))
               for _ in range(claimers + 1)]  # 0: the putter
    changes = []
    for i in range(int(seconds * rate)):
        put_at = i / rate
        changes.append((put_at, 0))
        changes.append((put_at + rng.uniform(0.05, 0.3), 1 + rng.randrange(claimers)))
    changes.sort()
    sent = every_try = 0
    for when, process in changes:
        picker = pickers[process]
        order = picker.order("a/o/bench/", job_mark.TRIES)
        for n, shard in enumerate(order):
            clock.now = when + n * RTT
            picker.used("a/o/bench/", shard)
            sent += 1
            if limit.admit("POST", f"/upload/storage/v1/b/bucket/o?name=a/o/bench/m/{shard}", b""):
                break
        else:
            every_try += 1
    return limit.refused, sent, every_try


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default=f"32,64,{job_mark.SHARDS},256")
    parser.add_argument("--rate", type=float, default=10.0, help="jobs a second (a put and a claim each)")
    parser.add_argument("--claimers", type=int, default=12, help="claiming driver processes (3 runners x 4)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args(argv)
    print(f"{args.rate:g} jobs/s for {args.seconds:g} s, 1 putter + {args.claimers} claimers, "
          f"{args.seeds} seeds; goal: 0 refused")
    print("| shards | refused a run, mean / worst | per 1,000 mark writes | every try used |")
    print("|---|---|---|---|")
    for shards in (int(s) for s in args.shards.split(",")):
        runs = [one_run(shards, args.rate, args.claimers, args.seconds, seed) for seed in range(args.seeds)]
        refused = [r for r, _, _ in runs]
        per_k = 1000 * sum(refused) / sum(s for _, s, _ in runs)
        mark = " (job_mark.SHARDS)" if shards == job_mark.SHARDS else ""
        print(f"| {shards}{mark} | {statistics.mean(refused):.1f} / {max(refused)} | {per_k:.1f} | "
              f"{sum(e for _, _, e in runs)} |", flush=True)


if __name__ == "__main__":
    main()

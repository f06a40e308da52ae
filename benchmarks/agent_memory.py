#!/usr/bin/env python3
"""A serve process's memory as it meets more and more agents (issue 44, item 5).

    cd /tmp && PYTHONPATH=<tree> python3 <checkout>/benchmarks/agent_memory.py [--agents 100000]
        [--writes 2] [--holder 100] [--every 10000] [--seed 44]

One ``lnk-bucket-store serve`` on a folder store (a temporary ``file://``
folder, a wake folder of its own), driven through ``--agents`` distinct
agents: each gets ``--writes`` changes of its waiting (a ``job_put``, then
``job_remove`` and ``job_put`` in turn: a mark shard written each, what the
shard picker remembers) and a lease taken on a thread of its own (a head
written, with a holder of ``--holder`` characters).  Requests are written 64
ahead of their replies, so the process runs at its own speed.  Printed every
``--every`` agents: the serve process's RSS (VmRSS) and peak (VmHWM), its
descriptors and threads, and the time so far.

``PYTHONPATH`` chooses the code measured: the driver imports whatever
``cloudstore`` the path finds, so run it from outside a checkout (``cd
/tmp``).  About 10 minutes for 100,000 agents on a 2-core machine.  Figures:
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # proc_watch: not installed

from proc_watch import fds, status  # noqa: E402

BATCH = 64


def requests_of(n: int, writes: int, holder: str) -> list[dict]:
    agent = {"owner": "bench", "id": f"agent-{n:07d}"}
    put = {"op": "job_put", "agent": agent, "place": "waiting", "job": {"id": "j", "spec": None, "due": 4e9}}
    out = [put if w % 2 == 0 else {"op": "job_remove", "agent": agent, "place": "waiting", "id": "j"}
           for w in range(writes)]
    return out + [{"op": "take", "agent": agent, "thread": "l", "holder": holder, "lapse_ms": 60_000}]


def send(proc: subprocess.Popen, batch: list[dict]) -> None:
    """Write ``batch`` ahead of its replies and read them all; exit on an error reply."""
    assert proc.stdin is not None and proc.stdout is not None
    replies: list[bytes] = []
    reader = threading.Thread(target=lambda: replies.extend(proc.stdout.readline() for _ in batch), daemon=True)
    reader.start()
    proc.stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in batch))
    proc.stdin.flush()
    reader.join()
    for request, reply in zip(batch, replies, strict=True):
        if not reply or json.loads(reply).get("reply") == "error":
            sys.exit(f"{request['op']} of {request['agent']['id']}: {reply[:300]!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--writes", type=int, default=2, help="changes of waiting an agent (mark shards written)")
    parser.add_argument("--holder", type=int, default=100, help="characters of each lease's holder")
    parser.add_argument("--every", type=int, default=10_000, help="agents between two rows")
    parser.add_argument("--seed", type=int, default=44, help="the holders' text")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="agent-memory-") as work:
        store, wake = os.path.join(work, "store"), os.path.join(work, "wake")
        os.mkdir(store)
        os.mkdir(wake, 0o700)
        env = {**os.environ, "LNK_BUCKET_URL": f"file://{store}", "LNK_WAKE_DIR": wake}
        proc = subprocess.Popen(["lnk-bucket-store", "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env)
        try:
            import cloudstore

            print(f"code: {os.path.dirname(os.path.dirname(os.path.abspath(cloudstore.__file__)))} "
                  f"(the driver's: PYTHONPATH {os.environ.get('PYTHONPATH', '')!r}); {args.agents} agents, "
                  f"{args.writes} mark writes and a lease each, holders of {args.holder} characters")
            print("| agents | RSS MiB | peak MiB | fds | threads | seconds |")
            print("|---|---|---|---|---|---|")
            began, batch = time.monotonic(), []

            def row(n: int) -> None:
                pid = proc.pid
                print(f"| {n:,} | {status(pid, 'VmRSS') / 1024:.1f} | {status(pid, 'VmHWM') / 1024:.1f} | "
                      f"{fds(pid)} | {status(pid, 'Threads')} | {time.monotonic() - began:.0f} |", flush=True)

            send(proc, [{"op": "job_mark", "agent": {"owner": "bench", "id": "warm"}}])
            row(0)
            for n in range(args.agents):
                holder = f"{rng.randrange(10**9):09d}".ljust(args.holder, "h")
                batch += requests_of(n, args.writes, holder)
                if len(batch) >= BATCH or n + 1 == args.agents or (n + 1) % args.every == 0:
                    send(proc, batch)
                    batch = []
                if (n + 1) % args.every == 0 or n + 1 == args.agents:
                    row(n + 1)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)


if __name__ == "__main__":
    main()

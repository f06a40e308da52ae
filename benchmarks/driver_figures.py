"""Figures for the drivers: latency and bucket requests per op, in serve mode.

Run: ``python benchmarks/driver_figures.py [--events 1000] [--agents 1000]``

For each backend (local folder, moto's S3 server, fake-gcs-server, the last
two started here as processes) it runs a real ``serve`` process with
``LNK_STORE_LOG=debug``, which logs to stderr, per request, how many backend
requests it made; the figures below are read from that log and from the
client-side clock.  It prints, per backend:

* append: median latency and requests, over ``--events`` appends;
* read(1) of that conversation, from the writer's process and from a fresh
  process that remembers nothing; ``last`` from a fresh process;
* job_next with ``--agents`` agents each holding a waiting job;
* job_shift, file_write and tools_narrow.

Figures, not assertions: these machines are noisy.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

from cloudstore.protocol.client import ServeProcess

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from emulators import start_fake_gcs, start_moto  # noqa: E402  (tests/emulators.py: test machinery, not installed)

LINE = re.compile(r"op=(\S+) reply=(\S+) requests=(\d+) ms=([\d.]+)")


class Probe:
    """A serve process whose per-request backend counts we can read back."""

    def __init__(self, program: str, env: dict[str, str]) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = ServeProcess(program, env={**env, "LNK_STORE_LOG": "debug"}, stderr=self.log)
        self.seen = 0
        # Warm up: the SDK import and first connection are paid here, not in a figure.
        self.timed([{"op": "last", "agent": {"id": "warm-up", "owner": None}, "thread": "warm-up"}])

    def timed(self, requests: list[dict]) -> tuple[list[float], list[int]]:
        """Send each request; client-side ms and backend requests of each."""
        times = []
        for req in requests:
            start = time.perf_counter()
            reply = self.proc.request(req, timeout=120)
            times.append((time.perf_counter() - start) * 1000)
            if reply.get("reply") == "error":
                raise RuntimeError(f"{req['op']}: {reply}")
        return times, self._counts(len(requests))

    def _counts(self, n: int) -> list[int]:
        deadline = time.time() + 5
        while True:
            self.log.flush()
            with open(self.log.name) as f:
                found = [int(m.group(3)) for m in map(LINE.search, f) if m]
            if len(found) >= self.seen + n or time.time() > deadline:
                break
            time.sleep(0.02)
        counts = found[self.seen : self.seen + n]
        self.seen += n
        return counts

    def close(self) -> None:
        self.proc.close()
        os.unlink(self.log.name)


def summary(name: str, times: list[float], counts: list[int]) -> str:
    return (f"  {name:<34} median {statistics.median(times):8.2f} ms   worst {max(times):8.2f} ms   "
            f"requests median {statistics.median(counts):g} max {max(counts)}")


def bench(label: str, program: str, env: dict[str, str], events: int, agents: int) -> None:
    print(f"\n{label}")
    agent = {"id": "bench", "owner": "o"}
    thread = "long"
    writer = Probe(program, env)
    appends = [{"op": "append", "agent": agent, "thread": thread, "event": {"seq": i, "text": "x" * 200}}
               for i in range(1, events + 1)]
    t, c = writer.timed(appends)
    print(summary(f"append ({events} events)", t, c))
    t, c = writer.timed([{"op": "read", "agent": agent, "thread": thread, "first": 1}] * 10)
    print(summary(f"read(1) of {events}, writer process", t, c))
    fresh = [Probe(program, env) for _ in range(5)]
    reads = [p.timed([{"op": "read", "agent": agent, "thread": thread, "first": 1}]) for p in fresh]
    print(summary(f"read(1) of {events}, fresh process", [r[0][0] for r in reads], [r[1][0] for r in reads]))
    lasts = [Probe(program, env) for _ in range(5)]
    got = [p.timed([{"op": "last", "agent": agent, "thread": thread}]) for p in lasts]
    print(summary("last, fresh process", [g[0][0] for g in got], [g[1][0] for g in got]))
    for p in fresh + lasts:
        p.close()

    puts = [{"op": "job_put", "agent": {"id": f"agent-{i}", "owner": f"owner-{i % 7}"}, "place": "waiting",
             "job": {"id": "j", "spec": {"i": i}, "due": 2_000_000_000 + i}} for i in range(agents)]
    put_times, put_counts = writer.timed(puts)
    t, c = writer.timed([{"op": "job_next", "agent": agent}] * 20)
    print(summary(f"job_next, {agents} agents waiting", t, c))
    print(summary("job_put into waiting", put_times, put_counts))
    shifts = []
    for i in range(20):
        shifts.append({"op": "job_shift", "agent": puts[i]["agent"], "id": "j", "from": "waiting", "to": "firing"})
    t, c = writer.timed(shifts)
    print(summary("job_shift waiting->firing", t, c))
    writes = [{"op": "file_write", "agent": agent, "path": "skills/s/SKILL.md", "data": "aGVsbG8=", "version": v}
              for v in range(0, 20)]
    t, c = writer.timed(writes)
    print(summary("file_write (update)", t, c))
    narrows = [{"op": "tools_narrow", "agent": agent, "thread": f"t{i}", "tools": ["a", "b"]} for i in range(20)]
    t, c = writer.timed(narrows)
    print(summary("tools_narrow", t, c))
    writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--only", choices=["file", "moto", "gcs"], action="append")
    args = parser.parse_args()
    only = set(args.only or ["file", "moto", "gcs"])
    if "file" in only:
        with tempfile.TemporaryDirectory() as folder:
            bench(
                "local folder (file://)",
                "lnk-bucket-store",
                {"LNK_BUCKET_URL": f"file://{folder}"},
                args.events,
                args.agents,
            )
    if "moto" in only:
        em = start_moto()
        try:
            env: dict[str, Any] = {**em.env, "LNK_BUCKET_URL": f"s3://{em.bucket}/{uuid.uuid4().hex[:8]}"}
            bench("moto S3 server", "lnk-bucket-store", env, args.events, args.agents)
        finally:
            em.stop()
    if "gcs" in only:
        em = start_fake_gcs()
        try:
            env = {**em.env, "LNK_GCS_URL": f"gs://{em.bucket}/{uuid.uuid4().hex[:8]}"}
            bench("fake-gcs-server (memory)", "lnk-gcs", env, args.events, args.agents)
        finally:
            em.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())



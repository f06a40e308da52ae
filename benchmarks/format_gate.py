#!/usr/bin/env python3
"""What the format record and the server check cost a process: requests, rounds and time, before and after.

    python benchmarks/format_gate.py [--rtt-ms 20] [--repeats 7] [--backends moto,gcs] [--before 0.5.0]

For each backend (moto's S3 server, fake-gcs-server, started here) a ``FaultProxy`` holds every request
``--rtt-ms`` and counts it.  A store with its record and every probe shard made (what every process but a
store's first meets) is answered:

* ``call`` mode, a fresh process per op: ``last`` of a one-event conversation, and an ``append`` to it;
  the process's wall time (start to exit, the SDK's import included), the requests and the rounds at the
  proxy, and the gate's share of them (requests naming ``_format`` or ``_probe/``);
* ``serve`` mode: the first op of a process, then the next 20 (the gate is paid once).

"before" runs the release ``--before`` names (tests/upgrade/releases.json: built from git history),
which has no gate, through the same proxy in the same run.  Medians of ``--repeats``.  Figures, not
assertions (tests/test_format_gate_cost.py guards the counts).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "upgrade"))

import json  # noqa: E402

from emulators import start_fake_gcs, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy, Seen  # noqa: E402
from faults.rounds import gate_kind, rounds_of  # noqa: E402
from releases import HEAD, driver_command  # noqa: E402

from cloudstore.gate import server_check  # noqa: E402
from cloudstore.generations import RetryingStore  # noqa: E402
from cloudstore.protocol.client import ServeProcess  # noqa: E402
from cloudstore.settings import open_backend, parse_location  # noqa: E402


def gate_share(seen: list[Seen]) -> int:
    return sum(1 for s in seen if gate_kind(s) is not None)


def call(argv: list[str], env: dict[str, str], request: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """(the process's wall ms, the op's own ms as the driver logs it, the reply)."""
    began = time.monotonic()
    done = subprocess.run(argv + ["call"], input=json.dumps(request).encode(),
                          env={**os.environ, **env, "LNK_STORE_LOG": "debug"}, capture_output=True, timeout=120)
    ms = (time.monotonic() - began) * 1000
    logged = re.findall(r"ms=([0-9.]+)", done.stderr.decode())
    return ms, float(logged[-1]) if logged else float("nan"), json.loads(done.stdout.decode().splitlines()[-1])


def prepare(env: dict[str, str], setting: str) -> None:
    """The record and every probe shard, as a store any process but its first meets."""
    os.environ.update(env)
    location = parse_location(setting, env[setting], ("gs", "s3"))
    raw = RetryingStore(open_backend(location, create=False))
    for shard in range(server_check.SHARDS):
        server_check.Probe(raw, location.prefix, raw.label, shard).create()
    subprocess.run(driver_command(HEAD, "lnk-bucket-store" if setting == "LNK_BUCKET_URL" else "lnk-gcs")
                   + ["call"], input=json.dumps({"op": "append", "agent": {"id": "warm", "owner": None},
                                                  "thread": "w", "event": {"seq": 1}}).encode(),
                   env={**os.environ, **env}, capture_output=True, timeout=120, check=True)


def run(backend: str, releases: list[str], rtt: float, repeats: int) -> None:
    em = start_moto() if backend == "moto" else start_fake_gcs()
    program = "lnk-bucket-store" if backend == "moto" else "lnk-gcs"
    setting = "LNK_BUCKET_URL" if backend == "moto" else "LNK_GCS_URL"
    endpoint = "AWS_ENDPOINT_URL_S3" if backend == "moto" else "STORAGE_EMULATOR_HOST"
    try:
        prepare(em.env, setting)
        with FaultProxy(em.env[endpoint], flavor="s3" if backend == "moto" else "gcs") as proxy:
            env = proxy.redirect(em.env)
            for release in releases:
                argv = driver_command(release, program)
                for op in ("last", "append"):
                    times, op_times, counts, rounds, gates = [], [], [], [], []
                    for _ in range(repeats):
                        agent = {"id": uuid.uuid4().hex, "owner": None}
                        call(argv, env, {"op": "append", "agent": agent, "thread": "t", "event": {"seq": 1}})
                        proxy.clear()
                        proxy.latency = rtt
                        request = ({"op": "last", "agent": agent, "thread": "t"} if op == "last" else
                                   {"op": "append", "agent": agent, "thread": "t", "event": {"seq": 2}})
                        ms, op_ms, reply = call(argv, env, request)
                        assert reply.get("reply") in ("last", "done"), reply
                        seen = proxy.requests()
                        times.append(ms)
                        op_times.append(op_ms)
                        counts.append(len(seen))
                        rounds.append(rounds_of(seen))
                        gates.append(gate_share(seen))
                        proxy.latency = 0.0
                    print(f"{backend:5} {release:6} call {op:6}  process {statistics.median(times):6.1f} ms, "
                          f"op {statistics.median(op_times):6.1f} ms  "
                          f"requests {statistics.median(counts):4.1f} (gate {statistics.median(gates):.0f})  "
                          f"rounds {statistics.median(rounds):.0f}", flush=True)
                proc = ServeProcess(argv, env=env)
                try:
                    agent = {"id": uuid.uuid4().hex, "owner": None}
                    proxy.clear()
                    proxy.latency = rtt
                    proc.request({"op": "last", "agent": agent, "thread": "s"}, timeout=60)
                    first = proxy.requests()
                    proxy.clear()
                    for n in range(1, 21):
                        proc.request({"op": "append", "agent": agent, "thread": "s", "event": {"seq": n}}, timeout=60)
                    rest = proxy.requests()
                    proxy.latency = 0.0
                finally:
                    proc.close()
                print(f"{backend:5} {release:6} serve first op: requests {len(first)} (gate {gate_share(first)}), "
                      f"next 20 appends: requests {len(rest)} (gate {gate_share(rest)})", flush=True)
    finally:
        em.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--backends", default="moto,gcs")
    p.add_argument("--before", default="0.5.0", help="a release of tests/upgrade/releases.json, or '' for none")
    args = p.parse_args()
    releases = [args.before, HEAD] if args.before else [HEAD]
    print(f"format gate at {args.rtt_ms:g} ms a request, medians of {args.repeats}; HEAD is this checkout")
    for backend in args.backends.split(","):
        run(backend, releases, args.rtt_ms / 1000, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What the store bridge costs: median latency of one append through the bridge,
straight to a ``serve`` process, and as a ``call`` process of its own.

    python benchmarks/bridge_latency.py [--n 200] [--call-n 20] [--backends file,moto]

The bridge runs as its own process (``lnk-store-bridge``), as it does beside a
harness, so client and bridge do not share an interpreter. Each way is warmed
once (processes started, SDKs imported) before it is timed; every append is a
new event of a new conversation's sequence, so each one really writes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

from cloudstore.bridge import SOCKET_NAME, BridgeClient
from cloudstore.bridge.proof import new_key_hex
from cloudstore.protocol.client import ServeProcess, call

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from emulators import start_moto  # noqa: E402  (tests/emulators.py: test machinery, not installed)

DRIVER = "lnk-bucket-store"
AGENT = {"id": "bench", "owner": "bench"}


def timed(n: int, send: Callable[[dict], dict]) -> list[float]:
    """Milliseconds for each of ``n`` appends (one conversation, seq 1..n), after one warm-up."""
    send({"op": "last", "agent": AGENT, "thread": "warm"})
    thread = f"bench-{uuid.uuid4().hex[:8]}"
    times = []
    for seq in range(1, n + 1):
        start = time.perf_counter()
        reply = send({"op": "append", "agent": AGENT, "thread": thread, "event": {"seq": seq, "text": "x" * 200}})
        times.append((time.perf_counter() - start) * 1000)
        if reply != {"reply": "done"}:
            raise SystemExit(f"append {seq} answered {reply}")
    return times


def through_bridge(env: dict[str, str], n: int, work: str) -> list[float]:
    harness, folder = os.path.join(work, "h"), os.path.join(work, "agent")
    os.makedirs(harness)
    os.makedirs(os.path.join(folder, "chats"))
    key_hex = new_key_hex()
    key_file = os.path.join(work, "key")
    with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(key_hex + "\n")
    args = ["lnk-store-bridge", "--harness", harness, "--agent-id", AGENT["id"], "--agent-owner", AGENT["owner"],
            "--key-file", key_file, "--agent-folder", folder, "--driver", DRIVER, "--log-level", "WARNING"]
    for k, v in env.items():
        args += ["--driver-env", f"{k}={v}"]
    proc = subprocess.Popen(args)
    sock = os.path.join(harness, SOCKET_NAME)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("lnk-store-bridge did not start")
            time.sleep(0.02)
        client = BridgeClient(sock, AGENT["owner"], AGENT["id"], bytes.fromhex(key_hex))
        return timed(n, client.request)
    finally:
        proc.terminate()
        proc.wait(60)


def straight_to_serve(env: dict[str, str], n: int) -> list[float]:
    with ServeProcess(DRIVER, env) as proc:
        return timed(n, proc.request)


def as_call(env: dict[str, str], n: int) -> list[float]:
    return timed(n, lambda request: call(DRIVER, request, env))


def summary(times: list[float]) -> str:
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else times * 9
    return f"median {statistics.median(times):8.2f} ms   p90 {q[-1]:8.2f} ms   (n={len(times)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="appends timed through the bridge and the serve process")
    parser.add_argument("--call-n", type=int, default=20, help="appends timed in call mode (a process each)")
    parser.add_argument("--backends", default="file,moto")
    args = parser.parse_args()
    if shutil.which(DRIVER) is None:
        raise SystemExit(f"{DRIVER} is not installed")
    for backend in args.backends.split(","):
        work = tempfile.mkdtemp(prefix="lsb-bench-", dir="/tmp")
        emulator = None
        try:
            if backend == "file":
                os.makedirs(os.path.join(work, "bucket"))
                env = {"LNK_BUCKET_URL": f"file://{work}/bucket"}
            elif backend == "moto":
                emulator = start_moto(bucket="bridge-bench")
                env = dict(emulator.env)
            else:
                raise SystemExit(f"unknown backend {backend!r} (file, moto)")
            print(f"{backend}:")
            print(f"  bridge   {summary(through_bridge(env, args.n, work))}")
            print(f"  serve    {summary(straight_to_serve(env, args.n))}")
            print(f"  call     {summary(as_call(env, args.call_n))}")
            sys.stdout.flush()
        finally:
            if emulator is not None:
                emulator.stop()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

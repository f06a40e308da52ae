#!/usr/bin/env python3
"""The store bridge under a flood of callers who prove nothing, and under huge requests.

    python benchmarks/bridge_flood.py [--flood 1000] [--calls 300] [--big 4] [--rounds 2]

The bridge runs as its own process (``lnk-store-bridge``) over a tiny serve
driver written here (it answers ``done`` to every line), so what is measured
is the bridge, not a store. Three phases, each bounded in count and time:

1. quiet: ``--calls`` proved calls one after another, latency p50/p99;
2. flood: ``--flood`` connections through the loopback Unix socket that
   connect, send a byte of a proof line every 0.25 s and never finish it,
   reconnecting whenever the bridge drops them; meanwhile the same proved
   calls, latency p50/p99/max and how many were answered busy; also the
   bridge's threads and RSS during the flood;
3. memory: ``--big`` proved agents at once, each sending ``--rounds`` pairs
   of 16 MiB request lines (one a single huge string, one ``[{},{},...]``,
   the costliest JSON to parse), then the bridge process's peak RSS
   (VmHWM) and how the lines were answered.

The goal (issue 12): under the flood, p99 under 100 ms; peak RSS under 256 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

from cloudstore.bridge import SOCKET_NAME, BridgeClient, exchange
from cloudstore.bridge.proof import new_key_hex

MiB = 1024 * 1024

DRIVER = r'''
import sys
if sys.argv[1:] == ["contract"]:
    print('{"version": 1, "serve": true}')
elif sys.argv[1:] == ["serve"]:
    for line in iter(sys.stdin.buffer.readline, b""):
        sys.stdout.write('{"reply": "done"}\n')
        sys.stdout.flush()
else:
    sys.exit(2)
'''


def status(pid: int, field: str) -> int:
    """A number from /proc/PID/status (kB for memory fields)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class Flood:
    """``n`` connections that never prove anything, kept up from one thread until stopped."""

    def __init__(self, path: str, n: int, interval: float = 0.25) -> None:
        self.path = path
        self.n = n
        self.interval = interval
        self.stop = threading.Event()
        self.connects = 0
        self.dropped = 0  # closed by the bridge (deadline, eviction), then reconnected
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, sel: selectors.BaseSelector) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(self.path)
        except (BlockingIOError, InterruptedError):
            sock.close()  # the backlog is full: try again next tick
            return False
        except OSError:
            sock.close()
            return False
        self.connects += 1
        sel.register(sock, selectors.EVENT_READ, b'{"agent": {"id": "')
        return True

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            missing = self.n
            next_send = time.monotonic()
            while not self.stop.is_set():
                while missing and self._open(sel):
                    missing -= 1
                for key, _ in sel.select(0.02):
                    try:
                        data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                    except OSError:
                        data = b""
                    if not data or b"\n" in data:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
                        self.dropped += 1
                        missing += 1
                now = time.monotonic()
                if now >= next_send:
                    next_send = now + self.interval
                    for key in list(sel.get_map().values()):
                        head = key.data
                        try:
                            key.fileobj.send(head[:1] if head else b"x")  # type: ignore[union-attr]
                            self.sent += 1
                        except OSError:
                            continue
                        if head:
                            sel.modify(key.fileobj, selectors.EVENT_READ, head[1:])
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]


def timed_calls(client: BridgeClient, n: int, pause: float = 0.0) -> tuple[list[float], Counter]:
    times, answers = [], Counter()
    for i in range(n):
        time.sleep(pause)
        start = time.perf_counter()
        reply = client.op("last", thread=f"t{i % 7}")
        times.append((time.perf_counter() - start) * 1000)
        answers[reply["reply"] if reply["reply"] != "error" else reply["error"].split(":")[0]] += 1
    return times, answers


def figures(times: list[float]) -> str:
    q = statistics.quantiles(times, n=100)
    return f"p50 {statistics.median(times):7.2f} ms  p99 {q[98]:7.2f} ms  max {max(times):7.2f} ms  (n={len(times)})"


def big_lines() -> list[tuple[str, bytes]]:
    head = b'{"op": "append", "agent": {"id": "bench", "owner": "bench"}, "thread": "big", "event": {"seq": 1, "x": '
    room = 16 * MiB - len(head) - 16
    return [
        ("16 MiB string", head + b'"' + b"x" * room + b'"}}'),
        ("16 MiB [{},...]", head + b"[" + b"{}," * (room // 3 - 1) + b"{}]}}"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=1000, help="unproved connections kept up at once")
    parser.add_argument("--calls", type=int, default=300, help="proved calls timed in each phase")
    parser.add_argument("--big", type=int, default=4, help="proved agents sending 16 MiB lines at once")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of 16 MiB lines each of them sends")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.flood + 512
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))  # the bridge inherits it too

    work = tempfile.mkdtemp(prefix="lsb-flood-", dir="/tmp")
    proc: subprocess.Popen | None = None
    try:
        harness, folder = os.path.join(work, "h"), os.path.join(work, "agent")
        os.makedirs(harness)
        os.makedirs(os.path.join(folder, "chats"))
        driver = os.path.join(work, "driver.py")
        with open(driver, "w") as f:
            f.write(DRIVER)
        key_hex = new_key_hex()
        key_file = os.path.join(work, "key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(key_hex + "\n")
        log_path = os.path.join(work, "bridge.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", harness, "--agent-id", "bench",
                 "--agent-owner", "bench", "--key-file", key_file, "--agent-folder", folder,
                 "--driver", f"{sys.executable} {driver}", "--log-level", "INFO"],
                stdout=subprocess.DEVNULL, stderr=log,
            )
        sock = os.path.join(harness, SOCKET_NAME)
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("lnk-store-bridge did not start")
            time.sleep(0.02)
        client = BridgeClient(sock, "bench", "bench", bytes.fromhex(key_hex), timeout=60)
        client.op("last", thread="warm")

        times, answers = timed_calls(client, args.calls)
        print(f"quiet:   proved call  {figures(times)}  {dict(answers)}")
        print(f"         bridge: {status(proc.pid, 'Threads')} threads, RSS {status(proc.pid, 'VmRSS') / 1024:.0f} MiB")
        sys.stdout.flush()

        flood = Flood(sock, args.flood)
        flood.thread.start()
        time.sleep(3.0)  # let it reach its size and start churning
        threads_seen = status(proc.pid, "Threads")
        # Spread over ~8 s: past the bridge's 5 s deadline, so the flood churns (dropped, reconnecting).
        times, answers = timed_calls(client, args.calls, pause=8.0 / args.calls)
        threads_seen = max(threads_seen, status(proc.pid, "Threads"))
        rss = status(proc.pid, "VmRSS") / 1024
        flood.stop.set()
        flood.thread.join(30)
        print(f"flood:   proved call  {figures(times)}  {dict(answers)}")
        print(f"         {args.flood} unproved connections kept up: {flood.connects} connects, "
              f"{flood.dropped} dropped by the bridge, {flood.sent} slow bytes sent")
        print(f"         bridge: at most {threads_seen} threads, RSS {rss:.0f} MiB")
        sys.stdout.flush()

        lines = big_lines()
        outcomes: Counter = Counter()
        lock = threading.Lock()

        def agent() -> None:
            for _ in range(args.rounds):
                for name, line in lines:
                    reply = json.loads(exchange(sock, [client.proof, line], timeout=120) or b'{"reply": "closed"}')
                    word = reply["reply"] if reply["reply"] != "error" else reply["error"].split(":")[0]
                    with lock:
                        outcomes[f"{name}: {word}"] += 1

        started = time.perf_counter()
        agents = [threading.Thread(target=agent) for _ in range(args.big)]
        for t in agents:
            t.start()
        for t in agents:
            t.join(600)
        took = time.perf_counter() - started
        print(f"memory:  {args.big} agents x {args.rounds} x 2 lines of 16 MiB in {took:.1f} s: "
              + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        print(f"         bridge peak RSS (VmHWM) over the whole run: {status(proc.pid, 'VmHWM') / 1024:.0f} MiB")
        times, answers = timed_calls(client, 20)
        print(f"after:   proved call  {figures(times)}  {dict(answers)}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
            with open(os.path.join(work, "bridge.log"), "rb") as f:
                print(f"         bridge log: {len(f.read().splitlines())} lines in all")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

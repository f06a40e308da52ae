#!/usr/bin/env python3
"""A proved call at the store bridge while idle TCP connections hold its metrics port (issue 25, item 4).

    python benchmarks/metrics_flood.py [--idle 1000] [--calls 300] [--scrapes 20] [--bridge-fd-limit N]

The bridge runs as its own process (``lnk-store-bridge --metrics-port 0``)
over a tiny serve driver written here (it answers ``done`` to every line), so
what is measured is the bridge, not a store. Two phases:

1. quiet: ``--calls`` proved calls spread over ~8 s, latency p50/p99; then
   ``--scrapes`` scrapes of ``GET /metrics``;
2. flood: ``--idle`` TCP connections to the metrics port that never send a
   byte, kept up from one thread (a connection the bridge closes, at its cap
   or at its read timeout, is opened again at once); meanwhile the same
   proved calls and scrapes (a scrape is tried until answered: one may be
   closed to make room for the flood's newest), and the bridge's threads and
   open descriptors, sampled between calls.

``--bridge-fd-limit`` sets the bridge's RLIMIT_NOFILE (systemd's default
soft limit is 1,024). Before the bounds (one thread per connection, no
timeout, no cap; run with ``PYTHONPATH`` at an older tree) the flood took
a thread and a descriptor per connection, and at the fd limit the proved
calls got no reply: the phase then ends after 3 calls without one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable

# The tiny driver that answers every request "done", and /proc/PID/status numbers: bridge_flood's.
from bridge_flood import DRIVER, status  # noqa: E402  (benchmarks/, run as a script from there)

from cloudstore.bridge import SOCKET_NAME, BridgeClient


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class IdleFlood:
    """``n`` TCP connections that never send anything, kept up until stopped.

    In a process of its own (forked), so that its loop never holds the
    interpreter lock of the process timing the calls.
    """

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.n = n
        self.stop = multiprocessing.get_context("fork").Event()
        self.connects = 0
        self.closed = 0  # closed by the bridge (its cap, its read timeout), then opened again
        self.held_most = 0
        self._results, self._send = multiprocessing.get_context("fork").Pipe(duplex=False)
        self.process = multiprocessing.get_context("fork").Process(target=self._child, daemon=True)

    def start(self) -> None:
        self.process.start()

    def finish(self) -> None:
        """Stop it, and take its counts."""
        self.stop.set()
        if self._results.poll(60):
            self.connects, self.closed, self.held_most = self._results.recv()
        self.process.join(30)

    def _child(self) -> None:
        self._run()
        self._send.send((self.connects, self.closed, self.held_most))

    def _open(self, sel: selectors.BaseSelector) -> bool:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(("127.0.0.1", self.port))
        if err not in (0, 115):  # 115: EINPROGRESS
            sock.close()
            return False
        self.connects += 1
        sel.register(sock, selectors.EVENT_READ)
        return True

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            while not self.stop.is_set():
                missing = self.n - len(sel.get_map())
                for _ in range(min(missing, 64)):  # a batch a turn, so closes are noticed too
                    if not self._open(sel):
                        break
                self.held_most = max(self.held_most, len(sel.get_map()))
                for key, _ in sel.select(0.01):
                    try:
                        data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
                        self.closed += 1
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]


def timed_calls(client: BridgeClient, pid: int, n: int, pause: float = 0.0) -> tuple[list[float], Counter, int, int]:
    """``n`` proved calls: latencies (ms), answers, and the most threads and descriptors the bridge had."""
    times: list[float] = []
    answers: Counter = Counter()
    threads = fds = 0
    for i in range(n):
        if answers.get("no reply (TimeoutError)", 0) >= 3:
            break  # the bridge answers no more: 3 are enough to say so
        time.sleep(pause)
        start = time.perf_counter()
        try:
            reply = client.op("last", thread=f"t{i % 7}")
            word = reply["reply"] if reply["reply"] != "error" else reply["error"].split(":")[0]
        except (OSError, TimeoutError) as exc:
            word = f"no reply ({type(exc).__name__})"
        times.append((time.perf_counter() - start) * 1000)
        answers[word] += 1
        if i % 10 == 0:
            threads = max(threads, status(pid, "Threads"))
            fds = max(fds, open_fds(pid))
    return times, answers, threads, fds


def scrapes(port: int, n: int) -> tuple[list[float], int]:
    """``n`` scrapes of /metrics, each tried until answered: latency (ms) and the tries that failed.

    Ends early once 5 tries in all have failed: an endpoint that answers none is said so in a minute.
    """
    times: list[float] = []
    failed = 0
    for _ in range(n):
        start = time.perf_counter()
        while failed < 5:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
                    got.read()
                times.append((time.perf_counter() - start) * 1000)
                break
            except OSError:
                failed += 1
        else:
            break
    return times, failed


def fd_limit(n: int | None) -> Callable[[], None] | None:
    """What sets a child's RLIMIT_NOFILE to ``n`` before it runs (None: inherit this process's)."""
    if n is None:
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def figures(times: list[float]) -> str:
    if not times:
        return "none answered"
    q = statistics.quantiles(times, n=100, method="inclusive") if len(times) > 1 else times * 99
    return f"p50 {statistics.median(times):7.2f} ms  p99 {q[98]:7.2f} ms  max {max(times):7.2f} ms  (n={len(times)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=1000, help="idle connections kept up on the metrics port")
    parser.add_argument("--calls", type=int, default=300, help="proved calls timed in each phase")
    parser.add_argument("--scrapes", type=int, default=20, help="scrapes of /metrics timed in each phase")
    parser.add_argument("--bridge-fd-limit", type=int, default=None, metavar="N",
                        help="the bridge's RLIMIT_NOFILE (default: this script's, raised to --idle + 512)")
    args = parser.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.idle + 512
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))  # the bridge inherits it too

    work = tempfile.mkdtemp(prefix="lsb-mflood-", dir="/tmp")
    proc: subprocess.Popen | None = None
    try:
        harness, folder = os.path.join(work, "h"), os.path.join(work, "agent")
        os.makedirs(harness)
        os.makedirs(os.path.join(folder, "chats"))
        driver = os.path.join(work, "driver.py")
        with open(driver, "w") as f:
            f.write(DRIVER)
        key_hex = os.urandom(32).hex()
        key_file = os.path.join(work, "key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(key_hex + "\n")
        log_path = os.path.join(work, "bridge.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", harness, "--agent-id", "bench",
                 "--agent-owner", "bench", "--key-file", key_file, "--agent-folder", folder,
                 "--driver", f"{sys.executable} {driver}", "--metrics-port", "0", "--log-format", "json"],
                stdout=subprocess.DEVNULL, stderr=log, preexec_fn=fd_limit(args.bridge_fd_limit),
            )
        sock = os.path.join(harness, SOCKET_NAME)
        port = None
        deadline = time.monotonic() + 30
        while port is None or not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("lnk-store-bridge did not start")
            with open(log_path, "rb") as f:
                for line in f.read().splitlines():
                    port = port or json.loads(line).get("metrics_port")
            time.sleep(0.02)
        client = BridgeClient(sock, "bench", "bench", bytes.fromhex(key_hex), timeout=10)
        client.op("last", thread="warm")
        print(f"fd limit: bridge {args.bridge_fd_limit or resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, "
              f"this script {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}")

        cpu, wall = cpu_seconds(proc.pid), time.monotonic()
        times, answers, threads, fds = timed_calls(client, proc.pid, args.calls, pause=8.0 / args.calls)
        cpu, wall = cpu_seconds(proc.pid) - cpu, time.monotonic() - wall
        print(f"0 idle:      proved call  {figures(times)}  {dict(answers)}")
        took, failed = scrapes(port, args.scrapes)
        print(f"             GET /metrics {figures(took)}  failed tries {failed}")
        print(f"             bridge: at most {threads} threads, {fds} descriptors open, "
              f"CPU {100 * cpu / wall:.0f}% of a core over the calls")
        sys.stdout.flush()

        flood = IdleFlood(port, args.idle)
        flood.start()
        time.sleep(2.0)  # let it reach its size and start churning
        # Spread over ~8 s: past the exporter's read timeout, so the flood churns (closed, reopened).
        cpu, wall = cpu_seconds(proc.pid), time.monotonic()
        times, answers, threads, fds = timed_calls(client, proc.pid, args.calls, pause=8.0 / args.calls)
        cpu, wall = cpu_seconds(proc.pid) - cpu, time.monotonic() - wall
        took, failed = scrapes(port, args.scrapes)
        flood.finish()
        print(f"{args.idle} idle:   proved call  {figures(times)}  {dict(answers)}")
        print(f"             GET /metrics {figures(took)}  failed tries {failed}")
        print(f"             bridge: at most {threads} threads, {fds} descriptors open, "
              f"CPU {100 * cpu / wall:.0f}% of a core over the calls")
        print(f"             flood: at most {flood.held_most} connections open at once, {flood.connects} connects, "
              f"{flood.closed} closed by the bridge")
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                print("         the bridge did not stop within 60 s of SIGTERM: killed")
                proc.kill()
                proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

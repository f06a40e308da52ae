#!/usr/bin/env python3
"""Agents sharing one store bridge and one machine (issue 43): memory, latency, descriptors.

    cd /tmp && PYTHONPATH=/work/wt43 python3 /work/wt43/benchmarks/bridge_sharing.py \\
        [--phases a,b,c] [--shared-drivers] [--calls 10000] [--tiny]

The code measured is the ``cloudstore`` this process imports (``PYTHONPATH``;
run it from outside a checkout, as ``python -c`` and ``-m`` put the current
folder first): the bridge (``python -m cloudstore.bridge.cli``) and its
drivers (``lnk-bucket-store``'s own ``main``, through a small launcher that
counts each start in a file, never on stdout) are started with that same
tree on their ``PYTHONPATH``. The store is a folder (``file://``) of this
run's own. Each phase starts a fresh bridge, so its peak RSS is its own.

a. Memory: one agent reads a conversation of ``--events`` events each of
   ``--values`` ``{}`` (written straight through a serve process first):
   the bridge's and the largest driver's peak RSS (VmHWM, sampled every
   20 ms) and what the caller got; then ``--big-agents`` agents x 8 such
   reads at once.
b. Latency: one agent keeps 8 ``threads`` calls in flight on
   ``--conversations`` conversations of its own (an honestly slow op)
   while another agent calls ``last`` ``--probes`` times: its p50/p99.
c. Many agents: ``--agents`` agents (24) send ``--calls`` appends between
   them, one caller each, on 4 places; a call answered ``busy`` reached no
   driver and is sent again (counted). Append p50/p99 under that load,
   driver starts, the bridge's open descriptors and RSS before and after,
   and then one agent's append p50 alone.

``--shared-drivers`` passes the bridge's flag of that name (not in code
before it). Figures, not assertions; ``tests/test_benchmarks_run.py`` runs
``--tiny``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # proc_watch: not installed

from proc_watch import children, fds, status  # noqa: E402

import cloudstore  # noqa: E402
from cloudstore.bridge import SOCKET_NAME, BridgeClient  # noqa: E402
from cloudstore.bridge.client import exchange  # noqa: E402
from cloudstore.bridge.proof import new_key_hex  # noqa: E402
from cloudstore.protocol.client import ServeProcess  # noqa: E402

MiB = 1024 * 1024
CODE = os.path.dirname(os.path.dirname(os.path.abspath(cloudstore.__file__)))

LAUNCHER = r'''
import os, sys
if sys.argv[1:2] in (["serve"], ["call"]):  # a driver start (not "contract"): one line in the count
    fd = os.open(os.environ["BENCH_STARTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, b"%d\n" % os.getpid())
    os.close(fd)
from cloudstore.driver import main_bucket
main_bucket()
'''


class Sampler:
    """Peak RSS (VmHWM) of the bridge and of each of its drivers, every 20 ms, until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.driver_peak = 0  # kB
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            for child in children(self.pid):
                self.driver_peak = max(self.driver_peak, status(child, "VmHWM"))

    def end(self) -> tuple[float, float]:
        """(bridge peak, largest driver peak) in MiB."""
        self.stop.set()
        self.thread.join()
        return status(self.pid, "VmHWM") / 1024, self.driver_peak / 1024


@dataclass
class Setup:
    """This run's folder, store and driver launcher, and its agents (keys and folders)."""

    work: str
    env: dict[str, str]
    driver: list[str]
    starts: str
    agents: list[tuple[str, str, bytes]] = field(default_factory=list)  # (id, key file, key)

    def agent(self, agent_id: str) -> tuple[str, str, bytes]:
        for a in self.agents:
            if a[0] == agent_id:
                return a
        key_hex = new_key_hex()
        key_file = os.path.join(self.work, f"{agent_id}.key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(key_hex + "\n")
        os.makedirs(os.path.join(self.work, "agents", agent_id, "chats"), exist_ok=True)
        self.agents.append((agent_id, key_file, bytes.fromhex(key_hex)))
        return self.agents[-1]

    def driver_starts(self) -> int:
        try:
            with open(self.starts) as f:
                return len(f.read().splitlines())
        except FileNotFoundError:
            return 0


def make_setup() -> Setup:
    work = tempfile.mkdtemp(prefix="lsb-share-", dir="/tmp")
    os.makedirs(os.path.join(work, "bucket"), mode=0o700)
    launcher = os.path.join(work, "driver.py")
    with open(launcher, "w") as f:
        f.write(LAUNCHER)
    starts = os.path.join(work, "starts")
    env = {"LNK_BUCKET_URL": f"file://{work}/bucket", "BENCH_STARTS": starts}
    return Setup(work, env, [sys.executable, launcher], starts)


class Bridge:
    """``lnk-store-bridge`` as a process of its own, serving ``ids`` (a config file)."""

    def __init__(self, setup: Setup, ids: list[str], shared: bool) -> None:
        self.setup = setup
        harness = tempfile.mkdtemp(prefix="h", dir=setup.work)
        config = os.path.join(harness, "agents.json")
        agents = [setup.agent(i) for i in ids]
        with open(config, "w") as f:
            json.dump({"agents": [{"id": i, "owner": "bench", "key_file": k,
                                   "folder": os.path.join(setup.work, "agents", i)} for i, k, _ in agents]}, f)
        argv = [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", harness, "--config", config,
                "--driver", " ".join(setup.driver), "--log-level", "WARNING"]
        for k, v in setup.env.items():
            argv += ["--driver-env", f"{k}={v}"]
        if shared:
            argv.append("--shared-drivers")
        self.log = open(os.path.join(harness, "bridge.log"), "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.log, cwd=setup.work,
                                     env={**os.environ, "PYTHONPATH": CODE})
        self.socket = os.path.join(harness, SOCKET_NAME)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lnk-store-bridge did not start: {open(self.log.name).read()[-2000:]}")
            time.sleep(0.02)
        self.clients = {i: BridgeClient(self.socket, "bench", i, key, timeout=300) for i, _, key in agents}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)
        self.log.close()


def word(raw: bytes) -> str:
    """A reply as a short label: ``events (53 MiB)``, ``done``, or an error's first word."""
    if len(raw) > 64 * 1024:
        kind = "events" if re.match(rb'\{\s*"reply"\s*:\s*"events"', raw) else "other"
        return f"{kind} ({len(raw) / MiB:.1f} MiB)"
    if not raw:
        return "closed"
    reply = json.loads(raw)
    if reply.get("reply") != "error":
        return str(reply.get("reply"))
    return str(reply["error"]).split(":")[0]


def figures(times: list[float]) -> str:
    if not times:
        return "no calls"
    q = statistics.quantiles(times, n=100) if len(times) > 1 else times * 99
    return f"p50 {statistics.median(times):7.1f} ms  p99 {q[98]:7.1f} ms  (n={len(times)})"


def at_once(calls: list[Callable[[], None]]) -> None:
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], None]) -> None:
        barrier.wait()
        call()

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- a: memory -----------------------------------------------------------------


def write_big(setup: Setup, ids: list[str], events: int, values: int) -> None:
    """Each agent's conversation "big": ``events`` events of ``values`` ``{}``, straight through a serve process."""
    payload = b"[" + b", ".join([b"{}"] * values) + b"]"
    with ServeProcess(setup.driver, {**setup.env, "PYTHONPATH": CODE}) as proc:
        for agent_id in ids:
            for seq in range(1, events + 1):
                line = (b'{"op": "append", "agent": {"id": "%s", "owner": "bench"}, "thread": "big", '
                        b'"event": {"seq": %d, "x": %s}}' % (agent_id.encode(), seq, payload))
                reply = json.loads(proc.request_line(line, timeout=600))
                if reply != {"reply": "done"}:
                    raise SystemExit(f"writing the big conversation: {reply}")


def phase_a(setup: Setup, args: argparse.Namespace) -> None:
    ids = [f"big{i}" for i in range(args.big_agents)]
    started = time.perf_counter()
    write_big(setup, ids, args.events, args.values)
    print(f"a. {args.big_agents} conversations of {args.events} events x {args.values:,} {{}} written "
          f"in {time.perf_counter() - started:.1f} s")
    samples: dict[str, str] = {}

    def read(bridge: Bridge, agent_id: str, outcomes: Counter, times: list[float]) -> None:
        client = bridge.clients[agent_id]
        line = json.dumps({"op": "read", "agent": client.agent, "thread": "big", "first": 1}).encode()
        start = time.perf_counter()
        raw = exchange(bridge.socket, [client.proof, line], timeout=600)
        took = (time.perf_counter() - start) * 1000
        label = word(raw)
        outcomes[label] += 1
        times.append(took)
        if label not in samples and len(raw) < 4096:
            samples[label] = raw.decode("utf-8", "replace")
        del raw

    for title, readers in (("1 agent, 1 read", [ids[0]]), (f"{len(ids)} agents x 8 reads at once", ids * 8)):
        bridge = Bridge(setup, ids, args.shared_drivers)
        try:
            sampler = Sampler(bridge.pid)
            outcomes: Counter = Counter()
            times: list[float] = []
            start = time.perf_counter()
            at_once([functools.partial(read, bridge, a, outcomes, times) for a in readers])
            wall = time.perf_counter() - start
            peak, driver_peak = sampler.end()
        finally:
            bridge.stop()
        print(f"   {title}: {wall:.1f} s, bridge peak RSS {peak:.0f} MiB, largest driver peak RSS "
              f"{driver_peak:.0f} MiB; answers: " + ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())))
        print(f"      call time {figures(times)}")
        sys.stdout.flush()
    for label, text in sorted(samples.items()):
        if label not in ("done",) and not label.startswith("events"):
            print(f"   a caller's {label!r} answer: {text[:300]}")


# -- b: latency ------------------------------------------------------------------


def phase_b(setup: Setup, args: argparse.Namespace) -> None:
    with ServeProcess(setup.driver, {**setup.env, "PYTHONPATH": CODE}) as proc:
        for k in range(args.conversations):
            reply = proc.request({"op": "append", "agent": {"id": "flood", "owner": "bench"},
                                  "thread": f"c{k}", "event": {"seq": 1}})
            assert reply == {"reply": "done"}, reply
    bridge = Bridge(setup, ["flood", "probe"], args.shared_drivers)
    flooder, probe = bridge.clients["flood"], bridge.clients["probe"]
    stop = threading.Event()
    flood_times: list[float] = []
    flood_words: Counter = Counter()

    def flood() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            reply = flooder.op("threads")
            flood_times.append((time.perf_counter() - start) * 1000)
            flood_words[reply["reply"] if reply["reply"] != "error" else reply["error"].split(":")[0]] += 1

    try:
        alone = []
        for _ in range(3):
            start = time.perf_counter()
            assert flooder.op("threads")["reply"] == "threads"
            alone.append((time.perf_counter() - start) * 1000)
        starts = setup.driver_starts()
        threads = [threading.Thread(target=flood) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(args.settle)
        times: list[float] = []
        words: Counter = Counter()
        for k in range(args.probes):
            start = time.perf_counter()
            reply = probe.op("last", thread=f"p{k}")
            times.append((time.perf_counter() - start) * 1000)
            words[reply["reply"] if reply["reply"] != "error" else reply["error"].split(":")[0]] += 1
            time.sleep(args.probe_pause)
        stop.set()
        for t in threads:
            t.join()
        started = setup.driver_starts() - starts
    finally:
        stop.set()
        bridge.stop()
    print(f"b. one agent's `threads` on {args.conversations} conversations alone: median "
          f"{statistics.median(alone):.0f} ms; 8 of them in flight meanwhile: {figures(flood_times)} "
          f"{dict(flood_words)}")
    print(f"   another agent's `last` meanwhile: {figures(times)} {dict(words)}; {started} driver starts")
    sys.stdout.flush()


# -- c: many agents ----------------------------------------------------------------


def phase_c(setup: Setup, args: argparse.Namespace) -> None:
    ids = [f"m{i}" for i in range(args.agents)]
    bridge = Bridge(setup, ids, args.shared_drivers)
    try:
        for i in ids:  # every agent's first call, before counting
            assert bridge.clients[i].op("last", thread="warm")["reply"] == "last"
        fds_before, rss_before = fds(bridge.pid), status(bridge.pid, "VmRSS") / 1024
        starts = setup.driver_starts()
        lock = threading.Lock()
        times: list[float] = []
        busy = Counter()
        per_agent = args.calls // len(ids)

        def agent(agent_id: str) -> None:
            client = bridge.clients[agent_id]
            for seq in range(1, per_agent + 1):
                while True:
                    start = time.perf_counter()
                    reply = client.op("append", thread="load", event={"seq": seq, "text": "x" * 200})
                    took = (time.perf_counter() - start) * 1000
                    if reply.get("reply") == "error" and reply["error"].startswith("busy:"):
                        with lock:
                            busy[agent_id] += 1
                        time.sleep(0.01)
                        continue
                    if reply != {"reply": "done"}:
                        raise SystemExit(f"append of {agent_id} answered {reply}")
                    with lock:
                        times.append(took)
                    break

        start = time.perf_counter()
        at_once([lambda a=a: agent(a) for a in ids])
        wall = time.perf_counter() - start
        started = setup.driver_starts() - starts
        fds_after, rss_after = fds(bridge.pid), status(bridge.pid, "VmRSS") / 1024
        alone = []
        client = bridge.clients[ids[0]]
        for seq in range(per_agent + 1, per_agent + 1 + args.alone):
            t0 = time.perf_counter()
            assert client.op("append", thread="load", event={"seq": seq, "text": "x" * 200}) == {"reply": "done"}
            alone.append((time.perf_counter() - t0) * 1000)
        peak = status(bridge.pid, "VmHWM") / 1024
    finally:
        bridge.stop()
    n = per_agent * len(ids)
    print(f"c. {n} appends from {len(ids)} agents at once (one caller each, 4 places) in {wall:.1f} s "
          f"({n / wall:.0f}/s): append {figures(times)}; {sum(busy.values())} busy answers sent again; "
          f"{started} driver starts")
    print(f"   bridge: {fds_before} -> {fds_after} open fds, RSS {rss_before:.0f} -> {rss_after:.0f} MiB "
          f"(peak {peak:.0f}); then one agent alone: append {figures(alone)}")
    sys.stdout.flush()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", default="a,b,c", help="which of a, b, c to run (default: %(default)s)")
    p.add_argument("--shared-drivers", action="store_true", help="run the bridge with --shared-drivers")
    p.add_argument("--events", type=int, default=20, help="a: events of the big conversation")
    p.add_argument("--values", type=int, default=700_000, help="a: {} values in each of its events")
    p.add_argument("--big-agents", type=int, default=8, help="a: agents reading 8 at once each")
    p.add_argument("--conversations", type=int, default=2000, help="b: the flooding agent's conversations")
    p.add_argument("--probes", type=int, default=100, help="b: the other agent's `last` calls timed")
    p.add_argument("--probe-pause", type=float, default=0.05, help="b: seconds between them")
    p.add_argument("--settle", type=float, default=2.0, help="b: seconds of flood before timing")
    p.add_argument("--agents", type=int, default=24, help="c: agents calling at once")
    p.add_argument("--calls", type=int, default=10_000, help="c: appends between them")
    p.add_argument("--alone", type=int, default=50, help="c: one agent's appends timed afterwards")
    p.add_argument("--tiny", action="store_true", help="every phase at the smallest settings (a test's)")
    args = p.parse_args(argv)
    if args.tiny:
        args.events, args.values, args.big_agents = 2, 1000, 2
        args.conversations, args.probes, args.probe_pause, args.settle = 20, 5, 0.0, 0.2
        args.agents, args.calls, args.alone = 3, 12, 3
    return args


def main() -> int:
    args = parse()
    print(f"code: {CODE}{' with --shared-drivers' if args.shared_drivers else ''}; folder store (file://)")
    sys.stdout.flush()
    setup = make_setup()
    try:
        phases = {"a": phase_a, "b": phase_b, "c": phase_c}
        for name in args.phases.split(","):
            phases[name](setup, args)
    finally:
        shutil.rmtree(setup.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Appends at a cloud's round trip: requests per append (packing included), 8 writers, 1 writer (issue 26, item 7).

    python benchmarks/append_cost.py [--rtt-ms 20] [--events 256] [--writers 8] [--rounds 3] [--backends moto,gcs]

For each backend (moto's S3 server, fake-gcs-server, started here) a
``FaultProxy`` (tests/faults/http_proxy.py) sits between the store and the
emulator, holds every request ``--rtt-ms`` and counts every request that
reaches it.  The store is the Python API (``cloudstore.open``) in this
process, so ``PYTHONPATH`` chooses the code measured.  Printed, with the
goal beside each figure:

* requests per append: ``--writers`` threads each append ``--events``
  events to a conversation of their own, all at once; every request the
  proxy saw, packing included (counted after ``close``, which waits for the
  work left after replies), divided by the appends.  Goal <= 1.1.
* throughput of those writers against the same number of threads doing raw
  conditional creates (the SDK in this process, through the same proxy) for
  as many objects, in ``--rounds`` rounds (ours first, then the raw creates
  first, in turn), the median ratio and each round's.  Goal >= 0.9.
* single-writer latency: one thread appending ``--events`` events, median
  against a raw conditional create's median.  Goal <= 1.1.

Figures, not assertions (a shared 2-core machine is noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/faults, tests/emulators.py: not installed

from cloud_round_trips import BACKENDS, Backend, RawSDK  # noqa: E402
from faults.http_proxy import FaultProxy  # noqa: E402
from support import new_bucket  # noqa: E402

import cloudstore  # noqa: E402


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def event(seq: int, text_bytes: int) -> dict:
    return {"seq": seq, "text": "x" * text_bytes}


def at_once(count: int, work: Callable[[int], None]) -> float:
    """``work(i)`` on ``count`` threads started together; the wall time until all are done."""
    errors: list[BaseException] = []
    start = threading.Barrier(count + 1)

    def run(i: int) -> None:
        start.wait()
        try:
            work(i)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - began


def run(backend: Backend, args: argparse.Namespace) -> None:
    progress(f"{backend.label}: starting the emulator")
    em = backend.start()
    try:
        with FaultProxy(em.env[backend.endpoint_var], flavor=backend.flavor, latency=args.rtt_ms / 1000) as proxy:
            for key, value in proxy.redirect(em.env).items():
                os.environ[key] = value
            size = len(json.dumps(event(1, args.text_bytes), separators=(",", ":")))
            n, w = args.events, args.writers

            def fresh(side: str) -> str:
                """A bucket of its own for each side of each round: fake-gcs-server's writes slow as
                their bucket fills (284 appends/s in round 1, 67/s in round 4 of one shared bucket),
                which weighed on whichever side went second."""
                return new_bucket(em, f"{side}-{uuid.uuid4().hex[:8]}")

            # many writers, one process, against as many raw creates: in rounds, ours first in even
            # rounds and the raw creates first in odd ones, so that a drift of the machine weighs on
            # both alike; the median ratio is the figure.
            ratios: list[float] = []
            rates: list[tuple[float, float]] = []
            requests, kinds = 0, {}

            def ours() -> float:
                store = cloudstore.open(f"{backend.scheme}://{fresh('ours')}/bench", concurrency=args.concurrency or w)
                agent = store.agent("o", "bench-" + uuid.uuid4().hex[:6])
                agent.last("warm-up")  # the SDK's first connections are not a figure
                proxy.clear()

                def writer(i: int) -> None:
                    thread = f"w{i}"
                    for seq in range(1, n + 1):
                        agent.append(thread, event(seq, args.text_bytes))

                took = at_once(w, writer)
                store.close()
                return took

            def raws() -> float:
                raw = RawSDK(backend, proxy.url, em.env, fresh("raw"))
                raw.create("warm", b"x")  # its first connections are not a figure either
                proxy.clear()
                return at_once(w, lambda i: [raw.create(f"c{i}/{s}", b"x" * size) for s in range(n)])

            for round_ in range(args.rounds):
                progress(f"{backend.name}: round {round_ + 1} of {args.rounds}: {w} writers x {n} appends")
                if round_ % 2 == 0:
                    wall = ours()
                    if round_ == 0:  # counted once: the same appends cost the same requests each round
                        requests, kinds = len(proxy.requests()), proxy.counts()
                    raw_wall = raws()
                else:
                    raw_wall = raws()
                    wall = ours()
                ratios.append(raw_wall / wall)  # (appends / wall) / (creates / raw_wall)
                rates.append((w * n / wall, w * n / raw_wall))
                progress(f"{backend.name}: round {round_ + 1}: ours {w * n / wall:.0f}/s, raw {w * n / raw_wall:.0f}/s")
            per_append = requests / (w * n)
            ratio = statistics.median(ratios)
            ours_rate = statistics.median(r for r, _ in rates)
            raw_rate = statistics.median(r for _, r in rates)

            # one writer: latency
            store = cloudstore.open(f"{backend.scheme}://{fresh('solo')}/bench", concurrency=w)
            one = store.agent("o", "single-" + uuid.uuid4().hex[:6])
            one.last("warm-up")
            times = []
            for seq in range(1, n + 1):
                began = time.perf_counter()
                one.append("solo", event(seq, args.text_bytes))
                times.append(time.perf_counter() - began)
            store.close()
            raw = RawSDK(backend, proxy.url, em.env, fresh("rawsolo"))
            raw.create("warm", b"x")
            raw_times = []
            for s in range(n):
                began = time.perf_counter()
                raw.create(f"solo/{s}", b"x" * size)
                raw_times.append(time.perf_counter() - began)
            lat = statistics.median(times) / statistics.median(raw_times)

            each = ", ".join(f"{r:.2f}" for r in ratios)
            print(f"{backend.name:5} requests/append {per_append:.3f} (goal <= 1.1; {requests} for {w * n} "
                  f"appends: {kinds})  "
                  f"{w} writers {ours_rate:.0f}/s vs raw creates {raw_rate:.0f}/s = {ratio:.2f} "
                  f"(median of {args.rounds} rounds: {each}; goal >= 0.9)  "
                  f"1 writer p50 {statistics.median(times) * 1000:.1f} ms vs raw "
                  f"{statistics.median(raw_times) * 1000:.1f} ms = {lat:.2f} (goal <= 1.1)", flush=True)
    finally:
        em.stop()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--events", type=int, default=256, help="appends per writer")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=0, help="the store's (default: --writers)")
    parser.add_argument("--text-bytes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of writers against raw creates")
    parser.add_argument("--backends", default="moto,gcs", help="moto, gcs or both, comma-separated")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    progress(f"cloudstore from {os.path.dirname(cloudstore.__file__)}")
    for name in args.backends.split(","):
        run(BACKENDS[name.strip()], args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

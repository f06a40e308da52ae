#!/usr/bin/env python3
"""Writes to one object under a cloud's rate limit: throughput and error replies (issue 26, items 3 and 4).

    python benchmarks/throttle.py [--rtt-ms 20] [--seconds 30] [--rate 2] [--lapse-ms 1500]
        [--backends gcs,moto]

For each backend (GCS on fake-gcs-server, S3 on moto's server, started here
as processes) a ``FaultProxy`` (tests/faults/http_proxy.py) sits between the
drivers and the emulator, holds every request ``--rtt-ms`` and models the
cloud's limit (``RateLimit``): on GCS the per-object write limit, a token
bucket per object name of 1 write a second with a burst of 2, where a write
forwarded takes a token even if it then fails its precondition; on moto S3's
per-prefix ``SlowDown`` at the same 1 a second a prefix (far below S3's
3,500, to put the same pressure on the retries).  The drivers' handler
(``Service``, on the drivers' own SDK clients and retry policy) runs in this
process, so ``PYTHONPATH`` chooses the code measured.

* ``file_write``: one writer writes one path at ``--rate`` a second (each due
  at its slot, at once when late) for ``--seconds``; printed: writes done per
  second, error replies, those saying ``outcome unknown`` and those saying
  ``nothing was changed``, throttled replies seen at the proxy, the median
  and worst latency.
* a lease: ``take`` with ``--lapse-ms``, then ``renew`` every lapse/3 for
  ``--seconds``; printed: renewals ``done`` / ``lost`` / errors, unknown
  outcomes, throttled replies, median and worst latency (against the lapse).

Figures, not assertions (a shared 2-core machine is noisy).  The goal is
printed beside each figure.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/faults, tests/emulators.py: not installed

from emulators import Emulator, start_fake_gcs, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy, RateLimit  # noqa: E402

import cloudstore  # noqa: E402
from cloudstore.protocol.service import Service  # noqa: E402
from cloudstore.settings import open_store, parse_location  # noqa: E402
from cloudstore.store.leases import GCS_LAPSE_MIN_MS  # noqa: E402
from cloudstore.store.space import Space  # noqa: E402


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Tally:
    """Replies of one phase, by kind, and each call's latency."""

    replies: dict[str, int] = field(default_factory=dict)
    unknown: int = 0
    unchanged: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, reply: dict, took: float) -> None:
        kind = str(reply.get("reply"))
        self.replies[kind] = self.replies.get(kind, 0) + 1
        self.latencies.append(took)
        if kind == "error":
            why = str(reply.get("error", ""))
            self.unknown += "outcome unknown" in why
            self.unchanged += why.endswith("nothing was changed")

    @property
    def errors(self) -> int:
        return self.replies.get("error", 0)

    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else 0.0

    def worst_ms(self) -> float:
        return max(self.latencies) * 1000 if self.latencies else 0.0


def paced(rate: float, seconds: float, call: Callable[[int], None]) -> float:
    """``call(n)`` at ``rate`` a second (each at its slot, at once when late) for ``seconds``; the wall time."""
    started = time.monotonic()
    n = 0
    while n < rate * seconds:
        due = started + n / rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        call(n)
        n += 1
    return time.monotonic() - started


def service_on(em: Emulator, proxy: FaultProxy) -> Service:
    setting = "LNK_GCS_URL" if em.name == "fake-gcs-server" else "LNK_BUCKET_URL"
    for key, value in proxy.redirect(em.env).items():
        os.environ[key] = value
    scheme = "gs" if setting == "LNK_GCS_URL" else "s3"
    loc = parse_location(setting, f"{scheme}://{em.bucket}/bench-{uuid.uuid4().hex[:8]}", ("gs", "s3", "file"))
    return Service(Space(open_store(loc), loc.prefix))


def file_writes(service: Service, agent: dict, rate: float, seconds: float) -> tuple[Tally, float]:
    path = "skills/throttle/SKILL.md"
    tally = Tally()
    version = [0]

    def write(n: int) -> None:
        data = base64.b64encode(b"v%d" % n).decode("ascii")
        started = time.monotonic()
        reply = service.answer({"op": "file_write", "agent": agent, "path": path, "data": data,
                                "version": version[0]})
        tally.add(reply, time.monotonic() - started)
        if reply.get("reply") == "wrote":
            version[0] = int(reply["version"])
        else:  # learn the version again (an error, or stale after an unknown outcome)
            got = service.answer({"op": "file_read", "agent": agent, "path": path})
            version[0] = int((got.get("file") or {}).get("version", version[0]))

    wall = paced(rate, seconds, write)
    return tally, wall


def lease_renewals(service: Service, agent: dict, lapse_ms: int, seconds: float) -> Tally:
    thread, holder = "t-throttle", "holder-" + uuid.uuid4().hex[:6]
    took = service.answer({"op": "take", "agent": agent, "thread": thread, "holder": holder, "lapse_ms": lapse_ms})
    if took.get("reply") != "took":
        progress(f"take answered {took}")
    tally = Tally()

    def renew(_: int) -> None:
        started = time.monotonic()
        reply = service.answer({"op": "renew", "agent": agent, "thread": thread, "holder": holder})
        tally.add(reply, time.monotonic() - started)

    paced(3000.0 / lapse_ms, seconds, renew)
    return tally


def lease_beside_appends(service: Service, agent: dict, lapse_ms: int, seconds: float,
                         append_rate: float) -> tuple[Tally, int]:
    """A lease renewed every lapse/3 while its conversation is appended to at ``append_rate`` a second
    (the holder running its turn): the head is written by renewals and packing hints both.
    The renewals' tally and the appends that did not answer ``done``."""
    thread, holder = "t-beside-" + uuid.uuid4().hex[:6], "holder-" + uuid.uuid4().hex[:6]
    took = service.answer({"op": "take", "agent": agent, "thread": thread, "holder": holder, "lapse_ms": lapse_ms})
    if took.get("reply") != "took":
        progress(f"take answered {took}")
    appender = Service(Space(service.space.store, service.space.root))  # another caller in this process
    appender.space.deferred = []  # packing (and the hint) after each reply, as serve does
    failed = [0]
    stop = threading.Event()

    def appends() -> None:
        seq = 0
        started = time.monotonic()
        while not stop.is_set():
            due = started + seq / append_rate
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            seq += 1
            reply = appender.answer({"op": "append", "agent": agent, "thread": thread, "event": {"seq": seq}})
            appender.space.run_deferred()
            if reply.get("reply") != "done":
                failed[0] += 1
                seq = int(reply.get("last", seq - 1))

    worker = threading.Thread(target=appends, daemon=True)
    worker.start()
    tally = Tally()

    def renew(_: int) -> None:
        started = time.monotonic()
        reply = service.answer({"op": "renew", "agent": agent, "thread": thread, "holder": holder})
        tally.add(reply, time.monotonic() - started)

    try:
        paced(3000.0 / lapse_ms, seconds, renew)
    finally:
        stop.set()
        worker.join()
    return tally, failed[0]


def print_lease_beside_appends(backend: str, proxy: FaultProxy, service: Service, agent: dict,
                               args: argparse.Namespace) -> None:
    """The lease at the smallest lapse the docs allow on GCS, renewed beside appends (issue 26, item 4)."""
    lapse = GCS_LAPSE_MIN_MS
    time.sleep(2.5)  # the buckets refill
    progress(f"{backend}: renew every {lapse / 3:.0f} ms beside {args.append_rate:g} appends/s for {args.seconds} s")
    before = throttled(proxy)
    lease, failed = lease_beside_appends(service, agent, lapse, args.seconds, args.append_rate)
    print(f"{backend:5} renew+app   lapse {lapse} ms (the docs' smallest on GCS), every {lapse / 3:.0f} ms, "
          f"{args.append_rate:g} appends/s  done {lease.replies.get('done', 0)}  "
          f"lost {lease.replies.get('lost', 0)} (goal 0)  errors {lease.errors} (goal 0)  "
          f"appends not done {failed} (goal 0)  throttled {throttled(proxy) - before} (goal 0)  "
          f"p50 {lease.p50_ms():.0f} ms  worst {lease.worst_ms():.0f} ms", flush=True)


def throttled(proxy: FaultProxy) -> int:
    return sum(1 for s in proxy.requests() if s.action == "throttle")


def run(backend: str, args: argparse.Namespace) -> None:
    em = start_fake_gcs() if backend == "gcs" else start_moto()
    try:
        setting = "STORAGE_EMULATOR_HOST" if backend == "gcs" else "AWS_ENDPOINT_URL_S3"
        with FaultProxy(em.env[setting], flavor="gcs" if backend == "gcs" else "s3",
                        latency=args.rtt_ms / 1000) as proxy:
            kind = "gcs-object" if backend == "gcs" else "s3-prefix"
            service = service_on(em, proxy)
            agent = {"id": "agent-" + uuid.uuid4().hex[:8], "owner": "o"}
            service.answer({"op": "last", "agent": agent, "thread": "warm"})  # the SDK's first connection
            proxy.limit(RateLimit(kind, rate=1.0, burst=2.0))

            progress(f"{backend}: file_write at {args.rate}/s for {args.seconds} s")
            before = throttled(proxy)
            tally, wall = file_writes(service, agent, args.rate, args.seconds)
            wrote = tally.replies.get("wrote", 0)
            print(f"{backend:5} file_write  offered {args.rate:g}/s  done {wrote / wall:.2f}/s "
                  f"(goal: the limit, 1/s)  {wrote} of {len(tally.latencies)} wrote  "
                  f"errors {tally.errors} (goal 0)  outcome unknown {tally.unknown} (goal 0)  "
                  f"nothing changed {tally.unchanged}  throttled {throttled(proxy) - before}  "
                  f"p50 {tally.p50_ms():.0f} ms  worst {tally.worst_ms():.0f} ms", flush=True)

            time.sleep(2.5)  # the bucket refills: the lease starts under the same limit, not behind it
            progress(f"{backend}: renew every {args.lapse_ms / 3:.0f} ms for {args.seconds} s")
            before = throttled(proxy)
            lease = lease_renewals(service, agent, args.lapse_ms, args.seconds)
            print(f"{backend:5} renew       lapse {args.lapse_ms} ms, every {args.lapse_ms / 3:.0f} ms  "
                  f"done {lease.replies.get('done', 0)}  lost {lease.replies.get('lost', 0)} (goal 0)  "
                  f"errors {lease.errors} (goal 0)  outcome unknown {lease.unknown} (goal 0)  "
                  f"throttled {throttled(proxy) - before}  p50 {lease.p50_ms():.0f} ms  "
                  f"worst {lease.worst_ms():.0f} ms (goal well under the lapse)", flush=True)
            print_lease_beside_appends(backend, proxy, service, agent, args)
    finally:
        em.stop()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=2.0, help="file writes offered a second")
    parser.add_argument("--lapse-ms", type=int, default=1500)
    parser.add_argument("--backends", default="gcs", help="gcs, moto or both, comma-separated")
    parser.add_argument("--append-rate", type=float, default=40.0,
                        help="appends a second to the leased conversation, beside its renewals")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    progress(f"cloudstore from {os.path.dirname(cloudstore.__file__)}")
    for backend in args.backends.split(","):
        run(backend.strip(), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

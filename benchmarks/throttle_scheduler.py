#!/usr/bin/env python3
"""One agent's scheduler under a cloud's write limit (issue 26, case 1): error replies, lateness, 429s by object.

    python benchmarks/throttle_scheduler.py [--rtt-ms 20] [--seconds 20] [--rates 1,10] [--runners 1,3]
        [--backends gcs,moto]

For each backend (fake-gcs-server or moto, started here as processes), each
rate and each number of runners: a ``FaultProxy`` (tests/faults/http_proxy.py)
holds every request ``--rtt-ms`` and models the cloud's limit (``RateLimit``:
on GCS 1 write a second per object name, burst 2, a forwarded write taking its
token even if its precondition fails; on S3 its documented 3,500 writes a
second per prefix).  Runner processes (``python -m cloudstore.scheduler``, fire
command ``/bin/true``) serve one agent; this process puts jobs due now at the
rate for ``--seconds`` through a driver process of its own, then waits for
every job to fire.  Printed: puts failed (and how many said ``outcome
unknown``), jobs fired, fired twice, lateness (start of the fire less its
due) median and worst, jobs still not fired, and the 429s / 503s the proxy
answered, by kind of object (mark shards, the old one mark, job records,
claim leases, due entries) and the worst objects.

``--code PATH`` chooses the code the runners and drivers run (an older tree,
to compare: run this from outside any tree then, so that ``python -m`` in the
runners finds that one); this process keeps the proxy of its own tree.  Figures, not
assertions; the goals are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/faults, tests/emulators.py: not installed

from emulators import Emulator, start_fake_gcs, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy, RateLimit  # noqa: E402
from load import put_paced  # noqa: E402

import cloudstore  # noqa: E402
from cloudstore.protocol.client import ServeProcess  # noqa: E402
from cloudstore.scheduling.log import read_events  # noqa: E402

AGENT = {"owner": "o", "id": "bench"}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def kind_of(name: str) -> str:
    """The kind of object a throttled name or prefix is (keys.py's layout)."""
    for kind, pattern in (("mark shard", r"/m/\d+$"), ("old mark", r"/mark$"), ("job record", r"/j/[^/]+$"),
                          ("lease", r"/l/[^/]+$"), ("due entry", r"_due/"), ("day", r"/day$")):
        if re.search(pattern, name):
            return kind
    return "other"


def start_runner(root: Path, n: int, driver: str, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    config = {"agents": [AGENT], "driver": driver, "driver_env": env, "fire": ["/bin/true"],
              "poll_interval": 0.5, "workers": 4, "runner": f"bench-{n}"}
    path = root / f"runner{n}.json"
    path.write_text(json.dumps(config))
    log = root / f"runner{n}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    return proc, log




def one_run(em: Emulator, backend: str, rate: float, runners: int, args: argparse.Namespace) -> None:
    setting = "STORAGE_EMULATOR_HOST" if backend == "gcs" else "AWS_ENDPOINT_URL_S3"
    scheme, url_setting, driver = (("gs", "LNK_GCS_URL", "lnk-gcs") if backend == "gcs"
                                   else ("s3", "LNK_BUCKET_URL", "lnk-bucket-store"))
    with FaultProxy(em.env[setting], flavor="gcs" if backend == "gcs" else "s3",
                    latency=args.rtt_ms / 1000) as proxy, tempfile.TemporaryDirectory() as tmp:
        env = {**proxy.redirect(em.env), url_setting: f"{scheme}://{em.bucket}/bench-{uuid.uuid4().hex[:8]}"}
        root = Path(tmp)
        procs = [start_runner(root, n, driver, env) for n in range(runners)]
        putter = ServeProcess(driver, env, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(read_events(log, "started") for _, log in procs):
                time.sleep(0.2)
            limit = proxy.limit(RateLimit("gcs-object", rate=1.0, burst=2.0) if backend == "gcs"
                                else RateLimit("s3-prefix", rate=3500.0, burst=3500.0))
            progress(f"{backend}: {rate:g} jobs/s for {args.seconds:g} s, {runners} runner(s)")
            tag = uuid.uuid4().hex[:6]
            replies = put_paced(lambda r: putter.request(r, timeout=60), AGENT, rate, int(rate * args.seconds),
                                f"{tag}-", threads=4)
            done = {f"{tag}-{n:05d}" for n, r in enumerate(replies) if r.get("reply") == "done"}
            deadline = time.monotonic() + args.seconds + 60
            fired: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                fired = [e for _, log in procs for e in read_events(log, "fired")]
                if len({e["job"] for e in fired}) >= len(done):
                    break
                time.sleep(0.5)
            failed = [r for r in replies if r.get("reply") != "done"]
            unknown = sum("outcome unknown" in str(r.get("error", "")) for r in failed)
            lateness = sorted(float(e["lateness_ms"]) for e in fired)
            once = {e["job"] for e in fired}
            twice = len(fired) - len(once)
            by_kind: dict[str, int] = {}
            for name, n in limit.refused_names.items():
                by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0) + n
            worst = sorted(limit.refused_names.items(), key=lambda kv: -kv[1])[:3]
            median = statistics.median(lateness) / 1000 if lateness else float("nan")
            latest = lateness[-1] / 1000 if lateness else float("nan")
            print(f"{backend:4} {rate:4g} jobs/s {runners} runner(s): puts failed {len(failed)} of {len(replies)} "
                  f"(goal 0; outcome unknown {unknown})  fired {len(once)}  fired twice {twice} (goal 0)  "
                  f"not fired {len(done - once)}  "
                  f"lateness median {median:.2f} s (goal < 1 s) worst {latest:.2f} s  "
                  f"throttled {limit.refused} by kind {json.dumps(by_kind, sort_keys=True)} "
                  f"worst objects {[(name.rsplit('/', 2)[-2:], n) for name, n in worst]}", flush=True)
        finally:
            putter.close()
            for proc, _ in procs:
                proc.terminate()
            for proc, _ in procs:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rates", default="1,10", help="jobs put a second, comma-separated")
    parser.add_argument("--runners", default="1,3", help="runner counts, comma-separated")
    parser.add_argument("--backends", default="gcs", help="gcs, moto or both, comma-separated")
    parser.add_argument("--code", default=None, help="a tree whose runners and drivers are measured")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.code:
        os.environ["PYTHONPATH"] = args.code  # the runners' and drivers' processes (and theirs) run that tree
    progress(f"cloudstore from {args.code or os.path.dirname(cloudstore.__file__)}")
    for backend in (b.strip() for b in args.backends.split(",")):
        em = start_fake_gcs() if backend == "gcs" else start_moto()
        try:
            for rate in (float(r) for r in args.rates.split(",")):
                for runners in (int(n) for n in args.runners.split(",")):
                    one_run(em, backend, rate, runners, args)
        finally:
            em.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How long ``lnk-store-admin inspect`` takes for many agents at a cloud's round trips (issue 26, case 6).

``--agents`` agents (1,000 by default), each with one conversation of one
event, one waiting job and one file, are written straight to the emulator
(uncounted).  Then ``inspect`` runs in this process with every request
through the latency-adding, request-counting proxy (``tests/faults/http_proxy.py``,
20 ms a request by default): its wall time, requests, and requests per
agent, beside the goal (1,000 agents in at most 2 minutes).

    python benchmarks/inspect_scale.py                       # moto, 1,000 agents
    python benchmarks/inspect_scale.py --backends moto,gcs --agents 200
    PYTHONPATH=/path/to/old/checkout python benchmarks/inspect_scale.py --agents 100

Figures, not assertions: a table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from emulators import start_fake_gcs, start_moto  # noqa: E402  (tests/emulators.py: not installed)
from faults.http_proxy import FaultProxy  # noqa: E402

BACKENDS = {"moto": ("LNK_BUCKET_URL", "s3", "AWS_ENDPOINT_URL_S3", "s3", start_moto),
            "gcs": ("LNK_GCS_URL", "gs", "STORAGE_EMULATOR_HOST", "gcs", start_fake_gcs)}
GOAL_SECONDS_PER_1000 = 120.0


def run(name: str, agents: int, rtt_ms: float) -> dict[str, float]:
    setting, scheme, endpoint_var, flavor, start = BACKENDS[name]
    from cloudstore.admin import inspect
    from cloudstore.admin.walk import open_url

    em = start()
    try:
        with FaultProxy(em.env[endpoint_var], flavor=flavor, latency=rtt_ms / 1000) as proxy:
            url = f"{scheme}://{em.bucket}/{uuid.uuid4().hex[:10]}"
            os.environ.update({**em.env, setting: url})
            direct = open_url(url)

            def fill(i: int) -> None:
                agent = {"id": f"agent-{i:05d}", "owner": "bench"}
                for request in ({"op": "append", "thread": "t", "event": {"seq": 1}},
                                {"op": "job_put", "place": "waiting", "job": {"id": "j", "spec": None, "due": 2e9}},
                                {"op": "file_write", "path": "skills/a.md", "data": "aGk=", "version": 0}):
                    reply = direct.service.answer({**request, "agent": agent})
                    assert reply.get("reply") != "error", reply

            started = time.monotonic()
            with ThreadPoolExecutor(32) as pool:
                list(pool.map(fill, range(agents)))
            print(f"# {name}: {agents} agents written in {time.monotonic() - started:.0f} s", file=sys.stderr)
            os.environ.update(proxy.redirect({**em.env, setting: url}))
            proxy.clear()
            started = time.monotonic()
            report = inspect.inspect(open_url(url), show_progress=True) if "show_progress" in \
                inspect.inspect.__code__.co_varnames else inspect.inspect(open_url(url))
            took = time.monotonic() - started
            requests = len(proxy.requests())
            assert report["totals"]["agents"] == agents, report["totals"]
    finally:
        em.stop()
    return {"seconds": took, "requests": requests, "per_agent": requests / max(agents, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="moto", help="comma-separated: moto, gcs")
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--rtt-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    goal = GOAL_SECONDS_PER_1000 * args.agents / 1000
    print("| backend | agents | wall s | requests | per agent | goal |")
    print("|---|---|---|---|---|---|")
    for name in args.backends.split(","):
        r = run(name, args.agents, args.rtt_ms)
        print(f"| {name} | {args.agents} | {r['seconds']:.1f} | {r['requests']} | {r['per_agent']:.1f} | "
              f"<= {goal:.0f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

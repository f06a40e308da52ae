"""What ``lnk-store-admin inspect`` shows for a store after the scheduler fired N jobs, before and after ``gc``.

Issue 15's figure.  On a fresh store (a local folder by default; moto's S3
server and fake-gcs-server with ``--backends``):

1. Live sentinels first, per agent: a job waiting, due in a day, and a lease
   held for an hour, so that a gc deleting anything live would show in the
   "live state" line.
2. ``--runners`` scheduler runners (the RECORDER fire command of
   ``scheduler_lateness.py``) fire ``--jobs`` jobs of ``--agents`` agents,
   put by a driver of the benchmark's own (``ServeProcess``, on the runners'
   wake folder: a put nudges them), due over ``--spread`` seconds.  Job ids
   are unique, or with ``--ids K`` only K ids are used, over and over, in
   rounds (a recurring job is put again once its previous firing finished).
   Once every job fired and left firing and ending, the runners are stopped.
3. ``lnk-store-admin`` (as a process, so its start-up is in the wall time)
   runs: ``inspect --json``; ``gc`` dry run and ``gc --apply`` with the
   default ``--min-age`` (120 s: tombstones younger than that are kept, so
   just after the jobs it deletes no lease tombstone); ``inspect --json``;
   then ``gc`` dry run and ``gc --apply`` with ``--min-age 0``; ``inspect
   --json`` again.

On the emulators every bucket request of the admin tool goes through
``tests/faults/http_proxy.py``'s ``FaultProxy`` (``--rtt-ms`` added to each,
20 ms by default), which counts them by kind; the runners and the putting
driver reach the emulator directly.  On ``file`` there is no wire: no
request counts, and no added latency.

    python benchmarks/gc_after_jobs.py                                  # file://, 1,000 jobs
    python benchmarks/gc_after_jobs.py --backends file,moto,gcs
    python benchmarks/gc_after_jobs.py --ids 100                        # 100 recurring jobs fired 10 times each

Figures, not assertions: a table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling.log import read_events

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/emulators.py, tests/faults: not installed
sys.path.insert(0, str(HERE))

from emulators import Emulator, start_fake_gcs, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy  # noqa: E402
from scheduler_cost import by_kind, progress  # noqa: E402  (requests by price class, as that benchmark counts)
from scheduler_lateness import RECORDER, wait_until  # noqa: E402  (benchmarks/: the fire recorder)

KINDS = ("event", "segment", "head", "tools", "job", "mark", "day", "file", "name", "due", "admin", "other")
GC_CATEGORIES = ("lease-tombstone", "due-orphan", "dead-epoch")
PLACES = ("waiting", "firing", "ending")
STEPS = (  # (label, admin arguments after the URL)
    ("inspect before", ["inspect", "--json"]),
    ("gc dry run (default min-age)", ["gc", "--json"]),
    ("gc --apply (default min-age)", ["gc", "--apply", "--json"]),
    ("inspect after default gc", ["inspect", "--json"]),
    ("gc dry run --min-age 0", ["gc", "--min-age", "0", "--json"]),
    ("gc --apply --min-age 0", ["gc", "--apply", "--min-age", "0", "--json"]),
    ("inspect after", ["inspect", "--json"]),
)




def admin_argv() -> list[str]:
    found = shutil.which("lnk-store-admin")
    return [found] if found else [sys.executable, "-m", "cloudstore.admin.cli"]


class Store:
    """One fresh store: the driver and settings that reach it directly, and the admin tool's URL and settings."""

    def __init__(self, name: str, stack: ExitStack, folder: Path, rtt_ms: float) -> None:
        self.name = name
        self.proxy: FaultProxy | None = None
        prefix = uuid.uuid4().hex[:12]
        if name == "file":
            (folder / "store").mkdir()
            self.url = (folder / "store").as_uri()
            self.driver = "lnk-bucket-store"
            self.env = {"LNK_BUCKET_URL": self.url}
            self.admin_env = dict(self.env)
            return
        if name not in ("moto", "gcs"):
            raise SystemExit(f"unknown backend {name!r}: file, moto or gcs")
        progress(f"{name}: starting the emulator")
        em: Emulator = (start_moto if name == "moto" else start_fake_gcs)()
        stack.callback(em.stop)
        endpoint_var, flavor, scheme, setting, self.driver = {
            "moto": ("AWS_ENDPOINT_URL_S3", "s3", "s3", "LNK_BUCKET_URL", "lnk-bucket-store"),
            "gcs": ("STORAGE_EMULATOR_HOST", "gcs", "gs", "LNK_GCS_URL", "lnk-gcs"),
        }[name]
        self.url = f"{scheme}://{em.bucket}/{prefix}"
        self.env = {**em.env, setting: self.url}
        self.proxy = stack.enter_context(FaultProxy(em.env[endpoint_var], flavor=flavor, latency=rtt_ms / 1000))
        self.admin_env = self.proxy.redirect(self.env)


def start_runners(folder: Path, store: Store, agents: list[dict[str, Any]], record: Path, n: int,
                  workers: int | None) -> list[tuple[subprocess.Popen, Path]]:
    runners = []
    for i in range(n):
        config = folder / f"runner{i}.json"
        settings: dict[str, Any] = {
            "agents": agents, "driver": store.driver, "driver_env": store.env,
            "fire": [sys.executable, "-S", "-c", RECORDER, str(record)],
        }
        if workers is not None:
            settings["workers"] = workers
        config.write_text(json.dumps(settings))
        log = folder / f"runner{i}.log"
        env = {**os.environ, "LNK_WAKE_DIR": str(folder / "wake")}
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        runners.append((proc, log))
    return runners


def stop_runners(runners: list[tuple[subprocess.Popen, Path]]) -> None:
    for proc, _ in runners:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc, _ in runners:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fired(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


def ask(store: ServeProcess, request: dict[str, Any]) -> dict[str, Any]:
    reply: dict[str, Any] = store.request(request, timeout=60)
    if "error" in reply:
        raise SystemExit(f"{request['op']} failed: {reply}")
    return reply


def settled(store: ServeProcess, agents: list[dict[str, Any]]) -> bool:
    """No job of any agent left firing or ending (every firing finished, its lease ended)."""
    return all(ask(store, {"op": "job_count", "agent": a, "place": p})["count"] == 0
               for a in agents for p in ("firing", "ending"))


def run_jobs(store: Store, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Sentinels, then ``args.jobs`` jobs fired by the runners; the runners stopped."""
    agents = [{"owner": "bench", "id": f"agent{i}"} for i in range(args.agents)]
    ids = args.ids or args.jobs
    rounds = math.ceil(args.jobs / ids)
    record = folder / "fired.jsonl"
    putter = ServeProcess(store.driver, {**store.env, "LNK_WAKE_DIR": str(folder / "wake")},
                          stderr=subprocess.DEVNULL)
    try:
        for a in agents:  # live things gc must keep: a job waiting (due in a day), a lease held for an hour
            ask(putter, {"op": "job_put", "agent": a, "place": "waiting",
                         "job": {"id": "sentinel", "spec": {"keep": True}, "due": time.time() + 86400}})
            took = ask(putter, {"op": "take", "agent": a, "thread": "sentinel", "holder": "bench",
                                "lapse_ms": 3_600_000})
            assert took.get("took") == "took", took
        runners = start_runners(folder, store, agents, record, args.runners, args.workers)
        try:
            wait_until(lambda: all(read_events(log, "started") for _, log in runners), 120, "the runners to start")
            progress(f"{store.name}: {args.runners} runners started; putting {args.jobs} jobs "
                     f"({ids} ids, {rounds} round(s)) of {args.agents} agents due over {args.spread:g} s")
            clock = time.monotonic()
            done = 0
            for r in range(rounds):
                count = min(ids, args.jobs - done)
                window = args.spread / rounds
                first = time.time() + 1.0
                for i in range(count):
                    due = first + window * i / max(1, count - 1)
                    job = {"id": f"j{i}", "spec": {"round": r, "n": i}, "due": due}
                    ask(putter, {"op": "job_put", "agent": agents[i % len(agents)], "place": "waiting", "job": job})
                done += count
                wait_until(lambda d=done: len(fired(record)) >= d, args.timeout, f"{done} jobs to fire")
                wait_until(lambda: settled(putter, agents), 120, "every firing to finish")
                if rounds > 1:
                    progress(f"{store.name}: round {r + 1}/{rounds}: {done} fired")
            took_s = time.monotonic() - clock
        finally:
            stop_runners(runners)
        shots = fired(record)
        occurrences = {(s["agent"], s["job"], s["due"]) for s in shots}
        per_runner = sorted(len(read_events(log, "fired")) for _, log in runners)
        problems = [e["event"] for _, log in runners for e in read_events(log)
                    if e.get("event") in ("lease_lost", "lost_job", "finish_failed")]
        progress(f"{store.name}: {len(shots)} fired in {took_s:.1f} s; runners stopped")
        return {"fired": len(shots), "duplicates": len(shots) - len(occurrences), "seconds": took_s,
                "per_runner": per_runner, "problems": problems, "ids": ids, "rounds": rounds,
                "agents": agents}
    finally:
        putter.close()


def run_admin(store: Store, argv: list[str]) -> dict[str, Any]:
    """One ``lnk-store-admin`` command: its JSON output, wall time, and bucket requests by kind (emulators)."""
    if store.proxy is not None:
        store.proxy.clear()
    command = admin_argv() + [argv[0], store.url] + argv[1:]
    clock = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, **store.admin_env})
    seconds = time.monotonic() - clock
    out: dict[str, Any] = {"seconds": seconds, "exit": done.returncode, "requests": None}
    if store.proxy is not None:
        out["requests"] = by_kind(store.proxy.requests())
    if done.returncode != 0:
        out["error"] = done.stderr.strip()[-2000:]
        progress(f"{store.name}: {' '.join(argv)} exited {done.returncode}: {out['error']}")
        return out
    out["report"] = json.loads(done.stdout)
    return out


def live_view(report: dict[str, Any]) -> dict[str, Any]:
    """What ops tell of each agent (lease timings left out), and the due index's entries: gc must change none."""
    view: dict[str, Any] = {}
    for a in report["agents"]:
        view[f"{a['owner_part']}/{a['id_part']}"] = {
            "conversations": a.get("conversations"),
            "leases": sorted((x["thread"], x["holder"], x["started"]) for x in a.get("leases", [])),
            "jobs": a.get("jobs"), "files": a.get("files"), "tools": a.get("tools"),
        }
    view["due index"] = {k: v for k, v in report["due_index"].items() if k != "unnamed_past_grace"}
    return view


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            out.append(f"{key}: {json.dumps(before.get(key))[:300]} -> {json.dumps(after.get(key))[:300]}")
    return out


def run_backend(name: str, args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"gcjobs-{name}-")))
        store = Store(name, stack, folder, args.rtt_ms)
        jobs = run_jobs(store, folder, args)
        steps: list[tuple[str, dict[str, Any]]] = []
        for label, argv in STEPS:
            progress(f"{name}: lnk-store-admin {' '.join(argv)}")
            steps.append((label, run_admin(store, argv)))
        return {"backend": name, "url_kind": store.url.split(":", 1)[0], "jobs": jobs, "steps": steps}


# -- the figures ---------------------------------------------------------------------------------------------


def _kinds_of(step: dict[str, Any]) -> dict[str, dict[str, int]]:
    return step.get("report", {}).get("totals", {}).get("kinds", {}) if step else {}


def _fmt_requests(kinds: dict[str, int] | None) -> str:
    if kinds is None:
        return "n/a (no wire)"
    total = sum(kinds.values())
    return f"{total} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})" if total else "0"


def _agent_sum(report: dict[str, Any], field: str) -> int:
    return sum(int(a.get(field, 0)) for a in report.get("agents", []))


def _jobs_sum(report: dict[str, Any], place: str) -> int:
    return sum(a["jobs"][place]["count"] for a in report.get("agents", []) if "jobs" in a)


def print_backend(r: dict[str, Any], args: argparse.Namespace) -> None:
    j = r["jobs"]
    steps = dict(r["steps"])
    inspects = [("before", steps["inspect before"]), ("after default gc", steps["inspect after default gc"]),
                ("after --min-age 0", steps["inspect after"])]
    print(f"== {r['backend']} ({r['url_kind']}://): {j['fired']} jobs fired ({j['ids']} job ids, "
          f"{j['rounds']} round(s), {args.agents} agents, due over {args.spread:g} s) "
          f"by {args.runners} runners in {j['seconds']:.1f} s; "
          f"duplicates {j['duplicates']}; fired per runner {j['per_runner']}; runner problems "
          f"{j['problems'] or 'none'}")
    print("   plus, per agent, one job waiting (due in a day) and one lease held for an hour (sentinels)")
    header = f"{'kind':10}" + "".join(f" {label + ' obj':>22} {'bytes':>10}" for label, _ in inspects)
    print(header)
    for kind in KINDS + ("TOTAL",):
        cells = []
        for _, step in inspects:
            if "report" not in step:
                cells.append(f" {'(failed)':>22} {'':>10}")
                continue
            if kind == "TOTAL":
                t = step["report"]["totals"]
                cells.append(f" {t['objects']:>22} {t['bytes']:>10}")
                continue
            slot = _kinds_of(step).get(kind)
            cells.append(f" {slot['objects'] if slot else 0:>22} {slot['bytes'] if slot else 0:>10}")
        if kind != "TOTAL" and all(c.split()[:2] == ["0", "0"] for c in cells):
            continue
        print(f"{kind:10}" + "".join(cells))
    for label, step in inspects:
        rep = step.get("report")
        if rep is None:
            continue
        d = rep["due_index"]
        print(f"  inspect {label}: heads {_agent_sum(rep, 'heads')}, live leases "
              f"{sum(len(a.get('leases', [])) for a in rep['agents'])}, lease tombstones "
              f"{_agent_sum(rep, 'lease_tombstones')}, removals pending {_agent_sum(rep, 'removals_pending')}; "
              f"jobs waiting/firing/ending {_jobs_sum(rep, 'waiting')}/{_jobs_sum(rep, 'firing')}/"
              f"{_jobs_sum(rep, 'ending')}; due index {d['entries']} entries, {d['unnamed']} no job names")
    rep = steps["inspect after"].get("report")
    if rep is not None:
        threads: dict[str, list[int]] = {}
        for a in rep["agents"]:
            for lease in a.get("leases", []):
                tally = threads.setdefault(lease["thread"], [0, 0])
                tally[0] += 1
                tally[1] += 1 if lease["lapsed"] else 0
        print("  live leases after gc, by thread: "
              + ", ".join(f"{t!r} {n} ({lapsed} lapsed)" for t, (n, lapsed) in sorted(threads.items())))
        records = _kinds_of(steps["inspect after"]).get("job", {}).get("objects", 0)
        listed = sum(_jobs_sum(rep, p) for p in PLACES)
        print(f"  job records holding no job after gc: {records - listed} of {records} (records minus jobs listed; "
              "gc never deletes job records: job_list sweeps such tombstones once an hour old)")
    print(f"  {'gc':32} {'judged dead':26} {'deleted':26} {'kept changed':>12} {'kept no-conditional':>26} "
          f"{'gone':>5} {'notes':>5}")
    for label in ("gc dry run (default min-age)", "gc --apply (default min-age)", "gc dry run --min-age 0",
                  "gc --apply --min-age 0"):
        step = steps[label]
        rep = step.get("report")
        if rep is None:
            print(f"  {label:32} failed (exit {step['exit']}): {step.get('error', '')[-300:]}")
            continue

        def cats(counts: dict[str, int] | None) -> str:
            if counts is None:
                return "-"
            return ", ".join(f"{k} {counts[k]}" for k in GC_CATEGORIES + tuple(sorted(set(counts) - set(GC_CATEGORIES)))
                             if counts.get(k)) or "0"

        applied = rep.get("applied")
        print(f"  {label:32} {cats(rep['judged_dead']):26} {cats(rep.get('deleted')) if applied else '-':26} "
              f"{cats(rep.get('kept_changed_since_judged')) if applied else '-':>12} "
              f"{cats(rep.get('kept_no_conditional_delete')) if applied else '-':>26} "
              f"{cats(rep.get('already_gone')) if applied else '-':>5} {len(rep['notes']):>5}")
        if applied:
            honoured = rep.get("conditional_delete_honoured")
            extra = "" if honoured else " (lease tombstones kept: the store ignores a delete's version)"
            print(f"  {'':32} conditional delete honoured: {honoured}{extra}; fenced {rep['fenced']}, "
                  f"removal records dropped {rep['records_dropped']}")
    rtt = "" if r["backend"] == "file" else f", {args.rtt_ms:g} ms added to each request at the proxy"
    print(f"  {'step':32} {'wall s':>7}  bucket requests (process start included in wall{rtt})")
    for label, step in r["steps"]:
        print(f"  {label:32} {step['seconds']:7.2f}  {_fmt_requests(step['requests'])}")
    before, after = steps["inspect before"].get("report"), steps["inspect after"].get("report")
    if before is not None and after is not None:
        diff = differences(live_view(before), live_view(after))
        print("  live state (what ops tell, due index) before vs after gc: " + ("unchanged" if not diff else "CHANGED"))
        for line in diff:
            print(f"    {line}")
    print()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="file", help="comma-separated: file, moto, gcs (default file)")
    p.add_argument("--jobs", type=int, default=1000, help="jobs fired (default 1000)")
    p.add_argument("--agents", type=int, default=4, help="agents the jobs are spread over (default 4)")
    p.add_argument("--spread", type=float, default=20.0, help="seconds the dues are spread over (default 20)")
    p.add_argument("--ids", type=int, default=None,
                   help="job ids used, over and over in rounds, to model recurring jobs (default: every id unique)")
    p.add_argument("--runners", type=int, default=2, help="scheduler runners (default 2)")
    p.add_argument("--workers", type=int, default=None, help="jobs each runner fires at once (runner's default)")
    p.add_argument("--rtt-ms", type=float, default=20.0, help="latency the proxy adds to the admin tool's requests")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds to wait for a round's jobs to fire")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.agents < 1 or args.runners < 1 or (args.ids is not None and args.ids < 1):
        p.error("--jobs, --agents, --runners and --ids must be at least 1")
    results = []
    for name in (n.strip() for n in args.backends.split(",") if n.strip()):
        results.append(run_backend(name, args))
    print("What lnk-store-admin inspect shows after the scheduler fired the jobs, before and after gc "
          "(objects and bytes by kind of key, from inspect --json's totals).")
    print()
    for r in results:
        print_backend(r, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

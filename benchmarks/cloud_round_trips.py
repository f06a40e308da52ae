#!/usr/bin/env python3
"""Round trips the drivers make against a bucket, counted outside the driver.

    python benchmarks/cloud_round_trips.py [--rtt-ms 20] [--repeats 5] [--quick]
        [--events 1000] [--big-events 10000 | --skip-big] [--agents 200]
        [--appends 30] [--files 100] [--big-files 4096] [--backends moto,gcs]
        [--show-requests] [--profile DIR [--profile-cpu]]

For each backend (S3 on moto's server, GCS on fake-gcs-server, both started
here as processes) a ``FaultProxy`` (tests/faults/http_proxy.py) sits between
the drivers and the emulator and adds ``--rtt-ms`` to every request.  The
requests are counted at that proxy, never from the driver's log, and every
figure is set beside the raw SDK (boto3 / google-cloud-storage, in this
process or in a fresh one) doing the nearest equivalent through the same
proxy in the same run:

* append p50, serve process, steady state  vs one conditional create
  (``put_object(IfNoneMatch='*')`` / ``upload_from_string(if_generation_match=0)``);
* ``last`` of an ``--events`` conversation, fresh serve process  vs one GET
  of a small object;
* ``read`` first=1 of ``--events``, fresh process  vs one GET of an object as
  big as all those events;
* ``read`` first=events-9 (the last ten), fresh process  vs one GET of ten
  events' bytes;
* under both reads, their raw floor (same objects, same rounds): each try's
  own requests, as the proxy saw them, grouped into the rounds the proxy saw
  (``rounds_in``), replayed by the raw SDK in a fresh python warmed as the
  driver's process was (``raw_floor.py``), round after round, each round's
  requests at once; its wall time beside the driver's, and both sides' CPU;
* ``read`` first=1 of ``--big-events``, fresh process (filled straight
  against the emulator, without the proxy's latency)  vs one GET as big;
* ``job_next`` with ``--agents`` agents each holding a waiting job, fresh
  process and then the same process again  vs one LIST of 16 keys;
* ``file_list`` of a folder of ``--files`` files and as many tombstones, and
  (``file_list big``) of ``--big-files``, 4,096 (the contract's limit), and
  as many, fresh process  vs the raw
  SDK listing every key under the folder (all its pages); filled straight
  against the emulator through the seam, in parallel, with the bodies the
  driver writes (a driver of the older layout: its bodies);
* ``call`` mode: one ``lnk-bucket-store call`` / ``lnk-gcs call`` process
  answering ``file_read``  vs a fresh ``python -c`` importing the SDK, making
  a client and making one GET.

A fresh serve process is started and warmed on another agent first (SDK
import, client, first connection), then only the request of interest is
counted and timed.  Each figure is the median of ``--repeats`` tries (appends:
of ``--appends``).  Round trips are wall time / RTT: how many RTTs deep the
op is, counting requests made in parallel once.  Rounds are the same depth
counted at the proxy instead of timed (``rounds_of``): what the design costs
on any store, where the wall time also holds the emulator's own speed (a
LIST on an emulator scans the whole bucket, and moto serves requests sent
beside it only as its CPU frees).  Figures, not assertions:
emulators on a shared 2-core machine are noisy, and the proxy opens a new
upstream connection per request, which adds a little under each request.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cloudstore.protocol.client import ServeProcess, call_once, driver_env

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/faults, tests/emulators.py: not installed

from emulators import Emulator, start_fake_gcs, start_moto  # noqa: E402
from faults.http_proxy import FaultProxy, Seen  # noqa: E402
from faults.rounds import rounds_in, rounds_of  # noqa: E402

AGENT = {"id": "bench", "owner": "bench"}
WARM = {"op": "last", "agent": {"id": "warm-up", "owner": None}, "thread": "warm-up"}
FILE_PATH = "instructions/bench.md"
TIMEOUT = 300.0

#: The figures' names, in the order printed (the smoke test looks for each).
FIGURES = ("append p50", "last, fresh", "read first=1", "read last 10", "read first=1 big",
           "job_next, fresh", "job_next, warm", "file_list", "file_list big", "call file_read")
#: The raw floor's process (the raw SDK replaying a driver's requests round by round), and the driver
#: wrapped in cProfile (``--profile``): benchmarks of their own, never the package's path.
FLOOR_SCRIPT = os.path.join(HERE, "raw_floor.py")
PROFILED_SERVE = os.path.join(HERE, "profiled_serve.py")
#: The folder of the file_list figures, and the most files a folder may hold (the contract's FILES_MAX).
FILES_FOLDER = "skills"
FILES_MAX = 4096


def progress(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def event(seq: int, text_bytes: int) -> dict:
    return {"seq": seq, "text": "x" * text_bytes}


def event_size(text_bytes: int) -> int:
    """Bytes of one event as compact JSON (a typical seq): the raw baselines read as many."""
    return len(json.dumps(event(500, text_bytes), separators=(",", ":")))


# -- the two backends, seen from the benchmark


@dataclass
class Backend:
    name: str  # "moto" / "gcs"
    label: str
    program: str
    setting: str  # LNK_BUCKET_URL / LNK_GCS_URL
    scheme: str
    endpoint_var: str  # the env var naming the emulator's URL
    flavor: str  # FaultProxy error flavor
    start: Callable[[], Emulator]


BACKENDS = {
    "moto": Backend("moto", "S3 on moto's server", "lnk-bucket-store", "LNK_BUCKET_URL", "s3",
                    "AWS_ENDPOINT_URL_S3", "s3", start_moto),
    "gcs": Backend("gcs", "GCS on fake-gcs-server (memory)", "lnk-gcs", "LNK_GCS_URL", "gs",
                   "STORAGE_EMULATOR_HOST", "gcs", start_fake_gcs),
}


class RawSDK:
    """The raw SDK in this process, through the proxy: the baselines."""

    def __init__(self, backend: Backend, url: str, env: dict[str, str], bucket: str) -> None:
        self.backend = backend
        self.bucket_name = bucket
        if backend.name == "moto":
            import boto3
            from botocore.config import Config

            self.client: Any = boto3.session.Session().client(
                "s3", endpoint_url=url, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"],
                config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))
        else:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self.client = storage.Client(project=env.get("GOOGLE_CLOUD_PROJECT", "test"),
                                         credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
            # As the driver does: no background bucket-metadata read (a request nobody asked for).
            if getattr(self.client, "_bucket_metadata_cache", None) is not None:
                self.client._bucket_metadata_cache = None
            self.bucket = self.client.bucket(bucket)

    def create(self, key: str, data: bytes) -> None:
        """One conditional create (the key must be new)."""
        if self.backend.name == "moto":
            self.client.put_object(Bucket=self.bucket_name, Key=key, Body=data, IfNoneMatch="*")
        else:
            self.bucket.blob(key).upload_from_string(data, if_generation_match=0)

    def get(self, key: str) -> bytes:
        if self.backend.name == "moto":
            return self.client.get_object(Bucket=self.bucket_name, Key=key)["Body"].read()
        return self.bucket.blob(key).download_as_bytes()

    def list_all(self, prefix: str) -> int:
        """Every key under ``prefix``, all pages (the driver's listing of a folder, raw)."""
        if self.backend.name == "moto":
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket_name, Prefix=prefix)
            return sum(len(page.get("Contents", [])) for page in pages)
        return len(list(self.client.list_blobs(self.bucket_name, prefix=prefix)))

    def list16(self, prefix: str) -> int:
        if self.backend.name == "moto":
            return len(self.client.list_objects_v2(Bucket=self.bucket_name, Prefix=prefix, MaxKeys=16)
                       .get("Contents", []))
        return len(list(self.client.list_blobs(self.bucket_name, prefix=prefix, max_results=16)))


BARE_SCRIPT = {
    "moto": """
import sys, boto3
c = boto3.client("s3")
c.get_object(Bucket=sys.argv[1], Key=sys.argv[2])["Body"].read()
""",
    "gcs": """
import sys
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
c = storage.Client(project="test", credentials=AnonymousCredentials())
c._bucket_metadata_cache = None
c.bucket(sys.argv[1]).blob(sys.argv[2]).download_as_bytes()
""",
}


# A folder of files and as many tombstones, written straight through the seam (in parallel, without a
# driver's op per file) with the bodies the driver under test writes: this layout's (``files.body``), or
# the older layout's when PYTHONPATH holds an older cloudstore.  The first file is the driver's own op, so
# the agent has what its first file gives it (this layout: the ledger).
FILL_FILES = """
import base64, json, os, sys
from concurrent.futures import ThreadPoolExecutor
from cloudstore.generations import Create
from cloudstore.settings import open_store, parse_location
try:
    from cloudstore.protocol.service import Service
    from cloudstore.protocol.validate import Agent
    from cloudstore.store import files
    from cloudstore.store.space import Space
except ImportError:  # a tree from before 0.6.1's folders (cloudstore/store/, cloudstore/protocol/)
    from cloudstore import files
    from cloudstore.service import Service
    from cloudstore.space import Space
    from cloudstore.validate import Agent

setting, count, folder, agent = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
loc = parse_location(setting, os.environ[setting], ("gs", "s3", "file"))
service = Service(Space(open_store(loc), loc.prefix))
live = [f"{folder}/live/{i:05d}.md" for i in range(count)]
gone = [f"{folder}/gone/{i:05d}.md" for i in range(count)]
first = service.answer({"op": "file_write", "agent": agent, "path": live[0], "data": "eA==", "version": 0})
assert first == {"reply": "wrote", "version": 1}, first
keys = service.space.keys(Agent(id=agent["id"], owner=agent["owner"]))
make = getattr(files, "body", None)

def put(path, removed):
    header = {"v": 2, "path": path, "gone": True} if removed else {"v": 1, "path": path}
    data = b"" if removed else ("# " + path + "\\n").encode()
    payload = make(header, data, Create().lineage) if make else files._join(header, data)
    service.space.store.put(keys.file(path), payload, Create())

with ThreadPoolExecutor(16) as pool:
    list(pool.map(lambda item: put(*item), [(p, False) for p in live[1:]] + [(p, True) for p in gone]))
"""


def fill_files(backend: Backend, env: dict[str, str], agent: dict, count: int) -> None:
    """``count`` files and ``count`` tombstones of ``agent`` under ``FILES_FOLDER`` (see ``FILL_FILES``)."""
    start = time.monotonic()
    argv = [sys.executable, "-c", FILL_FILES, backend.setting, str(count), FILES_FOLDER, json.dumps(agent)]
    done = subprocess.run(argv, env=driver_env(env), capture_output=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"filling {count} files exited {done.returncode}: {done.stderr.decode()[-1500:]}")
    progress(f"{backend.name}: {count} files and {count} tombstones written in {time.monotonic() - start:.0f} s")


# -- measuring


@dataclass
class Sample:
    ms: list[float] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    def add(self, ms: float, seen: Sequence[Seen]) -> None:
        """One try: its wall time and what the proxy saw of it."""
        self.ms.append(ms)
        self.requests.append(len(seen))
        self.rounds.append(rounds_of(seen))

    @property
    def p50(self) -> float:
        return statistics.median(self.ms)

    @property
    def req(self) -> float:
        return statistics.median(self.requests)

    @property
    def depth(self) -> float:
        return statistics.median(self.rounds)


@dataclass
class Floor:
    """The raw floor of a fresh figure: each try's own requests, in its rounds, from the raw SDK.

    ``cpu_ms``: CPU time of each try in the floor's process, and
    ``driver_cpu_ms`` in the driver's serve process (every thread, both).
    """

    program: list[str]  # raw_floor.py for the backend (ServeProcess adds "serve")
    sample: Sample = field(default_factory=Sample)
    cpu_ms: list[float] = field(default_factory=list)
    driver_cpu_ms: list[float] = field(default_factory=list)
    driver: Sample | None = None  # the driver's tries, for the ratio


@dataclass
class Row:
    figure: str
    driver: Sample
    baseline_name: str
    baseline: Sample
    note: str = ""
    floor: Floor | None = None


SHOW_REQUESTS = False  # --show-requests: each counted request on stderr


def timed(proxy: FaultProxy, fn: Callable[[], Any]) -> tuple[float, list[Seen], Any]:
    """Run ``fn`` once with the proxy's record cleared: (ms, the requests the proxy saw, result)."""
    proxy.clear()
    began = time.monotonic()
    start = time.perf_counter()
    result = fn()
    ms = (time.perf_counter() - start) * 1000
    seen = proxy.requests()
    if SHOW_REQUESTS:
        progress(f"{len(seen)} requests in {ms:.1f} ms:")
        for s in seen:
            progress(f"  +{(s.at - began) * 1000:7.1f} ms ..{(s.answered - began) * 1000:7.1f} ms "
                     f"{s.method} {s.target[:400]} -> {s.status} ({s.sent} B)")
    return ms, seen, result


def checked(reply: Any, what: str) -> Any:
    if not isinstance(reply, dict) or reply.get("reply") == "error":
        raise RuntimeError(f"{what}: {reply}")
    return reply


@contextlib.contextmanager
def no_latency(proxy: FaultProxy) -> Iterator[None]:
    """The proxy without its added latency, for setting things up."""
    kept = proxy.latency
    proxy.latency = 0.0
    try:
        yield
    finally:
        proxy.latency = kept


@contextlib.contextmanager
def warmed(program: str | list[str], env: dict[str, str], count: int, proxy: FaultProxy | None = None,
           warm_seen: list[list[Seen]] | None = None) -> Iterator[list[ServeProcess]]:
    """``count`` serve processes, started at once and each warmed on another agent; with ``proxy``,
    the requests each warm-up made are put in ``warm_seen`` (the raw floor warms up as they did)."""
    procs = [ServeProcess(program, env=env) for _ in range(count)]
    try:
        for p in procs:
            if proxy is not None:
                proxy.clear()
            checked(p.request(WARM, timeout=TIMEOUT), "warm-up")
            if proxy is not None and warm_seen is not None:
                time.sleep(0.05)  # a request the warm-up left in flight past its reply (the gate's) is answered
                warm_seen.append(proxy.requests())
        yield procs
    finally:
        for p in procs:
            p.close()


def fresh(proxy: FaultProxy, program: str | list[str], env: dict[str, str], request: dict, repeats: int,
          check: Callable[[dict], None] | None = None, floor: Floor | None = None) -> Sample:
    """``request`` as the first request (after the warm-up) of each of ``repeats`` fresh processes;
    with ``floor``, each try's raw floor measured right after it (``measure_floor``)."""
    sample = Sample()
    warm_seen: list[list[Seen]] = []
    with warmed(program, env, repeats, proxy if floor else None, warm_seen) as procs:
        for i, p in enumerate(procs):
            cpu = cpu_ms(p.proc.pid)
            ms, seen, reply = timed(proxy, lambda p=p: p.request(request, timeout=TIMEOUT))
            cpu = cpu_ms(p.proc.pid) - cpu
            checked(reply, request["op"])
            if check:
                check(reply)
            sample.add(ms, seen)
            p.close()
            if floor is not None:
                floor.driver_cpu_ms.append(cpu)
                measure_floor(proxy, env, floor, warm_seen[i], seen)
    if floor is not None:
        floor.driver = sample
    return sample


def cpu_ms(pid: int) -> float:
    """CPU time of a process so far, every thread, in ms (Linux's schedstat: nanoseconds, not ticks)."""
    total = 0
    task_dir = f"/proc/{pid}/task"
    for task in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e6


def plan(seen: Sequence[Seen]) -> list[list[list[str]]]:
    """A try's requests as the raw floor replays them: (method, target), by round (``rounds_in``)."""
    return [[[s.method, s.target] for s in r] for r in rounds_in(seen)]


def measure_floor(proxy: FaultProxy, env: dict[str, str], floor: Floor, warm: Sequence[Seen],
                  seen: Sequence[Seen]) -> None:
    """The raw floor of one try: a fresh python (raw_floor.py) makes its client, replays the driver's
    warm-up, then (timed, counted at the proxy) the try's requests in the try's rounds."""
    with ServeProcess(floor.program, env=env) as raw:
        warmed_up = raw.request({"rounds": plan(warm), "warm": True}, timeout=TIMEOUT)
        if "error" in warmed_up:
            raise RuntimeError(f"the raw floor's warm-up failed: {warmed_up['error']}")
        ms, replayed, reply = timed(proxy, lambda: raw.request({"rounds": plan(seen)}, timeout=TIMEOUT))
    if "error" in reply:
        raise RuntimeError(f"the raw floor's replay failed: {reply['error']}")
    asked = sorted((s.method, s.target) for s in seen)
    if sorted((s.method, s.target) for s in replayed) != asked:
        raise RuntimeError(f"the raw floor sent other requests than the driver's {len(asked)}: "
                           f"{sorted((s.method, s.target) for s in replayed)}")
    floor.sample.add(ms, replayed)
    floor.cpu_ms.append(float(reply["cpu_ms"]))


def fill(program: str, env: dict[str, str], thread: str, events: int, text_bytes: int) -> None:
    """Append events 1..``events`` to ``thread`` in one serve process (straight to the emulator)."""
    start = time.monotonic()
    with ServeProcess(program, env=env) as p:
        for seq in range(1, events + 1):
            reply = p.request({"op": "append", "agent": AGENT, "thread": thread, "event": event(seq, text_bytes)},
                              timeout=TIMEOUT)
            if reply != {"reply": "done"}:
                raise RuntimeError(f"filling {thread}: append {seq} answered {reply}")
    progress(f"filled {thread} with {events} events in {time.monotonic() - start:.1f} s (no proxy)")


def make_bucket(backend: Backend, em: Emulator, name: str) -> None:
    """Another bucket on the same emulator."""
    import urllib.request

    base = em.env[backend.endpoint_var]
    if backend.name == "moto":
        req = urllib.request.Request(f"{base}/{name}", method="PUT")
    else:
        req = urllib.request.Request(f"{base}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()


def fill_all(program: str, env: dict[str, str], threads: list[tuple[dict[str, str], str, int]], text_bytes: int,
             agents: int) -> None:
    """Fill the conversations and put the agents' jobs, each in a serve process of its own, at once."""
    errors: list[BaseException] = []

    def guard(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
        return run

    def jobs() -> None:
        start = time.monotonic()
        with ServeProcess(program, env=env) as p:
            for i in range(agents):
                checked(p.request({"op": "job_put", "agent": {"id": f"agent-{i}", "owner": f"owner-{i % 7}"},
                                   "place": "waiting",
                                   "job": {"id": "j", "spec": {"i": i}, "due": 2_000_000_000 + i}},
                                  timeout=TIMEOUT), "job_put")
            wrote = p.request({"op": "file_write", "agent": AGENT, "path": FILE_PATH,
                               "data": "aGVsbG8sIHdvcmxkCg==", "version": 0}, timeout=TIMEOUT)  # 0: a new file
            if wrote != {"reply": "wrote", "version": 1}:
                raise RuntimeError(f"file_write answered {wrote}")
        progress(f"put {agents} agents' waiting jobs in {time.monotonic() - start:.1f} s (no proxy)")

    workers = [threading.Thread(target=guard(fill, program, e, t, n, text_bytes)) for e, t, n in threads]
    workers.append(threading.Thread(target=guard(jobs)))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


# -- one backend


class Turns:
    """Backends set up at once, then measure one after another, once every one is set up."""

    def __init__(self, count: int) -> None:
        self.ready = threading.Barrier(count)
        self.cond = threading.Condition()
        self.now = 0

    def wait(self, i: int) -> None:
        self.ready.wait()
        with self.cond:
            self.cond.wait_for(lambda: self.now >= i)

    def done(self, i: int) -> None:
        self.ready.abort()  # a run that failed before the barrier must not leave the others waiting
        with self.cond:
            self.now = max(self.now, i + 1)
            self.cond.notify_all()


def bench(backend: Backend, args: argparse.Namespace, turn: Callable[[], None] = lambda: None) -> list[Row]:
    """The figures of one backend: set up, then ``turn()`` (wait for the machine), then measure."""
    progress(f"{backend.label}: starting the emulator")
    em = backend.start()
    try:
        upstream = em.env[backend.endpoint_var]
        with FaultProxy(upstream, flavor=backend.flavor, latency=args.rtt_ms / 1000.0) as proxy:
            return _bench(backend, args, em, proxy, turn)
    finally:
        em.stop()


def _bench(backend: Backend, args: argparse.Namespace, em: Emulator, proxy: FaultProxy,
           turn: Callable[[], None]) -> list[Row]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    direct = {**em.env, backend.setting: f"{backend.scheme}://{em.bucket}/{prefix}"}
    via = proxy.redirect(direct)
    assert via[backend.endpoint_var] == proxy.url, "the proxy did not take the emulator's place"
    program, n, big, tb = backend.program, args.events, args.big_events, args.text_bytes
    # The fresh figures' serve processes; with --profile, under cProfile (profiled_serve.py), stats in its folder.
    served: str | list[str] = program
    if args.profile:
        served = [sys.executable, PROFILED_SERVE, program]
        via = {**via, "BENCH_PROFILE_DIR": os.path.abspath(args.profile),
               "BENCH_PROFILE_CLOCK": "cpu" if args.profile_cpu else "wall"}
    rows: list[Row] = []

    # Setting up, without the proxy's latency: the conversations, the jobs, the raw objects.  The big
    # conversation has a bucket of its own: the emulators list by scanning the whole bucket (moto's LIST
    # of 16 keys takes ~20x longer beside 10,000 events), which would swamp every other figure.
    threads = [(direct, f"conv-{n}", n)]
    if not args.skip_big:
        big_bucket = f"{em.bucket}-big"
        make_bucket(backend, em, big_bucket)
        direct_big = {**em.env, backend.setting: f"{backend.scheme}://{big_bucket}/{prefix}"}
        via_big = proxy.redirect(direct_big)
        threads.append((direct_big, f"conv-{big}", big))
    fill_all(program, direct, threads, tb, args.agents)
    file_counts = [args.files] + ([] if args.skip_big else [args.big_files])
    file_agents = {count: {"id": f"files-{count}", "owner": "bench"} for count in file_counts}
    for count in file_counts:
        fill_files(backend, direct, file_agents[count], count)
    raw = RawSDK(backend, proxy.url, em.env, em.bucket)
    size = event_size(tb)
    raw_prefix = f"raw-{uuid.uuid4().hex[:8]}/"
    with no_latency(proxy):
        raw.create(raw_prefix + "small", b'{"last":1000}')
        raw.create(raw_prefix + f"events-{n}", b"x" * (size * n))
        raw.create(raw_prefix + "events-10", b"x" * (size * 10))
        if not args.skip_big:
            raw_big = RawSDK(backend, proxy.url, em.env, big_bucket)
            raw_big.create(raw_prefix + f"events-{big}", b"x" * (size * big))
        for i in range(max(args.agents, 16)):
            raw.create(f"{raw_prefix}list/{i:05d}", b"j")
        raw.get(raw_prefix + "small")  # warm: the raw client's first connection is not a figure
    turn()

    def raw_sample(fn: Callable[[], Any], times: int) -> Sample:
        sample = Sample()
        for _ in range(times):
            ms, seen, _ = timed(proxy, fn)
            sample.add(ms, seen)
        return sample

    reps = args.repeats

    # append, steady state in a warm serve process
    progress(f"{backend.name}: append x{args.appends}")
    appends = Sample()
    with warmed(program, via, 1) as (p,):
        thread = f"appends-{uuid.uuid4().hex[:6]}"
        for seq in range(1, args.appends + 1):
            req = {"op": "append", "agent": AGENT, "thread": thread, "event": event(seq, tb)}
            ms, seen, reply = timed(proxy, lambda p=p, req=req: p.request(req, timeout=TIMEOUT))
            if reply != {"reply": "done"}:
                raise RuntimeError(f"append {seq}: {reply}")
            appends.add(ms, seen)
    creates = raw_sample(lambda: raw.create(f"{raw_prefix}create/{uuid.uuid4().hex}", b"x" * size), args.appends)
    rows.append(Row("append p50", appends, "1 conditional create", creates,
                    f"req mean {statistics.mean(appends.requests):.2f} max {max(appends.requests)}, "
                    f"{args.appends} appends"))

    # last / read from fresh processes
    conv = f"conv-{n}"

    def expect_last(reply: dict) -> None:
        if reply.get("last") != n:
            raise RuntimeError(f"last of {conv} answered {reply}")

    def expect_events(count: int, first: int) -> Callable[[dict], None]:
        def check(reply: dict) -> None:
            events = reply.get("events", [])
            if len(events) != count or (events and events[0].get("seq") != first):
                raise RuntimeError(f"read first={first} of {conv}: {len(events)} events, expected {count}")
        return check

    progress(f"{backend.name}: last, read (fresh processes x{reps})")
    rows.append(Row("last, fresh", fresh(proxy, served, via, {"op": "last", "agent": AGENT, "thread": conv}, reps,
                                         expect_last),
                    "1 GET, small object", raw_sample(lambda: raw.get(raw_prefix + "small"), reps),
                    f"{n} events"))
    for figure, first, count, whole in (("read first=1", 1, n, size * n), ("read last 10", n - 9, 10, size * 10)):
        floor = Floor([sys.executable, FLOOR_SCRIPT, backend.name])
        read = fresh(proxy, served, via, {"op": "read", "agent": AGENT, "thread": conv, "first": first}, reps,
                     expect_events(count, first), floor)
        name = f"1 GET, {whole // 1024} KiB" if whole >= 10240 else f"1 GET, {whole} B"
        one_get = raw_sample(lambda k=f"events-{count}": raw.get(raw_prefix + k), reps)
        rows.append(Row(figure, read, name, one_get, f"first={first} of {n}" if first > 1 else f"{n} events",
                        floor))
    if not args.skip_big:
        progress(f"{backend.name}: read first=1 of {big} (fresh processes x{reps})")
        bconv = f"conv-{big}"

        def expect_big(reply: dict) -> None:
            events = reply.get("events", [])
            if len(events) != big:
                raise RuntimeError(f"read first=1 of {bconv}: {len(events)} events")

        big_read = fresh(proxy, served, via_big, {"op": "read", "agent": AGENT, "thread": bconv, "first": 1},
                         reps, expect_big)
        with no_latency(proxy):
            raw_big.get(raw_prefix + f"events-{big}")  # warm
        big_get = raw_sample(lambda: raw_big.get(raw_prefix + f"events-{big}"), reps)
        big_list = raw_sample(lambda: raw_big.list16(prefix + "/"), reps)
        rows.append(Row("read first=1 big", big_read, f"1 GET, {size * big // 1024} KiB", big_get,
                        f"{big} events, own bucket; raw LIST 16 there {big_list.p50:.0f} ms"))

    # job_next: fresh, then the same processes again
    progress(f"{backend.name}: job_next with {args.agents} agents waiting")
    due = 2_000_000_000
    next_fresh, next_warm = Sample(), Sample()
    with warmed(program, via, reps) as procs:
        for p in procs:
            for sample in (next_fresh, next_warm):
                ms, seen, reply = timed(proxy, lambda p=p: p.request({"op": "job_next", "agent": AGENT},
                                                                  timeout=TIMEOUT))
                if checked(reply, "job_next").get("next") != due:
                    raise RuntimeError(f"job_next answered {reply}, expected {due}")
                sample.add(ms, seen)
            p.close()
    listing = raw_sample(lambda: raw.list16(raw_prefix + "list/"), reps)
    rows.append(Row("job_next, fresh", next_fresh, "1 LIST, 16 keys", listing, f"{args.agents} agents"))
    rows.append(Row("job_next, warm", next_warm, "1 LIST, 16 keys", listing, "2nd job_next, same process"))

    # file_list from fresh processes, beside the raw listing of the folder's keys
    from cloudstore.store.keys import AgentKeys

    for count in file_counts:
        progress(f"{backend.name}: file_list of {count} files and {count} tombstones (fresh processes x{reps})")
        agent = file_agents[count]

        def expect_files(reply: dict, count: int = count) -> None:
            if len(reply.get("files", [])) != count:
                raise RuntimeError(f"file_list answered {len(reply.get('files', []))} files, expected {count}")

        listed = fresh(proxy, served, via, {"op": "file_list", "agent": agent, "folder": FILES_FOLDER}, reps,
                       expect_files)
        folder_prefix = AgentKeys(f"{prefix}/", agent["owner"], agent["id"]).folder(FILES_FOLDER)
        with no_latency(proxy):
            keys = raw.list_all(folder_prefix)  # the files and tombstones, and a moved stub at a path's old key
            if keys < 2 * count:  # (files.py) where a driver's own write made it
                raise RuntimeError(f"the raw listing of {folder_prefix} holds {keys} keys, under {2 * count}")
        rows.append(Row("file_list" if count == file_counts[0] else "file_list big", listed,
                        f"LIST all, {keys} keys", raw_sample(lambda p=folder_prefix: raw.list_all(p), reps),
                        f"{count} files + {count} tombstones"))

    # call mode: one process per request, against a bare SDK in a fresh python
    progress(f"{backend.name}: call mode x{reps}")
    calls = Sample()
    request = {"op": "file_read", "agent": AGENT, "path": FILE_PATH}
    for _ in range(reps):
        ms, seen, (lines, err, code) = timed(proxy, lambda: call_once(program, request, env=via, timeout=TIMEOUT))
        if code != 0 or len(lines) != 1 or not json.loads(lines[0]).get("file"):
            raise RuntimeError(f"{program} call exited {code}: {lines} {err[-500:]}")
        calls.add(ms, seen)
    bare = Sample()
    for _ in range(reps):
        argv = [sys.executable, "-c", BARE_SCRIPT[backend.name], em.bucket, raw_prefix + "small"]
        ms, seen, done = timed(proxy, lambda argv=argv: subprocess.run(argv, env=driver_env(via), capture_output=True,
                                                              timeout=TIMEOUT))
        if done.returncode != 0:
            raise RuntimeError(f"bare SDK GET exited {done.returncode}: {done.stderr.decode()[-800:]}")
        bare.add(ms, seen)
    rows.append(Row("call file_read", calls, "python: import SDK + 1 GET", bare, "process per request"))
    return rows


# -- printing


def fmt_req(sample: Sample) -> str:
    return f"{sample.req:g}"


def fmt_rounds(sample: Sample) -> str:
    return f"{sample.depth:g}"


def fmt_rt(ms: float, rtt_ms: float) -> str:
    return f"{ms / rtt_ms:.1f}" if rtt_ms > 0 else "-"


def table(label: str, rows: Sequence[Row], rtt_ms: float) -> str:
    head = (f"{'figure':<18} {'req':>5} {'rounds':>6} {'wall ms':>9} {'RTTs':>6} | {'raw SDK, nearest equivalent':<28} "
            f"{'req':>4} {'wall ms':>9} {'RTTs':>6} | {'ratio':>6}  note")
    out = [f"\n{label}", head, "-" * len(head)]
    for r in rows:
        d, b = r.driver, r.baseline
        ratio = d.p50 / b.p50 if b.p50 > 0 else float("nan")
        out.append(f"{r.figure:<18} {fmt_req(d):>5} {fmt_rounds(d):>6} {d.p50:9.1f} {fmt_rt(d.p50, rtt_ms):>6} | "
                   f"{r.baseline_name:<28} {fmt_req(b):>4} {b.p50:9.1f} {fmt_rt(b.p50, rtt_ms):>6} | "
                   f"{ratio:6.2f}  {r.note}")
        if r.floor is not None:
            out.append(floor_line(r.floor, rtt_ms))
    return "\n".join(out)


def floor_line(floor: Floor, rtt_ms: float) -> str:
    """The raw floor under a figure, on a line of its own: its requests, rounds and wall time, the ratio
    of the driver's wall time to it (median of the tries' ratios), and both sides' CPU time."""
    f, d = floor.sample, floor.driver
    ratios = [dm / fm for dm, fm in zip(d.ms, f.ms, strict=True) if fm > 0] if d is not None else []
    ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
    tries = ", ".join(f"{x:.2f}" for x in ratios)
    cpu = f"CPU ms driver {statistics.median(floor.driver_cpu_ms):.1f}, raw floor {statistics.median(floor.cpu_ms):.1f}"
    return (f"  ^ raw floor (same objects, same rounds): req {fmt_req(f)}, rounds {fmt_rounds(f)}, "
            f"wall {f.p50:.1f} ms ({fmt_rt(f.p50, rtt_ms)} RTTs); driver / raw floor {ratio} (tries {tries}); {cpu}")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="latency the proxy adds to every request")
    parser.add_argument("--repeats", type=int, default=None, help="tries per figure, median reported (5; 3 quick)")
    parser.add_argument("--appends", type=int, default=None, help="appends timed (30; 15 quick)")
    parser.add_argument("--events", type=int, default=1000, help="events of the conversation read")
    parser.add_argument("--big-events", type=int, default=10000, help="events of the big conversation")
    parser.add_argument("--skip-big", action="store_true", help="leave out the big conversation (quick does)")
    parser.add_argument("--agents", type=int, default=200, help="agents holding a waiting job, for job_next")
    parser.add_argument("--text-bytes", type=int, default=200, help="bytes of text in each event")
    parser.add_argument("--files", type=int, default=100, help="files (and as many tombstones) of file_list")
    parser.add_argument("--big-files", type=int, default=FILES_MAX,
                        help="files (and as many tombstones) of file_list big (left out with --skip-big)")
    parser.add_argument("--backends", default="moto,gcs", help="comma-separated: moto, gcs")
    parser.add_argument("--quick", action="store_true", help="fewer repeats, no big conversation")
    parser.add_argument("--show-requests", action="store_true", help="print each counted request on stderr")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="run the fresh figures' serve processes under cProfile (benchmarks/profiled_serve.py), "
                             "every thread, each op after the warm-up; pstats files in DIR")
    parser.add_argument("--profile-cpu", action="store_true",
                        help="with --profile: time functions by their thread's CPU time, not the wall clock")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.appends is None:
        args.appends = 15 if args.quick else 30
    args.skip_big = args.skip_big or args.quick
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names:
        parser.error(f"--backends takes a comma-separated list of {', '.join(BACKENDS)}, not {args.backends!r}")
    args.backend_names = names
    if args.events < 10 or args.repeats < 1 or args.appends < 1 or args.agents < 1:
        parser.error("--events must be at least 10; --repeats, --appends and --agents at least 1")
    if not (1 <= args.files <= FILES_MAX and 1 <= args.big_files <= FILES_MAX) or args.files == args.big_files:
        parser.error(f"--files and --big-files must be from 1 to {FILES_MAX}, and differ")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    global SHOW_REQUESTS
    args = parse(argv)
    SHOW_REQUESTS = args.show_requests
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    print(f"cloud round trips: RTT {args.rtt_ms:g} ms added by a proxy per request; backends "
          f"{', '.join(BACKENDS[b].label for b in args.backend_names)}; {now}")
    print(f"host {platform.node()} ({os.cpu_count()} cores), python {platform.python_version()}; "
          f"repeats {args.repeats}, appends {args.appends}, events {args.events}, "
          f"big {'skipped' if args.skip_big else args.big_events}, agents {args.agents}, "
          f"event text {args.text_bytes} B")
    print("req: requests counted at the proxy (median); rounds: requests one after another at the proxy "
          "(median); wall ms: median; RTTs: wall / RTT; "
          "ratio: driver wall / raw SDK wall")
    sys.stdout.flush()
    started = time.monotonic()
    # Every backend fills its store at once (the slow part, CPU-bound in the emulators and drivers);
    # the measuring waits until all are filled, and runs one backend at a time.
    turns = Turns(len(args.backend_names))
    results: dict[int, list[Row]] = {}
    errors: dict[int, BaseException] = {}

    def run(i: int, backend: Backend) -> None:
        try:
            results[i] = bench(backend, args, lambda: turns.wait(i))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors[i] = exc
        finally:
            turns.done(i)

    workers = [threading.Thread(target=run, args=(i, BACKENDS[name]), daemon=True)
               for i, name in enumerate(args.backend_names)]
    for w in workers:
        w.start()
    for i, (name, w) in enumerate(zip(args.backend_names, workers, strict=False)):
        w.join()
        if i in errors:
            for other in workers:
                other.join()
            real = [e for _, e in sorted(errors.items()) if not isinstance(e, threading.BrokenBarrierError)]
            raise (real or [errors[i]])[0]
        backend = BACKENDS[name]
        print(table(f"{backend.label} ({backend.program})", results[i], args.rtt_ms))
        sys.stdout.flush()
    print(f"\ntotal run {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

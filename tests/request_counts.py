"""How tests/test_request_counts.py measures the headline costs: requests and rounds, counted, never timed.

A ``Place`` is one backend as the guards see it: three stores (the
conversations, a full job index, a full folder of files), each reached
straight (for filling) and through a ``FaultProxy`` in front of the emulator
(what a measured process is given), so that every request a driver or a
runner sends is counted outside it.  A local folder has no wire to put a
proxy on: there the drivers' own counts are read, their metrics snapshots
(``LNK_METRICS_DIR``: every request, the work left for after a reply
included) and their logs (an op's requests up to its reply); no rounds.

What a figure counts:

* **requests**: everything the op made the store do, the work a driver
  leaves for after its reply included (packing); the store gate's requests
  (the format record, the server probe: once a process, test_format_gate_cost.py)
  left out, as every cost test leaves them out.
* **rounds**: how many requests deep the op was before its reply
  (``rounds_of``), with each request held ``HOLD`` (a read's ``READ_HOLD``)
  at the proxy so that requests sent together are seen together: the
  design's rounds, not the machine's thread scheduling.  The hold is no
  timing: nothing is asserted of a time.

Filling (10,000 index entries, 8,192 file objects a backend; less on
fake-gcs-server: ``SIZES``) is what costs: it runs in a process of its own
per backend, straight at the emulator, with the helpers the other cost tests
fill with (``test_file_list_cost.fill``, ``test_due_backlog._plant``), all
backends at once, while the measuring goes on.  ``python
tests/request_counts.py fill SPEC`` is that process.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # the fill process: the tests' helpers are imported by name, as pytest does
    sys.path.insert(0, str(HERE))

from faults.http_proxy import FaultProxy, Rule, Seen  # noqa: E402
from faults.rounds import gate_kind, rounds_of  # noqa: E402
from scheduler.scheduler_rig import AGENTS, Backend, Rig, RunnerProc  # noqa: E402
from support import StoreUnderTest, location_of, service_of, wait_for  # noqa: E402
from test_file_list_cost import LISTING as FILE_LISTING  # noqa: E402

from cloudstore.generations import AlreadyExists, Create, PutMode, RetryingStore  # noqa: E402
from cloudstore.protocol.client import ServeProcess  # noqa: E402
from cloudstore.store.keys import due_root  # noqa: E402

#: Seconds each request is held at the proxy while rounds are counted: far longer than the gap between
#: requests a process sends together, so they overlap at the proxy whatever the machine's load.
HOLD = 0.2
#: The same for a read, which sends up to 13 requests at once once its listing is in: each is made ready
#: in turn under the interpreter's lock, and on a starved 2-core machine the last of a read on
#: fake-gcs-server left over 0.1 s after the first (one was then seen after an answer, a round too many).
READ_HOLD = 0.5
#: The folder that ``LNK_TEST_WORSE`` variants live in (tests/worse/sitecustomize.py).
WORSE = HERE / "worse"

#: The setting that names the emulator, per backend reached over HTTP (the proxy takes its place there).
ENDPOINT = {"moto": "AWS_ENDPOINT_URL_S3", "seaweedfs": "AWS_ENDPOINT_URL_S3", "gcs": "STORAGE_EMULATOR_HOST"}
KIND = {"file": "file", "moto": "s3", "seaweedfs": "s3", "gcs": "gcs"}
#: A listing's page, as the proxy sees its target (test_file_list_cost.py), by kind of server.
LISTING = {"s3": FILE_LISTING["moto"], "gcs": FILE_LISTING["gcs"]}

#: What the guards read and write, in stores of their own on each backend.
WRITER = {"id": "writer", "owner": "o"}
FILES_AGENT = {"id": "files", "owner": "o"}
WARM = {"op": "threads", "agent": {"id": "warm-up", "owner": None}}  # an op no figure is: it takes the gate's round
REAL_JOBS = 4  # of an index's entries: put by the driver, due first; the rest planted straight into the index
FIRST_DUE = 2_000_000_000
FOLDER = "skills"


@dataclass(frozen=True)
class Sizes:
    """How full a backend's index and folder are filled."""

    index: int = 10_000  # waiting jobs in the shared index
    files: int = 4096  # live files in the folder (the contract's FILES_MAX), and as many tombstones beside them


#: fake-gcs-server answers a listing of any length in one page, so there no figure changes with these sizes;
#: and each write into a bucket takes time in proportion to the objects already in it (10,000 entries took
#: 50 s of its CPU, 1,000 half a second), so there they are a tenth and an eighth.  Everywhere else: in full.
SIZES = {"gcs": Sizes(index=1000, files=512)}


@dataclass(frozen=True)
class Cost:
    """What one figure cost: requests (a mean where the figure is one) and rounds (None: not a figure of
    rounds, or not counted: the folder)."""

    requests: float
    rounds: float | None


@dataclass(frozen=True)
class Reached:
    """One store: straight at the emulator (for filling), and as a measured process reaches it."""

    direct: StoreUnderTest
    through: StoreUnderTest


@dataclass
class Place:
    """One backend under count: its stores, the proxy in front of its emulator (None on the folder), a scratch
    folder for the measured processes' logs."""

    backend: str
    conversations: Reached
    index: Reached
    files: Reached
    proxy: FaultProxy | None
    scratch: Path
    filling: subprocess.Popen[bytes] | None = None  # the fill of ``index`` and ``files`` (``start_fill``)

    @property
    def sizes(self) -> Sizes:
        return SIZES.get(self.backend, Sizes())

    @property
    def kind(self) -> str:
        """"s3", "gcs" or "file": what a bound is kept per."""
        return KIND[self.backend]

    def seen(self) -> list[Seen]:
        """The requests the proxy saw since it was last cleared, the store gate's left out, in order sent."""
        assert self.proxy is not None
        return sorted((s for s in self.proxy.requests() if gate_kind(s) is None), key=lambda s: s.at)

    @contextmanager
    def held(self, seconds: float = HOLD) -> Iterator[None]:
        """Every request held ``seconds`` at the proxy inside (rounds are counted): see the module docstring."""
        if self.proxy is None:
            yield
            return
        self.proxy.latency = seconds
        try:
            yield
        finally:
            self.proxy.latency = 0.0

    def clear(self) -> None:
        if self.proxy is not None:
            self.proxy.clear()


def worse_env(variant: str | None) -> dict[str, str]:
    """The environment that makes a process (and the processes it starts) run ``variant`` of tests/worse."""
    if variant is None:
        return {}
    path = os.pathsep.join(p for p in (str(WORSE), os.environ.get("PYTHONPATH", "")) if p)
    return {"LNK_TEST_WORSE": variant, "PYTHONPATH": path}


# --------------------------------------------------------------------------
# A driver process, counted


class Driver:
    """One ``serve`` process of a store's driver, warmed (its gate's round taken by ``WARM``), counted."""

    def __init__(self, place: Place, store: Reached, worse: str | None = None) -> None:
        self.place = place
        self.folder = Path(place.scratch) / f"driver-{time.monotonic_ns()}"
        self.folder.mkdir()
        self.log = self.folder / "stderr"
        env = {**store.through.env, "LNK_STORE_LOG": "debug", **worse_env(variant=worse)}
        if place.proxy is None:
            env["LNK_METRICS_DIR"] = str(self.folder)
        with open(self.log, "wb") as err:
            self.proc = ServeProcess(store.through.program, env=env, stderr=err)
        self.ask(WARM)
        place.clear()

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = self.proc.request(request, timeout=120)
        self.replied = time.monotonic()  # the proxy's clock: requests answered since came after the reply
        assert isinstance(reply, dict) and reply.get("reply") not in ("error", "taken"), (request.get("op"), reply)
        return reply

    def close(self) -> None:
        """End stdin and wait: once it has exited, whatever it left for after a reply has been done."""
        code = self.proc.close(timeout=120)
        assert code == 0, f"the driver exited {code}: {self.log.read_text()[-2000:]}"

    def logged(self, op: str) -> list[int]:
        """The requests the driver's log counts for each ``op`` it answered (up to its reply), in order."""
        text = self.log.read_text(errors="replace")
        return [int(n) for n in re.findall(rf"op={re.escape(op)} reply=\S+ requests=(\d+)", text)]

    def snapshot(self, op: str) -> int:
        """Every request the driver counted under ``op`` (the folder only)."""
        return requests_by_op(self.folder).get(op, 0)

    def after_listing(self) -> int | None:
        """How many of the requests were sent once its one listing was answered: those that waited for it
        (None on the folder, which has no wire to tell)."""
        if self.place.proxy is None:
            return None
        seen = self.place.seen()
        listings = [s for s in seen if re.search(LISTING[self.place.kind], s.target)]
        assert len(listings) == 1, listings
        return sum(1 for s in seen if s.at >= listings[0].answered)

    def cost(self, op: str) -> Cost:
        """What the ``op`` asked last cost, the process closed since: every request it made, and how many deep
        those answered before its reply were (what it left for after the reply ran after, each request
        held ``HOLD``: answered past the moment the reply was read)."""
        if self.place.proxy is None:
            return Cost(self.snapshot(op), None)
        seen = self.place.seen()
        return Cost(len(seen), rounds_of([s for s in seen if s.answered <= self.replied]))


def requests_by_op(folder: Path) -> dict[str, int]:
    """Every request the drivers that write their metrics snapshots in ``folder`` (``LNK_METRICS_DIR``) have
    counted, by op: the work each leaves for after a reply is counted under the op that left it, and a
    snapshot is written after each reply, whole (written aside, then renamed)."""
    by_op: dict[str, int] = {}
    for snapshot in folder.glob("*.json"):
        family = json.loads(snapshot.read_text())["families"].get("lnk_store_requests_total", {"samples": []})
        for labels, n in family["samples"]:
            by_op[labels["op"]] = by_op.get(labels["op"], 0) + int(n)
    return by_op


#: Seconds a listing is held beyond ``HOLD`` when what waits for it is counted (``fresh``'s ``slow_listing``):
#: long beside the moment between a request's answer and what its thread sends next.
SLOW_LISTING = 0.5


def fresh(place: Place, store: Reached, request: dict[str, Any], worse: str | None = None,
          slow_listing: bool = False, hold: float = HOLD) -> tuple[dict[str, Any], Driver]:
    """``request`` as the first of a fresh process (warmed on another agent): its reply, and the process
    (closed: ``cost``, ``after_listing``).  ``slow_listing``: every listing held ``SLOW_LISTING`` longer
    than the other requests, as on a big bucket, where the listing is the slower request (its rounds are
    then not the op's: requests sent together with the listing's answer may be seen after another's)."""
    driver = Driver(place, store, worse)
    if slow_listing and place.proxy is not None:
        place.proxy.add(Rule("delay", "GET", LISTING[place.kind], times=10**6, before=SLOW_LISTING))
    try:
        with place.held(hold):
            reply = driver.ask(request)
    finally:
        driver.close()
    return reply, driver


# --------------------------------------------------------------------------
# Appends


#: The conversations the appends write (and the reads then read): (thread, events).
CONVERSATIONS = (("all", 1000), ("tail", 1000), ("more", 48))
STEADY = (2, 3, 4)  # appends of "all" each counted alone: memory trusted, no block ends there


def append(thread: str, seq: int) -> dict[str, Any]:
    return {"op": "append", "agent": WRITER, "thread": thread, "event": {"seq": seq, "text": f"{thread}-{seq}"}}


def appends(place: Place, worse: str | None = None, prefix: str = "",
            conversations: tuple[tuple[str, int], ...] = CONVERSATIONS) -> tuple[Cost, Cost]:
    """Every append of ``conversations`` (2,048) by one serve process: (the costliest steady append alone,
    the mean over all of them, packing included).  ``prefix`` names the threads apart (a variant's run)."""
    driver = Driver(place, place.conversations, worse)
    steady: list[Cost] = []
    try:
        for thread, events in conversations:
            for seq in range(1, events + 1):
                if thread == "all" and seq in STEADY and place.proxy is not None:
                    before = len(place.seen())
                    with place.held():
                        driver.ask(append(prefix + thread, seq))
                    alone = place.seen()[before:]
                    steady.append(Cost(len(alone), rounds_of(alone)))
                else:
                    driver.ask(append(prefix + thread, seq))
    finally:
        driver.close()
    total = sum(events for _, events in conversations)
    if place.proxy is None:
        logged = driver.logged("append")
        one = Cost(max(logged[seq - 1] for seq in STEADY), None)
        return one, Cost(driver.snapshot("append") / total, None)
    one = Cost(max(c.requests for c in steady), max(c.rounds or 0 for c in steady))
    return one, Cost(len(place.seen()) / total, None)


# --------------------------------------------------------------------------
# The scheduler


def is_due_listing(place: Place, seen: Seen) -> bool:
    """A listing of the shared job index (a runner's poll: ``job_due``); its prefix is in the query,
    percent-encoded (twice over, in a GCS one)."""
    listing = seen.method == "GET" and re.search(LISTING[place.kind], seen.target) is not None
    return listing and due_root("").rstrip("/") in unquote(unquote(seen.target))


def scheduler(place: Place, worse: str | None = None, polls: int = 10, idle: bool = True,
              fired: bool = True) -> tuple[Cost | None, Cost | None]:
    """One runner serving two agents of the conversations' store, nothing due: (requests and rounds per idle
    poll, over ``polls`` polls; then one job, from claim to finish with ``/bin/true``).

    A poll is one listing of the due index (``job_due``); the claim listing and the recovery step come once
    a lapse/3, and the lapse here (600 s) keeps them out of what is counted: they are not a poll's.  The job
    is put straight at the store (uncounted) by a driver that nudges nobody, so the runner finds it by a
    poll; the polls seen while it fires are left out of its cost.  It is fired twice, the first time
    uncounted: a driver process reads the agent's old single mark once (``job_mark.OldMarks``), with the
    first job it claims for it.  The runner is stopped (its drivers closed: what they leave for after a
    reply is done) before the second's requests are counted.  On the folder its drivers' metrics
    snapshots count (``requests_by_op``), the gate's round falling on their warm-up (``job_mark``)."""
    root = Path(place.scratch) / f"runner-{time.monotonic_ns()}"
    (root / "metrics").mkdir(parents=True)
    store = place.conversations
    driver_env = {**store.through.env, "LNK_STORE_LOG": "debug",
                  **({"LNK_METRICS_DIR": str(root / "metrics")} if place.proxy is None else {})}
    putter = ServeProcess(store.direct.program, env={**store.direct.env, "LNK_WAKE_DIR": str(root / "nobody")})
    rig = Rig(Backend(place.backend, store.through.program, driver_env, 1.0), root, putter)
    try:
        runner = rig.start_runner(env={"LNK_WAKE_DIR": str(root / "wake"), **worse_env(worse)},
                                  fire=["/bin/true"], poll_interval=0.1, lapse=600, workers=1)
        rig.wait_started(120)
        tally = Tally(place, root / "metrics")
        per_poll = tally.idle(polls) if idle else None
        if not fired:
            return per_poll, None
        fire(rig, runner)  # uncounted: what a driver process pays once an agent (the old mark's read)
        base = tally.start()
        with place.held():
            fire(rig, runner)
            rig.stop_all()
        return per_poll, tally.job(base)
    finally:
        rig.stop_all(hurry=True)
        for stopped in rig.runners:
            if stopped.proc.stdout is not None:
                stopped.proc.stdout.close()
        putter.close()


#: Seconds after its put a job falls due: a put writes the index entry before the record, and a poll between
#: the two finds a job it cannot claim yet (left alone for ``runner.GONE_FOR``); due a moment later, the job is
#: claimed when it falls due, its record long written.
DUE_IN = 1.0


def fire(rig: Rig, runner: RunnerProc) -> None:
    """Put job ``fired`` of the first agent, due in ``DUE_IN``, and wait until it has fired and its finish has
    answered.

    The same id each time: a runner's driver processes each take the requests of the jobs whose ids
    hash to them (``PooledServeClient``), so the second fire meets the process the first one did.  The
    finish is known answered by its driver's log line (``LNK_STORE_LOG=debug``): its last request (the
    lease ended) is then in."""
    fired, finished = len(runner.events("fired")), finishes(runner)
    rig.put(AGENTS[0], "fired", time.time() + DUE_IN)
    wait_for(lambda: len(runner.events("fired")) > fired, 60, "the job to fire")
    wait_for(lambda: finishes(runner) > finished, 60, "the job's finish")


def finishes(runner: RunnerProc) -> int:
    """The ``job_finish`` requests the runner's drivers have answered, by their log lines."""
    return len(re.findall(r"op=job_finish reply=", runner.log.read_text(errors="replace")))


@dataclass(frozen=True)
class Tally:
    """A runner's requests as counted: at the proxy, or on the folder by its drivers' snapshots in ``metrics``."""

    place: Place
    metrics: Path

    def now(self) -> tuple[int, int]:
        """(every request counted, those that listed the due index): since the proxy was cleared, or since
        the drivers started."""
        if self.place.proxy is None:
            by_op = requests_by_op(self.metrics)
            return sum(by_op.values()), by_op.get("job_due", 0)
        seen = self.place.seen()
        return len(seen), sum(is_due_listing(self.place, s) for s in seen)

    def start(self) -> tuple[int, int]:
        """A window starts: the proxy cleared; what is counted so far."""
        self.place.clear()
        return self.now()

    def idle(self, polls: int) -> Cost:
        """Requests and rounds per poll of an idle runner, over ``polls`` polls after those of its start-up."""
        wait_for(lambda: self.now()[1] >= 3, 60, "the runner's first polls")
        base = self.start()
        wait_for(lambda: self.now()[1] - base[1] >= polls, 60, f"{polls} polls")
        if self.place.proxy is None:
            total, listed = self.now()
            return Cost((total - base[0]) / (listed - base[1]), None)
        seen = self.place.seen()
        count = sum(is_due_listing(self.place, s) for s in seen)
        return Cost(len(seen) / count, rounds_of(seen) / count)

    def job(self, base: tuple[int, int]) -> Cost:
        """What was counted since ``base`` but the polls."""
        if self.place.proxy is None:
            total, listed = self.now()
            return Cost((total - base[0]) - (listed - base[1]), None)
        job = [s for s in self.place.seen() if not is_due_listing(self.place, s)]
        return Cost(len(job), rounds_of(job))


# --------------------------------------------------------------------------
# Filling, in a process of its own per backend


def fill_spec(place: Place) -> dict[str, Any]:
    """What the fill process needs: the stores straight at the emulator, and how full to fill them."""
    return {"index": asdict(place.index.direct), "files": asdict(place.files.direct), "sizes": asdict(place.sizes)}


def start_fill(place: Place) -> subprocess.Popen[bytes]:
    """Fill ``place``'s index and folder in a process of its own (its own environment: the SDK clients read
    the emulator's address from it), at once with everything else."""
    log = open(Path(place.scratch) / "fill.log", "wb")  # noqa: SIM115  # the child holds it
    try:
        return subprocess.Popen([sys.executable, __file__, "fill", json.dumps(fill_spec(place))],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def files_of(kind: str, count: int) -> list[str]:
    """The folder's live files (``kind`` "live") or tombstones ("gone"), as test_file_list_cost names them."""
    return [f"{FOLDER}/{kind}/{i:05d}.md" for i in range(count)]


class QuickS3:
    """The one call a fill makes of an S3 server, ``put``, over plain ``http.client`` with boto3's own SigV4
    signer: a third of boto3's client CPU a request (measured 0.5 ms against 1.5), which over the 36,000
    writes moto and SeaweedFS are filled with is half a minute.  The seam above it is the drivers' own
    (``RetryingStore``: the frame, the lineage), so the bytes stored are the ones a driver would store."""

    label = "s3"

    def __init__(self, env: dict[str, str], bucket: str) -> None:
        from botocore.auth import S3SigV4Auth
        from botocore.credentials import Credentials

        self.endpoint = env["AWS_ENDPOINT_URL_S3"].rstrip("/")
        self.bucket = bucket
        self.signer = S3SigV4Auth(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]), "s3",
                                  env.get("AWS_DEFAULT_REGION", "us-east-1"))
        self.connections = threading.local()  # one kept-alive connection per filling thread

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        from botocore.awsrequest import AWSRequest

        path = f"/{self.bucket}/{quote(key, safe='/~')}"
        request = AWSRequest("PUT", self.endpoint + path, data=raw,
                             headers={"If-None-Match": "*"} if isinstance(mode, Create) else {})
        self.signer.add_auth(request)
        connection = getattr(self.connections, "one", None)
        if connection is None:
            parts = urlsplit(self.endpoint)
            connection = self.connections.one = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        connection.request("PUT", path, body=raw, headers=dict(request.headers.items()))
        reply = connection.getresponse()
        reply.read()
        if reply.status == 412:
            raise AlreadyExists(key)
        assert reply.status == 200, (reply.status, key)
        return str(reply.getheader("ETag"))


def quick_store(store: StoreUnderTest) -> RetryingStore | None:
    """On an S3 server, the seam over ``QuickS3``, for a fill's bulk; elsewhere None (the drivers' own)."""
    if KIND[store.backend] != "s3":
        return None
    return RetryingStore(QuickS3(store.env, location_of(store).bucket))


def _fill_index(store: StoreUnderTest, size: int) -> None:
    """``size`` waiting jobs: ``REAL_JOBS`` put by the driver's own op, due first, the rest planted
    straight into the shared index as test_due_backlog plants a backlog (entries whose records nobody reads:
    ``job_next`` reads the first entry's record only)."""
    from test_due_backlog import _plant

    from cloudstore.protocol.service import Service

    service = service_of(store)
    for i in range(REAL_JOBS):
        job = {"id": f"job-{i}", "spec": {"i": i}, "due": FIRST_DUE + i}
        reply = service.answer({"op": "job_put", "agent": {"id": f"jobs-{i}", "owner": "o"}, "place": "waiting",
                                "job": job})
        assert reply == {"reply": "done"}, reply
    bulk = Service(replace(service.space, store=quick_store(store) or service.space.store))
    _plant(bulk, [float(FIRST_DUE + REAL_JOBS + i) for i in range(size - REAL_JOBS)])


def _fill_files(store: StoreUnderTest, count: int) -> None:
    from test_file_list_cost import Counted as FileCounted
    from test_file_list_cost import fill

    from cloudstore.protocol.validate import Agent

    fill(FileCounted(store.backend, store, store, None), Agent(**FILES_AGENT), files_of("live", count),
         files_of("gone", count), quick_store(store))


def _fill(spec: dict[str, Any]) -> None:
    index, files, sizes = StoreUnderTest(**spec["index"]), StoreUnderTest(**spec["files"]), Sizes(**spec["sizes"])
    os.environ.update(index.env)  # one emulator: both stores' settings differ only in the URL
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(_fill_index, index, sizes.index), pool.submit(_fill_files, files, sizes.files)]:
            done.result()


def store_of(reached: StoreUnderTest, proxy: FaultProxy | None) -> Reached:
    """A store straight, and through ``proxy`` (the folder: the same both ways)."""
    return Reached(reached, reached if proxy is None else replace(reached, env=proxy.redirect(reached.env)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["fill"] and len(sys.argv) == 3:
        _fill(json.loads(sys.argv[2]))
    else:
        sys.exit(f"usage: {sys.argv[0]} fill SPEC")

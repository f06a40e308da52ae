"""The rig of ``test_crash_points.py``: kill a driver before each of its store requests in turn.

A driver started with ``LNK_STORE_FAILPOINT=N`` kills itself (SIGKILL) just
before its Nth store request, counted from its start.  For one op, a *kill
point* N is:

1. a fresh agent, in the test's location, or, for an op whose reading asks
   ``job_next`` (which answers for the whole store), in a location of the
   point's own (a new prefix of the test's bucket, or a new folder);
2. the state before the op, made by a normal ``serve`` process (``CrashOp.setup``);
3. a NEW serve process with the failpoint at N, sent exactly the op, no
   warm-up request: it dies (no reply, exit -9) or answers;
4. a fresh normal ``serve`` process, started for this point alone (so it
   remembers nothing of the agent), reading what the next ops read
   (``CrashOp.check`` through a ``Probe``, which keeps every read for the
   report).

``sweep`` runs N = 1, 2, 3, ... a few at a time and stops once a point
answers (the op needed fewer than N requests); the points that died are the
kill points exercised.  Nothing waits on time: a point is done when its
processes are."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from support import Session, fresh_agent, serving

from cloudstore.generations import FAILPOINT
from cloudstore.protocol.client import DriverError, ServeProcess

Json = Any

#: Kill points run at once: more than the 2 cores, since each point waits on the store part of its time.
WORKERS = int(os.environ.get("LNK_CRASH_WORKERS", "4"))
#: No op of the drivers comes near this many requests; past it the rig gives up.
LIMIT = 400
#: Seconds a driver may take to answer one request before the rig calls it hung.
REPLY_WITHIN = 120


class RigError(Exception):
    """The rig could not run a point (a setup step failed, a driver exited oddly)."""


def point_store(store: Any, label: str) -> Any:
    """A location of one kill point's own, below the test's store (a ``support.StoreUnderTest``)."""
    setting = "LNK_GCS_URL" if store.backend == "gcs" else "LNK_BUCKET_URL"
    url = f"{store.url.rstrip('/')}/{re.sub(r'[^a-z0-9-]+', '-', label.lower())}-{uuid.uuid4().hex[:8]}"
    if store.backend == "file":
        os.makedirs(url[len("file://"):])  # the drivers refuse a folder that does not exist
    return replace(store, env={**store.env, setting: url}, url=url)


# --------------------------------------------------------------------------
# What a fresh process reads, and the promises it finds broken


def brief(value: Json, width: int = 240) -> str:
    """A value for a report: a run of events as ``events 1..64``, long text cut."""
    if isinstance(value, list) and value and all(isinstance(e, dict) and "seq" in e for e in value):
        seqs = [e["seq"] for e in value]
        if seqs == list(range(seqs[0], seqs[0] + len(seqs))):
            return f"events {seqs[0]}..{seqs[-1]}" if len(seqs) > 1 else f"event {seqs[0]}"
        return f"events {seqs}"
    if isinstance(value, dict) and isinstance(value.get("events"), list):
        return "{" + f"reply: events, {brief(value['events'])}" + "}"
    if isinstance(value, (list, tuple)) and value and any(isinstance(v, (list, dict)) for v in value):
        return "(" + ", ".join(brief(v, width) for v in value) + ")"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= width else text[: width - 3] + "..."


class ProbeStop(Exception):
    """A read answered an error: what the state is cannot be judged further."""


class Probe:
    """A fresh process's session that keeps what it read and the promises found broken."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.reads: list[str] = []
        self.violations: list[str] = []

    def __call__(self, op: str, **args: Json) -> Json:
        reply = self.session(op, **args)
        shown = ", ".join(f"{k}={brief(v, 40)}" for k, v in args.items())
        self.reads.append(f"{op}({shown}) -> {brief(reply)}")
        if reply.get("reply") == "error":
            self.violations.append(f"{op} answered an error: {reply.get('error')}")
            raise ProbeStop
        return reply

    def send(self, request: dict) -> Json:
        """A request given whole, ``op`` included (the op under test, sent again)."""
        return self(request["op"], **{k: v for k, v in request.items() if k != "op"})

    def require(self, ok: bool, why: str) -> bool:
        if not ok:
            self.violations.append(why)
        return ok

    def whole(self, what: str, got: Json, before: Json, after: Json, reply: Json | None) -> bool:
        """``got`` is the op's whole effect (``after``) or none of it (``before``); after a reply, the whole.

        True when the effect is there.
        """
        if reply is not None:
            self.require(got == after, f"{what}: the op answered {brief(reply)}, yet a fresh process read "
                                       f"{brief(got)}, not its effect {brief(after)}")
        else:
            self.require(
                got in (before, after),
                f"{what}: a fresh process read {brief(got)}: neither the state "
                f"before the op ({brief(before)}) nor its whole effect ({brief(after)})",
            )
        return got == after


# --------------------------------------------------------------------------
# One op, one point, all points


@dataclass(frozen=True)
class CrashOp:
    """An op to crash: the state before it, the request, and the reading after.

    ``setup`` makes the state with a normal process and returns what the
    check must know of it (read before the op); ``check(probe, before,
    reply)`` reads with a fresh process, ``reply`` being None when the
    driver was killed.  ``own_store``: each point needs a location of its
    own (an op whose reading asks ``job_next``, which answers for the whole
    store); otherwise points share the test's location, each with its own
    agent, and their states are made by serve processes kept for the sweep.
    """

    name: str
    setup: Callable[[Session], Any]
    request: dict
    check: Callable[[Probe, Any, Json | None], None]
    own_store: bool = False


@dataclass
class Point:
    n: int
    reply: Json | None  # None: killed before its Nth request
    killed_after_reply: bool = False  # answered, then died at N in the work a reply leaves for after it (packing)
    violations: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)


def strike(where: Any, request: dict, n: int) -> tuple[Json | None, bool]:
    """Send ``request`` to a new driver that dies before its ``n``th store request.

    Its reply (None if it died first), and whether it died after replying:
    a driver packs after its reply, so a kill point may fall past the reply.
    """
    with tempfile.TemporaryFile() as err:
        proc = ServeProcess(where.program, env={**where.env, FAILPOINT: str(n)}, stderr=err)
        try:
            reply = proc.request(request, timeout=REPLY_WITHIN)
        except DriverError as exc:
            code = proc.close(REPLY_WITHIN)
            if code == -signal.SIGKILL:
                return None, False
            err.seek(0)
            tail = err.read().decode("utf-8", "replace")[-2000:]
            raise RigError(f"the driver with {FAILPOINT}={n} gave no reply ({exc}) and exited {code}, "
                           f"not killed; stderr: {tail}") from exc
        except BaseException:
            proc.kill()
            raise
        return reply, proc.close(REPLY_WITHIN) == -signal.SIGKILL


class SetupProcesses:
    """Normal serve processes on one location that make states before the op: one per worker thread."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.mine = threading.local()
        self.all: list[ServeProcess] = []
        self.lock = threading.Lock()

    def session(self, agent: dict) -> Session:
        proc = getattr(self.mine, "proc", None)
        if proc is None:
            proc = self.mine.proc = ServeProcess(self.store.program, env=self.store.env)
            with self.lock:
                self.all.append(proc)
        return Session(proc, agent)

    def close(self) -> None:
        for proc in self.all:
            proc.close()


def run_point(store: Any, op: CrashOp, n: int, setups: SetupProcesses) -> Point:
    """Kill point ``n`` of ``op``: the state before it, the op in a driver dying at ``n``, a fresh reading."""
    agent = fresh_agent()
    if op.own_store:
        where = point_store(store, f"{op.name}-{n}")
        with serving(where) as procs:
            before = op.setup(Session(procs[0], agent))
    else:
        where = store
        before = op.setup(setups.session(agent))
    reply, killed_after_reply = strike(where, {**op.request, "agent": agent}, n)
    with serving(where) as procs:
        probe = Probe(Session(procs[0], agent))
        try:
            op.check(probe, before, reply)
        except ProbeStop:
            pass
    return Point(n, reply, killed_after_reply, probe.violations, probe.reads)


def sweep(run: Callable[[int], Point], workers: int = WORKERS, limit: int = LIMIT) -> list[Point]:
    """``run(N)`` for N = 1, 2, ..., ``workers`` at a time, until one answers; every point run, by N."""
    done: list[Point] = []
    answered: int | None = None
    with ThreadPoolExecutor(workers) as pool:
        pending: set[Future] = set()
        n = 0
        while True:
            while answered is None and len(pending) < workers and n < limit:
                n += 1
                pending.add(pool.submit(run, n))
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                point = future.result()
                done.append(point)
                done_whole = point.reply is not None and not point.killed_after_reply
                if done_whole and (answered is None or point.n < answered):
                    answered = point.n
    if answered is None:
        raise RigError(f"the op never answered within {limit} requests")
    return sorted(done, key=lambda p: p.n)


# --------------------------------------------------------------------------
# Reports


@dataclass
class OpReport:
    backend: str
    op: str
    points: list[Point]
    seconds: float

    @property
    def killed(self) -> list[Point]:
        """Every point that died: before its reply, or after it in the work left for after (packing)."""
        return [p for p in self.points if p.reply is None or p.killed_after_reply]

    @property
    def answered_at(self) -> int:
        """The first N at which the op ran whole, reply and all that followed it."""
        return min(p.n for p in self.points if p.reply is not None and not p.killed_after_reply)

    @property
    def broken(self) -> list[Point]:
        return [p for p in self.points if p.violations]

    def line(self) -> str:
        odd = [p.n for p in self.killed if p.n > self.answered_at]
        note = f"; died past the answer at N={odd} (request count varies)" if odd else ""
        return (f"[{self.backend}] {self.op}: {len(self.killed)} kill points, answered at N={self.answered_at}, "
                f"{len(self.broken)} broken, {self.seconds:.1f} s{note}")

    def describe(self) -> str:
        out = [self.line()]
        for p in self.broken:
            how = "killed" if p.reply is None else f"answered {brief(p.reply)}" + (
                ", then killed" if p.killed_after_reply else "")
            out.append(f"  N={p.n} ({how}):")
            out += [f"    BROKEN: {v}" for v in p.violations]
            out += [f"      read: {r}" for r in p.reads]
        return "\n".join(out)


def sweep_op(store: Any, op: CrashOp) -> OpReport:
    start = time.monotonic()
    setups = SetupProcesses(store)
    try:
        points = sweep(lambda n: run_point(store, op, n, setups))
    finally:
        setups.close()
    return OpReport(store.backend, op.name, points, time.monotonic() - start)


class Tally:
    """Kill points, broken points and wall time per backend, over a module's tests."""

    def __init__(self, backends: tuple[str, ...]) -> None:
        self.backends = backends
        self.reports: list[OpReport] = []

    def add(self, report: OpReport) -> None:
        self.reports.append(report)

    def _sum(self, backend: str, of: Callable[[OpReport], float]) -> float:
        return sum(of(r) for r in self.reports if r.backend == backend)

    def lines(self) -> list[str]:
        seen = [b for b in self.backends if any(r.backend == b for r in self.reports)]
        points = ", ".join(f"{b} {int(self._sum(b, lambda r: len(r.killed)))}" for b in seen)
        broken = sum(len(r.broken) for r in self.reports)
        wall = ", ".join(f"{b} {self._sum(b, lambda r: r.seconds):.1f} s" for b in seen)
        failing = sorted({f"{r.op} [{r.backend}]" for r in self.reports if r.broken})
        out = [f"crash points: {points}; violations {broken}", f"crash points wall time: {wall}"]
        if failing:
            out.append("crash points broken in: " + ", ".join(failing))
        return out

"""Family ``faults``: the promises under the faults a cloud really has (``lnk-store-check --faults``).

Every check runs its own ``serve`` processes through the suite's proxy
(``faults.World``), sets faults on the k-th request of one op, and judges
the reply (``judge``) and then what reading back shows, with no fault set:

* ``lost_reply``: the store applies a write and its reply is lost, for
  every write of every op in turn; the driver's retry must know its own
  write (no ``taken``, ``stale``, ``held``, ``lost``, ``found: false``).
* ``transient``: a 5xx, a throttle (429 / ``SlowDown``, the services' own
  bodies) or a reset, on a seeded request of each op; an error reply
  without ``outcome unknown`` must have changed nothing.
* ``cut_body``: a reply's body cut short on a seeded read: the answer is
  exact or an error, never a wrong one.
* ``late_landing``: a write is held past the client's giving up (its
  connection reset), the driver's retry and the next op succeed, and then
  the held request lands: no acknowledged write may be lost by it.
* ``own_write_replaced``: a write lands, its reply is lost, and its retry
  is held while another process writes over it: the retry must still
  know the write was its own.
* ``racers_linearizable``: three processes racing ``last`` and ``append``
  under lost replies, a 5xx or a reset, every op recorded with its start
  and end: one order of them all must explain every reply (the
  simulation's linearizability search, ``linear``).
* ``store_time``: every reply's ``Date`` a day ahead (the store's clock is
  not the machine's), and one reply an hour off: leases are written and
  judged in the store's time, and one wrong reply lapses nothing.
* ``server_ignores_preconditions``: every request reaches the store without
  its preconditions (a server that ignores them); processes started there
  answer every write an error (never their success: nothing can be settled),
  two racers of one seq are never both ``done``, and nothing was changed.

Which request of an op fails and how is drawn from the run's seed; a
failure prints the seed, the fault schedule and the history that broke.
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial

from ..protocol.client import DriverError
from .expect import Json, is_error
from .faults import Fault, World
from .harness import CheckSet, Ctx
from .judge import DONE, NOT_DONE, UNKNOWN, History, compact, fail, fate, judge_own
from .linear import linearizable
from .program import Driver
from .racing import at_once
from .transport import ServeTransport

checks = CheckSet("faults")

FAR = 10**9  # a due far in the past or future does not matter here: a fixed one
LAPSE = 600_000  # a lease no one lets lapse during a check


@dataclass
class FaultCtx(Ctx):
    """A check's context under ``--faults``: the proxy's world and the history of what was sent."""

    world: World | None = None
    history: History = field(default_factory=lambda: History(0))


class Proc:
    """One ``serve`` process of the driver behind the proxy; every request recorded."""

    def __init__(self, ctx: FaultCtx, who: str) -> None:
        assert ctx.world is not None and ctx.driver is not None
        self.ctx, self.who = ctx, who
        self.transport = ServeTransport(Driver(ctx.driver.program, ctx.world.env))

    def ask(self, agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
        request = {"op": op, "agent": agent, **fields}
        world = self.ctx.world
        assert world is not None
        before = {id(f) for f in world.proxy.faults if f.fired is not None}
        try:
            reply = self.transport.request(request)
        except DriverError as exc:
            self.ctx.history.record(self.who, request, f"<no reply: {exc}>", "")
            fail(self.ctx.history, f"{op} under faults: the driver did not answer one reply line",
                 "<one JSON reply line>", str(exc)[:300])
            raise
        # The faults that fired while it was out (with racers: in any racer's request meanwhile).
        fired = "; ".join(f.describe() for f in world.proxy.faults if f.fired is not None and id(f) not in before)
        self.ctx.history.record(self.who, request, reply, fired)
        return reply

    def warm(self, agent: dict[str, Json]) -> None:
        for _ in range(2):  # its imports paid, and two replies seen (a store clock settles on two)
            self.ask(agent, "last", thread="lnk-store-check warm")

    def close(self) -> None:
        self.transport.close()


def world_of(ctx: Ctx) -> tuple[FaultCtx, World]:
    assert isinstance(ctx, FaultCtx) and ctx.world is not None, "a faults check run without --faults"
    return ctx, ctx.world


def token() -> str:
    return uuid.uuid4().hex[:10]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def armed(ctx: FaultCtx, *faults: Fault) -> list[Fault]:
    """Arm ``faults`` on the proxy, naming them in the schedule (the history's and the failure's)."""
    assert ctx.world is not None
    ctx.world.proxy.set(*faults)
    ctx.history.schedule.append(", ".join(f"{f.kind}{' ' + str(f.status) if f.kind in ('fail', 'throttle') else ''}"
                                          f" at {f.klass} #{f.nth}" for f in faults))
    return list(faults)


def disarm(ctx: FaultCtx, faults: list[Fault]) -> None:
    assert ctx.world is not None
    ctx.world.proxy.disarm()
    for f in faults:
        if f.fired is not None:
            ctx.history.fault(f.kind)


# -- the ops put under faults, each with what its own success is and how reading back judges it


@dataclass
class Case:
    """One op under a fault: set up, asked, its own success recognised, its effect read back."""

    name: str
    needs: str | None  # "jobs" / "files": only for a contract that keeps them
    setup: Callable[[Proc, dict[str, Json], dict[str, Json]], None]
    act: Callable[[Proc, dict[str, Json], dict[str, Json]], dict[str, Json]]
    good: Callable[[dict[str, Json], dict[str, Json]], bool]
    # Given the fate of the op (DONE / UNKNOWN / NOT_DONE), what reading back shows that is wrong, or "".
    verify: Callable[[Proc, dict[str, Json], dict[str, Json], str], str]


def _none(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["t"] = f"fz-{token()}"


def _read_events(p: Proc, a: dict[str, Json], thread: str) -> list[Json] | None:
    reply = p.ask(a, "read", thread=thread)
    events = reply.get("events")
    return events if isinstance(events, list) and not is_error(reply) else None


def _verify_append(p: Proc, a: dict[str, Json], st: dict[str, Json], told: str) -> str:
    events = _read_events(p, a, str(st["t"]))
    if events is None:
        return ""
    ev = st["event"]
    if told == DONE and events != [ev]:
        return f"the acknowledged event read back exactly once: expected [{ev}], got {events}"
    if told == UNKNOWN and events not in ([], [ev]):
        return f"at most the one event: got {events}"
    if told == NOT_DONE and events != []:
        return f"nothing written (the error said so): got {events}"
    return ""


def _act_append(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> dict[str, Json]:
    st["event"] = {"seq": 1, "by": token()}
    return p.ask(a, "append", thread=st["t"], event=st["event"])


def _holders(p: Proc, a: dict[str, Json], thread: str) -> list[Json] | None:
    reply = p.ask(a, "leases", lapse_ms=LAPSE)
    if is_error(reply):
        return None
    return [x.get("holder") for x in reply.get("leases", []) if isinstance(x, dict) and x.get("thread") == thread]


def _verify_lease(p: Proc, a: dict[str, Json], st: dict[str, Json], told: str) -> str:
    holders = _holders(p, a, str(st["t"]))
    if holders is None:
        return ""
    want = [st["h"]]
    if told == DONE and holders != want:
        return f"the lease held by {st['h']}: got holders {holders}"
    if told == NOT_DONE and holders != [] and not st.get("held_before"):
        return f"no lease (the error said nothing changed): got holders {holders}"
    return ""


def _setup_lease(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    _none(p, a, st)
    st["h"] = f"h-{token()}"


def _setup_take(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    _none(p, a, st)
    st["h"] = f"h-{token()}"
    p.ask(a, "take", thread=st["t"], holder=st["h"], lapse_ms=LAPSE)
    st["held_before"] = True


def _job(st: dict[str, Json]) -> dict[str, Json]:
    return {"id": str(st["j"]), "spec": {"by": st["spec"]}, "due": FAR}


def _setup_job(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["j"], st["spec"] = f"j-{token()}", token()


def _setup_put_job(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    _setup_job(p, a, st)
    p.ask(a, "job_put", place="waiting", job=_job(st))


def _get(p: Proc, a: dict[str, Json], place: str, job_id: str) -> tuple[bool, Json]:
    reply = p.ask(a, "job_get", place=place, id=job_id)
    return (not is_error(reply)), reply.get("job")


def _verify_places(p: Proc, a: dict[str, Json], st: dict[str, Json], done: list[str], undone: list[str],
                   told: str) -> str:
    """The job in exactly the places ``done`` (told DONE), ``undone`` (NOT_DONE) or one of them (UNKNOWN)."""
    seen = []
    for place in ("waiting", "firing"):
        ok, job = _get(p, a, place, str(st["j"]))
        if not ok:
            return ""
        if job is not None:
            if job != _job(st):
                return f"the job read back exactly in {place}: got {job}"
            seen.append(place)
    allowed = {DONE: [done], NOT_DONE: [undone], UNKNOWN: [done, undone]}[told]
    if seen not in allowed:
        return f"the job in {' or '.join(map(str, allowed))}: got it in {seen}"
    return ""


def _file(st: dict[str, Json], which: str = "data") -> str:
    return b64(str(st[which]).encode())


def _setup_file(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["path"], st["data"] = f"skills/fz-{token()}/SKILL.md", token()


def _setup_written(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> None:
    _setup_file(p, a, st)
    reply = p.ask(a, "file_write", path=st["path"], data=_file(st), version=0)
    st["v"], st["before"] = reply.get("version"), st["data"]
    st["data"] = token()


def _verify_file(p: Proc, a: dict[str, Json], st: dict[str, Json], told: str, gone: bool = False) -> str:
    reply = p.ask(a, "file_read", path=st["path"])
    if is_error(reply):
        return ""
    got = reply.get("file")
    data = got.get("data") if isinstance(got, dict) else None
    new = None if gone else _file(st)
    old = _file(st, "before") if "before" in st else None
    want = {DONE: [new], NOT_DONE: [old], UNKNOWN: [new, old]}[told]
    if data not in want:
        return f"the file's data read back: expected one of {want}, got {got}"
    if told == DONE and not gone and isinstance(got, dict) and got.get("version") != st.get("wrote"):
        return f"the version the write answered ({st.get('wrote')}): got {got}"
    return ""


def _act_write(p: Proc, a: dict[str, Json], st: dict[str, Json]) -> dict[str, Json]:
    reply = p.ask(a, "file_write", path=st["path"], data=_file(st), version=st.get("v", 0))
    st["wrote"] = reply.get("version")
    return reply


CASES = [
    Case("append", None, _none, _act_append, lambda r, st: r == {"reply": "done"}, _verify_append),
    Case("take", None, _setup_lease,
         lambda p, a, st: p.ask(a, "take", thread=st["t"], holder=st["h"], lapse_ms=LAPSE),
         lambda r, st: r == {"reply": "took", "took": "took"}, _verify_lease),
    Case("renew", None, _setup_take, lambda p, a, st: p.ask(a, "renew", thread=st["t"], holder=st["h"]),
         lambda r, st: r == {"reply": "done"}, _verify_lease),
    Case("job_put", "jobs", _setup_job, lambda p, a, st: p.ask(a, "job_put", place="waiting", job=_job(st)),
         lambda r, st: r == {"reply": "done"},
         lambda p, a, st, told: _verify_places(p, a, st, ["waiting"], [], told)),
    Case("job_shift", "jobs", _setup_put_job,
         lambda p, a, st: p.ask(a, "job_shift", id=st["j"], **{"from": "waiting", "to": "firing"}),
         lambda r, st: r == {"reply": "found", "found": True},
         lambda p, a, st, told: _verify_places(p, a, st, ["firing"], ["waiting"], told)),
    Case("job_remove", "jobs", _setup_put_job, lambda p, a, st: p.ask(a, "job_remove", place="waiting", id=st["j"]),
         lambda r, st: r == {"reply": "found", "found": True},
         lambda p, a, st, told: _verify_places(p, a, st, [], ["waiting"], told)),
    Case("file_write_new", "files", _setup_file, _act_write,
         lambda r, st: r.get("reply") == "wrote" and isinstance(r.get("version"), int), _verify_file),
    Case("file_write_over", "files", _setup_written, _act_write,
         lambda r, st: r.get("reply") == "wrote" and isinstance(r.get("version"), int), _verify_file),
    Case("file_remove", "files", _setup_written,
         lambda p, a, st: p.ask(a, "file_remove", path=st["path"], version=st["v"]),
         lambda r, st: r == {"reply": "found", "found": True},
         lambda p, a, st, told: _verify_file(p, a, st, told, gone=True)),
]


def kept_cases(ctx: FaultCtx) -> list[Case]:
    return [c for c in CASES if c.needs is None or ctx.contract.get(c.needs)]


def run_case(ctx: FaultCtx, p: Proc, case: Case, faults: list[Fault], title: str) -> bool:
    """Set up (no fault), ask under ``faults``, judge the reply and the read-back; whether a fault fired."""
    ctx.history.scenario(f"{case.name}: {title}")
    agent = ctx.agent()
    st: dict[str, Json] = {}
    case.setup(p, agent, st)
    armed(ctx, *faults)
    try:
        reply = case.act(p, agent, st)
    finally:
        disarm(ctx, faults)
    told = judge_own(ctx.history, case.name, reply, case.good(reply, st))
    wrong = case.verify(p, agent, st, told)
    if wrong:
        fail(ctx.history, f"{case.name} read back after {title} (the reply was {told})", "<consistent>", wrong)
    return any(f.fired is not None for f in faults)


def with_proc(ctx: Ctx, body: Callable[[FaultCtx, World, Proc], None]) -> None:
    fctx, world = world_of(ctx)
    p = Proc(fctx, "A")
    try:
        p.warm(fctx.agent())
        body(fctx, world, p)
    finally:
        world.proxy.disarm()
        world.proxy.release_all()
        p.close()


@checks.check
def lost_reply(ctx: Ctx) -> None:
    """Each write of each op applied with its reply lost, in turn: the op answers its own success or
    outcome unknown, never another's win, and reads back as acknowledged."""

    def body(fctx: FaultCtx, world: World, p: Proc) -> None:
        for case in kept_cases(fctx):
            for k in range(1, 5):
                if not run_case(fctx, p, case, [Fault("lose_reply", "write", k)], f"reply of write #{k} lost"):
                    break  # the op has fewer writes

    with_proc(ctx, body)


def _transient(world: World) -> Fault:
    r = world.rng
    kind = r.choice(("fail", "throttle", "reset", "fail"))
    status = {"fail": r.choice((500, 503)), "throttle": 429 if world.proxy.flavor == "gcs" else 503}.get(kind, 0)
    return Fault(kind, "any", r.randint(1, 3), status=status or 503)


@checks.check
def transient(ctx: Ctx) -> None:
    """A 5xx, a throttle or a reset on a seeded request of each op: success or an honest error, and an
    error that says nothing changed changed nothing."""

    def body(fctx: FaultCtx, world: World, p: Proc) -> None:
        for _ in range(1 if world.quick else 3):
            for case in kept_cases(fctx):
                fault = _transient(world)
                run_case(fctx, p, case, [fault], fault.describe().split(":")[0])

    with_proc(ctx, body)


@checks.check
def cut_body(ctx: Ctx) -> None:
    """A reply's body cut short on a seeded read while the op's effect is read back: exact or an error."""

    def body(fctx: FaultCtx, world: World, p: Proc) -> None:
        for case in kept_cases(fctx):
            for _ in range(1 if world.quick else 2):
                title = "body of a read cut short"
                fctx.history.scenario(f"{case.name}: {title}")
                agent = fctx.agent()
                st: dict[str, Json] = {}
                case.setup(p, agent, st)
                reply = case.act(p, agent, st)
                told = judge_own(fctx.history, case.name, reply, case.good(reply, st))
                faults = armed(fctx, Fault("truncate", "read", world.rng.randint(1, 3)))
                try:
                    wrong = case.verify(p, agent, st, told)
                finally:
                    disarm(fctx, faults)
                if wrong:
                    fail(fctx.history, f"{case.name} read back with a body cut short", "<exact, or an error>", wrong)

    with_proc(ctx, body)


def _late(fctx: FaultCtx, world: World, p: Proc, title: str, k: int,
          first: Callable[[], dict[str, Json]], good: Callable[[dict[str, Json]], bool],
          then: Callable[[], bool], check: Callable[[], str]) -> bool:
    """``first`` with its k-th write held until ``then`` ran, then landing; ``check`` judges. Whether it fired."""
    fctx.history.scenario(f"{title}: write #{k} lands late")
    faults = armed(fctx, Fault("late", "write", k))
    try:
        reply = first()
    finally:
        world.proxy.disarm()
    told = judge_own(fctx.history, title, reply, good(reply))
    fired = faults[0].fired is not None
    if fired:
        fctx.history.fault("late")
    if told != DONE or not then():
        world.proxy.settle_late(faults[0])
        return fired
    landed = world.proxy.settle_late(faults[0])
    fctx.history.lines.append(f"          (the held request landed: {faults[0].landed})" if landed
                              else "          (the held request never landed)")
    wrong = check()
    if wrong:
        fail(fctx.history, f"{title}: an acknowledged write after a late landing", "<read back exactly once>", wrong)
    return fired


def _late_append(fctx: FaultCtx, world: World, p: Proc, k: int) -> bool:
    a, t = fctx.agent(), f"fz-{token()}"
    e1, e2 = {"seq": 1, "by": token()}, {"seq": 2, "by": token()}

    def back() -> str:
        events = _read_events(p, a, t)
        return "" if events in (None, [e1, e2]) else f"events {events}"

    return _late(fctx, world, p, "append", k,
                 lambda: p.ask(a, "append", thread=t, event=e1), lambda r: r == {"reply": "done"},
                 lambda: p.ask(a, "append", thread=t, event=e2) == {"reply": "done"}, back)


def _late_file(fctx: FaultCtx, world: World, p: Proc, k: int) -> bool:
    a, st = fctx.agent(), dict[str, Json]()
    _setup_written(p, a, st)
    new = b64(token().encode())

    def rewrite() -> bool:
        reply = p.ask(a, "file_write", path=st["path"], data=new, version=0)
        st["wrote"] = reply.get("version")
        return reply.get("reply") == "wrote"

    def back() -> str:
        reply = p.ask(a, "file_read", path=st["path"])
        want = {"data": new, "version": st["wrote"]}
        return "" if is_error(reply) or reply.get("file") == want else f"file {reply.get('file')}, not {want}"

    return _late(fctx, world, p, "file_remove then file_write", k,
                 lambda: p.ask(a, "file_remove", path=st["path"], version=st["v"]),
                 lambda r: r == {"reply": "found", "found": True}, rewrite, back)


def _late_job(fctx: FaultCtx, world: World, p: Proc, k: int) -> bool:
    a, st = fctx.agent(), dict[str, Json]()
    _setup_put_job(p, a, st)

    def put_again() -> bool:
        st["spec"] = token()
        return p.ask(a, "job_put", place="waiting", job=_job(st)) == {"reply": "done"}

    def back() -> str:
        ok, job = _get(p, a, "waiting", str(st["j"]))
        return "" if not ok or job == _job(st) else f"job {job}, not {_job(st)}"

    return _late(fctx, world, p, "job_remove then job_put", k,
                 lambda: p.ask(a, "job_remove", place="waiting", id=st["j"]),
                 lambda r: r == {"reply": "found", "found": True}, put_again, back)


@checks.check
def late_landing(ctx: Ctx) -> None:
    """A write held past the client's giving up lands after the retry and the next op: no acknowledged
    write is lost or doubled by it (appends, a file removed and made again, a job removed and put again)."""

    def body(fctx: FaultCtx, world: World, p: Proc) -> None:
        scenarios = [_late_append]
        scenarios += [_late_file] if fctx.contract.get("files") else []
        scenarios += [_late_job] if fctx.contract.get("jobs") else []
        for scenario in scenarios:
            for k in range(1, 4):
                if not scenario(fctx, world, p, k):
                    break  # the op has fewer writes

    with_proc(ctx, body)


def _replaced(fctx: FaultCtx, world: World, p: Proc, title: str, k: int,
              act: Callable[[], dict[str, Json]], meanwhile: Callable[[], None],
              judge: Callable[[dict[str, Json]], str]) -> bool:
    """``act`` with its k-th write's reply lost and the next write held while ``meanwhile`` runs."""
    fctx.history.scenario(f"{title}: reply of write #{k} lost, the retry held while another writes")
    faults = armed(fctx, Fault("lose_reply", "write", k), Fault("hold", "write", k + 1))
    replies: list[dict[str, Json]] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            replies.append(act())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the check's thread
            errors.append(exc)

    runner = threading.Thread(target=go, daemon=True)
    runner.start()
    ends = time.monotonic() + 8.0
    while runner.is_alive() and faults[1].fired is None and time.monotonic() < ends:
        time.sleep(0.01)
    held = faults[1].fired is not None and runner.is_alive()
    world.proxy.disarm()
    if held:
        meanwhile()
    faults[1].release.set()
    runner.join(40)
    for f in faults:
        if f.fired is not None:
            fctx.history.fault(f.kind)
    if errors:
        raise errors[0]
    if not replies:
        fail(fctx.history, f"{title}: no reply", "<a reply>", "<none within 40 s>")
    wrong = judge(replies[0]) if held else ""
    if wrong:
        fail(fctx.history, f"{title}: a wrong reply about its own write, replaced since", "<its success, or "
             "outcome unknown>", wrong)
    return faults[0].fired is not None


def _replaced_file(fctx: FaultCtx, world: World, p: Proc, other: Proc, k: int) -> bool:
    a, st = fctx.agent(), dict[str, Json]()
    _setup_file(p, a, st)
    seen: dict[str, Json] = {}

    def over() -> None:
        got = other.ask(a, "file_read", path=st["path"]).get("file")
        seen["file"] = got
        version = got.get("version", 0) if isinstance(got, dict) else 0
        other.ask(a, "file_write", path=st["path"], data=b64(b"over"), version=version)

    def judge_file(reply: dict[str, Json]) -> str:
        landed = isinstance(seen.get("file"), dict)  # B read A's file: A's write had landed
        return str(reply) if landed and reply.get("reply") == "stale" else ""

    return _replaced(fctx, world, p, "file_write", k,
                     lambda: p.ask(a, "file_write", path=st["path"], data=_file(st), version=0), over, judge_file)


def _replaced_job(fctx: FaultCtx, world: World, p: Proc, other: Proc, k: int) -> bool:
    a, st = fctx.agent(), dict[str, Json]()
    _setup_put_job(p, a, st)

    def shift_on() -> None:
        other.ask(a, "job_shift", id=st["j"], **{"from": "firing", "to": "ending"})

    def judge_job(reply: dict[str, Json]) -> str:
        ok, job = _get(other, a, "waiting", str(st["j"]))
        left = ok and job is None  # only A shifts it out of waiting
        return str(reply) if left and reply == {"reply": "found", "found": False} else ""

    return _replaced(fctx, world, p, "job_shift", k,
                     lambda: p.ask(a, "job_shift", id=st["j"], **{"from": "waiting", "to": "firing"}),
                     shift_on, judge_job)


@checks.check(builds_on="faults.lost_reply")
def own_write_replaced(ctx: Ctx) -> None:
    """A write lands, its reply is lost, and before its retry another process writes over it: the retry
    still knows the write as its own (a file written, then written over; a job shifted, then shifted on).

    Built on ``lost_reply``: a driver that already mistakes its own write for another's before anyone
    replaces it fails there, and is not judged here again."""

    def body(fctx: FaultCtx, world: World, p: Proc) -> None:
        other = Proc(fctx, "B")
        try:
            other.warm(fctx.agent())
            scenarios = [_replaced_file] if fctx.contract.get("files") else []
            scenarios += [_replaced_job] if fctx.contract.get("jobs") else []
            for scenario in scenarios:
                for k in range(1, 6):
                    if not scenario(fctx, world, p, other, k):
                        break
        finally:
            other.close()

    with_proc(ctx, body)


@checks.check
def store_time(ctx: Ctx) -> None:
    """Every reply's Date a day ahead: a lease's times are the store's; then one reply an hour off:
    a lease judged by it does not lapse."""
    fctx, world = world_of(ctx)
    day = 86_400.0
    shift = world.shift_dates(day)
    fctx.history.schedule.append(f"every reply's Date +{day:.0f} s")
    a = fctx.agent()
    p = Proc(fctx, "A")
    try:
        fctx.history.scenario("the store's clock a day ahead of the machine's")
        p.warm(a)
        t, h = f"fz-{token()}", f"h-{token()}"
        before = time.time()
        took = p.ask(a, "take", thread=t, holder=h, lapse_ms=LAPSE)
        leases = p.ask(a, "leases", lapse_ms=LAPSE)
        after = time.time()
        fctx.history.fault("date")
        if took.get("reply") == "took":
            mine = [x for x in leases.get("leases", []) if isinstance(x, dict) and x.get("thread") == t]
            renewed = mine[0].get("renewed") if mine else None
            low, high = before + day - 5, after + day + 5
            if not isinstance(renewed, (int, float)) or not low <= renewed <= high:
                fail(fctx.history, "a lease's `renewed` in the store's time (every reply's Date a day ahead)",
                     f"<between {low:.3f} and {high:.3f}>", mine or leases)
    finally:
        shift.active = False
        world.unshift()
        p.close()
    b = Proc(fctx, "B")
    try:
        fctx.history.scenario("one reply's Date an hour ahead")
        b.warm(a)
        t, h1, h2 = f"fz-{token()}", f"h-{token()}", f"h-{token()}"
        b.ask(a, "take", thread=t, holder=h1, lapse_ms=60_000)
        nth = world.rng.randint(1, 2)
        world.shift_dates(3600.0, nth=nth, times=1)
        fctx.history.schedule.append(f"reply #{nth} of the next take: Date +3600 s")
        other = b.ask(a, "take", thread=t, holder=h2, lapse_ms=60_000)
        fctx.history.fault("date")
        if other.get("reply") == "took" and other.get("took") == "lapsed":
            fail(fctx.history, "a lease taken 60 s lapse ago: not lapsed by one reply dated an hour ahead",
                 {"reply": "took", "took": "held"}, other)
    finally:
        world.unshift()
        b.close()


# -- racers under faults, their history checked as a whole


@dataclass
class RacedOp:
    """One request of a racer: its reply and the logical steps it began and ended at."""

    who: str
    request: dict[str, Json]
    reply: dict[str, Json]
    start: int
    end: int

    @property
    def ok(self) -> bool:
        return not is_error(self.reply)

    def __str__(self) -> str:
        shown = {k: v for k, v in self.request.items() if k not in ("agent", "thread")}
        return f"[{self.start}-{self.end}] {self.who}: {compact(shown)} -> {compact(self.reply)}"


def append_model(last: Hashable, op: RacedOp) -> list[Hashable]:
    """The states a conversation's ``last`` may be in after ``op`` answered as it did (none: impossible)."""
    assert isinstance(last, int)
    name, reply = op.request["op"], op.reply
    if name == "last":
        return [last] if reply.get("last") == last else []
    seq = op.request["event"]["seq"]
    if not op.ok:  # outcome unknown: if it took effect, it was the append of the next number
        return [seq] if seq == last + 1 else []
    if reply == {"reply": "done"}:
        return [seq] if seq == last + 1 else []
    if reply.get("reply") == "taken":
        return [last] if seq != last + 1 and reply.get("last") == last else []
    return []


@checks.check(builds_on="faults.lost_reply")
def racers_linearizable(ctx: Ctx) -> None:
    """Three processes racing `last` then `append` of the next number on one conversation, under seeded lost
    replies, 5xx and resets: one order of every op (each between its start and its end) explains every reply.

    First in seeded turns (each round every racer once, in an order drawn from the seed), so that the same
    seed replays the same interleaving and every run has a racer asking after others appended since its own
    last op; then released together, for the interleavings no schedule thought of. Built on ``lost_reply``
    (the racers' appends lose replies too): it is here for what no single reply shows."""
    fctx, world = world_of(ctx)
    rounds = 4 if world.quick else 10
    racers = [Proc(fctx, f"R{i}") for i in range(3)]
    agent, thread = fctx.agent(), f"fz-{token()}"
    steps = itertools.count()
    lock = threading.Lock()
    ops: list[RacedOp] = []

    def step() -> int:
        with lock:
            return next(steps)

    def one(p: Proc, op: str, **fields: Json) -> dict[str, Json]:
        start = step()
        reply = p.ask(agent, op, thread=thread, **fields)
        with lock:
            ops.append(RacedOp(p.who, {"op": op, "agent": agent, "thread": thread, **fields}, reply, start,
                               next(steps)))
        return reply

    def turn(p: Proc) -> None:
        last = one(p, "last").get("last")
        if isinstance(last, int):
            one(p, "append", event={"seq": last + 1, "by": p.who})

    def race(p: Proc) -> None:
        for _ in range(rounds):
            turn(p)

    r = world.rng
    first = r.randint(1, 3)  # a lost reply every third write from a seeded one on (some writes are not appends)
    faults = [*(Fault("lose_reply", "write", k) for k in range(first, 6 * rounds, 3)),
              Fault(r.choice(("fail", "reset")), "any", r.randint(1, 12), status=r.choice((500, 503)))]
    turns = [who for _ in range(rounds) for who in r.sample(range(len(racers)), len(racers))]
    try:
        for p in racers:
            p.warm(agent)
        fctx.history.scenario(f"3 racers, {rounds} rounds of last + append each in seeded turns, then {rounds} "
                              "released together")
        armed(fctx, *faults)
        for who in turns:
            turn(racers[who])
        errors: list[BaseException] = []

        def run(p: Proc) -> None:
            try:
                race(p)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the check's thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in racers]
        for thread_ in threads:
            thread_.start()
        for thread_ in threads:
            thread_.join(120)
        disarm(fctx, faults)
        if errors:
            raise errors[0]
        events = _read_events(racers[0], agent, thread)
        if events is not None:
            seqs = [e.get("seq") for e in events if isinstance(e, dict)]
            if seqs != list(range(1, len(seqs) + 1)):
                fail(fctx.history, "the raced conversation's events once each, one after another", "1..N", seqs)
        # Errors that say nothing changed are left out: if one changed something, no order explains the rest.
        judged = [o for o in sorted(ops, key=lambda o: o.start) if o.ok or "outcome unknown" in str(o.reply)]
        verdict = linearizable(judged, 0, append_model)
        if not verdict.ok:
            fctx.history.lines.append("          longest order found: " + " ; ".join(map(str, verdict.placed)))
            fctx.history.lines.append(f"          then, at last = {verdict.state}, none of: "
                                      + " ; ".join(map(str, verdict.stuck)))
            fail(fctx.history, "one order of the racers' ops explaining every reply (linearizability)",
                 "<an order the model of append and last accepts>", f"none: stuck at last = {verdict.state}")
    finally:
        world.proxy.disarm()
        for p in racers:
            p.close()


# -- a server that ignores preconditions


def _stripped(world: World) -> int:
    """Requests the proxy has forwarded without a precondition they carried, so far."""
    return sum(1 for seen in world.proxy.requests() if seen.stripped)


@checks.check
def server_ignores_preconditions(ctx: Ctx) -> None:
    """Every request forwarded without its preconditions (If-None-Match / If-Match, ifGenerationMatch...):
    processes started on that server answer each write op an error, never their success; two racers of one
    seq are never both `done`; and what those errors said was not changed, was not (read back by a process
    started before, with the server honest again).

    Every promise rests on the server refusing a conditional write; one that accepts them all settles no
    race, and a driver that trusts it tells two appenders `done`. Only processes started while the server
    ignores them are asked (a driver may check its server once per process, before its first write)."""
    fctx, world = world_of(ctx)
    honest = Proc(fctx, "S")  # sets up and reads back, with the preconditions honoured
    procs: list[Proc] = []
    fctx.history.schedule.append("every request without its preconditions, for processes A and B")
    try:
        honest.warm(fctx.agent())
        with world.ignoring_preconditions():
            procs += [Proc(fctx, "A"), Proc(fctx, "B")]
            for p in procs:
                p.warm(fctx.agent())
        a, b = procs
        for case in kept_cases(fctx):
            fctx.history.scenario(f"{case.name}: asked of a process whose server ignores preconditions")
            agent, st = fctx.agent(), dict[str, Json]()
            case.setup(honest, agent, st)
            before = _stripped(world)
            with world.ignoring_preconditions():
                reply = case.act(a, agent, st)
            fctx.history.lines.append(f"          (requests stripped of a precondition meanwhile: "
                                      f"{_stripped(world) - before})")
            fctx.history.fault("strip")
            if not is_error(reply):
                fail(fctx.history, f"{case.name} on a server that ignores preconditions",
                     "<an error: no race can be settled there>", reply)
            wrong = case.verify(honest, agent, st, fate(reply, False))
            if wrong:
                fail(fctx.history, f"{case.name} read back after its error on a server that ignores preconditions",
                     "<what the error said>", wrong)
        rounds = 2 if world.quick else 4
        for n in range(rounds):
            fctx.history.scenario(f"two racers of seq 1, released together, on a server that ignores "
                                  f"preconditions (round {n + 1} of {rounds})")
            agent, thread = fctx.agent(), f"fz-{token()}"
            events = [{"seq": 1, "by": p.who} for p in procs]

            def ready(i: int, agent: dict[str, Json] = agent, thread: str = thread,
                      events: list[dict[str, Json]] = events) -> Callable[[], dict[str, Json]]:
                return lambda: procs[i].ask(agent, "append", thread=thread, event=events[i])

            with world.ignoring_preconditions():
                replies = at_once([partial(ready, i) for i in range(len(procs))])
            fctx.history.fault("strip")
            if sum(r == {"reply": "done"} for r in replies) > 1:
                fail(fctx.history, "two racers of one seq on a server that ignores preconditions",
                     "<at most one done (each an error: no race can be settled there)>", replies)
            if not all(is_error(r) for r in replies):
                fail(fctx.history, "racers of one seq on a server that ignores preconditions",
                     "<each an error: no race can be settled there>", replies)
            unknown = any(fate(r, False) == UNKNOWN for r in replies)
            got = _read_events(honest, agent, thread)
            if got is not None and got != [] and not (unknown and len(got) == 1):
                fail(fctx.history, "the raced conversation read back after both racers' errors",
                     "<nothing written>" if not unknown else "<at most one event>", got)
    finally:
        for p in (honest, *procs):
            p.close()

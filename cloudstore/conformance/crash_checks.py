"""Family ``crash``: what the next op sees after a ``serve`` process was killed mid-op (``--crash``).

For any driver, black box.  Each check sets a state up with a normal
``serve`` process, sends one multi-request op to a *victim* process and
kills it (SIGKILL): before each of its store requests in turn, where the
driver honours ``LNK_STORE_FAILPOINT=N`` (it kills itself before its Nth
request; a driver that ignores it simply answers, and the sweep ends), and
at seeded moments within the op's fault-free time.  Then another process,
which never saw the agent, reads what the next ops read and judges:

* ``append``: no event lost or doubled, the numbers still one after another;
* ``job_shift``: the job in exactly one place, never none or two, and a job
  left in waiting still counted by ``job_next``;
* ``file_write`` / ``file_remove``: a version never given again;
* ``tools_narrow``: a narrowing never widened;
* ``take``: one holder at most.
"""

from __future__ import annotations

import base64
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocol.client import DriverError, ServeProcess, dumps
from .expect import Json, is_number
from .harness import CheckSet, Ctx
from .judge import History, fail

checks = CheckSet("crash")

FAILPOINT = "LNK_STORE_FAILPOINT"
LAPSE = 600_000
#: Failpoints tried per op at most (no op of a sane driver needs more requests).
MOST_POINTS = 60
REPLY_WITHIN = 60.0


@dataclass
class CrashCtx(Ctx):
    """A check's context under ``--crash``: the seed's choices and the history of what was sent."""

    seed: int = 0
    quick: bool = True
    history: History = field(default_factory=lambda: History(0))
    rng: random.Random = field(default_factory=random.Random)
    kills: dict[str, int] = field(default_factory=dict)


class Asker:
    """A normal ``serve`` process of the driver; every request recorded."""

    def __init__(self, ctx: CrashCtx, who: str) -> None:
        assert ctx.driver is not None
        self.ctx, self.who = ctx, who
        self.proc = ServeProcess(ctx.driver.argv, ctx.driver.env, stderr=subprocess.DEVNULL)

    def ask(self, agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
        request = {"op": op, "agent": agent, **fields}
        try:
            reply = self.proc.request(request, timeout=REPLY_WITHIN)
        except DriverError as exc:
            self.ctx.history.record(self.who, request, f"<no reply: {exc}>", "")
            fail(self.ctx.history, f"{op} after a crash: the driver did not answer", "<one reply line>", str(exc))
            raise
        self.ctx.history.record(self.who, request, reply, "")
        return reply if isinstance(reply, dict) else {"reply": "<not an object>", "got": reply}

    def close(self) -> None:
        self.proc.close()


def victim(ctx: CrashCtx, request: dict[str, Json], point: int | None, after: float | None) -> tuple[str, float]:
    """Send ``request`` to a new process, killed at failpoint ``point`` or ``after`` seconds; what became of
    it ("killed" or "answered") and how long the op took."""
    assert ctx.driver is not None
    env = dict(ctx.driver.env)
    if point is not None:
        env[FAILPOINT] = str(point)
    proc = ServeProcess(ctx.driver.argv, env, stderr=subprocess.DEVNULL)
    how = f"failpoint {point}" if point is not None else f"SIGKILL after {after:.3f} s"
    try:
        if after is not None:  # the process started and its imports paid, so the moment falls within the op
            proc.request({"op": "last", "agent": request["agent"], "thread": "lnk-store-check warm"},
                         timeout=REPLY_WITHIN)
            timer = threading.Timer(after, proc.proc.kill)
            timer.start()
        sent = time.monotonic()
        try:
            reply = proc.request_line(dumps(request).encode(), timeout=REPLY_WITHIN)
            died = False
        except DriverError:
            reply, died = "<killed>", True
        if after is not None:
            timer.cancel()
        took = time.monotonic() - sent
        outcome = f"killed ({how})" if died else f"answered ({how}): {reply[:200]}"
    finally:
        proc.kill()
    ctx.history.record("victim", request, outcome, "")
    if died:
        ctx.kills["failpoint" if point is not None else "moment"] = \
            ctx.kills.get("failpoint" if point is not None else "moment", 0) + 1
    return ("killed" if died else "answered"), took


@dataclass
class CrashOp:
    """One multi-request op killed mid-way: its state set up, the op, what the next ops must see."""

    name: str
    needs: str | None
    setup: Callable[[Asker, dict[str, Json], dict[str, Json]], None]
    request: Callable[[dict[str, Json], dict[str, Json]], dict[str, Json]]
    check: Callable[[Asker, dict[str, Json], dict[str, Json]], str]


def _tok() -> str:
    return uuid.uuid4().hex[:10]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def _setup_events(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["t"] = f"cr-{_tok()}"
    st["events"] = [{"seq": i, "by": _tok()} for i in range(1, 5)]
    for event in st["events"][:3]:
        p.ask(a, "append", thread=st["t"], event=event)


def _check_events(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> str:
    events: list[Json] = st["events"]
    got = p.ask(a, "read", thread=st["t"]).get("events")
    if got not in (events[:3], events):
        return f"events 1-3, or 1-4 (no event lost or doubled): got {got}"
    again = {"seq": 4, "by": _tok()}
    reply = p.ask(a, "append", thread=st["t"], event=again)
    want = {"reply": "taken", "last": 4} if got == events else {"reply": "done"}
    if reply != want:
        return f"appending 4 again after reading {len(got or [])} events: expected {want}, got {reply}"
    final = p.ask(a, "read", thread=st["t"]).get("events")
    if final != (events if got == events else events[:3] + [again]):
        return f"the events once each, in order: got {final}"
    return ""


#: A due at or before any other job's in the store (the least that this project's drivers keep in waiting:
#: ``validate.DUE_MAX``; the contract says only "number", and this one is exact as an integer and a double),
#: so ``job_next``, which answers for every agent of the store, must answer at most it while the job waits.
DUE_LEAST = -(2**53 - 1)


def _job(st: dict[str, Json]) -> dict[str, Json]:
    return {"id": str(st["j"]), "spec": {"by": st["spec"]}, "due": DUE_LEAST}


def _setup_job(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["j"], st["spec"] = f"j-{_tok()}", _tok()
    p.ask(a, "job_put", place="waiting", job=_job(st))


def _places(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> list[str]:
    return [place for place in ("waiting", "firing", "ending")
            if p.ask(a, "job_get", place=place, id=st["j"]).get("job") is not None]


def _check_job(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> str:
    places = _places(p, a, st)
    if places not in (["waiting"], ["firing"]):
        return f"the job in exactly one place, waiting or firing: got {places}"
    got = p.ask(a, "job_get", place=places[0], id=st["j"]).get("job")
    if got != _job(st):
        return f"the job whole in {places[0]}: got {got}"
    if places == ["waiting"]:
        soonest = p.ask(a, "job_next").get("next")
        if not is_number(soonest) or soonest > DUE_LEAST:  # type: ignore[operator]  # a number: just checked
            return (f"the job is in waiting, due {DUE_LEAST}, but job_next answered {soonest}: "
                    "a waiting job the next ops do not see as due")
    reply = p.ask(a, "job_shift", id=st["j"], **{"from": places[0], "to": "ending"})
    if reply != {"reply": "found", "found": True} or _places(p, a, st) != ["ending"]:
        return f"the job shifted on from {places[0]}: {reply}, now in {_places(p, a, st)}"
    return ""


def _setup_file(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["path"], st["old"], st["new"] = f"skills/cr-{_tok()}/SKILL.md", _tok(), _tok()
    st["v"] = p.ask(a, "file_write", path=st["path"], data=_b64(str(st["old"])), version=0).get("version")


def _check_versions(p: Asker, a: dict[str, Json], st: dict[str, Json], removing: bool) -> str:
    seen = {st["v"]}
    got = p.ask(a, "file_read", path=st["path"]).get("file")
    old = {"data": _b64(str(st["old"])), "version": st["v"]}
    if removing:
        if got not in (old, None):
            return f"the file as it was, or removed: got {got}"
    elif got != old and not (isinstance(got, dict) and got.get("data") == _b64(str(st["new"]))
                             and isinstance(got.get("version"), int) and got["version"] > st["v"]):
        return f"the file as it was, or written with a greater version: got {got}"
    if isinstance(got, dict):
        seen.add(got.get("version"))
        p.ask(a, "file_remove", path=st["path"], version=got.get("version"))
    again = p.ask(a, "file_write", path=st["path"], data=_b64("again"), version=0)
    version = again.get("version")
    if again.get("reply") != "wrote" or not isinstance(version, int) or version in seen \
            or any(isinstance(v, int) and version < v for v in seen):
        return f"the file made again with a version never given before ({sorted(map(str, seen))}): got {again}"
    return ""


def _setup_tools(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["t"] = f"cr-{_tok()}"
    p.ask(a, "tools_narrow", thread=st["t"], tools=["a", "b", "c"])


def _check_tools(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> str:
    got = p.ask(a, "tools_read", thread=st["t"]).get("tools")
    if got not in (["a", "b", "c"], ["a", "b"]):
        return f"the narrowing as it was or narrowed: got {got}"
    wider = p.ask(a, "tools_narrow", thread=st["t"], tools=["a", "b", "c", "d"]).get("tools")
    if wider != got:
        return f"a narrowing never widened: after {got}, narrowing to a,b,c,d answered {wider}"
    return ""


def _setup_lease(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> None:
    st["t"], st["h"] = f"cr-{_tok()}", f"h-{_tok()}"
    p.ask(a, "append", thread=st["t"], event={"seq": 1})


def _check_lease(p: Asker, a: dict[str, Json], st: dict[str, Json]) -> str:
    reply = p.ask(a, "leases", lapse_ms=LAPSE)
    holders = [x.get("holder") for x in reply.get("leases", []) if isinstance(x, dict) and x.get("thread") == st["t"]]
    if holders not in ([], [st["h"]]):
        return f"no lease or {st['h']}'s: got {holders}"
    other = p.ask(a, "take", thread=st["t"], holder=f"h-{_tok()}", lapse_ms=LAPSE)
    want = "held" if holders else "took"
    if other != {"reply": "took", "took": want}:
        return f"another's take after the crash: expected {want}, got {other}"
    return ""


OPS = [
    CrashOp("append", None, _setup_events,
            lambda a, st: {"op": "append", "agent": a, "thread": st["t"], "event": st["events"][3]},
            _check_events),
    CrashOp("take", None, _setup_lease,
            lambda a, st: {"op": "take", "agent": a, "thread": st["t"], "holder": st["h"], "lapse_ms": LAPSE},
            _check_lease),
    CrashOp("tools_narrow", None, _setup_tools,
            lambda a, st: {"op": "tools_narrow", "agent": a, "thread": st["t"], "tools": ["a", "b"]}, _check_tools),
    CrashOp("job_shift", "jobs", _setup_job,
            lambda a, st: {"op": "job_shift", "agent": a, "id": st["j"], "from": "waiting", "to": "firing"},
            _check_job),
    CrashOp("file_write", "files", _setup_file,
            lambda a, st: {"op": "file_write", "agent": a, "path": st["path"], "data": _b64(str(st["new"])),
                           "version": st["v"]},
            lambda p, a, st: _check_versions(p, a, st, False)),
    CrashOp("file_remove", "files", _setup_file,
            lambda a, st: {"op": "file_remove", "agent": a, "path": st["path"], "version": st["v"]},
            lambda p, a, st: _check_versions(p, a, st, True)),
]


def _kept(ctx: CrashCtx, op: CrashOp) -> bool:
    if op.needs is not None and not ctx.contract.get(op.needs):
        return False
    return op.name != "tools_narrow" or ctx.keeps_tools


def _point(ctx: CrashCtx, setup: Asker, checker: Asker, op: CrashOp, point: int | None,
           after: float | None) -> tuple[str, float]:
    agent = ctx.agent()
    st: dict[str, Json] = {}
    ctx.history.scenario(f"{op.name}: " + (f"failpoint {point}" if point is not None else f"killed at {after:.3f} s"))
    op.setup(setup, agent, st)
    outcome = victim(ctx, op.request(agent, st), point, after)
    wrong = op.check(checker, agent, st)
    if wrong:
        fail(ctx.history, f"{op.name} after its process was killed mid-op", "<what the contract promises>", wrong)
    return outcome


def crash_check(name: str) -> Callable[[Ctx], None]:
    def body(ctx: Ctx) -> None:
        assert isinstance(ctx, CrashCtx)
        op = next(o for o in OPS if o.name == name)
        if not _kept(ctx, op):
            ctx.history.lines.append(f"-- {name}: not kept by the contract")
            return
        setup, checker = Asker(ctx, "setup"), Asker(ctx, "next")
        try:
            _, took = _point(ctx, setup, checker, op, None, REPLY_WITHIN)  # no kill: the op's own time
            for point in range(1, MOST_POINTS + 1):
                if _point(ctx, setup, checker, op, point, None)[0] == "answered":
                    break
            for _ in range(1 if ctx.quick else 6):
                _point(ctx, setup, checker, op, None, ctx.rng.uniform(0.0, took))
        finally:
            setup.close()
            checker.close()

    body.__name__ = name
    body.__doc__ = f"`{name}` killed before each store request and at seeded moments: the next ops see it whole."
    return body


for _op in OPS:
    checks.check(crash_check(_op.name))

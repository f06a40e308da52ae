"""Issue 27: the contract's promises hold when replies' ``Date`` headers are off, on moto and fake-gcs-server.

Each machine is the drivers' own request handler (``Service``) on a backend
of its own (its own SDK client, so its own store clock), reaching the
emulator through a ``FaultProxy`` of its own: its front-end.  One machine's
front-end moves the ``Date`` of chosen replies (``DateShift``): one reply, every
reply of one op, a replica constantly 2 s off (every 3rd reply), a jump of
+1 h or -1 h, replicas disagreeing (+1 h and -1 h in turn), and a seeded
random pick of offsets.  Every machine first sees honest replies (its
estimate stands before the fault), and the machines' own clocks agree with
the store's (all on this host), so only the shifted Dates are wrong.

Promises checked, each under every kind of shift:

* leases: a take never takes a lease renewed within ``lapse_ms`` (and the
  holder's next renew is not ``lost``);
* jobs: a job put waiting stays in ``job_list`` and ``job_next``, even when
  the shifted ``job_next`` comes while the put's record write is in flight
  (the proxy holds it, released by the test: no timing decides the order);
* conversations: an append told ``done`` is read back, after a shifted
  ``last`` has rolled a removal forward.

On eafe802's clock (one reply restarted the estimate) the +1 h kinds take the
lease and drop the due entry, and +1 h makes the reader purge the removed
epoch at once.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import pytest
from faults.http_proxy import DateShift, FaultProxy, Rule
from support import StoreUnderTest, environment, fresh_agent, location_of, make_store

from cloudstore.generations import RetryingStore, RetryPolicy
from cloudstore.protocol.service import Service
from cloudstore.protocol.validate import agent as parse_agent
from cloudstore.settings import open_backend
from cloudstore.store.space import Space

NO_WAIT = RetryPolicy(first_delay=0.0, max_delay=0.0)
HOUR = 3600.0


@dataclass(frozen=True)
class Kind:
    """A kind of clock fault: the shift, and whether it lasts for the machine's whole life (a replica)."""

    name: str
    make: Callable[[], DateShift]
    always: bool = False  # on from the machine's first request; else only during the op under test


KINDS = (
    Kind("one reply +1 h", lambda: DateShift(HOUR, times=1)),
    Kind("one op +100 s", lambda: DateShift(100.0)),
    Kind("replica 2 s ahead", lambda: DateShift(2.0, every=3), always=True),
    Kind("replica 2 s behind", lambda: DateShift(-2.0, every=3), always=True),
    Kind("jump +1 h", lambda: DateShift(HOUR)),
    Kind("jump -1 h", lambda: DateShift(-HOUR)),
    Kind("replicas disagree", lambda: DateShift((HOUR, -HOUR))),
    Kind("seeded random", lambda: DateShift((100.0, -100.0, HOUR, -HOUR, 2.0), chance=0.5, seed=3)),
)


@dataclass
class Front:
    """One machine: the drivers' handler on its own backend, through its own proxy (its front-end)."""

    name: str
    backend: str
    proxy: FaultProxy
    service: Service
    agent: dict
    shift: DateShift | None = None
    always: bool = False  # the shift is a replica's: on throughout

    def __call__(self, op: str, **args: Any) -> dict:
        return self.service.answer({"op": op, "agent": self.agent, **args})

    def ok(self, op: str, **args: Any) -> dict:
        reply = self(op, **args)
        assert reply.get("reply") != "error", f"{self.name}: {op} {args} answered {reply}"
        return reply

    def writes_of(self, key: str) -> dict[str, Any]:
        """A rule's matcher for uploads of ``key`` (as tests/test_sdk_faults.py)."""
        if self.backend == "moto":
            return {"method": "PUT", "path": re.escape(quote(key, safe="/~")) + r"(\?|$)"}
        return {"method": "POST", "path": r"^/upload/", "content": re.escape(key.encode()) + b'"'}

    @contextmanager
    def shifted(self) -> Iterator[None]:
        """The op(s) run inside it meet this machine's clock fault (a replica's is on throughout)."""
        assert self.shift is not None
        self.shift.active = True
        try:
            yield
        finally:
            self.shift.active = self.always


@dataclass
class Fronts:
    """The machines of one test, on one fresh location of one emulator."""

    store: StoreUnderTest
    setting: str
    flavor: str
    agent: dict = field(default_factory=fresh_agent)
    made: list[Front] = field(default_factory=list)

    def __call__(self, name: str, kind: Kind | None = None) -> Front:
        proxy = FaultProxy(self.store.env[self.setting], flavor=self.flavor).start()
        shift = None
        if kind is not None:
            shift = proxy.shift_dates(kind.make())
            shift.active = kind.always
        env = proxy.redirect(self.store.env)
        with environment(env):  # the SDK client reads its endpoint when it is made
            loc = location_of(replace(self.store, env=env))
            service = Service(Space(RetryingStore(open_backend(loc), NO_WAIT), loc.prefix))
        front = Front(name, self.store.backend, proxy, service, self.agent, shift, kind is not None and kind.always)
        self.made.append(front)
        warm(front)
        return front

    def close(self) -> None:
        for front in self.made:
            front.proxy.stop()


def warm(front: Front) -> None:
    """Honest replies first (a replica's shifts among them): the machine's estimate stands before the fault."""
    thread = f"warm-{front.name}"
    for seq in (1, 2, 3):
        front.ok("append", thread=thread, event={"seq": seq})
    front.ok("read", thread=thread, first=1)


@pytest.fixture(params=("moto", "gcs"))
def fronts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronts]:
    store = make_store(request.param, request, tmp_path_factory)
    setting = "AWS_ENDPOINT_URL_S3" if request.param == "moto" else "STORAGE_EMULATOR_HOST"
    made = Fronts(store, setting, "s3" if request.param == "moto" else "gcs")
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_no_shifted_date_takes_a_lease_renewed_within_its_lapse(fronts: Fronts, kind: Kind) -> None:
    a, b = fronts("a"), fronts("b", kind)
    assert a.ok("take", thread="t", holder="A", lapse_ms=60_000)["took"] == "took"
    assert a.ok("renew", thread="t", holder="A") == {"reply": "done"}
    with b.shifted():
        taken = b.ok("take", thread="t", holder="B", lapse_ms=60_000)
    assert taken["took"] == "held", f"{kind.name}: a lease renewed a moment ago was taken: {taken}"
    assert a.ok("renew", thread="t", holder="A") == {"reply": "done"}
    with b.shifted():
        leases = b.ok("leases", lapse_ms=60_000)["leases"]
    assert [(x["holder"], x["lapsed"]) for x in leases] == [("A", False)]
    assert b.shift is not None and b.shift.shifted > 0, "the fault never happened"


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_job_put_waiting_stays_in_job_next_and_job_list(fronts: Fronts, kind: Kind) -> None:
    p, q = fronts("p"), fronts("q", kind)
    record = p.service.space.keys(parse_agent({"agent": p.agent})).job("j")
    release = threading.Event()
    held = p.proxy.add(Rule("delay", hold=release, **p.writes_of(record)))
    due = time.time()
    replies: list[dict] = []
    putter = threading.Thread(target=lambda: replies.append(
        p("job_put", place="waiting", job={"id": "j", "spec": None, "due": due})))
    putter.start()
    try:
        for _ in range(600):  # until P's record write is held at its front-end (its entry and mark are written)
            if held.fired:
                break
            time.sleep(0.01)
        assert held.fired, "P's record write never came"
        with q.shifted():
            q.ok("job_next")  # the entry's record is still in flight: young, whatever the Dates say
    finally:
        release.set()
        putter.join(timeout=60)
    assert replies == [{"reply": "done"}]
    with q.shifted():
        listed = [j["id"] for j in q.ok("job_list", place="waiting")["jobs"]]
        nxt = q.ok("job_next")
    assert listed == ["j"]
    assert nxt == {"reply": "next", "next": due}, f"{kind.name}: the job's due entry was deleted as an orphan"
    assert q.shift is not None and q.shift.shifted > 0, "the fault never happened"


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_an_append_told_done_is_read_back_after_a_shifted_roll_forward(fronts: Fronts, kind: Kind) -> None:
    s, o, r, x = fronts("s"), fronts("o"), fronts("r"), fronts("x", kind)
    for seq in (1, 2):
        s.ok("append", thread="t", event={"seq": seq})
    for seq in (3, 4):
        o.ok("append", thread="t", event={"seq": seq})
    r.ok("remove", thread="t")
    with x.shifted():
        assert x.ok("last", thread="t") == {"reply": "last", "last": 0}
    reply = s("append", thread="t", event={"seq": 3, "by": "s"})  # within S's 30 s of trusting its memory
    events = s.ok("read", thread="t", first=1)["events"]
    if reply == {"reply": "done"}:
        assert {"seq": 3, "by": "s"} in events, f"{kind.name}: append answered done, then read {events}"
    else:
        assert reply["reply"] in ("error", "stale", "taken"), reply
    assert x.shift is not None and x.shift.shifted > 0, "the fault never happened"

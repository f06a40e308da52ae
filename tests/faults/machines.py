"""Several machines on one real store, each with its own fault plan, driven request by request.

A ``Machine`` is what one host running a driver is: a ``Service`` over its
own ``Space`` / ``RetryingStore`` / ``FaultyBackend``, all the machines of a
test sharing one real backend (folder, moto, fake-gcs-server) and one
``Limbo`` of late writes.  Requests go in and replies come out as the wire
shows them, through the driver's own ``Answerer``, so a store failure is the
error reply a caller would read.

Plans here are built from *steps* fired one after another (``in_order``):
step k+1 only looks at requests made after step k fired, so "the request
right after the lost one" is simply ``any_request``.  A step's fault may be
``between(...)``: run other machines' ops first, then answer a fault.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from support import fresh_agent, location_of

from cloudstore.generations import RetryingStore, RetryPolicy
from cloudstore.protocol.answerer import BUCKET_SETTING as BUCKET
from cloudstore.protocol.answerer import Answerer, encode_reply
from cloudstore.protocol.service import Service
from cloudstore.settings import open_backend
from cloudstore.store.space import Space
from faults.backend import Call, Fault, FaultyBackend, Limbo, Plan, no_faults

Json = Any
Matcher = Callable[[Call], bool]
Step = tuple[Matcher, "Fault | Callable[[Call], Fault]"]

#: Retries at once: the tests order requests with hooks, never with time.
NO_WAIT = RetryPolicy(first_delay=0.0, max_delay=0.0)
#: Gives up after two tries, for outages.
GIVE_UP_FAST = RetryPolicy(attempts=2, first_delay=0.0, max_delay=0.0)


class Machine:
    """One machine's driver: its ``Service`` over its own faulty view of the shared store."""

    def __init__(self, name: str, store: Any, agent: dict, limbo: Limbo, policy: RetryPolicy) -> None:
        loc = location_of(store)
        self.name = name
        self.agent = agent
        self.backend = FaultyBackend(open_backend(loc), name, no_faults, limbo)
        self.space = Space(RetryingStore(self.backend, policy), loc.prefix)
        self.answerer = Answerer(BUCKET)
        self.answerer.service = Service(self.space)

    def plan(self, plan: Plan) -> None:
        """Faults from now on (requests made before are not counted)."""
        self.backend.plan = plan

    def __call__(self, op: str, **args: Json) -> dict:
        """One request for this machine's agent; the reply as the wire carries it."""
        line = json.dumps({"op": op, "agent": self.agent, **args}).encode("utf-8")
        return json.loads(encode_reply(self.answerer.answer(line)))

    def ok(self, op: str, **args: Json) -> dict:
        """A request that must not fail (setup and checking)."""
        reply = self(op, **args)
        assert reply.get("reply") != "error", f"{self.name}: {op} {args} answered {reply}"
        return reply


@dataclass
class Machines:
    """The machines of one test: one store, one agent, one ``Limbo``."""

    store: Any
    agent: dict = field(default_factory=fresh_agent)
    limbo: Limbo = field(default_factory=Limbo)
    made: list[Machine] = field(default_factory=list)

    def __call__(self, name: str, policy: RetryPolicy = NO_WAIT) -> Machine:
        machine = Machine(name, self.store, self.agent, self.limbo, policy)
        self.made.append(machine)
        return machine

    def close(self) -> None:
        for machine in self.made:
            machine.space.pool.shutdown(wait=False)


# --------------------------------------------------------------------------
# Plans


def in_order(*steps: Step) -> Plan:
    """Fire ``steps`` one after another: each matcher sees only the requests after the previous step fired."""
    pending = list(steps)
    lock = threading.Lock()

    def plan(call: Call) -> Fault:
        with lock:
            if not pending or not pending[0][0](call):
                return Fault.NONE
            _, fault = pending.pop(0)
        return fault(call) if callable(fault) else fault

    return plan


def any_request(call: Call) -> bool:
    return True


def a_write(call: Call) -> bool:
    return call.is_write


def nth_request(n: int) -> Matcher:
    """The ``n``-th request made after the previous step (or after ``plan``)."""
    seen = [0]

    def matches(call: Call) -> bool:
        seen[0] += 1
        return seen[0] == n

    return matches


def write_to(key_has: str) -> Matcher:
    """A write whose key contains ``key_has`` (for scenarios built on one driver's layout)."""
    return lambda call: call.is_write and key_has in call.key


def between(*ops: Callable[[], Any], then: Fault = Fault.NONE) -> Callable[[Call], Fault]:
    """A step's fault: run ``ops`` (other machines' requests) first, then answer ``then``."""
    def run(call: Call) -> Fault:
        for op in ops:
            op()
        return then

    return run


def outage_after_first_write() -> Plan:
    """The first write goes through; every request after it fails before the store sees it."""
    down = [False]

    def plan(call: Call) -> Fault:
        if down[0]:
            return Fault.FAIL_BEFORE
        down[0] = call.is_write
        return Fault.NONE

    return plan


def every_write_lands_late_once() -> Plan:
    """The first try of each write is held in the ``Limbo`` (the client sees a timeout); its retry goes through."""
    tried: set[tuple[str, str]] = set()
    lock = threading.Lock()

    def plan(call: Call) -> Fault:
        if not call.is_write:
            return Fault.NONE
        with lock:
            first = (call.op, call.key) not in tried
            tried.add((call.op, call.key))
        return Fault.LAND_LATE if first else Fault.NONE

    return plan


class Once:
    """An op to run between two requests of another machine, exactly once: in a hook or, failing that, after."""

    def __init__(self, op: Callable[[], Any]) -> None:
        self.op = op
        self.result: Any | None = None
        self.ran = False

    def __call__(self) -> Any:
        if not self.ran:
            self.ran = True
            self.result = self.op()
        return self.result

"""The seeded scheduler: one thread runs at a time, and the seed decides which.

Each machine runs its ops in a thread of its own.  Before every backend
request the thread stops at a *gate* (the ``FaultyBackend``'s plan), and
before every op it stops *idle*.  The scheduler waits until every machine's
thread is stopped (at a gate, idle, or finished), then with its
``random.Random(seed)`` picks one: an idle machine starts its next op, a
gated one sends its request with a fault the same RNG picks.  Between two
steps it may land one held late write (``Limbo.land``), in its own thread
while every machine is stopped.  So exactly one thread runs at any moment and
the whole history is a function of the seed; nothing waits on time.

Faults: most requests go through; some fail (reads: before the store saw
them; writes: before, after being applied with the reply lost, or held to
land later); now and then a machine meets an *outage* (a run of failing
requests long enough to exhaust its retries), so ops also end in errors.
A machine may also meet a *throttle* (the cloud's rate limit: GCS 429, S3
``SlowDown``), a run of requests refused before the store saw them, longer
than the attempts a timeout may spend: the seam outlasts it.
A machine whose write just failed often *pauses* for a few steps (and any
machine now and then), so that another machine's op runs between a lost
reply and its retry, or between a read and the write it decides.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from faults.backend import Call, Fault, Limbo

from .history import Event, History

IDLE, GATE, RUNNING, DONE = "idle", "gate", "running", "done"
START = "start"
ABORT = "abort"
WRITE_FAULTS = (Fault.FAIL_BEFORE, Fault.LOSE_REPLY, Fault.LOSE_REPLY, Fault.LAND_LATE)


class Abort(BaseException):
    """Raised in a machine's thread to stop it (not an Exception: nothing on the way catches it)."""


class Stuck(Exception):
    """A machine ran for too long without reaching a gate: something waits on something else."""


@dataclass(frozen=True)
class Knobs:
    """How hostile the world is."""

    fault_rate: float = 0.15  # a request fails (one of WRITE_FAULTS for writes, FAIL_BEFORE for reads)
    outage_rate: float = 0.012  # a request starts an outage of this machine
    outage_length: tuple[int, int] = (6, 9)  # failing requests in a row: attempts=6 gives up
    land_rate: float = 0.05  # a step lands one held write instead
    throttle_rate: float = 0.015  # a request starts a throttle of this machine (refused for the rate)...
    throttle_length: tuple[int, int] = (1, 12)  # ...for this many requests in a row (past attempts=6)
    pause_after_fault: float = 0.5  # a machine whose write just failed pauses (others run before its retry)...
    pause_rate: float = 0.04  # ...and any machine now and then (a slow host, a GC pause)
    pause_steps: tuple[int, int] = (2, 14)  # for this many steps, while another machine can run
    final_land: float = 0.7  # at the end, each write still held lands (else it is lost for good)
    stuck_seconds: float = 60.0


@dataclass
class Slot:
    """One machine as the scheduler sees it."""

    name: str
    wake: threading.Condition
    state: str = RUNNING
    grant: object | None = None
    call: Call | None = None
    outage: int = 0
    throttled: int = 0  # requests of this machine still to be refused for the rate
    paused_until: int = 0


@dataclass
class Tally:
    """What the scheduler made happen, for the summary line."""

    faults: Counter = field(default_factory=Counter)
    landed: int = 0
    dropped: int = 0
    steps: int = 0

    def add(self, other: Tally) -> None:
        self.faults.update(other.faults)
        self.landed += other.landed
        self.dropped += other.dropped
        self.steps += other.steps


def describe(call: Call, short: Callable[[str], str]) -> str:
    """A request in a few words: op, key below the history's prefix, put mode or delete version."""
    extra = ""
    if call.mode is not None:
        extra = type(call.mode).__name__
        version = getattr(call.mode, "version", None)
        if version is not None:
            extra += f"({str(version)[:10]})"
    elif call.op == "delete":
        extra = "any" if call.version is None else f"at {str(call.version)[:10]}"
    return f"{call.op} {short(call.key)} {extra}".rstrip()


class Scheduler:
    """Lets exactly one machine's thread run at a time, in an order the seed decides."""

    def __init__(self, seed: int, limbo: Limbo, history: History, knobs: Knobs,
                 short: Callable[[str], str] = lambda key: key) -> None:
        self.rng = random.Random(f"schedule:{seed}")
        self.limbo = limbo
        self.history = history
        self.knobs = knobs
        self.short = short
        self.lock = threading.Lock()
        self.idle_all = threading.Condition(self.lock)
        self.slots: list[Slot] = []
        self.step = 0
        self.tally = Tally()

    def slot(self, name: str) -> Slot:
        slot = Slot(name, threading.Condition(self.lock))
        self.slots.append(slot)
        return slot

    # -- in the machines' threads

    def _stop(self, slot: Slot, state: str, call: Call | None = None) -> object:
        with self.lock:
            slot.state, slot.call = state, call
            self.idle_all.notify()
            while slot.grant is None:
                slot.wake.wait()
            grant, slot.grant = slot.grant, None
        if grant is ABORT:
            raise Abort()
        return grant

    def gate(self, slot: Slot, call: Call) -> Fault:
        """The plan of a machine's FaultyBackend: wait for our turn, then take the fault given."""
        grant = self._stop(slot, GATE, call)
        assert isinstance(grant, Fault)
        return grant

    def wait_start(self, slot: Slot) -> None:
        """Between ops: wait until the scheduler lets this machine begin its next one."""
        self._stop(slot, IDLE)

    def finish(self, slot: Slot) -> None:
        with self.lock:
            slot.state = DONE
            self.idle_all.notify()

    # -- in the scheduler's thread

    def run(self) -> None:
        """Run every machine to its end, one step at a time."""
        with self.lock:
            try:
                while True:
                    self._wait_stopped()
                    live = [s for s in self.slots if s.state != DONE]
                    if not live:
                        return
                    self.step += 1
                    if self.limbo.held and self.rng.random() < self.knobs.land_rate:
                        self._land(self.rng.randrange(len(self.limbo.held)), land=True)
                        continue
                    ready = [s for s in live if s.paused_until <= self.step]
                    slot = self.rng.choice(ready or live)
                    if self.rng.random() < self.knobs.pause_rate and len(ready) > 1:
                        self._pause(slot)
                        continue
                    if slot.state == IDLE:
                        slot.grant = START
                    else:
                        assert slot.call is not None
                        slot.grant = self._fault(slot, slot.call)
                    slot.state = RUNNING
                    slot.wake.notify()
            except BaseException:
                self._abort()
                raise
            finally:
                self.tally.steps = self.step

    def settle(self) -> None:
        """After every machine finished: land or lose, as the seed says, each write still held."""
        with self.lock:
            while self.limbo.held:
                self.step += 1
                self._land(self.rng.randrange(len(self.limbo.held)), land=self.rng.random() < self.knobs.final_land)
            self.tally.steps = self.step

    def _wait_stopped(self) -> None:
        deadline = time.monotonic() + self.knobs.stuck_seconds
        while any(s.state == RUNNING for s in self.slots):
            left = deadline - time.monotonic()
            if left <= 0:
                running = [s.name for s in self.slots if s.state == RUNNING]
                raise Stuck(f"step {self.step}: {running} ran {self.knobs.stuck_seconds:.0f} s without reaching a gate")
            self.idle_all.wait(left)

    def _abort(self) -> None:
        for slot in self.slots:
            if slot.state in (IDLE, GATE):
                slot.grant = ABORT
                slot.state = RUNNING
                slot.wake.notify()

    def _fault(self, slot: Slot, call: Call) -> Fault:
        rng, knobs = self.rng, self.knobs
        if slot.outage == 0 and rng.random() < knobs.outage_rate:
            slot.outage = rng.randint(*knobs.outage_length)
        if slot.outage == 0 and slot.throttled == 0 and rng.random() < knobs.throttle_rate:
            slot.throttled = rng.randint(*knobs.throttle_length)
        if slot.throttled > 0 and slot.outage == 0:
            slot.throttled -= 1
            fault = Fault.THROTTLE
        elif slot.outage > 0:
            slot.outage -= 1
            fault = rng.choice(WRITE_FAULTS) if call.is_write else Fault.FAIL_BEFORE
        elif rng.random() < knobs.fault_rate:
            fault = rng.choice(WRITE_FAULTS) if call.is_write else Fault.FAIL_BEFORE
        else:
            fault = Fault.NONE
        if fault is not Fault.NONE:
            self.tally.faults[fault.value] += 1
            if call.is_write and rng.random() < knobs.pause_after_fault:
                self._pause(slot)
        text = f"{describe(call, self.short)} -> {fault.value}"
        reached = call.is_write and fault not in (Fault.FAIL_BEFORE, Fault.THROTTLE)
        self.history.events.append(Event(self.step, slot.name, "call", text, call.key, reached))
        return fault

    def _pause(self, slot: Slot) -> None:
        slot.paused_until = self.step + self.rng.randint(*self.knobs.pause_steps)

    def _land(self, index: int, land: bool) -> None:
        if land:
            held = self.limbo.land(index)
            self.tally.landed += 1
            kind, outcome = "land", held.outcome
        else:
            with self.limbo.lock:
                held = self.limbo.held.pop(index)
            self.tally.dropped += 1
            kind, outcome = "drop", "never lands"
        text = f"late write of {held.call.machine}: {describe(held.call, self.short)} -> {outcome}"
        self.history.events.append(Event(self.step, "-", kind, text, held.call.key))

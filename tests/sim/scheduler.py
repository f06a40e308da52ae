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

Clock faults (issue 27): the reply to a request carries a ``Date`` that is
off, observed by that machine's own ``StoreClock`` (``Slot.clock``) exactly
at the request, as the store's real ``Date`` would be, while every other
reply brings an honest one.  Kinds (``CLOCK_KINDS``), each started now and
then by a request with the clock's own seeded RNG: one reply off (+-100 s,
+-120 s, +-1 h); every reply of the rest of one op off by the same amount;
a jump of +-1 h for 1-4 replies; replicas disagreeing (replies alternately
+d and -d, d of 2 s, 30 s or 1 h); and, for a whole history, one "replica"
of the store that is constantly 2 s off (every Nth reply of a machine).
No machine ever sees ``RESTART_AFTER`` agreeing shifted replies in a row (an
honest one is put between): that would be a clock that really stepped,
which ``clock.py`` follows by design, and a store whose clock steps is not
what these faults are.

Time faults (issue 44): the world's time moves on, at once, by more than the
workload's half-hour lapse (``jump_minutes``; ``simtime`` moves the store's
``Date`` replies, its listings' times and every machine's clocks alike), at
most ``jumps`` times a history, each its own step (``History.jumps``), drawn
by their own seeded RNG (a seed's schedule is what it was until one comes):

* a *long pause* of one machine (a SIGSTOP, a VM stall, a swap storm): it
  stops where it is (between ops, or at a gate, its request's time check
  passed: it is sent on waking); the others finish the ops they are in; the
  time jumps; the others run for ``long_pause_steps`` while it stays stopped.
  The sleeper is a machine that believes it holds a lease or, half the time
  when there is one, a machine stopped at a write (its op's earlier writes
  in the store, the rest to land after the jump);
* a *stall* of the store (the fault proxy's ``Stall``): the time jumps with
  every machine where it is, each gated request answered after it.

When a machine believes it holds a lease (``Workload.holds``: a take or renew
told so), the jump gives another machine, first thing, a take of that lease
by the other holder at the half-hour lapse, and the believer, first thing,
its renew and end: the takeover a pause allows, and what the sleeper must be
told on waking (``lost``; an end that leaves the new holder's lease alone).
Every machine but the sleeper is also given a ``job_next`` (after the take):
the index's judgment of every entry the jump made old, a sleeper's included
whose record is yet to land (``jobs.waiting-indexed`` judges what follows).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faults.backend import Call, Fault, Limbo

from cloudstore.clock import RESTART_AFTER, StoreClock

from .history import Event, History
from .simtime import SimTime

IDLE, GATE, RUNNING, DONE = "idle", "gate", "running", "done"
START = "start"
ABORT = "abort"
WRITE_FAULTS = (Fault.FAIL_BEFORE, Fault.LOSE_REPLY, Fault.LOSE_REPLY, Fault.LAND_LATE)
#: The kinds of clock fault (see the module's docstring); each shifted reply is counted as "date <kind>".
CLOCK_KINDS = ("reply", "op", "jump", "disagree", "replica")
ONE_REPLY_SHIFTS = (100.0, -100.0, 120.0, -120.0, 3600.0, -3600.0)
OP_SHIFTS = (100.0, -100.0, 120.0, 3600.0)
DISAGREE_SHIFTS = (2.0, 30.0, 3600.0)


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
    clock_rate: float = 0.15  # a request with a reply starts a clock fault of this machine (CLOCK_KINDS)
    replica_rate: float = 0.3  # a machine meets, for the whole history, a replica constantly 2 s off
    #: A conditional write reaches the store without its precondition (Fault.STRIP: a server that ignores
    #: them).  0 in every run that checks the drivers: no driver can keep a promise there, and the server
    #: check (server_check.py) is made once per process, not per request.  Above 0 it proves the checker
    #: sees what such a server does (tests/test_simulation.py).
    strip_rate: float = 0.0
    long_pause_rate: float = 0.003  # a step starts a long pause of a machine (module docstring)...
    stall_rate: float = 0.0015  # ...or a stall of the store
    jump_minutes: tuple[float, float] = (31.0, 50.0)  # past the half-hour lapse; under jobs' TOMBSTONE_MS hour
    jumps: int = 1  # at most, per history: the store's time stays within the hour a tombstone is kept
    long_pause_steps: tuple[int, int] = (4, 16)  # steps the others run after the jump while the sleeper sleeps
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
    clock: StoreClock | None = None  # this machine's own store clock: where shifted Dates are observed
    ops: int = 0  # ops started, so that a clock fault of "one op" knows when its op is over
    skew: ClockSkew | None = None  # the clock fault under way, if any
    replica: tuple[int, float] | None = None  # (every nth reply, seconds off) for the whole history
    replies: int = 0  # replies this machine observed
    agreeing: tuple[float, int] = (0.0, 0)  # (shift, how many replies in a row were shifted by it)
    work: Any = None  # its Workload: the leases it believes it holds, and requests put first


@dataclass
class ClockSkew:
    """One clock fault of one machine: the shifts of its next replies."""

    kind: str
    shifts: list[float]  # for the next replies, in order ("op": the first repeated while the op lasts)
    op: int = 0  # "op": the op it belongs to


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
                 short: Callable[[str], str] = lambda key: key, sim: SimTime | None = None) -> None:
        self.rng = random.Random(f"schedule:{seed}")
        self.clock_rng = random.Random(f"clock:{seed}")  # its own: the schedule of a seed stays what it was
        self.time_rng = random.Random(f"time:{seed}")  # the same for long pauses and stalls
        self.sim = sim or SimTime()
        self.sleeper: Slot | None = None  # the machine in a long pause, until the time has jumped
        self.limbo = limbo
        self.history = history
        self.knobs = knobs
        self.short = short
        self.lock = threading.Lock()
        self.idle_all = threading.Condition(self.lock)
        self.slots: list[Slot] = []
        self.step = 0
        self.tally = Tally()

    def slot(self, name: str, clock: StoreClock | None = None) -> Slot:
        """A machine's place in the schedule; its own ``clock`` observes each reply's Date (clock faults)."""
        slot = Slot(name, threading.Condition(self.lock), clock=clock)
        if clock is not None and self.clock_rng.random() < self.knobs.replica_rate:
            slot.replica = (self.clock_rng.randint(2, 6), self.clock_rng.choice((2.0, -2.0)))
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
                    if self.sleeper is not None:
                        self._drain(live)
                        continue
                    ready = [s for s in live if s.paused_until <= self.step]
                    slot = self.rng.choice(ready or live)
                    if self._time_fault(live):
                        continue
                    if self.rng.random() < self.knobs.pause_rate and len(ready) > 1:
                        self._pause(slot)
                        continue
                    if slot.state == IDLE:
                        slot.grant = START
                        slot.ops += 1
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
        elif knobs.strip_rate and call.is_write and rng.random() < knobs.strip_rate:  # no draw when 0: seeds replay
            fault = Fault.STRIP
        elif rng.random() < knobs.fault_rate:
            fault = rng.choice(WRITE_FAULTS) if call.is_write else Fault.FAIL_BEFORE
        else:
            fault = Fault.NONE
        if fault is not Fault.NONE:
            self.tally.faults[fault.value] += 1
            if call.is_write and rng.random() < knobs.pause_after_fault:
                self._pause(slot)
        text = f"{describe(call, self.short)} -> {fault.value}"
        if fault in (Fault.NONE, Fault.THROTTLE, Fault.STRIP):  # a reply comes back, with the store's Date
            shift = self._date(slot)
            if shift:
                text += f", Date {shift:+g} s"
        reached = call.is_write and fault not in (Fault.FAIL_BEFORE, Fault.THROTTLE)  # STRIP: it reached
        self.history.events.append(Event(self.step, slot.name, "call", text, call.key, reached))
        return fault

    def _date(self, slot: Slot) -> float:
        """The Date of this reply, seconds off (0: honest), as the seed says; observed by the machine's clock.

        The reply is observed before the request runs (the scheduler's thread, every machine stopped):
        to the clock that is the same as the reply having carried that Date.
        """
        if slot.clock is None:
            return 0.0
        rng, knobs = self.clock_rng, self.knobs
        slot.replies += 1
        if slot.skew is not None and (slot.skew.kind == "op" and slot.skew.op != slot.ops
                                      or slot.skew.kind != "op" and not slot.skew.shifts):
            slot.skew = None
        if slot.skew is None and rng.random() < knobs.clock_rate:
            slot.skew = self._skew(slot)
        kind, shift = "", 0.0
        if slot.skew is not None:
            kind = slot.skew.kind
            shift = slot.skew.shifts[0] if kind == "op" else slot.skew.shifts.pop(0)
        elif slot.replica is not None and slot.replies % slot.replica[0] == 0:
            kind, shift = "replica", slot.replica[1]
        same, run = slot.agreeing
        if shift and shift == same and run + 1 >= RESTART_AFTER:
            shift = 0.0  # an honest reply between: never a clock that really stepped (module docstring)
        slot.agreeing = (shift, run + 1 if shift == same else 1) if shift else (0.0, 0)
        now = self.sim.time()
        if shift:
            self.tally.faults[f"date {kind}"] += 1
            slot.clock.observe(now, now, now + shift, 1.0)
        else:
            slot.clock.observe(now, now, float(int(now)), 1.0)  # the store's Date: whole seconds
        return shift

    def _skew(self, slot: Slot) -> ClockSkew:
        rng = self.clock_rng
        kind = rng.choice(CLOCK_KINDS[:-1])
        if kind == "reply":
            return ClockSkew(kind, [rng.choice(ONE_REPLY_SHIFTS)])
        if kind == "op":
            return ClockSkew(kind, [rng.choice(OP_SHIFTS)], op=slot.ops)
        if kind == "jump":
            return ClockSkew(kind, [rng.choice((3600.0, -3600.0))] * rng.randint(1, RESTART_AFTER - 1))
        d = rng.choice(DISAGREE_SHIFTS)
        first = rng.choice((1.0, -1.0))
        return ClockSkew(kind, [d * first * (-1) ** i for i in range(rng.randint(2, 12))])

    def _pause(self, slot: Slot) -> None:
        slot.paused_until = self.step + self.rng.randint(*self.knobs.pause_steps)

    # -- time faults (the module's docstring)

    def _time_fault(self, live: list[Slot]) -> bool:
        """Whether this step starts a long pause (of a machine that believes it holds a lease, or of one
        stopped at a write) or a stall."""
        knobs = self.knobs
        if len(self.history.jumps) >= knobs.jumps:
            return False
        draw = self.time_rng.random()
        believers = [s for s in live if s.work is not None and s.work.holds]
        writers = [s for s in live if s.state == GATE and s.call is not None and s.call.is_write]
        if draw < knobs.long_pause_rate and len(live) > 1 and (believers or writers):
            # A pause that may cost a lease, or, as often, one where it hurts most: at a write whose time
            # check passed, an op's earlier writes already in the store (an index entry before its record).
            pick = writers if writers and (not believers or self.time_rng.random() < 0.5) else believers
            self.sleeper = self.time_rng.choice(pick)
            self.history.events.append(Event(self.step, self.sleeper.name, "pause", "stops: a long pause begins"))
            return True
        if knobs.long_pause_rate <= draw < knobs.long_pause_rate + knobs.stall_rate:
            self._jump(live, None)
            return True
        return False

    def _drain(self, live: list[Slot]) -> None:
        """While a machine sleeps: let the others finish the ops they are in, then jump."""
        busy = [s for s in live if s is not self.sleeper and s.state == GATE]
        if not busy:
            self._jump(live, self.sleeper)
            return
        slot = self.rng.choice(busy)
        assert slot.call is not None
        slot.grant = self._fault(slot, slot.call)
        slot.state = RUNNING
        slot.wake.notify()

    def _jump(self, live: list[Slot], sleeper: Slot | None) -> None:
        """The world's time moves on (every machine stopped); a lease believed held meets a taker."""
        rng = self.time_rng
        minutes = rng.uniform(*self.knobs.jump_minutes)
        self.sim.jump(minutes * 60)
        self.history.jumps.append(self.step)
        kind = "long pause" if sleeper is not None else "stall"
        self.tally.faults[kind] += 1
        text = (f"sleeps through {minutes:.1f} min" if sleeper is not None
                else f"the store stalls {minutes:.1f} min")
        believers = [sleeper] if sleeper is not None else [s for s in live if s.work is not None and s.work.holds]
        believer = rng.choice(believers) if believers else None
        takers = [s for s in live if s is not believer and s.work is not None]
        if believer is not None and believer.work is not None and believer.work.holds and takers:
            key = rng.choice(sorted(believer.work.holds))
            (agent, holder), thread = believer.work.holds[key], key[1]
            taker = rng.choice(takers)
            taker.work.contend(agent, thread, holder)
            believer.work.resume(agent, thread, holder)
            text += f"; {taker.name} will take {agent['id']}/{thread} from {holder}, {believer.name} renew and end it"
        for other in (s for s in live if s is not sleeper and s.work is not None):
            other.work.look()
        self.history.events.append(Event(self.step, sleeper.name if sleeper is not None else "-", "jump", text))
        if sleeper is not None:
            sleeper.paused_until = self.step + rng.randint(*self.knobs.long_pause_steps)
            self.sleeper = None

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

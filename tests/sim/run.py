"""One seeded history on a real backend, checked; and many of them, summed up.

A history: 2-3 machines (``machines``), each running its workload
(``workload``) in a thread of its own under the seeded scheduler
(``scheduler``); then the writes still held land or are lost, as the seed
says; then a fault-free reader reads the state of every object an op touched;
then the checker (``invariants``) judges the whole history.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from faults.backend import Limbo

from cloudstore.generations import Backend, RetryingStore

from .history import History
from .invariants import Violation, check
from .machines import POLICY, ConditionalDeletes, OwnClock, answerer_on, seeded
from .scheduler import Abort, Knobs, Scheduler, Tally
from .simtime import SimTime
from .workload import AGENTS, LONG_LAPSE_MS, PATHS, PLACES, THREADS, Workload


@dataclass
class Outcome:
    """One history and what the checker made of it."""

    history: History
    violations: list[Violation]
    tally: Tally
    knobs: dict
    undecided: int = 0

    @property
    def ops(self) -> int:
        return sum(op.machine != "final" for op in self.history.ops)


def final_requests(history: History) -> list[dict]:
    """What a fault-free reader asks once everything has settled: the state of every object an op touched."""
    touched = {(op.agent, op.name, op.arg("thread"), op.arg("path")) for op in history.ops}
    out: list[dict] = []
    for agent in AGENTS:
        ask = lambda op, **args: out.append({"op": op, "agent": dict(agent), **args})  # noqa: E731, B023 (used in this iteration only)
        ops = {(name, thread, path) for who, name, thread, path in touched if who == agent["id"]}
        for thread in THREADS:
            if ops & {(name, thread, None) for name in ("append", "remove")}:
                ask("read", thread=thread, first=1)
            if ("tools_narrow", thread, None) in ops:
                ask("tools_read", thread=thread)
        if {name for name, _, _ in ops} & {"take", "renew", "end", "remove"}:
            ask("leases", lapse_ms=LONG_LAPSE_MS)
        for path in PATHS:
            if {name for name, _, p in ops if p == path} & {"file_write", "file_append", "file_remove"}:
                ask("file_read", path=path)
        if {name for name, _, _ in ops} & {"job_put", "job_shift", "job_remove", "job_mark"}:
            for place in PLACES:
                ask("job_list", place=place)
            ask("job_mark")
    out.append({"op": "job_next", "agent": dict(AGENTS[0])})
    out.append({"op": "job_due", "agent": dict(AGENTS[0]), "limit": 1000})  # the runner's view of the due index
    return out


def run_history(seed: int, backend: str, inner: Backend, prefix: str, knobs: Knobs = Knobs(),
                ops_per_machine: tuple[int, int] = (16, 24)) -> Outcome:
    """One seeded history on ``inner`` below ``prefix`` (fresh), checked."""
    history = History(seed, backend)
    limbo = Limbo()
    shape = random.Random(f"shape:{seed}")
    count = shape.choice((2, 3, 3))
    sim = SimTime()
    sched = Scheduler(seed, limbo, history, knobs, short=lambda key: key[len(prefix):], sim=sim)
    with seeded(seed, sim) as patched:
        threads = []
        for i in range(count):
            name = f"m{i}"
            faulty = OwnClock(inner, name, limbo=limbo, sim=sim)
            slot = sched.slot(name, faulty.clock)
            faulty.plan = lambda call, slot=slot: sched.gate(slot, call)
            answer = answerer_on(RetryingStore(faulty, POLICY), prefix, random.Random(f"together:{seed}:{name}"))
            work = slot.work = Workload(seed, name)
            n_ops = shape.randint(*ops_per_machine)
            threads.append(threading.Thread(target=_machine, args=(sched, slot, answer, work, n_ops, history),
                                            name=f"sim-{seed}-{name}", daemon=True))
        for t in threads:
            t.start()
        try:
            sched.run()
        finally:
            for t in threads:
                t.join(timeout=30)
        sched.settle()
        answer = answerer_on(RetryingStore(OwnClock(inner, "final", sim=sim), POLICY), prefix, scheduler_ops=True)
        for request in final_requests(history):
            sched.step += 1
            history.add("final", request, answer(request), sched.step, sched.step)
    violations, undecided = check(history)
    return Outcome(history, violations, sched.tally, patched, undecided)


def _machine(sched: Scheduler, slot: Any, answer: Callable[[dict], dict], work: Workload, n_ops: int,
             history: History) -> None:
    try:
        done = 0
        while done < n_ops or work.queued:  # what the scheduler put first is sent even after its own ops
            done += 1
            sched.wait_start(slot)
            request = work.next_request()
            start = sched.step
            reply = answer(request)
            history.add(slot.name, request, reply, start, sched.step)
            work.observe(request, reply)
    except Abort:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported with the history
        history.crashes.append(f"{slot.name}: {type(exc).__name__}: {exc}")
    finally:
        sched.finish(slot)


@dataclass
class Summary:
    """Many histories on one backend."""

    backend: str
    base: int
    outcomes: list[Outcome] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)
    seconds: float = 0.0

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.tally.add(outcome.tally)

    @property
    def ops(self) -> int:
        return sum(o.ops for o in self.outcomes)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.violations or o.history.crashes]

    def line(self) -> str:
        seeds = [o.history.seed for o in self.outcomes]
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.tally.faults.items()))
        violations = sum(len(o.violations) for o in self.outcomes)
        undecided = sum(o.undecided for o in self.outcomes)
        return (f"simulation[{self.backend}]: {len(self.outcomes)} histories, {self.ops} ops, "
                f"{self.tally.steps} steps, "
                f"faults: {faults or 'none'}, late writes landed {self.tally.landed} (lost {self.tally.dropped}), "
                f"seeds {seeds[0]}..{seeds[-1]} (base {self.base}), {self.seconds:.1f} s, "
                f"violations {violations} in {len(self.failed)} histories"
                + (f", {undecided} model checks undecided" if undecided else ""))


def report(summary: Summary, replay: Callable[[int], str], most: int = 3) -> str:
    """What a failed run prints: per invariant broken, its seeds, the first violation (for the first ``most``
    invariants with the op and an excerpt of its history) and the command that replays it."""
    broken: dict[str, list[tuple[Outcome, Violation]]] = {}
    for o in summary.outcomes:
        for v in o.violations:
            broken.setdefault(v.invariant, []).append((o, v))
    lines = [f"seed {o.history.seed}: a machine crashed: {crash}\n  replay: {replay(o.history.seed)}"
             for o in summary.failed for crash in o.history.crashes]
    for n, name in enumerate(sorted(broken, key=lambda name: name.startswith("model."))):
        seeds = sorted({o.history.seed for o, _ in broken[name]})
        first, v = broken[name][0]
        seed = first.history.seed
        more = " ..." if len(seeds) > 12 else ""
        lines.append(f"== {name}: {len(broken[name])} violations in seeds {seeds[:12]}{more}")
        if n < most:
            lines.append(f"seed {seed} ({summary.backend}), {v.render(first.history)}")
        else:
            lines.append(f"  first: seed {seed}, {v.invariant}: {v.message}")
        lines.append(f"  replay: {replay(seed)}")
    return "\n".join(lines)


def run_many(backend: str, inner: Backend, prefix: str, base: int, min_ops: int, histories: int | None = None,
             knobs: Knobs = Knobs()) -> Summary:
    """Histories of seeds base, base+1, ... until ``min_ops`` ops were run (or exactly ``histories`` of them)."""
    summary = Summary(backend, base)
    if backend == "gcs":
        inner = ConditionalDeletes(inner)  # type: ignore[assignment]
    started = time.perf_counter()
    seed = base
    while (len(summary.outcomes) < histories) if histories else (summary.ops < min_ops):
        try:
            outcome = run_history(seed, backend, inner, f"{prefix}s{seed}-{len(summary.outcomes)}/", knobs)
        except Exception as exc:  # a stuck scheduler, a harness error: said with the seed that replays it
            raise RuntimeError(f"simulation[{backend}] seed {seed} (base {base}): {type(exc).__name__}: {exc}") from exc
        summary.add(outcome)
        seed += 1
    summary.seconds = time.perf_counter() - started
    return summary

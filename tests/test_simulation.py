"""Issue 10: a deterministic simulation that looks for broken promises by itself.

Many seeded histories per backend (local folder, moto, fake-gcs-server, SeaweedFS):
2-3 machines, each its own ``Service`` with its own caches and retries, on
one real store; a seeded scheduler runs one request at a time, loses replies,
fails requests, lands writes late; a seeded workload collides on a small key
space; a checker (``tests/sim/invariants.py``) judges every history by
wire.md.  See ``tests/sim/`` for the parts.

Every run also meets clock faults (issue 27, ``sim/scheduler.py``): replies
whose ``Date`` is off, observed by the one machine's own store clock at the
request (one reply, every reply of one op, a jump of an hour, replicas that
disagree, one replica constantly 2 s off); the faults by kind ("date ...")
are on the summary line.  The workload's 30-minute lapses make a takeover a
shifted reply brought forward a violation, as the purge of a removed epoch
and the orphan check of a due entry already are.

And time faults (issue 44, ``sim/scheduler.py``, ``sim/simtime.py``): a long
pause of one machine (a SIGSTOP) or a stall of the store moves the world's
time on past the half-hour lapse; a machine that believed it held a lease
meets a taker, and must then be told ``lost`` by its renew, and its end must
leave the new holder's lease alone (``lease.one-holder`` and the lease model
judge it); the "long pause" and "stall" counts are on the summary line.  A
long pause stops, as often, a machine at a write (its op's earlier writes in
the store), and every other machine sends a ``job_next`` first after the jump:
a put stopped between its due entry and its record must not leave its job
waiting unindexed (``jobs.waiting-indexed``, against the final ``job_due``).

Seeds are ``base``, ``base + 1``, ... with ``base`` printed on each summary
line; set ``CLOUDSTORE_SIM_SEED`` to choose it (a failure prints the command
that replays its seed alone) and ``CLOUDSTORE_SIM_HISTORIES`` to run exactly
that many histories instead of enough for ``MIN_OPS`` operations.
"""

from __future__ import annotations

import json
import logging
import os
import random
from typing import Any

import pytest
from sim.history import History
from sim.invariants import check
from sim.run import report, run_history, run_many
from sim.scheduler import Knobs
from sim.workload import HALF_HOUR_LAPSE_MS
from support import location_of

from cloudstore.settings import Location, open_backend

#: Operations per backend per run (CI): the folder runs about 700 a second, the emulators 50-150, so
#: the folder takes the most histories for the same time.  SeaweedFS (a real server whose keys are
#: paths) ran 1,000 ops in 28 s on 2 idle cores.  On the emulators the histories search what the
#: folder's do not (each backend's own requests under the same faults), so fewer suffice: 2,000 ops
#: on fake-gcs-server took 140 s of a loaded CI run; 1,000 still draw every op and fault kind
#: many times over, and each run's seeds are new.
MIN_OPS = {"file": 10_000, "moto": 1200, "gcs": 1000, "seaweedfs": 1000}
SEED_VARIABLE = "CLOUDSTORE_SIM_SEED"
HISTORIES_VARIABLE = "CLOUDSTORE_SIM_HISTORIES"
BASE = int(os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(1, 10**6))


def replay(backend: str) -> Any:
    return lambda seed: (f"{SEED_VARIABLE}={seed} {HISTORIES_VARIABLE}=1 "
                         f"python -m pytest tests/test_simulation.py -k {backend}")


@pytest.mark.slow  # thousands of ops per backend; the fast loop keeps one seeded history, replayed (below)
def test_simulation(store_env: Any, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    store = store_env
    caplog.set_level(logging.CRITICAL, logger="cloudstore")  # internal errors are reported as violations, once
    location = location_of(store)
    histories = int(os.environ.get(HISTORIES_VARIABLE) or 0) or None
    summary = run_many(store.backend, open_backend(location), location.prefix, BASE, MIN_OPS[store.backend], histories)
    with capsys.disabled():
        print("\n" + summary.line())
    if summary.failed:
        pytest.fail(f"{summary.line()}\n{report(summary, replay(store.backend))}", pytrace=False)


#: A long pause in nearly every history (of a machine that believes it holds a lease), the other faults as usual.
PAUSES = Knobs(long_pause_rate=0.05, stall_rate=0.0)


@pytest.mark.parametrize("knobs", [Knobs(), PAUSES], ids=["faults", "long-pauses"])
def test_a_seed_replays_the_same_history(tmp_path: Any, knobs: Knobs) -> None:
    """The whole history, every request, fault and reply, is a function of the seed (a jump of the world's
    time included)."""
    inner = open_backend(Location("file", str(tmp_path), ""))

    def reply(op: Any, prefix: str) -> str:
        if op.name == "leases":  # the times a lease was taken are the clock's, not the seed's
            return json.dumps([(lease["thread"], lease["holder"]) for lease in op.reply["leases"]])
        return json.dumps(op.reply).replace(prefix, "")

    def trace(seed: int, prefix: str) -> list[Any]:
        h = run_history(seed, "file", inner, prefix, knobs).history
        return [(op.machine, op.request, reply(op, prefix), op.start, op.end, op.epochs) for op in h.ops] + [
            (ev.step, ev.machine, ev.kind, ev.text) for ev in h.events]

    def jumped(trace: list[Any]) -> bool:
        return any(event[2] == "jump" for event in trace if len(event) == 4)

    seed, one = BASE, trace(BASE, "one/")
    while knobs is PAUSES and not jumped(one) and seed < BASE + 20:  # a history where nobody held a lease has none
        seed += 1
        one = trace(seed, f"one-{seed}/")
    assert knobs is not PAUSES or jumped(one), f"no jump of the world's time in seeds {BASE}..{seed}"
    assert one == trace(seed, "two/")


def takeovers(outcome: Any) -> list[tuple[Any, Any]]:
    """(take, renew) pairs of a history: a take at the half-hour lapse told ``lapsed`` after a jump of the
    world's time, and a later renew by the holder it took the lease from, told ``lost``."""
    h = outcome.history
    out = []
    for take in h.of("take"):
        if not (take.ok and take.reply["took"] == "lapsed" and take.arg("lapse_ms") == HALF_HOUR_LAPSE_MS):
            continue
        for renew in h.of("renew"):
            if (renew.start > take.end and renew.agent == take.agent and renew.arg("thread") == take.arg("thread")
                    and renew.arg("holder") != take.arg("holder") and renew.reply == {"reply": "lost"}):
                out.append((take, renew))
                break
    return out


SLEEPERS = range(4425, 4437)  # seeds whose long pauses, at PAUSES, cost a sleeper its lease (below)


def test_a_long_pause_lets_another_take_the_lease_and_the_sleeper_is_told(tmp_path: Any,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A machine that believed it held a lease sleeps through more than its lapse: another takes it over
    (``lapsed``), the sleeper's renew on waking answers ``lost``, its end leaves the new lease alone, and the
    checker finds every promise kept (``lease.one-holder``, the lease model)."""
    caplog.set_level(logging.CRITICAL, logger="cloudstore")
    inner = open_backend(Location("file", str(tmp_path), ""))
    found = {seed: run_history(seed, "file", inner, f"s{seed}/", PAUSES) for seed in SLEEPERS}
    assert {seed: [v.render(o.history) for v in o.violations] for seed, o in found.items() if o.violations} == {}
    slept = [seed for seed, o in found.items() if o.tally.faults["long pause"]]
    taken = [seed for seed, o in found.items() if takeovers(o)]
    assert len(slept) >= len(SLEEPERS) // 2 and len(taken) >= 3, f"long pauses in {slept}, a lease taken in {taken}"


def test_the_checker_flags_a_sleeper_that_still_holds_its_lease_on_waking(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A renew that does not look at the holder (a sleeper that trusts what it remembers) is told ``done``
    after another took the lease over: two holders at once, flagged the same way from the same seed."""
    from cloudstore.store import leases

    def renew_blindly(self: Any, agent: Any, thread: str, holder: str) -> bool:
        def change(head: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            return {**head, "holder": holder, "renewed": self.clock.now_ms()}, True

        return bool(self.heads.update(self.space.keys(agent), thread, change, cached=True))

    caplog.set_level(logging.CRITICAL, logger="cloudstore")
    monkeypatch.setattr(leases.Leases, "renew", renew_blindly)
    inner = open_backend(Location("file", str(tmp_path), ""))
    found = {seed: run_history(seed, "file", inner, f"s{seed}/", PAUSES) for seed in SLEEPERS}
    flagged = [seed for seed, o in found.items() if any(v.invariant == "lease.one-holder" for v in o.violations)]
    assert flagged, "no sleeper's blind renew was flagged"
    again = run_history(flagged[0], "file", inner, "again/", PAUSES)
    assert sorted(v.invariant for v in again.violations) == sorted(v.invariant for v in found[flagged[0]].violations)


#: Seeds whose long pauses, at PAUSES, stop a put into waiting between its due entry and its record while
#: another machine's job_next meets the entry (issue 44): every one flagged in 900 histories (1000-1299, 20000-20599).
UNINDEXED = (1013, 1023, 1089, 20089, 20171, 20242, 20249, 20595)


def test_a_put_stopped_past_grace_before_its_record_is_flagged_unless_it_writes_its_entry_again(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A put that does not write its entry again after a long pause (a98876f's: ``Jobs._keep_entry`` a no-op)
    leaves its job waiting with no entry once another machine's job_next deleted the entry as a leftover: the
    checker flags it (``jobs.waiting-indexed``), the same way from the same seed.  Today's put keeps every
    promise in the same histories.  (Measured: with the no-op, 5 of 600 histories at PAUSES and 1 of 600 at
    the default knobs were flagged; none with the put as it is.)"""
    from cloudstore.store import jobs

    caplog.set_level(logging.CRITICAL, logger="cloudstore")
    inner = open_backend(Location("file", str(tmp_path), ""))
    kept = {seed: run_history(seed, "file", inner, f"k{seed}/", PAUSES) for seed in UNINDEXED}
    assert {seed: [v.render(o.history) for v in o.violations] for seed, o in kept.items() if o.violations} == {}
    monkeypatch.setattr(jobs.Jobs, "_keep_entry", lambda self, indexed: None)
    found = {seed: run_history(seed, "file", inner, f"s{seed}/", PAUSES) for seed in UNINDEXED}
    flagged = [seed for seed, o in found.items() if any(v.invariant == "jobs.waiting-indexed" for v in o.violations)]
    assert len(flagged) >= len(UNINDEXED) // 2, f"flagged only {flagged}"
    again = run_history(flagged[0], "file", inner, "again/", PAUSES)
    assert sorted(v.invariant for v in again.violations) == sorted(v.invariant for v in found[flagged[0]].violations)


def test_the_checker_accepts_a_race_and_flags_a_lost_own_write() -> None:
    """Two appenders of seq 1 at once, one done and one taken, is a promise kept; a taken whose event is
    stored is not."""
    agent = {"id": "a0", "owner": "o"}

    def history(second_reply: dict, stored: list[str]) -> History:
        h = History(0, "none")
        for machine, tag, reply, start, end in (("m0", "m0.1", {"reply": "done"}, 1, 4),
                                                 ("m1", "m1.1", second_reply, 2, 5)):
            event = {"seq": 1, "tag": tag}
            h.add(machine, {"op": "append", "agent": agent, "thread": "t0", "event": event}, reply, start, end)
        events = [{"seq": 1, "tag": tag} for tag in stored]
        h.add("final", {"op": "read", "agent": agent, "thread": "t0", "first": 1},
              {"reply": "events", "events": events}, 6, 6)
        return h

    assert check(history({"reply": "taken", "last": 1}, ["m0.1"]))[0] == []
    found = {v.invariant for v in check(history({"reply": "taken", "last": 1}, ["m1.1"]))[0]}
    assert {"conv.taken-own-write", "conv.owns-seq", "model.conversations"} <= found


def test_the_checker_sees_what_a_server_ignoring_preconditions_does(tmp_path: Any,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The strip fault (a conditional write applied as an overwrite: a server that ignores preconditions)
    breaks promises no driver can keep there, and the checker flags them, the same way from the same seed.

    So the simulation would see such a server, were the server check (server_check.py, once per process)
    ever to let one through; the drivers' own runs keep ``strip_rate`` at 0."""
    caplog.set_level(logging.CRITICAL, logger="cloudstore")
    inner = open_backend(Location("file", str(tmp_path), ""))
    knobs = Knobs(strip_rate=0.6, fault_rate=0.0, outage_rate=0.0, throttle_rate=0.0, land_rate=0.0,
                  clock_rate=0.0, replica_rate=0.0, pause_rate=0.0)
    seeds = [7001 + n for n in range(6)]
    found = {seed: run_history(seed, "file", inner, f"s{seed}/", knobs) for seed in seeds}
    flagged = [seed for seed, outcome in found.items() if outcome.violations]
    assert flagged, "no history on a server that ignores preconditions was flagged"
    assert all(found[seed].tally.faults["strip"] for seed in seeds)
    again = run_history(flagged[0], "file", inner, "again/", knobs)
    assert sorted(v.invariant for v in again.violations) == sorted(v.invariant for v in found[flagged[0]].violations)

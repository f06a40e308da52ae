"""The runner's claim in one op (``job_claim`` with its lease): what it answers, under races and faults.

A runner claims a due job by taking the job's claim lease (the conversation
lease ``job:<id>``) and moving the job from waiting to firing.  Through its
own driver both happen in one ``job_claim`` (``Jobs.claim``): the lease, the
record's read and a new mark at once, then the record written, only with the
lease ours.  The promises it must keep whatever happens:

* exactly one claimer of a waiting job gets it; every other is told ``held``
  naming the winner, or nothing to fire;
* a job in firing always has its claimer's lease (the lease came first), so
  no runner can take it before that lease lapses;
* a claimer is never told ``held`` or "nothing to fire" about its own write:
  a lease or a record whose write landed with its reply lost is its own;
* the mark moves whenever waiting changed, and ``job_next`` is never later
  than a waiting job's due;
* with nothing to fire the lease is let go, and a job due later than
  ``not_after`` is not moved.

Here on the local folder, moto and fake-gcs-server: the op's answers,
processes racing one job (released together), explicit lost replies, and
seeded histories of three machines with faults on every request, each
checked against those promises (replay one with its seed).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from faults.backend import Fault
from faults.machines import Machine, Machines, between, in_order, write_to
from sim.machines import SeededSidePool
from support import Session, fresh_agent, race, serving

from cloudstore.protocol import validate as v
from cloudstore.protocol.service import Service
from cloudstore.store.jobs import LATE_RECORD_WAITS

Json = Any
JOB_ID = "claimed-job"
THREAD = "job:" + JOB_ID
LONG_MS = 600_000
DUE = 1_000.0
NOT_AFTER = 2_000_000_000.0
JOB = {"id": JOB_ID, "spec": {"say": "hello"}, "due": DUE}
#: Where the current drivers keep the claim lease and the job record (for plans that pick one write).
LEASE_KEY, RECORD_KEY = "/l/_job%3A" + JOB_ID, "/j/_" + JOB_ID
#: Seeded histories per backend: the folder is fast, the emulators pay real requests.
HISTORIES = {"file": 120, "moto": 30, "gcs": 30}


def claim(holder: str, not_after: float = NOT_AFTER, lapse_ms: int = LONG_MS, job_id: str = JOB_ID) -> dict:
    return {"id": job_id, "thread": "job:" + job_id, "holder": holder, "lapse_ms": lapse_ms, "not_after": not_after}


class Claimed(dict):
    """A ``job_claim`` reply as expected: equal to one with these fields and a fence, a whole number when
    it has a job to fire (the lease's, leases.py), else null, and ``held_ms``, a whole number."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, dict):
            return NotImplemented
        fence = other.get("fence", "absent")
        fenced = type(fence) is int and fence > 0 if self["job"] is not None else fence is None
        held = other.get("held_ms")
        return (fenced and type(held) is int and held >= 0
                and {k: v for k, v in other.items() if k not in ("fence", "held_ms")} == dict(self))

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]


def claimed(job: dict | None, took: str = "took", holder: str | None = None, recovered: bool = False) -> dict:
    return Claimed({"reply": "claimed", "job": job, "took": took, "holder": holder, "recovered": recovered})


def holder_of(s: Any, thread: str = THREAD) -> str | None:
    """Who holds the lease on ``thread`` now (a long lapse: nobody's has lapsed)."""
    held = [lease for lease in s("leases", lapse_ms=LONG_MS)["leases"] if lease["thread"] == thread]
    return held[0]["holder"] if held else None


def where(s: Any, job_id: str = JOB_ID) -> list[str]:
    return [place for place in ("waiting", "firing", "ending") if s("job_get", place=place, id=job_id)["job"]]


@pytest.fixture
def own(store: Any) -> Any:
    """The store as the scheduler's own driver sees it (``LNK_SCHEDULER_OPS=1``)."""
    return replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"})


# --------------------------------------------------------------------------
# What the op answers


def test_a_claim_takes_the_lease_then_moves_the_job_and_its_index_entry_goes(own: Any) -> None:
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        assert s("job_put", place="waiting", job=JOB) == {"reply": "done"}
        mark = s("job_mark")["mark"]
        assert s("job_claim", **claim("runner-A")) == claimed(JOB)
        assert where(s) == ["firing"]
        assert holder_of(s) == "runner-A", "a job in firing must have its claimer's lease"
        assert s("job_mark")["mark"] != mark, "the job left waiting: the mark must move"
        assert s("job_next")["next"] is None, "the claimed job's index entry must be gone by the next request"
        assert s("job_claim", **claim("runner-B")) == claimed(None, "held", "runner-A"), "claimed twice"
        assert where(s) == ["firing"] and holder_of(s) == "runner-A", "a refused claim changed something"


def test_a_claim_of_a_job_not_waiting_lets_its_lease_go(own: Any) -> None:
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        assert s("job_claim", **claim("runner-A")) == claimed(None)
        assert holder_of(s) is None, "nothing to fire: the lease taken for it must be let go"
        s("job_put", place="ending", job=JOB)
        assert s("job_claim", **claim("runner-A")) == claimed(None)
        assert where(s) == ["ending"] and holder_of(s) is None


def test_a_job_due_later_than_not_after_stays_waiting(own: Any) -> None:
    """Replaced with a later due since the runner listed it: not claimed, and not moved and moved back."""
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        s("job_put", place="waiting", job=JOB)
        assert s("job_claim", **claim("runner-A", not_after=DUE - 0.5)) == claimed(None)
        assert where(s) == ["waiting"] and holder_of(s) is None
        assert s("job_next")["next"] == DUE, "the job still waits: its index entry must stay"
        assert s("job_claim", **claim("runner-A", not_after=DUE)) == claimed(JOB), "due exactly at not_after"


def test_a_lease_held_elsewhere_refuses_the_claim_and_names_its_holder(own: Any) -> None:
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        s("job_put", place="waiting", job=JOB)
        assert s("take", thread=THREAD, holder="runner-B", lapse_ms=LONG_MS) == {"reply": "took", "took": "took"}
        assert s("job_claim", **claim("runner-A")) == claimed(None, "held", "runner-B")
        assert where(s) == ["waiting"] and holder_of(s) == "runner-B"


def test_a_lapsed_lease_over_a_job_left_in_firing_answers_that_job_first(own: Any) -> None:
    """Its last runner died firing it: the orphan comes first, and the waiting job stays for later."""
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        orphan = {**JOB, "spec": {"say": "orphan"}}
        s("job_put", place="firing", job=orphan)
        s("job_put", place="waiting", job=JOB)
        assert s("take", thread=THREAD, holder="dead", lapse_ms=LONG_MS)["took"] == "took"
        assert s("job_claim", **claim("runner-A", lapse_ms=0)) == claimed(orphan, "lapsed", recovered=True)
        assert holder_of(s) == "runner-A"
        assert sorted(where(s)) == ["firing", "waiting"]


def test_a_job_id_claimed_again_after_its_lease_ended_is_claimed(own: Any) -> None:
    """The lease head stays after ``end``: a claim guessing a fresh id finds it there, and still takes it."""
    with serving(own, 2) as procs:
        a, b = Session(procs[0], fresh_agent()), None
        b = Session(procs[1], a.agent)  # another process: it remembers no head of this job's lease
        for round_, (s, holder) in enumerate([(a, "runner-A"), (b, "runner-B"), (a, "runner-A"), (a, "runner-C")]):
            job = {**JOB, "spec": {"round": round_}}
            assert s("job_put", place="waiting", job=job) == {"reply": "done"}
            assert s("job_claim", **claim(holder)) == claimed(job), f"round {round_}"
            assert holder_of(s) == holder
            assert s("job_remove", place="firing", id=JOB_ID) == {"reply": "found", "found": True}
            assert s("end", thread=THREAD, holder=holder) == {"reply": "done"}


@pytest.mark.parametrize("bad", [
    {"holder": 5}, {"thread": None}, {"lapse_ms": -1}, {"lapse_ms": 1.5}, {"not_after": "soon"},
    {"not_after": True}, {"not_after": 10**400}, {"id": ""},
])
def test_a_malformed_claim_is_refused_and_changes_nothing(own: Any, bad: dict) -> None:
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        s("job_put", place="waiting", job=JOB)
        mark = s("job_mark")["mark"]
        reply = s("job_claim", **{**claim("runner-A"), **bad})
        assert reply["reply"] == "error", reply
        assert where(s) == ["waiting"] and holder_of(s) is None and s("job_mark")["mark"] == mark


def test_only_the_schedulers_driver_answers_a_claim_with_its_lease(store: Any) -> None:
    with serving(store) as procs:
        s = Session(procs[0], fresh_agent())
        s("job_put", place="waiting", job=JOB)
        refused = s("job_claim", **claim("runner-A"))
        assert refused["reply"] == "error" and "unknown op" in refused["error"]
        assert where(s) == ["waiting"] and holder_of(s) is None


# --------------------------------------------------------------------------
# Processes racing one job, released together


@pytest.mark.parametrize("rounds", [2])
def test_processes_racing_one_job_exactly_one_claims_it_the_rest_are_told_who(own: Any, rounds: int) -> None:
    """Six serve processes claim one job at once, twice (the second time its lease head exists)."""
    with serving(own, 6) as procs:
        agent = fresh_agent()
        s = Session(procs[0], agent)
        for round_ in range(rounds):
            job = {**JOB, "spec": {"round": round_}}
            s("job_put", place="waiting", job=job)
            replies = race(procs, lambda i: {"op": "job_claim", "agent": agent, **claim(f"runner-{i}")})
            winners = [i for i, r in enumerate(replies) if r.get("job") is not None]
            assert len(winners) == 1, f"round {round_}: {len(winners)} claimers got the job: {replies}"
            winner = f"runner-{winners[0]}"
            assert replies[winners[0]] == claimed(job), replies
            for i, reply in enumerate(replies):
                if i != winners[0]:
                    assert reply == claimed(None, "held", winner), f"round {round_}, runner-{i}: {reply}"
            assert where(s) == ["firing"] and holder_of(s) == winner
            s("job_remove", place="firing", id=JOB_ID)
            s("end", thread=THREAD, holder=winner)


# --------------------------------------------------------------------------
# Lost replies: an answer about one's own write is never "held" nor "nothing to fire"


def scheduler(machine: Machine) -> Machine:
    """The machine's driver as the scheduler's own (``job_claim`` answered)."""
    machine.answerer.service = Service(machine.space, scheduler_ops=True)
    return machine


def test_a_lease_written_with_its_reply_lost_is_the_claimers_own(machines: Machines) -> None:
    a, b, reader = scheduler(machines("A")), scheduler(machines("B")), scheduler(machines("reader"))
    reader.ok("job_put", place="waiting", job=JOB)
    b_claims = []
    a.plan(in_order((write_to(LEASE_KEY), between(lambda: b_claims.append(b("job_claim", **claim("runner-B"))),
                                                  then=Fault.LOSE_REPLY))))
    # B's claim runs just before A's lease write lands (its reply lost): B finds the lease free and wins...
    mine = a("job_claim", **claim("runner-A"))
    assert b_claims == [claimed(JOB)], b_claims
    assert mine == claimed(None, "held", "runner-B"), mine
    # ...and the other way round: A's lease write lands first, its reply lost; A must still take it.
    reader.ok("job_remove", place="firing", id=JOB_ID)
    reader.ok("end", thread=THREAD, holder="runner-B")
    reader.ok("job_put", place="waiting", job=JOB)
    a.plan(in_order((write_to(LEASE_KEY), Fault.LOSE_REPLY)))
    assert a("job_claim", **claim("runner-A")) == claimed(JOB)
    assert holder_of(reader) == "runner-A" and where(reader) == ["firing"]


def test_a_record_written_with_its_reply_lost_still_answers_the_job(machines: Machines) -> None:
    a, reader = scheduler(machines("A")), scheduler(machines("reader"))
    reader.ok("job_put", place="waiting", job=JOB)
    mark = reader.ok("job_mark")["mark"]
    a.plan(in_order((write_to(RECORD_KEY), Fault.LOSE_REPLY)))
    assert a("job_claim", **claim("runner-A")) == claimed(JOB), "its own record write must not read as gone"
    assert where(reader) == ["firing"] and holder_of(reader) == "runner-A"
    assert reader.ok("job_mark")["mark"] != mark and reader.ok("job_next")["next"] is None


@pytest.mark.parametrize("missed", range(1, len(LATE_RECORD_WAITS) + 1))
def test_a_claim_that_read_before_the_puts_record_landed_reads_again_and_claims_it(machines: Machines,
                                                                                  missed: int) -> None:
    """A put writes the job's due entry, then the mark, then its record: a runner that listed the entry
    at once can read the record before it lands (measured: twice, at 20 ms round trips).  The claim
    reads again, waiting a little longer each time, and fires the job under the lease it took;
    letting the lease go and taking it again for the same job was three writes of one object within
    a second, the third refused by GCS (issue 26)."""
    a, putter, reader = scheduler(machines("A")), scheduler(machines("putter")), scheduler(machines("reader"))
    lease_writes: list[str] = []

    def record_read(call: Any) -> bool:
        return call.op == "get" and call.key.endswith(RECORD_KEY)

    def count_lease_writes(call: Any) -> Fault:
        if call.is_write and call.key.endswith(LEASE_KEY):
            lease_writes.append(call.op)
        return plan(call)

    # The first ``missed`` reads of the record find nothing; the put lands just before the next is sent.
    plan = in_order(*[(record_read, Fault.NONE)] * missed,
                    (record_read, between(lambda: putter.ok("job_put", place="waiting", job=JOB))))
    a.plan(count_lease_writes)
    assert a("job_claim", **claim("runner-A")) == claimed(JOB)
    assert where(reader) == ["firing"] and holder_of(reader) == "runner-A"
    assert lease_writes == ["put"], "the lease was written once: taken, not let go and taken again"


def test_a_claim_whose_record_never_lands_lets_its_lease_go_after_its_last_read(machines: Machines) -> None:
    """A due entry no record follows (a put that crashed after it): the claim reads its patience's
    worth, answers nothing to fire, and lets the lease go; nothing else is written."""
    a, reader = scheduler(machines("A")), scheduler(machines("reader"))
    calls: list[tuple[str, str]] = []

    def count(call: Any) -> Fault:
        if call.key.endswith(RECORD_KEY) or call.key.endswith(LEASE_KEY):
            calls.append((call.op, "record" if call.key.endswith(RECORD_KEY) else "lease"))
        return Fault.NONE

    a.plan(count)
    assert a("job_claim", **claim("runner-A")) == claimed(None)
    assert [c for c in calls if c[1] == "record"] == [("get", "record")] * (1 + len(LATE_RECORD_WAITS)), calls
    assert holder_of(reader) is None, "the lease was let go"
    assert where(reader) == []


@pytest.mark.parametrize("wanted", [False, True])
def test_a_claims_lease_over_a_head_left_there_is_written_only_when_still_wanted(machines: Machines,
                                                                                wanted: bool) -> None:
    """The take's guess (a create) meets the head of an ended lease: read, then the claim is asked
    whether its job is still worth a lease.  No: ``skipped``, and nothing more is written."""
    a, reader = scheduler(machines("A")), scheduler(machines("reader"))
    reader.ok("take", thread=THREAD, holder="runner-B", lapse_ms=LONG_MS)
    reader.ok("end", thread=THREAD, holder="runner-B")
    lease_writes: list[str] = []

    def count(call: Any) -> Fault:
        if call.is_write and call.key.endswith(LEASE_KEY):
            lease_writes.append(call.op)
        return Fault.NONE

    a.plan(count)
    asked: list[str] = []
    leases = a.answerer.service.leases_
    agent = v.agent({"agent": machines.agent})
    with a.space.store.op_window():
        got = leases.take_naming(agent, THREAD, "runner-A", LONG_MS, guess=True,
                                 wanted=lambda answer: asked.append(answer) or wanted)
    assert asked == ["took"], "asked once, on the head read after the guess lost"
    if wanted:
        assert got == ("took", None) and holder_of(reader) == "runner-A" and lease_writes == ["put", "put"]
    else:
        assert got == ("skipped", None) and holder_of(reader) is None, got
        assert lease_writes == ["put"], "only the guess was sent: no lease taken to be let go"


def test_the_mark_is_written_before_the_record(machines: Machines) -> None:
    """The record write of a claim whose mark write failed for good is never sent."""
    a, reader = scheduler(machines("A")), scheduler(machines("reader"))
    reader.ok("job_put", place="waiting", job=JOB)
    mark = reader.ok("job_mark")["mark"]
    writes: list[str] = []

    def plan(call: Any) -> Fault:
        if call.is_write:
            writes.append(call.key)
            if call.key.endswith("/mark") or "/m/" in call.key:  # the mark, or one of its shards
                return Fault.FAIL_BEFORE
        return Fault.NONE

    a.plan(plan)
    reply = a("job_claim", **claim("runner-A"))
    assert reply["reply"] == "error", reply
    assert where(reader) == ["waiting"], "the record moved though the mark was never written"
    assert reader.ok("job_mark")["mark"] == mark
    assert not [k for k in writes if k.endswith(RECORD_KEY)], writes


# --------------------------------------------------------------------------
# Seeded histories: three machines, faults on every request, checked against the promises


def faulty(rng: random.Random, others: list[Any]) -> Any:
    """A plan: each request may fail (before, reply lost, landing late), and once, at a seeded
    request, the other machines' claims run in between."""
    at = rng.randint(1, 5)
    seen = [0]

    def plan(call: Any) -> Fault:
        seen[0] += 1
        if seen[0] == at:
            for other in others:
                other()
        if rng.random() < 0.3:
            return rng.choice([Fault.FAIL_BEFORE, Fault.LOSE_REPLY, Fault.LAND_LATE] if call.is_write
                              else [Fault.FAIL_BEFORE])
        return Fault.NONE

    return plan


def one_history(machines: Machines, seed: int) -> list[str]:
    """Claims by A (B and C in between) under seeded faults; the broken promises found."""
    rng = random.Random(seed)
    broken: list[str] = []
    reader = scheduler(machines("reader"))
    names = ["A", "B", "C"]
    ms = {n: scheduler(machines(n)) for n in names}
    for m in ms.values():
        m.space.beside = SeededSidePool(random.Random(f"{seed}:{m.name}"))
    job = {**JOB, "spec": {"seed": seed}}
    reader.ok("job_put", place="waiting", job=job)
    mark = reader.ok("job_mark")["mark"]
    replies: dict[str, dict] = {}

    def run(name: str) -> None:
        if name not in replies:
            replies[name] = ms[name]("job_claim", **claim("runner-" + name))

    ms["B"].plan(faulty(rng, [lambda: run("C")]))
    ms["C"].plan(faulty(rng, []))
    ms["A"].plan(faulty(rng, [lambda: run("B")]))
    run("A")
    run("B")
    run("C")
    for held in list(machines.limbo.held):
        if rng.random() < 0.8:
            machines.limbo.land(machines.limbo.held.index(held))

    got = [n for n, r in replies.items() if r.get("job") is not None]
    errored = [n for n, r in replies.items() if r.get("reply") == "error"]
    if len(got) > 1:
        broken.append(f"{got} all got the job")
    for n, r in replies.items():
        if r.get("reply") == "error":
            continue
        if r.get("job") is not None and r != claimed(job):
            broken.append(f"{n} answered {r}")
        if r.get("took") == "held" and r.get("holder") == "runner-" + n:
            broken.append(f"{n} was told its own lease is held: {r}")
        if r.get("job") is None and r.get("took") != "held":
            broken.append(f"{n} took the lease but got nothing to fire: {r} (the job only ever waited for it)")
    places = where(reader)
    holder = holder_of(reader)
    if len(places) != 1:
        broken.append(f"the job is in {places}")
    if places == ["firing"]:
        if holder is None:
            broken.append("the job is in firing with no lease held: any runner could take it")
        elif holder[len("runner-"):] not in got + errored:
            broken.append(f"the job is in firing under {holder}'s lease, which was told it did not claim it")
        if reader.ok("job_mark")["mark"] == mark:
            broken.append("the job left waiting and the mark did not move")
    if places == ["waiting"]:
        if got:
            broken.append(f"{got} got the job, yet it still waits")
        soon = reader.ok("job_next")["next"]
        if soon is None or soon > DUE:
            broken.append(f"the job waits due {DUE} but job_next answers {soon}")
    if got and holder != "runner-" + got[0]:
        broken.append(f"{got[0]} got the job but the lease is {holder}'s")
    # The next claimer (no faults): held by whoever holds it, or the job if it still waits and nobody does.
    after = reader.ok("job_claim", **claim("runner-D"))
    expected = claimed(None, "held", holder) if holder is not None else (
        claimed(job) if places == ["waiting"] else claimed(None))
    if holder == "runner-D" or after != expected:
        broken.append(f"the next claim answered {after}, not {expected}")
    return broken


def test_seeded_histories_of_three_claimers_under_faults_keep_every_promise(machines: Machines, store: Any) -> None:
    """Replay one history: ``one_history(machines, seed)`` with the seed a failure names."""
    failures: list[str] = []
    for seed in range(HISTORIES[store.backend]):
        group = Machines(store)
        try:
            broken = one_history(group, seed)
        finally:
            group.close()
        failures += [f"seed {seed}: {why}" for why in broken]
    print(f"\n[{store.backend}] {HISTORIES[store.backend]} seeded claim histories, {len(failures)} broken promises")
    assert not failures, "\n".join(failures[:20])

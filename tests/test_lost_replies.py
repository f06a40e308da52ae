"""Issue 10: where the drivers' promises broke under lost replies, late writes and other machines.

One deterministic test per scenario of the issue (its numbering in the test
names), each on the local folder, moto and fake-gcs-server.  Several machines
are several in-process ``Service`` instances over one real store, each with
its own ``FaultyBackend`` (``tests/faults/machines.py``); the plan of one
machine runs the other machines' requests between two of its own, so the
order is decided by hooks, never by time.

Every assertion is a promise of ``wire.md`` (replies, what a reader sees),
never how the drivers lay out their objects; where a plan must find one
particular request of the current drivers, that is said where it is done,
and another machine's op the plan did not get to run is run right after.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest
from faults.backend import Fault
from faults.machines import (
    GIVE_UP_FAST,
    Machine,
    Machines,
    Once,
    a_write,
    any_request,
    between,
    every_write_lands_late_once,
    in_order,
    nth_request,
    outage_after_first_write,
    write_to,
)

PATH = "skills/greet/SKILL.md"
THREAD = "t-issue-10"
LONG_LAPSE_MS = 600_000


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def file_of(reader: Machine) -> tuple[int, bytes] | None:
    """(version, bytes) of PATH as a reader sees it, or None."""
    got = reader.ok("file_read", path=PATH)["file"]
    return None if got is None else (got["version"], base64.b64decode(got["data"]))


def event(seq: int) -> dict:
    return {"seq": seq, "text": f"event {seq}", "big": 2**60 + seq}


def append_all(machine: Machine, seqs: range) -> None:
    for seq in seqs:
        reply = machine.ok("append", thread=THREAD, event=event(seq))
        assert reply == {"reply": "done"}, f"{machine.name}: append {seq} answered {reply}"


def seqs_of(reply: dict) -> list[int]:
    return [e["seq"] for e in reply["events"]]


# --------------------------------------------------------------------------
# 2. A lost reply, then another machine writes before the retry


def test_2a_file_write_whose_reply_was_lost_is_wrote_though_another_wrote_before_the_retry(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    assert a.ok("file_write", path=PATH, data=b64(b"one"), version=0) == {"reply": "wrote", "version": 1}
    b_writes = Once(lambda: b("file_write", path=PATH, data=b64(b"three, by B"), version=2))
    a.plan(in_order((a_write, Fault.LOSE_REPLY), (any_request, between(b_writes))))

    mine = a("file_write", path=PATH, data=b64(b"two, by A"), version=1)
    theirs = b_writes()

    assert mine == {"reply": "wrote", "version": 2}, (
        f"A's write of version 2 landed (its reply was lost) before B wrote 3, so A must be told wrote 2, "
        f"never stale about its own write; A got {mine}")
    assert theirs == {"reply": "wrote", "version": 3}, f"B wrote over A's version 2: {theirs}"
    assert file_of(reader) == (3, b"three, by B"), f"the file must be B's bytes at version 3: {file_of(reader)}"


def test_2b_file_append_whose_reply_was_lost_is_kept_once(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    b_appends = Once(lambda: b("file_append", path=PATH, data=b64(b"<B>")))
    a.plan(in_order((a_write, Fault.LOSE_REPLY), (any_request, between(b_appends))))

    mine = a("file_append", path=PATH, data=b64(b"<A>"))
    theirs = b_appends()

    assert mine.get("reply") == "wrote" and theirs.get("reply") == "wrote", f"A got {mine}, B got {theirs}"
    now = file_of(reader)
    assert now is not None and now[1] == b"<A><B>", (
        f"A's append landed once (reply lost), then B appended: the file must be exactly <A><B>, "
        f"never A's bytes twice; it is {now}")
    assert now[0] == theirs["version"], f"the last append's version is the file's: B got {theirs}, file {now}"


def test_2c_job_shift_whose_reply_was_lost_is_found_though_another_shifted_it_on(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    job = {"id": "j1", "spec": {"say": "hi"}, "due": 100}
    a.ok("job_put", place="waiting", job=job)
    b_shifts = Once(lambda: b("job_shift", id="j1", **{"from": "firing", "to": "ending"}))
    # The job record's write (found by the key layout's /j/) is the one whose reply is lost.
    a.plan(in_order((write_to("/j/"), Fault.LOSE_REPLY), (any_request, between(b_shifts))))

    mine = a("job_shift", id="j1", **{"from": "waiting", "to": "firing"})
    theirs = b_shifts()

    assert mine == {"reply": "found", "found": True}, (
        f"A's shift waiting->firing landed (reply lost) before B shifted it on: A must be told found: true; got {mine}")
    assert theirs == {"reply": "found", "found": True}, f"B shifted firing->ending after A's shift landed: {theirs}"
    places = {place: reader.ok("job_get", place=place, id="j1")["job"] for place in ("waiting", "firing", "ending")}
    assert places == {"waiting": None, "firing": None, "ending": job}, f"the job must be in ending only: {places}"


def test_2d_job_put_retried_after_a_lost_reply_keeps_job_next_at_the_soonest_due(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    reader.ok("job_put", place="waiting", job={"id": "later", "spec": None, "due": 300})
    soon = {"id": "soon", "spec": {"n": 1}, "due": 5}
    b_puts = Once(lambda: b("job_put", place="firing", job={"id": "soon", "spec": {"n": 2}, "due": 7}))
    # The current drivers keep each job ID in one record (key ".../j/<id>"); its write's reply is lost,
    # then B writes that record before A's retry, so A's compare-and-set loop goes round again.
    a.plan(in_order((write_to("/j/"), Fault.LOSE_REPLY), (any_request, between(b_puts))))

    mine = a("job_put", place="waiting", job=soon)
    theirs = b_puts()

    assert mine == {"reply": "done"} and theirs == {"reply": "done"}, f"A got {mine}, B got {theirs}"
    waiting = reader.ok("job_get", place="waiting", id="soon")["job"]
    assert waiting == soon, f"A's job must be waiting as put: {waiting}"
    nxt = reader.ok("job_next")
    assert nxt == {"reply": "next", "next": 5}, (
        f"jobs wait with due 5 and 300: job_next must answer 5, never later than the soonest waiting due; got {nxt}")


# --------------------------------------------------------------------------
# 3, 4. Files, no fault: versions and removals between two machines


def test_3_a_file_version_is_never_given_twice(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    told: list[tuple[str, int, bytes]] = []  # (who, version, bytes): every version a writer was told or a reader saw

    def b_writes_v1() -> None:
        reply = b.ok("file_write", path=PATH, data=b64(b"B's version 1"), version=0)
        if reply["reply"] == "wrote":
            told.append(("B wrote", reply["version"], b"B's version 1"))
        seen = file_of(reader)
        if seen is not None:
            told.append(("reader saw", *seen))

    b_removes = Once(lambda: b.ok("file_remove", path=PATH, version=1))
    # A's write reads what is there (nothing), then B makes version 1 before A's next request,
    # and removes it before A's first write.
    b_writes = Once(b_writes_v1)
    a.plan(in_order((nth_request(2), between(b_writes)), (a_write, between(b_removes))))

    mine = a.ok("file_write", path=PATH, data=b64(b"A's bytes"), version=0)
    b_writes()
    b_removes()
    if mine["reply"] == "wrote":
        told.append(("A wrote", mine["version"], b"A's bytes"))
    seen = file_of(reader)
    if seen is not None:
        told.append(("reader saw", *seen))

    writers = [version for who, version, _ in told if who.endswith("wrote")]
    assert len(writers) == len(set(writers)), f"a version was given twice for one path: {told}; A got {mine}"
    for who, version, data in told:
        for other, same, more in told:
            assert version != same or data == more, (
                f"version {version} reads back different bytes: {who} {data!r}, {other} {more!r} (all: {told})")


def test_4_of_two_removers_of_one_version_exactly_one_is_told_found(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    reader.ok("file_write", path=PATH, data=b64(b"to go"), version=0)
    # A has read the file when it makes its first write; B's whole removal runs there.
    b_removes = Once(lambda: b("file_remove", path=PATH, version=1))
    a.plan(in_order((a_write, between(b_removes))))

    mine = a("file_remove", path=PATH, version=1)
    theirs = b_removes()

    replies = [mine, theirs]
    assert all(r.get("reply") == "found" for r in replies), f"A got {mine}, B got {theirs}"
    assert sum(r["found"] for r in replies) == 1, (
        f"two removers of version 1: exactly one must be told found: true; A got {mine}, B got {theirs}")
    assert file_of(reader) is None, f"the file must be gone: {file_of(reader)}"


# --------------------------------------------------------------------------
# 5. Conversations, no fault: a segment packed by another machine


def packed_by_another(machines: Machines) -> tuple[Machine, Machine]:
    """p1 appends 1..63, p2 appends 64 (which packs the segment 1..64); (p1, p2)."""
    p1, p2 = machines("p1"), machines("p2")
    append_all(p1, range(1, 64))
    append_all(p2, range(64, 65))
    return p1, p2


def test_5_read_after_another_machine_packed_a_segment_is_exact(machines: Machines) -> None:
    for machine in packed_by_another(machines):
        for first in (1, 60):
            reply = machine.ok("read", thread=THREAD, first=first)
            assert reply["events"] == [event(s) for s in range(first, 65)], (
                f"{machine.name}: read first={first} must give exactly events {first}..64; "
                f"got {len(reply['events'])} events numbered {seqs_of(reply)}")


def test_5_read_never_gives_an_event_twice_for_any_first(machines: Machines) -> None:
    p1, p2 = packed_by_another(machines)
    for first in range(1, 71):
        for machine in (p1, p2):
            got = seqs_of(machine.ok("read", thread=THREAD, first=first))
            assert got == list(range(first, 65)), f"{machine.name}: read first={first} gave events numbered {got}"


# --------------------------------------------------------------------------
# 6. The store fails after an op's first write landed


def _remove_case(healthy: Machine) -> tuple[dict, Callable[[], bool]]:
    append_all(healthy, range(1, 4))
    return {"op": "remove", "thread": THREAD}, lambda: healthy.ok("last", thread=THREAD)["last"] == 0


def _job_remove_case(healthy: Machine) -> tuple[dict, Callable[[], bool]]:
    healthy.ok("job_put", place="waiting", job={"id": "j1", "spec": None, "due": 50})
    return ({"op": "job_remove", "place": "waiting", "id": "j1"},
            lambda: healthy.ok("job_get", place="waiting", id="j1")["job"] is None)


def _packing_append_case(healthy: Machine) -> tuple[dict, Callable[[], bool]]:
    append_all(healthy, range(1, 64))
    return ({"op": "append", "thread": THREAD, "event": event(64)},
            lambda: healthy.ok("read", thread=THREAD, first=1)["events"] == [event(s) for s in range(1, 65)])


SUCCESS = {"remove": {"reply": "done"}, "job_remove": {"reply": "found", "found": True}, "append": {"reply": "done"}}


@pytest.mark.parametrize("case", [_remove_case, _job_remove_case, _packing_append_case],
                         ids=["remove", "job_remove", "append_64_packs"])
def test_6_an_error_after_a_landed_write_says_outcome_unknown(machines: Machines, case: Callable) -> None:
    healthy, failing = machines("healthy"), machines("A", GIVE_UP_FAST)
    request, landed = case(healthy)
    failing.plan(outage_after_first_write())

    reply = failing(**request)
    did_land = landed()

    if reply.get("reply") != "error":
        assert reply == SUCCESS[request["op"]] and did_land, f"{request['op']} answered {reply}; landed: {did_land}"
        return
    assert "outcome unknown" in reply["error"], (
        f"the store failed after {request['op']}'s first write (landed: {did_land}): "
        f"the error must say 'outcome unknown'; got {reply}")
    assert not did_land or "nothing was changed" not in reply["error"], (
        f"{request['op']}'s write landed, yet the error says nothing was changed: {reply}")


# --------------------------------------------------------------------------
# 7. Writes that land late


def test_7a_a_late_mark_write_never_brings_back_an_old_mark(machines: Machines) -> None:
    a, b, watcher = machines("A"), machines("B"), machines("watcher")
    seen = [watcher.ok("job_mark")["mark"]]
    a.plan(every_write_lands_late_once())
    a.ok("job_put", place="waiting", job={"id": "j1", "spec": None, "due": 100})
    seen.append(watcher.ok("job_mark")["mark"])
    b.ok("job_put", place="waiting", job={"id": "j2", "spec": None, "due": 200})
    seen.append(watcher.ok("job_mark")["mark"])
    held = machines.limbo.land_all()
    seen.append(watcher.ok("job_mark")["mark"])

    assert seen[1] != seen[0] and seen[2] != seen[1], f"job_mark must change when a job is put in waiting: {seen}"
    for k in range(1, len(seen)):
        assert seen[k] == seen[k - 1] or seen[k] not in seen[:k], (
            f"the watcher saw job_mark {seen[k]} again after a newer one (marks seen in turn: {seen}; "
            f"late writes landed: {[(h.call.op, h.outcome) for h in held]})")


def test_7b_a_late_lease_delete_of_remove_never_frees_the_next_holders_lease(machines: Machines) -> None:
    a, b, c = machines("A"), machines("B"), machines("C")
    c.ok("append", thread=THREAD, event=event(1))
    c.ok("take", thread=THREAD, holder="before", lapse_ms=LONG_LAPSE_MS)
    a.plan(every_write_lands_late_once())
    assert a.ok("remove", thread=THREAD) == {"reply": "done"}
    took = b.ok("take", thread=THREAD, holder="B", lapse_ms=LONG_LAPSE_MS)
    assert took == {"reply": "took", "took": "took"}, f"after remove the lease is free: B must take it; got {took}"
    held = machines.limbo.land_all()

    other = c("take", thread=THREAD, holder="C", lapse_ms=LONG_LAPSE_MS)
    renewed = b("renew", thread=THREAD, holder="B")
    landed = [(h.call.op, h.outcome) for h in held]
    assert other == {"reply": "took", "took": "held"}, (
        f"B took the lease just now (lapse {LONG_LAPSE_MS} ms): C must be told held; got {other} "
        f"(remove's late writes landed: {landed})")
    assert renewed == {"reply": "done"}, f"B still holds its lease: renew must be done; got {renewed} ({landed})"


def test_7c_a_late_create_of_a_job_record_never_brings_back_a_removed_job(machines: Machines) -> None:
    """Found by the simulation (seed 338265): A's put of a new job held its first create in the network and
    answered done on the retry; B removed the job, which deleted the empty record; the held create then
    landed on no object and the removed job was waiting again."""
    a, b, reader = machines("A"), machines("B"), machines("reader")
    a.plan(every_write_lands_late_once())
    assert a.ok("job_put", place="waiting", job={"id": "j", "spec": {"v": 1}, "due": 100}) == {"reply": "done"}
    assert b.ok("job_remove", place="waiting", id="j") == {"reply": "found", "found": True}
    held = machines.limbo.land_all()
    got = reader.ok("job_get", place="waiting", id="j")
    assert got == {"reply": "job", "job": None}, (
        f"the job was removed after its put answered done; a write of that put landing late must not bring it "
        f"back; got {got} (late writes landed: {[(h.call.op, h.outcome) for h in held]})")
    assert reader.ok("job_count", place="waiting") == {"reply": "count", "count": 0}


# --------------------------------------------------------------------------
# 9. An append racing a remove on another machine


def test_9_an_append_after_another_machine_removed_the_conversation_is_taken(machines: Machines) -> None:
    a, b, reader = machines("A"), machines("B"), machines("reader")
    append_all(a, range(1, 4))
    assert b.ok("remove", thread=THREAD) == {"reply": "done"}

    mine = a("append", thread=THREAD, event=event(4))
    events = reader.ok("read", thread=THREAD, first=1)["events"]

    assert mine != {"reply": "done"} or event(4) in events, (
        f"A was told done for event 4, yet a reader cannot read it: events {seqs_of({'events': events})}")
    assert mine == {"reply": "taken", "last": 0}, (
        f"B removed the conversation, so it is empty: A's append of 4 must be taken with last 0; got {mine}")

"""Issue 11: a driver killed at every request boundary of every multi-request op leaves every op whole.

wire.md: "an op is whole or not at all, as seen by the next op"; "a driver
never leaves a partial effect behind".  For each op below, on the local
folder, moto and fake-gcs-server, ``crash_rig.sweep`` kills a fresh ``serve``
process just before its 1st, 2nd, 3rd ... store request
(``LNK_STORE_FAILPOINT``), each time from the same state before the op (a
location and agent of its own, made by a normal process), until the op
answers.  After each kill a fresh process, which never saw that location,
reads what the next ops read; the op's check (``check_*`` below) requires:

* the state it reads is the state before the op or the op's whole effect,
  and the whole effect when the op answered;
* the standing promises of its collection: events 1..last, each once, and
  ``threads`` listing every conversation that holds events (hashed names
  too); a removed conversation has no lease and a new holder's ``take``
  answers ``took``, a conversation whose lease is still there has all its
  events; a job in one place at most, ``job_mark`` moved whenever waiting
  changed, ``job_next`` never later than the soonest waiting due; a file is
  its old bytes or its whole new bytes, its versions never come back;
  a narrowing only narrows;
* then the next ops a caller would send (the op again, where that is what a
  caller who got no reply does; a new event; a file made again) work and
  leave the whole effect.

Reading order.  Each check reads first what a watcher reads first (a
scheduler's ``job_mark`` and ``job_next``, ``leases`` for a removal,
``threads`` for conversations), so an op that completes itself when read
(roll-forward) passes only if the FIRST read already sees it whole.  No op
here is allowed a reading between "before" and "after", whatever the
driver does inside.

Every kill point counts once per backend in the closing summary line
(``crash points: file N, moto N, gcs N; violations N``) and the wall time
per backend; each test's own line says how many kill points its op had.
A broken point is reported with the op, the backend, N and every read of
the fresh process.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pytest
from crash_rig import CrashOp, Probe, Tally, brief, sweep_op
from support import BACKENDS, SEAWEEDFS, Session

Json = Any

TALLY = Tally((*BACKENDS, SEAWEEDFS))

#: The ops swept on SeaweedFS too (conftest), whose keys meet its path semantics: a file made and
#: removed, a job put into the shared due index.  Every kill point costs a fresh driver process and
#: its reads (30-40 s an op on 2 idle cores; the 15 ops would take 10 min or more), so the others,
#: the same code on every S3 server, run on moto only.
SEAWEEDFS_TESTS = frozenset({
    f"test_a_crash_before_any_request_leaves_the_op_whole[{SEAWEEDFS}-{name}]"
    for name in ("file_write new (version 0)", "file_remove", "job_put new into waiting")
})

#: The runs swept on fake-gcs-server (conftest): the claim, an append to a hashed thread (its name
#: record and event, generation-0 creates), a take and a create of each other kind, whose requests
#: take the GCS backend's own paths.  The other ops are the same code above the seam, swept kill
#: point by kill point on the folder and on moto; on GCS they cost CI minutes that find nothing those
#: runs do not (the packing append alone took 2 min: its kill points each start a driver).
GCS_TESTS = frozenset({"test_a_crash_at_any_request_of_a_runners_claim_leaves_it_whole"} | {
    f"test_a_crash_before_any_request_leaves_the_op_whole[gcs-{name}]"
    for name in ("append seq 1, hashed thread name", "take over a lapsed lease", "job_put new into waiting",
                 "file_write new (version 0)")
})

#: The runs swept on moto: every op whose requests differ in kind (creates, replaces by ETag,
#: deletes, the claim), not the ops that repeat another's requests with other values (a replacing
#: put is a waiting put's requests; a shift back, a shift's; a removal from waiting and a replacing
#: write, a removal's and a write's; packing's block puts and reads, an append's and a read's: 53 s
#: of CI on moto), which the folder sweeps.
MOTO_TESTS = frozenset({"test_a_crash_at_any_request_of_a_runners_claim_leaves_it_whole"} | {
    f"test_a_crash_before_any_request_leaves_the_op_whole[moto-{name}]"
    for name in ("append seq 1, hashed thread name",
                 "remove with events and a live lease", "take over a lapsed lease", "job_put new into waiting",
                 "job_shift waiting to firing", "file_write new (version 0)", "file_remove", "file_append",
                 "tools_narrow")
})

DONE = {"reply": "done"}
FOUND = {"reply": "found", "found": True}
THREAD = "t-crash"
#: Over 160 bytes of UTF-8: its key part is a hash, its name kept in a name record.
LONG_THREAD = "long thread " + "ü" * 90 + " /../%00 end"
LONG_LAPSE_MS = 600_000


def ok(reply: Json, expected: Json) -> Json:
    """A setup step's reply must be what a live store answers; anything else stops the point."""
    if reply != expected:
        raise AssertionError(f"setup: expected {expected}, got {reply}")
    return reply


# --------------------------------------------------------------------------
# Conversations


def ev(seq: int) -> dict:
    return {"seq": seq, "text": f"event {seq}", "big": 2**60 + seq}


def evs(first: int, last: int) -> list[dict]:
    return [ev(s) for s in range(first, last + 1)]


def append_all(s: Session, thread: str, last: int) -> None:
    for seq in range(1, last + 1):
        ok(s("append", thread=thread, event=ev(seq)), DONE)


def conversation(p: Probe, thread: str) -> list[dict]:
    """The events as read, after requiring threads, read and last to agree.

    ``threads`` first: it must list the conversation (with its last number)
    exactly when it holds events; ``read`` gives 1..last, each once.
    """
    listed = [t for t in p("threads")["threads"] if t["thread"] == thread]
    events = p("read", thread=thread)["events"]
    seqs = [e.get("seq") for e in events]
    p.require(seqs == list(range(1, len(seqs) + 1)), f"read gave seqs {seqs}: a gap or a duplicate")
    last = p("last", thread=thread)["last"]
    p.require(last == len(events), f"last answered {last}, read gave {len(events)} events")
    p.require(listed == ([{"thread": thread, "last": len(events)}] if events else []),
              f"threads listed {brief(listed)} for a conversation holding {brief(events) if events else 'no events'}")
    return events


def setup_append_64(s: Session) -> None:
    append_all(s, THREAD, 63)


def check_append_64(p: Probe, _: None, reply: Json | None) -> None:
    """Events 1..63 or 1..64; then the 64th again (a caller without a reply) and the 65th.

    The whole conversation is read once, right after the crash (a read
    after this process's own appends could come from its memory).
    """
    if reply is not None:
        p.require(reply == DONE, f"append of 64 answered {reply}")
    has_64 = p.whole("events", conversation(p, THREAD), evs(1, 63), evs(1, 64), reply)
    again = p("append", thread=THREAD, event=ev(64))
    p.require(again == ({"reply": "taken", "last": 64} if has_64 else DONE), f"append of 64 again answered {again}")
    p.require(p("append", thread=THREAD, event=ev(65)) == DONE, "append of 65 refused")
    p.require(p("last", thread=THREAD)["last"] == 65, "last is not 65 after the append of 65")
    p.require(p("read", thread=THREAD, first=63)["events"] == evs(63, 65), "read from 63 is not 63..65")


def setup_append_hashed(s: Session) -> None:
    ok(s("append", thread=THREAD, event=ev(1)), DONE)  # another conversation, to be listed beside it


def check_append_hashed(p: Probe, _: None, reply: Json | None) -> None:
    """A hashed conversation holds event 1 and is listed by ``threads``, or holds nothing and is not."""
    if reply is not None:
        p.require(reply == DONE, f"append of 1 answered {reply}")
    has_1 = p.whole("events", conversation(p, LONG_THREAD), [], [ev(1)], reply)
    p.require(conversation(p, THREAD) == [ev(1)], "the other conversation changed")
    again = p("append", thread=LONG_THREAD, event=ev(1))
    p.require(again == ({"reply": "taken", "last": 1} if has_1 else DONE), f"append of 1 again answered {again}")
    p.require(conversation(p, LONG_THREAD) == [ev(1)], "the hashed conversation is not event 1 after the append again")


HOLDER = "holder of the turn"
TOOLS = ["a", "b"]


def setup_remove(s: Session) -> None:
    append_all(s, THREAD, 3)
    ok(s("take", thread=THREAD, holder=HOLDER, lapse_ms=LONG_LAPSE_MS), {"reply": "took", "took": "took"})
    ok(s("tools_narrow", thread=THREAD, tools=TOOLS), {"reply": "tools", "tools": TOOLS})


def lease_holders(p: Probe, thread: str) -> list[str]:
    return [lease["holder"] for lease in p("leases", lapse_ms=LONG_LAPSE_MS)["leases"] if lease["thread"] == thread]


def check_remove(p: Probe, _: None, reply: Json | None) -> None:
    """Events 1..3 with the lease, or no events and no lease; the narrowing stays either way.

    ``leases`` is read first.  Then a new holder's ``take`` (``took`` only if
    removed), the remove again, and the conversation made again from event 1.
    """
    if reply is not None:
        p.require(reply == DONE, f"remove answered {reply}")
    holders = lease_holders(p, THREAD)
    events = conversation(p, THREAD)
    if not events and holders:
        p.require(False, f"the events are gone but the lease of {holders} is still there")
    else:
        p.whole("events and lease", (events, holders), (evs(1, 3), [HOLDER]), ([], []), reply)
    removed = not events
    p.require(p("tools_read", thread=THREAD)["tools"] == TOOLS, "the narrowing did not stay")
    took = p("take", thread=THREAD, holder="a new holder", lapse_ms=LONG_LAPSE_MS)["took"]
    p.require(took == ("took" if removed else "held"),
              f"take by a new holder answered {took!r} with the events {'gone' if removed else 'there'}")
    p.require(p("remove", thread=THREAD) == DONE, "remove again refused")
    p.require(lease_holders(p, THREAD) == [], "a lease is left after the remove again")
    p.require(p("take", thread=THREAD, holder="a third holder", lapse_ms=LONG_LAPSE_MS)["took"] == "took",
              "take after the remove again did not answer took")
    p.require(p("append", thread=THREAD, event=ev(1)) == DONE, "append of 1 after the remove refused")
    p.require(conversation(p, THREAD) == [ev(1)], "the conversation made again is not event 1 alone")
    p.require(p("tools_read", thread=THREAD)["tools"] == TOOLS, "the narrowing did not stay after the remove again")


A, B = "holder A", "holder B"
LAPSE_MS = 100


def setup_take(s: Session) -> None:
    ok(s("take", thread=THREAD, holder=A, lapse_ms=LAPSE_MS), {"reply": "took", "took": "took"})
    time.sleep(LAPSE_MS / 1000 + 0.05)  # the one sleep: waiting out the lease's lapse_ms


def check_take(p: Probe, _: None, reply: Json | None) -> None:
    """A's lease or B's, never none or two; then B takes again and A has lost it."""
    if reply is not None:
        p.require(reply == {"reply": "took", "took": "lapsed"}, f"take over the lapsed lease answered {reply}")
    holders = lease_holders(p, THREAD)
    b_holds = p.whole("lease holders", holders, [A], [B], reply)
    again = p("take", thread=THREAD, holder=B, lapse_ms=LAPSE_MS)["took"]
    p.require(again == ("took" if b_holds else "lapsed"), f"take by B again answered {again!r} with {holders} holding")
    p.require(lease_holders(p, THREAD) == [B], "B does not hold the lease after taking it again")
    p.require(p("renew", thread=THREAD, holder=A) == {"reply": "lost"}, "A could renew a lease B holds")
    p.require(p("renew", thread=THREAD, holder=B) == DONE, "B could not renew its lease")


# --------------------------------------------------------------------------
# Jobs

JOB_ID = "job-1"
PLACES = ("waiting", "firing", "ending")
DUE = 2_000_000_000


def job(due: float, spec: str = "first") -> dict:
    return {"id": JOB_ID, "spec": {"run": spec, "big": 2**60}, "due": due}


Where = tuple[str, dict] | None  # (place, job) of JOB_ID, or None


def waiting_job(where: Where) -> dict | None:
    return where[1] if where is not None and where[0] == "waiting" else None


def read_jobs(p: Probe, mark_before: int, before: Where, after: Where, reply: Json | None, when: str = "") -> bool:
    """``job_mark`` and ``job_next`` first (a scheduler's reads), then where the job is; True when moved.

    The job is in one place at most, and where ``before`` or ``after`` has
    it; the mark moved if the waiting job changed; ``job_next`` is no later
    than the soonest due of a waiting job.  ``when`` prefixes what is found broken.
    """
    mark = p("job_mark")["mark"]
    soon = p("job_next")["next"]
    got = {place: p("job_get", place=place, id=JOB_ID)["job"] for place in PLACES}
    found = [(place, j) for place, j in got.items() if j is not None]
    p.require(len(found) <= 1, f"{when}the job is in {len(found)} places: {brief(found)}")
    where: Where = found[0] if found else None
    moved = p.whole(f"{when}the job", where, before, after, reply)
    waiting = p("job_list", place="waiting")["jobs"]
    p.require(waiting == ([waiting_job(where)] if waiting_job(where) else []),
              f"{when}job_list waiting gave {brief(waiting)}, job_get found {brief(where)}")
    if waiting_job(where) != waiting_job(before):
        p.require(mark != mark_before, f"{when}job_mark is still {mark}: the waiting job changed from "
                                       f"{brief(waiting_job(before))} to {brief(waiting_job(where))}")
    dues = [j["due"] for j in waiting]
    if dues:
        p.require(
            soon is not None and soon <= min(dues), f"{when}job_next answered {soon}, a job waits due {min(dues)}"
        )
    return moved


def job_op(name: str, before: Where, request: dict, after: Where) -> CrashOp:
    """A job op: ``before`` put in place, the mark read; the op; the reading, then the op again."""
    answer = DONE if request["op"] == "job_put" else FOUND

    def setup(s: Session) -> int:
        if before is not None:
            ok(s("job_put", place=before[0], job=before[1]), DONE)
        return s("job_mark")["mark"]

    def check(p: Probe, mark_before: int, reply: Json | None) -> None:
        if reply is not None:
            p.require(reply == answer, f"{request['op']} answered {reply}, not {answer}")
        moved = read_jobs(p, mark_before, before, after, reply)
        again = p.send(request)
        expected = DONE if request["op"] == "job_put" else {"reply": "found", "found": not moved}
        p.require(again == expected, f"{request['op']} again answered {again}, not {expected}")
        read_jobs(p, mark_before, before, after, again, when="after the op again: ")

    return CrashOp(name, setup, request, check, own_store=True)


# --------------------------------------------------------------------------
# Files

PATH = "skills/greet/SKILL.md"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def read_file(p: Probe) -> tuple[bytes, int] | None:
    """(bytes, version) of PATH, or None; ``file_list`` must list it exactly when it is there."""
    got = p("file_read", path=PATH)["file"]
    listed = PATH in p("file_list", folder="skills/")["files"]
    p.require(
        listed == (got is not None), f"file_list {'lists' if listed else 'misses'} {PATH}, file_read gave {brief(got)}"
    )
    return None if got is None else (base64.b64decode(got["data"]), got["version"])


def file_op(name: str, before: list[bytes], request: dict, after: bytes | None, retry: bool) -> CrashOp:
    """A file op from the file written ``before`` (one write per item, none: no file).

    After: the bytes are the old ones at the old version or the whole new
    ones (``after``; None: removed) at a version above it; then the op again
    if ``retry`` (not for an append: a caller cannot know); then removed and
    made again, at a version above every version given so far.
    """
    def setup(s: Session) -> tuple[bytes, int] | None:
        version = 0
        for data in before:
            version = ok(s("file_write", path=PATH, data=b64(data), version=version),
                         {"reply": "wrote", "version": version + 1})["version"]
        return None if not before else (before[-1], version)

    def succeeded(reply: Json) -> bool:
        return reply == FOUND if request["op"] == "file_remove" else reply.get("reply") == "wrote"

    def check(p: Probe, old: tuple[bytes, int] | None, reply: Json | None) -> None:
        old_version = 0 if old is None else old[1]
        if reply is not None:
            p.require(succeeded(reply), f"{request['op']} answered {reply}")
        now = read_file(p)
        given = [old_version, now[1] if now else 0, reply.get("version", 0) if reply else 0]
        changed = p.whole("the file's bytes", None if now is None else now[0], None if old is None else old[0],
                          after, reply)
        if now is not None:
            p.require(
                now[1] > old_version if changed else now[1] == old_version,
                f"version {now[1]} for the {'new' if changed else 'old'} bytes; the old version was {old_version}",
            )
        if reply is not None and "version" in reply and now is not None:
            p.require(now[1] == reply["version"], f"read version {now[1]}, the op answered {reply['version']}")
        if retry:
            again = p.send(request)
            given.append(again.get("version", 0))
            if not changed:
                p.require(succeeded(again), f"{request['op']} again, on the old state, answered {again}")
            now = read_file(p)
            p.require((None if now is None else now[0]) == after, f"after the op again the file is {brief(now)}")
        if now is not None:
            given.append(now[1])
            p.require(p("file_remove", path=PATH, version=now[1]) == FOUND,
                      f"file_remove at version {now[1]} found nothing")
        made = p("file_write", path=PATH, data=b64(b"made again"), version=0)
        p.require(made.get("reply") == "wrote" and made["version"] > max(given),
                  f"the file made again after its removal got {made}; versions given so far: {sorted(set(given))}")

    return CrashOp(name, setup, request, check)


# --------------------------------------------------------------------------
# Tools

NARROWED = ["a", "b", "c"]


def setup_narrow(s: Session) -> None:
    ok(s("tools_narrow", thread=THREAD, tools=NARROWED), {"reply": "tools", "tools": NARROWED})


def check_narrow(p: Probe, _: None, reply: Json | None) -> None:
    """[a, b, c] or [b, c]; ``tools_list`` agrees; narrowing again never widens."""
    if reply is not None:
        p.require(reply == {"reply": "tools", "tools": ["b", "c"]}, f"tools_narrow answered {reply}")
    tools = p("tools_read", thread=THREAD)["tools"]
    p.whole("the tools", tools, NARROWED, ["b", "c"], reply)
    listed = p("tools_list")["narrowed"]
    p.require(listed == {THREAD: tools}, f"tools_list gave {brief(listed)}, tools_read {tools}")
    for asked in (["b", "c", "d"], ["a", "b", "c", "d"]):
        got = p("tools_narrow", thread=THREAD, tools=asked)["tools"]
        p.require(got == ["b", "c"], f"narrowing to {asked} afterwards gave {got}, not [b, c]")


# --------------------------------------------------------------------------
# The ops of issue 11

OPS = [
    CrashOp("append seq 64 (packs a segment)", setup_append_64,
            {"op": "append", "thread": THREAD, "event": ev(64)}, check_append_64),
    CrashOp("append seq 1, hashed thread name", setup_append_hashed,
            {"op": "append", "thread": LONG_THREAD, "event": ev(1)}, check_append_hashed),
    CrashOp("remove with events and a live lease", setup_remove, {"op": "remove", "thread": THREAD}, check_remove),
    CrashOp("take over a lapsed lease", setup_take,
            {"op": "take", "thread": THREAD, "holder": B, "lapse_ms": LAPSE_MS}, check_take),
    job_op("job_put new into waiting", None,
           {"op": "job_put", "place": "waiting", "job": job(DUE)}, ("waiting", job(DUE))),
    job_op("job_put replacing a waiting job", ("waiting", job(DUE + 500)),
           {"op": "job_put", "place": "waiting", "job": job(DUE, "second")}, ("waiting", job(DUE, "second"))),
    job_op("job_shift waiting to firing", ("waiting", job(DUE)),
           {"op": "job_shift", "id": JOB_ID, "from": "waiting", "to": "firing"}, ("firing", job(DUE))),
    job_op("job_shift firing to waiting", ("firing", job(DUE)),
           {"op": "job_shift", "id": JOB_ID, "from": "firing", "to": "waiting"}, ("waiting", job(DUE))),
    job_op("job_remove from waiting", ("waiting", job(DUE)),
           {"op": "job_remove", "place": "waiting", "id": JOB_ID}, None),
    file_op("file_write new (version 0)", [],
            {"op": "file_write", "path": PATH, "data": b64(b"new bytes"), "version": 0}, b"new bytes", retry=True),
    file_op("file_write replacing", [b"one"],
            {"op": "file_write", "path": PATH, "data": b64(b"two"), "version": 1}, b"two", retry=True),
    file_op("file_remove", [b"one", b"two"], {"op": "file_remove", "path": PATH, "version": 2}, None, retry=True),
    file_op("file_append", [b"old bytes"],
            {"op": "file_append", "path": PATH, "data": b64(b" + a whole chunk")}, b"old bytes + a whole chunk",
            retry=False),
    CrashOp("tools_narrow", setup_narrow, {"op": "tools_narrow", "thread": THREAD, "tools": ["b", "c", "d"]},
            check_narrow),
]


# --------------------------------------------------------------------------
# The runner's claim (job_claim with its lease, the scheduler's own driver)

CLAIM = {"op": "job_claim", "id": JOB_ID, "thread": "job:" + JOB_ID, "holder": "runner-A",
         "lapse_ms": LONG_LAPSE_MS, "not_after": DUE}


def lease_holder(p: Probe) -> str | None:
    held = [x for x in p("leases", lapse_ms=LONG_LAPSE_MS)["leases"] if x["thread"] == CLAIM["thread"]]
    return held[0]["holder"] if held else None


def setup_claim(s: Session) -> int:
    ok(s("job_put", place="waiting", job=job(DUE)), DONE)
    return s("job_mark")["mark"]


def unfenced(p: Probe, reply: Json | None) -> Json | None:
    """A claim's reply without its ``fence`` and ``held_ms`` (issue 44), once they are checked: a claim
    this runner took has a fence (a store time in ms, so positive) and how long ago its lease was written."""
    if not isinstance(reply, dict) or "took" not in reply:
        return reply
    fence, held_ms = reply.get("fence"), reply.get("held_ms")
    took = reply.get("took") in ("took", "lapsed")
    p.require(isinstance(held_ms, int) and held_ms >= 0 and (isinstance(fence, int) and fence > 0 if took
                                                             else fence is None),
              f"job_claim answered {reply}: not a fence for a claim it took, null otherwise, and held_ms")
    return {k: v for k, v in reply.items() if k not in ("fence", "held_ms")}


def check_claim(p: Probe, mark_before: int, reply: Json | None) -> None:
    """Whole or nothing as for job_shift, plus: a job in firing has runner-A's lease (the lease came
    first); then another runner's claim is refused naming runner-A, or (nothing landed, or the lease
    alone) claims the job."""
    expected = {"reply": "claimed", "job": job(DUE), "took": "took", "holder": None, "recovered": False}
    if reply is not None:
        p.require(unfenced(p, reply) == expected, f"job_claim answered {reply}, not {expected}")
    moved = read_jobs(p, mark_before, ("waiting", job(DUE)), ("firing", job(DUE)), reply)
    holder = lease_holder(p)
    if moved:
        p.require(holder == "runner-A", f"the job is in firing, but its lease is held by {holder}, not runner-A")
    p.require(holder in (None, "runner-A"), f"the lease is held by {holder}")
    again = p.send({**CLAIM, "holder": "runner-B"})
    if holder == "runner-A":  # a runner killed mid-claim: its lease lapses, then recovery or a claim takes over
        held = {"reply": "claimed", "job": None, "took": "held", "holder": "runner-A", "recovered": False}
        p.require(unfenced(p, again) == held, f"runner-B's claim answered {again}, not held by runner-A")
        read_jobs(p, mark_before, ("waiting", job(DUE)), ("firing", job(DUE)), reply, when="after runner-B's claim: ")
    else:
        p.require(unfenced(p, again) == expected, f"runner-B's claim answered {again}, not the job")
        read_jobs(p, mark_before, ("waiting", job(DUE)), ("firing", job(DUE)), again,
                  when="after runner-B's claim: ")


CLAIM_OP = CrashOp("job_claim with its lease (the runner's claim)", setup_claim, CLAIM, check_claim, own_store=True)


@pytest.mark.timeout(1800)
def test_a_crash_at_any_request_of_a_runners_claim_leaves_it_whole(store: Any) -> None:
    from dataclasses import replace

    report = sweep_op(replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"}), CLAIM_OP)
    TALLY.add(report)
    print(report.line())
    if report.broken:
        pytest.fail(report.describe(), pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """The closing lines: kill points and broken points per backend, wall time per backend."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for line in TALLY.lines():
        print(line)
        if reporter is not None and request.config.getoption("capture") != "no":
            reporter.write_line(line)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_a_crash_before_any_request_leaves_the_op_whole(store: Any, op: CrashOp) -> None:
    report = sweep_op(store, op)
    TALLY.add(report)
    print(report.line())
    if report.broken:
        pytest.fail(report.describe(), pytrace=False)

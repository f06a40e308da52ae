"""Issue 27, cases 1-3: no single reply's clock brings a deletion or a takeover forward.

On eafe802 ``StoreClock.observe`` started its estimate again whenever one
reply's interval disagreed ("a clock jumped"), so one reply dated 100 s ahead
(one front-end or proxy with a wrong clock) moved the process's store time by
100 s, and every judgment of age followed it:

1. a reader rolled a removal forward and purged the removed epoch at once, so
   an append answered ``done`` a moment later was never read;
2. ``job_next`` took a due entry written a moment ago, its record still in
   flight, for a 60 s orphan and deleted it: the job never fired;
3. a take judged a lease renewed a moment ago lapsed, and took it.

Here the shifted reply is injected into the one machine's clock, exactly at
the chosen request of the chosen op (a plan of ``faults.machines``), on the
folder, moto and fake-gcs-server.  Each machine first sees honest replies, so
its estimate stands before the shifted one comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from faults.backend import Call, Fault
from faults.machines import Machine, Machines, between, in_order, write_to

from cloudstore.protocol.validate import agent as parse_agent


def shifted_replies(m: Machine, seconds: float, only: Callable[[Call], bool] = lambda call: True,
                    ) -> Callable[[Call], Fault]:
    """A plan: each of ``m``'s requests that ``only`` picks also brings a reply dated ``seconds`` off."""
    clock = m.space.store.clock

    def plan(call: Call) -> Fault:
        if only(call):
            now = time.time()
            clock.observe(now, now + 0.001, now + seconds, 1.0)
        return Fault.NONE

    return plan


def warm(*machines: Machine) -> None:
    """Honest replies first: each machine's estimate of the store's time stands before the fault."""
    for m in machines:
        m.ok("last", thread="warm-up")
        m.ok("append", thread="warm-up", event={"seq": len(m.ok("read", thread="warm-up", first=1)["events"]) + 1})


def test_one_op_dated_100s_ahead_purges_nothing_an_append_was_told_done(machines: Machines) -> None:
    s, o, r, x = machines("s"), machines("o"), machines("r"), machines("x")
    warm(s, o, r, x)
    for seq in (1, 2):
        s.ok("append", thread="t", event={"seq": seq})
    for seq in (3, 4):
        o.ok("append", thread="t", event={"seq": seq})
    r.ok("remove", thread="t")
    x.plan(shifted_replies(x, 100.0))
    assert x.ok("last", thread="t") == {"reply": "last", "last": 0}
    x.plan(lambda call: Fault.NONE)
    reply = s("append", thread="t", event={"seq": 3, "by": "s"})  # within S's 30 s of trusting its memory
    events = s.ok("read", thread="t", first=1)["events"]
    if reply == {"reply": "done"}:
        assert {"seq": 3, "by": "s"} in events, f"append answered done, then read {events}: the event was lost"
    else:
        assert reply["reply"] in ("error", "stale", "taken"), reply


def test_a_reply_dated_120s_ahead_deletes_no_fresh_due_entry(machines: Machines) -> None:
    p, q = machines("p"), machines("q")
    warm(p, q)
    record = p.space.keys(parse_agent({"agent": p.agent})).job("j")

    def q_next_with_a_shifted_reply() -> None:
        q.plan(shifted_replies(q, 120.0))
        q.ok("job_next")
        q.plan(lambda call: Fault.NONE)

    # P's entry and mark are written; before its record is, Q's job_next sees a reply dated +120 s.
    p.plan(in_order((write_to(record), between(q_next_with_a_shifted_reply))))
    due = time.time()
    assert p.ok("job_put", place="waiting", job={"id": "j", "spec": None, "due": due}) == {"reply": "done"}
    assert [j["id"] for j in q.ok("job_list", place="waiting")["jobs"]] == ["j"]
    assert q.ok("job_next") == {"reply": "next", "next": due}, "the job's due entry was deleted as an orphan"


def test_a_reply_dated_an_hour_ahead_takes_no_lease_renewed_a_moment_ago(machines: Machines) -> None:
    a, b = machines("a"), machines("b")
    warm(a, b)
    assert a.ok("take", thread="t", holder="A", lapse_ms=60_000)["took"] == "took"
    assert a.ok("renew", thread="t", holder="A") == {"reply": "done"}
    head = b.space.keys(parse_agent({"agent": b.agent})).lease("t")
    b.plan(shifted_replies(b, 3600.0, only=lambda call: call.op == "get" and call.key == head))
    assert b.ok("take", thread="t", holder="B", lapse_ms=60_000)["took"] == "held"
    b.plan(lambda call: Fault.NONE)
    assert a.ok("renew", thread="t", holder="A") == {"reply": "done"}
    assert [x["holder"] for x in a.ok("leases", lapse_ms=60_000)["leases"]] == ["A"]


def test_a_clock_that_really_stepped_is_followed_once_replies_agree_over_seconds() -> None:
    """The other side of the rule: RESTART_AFTER agreeing replies over RESTART_SPAN seconds restart it."""
    from cloudstore.clock import RESTART_AFTER, RESTART_SPAN, StoreClock

    clock = StoreClock()
    clock.observe(1000.0, 1000.01, 1000.0, 1.0)
    clock.observe(1000.5, 1000.51, 1000.0, 1.0)  # a second reply agrees: the estimate stands
    for i in range(RESTART_AFTER - 1):  # one op's worth of shifted replies, close together: set aside
        clock.observe(1001.0 + i * 0.01, 1001.01 + i * 0.01, 1101.0 + i * 0.01, 1.0)
    assert clock.offset == 0.0
    step = RESTART_SPAN / (RESTART_AFTER - 1)
    for i in range(RESTART_AFTER):
        clock.observe(1010.0 + i * step, 1010.01 + i * step, 1110.0 + i * step, 1.0)
    assert 99.0 <= clock.offset <= 101.0


def test_a_first_reply_that_was_off_is_replaced_by_the_next_honest_ones() -> None:
    """Before any two replies agree, the newer of two disagreeing ones stands: a process whose very first
    reply was an hour off follows the honest replies after it at once (what it writes is not an hour off)."""
    from cloudstore.clock import StoreClock

    clock = StoreClock()
    clock.observe(1000.0, 1000.01, 1000.0 - 3600, 1.0)
    assert clock.offset < -3000
    for i in range(3):
        clock.observe(1000.1 + i * 0.01, 1000.11 + i * 0.01, 1000.1 + i * 0.01, 1.0)
    assert clock.offset == 0.0
    clock.observe(1001.0, 1001.01, 1001.0 + 3600, 1.0)  # now that two agreed, one wrong reply is set aside
    assert clock.offset == 0.0

"""Jobs and the shared job_next index through the real drivers, on every backend."""

from __future__ import annotations

import pytest
from support import Session, fresh_agent, location_of, race, service_of, serving


def job(id_: str, due, spec=None) -> dict:
    return {"id": id_, "spec": spec if spec is not None else {"do": id_}, "due": due}


def test_put_get_list_count_remove(session):
    s = session
    assert s("job_get", place="waiting", id="j") == {"reply": "job", "job": None}
    assert s("job_count", place="waiting") == {"reply": "count", "count": 0}
    spec = {"big": 2**64 + 1, "f": 0.5, "u": "ü", "list": [None, True]}
    assert s("job_put", place="waiting", job=job("j", 1_800_000_000.25, spec)) == {"reply": "done"}
    assert s("job_put", place="firing", job=job("j", 7)) == {"reply": "done"}
    assert s("job_put", place="waiting", job=job("k", 5)) == {"reply": "done"}
    got = s("job_get", place="waiting", id="j")["job"]
    assert got == job("j", 1_800_000_000.25, spec) and got["spec"]["big"] == 2**64 + 1
    assert s("job_get", place="firing", id="j")["job"] == job("j", 7)
    assert sorted(j["id"] for j in s("job_list", place="waiting")["jobs"]) == ["j", "k"]
    assert s("job_count", place="waiting")["count"] == 2
    assert s("job_count", place="ending")["count"] == 0
    assert s("job_put", place="waiting", job=job("k", 6, {"new": 1})) == {"reply": "done"}
    assert s("job_get", place="waiting", id="k")["job"] == job("k", 6, {"new": 1})
    assert s("job_count", place="waiting")["count"] == 2
    assert s("job_remove", place="waiting", id="j") == {"reply": "found", "found": True}
    assert s("job_remove", place="waiting", id="j") == {"reply": "found", "found": False}
    assert s("job_get", place="firing", id="j")["job"] == job("j", 7)
    assert s("job_list", place="waiting")["jobs"] == [job("k", 6, {"new": 1})]


def test_shift_moves_whole_and_replaces(session):
    s = session
    s("job_put", place="waiting", job=job("j", 10, {"v": "waiting"}))
    s("job_put", place="firing", job=job("j", 99, {"v": "old firing"}))
    assert s("job_shift", id="j", **{"from": "waiting", "to": "firing"}) == {"reply": "found", "found": True}
    assert s("job_get", place="waiting", id="j")["job"] is None
    assert s("job_get", place="firing", id="j")["job"] == job("j", 10, {"v": "waiting"})
    assert s("job_shift", id="j", **{"from": "waiting", "to": "firing"}) == {"reply": "found", "found": False}
    assert s("job_shift", id="nope", **{"from": "firing", "to": "ending"})["found"] is False
    assert s("job_shift", id="j", **{"from": "firing", "to": "waiting"})["found"] is True
    assert s("job_next")["next"] is not None


def test_eight_shifters_of_one_job_exactly_one_finds_it(store):
    agent = fresh_agent()
    with serving(store, 8) as procs:
        s = Session(procs[0], agent)
        for round_ in range(5):
            jid = f"race-{round_}"
            s("job_put", place="waiting", job=job(jid, 100 + round_))
            targets = ["firing", "ending"]
            replies = race(procs, lambda i, jid=jid, targets=targets: {"op": "job_shift", "agent": agent, "id": jid,
                                              "from": "waiting", "to": targets[i % 2]})
            found = [i for i, r in enumerate(replies) if r == {"reply": "found", "found": True}]
            assert len(found) == 1, replies
            assert all(r == {"reply": "found", "found": False} for i, r in enumerate(replies) if i != found[0])
            places = [p for p in ("waiting", "firing", "ending") if s("job_get", place=p, id=jid)["job"] is not None]
            assert places == [targets[found[0] % 2]]
            assert s("job_get", place=places[0], id=jid)["job"] == job(jid, 100 + round_)


def test_job_next_answers_for_every_agent_in_the_store(store):
    with serving(store) as procs:
        a = Session(procs[0], {"id": "same", "owner": None})
        b = Session(procs[0], {"id": "same", "owner": "someone"})
        assert a("job_next") == {"reply": "next", "next": None}
        a("job_put", place="waiting", job=job("x", 500))
        b("job_put", place="waiting", job=job("y", 300.5))
        b("job_put", place="firing", job=job("z", 1))  # firing never counts
        assert a("job_next") == {"reply": "next", "next": 300.5}
        assert b("job_next")["next"] == 300.5
        assert b("job_shift", id="y", **{"from": "waiting", "to": "firing"})["found"]
        assert a("job_next")["next"] == 500
        a("job_put", place="waiting", job=job("x", 700))  # moved later: the old entry must go
        assert a("job_next")["next"] == 700
        assert a("job_put", place="waiting", job=job("w", 2**70))["reply"] == "error"  # past DUE_MAX: no key
        a("job_put", place="waiting", job=job("w", 2**53 - 1))
        assert a("job_next")["next"] == 700
        a("job_remove", place="waiting", id="x")
        assert a("job_next")["next"] == 2**53 - 1
        a("job_remove", place="waiting", id="w")
        assert a("job_next")["next"] is None
        b("job_shift", id="y", **{"from": "firing", "to": "waiting"})
        assert a("job_next")["next"] == 300.5
        a("job_put", place="waiting", job=job("neg", -5))
        assert b("job_next")["next"] == -5


def test_job_mark_moves_on_every_waiting_change(session):
    s = session
    seen = [s("job_mark")["mark"]]
    assert seen == [0]

    def moved() -> None:
        mark = s("job_mark")["mark"]
        assert isinstance(mark, int) and mark not in seen
        seen.append(mark)

    s("job_put", place="waiting", job=job("j", 10))
    moved()
    s("job_put", place="waiting", job=job("j", 10))
    moved()
    s("job_shift", id="j", **{"from": "waiting", "to": "firing"})
    moved()
    s("job_shift", id="j", **{"from": "firing", "to": "waiting"})
    moved()
    s("job_remove", place="waiting", id="j")
    moved()


def test_day(session):
    assert session("job_day") == {"reply": "day", "day": 0, "sent": 0}
    assert session("job_set_day", day=20_000, sent=3) == {"reply": "done"}
    assert session("job_day") == {"reply": "day", "day": 20_000, "sent": 3}
    for bad in ({"day": -1, "sent": 0}, {"day": 1.0, "sent": 0}, {"day": 1, "sent": "2"}, {"day": 1}):
        assert session("job_set_day", **bad)["reply"] == "error"
    assert session("job_day") == {"reply": "day", "day": 20_000, "sent": 3}


def test_agents_jobs_are_their_own(store):
    with serving(store) as procs:
        a = Session(procs[0], {"id": "x", "owner": ""})
        b = Session(procs[0], {"id": "x", "owner": None})
        a("job_put", place="waiting", job=job("j", 1))
        assert b("job_get", place="waiting", id="j")["job"] is None
        assert b("job_count", place="waiting")["count"] == 0
        assert b("job_shift", id="j", **{"from": "waiting", "to": "firing"})["found"] is False
        assert b("job_remove", place="waiting", id="j")["found"] is False
        assert a("job_get", place="waiting", id="j")["job"] == job("j", 1)


HOSTILE_IDS = ["/", "..", "a/b", "%", "ü", "日本", " ", "x" * 256, "é" * 128, "~", "_"]


def test_hostile_job_ids_are_kept_exactly(session):
    for i, jid in enumerate(HOSTILE_IDS):
        assert session("job_put", place="waiting", job=job(jid, i)) == {"reply": "done"}, jid
    assert sorted(j["id"] for j in session("job_list", place="waiting")["jobs"]) == sorted(HOSTILE_IDS)
    for i, jid in enumerate(HOSTILE_IDS):
        assert session("job_get", place="waiting", id=jid)["job"] == job(jid, i)


@pytest.mark.parametrize("bad", [
    {"place": "later", "job": job("j", 1)},
    {"place": "waiting", "job": job("", 1)},
    {"place": "waiting", "job": job("x" * 257, 1)},
    {"place": "waiting", "job": job("é" * 129, 1)},
    {"place": "waiting", "job": job("a\nb", 1)},
    {"place": "waiting", "job": job("a\x85b", 1)},
    {"place": "waiting", "job": job("j", "1")},
    {"place": "waiting", "job": job("j", True)},
    {"place": "waiting", "job": {"id": "j", "due": 1}},
    {"place": "waiting", "job": {"id": "j", "spec": 1, "due": 1, "extra": 2}},
    {"place": "waiting", "job": job("j", 1, "x" * (1 << 20))},
])
def test_rule_breaking_jobs_change_nothing(session, bad):
    session("job_put", place="waiting", job=job("keep", 3))
    mark = session("job_mark")["mark"]
    assert session("job_put", **bad)["reply"] == "error"
    assert session("job_list", place="waiting")["jobs"] == [job("keep", 3)]
    assert session("job_mark")["mark"] == mark


def test_spec_of_exactly_one_mebibyte_is_kept(session):
    spec = "x" * ((1 << 20) - 2)  # a JSON string: the quotes make it 1 MiB
    assert session("job_put", place="waiting", job=job("big", 1, spec)) == {"reply": "done"}
    assert session("job_get", place="waiting", id="big")["job"]["spec"] == spec


def test_a_stale_index_entry_wakes_early_and_is_collected(store_env, monkeypatch):
    """A crash between the index entry and the record: early answer at first, then cleaned."""
    import cloudstore.store.due_index as due_index
    from cloudstore.protocol.validate import Agent

    service = service_of(store_env)
    loc = location_of(store_env)
    agent = Agent(id="crashy", owner="o")
    service.jobs.index.add(service.space.keys(agent), "ghost", 5)  # the record never came
    service.jobs.put(agent, "waiting", job("real", 50))
    assert service.jobs.next() == 5  # early, never late
    monkeypatch.setattr(due_index, "GRACE", 0.0)
    assert service.jobs.next() == 50
    assert len(service.space.store.list(due_index.due_root(loc.prefix))) == 1


def test_a_removed_jobs_record_stays_a_tombstone_until_long_after(store_env, monkeypatch):
    """A record left with no place is kept (a create landing late must find it there), and a listing
    deletes it once it has been empty for TOMBSTONE_MS, so one-shot job ids do not pile up."""
    import cloudstore.store.jobs as jobs
    from cloudstore.protocol.validate import Agent

    service = service_of(store_env)
    agent = Agent(id="tomb", owner="o")
    keys = service.space.keys(agent)
    service.jobs.put(agent, "waiting", job("once", 50))
    assert service.jobs.remove(agent, "waiting", "once")
    assert [item.key for item in service.space.store.list(keys.jobs())] == [keys.job("once")]
    assert service.jobs.listing(agent, "waiting") == [] and service.jobs.count(agent, "waiting") == 0
    assert len(service.space.store.list(keys.jobs())) == 1, "kept while young"
    monkeypatch.setattr(jobs, "TOMBSTONE_MS", -1)
    assert service.jobs.count(agent, "waiting") == 0
    assert service.space.store.list(keys.jobs()) == [], "swept once old"
    service.jobs.put(agent, "waiting", job("once", 60))
    assert service.jobs.listing(agent, "waiting") == [job("once", 60)]


def test_job_due_names_every_agents_due_jobs_only_for_the_schedulers_driver(store, tmp_path):
    """job_due (the runner's poll): the index by name, soonest first, paged; refused by an agent's driver."""
    from dataclasses import replace

    own = replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"})
    with serving(store) as plain, serving(own) as ops:
        a = Session(ops[0], {"id": "a", "owner": None})
        b = Session(ops[0], {"id": "b/x", "owner": "o"})
        refused = Session(plain[0], {"id": "a", "owner": None})("job_due")
        assert refused["reply"] == "error" and "unknown op" in refused["error"]
        assert a("job_due") == {"reply": "due", "due": [], "more": False}
        a("job_put", place="waiting", job=job("late", 900))
        b("job_put", place="waiting", job=job("soon", 300.5))
        a("job_put", place="firing", job=job("firing", 1))  # firing is never in the index
        long_id = "é" * 120  # its key part is a hash: named null, found by listing the agent's waiting
        a("job_put", place="waiting", job=job(long_id, 600))
        got = a("job_due")
        assert got["more"] is False
        assert [(e["agent"], e["job"], e["due"]) for e in got["due"]] == [
            ("_o/_b%2Fx", "soon", 300.5), ("-/_a", None, 600), ("-/_a", "late", 900)]
        first = a("job_due", limit=1)
        assert first["more"] is True and first["due"][0]["job"] == "soon"
        rest = a("job_due", limit=5, after=first["due"][0]["key"])
        assert [e["due"] for e in rest["due"]] == [600, 900]
        a("job_put", place="waiting", job=job("late", 100))  # moved sooner: its old entry goes
        b("job_shift", id="soon", **{"from": "waiting", "to": "firing"})
        assert [(e["job"], e["due"]) for e in a("job_due")["due"]] == [("late", 100), (None, 600)]
        for bad in ({"limit": 0}, {"limit": 1001}, {"limit": True}, {"after": 5}, {"after": "a\u0000b"},
                    {"after": "x" * 1025}):
            reply = a("job_due", **bad)
            assert reply["reply"] == "error", (bad, reply)
        assert len(a("job_due")["due"]) == 2, "a refused job_due changed something"


def test_a_job_entering_waiting_nudges_this_machines_runners(store, tmp_path):
    """The driver's nudge (wake.py): a put or shift INTO waiting wakes a listener; other changes do not."""
    from cloudstore.protocol.client import ServeProcess
    from cloudstore.runtime.wake import Named, WakeListener

    folder = str(tmp_path / "wake")
    listener = WakeListener(folder)
    assert listener.listening
    proc = ServeProcess(store.program, env={**store.env, "LNK_WAKE_DIR": folder})
    try:
        s = Session(proc, fresh_agent())
        s("job_put", place="waiting", job=job("j", 5))
        assert listener.wait(5.0), "a put into waiting sent no nudge"
        named = Named(s.agent["owner"], s.agent["id"], "j", 5.0)
        assert listener.take_names() == ([named], False), "the nudge must name the job put"
        s("job_shift", id="j", **{"from": "waiting", "to": "firing"})
        s("job_put", place="ending", job=job("e", 5))
        s("job_remove", place="ending", id="e")
        assert not listener.wait(0.3), "a change that put nothing in waiting nudged"
        s("job_shift", id="j", **{"from": "firing", "to": "waiting"})
        assert listener.wait(5.0), "a shift into waiting sent no nudge"
        assert listener.take_names() == ([named], False), "the nudge must name the job shifted"
    finally:
        proc.close()
        listener.close()
    assert list((tmp_path / "wake").iterdir()) == [], "the listener left its socket behind"


def test_job_claim_moves_waiting_to_firing_and_answers_the_job_only_for_the_schedulers_driver(store):
    """job_claim (the runner's claim): the job it moved, null when none was waiting; refused by an agent's driver."""
    from dataclasses import replace

    own = replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"})
    with serving(store) as plain, serving(own) as ops:
        s = Session(ops[0], fresh_agent())
        refused = Session(plain[0], s.agent)("job_claim", id="j")
        assert refused["reply"] == "error" and "unknown op" in refused["error"]
        assert s("job_claim", id="j") == {"reply": "claimed", "job": None}
        s("job_put", place="waiting", job=job("j", 5, {"v": 1}))
        mark = s("job_mark")["mark"]
        assert s("job_claim", id="j") == {"reply": "claimed", "job": job("j", 5, {"v": 1})}
        assert s("job_mark")["mark"] != mark, "a job left waiting: the mark must move"
        assert s("job_get", place="firing", id="j")["job"] == job("j", 5, {"v": 1})
        assert s("job_get", place="waiting", id="j")["job"] is None
        assert s("job_next")["next"] is None, "its due entry must go with it"
        assert s("job_claim", id="j") == {"reply": "claimed", "job": None}, "claimed twice"
        assert s("job_claim", id="")["reply"] == "error"


def test_lease_take_names_the_holder_only_for_the_schedulers_driver(store):
    """lease_take (the runner's claim lease): take's answers, plus who holds it when held; refused by an
    agent's driver."""
    from dataclasses import replace

    own = replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"})
    with serving(store) as plain, serving(own) as ops:
        s = Session(ops[0], fresh_agent())
        refused = Session(plain[0], s.agent)("lease_take", thread="job:j", holder="r1", lapse_ms=60_000)
        assert refused["reply"] == "error" and "unknown op" in refused["error"]
        assert s("leases", lapse_ms=60_000)["leases"] == [], "a refused request must change nothing"
        take = {"thread": "job:j", "lapse_ms": 60_000}

        def fenced(reply: dict) -> tuple[dict, int | None]:
            """The reply without its fence and held_ms (issue 44), and the fence: a store time in ms for a
            lease it gave this holder, null when held by another."""
            fence, held_ms = reply.pop("fence"), reply.pop("held_ms")
            assert isinstance(held_ms, int) and held_ms >= 0, reply
            if reply["took"] == "held":
                assert fence is None, reply
            else:
                assert isinstance(fence, int) and fence > 0, reply
            return reply, fence

        first, f1 = fenced(s("lease_take", holder="r1", **take))
        assert first == {"reply": "took", "took": "took", "holder": None}
        assert fenced(s("lease_take", holder="r2", **take))[0] == {"reply": "took", "took": "held", "holder": "r1"}
        assert s("take", holder="r2", **take) == {"reply": "took", "took": "held"}, "the protocol's take is unchanged"
        again, f2 = fenced(s("lease_take", holder="r1", **take))
        assert again == {"reply": "took", "took": "took", "holder": None} and f2 == f1, "its own take keeps the fence"
        assert f1 is not None
        s("end", thread="job:j", holder="r1")
        other, f3 = fenced(s("lease_take", holder="r2", **take))
        assert other == {"reply": "took", "took": "took", "holder": None}
        assert f3 is not None and f3 > f1, "a new holder, a larger fence"
        lapsing = {"thread": "job:k", "lapse_ms": 0}
        assert s("lease_take", holder="r1", **lapsing)["took"] == "took"
        assert fenced(s("lease_take", holder="r2", **lapsing))[0] == {"reply": "took", "took": "lapsed", "holder": None}
        assert s("lease_take", holder=5, **take)["reply"] == "error"

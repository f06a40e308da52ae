"""The claim lease's fence and the finish under it (issue 44): on the folder, moto and fake-gcs-server.

A lease's fence is its ``started`` (store milliseconds, heads.py): every take
that gives the lease to a holder writes ``max(now, the fence before + 1)``,
and an ended lease keeps it.  What must hold:

* the fences of one thread's successive holders only grow: across takes
  after an end, takeovers of a lapsed lease, a head an older driver rewrote
  without it, and a head deleted (as gc does); a holder's own take again
  (a renewal) keeps its fence;
* ``lease_take`` and ``job_claim`` answer it to the holder, and the
  protocol's ``take`` reply stays as wire.md says;
* ``job_finish`` takes a job out of firing only while its claim is the
  holder's with that fence in the store (lapsed but not taken over counts),
  and changes nothing otherwise; a recovery writes the record anew before it
  fires, so a finish decided before the takeover fails.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from support import Session, fresh_agent, location_of, serving

from cloudstore.generations import Update
from cloudstore.settings import open_store

JOB_ID = "fenced-job"
THREAD = "job:" + JOB_ID
LONG_MS = 600_000
JOB = {"id": JOB_ID, "spec": None, "due": 1000.0}
NOT_AFTER = 2_000_000_000.0


@pytest.fixture
def own(store_env: Any) -> Any:
    """The store as the scheduler's own driver sees it (``LNK_SCHEDULER_OPS=1``); its env is this process's
    too, so a test may reach the raw objects (``raw_head``)."""
    return replace(store_env, env={**store_env.env, "LNK_SCHEDULER_OPS": "1"})


def take(s: Session, holder: str, lapse_ms: int = LONG_MS) -> dict[str, Any]:
    reply = s("lease_take", thread=THREAD, holder=holder, lapse_ms=lapse_ms)
    assert type(reply.pop("held_ms")) is int, reply  # how long before the reply the lease was written
    return reply  # type: ignore[no-any-return]


def claim(s: Session, holder: str, lapse_ms: int = LONG_MS, recover: bool = False) -> dict[str, Any]:
    return s("job_claim", id=JOB_ID, thread=THREAD, holder=holder, lapse_ms=lapse_ms,  # type: ignore[no-any-return]
             not_after=NOT_AFTER, **({"recover": True} if recover else {}))


def finish(s: Session, holder: str, fence: int, keep_ending: bool = False) -> dict[str, Any]:
    return s("job_finish", id=JOB_ID, thread=THREAD, holder=holder, fence=fence,  # type: ignore[no-any-return]
             keep_ending=keep_ending)


def where(s: Session) -> list[str]:
    return [place for place in ("waiting", "firing", "ending") if s("job_get", place=place, id=JOB_ID)["job"]]


class RawHead:
    """The lease's head object itself, as another release (or gc) would write it."""

    def __init__(self, store: Any, agent: dict[str, Any]) -> None:
        self.loc = location_of(store)
        self.store = open_store(self.loc)
        suffix = "/l/_" + THREAD.replace(":", "%3A")
        keys = [item.key for item in self.store.list(self.loc.prefix)
                if item.key.endswith(suffix) and agent["id"] in item.key]
        assert len(keys) == 1, keys
        self.key = keys[0]

    def read(self) -> dict[str, Any]:
        obj = self.store.get(self.key)
        assert obj is not None
        return json.loads(obj.data)  # type: ignore[no-any-return]

    def write(self, head: dict[str, Any]) -> None:
        obj = self.store.get(self.key)
        assert obj is not None
        self.store.put(self.key, json.dumps(head).encode(), Update.of(obj))

    def delete(self) -> None:
        obj = self.store.get(self.key)
        assert obj is not None
        self.store.delete(self.key, obj.version)


def test_fences_grow_across_takes_takeovers_rewrites_and_deletes(own: Any) -> None:
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        fences = []
        first = take(s, "A")
        assert first["took"] == "took" and type(first["fence"]) is int
        fences.append(first["fence"])
        again = take(s, "A")
        assert again == {**first, "took": "took"}, "a holder's own take renews: its fence stays"
        assert take(s, "B") == {"reply": "took", "took": "held", "holder": "A", "fence": None}
        assert s("take", thread=THREAD, holder="B", lapse_ms=LONG_MS) == {"reply": "took", "took": "held"}, \
            "the protocol's take reply carries no fence"
        started = [lease["started"] for lease in s("leases", lapse_ms=LONG_MS)["leases"]]
        assert started == [fences[0] / 1000], "the fence is the lease's start, as leases shows it"
        s("end", thread=THREAD, holder="A")
        head = RawHead(own, s.agent)
        assert head.read().get("started") == fences[0] and "holder" not in head.read(), "an ended lease keeps it"
        after_end = take(s, "B")
        assert after_end["took"] == "took"
        fences.append(after_end["fence"])
        over = take(s, "C", lapse_ms=0)  # B's lease is lapsed at once: C takes it over
        assert over["took"] == "lapsed"
        fences.append(over["fence"])
        # A head far ahead (a writer whose store time ran ahead): the next fence still passes it.
        ahead = head.read()
        head.write({**ahead, "started": ahead["started"] + 10**9})
        over = take(s, "D", lapse_ms=0)
        assert over["took"] == "lapsed" and over["fence"] == ahead["started"] + 10**9 + 1
        fences.append(over["fence"])
        # An older driver's end drops the field (0.6.0's ``without_lease``), and gc deletes an ended head:
        # store time has moved on since the last fence was given, so the next one is larger all the same.
        head.write({"thread": THREAD, "epoch": 0})
        dropped = take(s, "E")
        assert dropped["took"] == "took" and dropped["fence"] > fences[-2]
        s("end", thread=THREAD, holder="E")
        head.delete()
        deleted = take(s, "F")
        assert deleted["took"] == "took" and deleted["fence"] > dropped["fence"]
        assert fences == sorted(set(fences)), fences


def test_a_claim_answers_its_fence_and_a_recovery_a_larger_one(own: Any) -> None:
    with serving(own) as procs:
        s = Session(procs[0], fresh_agent())
        s("job_put", place="waiting", job=JOB)
        first = claim(s, "A", lapse_ms=0)
        assert first["job"] == JOB and first["took"] == "took" and type(first["fence"]) is int
        again = claim(s, "B", lapse_ms=0)  # A's lease lapsed at once: B recovers the job left in firing
        assert again["took"] == "lapsed" and again["recovered"] is True and again["job"] == JOB
        assert again["fence"] > first["fence"]
        taken = claim(s, "C", lapse_ms=0, recover=True)
        assert taken["recovered"] is True and taken["fence"] > again["fence"]
        mine = claim(s, "C", recover=True)  # a runner recovering a job it fired itself: a new fence all the same
        assert mine["took"] == "took" and mine["recovered"] is True and mine["fence"] > taken["fence"]
        assert where(s) == ["firing"]


def test_a_finish_moves_the_job_only_under_its_claim(own: Any) -> None:
    with serving(own, 2) as procs:
        agent = fresh_agent()
        a, b = Session(procs[0], agent), Session(procs[1], agent)
        a("job_put", place="waiting", job=JOB)
        mine = claim(a, "A")
        assert finish(a, "A", mine["fence"] + 1) == {"reply": "finished", "finished": False, "ours": False,
                                                     "holder": "A"}, "another fence of the same holder"
        assert finish(a, "B", mine["fence"]) == {"reply": "finished", "finished": False, "ours": False,
                                                 "holder": "A"}
        assert where(a) == ["firing"]
        assert finish(a, "A", mine["fence"], keep_ending=True) == {"reply": "finished", "finished": True,
                                                                   "ours": True, "holder": None}
        assert where(a) == ["ending"]
        assert a("leases", lapse_ms=LONG_MS)["leases"] == [], "the finish ended the lease"
        assert b("job_claims")["claims"] == [] or all(c["job"] != JOB_ID for c in b("job_claims")["claims"])
        # Again: a lapsed lease nobody took over is still the holder's.
        a("job_remove", place="ending", id=JOB_ID)
        a("job_put", place="waiting", job=JOB)
        mine = claim(a, "A", lapse_ms=0)
        assert finish(a, "A", mine["fence"]) == {"reply": "finished", "finished": True, "ours": True,
                                                 "holder": None}
        assert where(a) == []


def test_a_finish_decided_before_a_takeover_never_removes_the_recovered_job(own: Any) -> None:
    """A's driver remembers the record it wrote when it claimed; B takes the lapsed lease over and recovers
    the job (its record written anew); A's finish, sent from that memory, must fail and change nothing."""
    with serving(own, 2) as procs:
        agent = fresh_agent()
        a, b = Session(procs[0], agent), Session(procs[1], agent)
        a("job_put", place="waiting", job=JOB)
        mine = claim(a, "A", lapse_ms=0)
        theirs = claim(b, "B", lapse_ms=0, recover=True)
        assert theirs["recovered"] is True and theirs["fence"] > mine["fence"]
        assert finish(a, "A", mine["fence"]) == {"reply": "finished", "finished": False, "ours": False,
                                                 "holder": "B"}
        assert where(a) == ["firing"], "a superseded finish took the job another runner fires out of firing"
        assert finish(b, "B", theirs["fence"]) == {"reply": "finished", "finished": True, "ours": True,
                                                   "holder": None}
        assert where(a) == []


def test_lease_renew_renews_each_lease_of_any_agent_and_says_which_are_not_the_holders(own: Any) -> None:
    with serving(own) as procs:
        one, two = fresh_agent(), fresh_agent(None)
        s, t = Session(procs[0], one), Session(procs[0], two)
        for session, thread, holder in ((s, "job:x", "A"), (s, "job:y", "B"), (t, "job:x", "A")):
            session("take", thread=thread, holder=holder, lapse_ms=LONG_MS)
        leases = [{"agent": one, "thread": "job:x"}, {"agent": one, "thread": "job:y"},
                  {"agent": two, "thread": "job:x"}, {"agent": two, "thread": "job:none"}]
        renewed = s("lease_renew", holder="A", leases=leases)
        assert type(renewed.pop("held_ms")) is int
        assert renewed == {"reply": "renewed", "renewed": [True, False, True, False]}
        assert s("lease_renew", holder="A", leases=[])["reply"] == "error"
        assert s("lease_renew", holder="A", leases=[{"thread": "job:x"}])["reply"] == "error"

"""Issue 26, case 1: what a runner writes per job stays within GCS's write a second per object.

A fired job's record is written three times (put, claim, finish) and its
lease twice (take, end).  These tests pin down, with a scripted driver that
records each op and when it was sent, the three rules that keep those writes
apart without holding a worker or a driver process meanwhile:

* the finish is sent ``FINISH_PACE`` after its claim's reply, off the worker:
  the slot is free for the next job as soon as the fire has ended;
* a job handed out with ``look_first`` (deferred to its owner, or late) is
  read first, and a job gone since the poll is claimed with no write at all;
* a claim is renewed lapse/4 to lapse/3 after its last confirmation, never
  a moment after its take (tests/scheduler/test_renewer.py).

The same at a real limit, counted at the proxy: ``test_throttle_scheduler.py``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from scheduler_rig import QuickFire

from cloudstore.scheduling import claiming
from cloudstore.scheduling.claim_leases import Claims
from cloudstore.scheduling.claiming import Claimer
from cloudstore.scheduling.store_client import Agent, AgentStore
from cloudstore.scheduling.timer_queue import TimerQueue

AGENT = Agent(owner=None, id="a")


class Recording:
    """The runner's own driver: claims succeed, jobs listed in ``gone`` are no longer waiting."""

    def __init__(self, gone: frozenset[str] = frozenset(), claim_takes: float = 0.0) -> None:
        self.gone = gone
        self.claim_takes = claim_takes  # seconds a job_claim takes to answer (its writes land meanwhile)
        self.sent: list[tuple[str, str, float]] = []  # (op, job id, time.monotonic())
        self.lock = threading.Lock()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        job = str(request.get("id") or request.get("thread", "").removeprefix("job:"))
        with self.lock:
            self.sent.append((op, job, time.monotonic()))
        if op == "job_get":
            return {"reply": "job", "job": None if job in self.gone else {"id": job, "spec": None, "due": 0}}
        if op == "job_claim":
            time.sleep(self.claim_takes)
            return {"reply": "claimed", "took": "took", "holder": None, "recovered": False,
                    "job": {"id": job, "spec": None, "due": 0}, "fence": 7}
        if op == "job_finish":
            assert request["fence"] == 7 and request["holder"] == "runner-A", request
            return {"reply": "finished", "finished": True, "ours": True, "holder": None}
        if op in ("end", "renew"):
            return {"reply": "done"}
        raise AssertionError(f"unexpected op {request}")

    def close(self) -> None:
        pass

    def at(self, op: str, job: str) -> float:
        return next(t for o, j, t in self.sent if o == op and j == job)

    def ops(self, job: str) -> list[str]:
        return [o for o, j, _ in self.sent if j == job]


def run_claimer(driver: Recording, workers: int, steps: Any) -> tuple[Claimer, QuickFire, list[str]]:
    """A claimer over ``driver``; ``steps(claimer, store, told)`` runs, then it is shut down."""
    store = AgentStore(AGENT, driver, own_driver=True)
    claims = Claims("runner-A", 30.0)
    fire = QuickFire()
    claimer = Claimer(claims, fire, workers, keep_ending=False)  # type: ignore[arg-type]
    told: list[str] = []
    try:
        steps(claimer, store, told)
        claimer.shutdown()
    finally:
        claims.close()
    return claimer, fire, told


def test_the_worker_is_free_while_its_finish_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker: the second job is claimed and fired while the first's finish waits for its pace."""
    monkeypatch.setattr(claiming, "FINISH_PACE", 60.0)  # longer than the test: stopping finishes at once
    driver = Recording()

    def steps(claimer: Claimer, store: AgentStore, told: list[str]) -> None:
        assert claimer.acquire_slot(lambda: False)
        assert claimer.dispatch(store, "first", told.append)
        assert claimer.acquire_slot(lambda: False), "the slot comes back when the fire ends, not the finish"
        assert claimer.busy(AGENT, "first"), "a job waiting for its finish is still in flight here"
        assert claimer.dispatch(store, "second", told.append)
        wait_until(lambda: told == ["claimed", "claimed"])
        assert "job_finish" not in driver.ops("first"), "finished before its pace"

    claimer, fire, told = run_claimer(driver, 1, steps)
    assert fire.fired == 2
    for job in ("first", "second"):
        assert driver.ops(job) == ["job_claim", "job_finish"], driver.sent  # stopping: finished, then let go
        assert not claimer.busy(AGENT, job)


def test_the_finish_is_sent_a_pace_after_its_claims_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the reply, not the request: a claim that began before the put's record landed (it
    listed the due entry at once) writes the record after it, and a finish a pace after the claim
    began came less than a second after the put's write (measured: 0.98 s, refused on GCS)."""
    monkeypatch.setattr(claiming, "FINISH_PACE", 0.3)
    driver = Recording(claim_takes=0.2)

    def steps(claimer: Claimer, store: AgentStore, told: list[str]) -> None:
        assert claimer.acquire_slot(lambda: False)
        assert claimer.dispatch(store, "j", told.append)
        wait_until(lambda: "job_finish" in driver.ops("j"))

    run_claimer(driver, 1, steps)
    assert driver.ops("j") == ["job_claim", "job_finish"]
    assert driver.at("job_finish", "j") - driver.at("job_claim", "j") >= 0.2 + 0.3  # a timer never ends early


def wait_until(check: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_job_read_first_and_gone_is_claimed_with_no_write() -> None:
    driver = Recording(gone=frozenset({"old"}))

    def steps(claimer: Claimer, store: AgentStore, told: list[str]) -> None:
        for job in ("old", "new"):
            assert claimer.acquire_slot(lambda: False)
            assert claimer.dispatch(store, job, told.append, look_first=True)

    _, _, told = run_claimer(driver, 2, steps)
    assert driver.ops("old") == ["job_get"], "a job gone since the poll: read, and no lease taken for it"
    assert driver.ops("new") == ["job_get", "job_claim", "job_finish"]
    assert sorted(told) == ["claimed", "gone"]


def test_a_fire_that_ended_marks_its_claim_ending_until_it_is_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claiming, "FINISH_PACE", 60.0)  # stopping finishes at once
    driver = Recording()
    seen: list[bool] = []

    def steps(claimer: Claimer, store: AgentStore, told: list[str]) -> None:
        assert claimer.acquire_slot(lambda: False)
        assert claimer.dispatch(store, "j", told.append)
        wait_until(lambda: claimer.fired == 1 and claimer.claims._held)
        wait_until(lambda: all(c.ending for c in claimer.claims._held.values()))
        seen.extend(c.ending for c in claimer.claims._held.values())

    run_claimer(driver, 1, steps)
    assert seen == [True]


def test_the_timer_queue_runs_each_item_at_its_time_and_the_rest_when_closed() -> None:
    queue = TimerQueue(2, "test")
    ran: list[tuple[str, float]] = []
    start = time.monotonic()
    for name, delay in (("late", 0.3), ("soon", 0.1), ("never waited", 60.0)):
        queue.at(start + delay, lambda name=name: ran.append((name, time.monotonic())))  # type: ignore[misc]
    wait_until(lambda: len(ran) == 2)
    assert [name for name, _ in ran] == ["soon", "late"] and queue.pending() == 1
    assert ran[0][1] >= start + 0.1 and ran[1][1] >= start + 0.3  # never before its time
    queue.close()  # what is left runs now: a stopping runner finishes what it fired
    assert [name for name, _ in ran] == ["soon", "late", "never waited"]
    queue.at(start + 60.0, lambda: ran.append(("after close", time.monotonic())))
    assert ran[-1][0] == "after close", "once closed, an item runs at once in the caller"


def test_a_claim_lost_while_its_finish_waited_is_not_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another runner holds the lease now (a renewal said ``lost``), and fires the job again: nothing is sent."""
    monkeypatch.setattr(claiming, "FINISH_PACE", 60.0)
    driver = Recording()

    def steps(claimer: Claimer, store: AgentStore, told: list[str]) -> None:
        assert claimer.acquire_slot(lambda: False)
        assert claimer.dispatch(store, "j", told.append)
        wait_until(lambda: told == ["claimed"] and claimer.acquire_slot(lambda: False))
        claimer.release_slot()
        held = list(claimer.claims._held.values())
        assert [c.job_id for c in held] == ["j"]
        held[0].lose("lost")

    claimer, fire, _ = run_claimer(driver, 1, steps)
    assert fire.fired == 1 and driver.ops("j") == ["job_claim"], driver.sent
    assert not claimer.busy(AGENT, "j")


def test_a_job_the_sweep_listed_in_firing_and_finished_since_is_read_not_taken() -> None:
    """The per-agent sweep lists firing, then takes each job's lease: a job finished a moment after
    the listing had its ended lease taken and let go again, two writes within a second of the end
    (seen at the proxy at three runners, the second refused).  Read first, it costs a read."""
    driver = Recording(gone=frozenset({"done"}))
    claims = Claims("runner-A", 30.0)
    claimer = Claimer(claims, QuickFire(), 1, keep_ending=False)  # type: ignore[arg-type]
    store = AgentStore(AGENT, driver, own_driver=True)
    try:
        assert claimer.reclaim(store, "done", look_first=True) == "gone"
        assert driver.ops("done") == ["job_get"], "no lease taken for a job gone from firing"
        assert not claimer.busy(AGENT, "done")
    finally:
        claimer.shutdown()
        claims.close()

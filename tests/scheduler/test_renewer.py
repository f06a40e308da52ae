"""The claims' renewer (``claim_leases.Claims``), on an injected clock: deterministic, no store.

Issue 44, case 1: with a slow store and a starved machine, live runners' claims went unconfirmed past
the fence (2/3 of the lapse) and finished fires were fired again.  Each claim must keep lapse/3 of slack:

* rounds are planned from their starts, and every claim is renewed by lapse/3 after its last
  confirmation was sent, whatever the number of claims and the store's speed (they go together: one
  ``lease_renew`` for every agent, or ``renew`` at once through bridges), never a moment after its
  take, and sooner by the time the last renewals took to answer on a slow store;
* a round that starts well after it was planned is a pause: logged, and every claim renewed then;
* a claim whose command has ended is renewed whatever its local age says, until its finish.

``LNK_FUZZ_SEED`` replays the seeded schedule test with another seed (printed on failure).
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import pytest

from cloudstore.scheduling.claim_leases import Claim, Claims
from cloudstore.scheduling.store_client import Agent, AgentStore

AGENT = Agent(owner=None, id="a")


class Clock:
    """A clock the test moves: ``now`` seconds, advanced by the fake store's requests."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowStore:
    """A driver whose every request takes ``latency`` on ``clock``; records what was sent and when."""

    def __init__(self, clock: Clock, latency: float = 0.0, lost: frozenset[str] = frozenset()) -> None:
        self.clock = clock
        self.latency = latency
        self.lost = lost
        self.sent: list[tuple[str, list[str], float]] = []
        self.lock = threading.Lock()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            threads = [x["thread"] for x in request["leases"]] if "leases" in request else [request.get("thread")]
            self.sent.append((request["op"], threads, self.clock.now))
            self.clock.now += self.latency
        if request["op"] == "lease_renew":
            return {"reply": "renewed", "renewed": [x["thread"] not in self.lost for x in request["leases"]],
                    "held_ms": 0}
        if request["op"] == "renew":
            return {"reply": "lost" if request["thread"] in self.lost else "done"}
        raise AssertionError(request)

    def close(self) -> None:
        pass


def claims_on(clock: Clock, lapse: float = 3.0) -> Claims:
    return Claims("runner-A", lapse, clock=clock, start=False)


def hold(claims: Claims, store: AgentStore, job: str, clock: Clock) -> Claim:
    claim = claims.hold(store, job, "took", None, clock.now, fence=1)
    assert claim is not None
    return claim


def test_every_due_claim_is_renewed_in_one_request_timed_from_the_rounds_start() -> None:
    """Fifty claims, a store that takes 0.3 s a request at lapse 3: one ``lease_renew`` renews them all, so
    none waits behind the others (one at a time, the last was sent 15 s late: fenced five times over)."""
    clock = Clock()
    store = SlowStore(clock, latency=0.3)
    claims = claims_on(clock)
    agent_store = AgentStore(AGENT, store, own_driver=True)
    held = [hold(claims, agent_store, f"j{i}", clock) for i in range(50)]
    planned = clock.now + claims.interval
    clock.now = planned
    after = claims.round(planned)
    assert [(op, len(threads)) for op, threads, _ in store.sent] == [("lease_renew", 50)]
    assert all(c.confirmed == planned for c in held), "confirmed when the request was SENT"
    assert after == pytest.approx(planned + claims.interval - claims.lead()), "timed from this one's start"
    assert all(claims.stale(c) is None for c in held)


def test_through_bridges_claims_are_renewed_at_once_not_one_after_another() -> None:
    clock = Clock()
    claims = Claims("runner-A", 3.0, clock=clock, start=False)
    inside = [0]
    most = [0]
    lock = threading.Lock()

    class Bridge:
        def request(self, request: dict[str, Any]) -> dict[str, Any]:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.2)
            with lock:
                inside[0] -= 1
            return {"reply": "done"}

        def close(self) -> None:
            pass

    try:
        stores = [AgentStore(Agent(owner="o", id=f"b{i}"), Bridge()) for i in range(4)]
        held = [hold(claims, s, "j", clock) for s in stores]
        clock.now += claims.interval
        started = time.monotonic()
        claims.round(clock.now)
        assert time.monotonic() - started < 0.6, "four renewals of 0.2 s each, one after another"
        assert most[0] >= 2
        assert all(c.confirmed == clock.now for c in held)
    finally:
        claims.close()


def test_a_claim_is_not_renewed_a_moment_after_its_take_yet_never_later_than_lapse_over_three() -> None:
    clock = Clock()
    store = SlowStore(clock)
    claims = claims_on(clock, lapse=30.0)
    agent_store = AgentStore(AGENT, store, own_driver=True)
    old = hold(claims, agent_store, "old", clock)
    clock.now += 9.0
    fresh = hold(claims, agent_store, "fresh", clock)  # taken a moment before the round
    clock.now += 1.0
    planned = claims.round(clock.now)
    assert [threads for _, threads, _ in store.sent] == [["job:old"]], "the fresh claim: not a second after its take"
    assert old.confirmed == 1010.0
    assert planned <= fresh.confirmed + claims.interval, "the next round comes by the fresh claim's lapse/3"
    clock.now = planned
    claims.round(planned)
    assert store.sent[-1][1] == ["job:old", "job:fresh"], "the old one, due within lapse/12, goes along"
    assert clock.now - 1009.0 <= claims.interval


def test_a_round_that_starts_late_is_a_pause_and_renews_every_claim(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    store = SlowStore(clock)
    claims = claims_on(clock, lapse=30.0)
    agent_store = AgentStore(AGENT, store, own_driver=True)
    planned = clock.now + claims.interval
    clock.now = planned - 0.5
    young = hold(claims, agent_store, "young", clock)  # not due for lapse/3
    clock.now = planned + claims.pause_gap  # the process was stopped: the round starts this late
    claims.round(planned)
    assert claims.pauses == 1
    assert young.doubted is False and young.confirmed == clock.now, "renewed in the round after the pause"
    assert store.sent[-1][1] == ["job:young"]
    assert '"event":"paused"' in capsys.readouterr().err
    # On time (a round that ran long is not a pause either: the loop plans from when it waited).
    claims.round(clock.now)
    assert claims.pauses == 1


def test_a_pause_past_the_fence_fences_a_running_fire_but_not_a_finished_ones_renewal() -> None:
    clock = Clock()
    store = SlowStore(clock)
    claims = claims_on(clock)
    agent_store = AgentStore(AGENT, store, own_driver=True)
    running, ended = hold(claims, agent_store, "running", clock), hold(claims, agent_store, "ended", clock)
    ended.ending = True  # its command exited: its finish asks the store
    clock.now += claims.fence + 0.1  # paused (SIGSTOP, a VM stall) past the fence
    assert claims.stale(running) == "fenced", "a running command is killed, and one not started never starts"
    claims.round(clock.now - 0.1)
    assert [threads for _, threads, _ in store.sent] == [["job:ended"]]
    assert ended.confirmed == clock.now, "the ended fire's claim is confirmed again: its finish goes under it"


def test_a_renewal_answering_lost_loses_the_claim_even_when_its_fire_ended() -> None:
    clock = Clock()
    store = SlowStore(clock, lost=frozenset({"job:j"}))
    claims = claims_on(clock)
    claim = hold(claims, AgentStore(AGENT, store, own_driver=True), "j", clock)
    claim.ending = True
    clock.now += claims.interval
    claims.round(clock.now)
    assert claim.lost == "lost"
    assert not claims.due(claim, clock.now + claims.interval)


def test_on_a_slow_store_renewals_go_out_sooner_by_the_time_they_take() -> None:
    """A store that takes 0.6 s to answer a renewal at lapse 3: a renewal sent lapse/3 after the last
    confirmation came back 1.6 s after it, 0.4 s short of the fence (a starved machine's half second
    more fenced live fires).  Sent sooner by what the renewals take (at most lapse/6), it is back by
    about lapse/3."""
    clock = Clock()
    store = SlowStore(clock, latency=0.6)
    claims = claims_on(clock)
    claim = hold(claims, AgentStore(AGENT, store, own_driver=True), "j", clock)
    assert claims.lead() == 0.0 and claims.planned(claim) == claim.confirmed + claims.interval
    clock.now = claims.planned(claim)
    planned = claims.round(clock.now)  # the first renewal: 0.6 s to answer
    assert claims.lead() == claims.interval / 2, "the slowest renewal's time, at most lapse/6"
    assert planned == pytest.approx(claim.confirmed + claims.interval / 2)
    assert claims.stale(claim) is None


def test_a_round_does_not_wait_for_a_slow_renewal_and_never_sends_one_twice() -> None:
    """A renewal held at the store past the next round: that round renews the claims of another driver
    client on time, leaves the one under way to its request, and holds back a claim of the same client
    (its process answers one request at a time: queued one behind another, every claim after the first
    was late), which goes as soon as the held one answers, with any other then due, in one request."""
    clock = Clock()
    release = threading.Event()

    class Held(SlowStore):
        def request(self, request: dict[str, Any]) -> dict[str, Any]:
            if any(x["thread"] == "job:s" for x in request.get("leases", [])):
                assert release.wait(10)
            return super().request(request)

    held_store, other_store = Held(clock), SlowStore(clock)
    claims = Claims("runner-A", 3.0, clock=clock, start=False)
    try:
        slow = hold(claims, AgentStore(AGENT, held_store, own_driver=True), "s", clock)
        clock.now += 0.5
        quick = hold(claims, AgentStore(AGENT, other_store, own_driver=True), "q", clock)
        behind = hold(claims, AgentStore(Agent(owner="o", id="b"), held_store, own_driver=True), "b", clock)
        clock.now = slow.confirmed + claims.interval
        started = time.monotonic()
        planned = claims.round(clock.now, wait=False)
        assert time.monotonic() - started < 1.0 and slow.renewing
        assert planned == quick.confirmed + claims.interval
        clock.now = planned
        claims.round(planned, wait=True)
        assert [threads for _, threads, _ in other_store.sent] == [["job:q"]]
        assert not behind.renewing and behind.confirmed < clock.now, "sent behind the held request"
        release.set()
        deadline = time.monotonic() + 10
        while slow.renewing and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not slow.renewing and [t for _, t, _ in held_store.sent] == [["job:s"]]
        claims.round(clock.now, wait=True)  # woken by the answer: the one held back goes now
        assert "job:b" in [t for _, t, _ in held_store.sent][-1]
    finally:
        release.set()
        claims.close()


def test_seeded_claims_are_never_renewed_later_than_lapse_over_three() -> None:
    """Claims taken at seeded times: every renewal is sent at most lapse/3 after the confirmation before
    it, so none is fenced while the runner is not paused."""
    seed = int(os.environ.get("LNK_FUZZ_SEED", "44"))
    rng = random.Random(seed)
    clock = Clock()
    lapse = 3.0
    store = SlowStore(clock)  # its time is not the renewer's: a round does not wait for its requests
    claims = claims_on(clock, lapse)
    agent_store = AgentStore(AGENT, store, own_driver=True)
    planned = clock.now + claims.interval
    held: list[Claim] = []
    last_sent: dict[str, float] = {}
    for step in range(200):
        while rng.random() < 0.3:  # claims taken between rounds
            clock.now = min(planned, clock.now + rng.uniform(0, 0.2))
            claim = hold(claims, agent_store, f"j{step}-{len(held)}", clock)
            held.append(claim)
            last_sent[claim.thread] = claim.confirmed
        clock.now = max(clock.now, planned)
        before = len(store.sent)
        planned = claims.round(planned)
        for _, threads, sent in store.sent[before:]:
            for thread in threads:
                assert sent - last_sent[thread] <= claims.interval + 1e-9, f"seed {seed}: {thread} renewed late"
                last_sent[thread] = sent
        for claim in held:
            assert claims.stale(claim) is None, f"seed {seed}: {claim.job_id} fenced on a live runner"
        if len(held) > 40:  # some finish
            for claim in held[:10]:
                claims.forget(claim)
            held = held[10:]


def test_a_claim_older_than_lapse_over_three_is_asked_of_the_store_before_its_command_starts() -> None:
    """Issue 44, case 2: the claim is judged right before the start.  A young claim starts at once; an old
    one (a slow claim, a pause since) starts only once the store renewed it, and never when the store
    says the lease is another's, whatever the local judgement of its age was."""
    clock = Clock()
    store = SlowStore(clock, lost=frozenset({"job:taken"}))
    claims = claims_on(clock)
    agent_store = AgentStore(AGENT, store, own_driver=True)
    young, old, taken = (hold(claims, agent_store, job, clock) for job in ("young", "old", "taken"))
    assert claims.ready_to_start(young) is None and store.sent == [], "a young claim costs no request"
    clock.now += claims.fence + 1  # paused past the fence: the local judgement says fenced
    assert claims.stale(old) == "fenced"
    assert claims.ready_to_start(old) is None, "renewed in the store: it starts, its fence withdrawn"
    assert old.lost is None and old.confirmed == clock.now
    assert claims.ready_to_start(taken) == "lost" and taken.lost == "lost"

"""How runners sharing an agent spread its due jobs (``scheduling.peers`` and ``Runner.claim_due``).

Deterministic: no store and no process.  A runner whose claimer records what
it was handed is shown polls at chosen times, with chosen peers known.

* With no peer known a runner claims every due job at once (as every runner
  did before spreading): forgetting is always safe.
* With peers known, a job is claimed at once only by its owner (the highest
  rendezvous weight of the runners known to share its agent); the others
  claim it a grace after they first saw it due, and only then.
* A runner that had to claim a job it deferred forgets that owner for that
  agent: its next jobs are its own at once.
* A poll is trusted for ``poll_interval``: a job handed from it is not
  handed again from it, and jobs due later are claimed when due without a
  fresh poll.
* Owners are stable and spread: every runner computes the same owner for a
  job, and three runners each own about a third of 3,000 jobs.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cloudstore.runtime.wake import Presence, decode_presence
from cloudstore.scheduling.peers import Peers, weight
from cloudstore.scheduling.runner import LATE_LOOK, Runner, Timing
from cloudstore.scheduling.store_client import Agent, AgentStore
from cloudstore.scheduling.watch import Due, Poll

AGENT = Agent(owner="o", id="a")
OTHER = Agent(owner="o", id="b")


class RecordingClaimer:
    """Stands for the workers: records each job handed, and tells the claim's outcome when asked."""

    def __init__(self) -> None:
        self.handed: list[str] = []
        self.told: dict[str, Callable[[str], None]] = {}
        self.looked: set[str] = set()  # handed to be read before they are claimed

    def busy(self, agent: Agent, job_id: str) -> bool:
        return False

    def acquire_slot(self, stopping: Callable[[], bool]) -> bool:
        return True

    def release_slot(self) -> None:
        pass

    def dispatch(self, store: AgentStore, job_id: str, told: Callable[[str], None], look_first: bool = False) -> bool:
        self.handed.append(job_id)
        if look_first:
            self.looked.add(job_id)
        self.told[job_id] = told
        return True

    def shutdown(self) -> None:
        pass


class NoClient:
    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError(f"no store request expected: {request}")

    def close(self) -> None:
        pass


def runner(holder: str, *peers: str, agent: Agent = AGENT,
           nearby: tuple[str, ...] = ()) -> tuple[Runner, RecordingClaimer, AgentStore]:
    """A runner ``holder`` knowing ``peers``; of them, ``nearby`` said they are on this machine."""
    store = AgentStore(agent, NoClient(), own_driver=True)
    r = Runner([store], [], fire=None, holder=holder, timing=Timing(lapse=30.0, poll_interval=2.0),  # type: ignore[arg-type]
               listener=NamedNudges([]))  # type: ignore[arg-type]
    r._nearby = {peer: time.monotonic() for peer in nearby}
    r.claims.close()
    claimer = RecordingClaimer()
    r.claimer = claimer  # type: ignore[assignment]
    for peer in peers:
        r.peers.saw(agent, peer)
    return r, claimer, store


def polled(r: Runner, store: AgentStore, dues: dict[str, float], now: float) -> list[Poll]:
    """What a poll at ``now`` showed ``r``: these jobs of ``store``'s agent, each its own index entry."""
    polls = [Poll([Due(store, job, due, key=f"k/{job}") for job, due in dues.items()])]
    r._polls = polls
    r._first_seen = {}
    r._handed.clear()
    for found in polls[0].found:
        r._first_seen[(found.agent, found.job, found.key or found.due)] = now
    return polls


def owner_of(job: str, holders: list[str], agent: Agent = AGENT) -> str:
    return max(holders, key=lambda h: (weight(h, agent, job), h))


JOBS = {f"j{i}": 1000.0 for i in range(30)}


def test_with_no_peer_known_every_due_job_is_claimed_at_once() -> None:
    r, claimer, store = runner("A")
    handed, later = r.claim_due(polled(r, store, JOBS, 1000.0), 1000.0)
    assert handed == 30 and sorted(claimer.handed) == sorted(JOBS) and later is None


def test_a_job_is_claimed_at_once_by_its_owner_only_and_by_others_after_a_grace() -> None:
    holders = ["A", "B", "C"]
    mine = {job for job in JOBS if owner_of(job, holders) == "A"}
    assert 0 < len(mine) < len(JOBS), "the test needs jobs of each kind"
    r, claimer, store = runner("A", "B", "C")
    polls = polled(r, store, JOBS, 1000.0)
    handed, later = r.claim_due(polls, 1000.0)
    assert set(claimer.handed) == mine and handed == len(mine)
    grace = r.timing.grace
    assert later == 1000.0 + grace, "the others' jobs are ready a grace after they were first seen due"
    assert r.claim_due(polls, 1000.0 + grace - 0.01) == (0, 1000.0 + grace), "handed twice from one poll"
    handed, later = r.claim_due(polls, 1000.0 + grace)
    assert set(claimer.handed) == set(JOBS) and len(claimer.handed) == len(JOBS) and later is None


def test_a_job_deferred_to_its_owner_or_late_is_read_before_it_is_claimed() -> None:
    """Most likely claimed and finished by the time it is handed out: a read, and no lease written for it."""
    holders = ["A", "B", "C"]
    r, claimer, store = runner("A", "B", "C")
    mine = {job for job in JOBS if owner_of(job, holders) == "A"}
    polls = polled(r, store, JOBS, 1000.0)
    r.claim_due(polls, 1000.0)
    assert set(claimer.handed) == mine and not claimer.looked, "its own jobs, due now: claimed at once"
    r.claim_due(polls, 1000.0 + r.timing.grace)
    assert claimer.looked == set(JOBS) - mine, "the others' jobs, a grace after their owner's turn: read first"
    r, claimer, store = runner("A")
    dues = {"late": 1000.0 - LATE_LOOK - 0.01, "due": 1000.0 - LATE_LOOK}
    r.claim_due(polled(r, store, dues, 1000.0), 1000.0)
    assert sorted(claimer.handed) == ["due", "late"] and claimer.looked == {"late"}


def test_a_job_seen_late_waits_a_grace_from_when_it_was_seen_not_from_its_due() -> None:
    r, claimer, store = runner("A", "B")
    theirs = next(job for job in JOBS if owner_of(job, ["A", "B"]) == "B")
    polls = polled(r, store, {theirs: 900.0}, 1000.0)  # due long ago, first seen now
    assert r.claim_due(polls, 1000.0) == (0, 1000.0 + r.timing.grace)
    assert claimer.handed == []


def test_an_owner_that_let_its_job_wait_is_forgotten_for_that_agent() -> None:
    r, claimer, store = runner("A", "B")
    r.peers.saw(OTHER, "B")
    theirs = [job for job in JOBS if owner_of(job, ["A", "B"]) == "B"]
    polls = polled(r, store, {theirs[0]: 1000.0}, 1000.0)
    r.claim_due(polls, 1000.0 + r.timing.grace)
    assert claimer.handed == [theirs[0]]
    claimer.told[theirs[0]]("claimed")  # still waiting a grace after its due: B didn't claim it
    assert r.peers.known(AGENT) == [] and r.peers.known(OTHER) == ["B"]
    handed, _ = r.claim_due(polled(r, store, {job: 1001.0 for job in theirs[1:]}, 1001.0), 1001.0)
    assert handed == len(theirs) - 1, "with B forgotten, its jobs are A's at once"


def test_a_refused_claim_teaches_nothing_but_its_holder_does() -> None:
    r, claimer, store = runner("A", "B")
    theirs = next(job for job in JOBS if owner_of(job, ["A", "B"]) == "B")
    polls = polled(r, store, {theirs: 1000.0}, 1000.0)
    r.claim_due(polls, 1000.0 + r.timing.grace)
    claimer.told[theirs]("held")  # B (or another) had it after all: B is not forgotten
    assert r.peers.known(AGENT) == ["B"]


def test_a_trusted_poll_claims_later_jobs_when_due_without_polling_again() -> None:
    r, claimer, store = runner("A")
    polls = polled(r, store, {"now": 1000.0, "soon": 1000.5, "later": 1100.0}, 1000.0)
    assert r.claim_due(polls, 1000.0) == (1, 1000.5)
    assert r.claim_due(polls, 1000.5) == (1, 1100.0)
    assert claimer.handed == ["now", "soon"]
    r._polled_at = math.inf  # young
    assert r._trusted(1000.6)
    r._polled_at = -math.inf
    assert not r._trusted(1000.6), "a poll older than poll_interval is polled afresh"


def test_owners_are_the_same_for_every_runner_and_spread_evenly() -> None:
    holders = ["vm1/100/aa", "vm2/200/bb", "vm3/300/cc"]
    views = [Peers(me) for me in holders]
    for view in views:
        for other in holders:
            view.saw(AGENT, other)
    jobs = [f"job-{i}" for i in range(3000)]
    owners = [[view.owner(AGENT, job) for view in views] for job in jobs]
    assert all(len(set(o)) == 1 for o in owners), "two runners disagree on an owner"
    share = Counter(o[0] for o in owners)
    assert set(share) == set(holders) and all(800 < n < 1200 for n in share.values()), share


def test_peers_are_forgotten_after_their_ttl() -> None:
    now = [0.0]
    peers = Peers("A", ttl=10.0, clock=lambda: now[0])
    peers.saw(AGENT, "B")
    peers.saw(AGENT, "A")  # oneself is never a peer
    assert peers.known(AGENT) == ["B"]
    now[0] = 9.9
    peers.saw(AGENT, "C")
    now[0] = 10.5
    assert peers.known(AGENT) == ["C"]
    assert peers.owner(OTHER, "j") == "A", "an agent with no peer known is this runner's alone"


def test_a_job_a_nudge_shows_first_is_claimed_at_once_when_its_owner_is_elsewhere() -> None:
    """Put on this machine (its driver nudged us): the owner elsewhere would see it only at its next
    poll, and a put through this machine's driver is promised to start within 100 ms."""
    r, claimer, store = runner("A", "B")
    theirs = [job for job in JOBS if owner_of(job, ["A", "B"]) == "B"][:2]
    old, put_here = theirs
    r.sources = [FixedSource(store, {old: 1000.0})]
    r._poll(1000.0)  # seen before the nudge: still B's
    r.sources = [FixedSource(store, {old: 1000.0, put_here: 1000.5})]
    r._poll(1000.5, nudged=True)
    assert r.claim_due(r._polls, 1000.5) == (1, 1000.0 + r.timing.grace)
    assert claimer.handed == [put_here]
    claimer.told[put_here]("claimed")
    assert r.peers.known(AGENT) == ["B"], "claiming a job put here says nothing against its owner"
    r._poll(1001.0)  # an ordinary poll later: nothing new is put here
    assert r._put_here == {(AGENT, put_here, f"k/{put_here}")}


def test_a_job_a_nudge_shows_first_waits_a_grace_when_its_owner_listens_on_this_machine() -> None:
    """The nudge reached its owner too, which claims it at once: the others racing it for the lease
    were writes of one object refused on GCS (two per job at three runners on one machine)."""
    r, claimer, store = runner("A", "B", "C", nearby=("B",))
    ours = next(job for job in JOBS if owner_of(job, ["A", "B", "C"]) == "A")
    near = next(job for job in JOBS if owner_of(job, ["A", "B", "C"]) == "B")
    far = next(job for job in JOBS if owner_of(job, ["A", "B", "C"]) == "C")
    r.sources = [FixedSource(store, {})]
    r._poll(1000.0)
    r.sources = [FixedSource(store, {ours: 1000.5, near: 1000.5, far: 1000.5})]
    r._poll(1000.5, nudged=True)
    assert r.claim_due(r._polls, 1000.5) == (2, 1000.5 + r.timing.grace)
    assert sorted(claimer.handed) == sorted([ours, far]), "B, nudged as we were, claims its own"
    assert far not in claimer.looked, "C's elsewhere: claimed at once as ours, not read first"
    handed, _ = r.claim_due(r._polls, 1000.5 + r.timing.grace)
    assert handed == 1 and claimer.handed[-1] == near and near in claimer.looked, \
        "still waiting a grace later, B's job is read, then claimed"


def test_runners_on_one_machine_learn_each_other_from_their_presences() -> None:
    """A runner that starts says who it is and asks: the others here answer, and each then knows the
    others as peers of the agents they share (no lost claim needed to learn it), and as nearby."""
    r, _, _ = runner("A")
    listener = NamedNudges([], presences=[Presence("B", (("o", "a"), ("o", "elsewhere")), ask=True),
                                          Presence("C", (("o", "not-ours"),))])
    r.listener = listener  # type: ignore[assignment]
    assert r._claim_named() is False, "a presence is not a look now: no poll"
    assert r.peers.known(AGENT) == ["B"], "C serves none of our agents"
    assert r._owned_nearby(AGENT, "j", "B") and r._owned_nearby(AGENT, "j", "C")
    assert [(p.holder, p.agents, p.ask) for p in listener.said] == [("A", (("o", "a"),), False)], \
        "B asked: A answered once, naming its own agents"
    listener.presences = [Presence("B", (("o", "a"),), gone=True)]
    r._claim_named()
    assert r.peers.known(AGENT) == [] and not r._owned_nearby(AGENT, "j", "B"), "B left: forgotten"


def test_a_runner_says_it_is_here_when_it_starts_and_when_it_stops(monkeypatch: Any) -> None:
    from cloudstore.scheduling import runner as runner_module

    r, _, store = runner("A")
    listener = NamedNudges([])
    listener.wait = lambda timeout, untrusted_every=0.0: r.stop() or False  # type: ignore[attr-defined]
    listener.listening = True  # type: ignore[attr-defined]
    listener.interrupt = lambda: None  # type: ignore[attr-defined]
    r.listener = listener  # type: ignore[assignment]
    r.sources = [FixedSource(store, {})]
    # No store here, and recovery is not what this is about: the runner's first sleep stops it.
    monkeypatch.setattr(runner_module.Runner, "_recover_claims", lambda self: None)
    monkeypatch.setattr(runner_module.Runner, "_scan_gap", lambda self: math.inf)
    monkeypatch.setattr(r.claim_watch, "next_at", lambda: math.inf)
    r.run()
    assert [(p.holder, p.ask, p.gone) for p in listener.said] == [("A", True, False), ("A", False, True)]


def test_a_nearby_runner_not_heard_of_for_a_while_is_not_counted_on() -> None:
    from cloudstore.scheduling.runner import NEARBY_FOR

    r, _, _ = runner("A", "B", nearby=("B",))
    assert r._owned_nearby(AGENT, "j", "B")
    r._nearby["B"] = time.monotonic() - NEARBY_FOR
    assert not r._owned_nearby(AGENT, "j", "B"), "killed without a word: its jobs are claimed as from elsewhere"


def test_runners_heard_nearby_are_forgotten_once_far_and_never_past_the_most() -> None:
    """Issue 44 (nothing grows with uptime): a runner restarted without end, each start a new holder
    that never said it left, left one entry each in ``_nearby`` for good; now one not heard of for
    ``NEARBY_FOR`` is dropped at the next presences heard, and no more than ``NEARBY_MAX`` are kept."""
    from cloudstore.scheduling.runner import NEARBY_FOR, NEARBY_MAX

    r, _, _ = runner("A")
    listener = NamedNudges([], presences=[])
    r.listener = listener  # type: ignore[assignment]
    long_ago = time.monotonic() - NEARBY_FOR
    r._nearby.update({f"killed-{i}": long_ago for i in range(500)})
    listener.presences = [Presence(f"live-{i}", (("o", "elsewhere"),)) for i in range(NEARBY_MAX + 10)]
    r._claim_named()
    assert not any(h.startswith("killed-") for h in r._nearby), "runners not heard of for NEARBY_FOR are kept"
    assert len(r._nearby) == NEARBY_MAX
    assert "live-0" not in r._nearby and f"live-{NEARBY_MAX + 9}" in r._nearby, "the newest heard are kept"


class FixedSource:
    """A source whose every poll shows the same jobs of one agent."""

    def __init__(self, store: AgentStore, dues: dict[str, float]) -> None:
        self.store, self.dues = store, dues

    def poll(self, now: float) -> Poll:
        return Poll([Due(self.store, job, due, key=f"k/{job}") for job, due in self.dues.items()])


class NamedNudges:
    """Stands for the wake listener: hands the runner the names a nudge carried and the presences
    heard, and keeps what the runner said."""

    def __init__(self, named: list[Any], plain: bool = False, presences: list[Presence] | None = None) -> None:
        self.named, self.plain = named, plain
        self.presences = list(presences or [])
        self.said: list[Presence] = []

    def take_presences(self) -> list[Presence]:
        heard, self.presences = self.presences, []
        return heard

    def announce(self, datagrams: list[bytes]) -> int:
        for datagram in datagrams:
            presence = decode_presence(datagram)
            assert presence is not None, datagram
            self.said.append(presence)
        return 1

    def take_names(self) -> tuple[list[Any], bool]:
        named, plain = self.named, self.plain
        self.named, self.plain = [], False
        return named, plain

    def close(self) -> None:
        pass


def test_a_job_a_nudge_names_due_now_is_claimed_at_once_without_a_poll() -> None:
    """A put through this machine's driver names its job: the runner's worker claims it at once (the
    claim judges whether it waits and is due), whoever owns it, and no poll is asked for."""
    from cloudstore.runtime.wake import Named

    r, claimer, store = runner("A", "B")
    theirs = [job for job in JOBS if owner_of(job, ["A", "B"]) == "B"][0]
    r.sources = []  # a poll would fail: none may be made
    r.listener = NamedNudges([Named("o", "a", theirs, 0.0)])  # type: ignore[assignment]
    assert r._claim_named() is False, "everything the nudge named was handed: no poll is needed"
    assert claimer.handed == [theirs]


def test_a_job_a_nudge_names_is_left_to_its_owner_when_that_owner_listens_on_this_machine() -> None:
    """Its owner got the same nudge: this runner neither claims the job nor polls for it; its
    ordinary polls show it a grace later if the owner did not claim it."""
    from cloudstore.runtime.wake import Named

    r, claimer, store = runner("A", "B", nearby=("B",))
    theirs = next(job for job in JOBS if owner_of(job, ["A", "B"]) == "B")
    ours = next(job for job in JOBS if owner_of(job, ["A", "B"]) == "A")
    r.sources = []  # a poll would fail: none may be made
    r.listener = NamedNudges([Named("o", "a", theirs, 0.0), Named("o", "a", ours, 0.0)])  # type: ignore[assignment]
    assert r._claim_named() is False, "nothing left for a poll: B's job is B's, ours is handed"
    assert claimer.handed == [ours]


def test_a_nudge_naming_nothing_of_ours_due_now_asks_for_a_poll() -> None:
    from cloudstore.runtime.wake import Named

    for named, plain in (
        ([Named("o", "someone-else", "j", 0.0)], False),  # not an agent of this runner's own driver
        ([Named("o", "a", "later", 4e9)], False),  # not due yet: the poll shows it, and when
        ([], True),  # "look now" alone
    ):
        r, claimer, _ = runner("A")
        r.listener = NamedNudges(named, plain)  # type: ignore[assignment]
        assert r._claim_named() is True, (named, plain)
        assert claimer.handed == [], (named, plain)


def test_a_named_nudge_for_an_agent_reached_through_a_bridge_only_polls() -> None:
    """A bridge answers no ``job_claim`` with its lease: its agents' named jobs are found by the poll."""
    from cloudstore.runtime.wake import Named

    bridged = AgentStore(AGENT, NoClient(), own_driver=False)
    r = Runner([bridged], [], fire=None, holder="A",  # type: ignore[arg-type]
               listener=NamedNudges([Named("o", "a", "j", 0.0)]))  # type: ignore[arg-type]
    r.claims.close()
    claimer = RecordingClaimer()
    r.claimer = claimer  # type: ignore[assignment]
    assert r._claim_named() is True and claimer.handed == []

"""Claim leases: which runner may fire a job, kept alive while it fires.

A job in ``firing`` is only the job itself (``job_shift`` moves it whole), so
who fires it is kept beside it, in a conversation lease on the thread
``job:<id>`` of the job's agent, held by the runner's unique id.  The lease is

* taken BEFORE the job is shifted out of waiting, so a job in firing always
  has a live lease unless its runner died (then it lapses and another runner
  takes it back, ``take`` answering ``lapsed``);
* renewed by one thread for every claim this runner holds, each claim at the
  latest lapse/3 after its last confirmation was sent, all claims due in a
  round together (``lease_renew``, one request for all the agents of the
  runner's own driver, through a driver process of its own, so a renewal never queues behind the runner's claims;
  through a bridge one ``renew`` each, at once on a small pool);
* ended once the job has left firing, never before (a runner that can't tell
  where its job is leaves the lease to lapse, so recovery looks again);
* kept, and renewed, while the finish of a fire that ended keeps failing
  (``finish_later``): a job whose fire ended is never recovered from a
  runner that is alive.

Fencing: ``take`` judges a lease lapsed ``lapse`` after its last renewal.  A
fire whose claim hasn't been confirmed (a successful take or renew, timed from
when the request was SENT) for ``FENCE`` of the lapse is killed by its worker
before anyone else can take the job, so a runner cut off from its store stops
firing instead of firing alongside the runner that recovers the job.  That
judgement is local: it only ever stops a RUNNING command (or one about to
start).  The finish of a fire that ended asks the store instead (``job_finish``
is conditional on the claim there), so a claim a slow store or a starved
machine made look stale is still finished once, never fired again.

Slack: a claim is renewed when lapse/3 has passed since its confirmation was
sent, less the time the slowest of the last renewals took to answer
(``lead``, at most lapse/6: on a store that answers slowly a renewal goes out
that much sooner, so that its answer is back by lapse/3), and a round may
renew it up to ``EARLY`` sooner still, never later.  So a claim is confirmed
again within lapse/3 and has the rest, lapse/3, before the fence, whatever
the number of claims (they go together) and the store's speed.  Rounds are timed from
their starts.  A round that starts well after it was planned
(``pause_gap``: the process was paused or starved) is a pause this runner
saw: it is logged, and every claim is renewed in that round.  Each claim's
age is measured on ``clock`` (``time.monotonic``), which runs on through a
pause (SIGSTOP, a VM stall): a pause past the fence kills a running fire and
keeps one not yet started from starting.  The fence's number
(``Claim.fence``, the lease's, leases.py) is what the fired command gets as
``LNK_JOB_FENCE``: it grows with every holder, so a system the command writes
to can refuse a superseded fire, whatever pause the runner went through.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from .log import log
from .store_client import Agent, AgentStore, StoreCallError

FENCE = 2 / 3  # of the lapse: kill a fire whose claim is this stale (leaves lapse/3 for skew and the kill)
#: A round renews every claim whose renewal falls due within this part of the lapse from its start
#: (lapse/12: a claim is renewed lapse/4 to lapse/3 after its last confirmation).  Never right after a
#: take: GCS takes about one write a second per object, and a renewal a moment after the take spent the
#: lease's burst, so the claim's end soon after was refused and retried for a second (lapse/4 is 1.5 s
#: at the least lapse the docs allow on GCS, 6 s).
EARLY = 1 / 12
#: A round starting this part of the lapse (at least ``PAUSE_MIN`` s) after it was planned saw a pause.
PAUSE = 1 / 12
PAUSE_MIN = 0.25
#: Renewal requests under way at once, at most: ``lease_renew`` batches, and a ``renew`` per bridged claim.
RENEWERS = 8
#: Claims one ``lease_renew`` renews at most (the driver's bound, ``service.RENEW_MAX``).
BATCH = 256
#: Renewal requests whose time to answer sets ``lead``: the slowest of the last this many.
LEAD_ROUNDS = 8
THREAD_PREFIX = "job:"


def lease_thread(job_id: str) -> str:
    """The conversation lease that says who fires ``job_id``."""
    return THREAD_PREFIX + job_id


class Claim:
    """This runner's lease on one job: confirmed when, its fence, and lost or not."""

    def __init__(self, store: AgentStore, job_id: str, took: str, confirmed: float, fence: int | None = None) -> None:
        self.store = store
        self.job_id = job_id
        self.took = took  # "took" or "lapsed" (a previous holder died)
        self.fence = fence  # the lease's fencing token (None: a bridge's take, which does not say)
        self.confirmed = confirmed  # clock() when the last successful take/renew was sent
        self.claimed = confirmed  # time.monotonic() when the claim's reply came: its record written before
        self.ending = False  # its fire ended, and its finish (which ends the lease) is queued or under way
        self.doubted = False  # a pause was seen since its last confirmation: renewed at once
        self.renewing = False  # a renewal of it is under way (a round does not wait for its requests)
        self._lost: str | None = None
        self._lock = threading.Lock()

    @property
    def thread(self) -> str:
        return lease_thread(self.job_id)

    def confirm(self, sent: float) -> None:
        with self._lock:
            if sent > self.confirmed:
                self.confirmed = sent
                self.doubted = False

    def lose(self, why: str) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = why

    def confirmed_again(self, sent: float) -> None:
        """The store renewed it (a renewal sent at ``sent``): a local ``fenced`` judgement is withdrawn."""
        with self._lock:
            if self._lost == "fenced":
                self._lost = None
        self.confirm(sent)

    @property
    def lost(self) -> str | None:
        """Why the claim is gone (``"lost"``: another holder has it; ``"fenced"``: unconfirmed too long)."""
        return self._lost


class Claims:
    """Takes, renews, fences and lets go of this runner's claim leases."""

    def __init__(self, holder: str, lapse: float,
                 renew_via: Callable[[AgentStore], AgentStore] | None = None,
                 held_by: Callable[[Agent, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, start: bool = True) -> None:
        self.holder = holder
        # Told who holds a job's lease when a take is refused (``peers.Peers.saw``).
        self.held_by = held_by or (lambda agent, holder: None)
        # Renewals through a driver process of their own: behind a burst of claims in the
        # runner's one serve process they waited past the lapse, and a live runner's fire
        # was fenced and fired again elsewhere.
        self.renew_via = renew_via or (lambda store: store)
        self.clock = clock
        self.lapse = lapse
        self.lapse_ms = max(1, int(round(lapse * 1000)))
        self.fence = lapse * FENCE
        self.interval = lapse / 3  # a claim's renewal is due this long after its confirmation was sent
        self.early = lapse * EARLY
        self.pause_gap = max(PAUSE_MIN, lapse * PAUSE)
        self.pauses = 0  # rounds that started a pause late
        self._took: deque[float] = deque(maxlen=LEAD_ROUNDS)  # how long the last renewal requests took
        self._held: dict[int, Claim] = {}
        # Claims whose fire ended but whose finish kept failing: (the claim, one more try, told when done).
        self._finishing: dict[int, tuple[Claim, Callable[[], object], Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._settling = threading.Lock()
        self._sending: set[int] = set()  # the driver clients a lease_renew is under way on
        self._closed = threading.Event()
        self._wake = threading.Event()  # the renewer plans again: a renewal answered, or closing
        self._pool = ThreadPoolExecutor(max_workers=RENEWERS, thread_name_prefix="claim-renew")
        self._renewer = threading.Thread(target=self._renew_loop, name="claim-renewer", daemon=True)
        if start:
            self._renewer.start()

    def take(self, store: AgentStore, job_id: str) -> Claim | None:
        """The job's lease for this runner, or None when another runner holds it."""
        sent = self.clock()
        took, holder, fence, held = store.take_naming(lease_thread(job_id), self.holder, self.lapse_ms)
        return self.hold(store, job_id, took, holder, self.written(sent, held), fence)

    def written(self, sent: float, held: float) -> float:
        """When a lease write whose request was sent at ``sent`` was made, at the latest: ``held`` seconds
        (the driver's word) before now, when that is later than ``sent``.  A claim of three round trips
        starts a round trip old, not three."""
        return max(sent, self.clock() - held) if held > 0 else sent

    def hold(self, store: AgentStore, job_id: str, took: str, holder: str | None, sent: float,
             fence: int | None = None) -> Claim | None:
        """What a take SENT at ``sent`` (on ``clock``) answered (``took``, ``holder`` when held, the
        lease's ``fence`` when ours): the claim now renewed by this runner, or None when another runner
        holds the lease."""
        if took == "held":
            if holder is not None:
                self.held_by(store.agent, holder)
            return None
        claim = Claim(store, job_id, took, sent, fence)
        with self._lock:
            self._held[id(claim)] = claim
        self._wake.set()  # its first renewal may be due before the round the renewer sleeps for
        return claim

    def stale(self, claim: Claim) -> str | None:
        """Why a fire under ``claim`` must stop now (or not start), or None: polled by the fire's worker
        while its command runs, and asked right before it starts.  A local judgement: the finish of a
        fire that ended never rests on it (``job_finish`` asks the store)."""
        if claim.lost is None and self.clock() - claim.confirmed >= self.fence:
            claim.lose("fenced")
        return claim.lost

    def ready_to_start(self, claim: Claim) -> str | None:
        """Asked right before a command starts: why it must not (``fenced``, ``lost``), or None.

        A claim confirmed within lapse/3 starts at once.  An older one (a
        claim of several slow round trips, a pause between the claim and the
        start) is asked of the store first: renewed there, it starts with a
        fresh lapse whatever the local judgement said; held by another runner,
        it does not start; unanswered, it starts only while short of the fence.
        """
        if claim.lost == "lost":
            return "lost"
        if claim.lost is None and self.clock() - claim.confirmed < self.interval:
            return None
        sent = self.clock()
        try:
            # Through the driver process that claimed it (idle now, the lease's head in its memory: one
            # write), not the renewals' process, whose requests must not queue behind this one.
            via = claim.store
            if via.own_driver:
                done, held = via.renew_many([(claim.store.agent, claim.thread)], self.holder)
                renewed = bool(done[0])
            else:
                renewed, held = via.renew(claim.thread, self.holder), 0.0
        except StoreCallError as exc:
            log("lease_renew_failed", agent=claim.store.agent.label(), job=claim.job_id, error=str(exc))
            return self.stale(claim)
        if not renewed:
            claim.lose("lost")
            return "lost"
        claim.confirmed_again(self.written(sent, held))
        return self.stale(claim)

    def due(self, claim: Claim, now: float) -> bool:
        """Whether a round starting at ``now`` renews ``claim``: a pause was seen since it was last
        confirmed, or its renewal falls due before ``early`` is up.  Not when lost (another holds it),
        nor when fenced while its command runs; one whose command has ended (``ending``) is renewed
        whatever its age says, until its finish, which asks the store, is done."""
        if claim.renewing or claim.lost == "lost" or not claim.ending and self.stale(claim) is not None:
            return False
        return claim.doubted or self.planned(claim) - self.early <= now

    def lead(self) -> float:
        """How much sooner than lapse/3 after its confirmation a claim's renewal is sent: the slowest of the
        last renewals' times to answer, at most lapse/6."""
        return min(self.interval / 2, max(self._took, default=0.0))

    def planned(self, claim: Claim) -> float:
        """When ``claim``'s renewal is to be sent at the latest (on ``clock``)."""
        return claim.confirmed + self.interval - self.lead()

    def release(self, claim: Claim) -> None:
        """The job has left firing: end the lease so the id can be claimed again at once."""
        self.forget(claim)
        try:
            claim.store.end(claim.thread, self.holder)
        except StoreCallError as exc:
            log("lease_end_failed", agent=claim.store.agent.label(), job=claim.job_id, error=str(exc))

    def forget(self, claim: Claim) -> None:
        """Stop renewing without ending: the lease lapses and recovery looks at the job again."""
        with self._lock:
            self._held.pop(id(claim), None)

    def finish_later(self, claim: Claim, finish: Callable[[], object], done: Callable[[], None]) -> None:
        """A fire that ended but could not be finished yet (a throttle or an outage past every try).

        The claim stays ours: its lease is still renewed, so no runner
        recovers (fires again) a job whose fire has ended.  Each renewal
        round tries ``finish`` once more (True: settled, the job left firing
        or it was not ours to finish; ``finish`` itself lets go of the claim);
        ``done`` is called once it is settled, the claim lost, or the runner
        stopping.
        """
        with self._lock:
            self._finishing[id(claim)] = (claim, finish, done)

    def _settle_finishes(self) -> None:
        if not self._settling.acquire(blocking=False):
            return  # the last round's are still being tried
        try:
            self._settle_pending()
        finally:
            self._settling.release()

    def _settle_pending(self) -> None:
        with self._lock:
            pending = list(self._finishing.values())
        for claim, finish, done in pending:
            settled = True
            if claim.lost != "lost" and self._holds(claim):
                try:
                    finish()
                except StoreCallError as exc:
                    log("finish_retry", agent=claim.store.agent.label(), job=claim.job_id, error=str(exc),
                        attempt="later")
                    settled = False
            if settled:
                with self._lock:
                    self._finishing.pop(id(claim), None)
                done()

    def _holds(self, claim: Claim) -> bool:
        with self._lock:
            return id(claim) in self._held

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._renewer.is_alive():
            self._renewer.join(5)
        self._pool.shutdown(wait=False)
        with self._lock:
            pending, self._finishing = list(self._finishing.values()), {}
        for _, _, done in pending:  # left to lapse: recovery fires them again, as after a crash
            done()

    # -- the renewer ---------------------------------------------------------------

    def next_round(self, start: float) -> float:
        """When the round after one that started at ``start`` is planned: lapse/3 on, or sooner when a
        claim's renewal falls due sooner (a claim taken since it started)."""
        soonest = self._soonest(start + self.interval)
        return max(start + min(self.early, self.interval - self.lead()), min(start + self.interval, soonest))

    def _soonest(self, default: float) -> float:
        """When the first renewal not under way is planned (``default`` with none)."""
        with self._lock:
            held = list(self._held.values())
        return min((self.planned(c) for c in held if c.lost != "lost" and not c.renewing), default=default)

    def round(self, planned: float, wait: bool = True) -> float:
        """One renewal round, planned for ``planned`` (on ``clock``): every due claim renewed together,
        the finishes left for later tried once.  Answers when the next round is planned.

        The renewer's own rounds do not ``wait`` for their requests: a round
        whose store is slow must not make the next one late (a claim falling
        due meanwhile would be sent past its lapse/3); a claim whose renewal
        is under way is left to it."""
        start = self.clock()
        with self._lock:
            held = list(self._held.values())
        late = start - planned
        if late >= self.pause_gap:
            self.pauses += 1
            log("paused", runner=self.holder, seconds=round(late, 3), claims=len(held))
            for claim in held:
                claim.doubted = True
        pending = self.renew([claim for claim in held if self.due(claim, start)])
        if self._finishing:
            pending.append(self._pool.submit(self._settle_finishes))
        if wait:
            for future in pending:
                future.result()
        return self.next_round(start)

    def renew(self, claims: list[Claim]) -> list[Future[None]]:
        """Renew ``claims`` together: one ``lease_renew`` for all the agents of the runner's own driver
        (per ``BATCH``), a ``renew`` each through a bridge, all at once on the renewers' pool.

        One ``lease_renew`` at a time per driver client: its process answers
        one request at a time, and requests queued behind each other made
        every claim after the first late (3 s at 0.3 s a request on a starved
        machine).  Claims due while one is under way stay due, and go together
        in the next, sent as soon as it answers (its answer wakes the renewer)."""
        batches: dict[int, tuple[AgentStore, list[Claim]]] = {}
        singles: list[Claim] = []
        for claim in claims:
            via = self.renew_via(claim.store)
            if via.own_driver:  # one request for every agent its client serves
                batches.setdefault(id(via.client), (via, []))[1].append(claim)
            else:
                singles.append(claim)
        tasks: list[Callable[[], None]] = []
        for claim in singles:
            claim.renewing = True
            tasks.append(lambda c=claim: self._renew_one(c))  # type: ignore[misc]
        for key, (via, group) in batches.items():
            with self._lock:
                if key in self._sending:
                    continue
                self._sending.add(key)
            for claim in group:
                claim.renewing = True
            tasks.append(lambda via=via, group=group, key=key: self._renew_batches(key, via, group))  # type: ignore[misc]
        return [self._pool.submit(task) for task in tasks]

    def _renew_batches(self, key: int, via: AgentStore, claims: list[Claim]) -> None:
        try:
            for at in range(0, len(claims), BATCH):
                self._renew_batch(via, claims[at:at + BATCH])
        finally:
            with self._lock:
                self._sending.discard(key)
            self._wake.set()

    def _renew_batch(self, via: AgentStore, claims: list[Claim]) -> None:
        sent = self.clock()
        try:
            renewed, held = via.renew_many([(c.store.agent, c.thread) for c in claims], self.holder)
            self._answered(sent, len(claims))
            written = self.written(sent, held)
            for claim, done in zip(claims, renewed, strict=True):
                self._renewed(claim, done, written)
        except StoreCallError as exc:
            for claim in claims:
                log("lease_renew_failed", agent=claim.store.agent.label(), job=claim.job_id, error=str(exc))
        finally:
            for claim in claims:
                claim.renewing = False

    def _renew_one(self, claim: Claim) -> None:
        sent = self.clock()
        try:
            renewed = self.renew_via(claim.store).renew(claim.thread, self.holder)
            self._answered(sent, 1)
            self._renewed(claim, renewed, sent)
        except StoreCallError as exc:
            log("lease_renew_failed", agent=claim.store.agent.label(), job=claim.job_id, error=str(exc))
        finally:
            claim.renewing = False

    def _answered(self, sent: float, claims: int) -> None:
        """A renewal request sent at ``sent`` answered now: its time sets ``lead``; one that took over
        lapse/6 is logged (``renew_slow``): the store, or this machine, eats the fence's slack."""
        took = self.clock() - sent
        self._took.append(took)
        if took > self.interval / 2:
            log("renew_slow", runner=self.holder, seconds=round(took, 3), claims=claims)

    def _renewed(self, claim: Claim, ok: bool, sent: float) -> None:
        self._wake.set()  # its next renewal is planned from this one
        if ok:
            claim.confirm(sent)
        elif self._holds(claim):  # not merely released meanwhile
            claim.lose("lost")
            log("lease_lost", agent=claim.store.agent.label(), job=claim.job_id)

    def _renew_loop(self) -> None:
        planned = self.clock() + self.interval
        while not self._closed.is_set():
            began = self.clock()  # a round that ran past its successor's plan is late, not paused
            if planned > began:
                self._wake.wait(planned - began)
                self._wake.clear()
                if self._closed.is_set():
                    return
                if self.clock() < planned:  # a renewal answered, or a claim was taken: plan again
                    planned = min(planned, self._soonest(planned))
                    continue
            try:
                planned = self.round(max(planned, began), wait=False)
            except Exception as exc:  # a bug must not stop the renewals of every claim
                log("renewer_failed", runner=self.holder, error=repr(exc))
                planned = self.clock() + self.early

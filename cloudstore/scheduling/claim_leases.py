"""Claim leases: which runner may fire a job, kept alive while it fires.

A job in ``firing`` is only the job itself (``job_shift`` moves it whole), so
who fires it is kept beside it, in a conversation lease on the thread
``job:<id>`` of the job's agent, held by the runner's unique id.  The lease is

* taken BEFORE the job is shifted out of waiting, so a job in firing always
  has a live lease unless its runner died (then it lapses and another runner
  takes it back, ``take`` answering ``lapsed``);
* renewed every lapse/3 by one thread for every claim this runner holds
  (one confirmed under ``FRESH`` before a round waits for the next),
  through a driver process of its own where the runner has one serve
  process (so a renewal never queues behind the runner's claims);
* ended once the job has left firing, never before (a runner that can't tell
  where its job is leaves the lease to lapse, so recovery looks again);
* kept, and renewed, while the finish of a fire that ended keeps failing
  (``finish_later``): a job whose fire ended is never recovered from a
  runner that is alive.

Fencing: ``take`` judges a lease lapsed ``lapse`` after its last renewal.  A
fire whose claim hasn't been confirmed (a successful take or renew, timed from
when the request was SENT) for ``FENCE`` of the lapse is killed by its worker
before anyone else can take the job, so a runner cut off from its store stops
firing instead of firing alongside the runner that recovers the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .log import log
from .store_client import Agent, AgentStore, StoreCallError

FENCE = 2 / 3  # of the lapse: kill a fire whose claim is this stale (leaves lapse/3 for skew and the kill)
#: A claim confirmed less than this long ago (at most lapse/6) is renewed at the next round, not
#: this one: GCS takes about one write a second per object, and a renewal a moment after the take
#: spent the lease's burst, so the claim's end soon after was refused and retried for a second.
#: Renewed a round later, a claim is at most lapse/6 + lapse/3 old, short of the fence.
FRESH = 1.0
THREAD_PREFIX = "job:"


def lease_thread(job_id: str) -> str:
    """The conversation lease that says who fires ``job_id``."""
    return THREAD_PREFIX + job_id


class Claim:
    """This runner's lease on one job: confirmed when, and lost or not."""

    def __init__(self, store: AgentStore, job_id: str, took: str, confirmed: float) -> None:
        self.store = store
        self.job_id = job_id
        self.took = took  # "took" or "lapsed" (a previous holder died)
        self.confirmed = confirmed  # time.monotonic() when the last successful take/renew was sent
        self.claimed = confirmed  # time.monotonic() when the claim's reply came: its record written before
        self.ending = False  # its fire ended, and its finish (which ends the lease) is queued or under way
        self._lost: str | None = None
        self._lock = threading.Lock()

    @property
    def thread(self) -> str:
        return lease_thread(self.job_id)

    def confirm(self, sent: float) -> None:
        with self._lock:
            self.confirmed = max(self.confirmed, sent)

    def lose(self, why: str) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = why

    @property
    def lost(self) -> str | None:
        """Why the claim is gone (``"lost"``: another holder has it; ``"fenced"``: unconfirmed too long)."""
        return self._lost


class Claims:
    """Takes, renews, fences and lets go of this runner's claim leases."""

    def __init__(self, holder: str, lapse: float,
                 renew_via: Callable[[AgentStore], AgentStore] | None = None,
                 held_by: Callable[[Agent, str], None] | None = None) -> None:
        self.holder = holder
        # Told who holds a job's lease when a take is refused (``peers.Peers.saw``).
        self.held_by = held_by or (lambda agent, holder: None)
        # Renewals through a driver process of their own: behind a burst of claims in the
        # runner's one serve process they waited past the lapse, and a live runner's fire
        # was fenced and fired again elsewhere.
        self.renew_via = renew_via or (lambda store: store)
        self.lapse = lapse
        self.lapse_ms = max(1, int(round(lapse * 1000)))
        self.fence = lapse * FENCE
        self._held: dict[int, Claim] = {}
        # Claims whose fire ended but whose finish kept failing: (the claim, one more try, told when done).
        self._finishing: dict[int, tuple[Claim, Callable[[], bool], Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="claim-renewer", daemon=True)
        self._renewer.start()

    def take(self, store: AgentStore, job_id: str) -> Claim | None:
        """The job's lease for this runner, or None when another runner holds it."""
        sent = time.monotonic()
        took, holder = store.take_naming(lease_thread(job_id), self.holder, self.lapse_ms)
        return self.hold(store, job_id, took, holder, sent)

    def hold(self, store: AgentStore, job_id: str, took: str, holder: str | None, sent: float) -> Claim | None:
        """What a take SENT at ``sent`` answered (``took``, and ``holder`` when held): the claim now
        renewed by this runner, or None when another runner holds the lease."""
        if took == "held":
            if holder is not None:
                self.held_by(store.agent, holder)
            return None
        claim = Claim(store, job_id, took, sent)
        with self._lock:
            self._held[id(claim)] = claim
        return claim

    def stale(self, claim: Claim) -> str | None:
        """Why a fire under ``claim`` must stop now, or None (polled by the fire's worker)."""
        if claim.lost is None and time.monotonic() - claim.confirmed >= self.fence:
            claim.lose("fenced")
        return claim.lost

    def renews_now(self, claim: Claim, now: float | None = None) -> bool:
        """Whether this renewal round renews ``claim``: not when fenced or lost, nor when confirmed less
        than ``FRESH`` (at most lapse/6) ago; the next round, lapse/3 on, is still short of the fence.

        A claim whose finish is queued (``ending``) waits until lapse/6 whatever ``FRESH`` says: its
        finish, a second after the claim, ends the lease, and a renewal sent at that moment made the
        end meet a changed lease (a refused write, a read, and a third write of one object within a
        second, refused on GCS).  A finish that is slow to land is still renewed in time."""
        if self.stale(claim) is not None:
            return False
        now = time.monotonic() if now is None else now
        fresh = self.lapse / 6 if claim.ending else min(FRESH, self.lapse / 6)
        return now - claim.confirmed >= fresh

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

    def finish_later(self, claim: Claim, finish: Callable[[], bool], done: Callable[[], None]) -> None:
        """A fire that ended but could not be finished yet (a throttle or an outage past every try).

        The claim stays ours: its lease is still renewed, so no runner
        recovers (fires again) a job whose fire has ended.  Each renewal
        round tries ``finish`` once more (True: the job left firing, the lease
        is ended; False: it was not there, the lease lapses); ``done`` is
        called once it is settled, the claim lost, or the runner stopping.
        """
        with self._lock:
            self._finishing[id(claim)] = (claim, finish, done)

    def _settle_finishes(self) -> None:
        with self._lock:
            pending = list(self._finishing.values())
        for claim, finish, done in pending:
            settled = True
            if claim.lost is None and self._holds(claim):
                try:
                    if finish():
                        self.release(claim)
                    else:
                        self.forget(claim)
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
        self._renewer.join(5)
        with self._lock:
            pending, self._finishing = list(self._finishing.values()), {}
        for _, _, done in pending:  # left to lapse: recovery fires them again, as after a crash
            done()

    def _renew_loop(self) -> None:
        while not self._closed.wait(self.lapse / 3):
            with self._lock:
                held = list(self._held.values())
            for claim in held:
                if not self.renews_now(claim):
                    continue
                sent = time.monotonic()
                try:
                    renewed = self.renew_via(claim.store).renew(claim.thread, self.holder)
                except StoreCallError as exc:
                    log("lease_renew_failed", agent=claim.store.agent.label(), job=claim.job_id, error=str(exc))
                    continue
                if renewed:
                    claim.confirm(sent)
                elif self._holds(claim):  # not merely released meanwhile
                    claim.lose("lost")
                    log("lease_lost", agent=claim.store.agent.label(), job=claim.job_id)
            self._settle_finishes()

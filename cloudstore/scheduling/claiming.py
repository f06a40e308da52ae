"""Claiming one job, firing it on a worker, and finishing it.

``Claimer.dispatch`` has a worker take a job out of waiting: lease first, then
the shift waiting -> firing (of several runners exactly one gets both), which
answers the job it moved, since what was shifted is what must be fired (a put
may have replaced the polled job meanwhile).  Through the runner's own driver
both are ONE request (``job_claim`` with its lease: three round trips at the
store, ``jobs.Jobs.claim``); through a bridge, which answers only the
protocol's ops, a ``take`` then a shift and a read back.
``Claimer.reclaim`` takes back a
job left in firing by a runner that died: the lease (``take`` answers
``lapsed``, or ``took`` when the lease is already this runner's), then a
fresh read that the job is still there.  Either way a worker thread fires it;
its finish (out of firing, into ending when ``keep_ending``, then the lease
ended) is queued for ``FINISH_PACE`` after the claim's reply and sent from a
thread of its own, so the worker's slot is free once the fire has ended.

A job is claimed only when a worker slot is free, so a runner never sits on
claimed jobs it can't fire yet while other runners could.  Whatever this
runner is claiming or firing is "in flight" and never claimed twice by it
(``take`` answers ``took`` to the holder itself, so without this the
recovery scan would fire our own jobs again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import fire_times
from .claim_leases import Claim, Claims, lease_thread
from .fire import FireCommand
from .log import log
from .store_client import Agent, AgentStore, StoreCallError, held_of
from .timer_queue import TimerQueue

EARLY = 0.001  # a job read back from firing due later than this past now was replaced: it isn't due


def due_of(job: dict[str, Any]) -> float:
    """A job's due as a float; a malformed one sorts last and is never due."""
    due = job.get("due")
    return float(due) if isinstance(due, (int, float)) and not isinstance(due, bool) else float("inf")


FINISH_TRIES = 8  # a finish tried this often while the claim is ours (each try retries inside the driver too)
FINISH_WAIT, FINISH_WAIT_MAX = 0.5, 5.0  # seconds between tries: doubling, at most this
#: Seconds from a claim's start to its finish at the soonest.  GCS takes about one write a
#: second per object (a burst of two): a job put and claimed within the second has spent its
#: record's burst, and a finish sent at once was refused and retried inside the driver for up to
#: a second, holding a worker slot and one of the runner's few driver processes, so claims
#: queued behind finishes and jobs at 10 a second fired seconds late.  A finish a second after
#: the claim's reply (so after the put's and the claim's writes of the record) meets a refilled
#: token; a second after the claim's start did not always: a claim that listed the due entry at
#: once begins before the put's record is written.  It waits off the worker
#: (``TimerQueue``), under the claim's lease, which is renewed meanwhile: the job shows in
#: firing a little longer, and nothing else changes.
FINISH_PACE = 1.0
FINISHING_PER_WORKER = 8  # finishes waiting for their pace per worker slot, at most (10 a second for 4 workers)


class Claimer:
    """Claims, fires (on ``workers`` threads) and finishes jobs for one runner."""

    def __init__(self, claims: Claims, fire: FireCommand, workers: int, keep_ending: bool) -> None:
        self.claims = claims
        self.holder = claims.holder
        self.fire = fire
        self.keep_ending = keep_ending
        self.fired = 0
        self._slots = threading.BoundedSemaphore(workers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fire")
        # Finishes, each at its claim's start + FINISH_PACE, on threads of their own; at most
        # FINISHING_PER_WORKER * workers wait or run at once (a worker past that waits with its slot).
        self._finishes = TimerQueue(workers, "finish")
        self._finishing = threading.BoundedSemaphore(FINISHING_PER_WORKER * workers)
        self._inflight: set[tuple[Agent, str]] = set()
        self._lock = threading.Lock()

    # -- slots and what's in flight ---------------------------------------------

    def acquire_slot(self, stopping: Callable[[], bool]) -> bool:
        """Wait for a free worker (False once stopping): claim only what can be fired at once."""
        while not stopping():
            if self._slots.acquire(timeout=0.2):
                return True
        return False

    def release_slot(self) -> None:
        self._slots.release()

    def busy(self, agent: Agent, job_id: str) -> bool:
        with self._lock:
            return (agent, job_id) in self._inflight

    def _enter(self, agent: Agent, job_id: str) -> bool:
        with self._lock:
            if (agent, job_id) in self._inflight:
                return False
            self._inflight.add((agent, job_id))
            return True

    def _leave(self, agent: Agent, job_id: str) -> None:
        with self._lock:
            self._inflight.discard((agent, job_id))

    def shutdown(self) -> None:
        """Wait for the fires under way to end, then finish each at once (a stopping runner does not
        wait out the pace)."""
        self._pool.shutdown(wait=True)
        self._finishes.close()

    # -- claiming ----------------------------------------------------------------

    def dispatch(self, store: AgentStore, job_id: str, told: Callable[[str], None], look_first: bool = False) -> bool:
        """Claim, fire and finish a due job on a worker; the caller holds a slot, which the worker frees.

        ``look_first``: the job was another runner's to claim and waited a grace for it, so most
        likely it has been claimed, fired and finished since the poll that listed it.  The worker
        reads it first (``job_get``: a read, which no cloud limits per object) and claims only a
        job still waiting: taking the lease at once, as a claim does, wrote the lease of a job
        long gone and then its release, two writes of one object within a second, and at three
        runners most of the GCS throttles were these.

        False (the slot still the caller's) when this runner has the job in
        flight already.  How the claim went is told to ``told`` from the
        worker: "claimed" (before the fire), refused ("held", "gone") or
        failed ("error").  Claims run on the workers, in parallel: at a
        cloud's round trips a claim is several requests, and claiming one
        job after another held due jobs back.
        """
        if not self._enter(store.agent, job_id):
            return False
        self._pool.submit(self._claim_and_fire, store, job_id, told, look_first)
        return True

    def reclaim(self, store: AgentStore, job_id: str, look_first: bool = False) -> str:
        """A job left in firing by a runner that died: "claimed" (a worker has it; its slot too),
        "held", "gone" or "busy".

        ``look_first`` (a listing of firing may be a moment old): the job is read before its lease
        is taken, and if it has left firing nothing is written.  A job finished just after the
        listing has its lease ended a round trip after: taken then, it was taken and let go again,
        two writes of one object within a second of the finish's end (refused on GCS)."""
        if not self._enter(store.agent, job_id):
            return "busy"
        claim: Claim | None = None
        try:
            if look_first and store.get("firing", job_id) is None:
                self._leave(store.agent, job_id)
                return "gone"
            if store.own_driver:  # the lease, and the record written anew under it (``Jobs.claim``)
                claim, found = self._claim_leased(store, job_id, recover=True)
                job = found[0] if found is not None else None
            else:
                claim = self.claims.take(store, job_id)
                job = store.get("firing", job_id) if claim is not None else None  # still there?
            if claim is None:
                self._leave(store.agent, job_id)
                return "held"
        except StoreCallError:
            if claim is not None:
                self.claims.forget(claim)  # where the job is is unknown: the lease lapses, recovery looks
            self._leave(store.agent, job_id)
            raise
        if job is None:
            if not store.own_driver:  # the driver let the lease go itself
                self.claims.release(claim)
            self._leave(store.agent, job_id)
            return "gone"
        log("recovering", runner=self.holder, agent=store.agent.label(), job=job_id, took=claim.took,
            fence=claim.fence)
        self._pool.submit(self._fire_and_finish, store, job, claim, True)
        return "claimed"

    def _claim_and_fire(self, store: AgentStore, job_id: str, told: Callable[[str], None],
                        look_first: bool = False) -> None:
        claim: Claim | None = None
        outcome = "held"
        try:
            if look_first and store.get("waiting", job_id) is None:
                outcome = "gone"  # claimed and gone since it was listed: nothing written for it
            else:
                if store.own_driver:
                    claim, found = self._claim_leased(store, job_id)
                else:
                    claim = self.claims.take(store, job_id)
                    found = self._claim(store, job_id, claim) if claim is not None else None
                if claim is not None:
                    if found is not None:
                        claim.claimed = time.monotonic()  # the finish's pace counts from here
                        job, recovered = found
                        outcome = "claimed"
                        told(outcome)
                        self._fire_and_finish(store, job, claim, recovered)  # frees the slot and the job
                        return
                    outcome = "gone"
        except StoreCallError as exc:
            if claim is not None:
                self.claims.forget(claim)  # where the job is is unknown: the lease lapses, recovery looks
            log("claim_failed", runner=self.holder, agent=store.agent.label(), job=job_id, error=str(exc))
            outcome = "error"
        except Exception as exc:  # a bug must not keep the slot taken
            log("worker_failed", runner=self.holder, agent=store.agent.label(), job=job_id, error=repr(exc))
            outcome = "error"
        finally:
            if outcome != "claimed":
                self._leave(store.agent, job_id)
                self._slots.release()
        told(outcome)

    def _claim_leased(self, store: AgentStore, job_id: str,
                      recover: bool = False) -> tuple[Claim | None, tuple[dict[str, Any], bool] | None]:
        """The lease and the claim in one request through the runner's own driver (``Jobs.claim``):
        (the claim, or None when another runner holds it; the job to fire and whether it is a
        recovery, or None).  With nothing to fire the driver has let the lease go already.
        ``recover``: only a job left in firing (``reclaim``)."""
        sent = self.claims.clock()
        reply = store.claim_leased(job_id, lease_thread(job_id), self.holder, self.claims.lapse_ms,
                                   time.time() + EARLY, recover=recover)
        if "took" not in reply:  # it shifted the job without a lease: recovery finds it leaseless in firing
            raise StoreCallError(f"job_claim for {store.agent.label()}: the driver is too old to take the "
                                 "claim lease (upgrade it with the scheduler); the job is left to recovery")
        holder, fence = reply.get("holder"), reply.get("fence")
        claim = self.claims.hold(store, job_id, str(reply["took"]), holder if isinstance(holder, str) else None,
                                 self.claims.written(sent, held_of(reply)), fence if type(fence) is int else None)
        job = reply.get("job")
        if claim is None or job is None:
            if claim is not None:
                self.claims.forget(claim)
            return claim, None
        return claim, (job, bool(reply.get("recovered")))

    def _claim(self, store: AgentStore, job_id: str, claim: Claim) -> tuple[dict[str, Any], bool] | None:
        """With the lease taken: the job to fire (and whether it is a recovery), or None (lease let go)."""
        if claim.took == "lapsed":
            # Its last holder died, maybe while firing an earlier job of this id: that one comes first.
            orphan = store.get("firing", job_id)
            if orphan is not None:
                return orphan, True
        job = store.claim(job_id)  # waiting -> firing, and the job that moved
        if job is None or due_of(job) > time.time() + EARLY:
            if job is not None:  # replaced with a later due since it was listed: put it back
                store.shift(job_id, "firing", "waiting")
            self.claims.release(claim)
            return None
        return job, False

    # -- firing and finishing ------------------------------------------------------

    def _fire_and_finish(self, store: AgentStore, job: dict[str, Any], claim: Claim, recovered: bool) -> None:
        """Fire on this worker; the finish is handed on (``_finish_paced``), and the slot freed."""
        agent, job_id = store.agent, job["id"]
        handed = False  # the finish is queued: the job stays in flight until it is settled
        try:
            result = self.fire.run(agent, job, recovered, lambda: self.claims.stale(claim), claim.fence,
                                   lambda: self.claims.ready_to_start(claim))
            if not result.ran:
                # Judged right before the start: the claim was fenced (a pause since the claim, a store
                # too slow to confirm it) or lost.  Nothing ran: recovery fires it (its lease lapses).
                log("not_started", runner=self.holder, owner=agent.owner, agent=agent.id, job=job_id,
                    why=result.killed, fence=claim.fence, recovered=recovered)
                self.claims.forget(claim)
                return
            with self._lock:
                self.fired += 1
            lateness = result.started - due_of(job)
            fire_times.observe(lateness, result.duration, recovered)
            log(
                "fired",
                owner=agent.owner,
                agent=agent.id,
                job=job_id,
                due=job["due"],
                started=round(result.started, 6),
                lateness_ms=round(lateness * 1000, 3),
                exit=result.exit,
                duration_ms=round(result.duration * 1000, 3),
                runner=self.holder,
                recovered=recovered,
                killed=result.killed,
                fence=claim.fence,
                **({"error": result.error} if result.error else {}),
            )
            if result.killed in ("fenced", "lost") or claim.lost == "lost":
                # Killed as the claim went (or another runner has it): the fire did not complete, and
                # recovery fires it again.  A fire that ended on its own is finished below, under its
                # claim in the store, whatever the local judgement of its age says.
                self.claims.forget(claim)
                return
            self._finishing.acquire()
            handed = True
            claim.ending = True  # renewed only when the lease needs it: the finish ends it soon
            self._finishes.at(claim.claimed + FINISH_PACE, lambda: self._finish_paced(store, job_id, claim))
        except Exception as exc:  # a bug must not keep the slot taken
            log("worker_failed", runner=self.holder, agent=agent.label(), job=job_id, error=repr(exc))
            self.claims.forget(claim)
        finally:
            if not handed:
                self._leave(agent, job_id)
            self._slots.release()

    def _finish_paced(self, store: AgentStore, job_id: str, claim: Claim) -> None:
        """The finish of a fire that ended, on a finishing thread at its pace."""
        agent = store.agent
        later = False  # the finish handed to the renewer: the job stays in flight until it is settled
        try:
            if claim.lost == "lost":  # lost while the finish waited: its new holder fires it and finishes it
                self.claims.forget(claim)
                return
            later = self._finish(store, job_id, claim)
        except StoreCallError as exc:
            log("finish_failed", runner=self.holder, agent=agent.label(), job=job_id, error=str(exc))
            self.claims.forget(claim)
        except Exception as exc:  # a bug must not keep the job in flight
            log("worker_failed", runner=self.holder, agent=agent.label(), job=job_id, error=repr(exc))
            self.claims.forget(claim)
        finally:
            if not later:
                self._leave(agent, job_id)
            self._finishing.release()

    def _finish_once(self, store: AgentStore, job_id: str, claim: Claim) -> None:
        """One finish, settled: the job out of firing and the lease ended while the claim is ours in the
        store; else nothing changed (another runner's, or nobody's) and the claim is let go.

        Through the runner's own driver one ``job_finish``, conditional on the
        lease with the claim's fence (``Jobs.finish``: no window).  Through a
        bridge, which answers only the protocol's ops: ``renew`` (``lost``: not
        ours), then the shift or removal; a runner paused between the two past
        the lapse, while another takes the job over and fires it, still takes
        it out of firing (docs/scheduler.md, *What is promised*).
        """
        agent = store.agent
        if store.own_driver and claim.fence is not None:
            reply = store.finish_claimed(job_id, claim.thread, self.holder, claim.fence, self.keep_ending)
            self.claims.forget(claim)  # the lease was ended by the op when ours
            if reply.get("ours") is not True:
                log("finish_not_ours", runner=self.holder, agent=agent.label(), job=job_id, fence=claim.fence,
                    holder=reply.get("holder"))
            elif reply.get("finished") is not True:
                log("lost_job", runner=self.holder, agent=agent.label(), job=job_id)
            return
        if not store.renew(claim.thread, self.holder):
            self.claims.forget(claim)
            log("finish_not_ours", runner=self.holder, agent=agent.label(), job=job_id, fence=None, holder=None)
            return
        moved = store.shift(job_id, "firing", "ending") if self.keep_ending else store.remove("firing", job_id)
        if moved:
            self.claims.release(claim)
        else:
            log("lost_job", runner=self.holder, agent=agent.label(), job=job_id)
            self.claims.forget(claim)

    def _finish(self, store: AgentStore, job_id: str, claim: Claim) -> bool:
        """Out of firing (into ending when kept, else removed), then the lease goes, under the claim in
        the store (``_finish_once``): never dropped on a local judgement of the claim's age.

        One request either way: a job not kept is removed straight from
        firing.  A runner that dies before that request leaves it in firing,
        to be fired again (at least once), exactly as if it had died a moment
        before a shift to ending; nothing is lost by skipping the stop.

        A finish that fails (a throttle outlasting the op's deadline, a store
        unreachable for a while) is tried again while the claim is ours: its
        lease is still renewed, so no runner recovers a job whose fire has
        ended.  Letting go at the first failure left the job in firing with a
        lapsing lease, and recovery fired it again.  Past ``FINISH_TRIES`` the
        finish is handed to the claims' renewer (``Claims.finish_later``),
        which keeps the lease and tries once a renewal round until it is
        done: True (the job stays in flight here until then, so this
        runner's own recovery scan never takes it either).
        """
        agent = store.agent
        for attempt in range(FINISH_TRIES):
            try:
                self._finish_once(store, job_id, claim)
                return False
            except StoreCallError as exc:
                if claim.lost == "lost":
                    raise
                if attempt == FINISH_TRIES - 1:
                    log("finish_later", runner=self.holder, agent=agent.label(), job=job_id, error=str(exc))
                    self.claims.finish_later(claim, lambda: self._finish_once(store, job_id, claim),
                                             lambda: self._leave(agent, job_id))
                    return True
                wait = min(FINISH_WAIT_MAX, FINISH_WAIT * 2**attempt)
                log("finish_retry", runner=self.holder, agent=store.agent.label(), job=job_id, error=str(exc),
                    attempt=attempt + 1, wait_s=wait)
                time.sleep(wait)
        return False

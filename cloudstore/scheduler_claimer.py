"""Claiming one job, firing it on a worker, and finishing it.

``Claimer.claim`` takes a job out of waiting: lease first, then the shift
waiting -> firing (of several runners exactly one gets both), then the job
is read back from firing, since what was shifted is what must be fired (a put
may have replaced the listed job meanwhile).  ``Claimer.reclaim`` takes back a
job left in firing by a runner that died: the lease (``take`` answers
``lapsed``, or ``took`` when the lease is already this runner's), then a
fresh read that the job is still there.  Either way a worker thread fires it
and then finishes it: firing -> ending, out of ending (unless kept), lease
ended.

A job is claimed only when a worker slot is free, so a runner never sits on
claimed jobs it can't fire yet while other runners could.  Whatever this
runner is claiming or firing is "in flight" and never claimed twice by it
(``take`` answers ``took`` to the holder itself, so without this the
recovery scan would fire our own jobs again).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional

from .scheduler_claims import Claim, Claims
from .scheduler_fire import FireCommand
from .scheduler_log import log
from .scheduler_store import Agent, AgentStore, StoreError

EARLY = 0.001  # a job read back from firing due later than this past now was replaced: it isn't due


def due_of(job: dict[str, Any]) -> float:
    """A job's due as a float; a malformed one sorts last and is never due."""
    due = job.get("due")
    return float(due) if isinstance(due, (int, float)) and not isinstance(due, bool) else float("inf")


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
        """Wait for the fires under way to finish."""
        self._pool.shutdown(wait=True)

    # -- claiming ----------------------------------------------------------------

    def claim(self, store: AgentStore, job_id: str) -> str:
        """A due job out of waiting: "claimed" (a worker has it; its slot too), "held", "gone" or "busy"."""
        return self._guarded(store, job_id, self._claim)

    def reclaim(self, store: AgentStore, job_id: str) -> str:
        """A job left in firing by a runner that died; answers as ``claim``."""
        return self._guarded(store, job_id, self._reclaim)

    def _guarded(self, store: AgentStore, job_id: str, step: Callable[[AgentStore, str, Claim], str]) -> str:
        """Take the lease, run ``step``; undo the bookkeeping whenever no worker got the job."""
        if not self._enter(store.agent, job_id):
            return "busy"
        claim: Optional[Claim] = None
        outcome = "held"
        try:
            claim = self.claims.take(store, job_id)
            if claim is not None:
                outcome = step(store, job_id, claim)
            return outcome
        except StoreError:
            if claim is not None:
                self.claims.forget(claim)  # where the job is is unknown: the lease lapses, recovery looks
            raise
        finally:
            if outcome != "claimed":
                self._leave(store.agent, job_id)

    def _claim(self, store: AgentStore, job_id: str, claim: Claim) -> str:
        if claim.took == "lapsed":
            # Its last holder died, maybe while firing an earlier job of this id: that one comes first.
            orphan = store.get("firing", job_id)
            if orphan is not None:
                return self._submit(store, orphan, claim, recovered=True)
        if not store.shift(job_id, "waiting", "firing"):
            self.claims.release(claim)
            return "gone"
        job = store.get("firing", job_id)
        if job is None or due_of(job) > time.time() + EARLY:
            if job is not None:  # replaced with a later due since it was listed: put it back
                store.shift(job_id, "firing", "waiting")
            self.claims.release(claim)
            return "gone"
        return self._submit(store, job, claim, recovered=False)

    def _reclaim(self, store: AgentStore, job_id: str, claim: Claim) -> str:
        job = store.get("firing", job_id)  # still there now that the lease is ours?
        if job is None:
            self.claims.release(claim)
            return "gone"
        log("recovering", runner=self.holder, agent=store.agent.label(), job=job_id, took=claim.took)
        return self._submit(store, job, claim, recovered=True)

    # -- firing and finishing ------------------------------------------------------

    def _submit(self, store: AgentStore, job: dict[str, Any], claim: Claim, recovered: bool) -> str:
        self._pool.submit(self._fire_and_finish, store, job, claim, recovered)
        return "claimed"

    def _fire_and_finish(self, store: AgentStore, job: dict[str, Any], claim: Claim, recovered: bool) -> None:
        agent, job_id = store.agent, job["id"]
        try:
            result = self.fire.run(agent, job, recovered, lambda: self.claims.stale(claim))
            with self._lock:
                self.fired += 1
            log(
                "fired",
                owner=agent.owner,
                agent=agent.id,
                job=job_id,
                due=job["due"],
                started=round(result.started, 6),
                lateness_ms=round((result.started - due_of(job)) * 1000, 3),
                exit=result.exit,
                duration_ms=round(result.duration * 1000, 3),
                runner=self.holder,
                recovered=recovered,
                killed=result.killed,
                **({"error": result.error} if result.error else {}),
            )
            if claim.lost is not None:
                # Another runner has it, or may take it any moment: it fires it again and finishes it.
                self.claims.forget(claim)
                return
            self._finish(store, job_id, claim)
        except StoreError as exc:
            log("finish_failed", runner=self.holder, agent=agent.label(), job=job_id, error=str(exc))
            self.claims.forget(claim)
        except Exception as exc:  # a bug must not keep the slot taken
            log("worker_failed", runner=self.holder, agent=agent.label(), job=job_id, error=repr(exc))
            self.claims.forget(claim)
        finally:
            self._leave(agent, job_id)
            self._slots.release()

    def _finish(self, store: AgentStore, job_id: str, claim: Claim) -> None:
        """firing -> ending, then (unless kept) out of ending, then the lease goes."""
        if not store.shift(job_id, "firing", "ending"):
            log("lost_job", runner=self.holder, agent=store.agent.label(), job=job_id)
            self.claims.forget(claim)
            return
        if not self.keep_ending:
            store.remove("ending", job_id)
        self.claims.release(claim)

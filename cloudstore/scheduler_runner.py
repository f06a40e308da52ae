"""The runner's loop: sleep until something is due, claim it, fire it, finish it.

One pass of the loop (see ``scheduler`` for what it promises):

1. Every ``lapse/3`` (and first thing): recovery.  List ``firing`` of each
   agent; a job there that this runner isn't firing whose lease ``take``
   gives us (nobody renewed it for a lapse: its runner died) is fired again.
2. Unless this runner knows every agent's waiting jobs (4.), ``job_next``:
   one request answering the soonest waiting due of EVERY agent in the
   store.  Nothing due: sleep until it is (at most ``max_sleep``), watching
   the ``job_mark`` of each of our agents every ``mark_interval``; any change
   (a put, a shift, a removal in waiting) wakes us at once.
3. Something due: list ``waiting`` of each agent not known, and claim every
   job due now, soonest first (``scheduler_claimer``: lease, shift, read
   back, fire on a worker, finish).
4. What the listing showed of an agent is KNOWN until its mark moves (no job
   of it can enter or leave waiting without moving its mark), so the runner
   sleeps until our own soonest due (or 1 s when a claim was refused as held
   by another runner's lease), watching marks as in 2., and on waking claims
   straight from what it knows: no ``job_next``, no listing.  A ``job_next``
   answering another agent's job therefore costs one listing, then nothing
   until our marks move: no spinning.  Knowledge a little stale (a change in
   the last mark interval) is harmless: the claim itself (lease, shift, read
   back) is the only judge of what's waiting.  Our own claims move that
   agent's mark, so after claiming it is read and listed afresh.

The mark baseline is read before ``job_next`` and before listing, and kept
across sleeps: a change after it moves the mark, a change before it is in
``job_next``'s answer and in the listing, so none is missed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .scheduler_claimer import Claimer, due_of
from .scheduler_claims import Claims
from .scheduler_fire import FireCommand
from .scheduler_log import log
from .scheduler_store import Agent, AgentStore, StoreError


WORKERS = 4  # jobs a runner fires at once by default: one long fire doesn't hold up the others


@dataclass(frozen=True)
class Timing:
    """How often the runner looks, and how long a claim lives."""

    lapse: float = 30.0
    mark_interval: float = 0.25
    max_sleep: float = 30.0

    @property
    def backoff(self) -> float:
        """How soon to look again at a due job another runner's lease holds."""
        return min(self.max_sleep, 1.0)

    @property
    def scan_interval(self) -> float:
        """Recovery cadence: an orphan can't be taken before its lease lapses, so lapse/3 loses little."""
        return self.lapse / 3


@dataclass
class Pass:
    """What a look at known waiting jobs did: how many it claimed, and when to look again (None: never)."""

    claimed: int = 0
    own_next: Optional[float] = None


class Runner:
    """Fires the due jobs of ``stores`` (one per agent bound to this machine)."""

    def __init__(
        self,
        stores: Sequence[AgentStore],
        next_stores: Sequence[AgentStore],
        fire: FireCommand,
        holder: str,
        timing: Timing = Timing(),
        workers: int = WORKERS,
        keep_ending: bool = False,
        renew_via: Optional[Callable[[AgentStore], AgentStore]] = None,
    ) -> None:
        self.stores = list(stores)
        self.next_stores = list(next_stores)  # one agent per distinct store, to ask job_next through
        self.holder = holder
        self.timing = timing
        self.claims = Claims(holder, timing.lapse, renew_via)
        self.claimer = Claimer(self.claims, fire, workers, keep_ending)
        self._stop = threading.Event()
        # Per agent: the mark baseline, and its waiting jobs as listed after that baseline was read.
        # While the mark stays the same nothing else can be waiting, so a known due is claimed
        # without job_next or job_list.  An agent missing from _known is listed again when due.
        self._marks: dict[Agent, int] = {}
        self._known: dict[Agent, list[dict[str, Any]]] = {}
        # A due job whose claim was refused (another lease on its id) isn't tried again before this.
        self._retry_at: dict[tuple[Agent, str], float] = {}

    # -- the loop ------------------------------------------------------------

    def stop(self) -> None:
        """Claim nothing more; ``run`` returns once the fires under way are finished."""
        self._stop.set()

    def run(self) -> None:
        next_scan, started = 0.0, False
        try:
            while not self._stop.is_set():
                try:
                    if time.monotonic() >= next_scan:
                        self.recover()
                        next_scan = time.monotonic() + self.timing.scan_interval
                    self._read_baselines()
                    if not started:
                        started = True
                        log("started", runner=self.holder, agents=[s.agent.wire() for s in self.stores])
                    wake_at = self._look()
                    if wake_at is not None:
                        self._sleep(wake_at, next_scan)
                except (StoreError, KeyError, TypeError, ValueError) as exc:  # the last three: a malformed reply
                    log("store_error", runner=self.holder, error=str(exc) or repr(exc))
                    self._marks.clear()
                    self._known.clear()
                    self._stop.wait(self.timing.backoff)
        finally:
            self.claimer.shutdown()
            self.claims.close()

    def _look(self) -> Optional[float]:
        """Fire what's due; the wall-clock time to sleep until, or None to look again at once."""
        now = time.time()
        unknown = [store for store in self.stores if store.agent not in self._known]
        soonest: Optional[float] = None
        if unknown:
            soonest = self._job_next()
            if soonest is not None and soonest <= now:
                for store in unknown:
                    self._known[store.agent] = store.list("waiting")
                soonest, now = None, time.time()
        found = self.claim_due(now)
        if found.claimed:
            return None
        wake_at = now + self.timing.max_sleep
        for later in (soonest, found.own_next):
            if later is not None:
                wake_at = min(wake_at, later)
        return wake_at

    def _job_next(self) -> Optional[float]:
        answers = [n for n in (s.next() for s in self.next_stores) if n is not None]
        return min(answers) if answers else None

    def _read_baselines(self) -> None:
        """A mark baseline for each agent without one; what was known of it is dropped (listed after it)."""
        for store in self.stores:
            if store.agent not in self._marks:
                self._known.pop(store.agent, None)
                self._marks[store.agent] = store.mark()

    def _sleep(self, wake_at: float, next_scan: float) -> None:
        """Sleep until ``wake_at`` (wall clock) or ``next_scan`` (monotonic), or a mark moves."""
        until = min(time.monotonic() + max(0.0, wake_at - time.time()), next_scan)
        while not self._stop.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            if left < self.timing.mark_interval:
                self._stop.wait(left)
                return
            if self._stop.wait(self.timing.mark_interval):
                return
            moved = False
            for store in self.stores:
                mark = store.mark()
                if mark != self._marks.get(store.agent):
                    self._marks[store.agent] = mark
                    self._known.pop(store.agent, None)  # its waiting changed: what we listed is stale
                    moved = True
            if moved:
                return

    # -- claiming ------------------------------------------------------------

    def claim_due(self, now: float) -> Pass:
        """Claim each known waiting job due by ``now``, soonest first; keep the rest known."""
        stores = {store.agent: store for store in self.stores}
        found = Pass()
        self._retry_at = {k: t for k, t in self._retry_at.items() if t > now}
        due, keep = [], {}
        for agent, jobs in self._known.items():
            keep[agent] = []
            for job in jobs:
                ready = max(due_of(job), self._retry_at.get((agent, job["id"]), 0.0))
                (due if ready <= now else keep[agent]).append((ready, agent, job))
        due.sort(key=lambda entry: entry[0])
        claimed_in: set[Agent] = set()
        for i, (_, agent, job) in enumerate(due):
            if not self.claimer.acquire_slot(self._stop.is_set):
                for entry in due[i:]:
                    keep[entry[1]].append(entry)
                break
            outcome = self.claimer.claim(stores[agent], job["id"])
            if outcome == "claimed":
                found.claimed += 1
                claimed_in.add(agent)
                continue
            self.claimer.release_slot()
            if outcome in ("held", "busy"):  # still waiting, another lease on its id: try again soon
                retry = now + self.timing.backoff
                self._retry_at[(agent, job["id"])] = retry
                keep[agent].append((retry, agent, job))
        found.own_next = min((ready for entries in keep.values() for ready, _, _ in entries), default=None)
        self._known = {agent: [job for _, _, job in entries] for agent, entries in keep.items()}
        for agent in claimed_in:  # our own shifts moved its mark: a fresh baseline, then a fresh listing
            self._marks.pop(agent, None)
            self._known.pop(agent, None)
        return found

    def recover(self) -> None:
        """Fire again each job left in firing by a runner that died (its lease lapsed)."""
        for store in self.stores:
            for job in sorted(store.list("firing"), key=due_of):
                if self._stop.is_set() or self.claimer.busy(store.agent, job["id"]):
                    continue
                if not self.claimer.acquire_slot(self._stop.is_set):
                    return
                if self.claimer.reclaim(store, job["id"]) != "claimed":
                    self.claimer.release_slot()

"""Where a runner learns which of its agents' jobs a dead runner left in firing: the claim index.

The store keeps one entry per job in firing, for every agent, in one shared
listing (``claim_index``); the runner's own driver answers it by name
(``job_claims``, like ``job_due``).  ``ClaimWatch`` lists it for all of the
runner's indexed agents at once, at most ``PAGES`` pages a step, and a full
pass at least every ``list_every`` (a third of the lapse): a job that enters
firing after a pass cannot be orphaned before a lapse has gone by since, so
the next pass sees it in time.  Idle, that is one request a ``list_every``
whatever the number of agents.

An entry of ours is tried (the claimer's ``reclaim``: the lease ``take``,
then a read that the job is still in firing) once its claim may have lapsed:
a lapse after it entered firing (the entry's age, less one poll of slack:
tried early, never late).  A lease still ``held`` (its runner renews it: a
long fire) is tried again every ``look_interval``, so a runner that dies
mid-fire is replaced at most a poll after its lease lapsed, whether or not
it was the one scanning anything.  At most ``TRIES`` tries a step, the
oldest first, so a crowd of long fires on other runners costs each step a
bounded number of reads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..store.keys import is_hashed, name_part
from .store_client import Agent, AgentStore

PAGE = 1000  # job_claims entries a request: one listing page
PAGES = 4  # pages at most a step; a longer index is paged on at the next steps
TRIES = 16  # leases tried at most a step


@dataclass
class Candidate:
    """A job of ours in firing elsewhere, and when (monotonic) to try its lease."""

    store: AgentStore
    job: str
    try_at: float
    entered: float  # when (monotonic, as a listing's age puts it) the job entered firing


class ClaimWatch:
    """The claim index, listed for the runner's own-driver agents (``stores``)."""

    def __init__(self, stores: Sequence[AgentStore], lapse: float, look_interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        own = [store for store in stores if store.own_driver]
        self.stores = {store.agent.due_token(): store for store in own}
        self.asker = own[0] if own else None
        self.lapse = lapse
        self.look_interval = look_interval
        self.list_every = max(lapse / 3, look_interval)
        self.clock = clock
        self.list_at = -math.inf  # monotonic time of the next listing step
        self.after: str | None = None  # the cursor of a pass longer than PAGES pages
        self.candidates: dict[tuple[Agent, str], Candidate] = {}
        self._seen: set[tuple[Agent, str]] = set()  # shown by the pass under way

    @property
    def agents(self) -> set[Agent]:
        """The agents whose firing this watch covers (the others: the runner's per-agent sweep)."""
        return {store.agent for store in self.stores.values()}

    def next_at(self) -> float:
        """When (monotonic) the next step has something to do."""
        if self.asker is None:
            return math.inf
        return min([self.list_at, *(c.try_at for c in self.candidates.values())])

    def step(self, busy: Callable[[Agent, str], bool]) -> list[Candidate]:
        """List the index when its time has come; the candidates whose lease is to be tried now
        (at most ``TRIES``, oldest first), not ``busy`` (in flight at this runner)."""
        if self.asker is None:
            return []
        now = self.clock()
        if now >= self.list_at:
            self._list(now)
        ready = sorted((c for c in self.candidates.values() if c.try_at <= now), key=lambda c: c.try_at)
        chosen = []
        for candidate in ready:
            if busy(candidate.store.agent, candidate.job):  # our own fire: its lease is ours, renewed
                candidate.try_at = now + self.list_every
                continue
            chosen.append(candidate)
            if len(chosen) >= TRIES:
                break
        return chosen

    def tried(self, candidate: Candidate, outcome: str) -> None:
        """What a try of ``candidate`` came to: "claimed" or "gone" (done with it), "held" (its runner
        lives, or has not lapsed yet: again in a poll), anything else (an error: again in a poll)."""
        key = (candidate.store.agent, candidate.job)
        if outcome in ("claimed", "gone"):
            self.candidates.pop(key, None)
        else:
            candidate.try_at = self.clock() + self.look_interval

    def _list(self, now: float) -> None:
        assert self.asker is not None
        first = self.after is None
        if first:
            self._seen = set()
        after = self.after
        for _ in range(PAGES):
            entries, more = self.asker.claims(PAGE, after)
            self._ours(entries, now)
            if not more or not entries:
                # A whole pass: what it did not show has left firing.
                self.candidates = {k: c for k, c in self.candidates.items() if k in self._seen}
                self.after = None
                self.list_at = now + self.list_every
                return
            after = entries[-1]["key"]
        self.after = after  # a long index: the next step goes on from here
        self.list_at = now + self.look_interval

    def _ours(self, entries: list[dict[str, Any]], now: float) -> None:
        hashed: set[AgentStore] = set()
        for entry in entries:
            store = self.stores.get(entry["agent"])
            if store is None:
                continue
            if entry["job"] is None:
                hashed.add(store)
                continue
            self._saw(store, str(entry["job"]), float(entry["age_ms"]) / 1000, now)
        for store in hashed:  # ids kept only as hashes: that agent's firing names them
            for job in store.list("firing"):
                if is_hashed(name_part(str(job["id"]))):
                    self._saw(store, str(job["id"]), 0.0, now)

    def _saw(self, store: AgentStore, job: str, age: float, now: float) -> None:
        key = (store.agent, job)
        self._seen.add(key)
        entered = now - age
        known = self.candidates.get(key)
        # New, or its entry written again since (the job left firing and entered it anew under a fresh
        # claim): its lease cannot lapse before a lapse after that.
        if known is None or entered > known.entered + self.look_interval:
            wait = max(0.0, self.lapse - age - self.look_interval)
            self.candidates[key] = Candidate(store, job, now + wait, entered)

"""Where a runner learns which of its agents' jobs are due: one poll, whatever the number of agents.

A ``Due`` is one waiting job of one of our agents as far as the runner needs
to know it: the agent, the job's id and its due.  A poll gathers them from
every source:

* ``IndexSource``: the runner's own driver answers ``job_due``, the store's
  shared due index by name, soonest first: ONE listing for every agent in the
  store.  Entries of agents that aren't ours are skipped; an entry whose job
  id is kept only as a hash is looked up by listing that agent's waiting.
  The index is shared with every agent of the store, so a backlog of another
  agent's entries (one no runner serves, with 10,000 jobs due in 1970, or
  10,000 due now) must neither hide our jobs nor multiply our cost.  Two
  scans share the work:

  - the *fast scan* lists from ``RECENT`` seconds before the last time a scan
    reached past ``now`` (everything due by then has been listed), so an old
    backlog is never listed again by it; a young backlog is paged through at
    most ``PAGES`` pages a poll, from where the last poll stopped (a cursor),
    and leaves the fast scan's range ``RECENT`` seconds after it fell due.
  - the *sweep* lists what lies before the fast scan's range (jobs put with a
    due long past, or missed while no runner ran): one page every
    ``SWEEP_EVERY`` seconds from where it stopped, ``PAGES`` pages at
    start-up.  Its cost is flat however large the backlog; what it finds was
    late already.
* ``ListSource``: an agent reached through its store bridge, which (rightly)
  answers no op naming other agents' jobs: its waiting is listed, one
  listing per poll for each such agent.

The index may show a job a moment after it left waiting (its entry is
dropped right after the record changes) or a crash's leftover: the claim is
the judge (lease, shift, read back), so such an entry costs a refused claim,
after which the runner leaves that entry alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..store.due_index import sortable
from .claiming import due_of
from .store_client import Agent, AgentStore

PAGE = 1000  # job_due entries a request: one listing page
PAGES = 10  # pages at most a poll of the fast scan (and of the start-up sweep)
RECENT = 60.0  # seconds: the fast scan starts this long before the last time it saw past now
SWEEP_EVERY = 30.0  # seconds (monotonic) between pages of the sweep over older entries


@dataclass(frozen=True)
class Due:
    """One of our agents' waiting jobs: claimed once ``due`` has come."""

    store: AgentStore
    job: str
    due: float
    key: str | None = None  # the index entry (unique to one put), when it came from the index

    @property
    def agent(self) -> Agent:
        return self.store.agent


@dataclass
class Poll:
    """What one poll found: our due jobs, and how far it could see (``horizon``: later dues unknown)."""

    found: list[Due]
    horizon: float = math.inf


class Source(Protocol):
    def poll(self, now: float) -> Poll: ...


class IndexSource:
    """Our agents' due jobs from the store's shared index, through the runner's own driver."""

    def __init__(self, stores: Sequence[AgentStore], clock: Callable[[], float] = time.monotonic) -> None:
        self.stores = {store.agent.due_token(): store for store in stores}
        self.asker = stores[0]
        self.clock = clock
        self.resume: str | None = None  # the fast scan's cursor: where a capped poll stopped
        self.seen_up_to: float | None = None  # every entry due by then was listed by a complete fast scan
        self.swept_after: str | None = None  # the sweep's cursor (None: from the top)
        self.sweep_at = -math.inf  # monotonic time of the sweep's next page; -inf: start-up

    def poll(self, now: float) -> Poll:
        found: dict[str, Due] = {}
        listed_again: set[Agent] = set()
        floor = sortable((self.seen_up_to if self.seen_up_to is not None else now) - RECENT)
        horizon = self._fast(now, floor, found, listed_again)
        self._sweep(floor, found, listed_again)
        return Poll(list(found.values()), horizon)

    def _fast(self, now: float, floor: str, found: dict[str, Due], listed_again: set[Agent]) -> float:
        """The fast scan: at most PAGES pages from the cursor, or from ``floor``; its horizon."""
        after = self.resume if self.resume is not None and self.resume > floor else floor
        for _ in range(PAGES):
            entries, more = self.asker.due(PAGE, after)
            self._ours(entries, found, listed_again, now)
            if not more or not entries or float(entries[-1]["due"]) > now:
                self.resume, self.seen_up_to = None, now
                last = float(entries[-1]["due"]) if entries else math.inf
                return last if more and last > now else math.inf
            after = entries[-1]["key"]
        self.resume = after  # a backlog past PAGES pages: the next poll goes on from here, at once
        return now

    def _sweep(self, floor: str, found: dict[str, Due], listed_again: set[Agent]) -> None:
        """The sweep over what lies before the fast scan's range: one page per SWEEP_EVERY,
        PAGES pages at start-up; entries at or past ``floor`` are the fast scan's."""
        if self.clock() < self.sweep_at:
            return
        pages = PAGES if self.sweep_at == -math.inf else 1
        self.sweep_at = self.clock() + SWEEP_EVERY
        for _ in range(pages):
            entries, more = self.asker.due(PAGE, self.swept_after)
            before = [e for e in entries if e["key"] < floor]
            self._ours(before, found, listed_again, math.inf)
            if not more or len(before) < len(entries) or not entries:
                self.swept_after = None  # reached the fast scan's range: start again from the top
                return
            self.swept_after = entries[-1]["key"]

    def _ours(self, entries: list[dict[str, Any]], found: dict[str, Due], listed_again: set[Agent],
              now: float) -> None:
        """Keep the entries of our agents (and look up the hashed ids of theirs by listing)."""
        for entry in entries:
            store = self.stores.get(entry["agent"])
            if store is None:
                continue
            if entry["job"] is not None:
                found.setdefault(entry["key"], Due(store, entry["job"], float(entry["due"]), entry["key"]))
            elif store.agent not in listed_again:  # the id is hashed in the key: ask the agent's waiting
                listed_again.add(store.agent)
                for due in ListSource(store).poll(now).found:
                    if _hashed_id(due.job):
                        found.setdefault(f"{store.agent.due_token()}\0{due.job}", due)


class ListSource:
    """One agent's waiting, listed (an agent reached through its own bridge)."""

    def __init__(self, store: AgentStore) -> None:
        self.store = store

    def poll(self, now: float) -> Poll:
        return Poll([Due(self.store, str(job["id"]), due_of(job)) for job in self.store.list("waiting")])


def _hashed_id(job_id: str) -> bool:
    """Whether the index keeps this id only as a hash (so a listing, not the index, names it)."""
    from ..store.keys import is_hashed, name_part

    return is_hashed(name_part(job_id))

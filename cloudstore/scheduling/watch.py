"""Where a runner learns which of its agents' jobs are due: one poll, whatever the number of agents.

A ``Due`` is one waiting job of one of our agents as far as the runner needs
to know it: the agent, the job's id and its due.  A poll gathers them from
every source:

* ``IndexSource``: the runner's own driver answers ``job_due``, the store's
  shared due index by name, soonest first: ONE listing for every agent in the
  store (paged on only while a backlog of other agents' due jobs fills a page).
  Entries of agents that aren't ours are skipped; an entry whose job id is
  kept only as a hash is looked up by listing that agent's waiting.
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .claiming import due_of
from .store_client import Agent, AgentStore

PAGE = 100  # job_due entries a request
PAGES = 10  # pages at most a poll, past a backlog of other agents' due jobs


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

    def __init__(self, stores: Sequence[AgentStore]) -> None:
        self.stores = {store.agent.due_token(): store for store in stores}
        self.asker = stores[0]

    def poll(self, now: float) -> Poll:
        found: list[Due] = []
        listed_again: set[Agent] = set()
        after: str | None = None
        for _ in range(PAGES):
            entries, more = self.asker.due(PAGE, after)
            for entry in entries:
                store = self.stores.get(entry["agent"])
                if store is None:
                    continue
                if entry["job"] is not None:
                    found.append(Due(store, entry["job"], float(entry["due"]), entry["key"]))
                elif store.agent not in listed_again:  # the id is hashed in the key: ask the agent's waiting
                    listed_again.add(store.agent)
                    found += [d for d in ListSource(store).poll(now).found if _hashed_id(d.job)]
            if not more or not entries:
                return Poll(found)
            last = float(entries[-1]["due"])
            if last > now:
                return Poll(found, horizon=last)
            after = entries[-1]["key"]
        return Poll(found, horizon=now)  # a backlog past PAGES pages: look again at the next poll


class ListSource:
    """One agent's waiting, listed (an agent reached through its own bridge)."""

    def __init__(self, store: AgentStore) -> None:
        self.store = store

    def poll(self, now: float) -> Poll:
        return Poll([Due(self.store, str(job["id"]), due_of(job)) for job in self.store.list("waiting")])


def _hashed_id(job_id: str) -> bool:
    """Whether the index keeps this id only as a hash (so a listing, not the index, names it)."""
    from ..keys import is_hashed, name_part

    return is_hashed(name_part(job_id))

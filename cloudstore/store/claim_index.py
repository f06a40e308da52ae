"""The shared claim index: one tiny object per job in firing, for every agent in the store.

Keys are ``_claim/<owner>/<id>/<job>`` below the store's prefix (owner/id as
``AgentKeys.due_token`` spells them, the job's id as a key part, hashed when
long), so ONE listing names every job in firing of every agent: a runner
finds a dead runner's job by listing this index once per recovery cadence,
whatever the number of agents, instead of each agent's ``firing`` in turn.

The key is the job's own (no nonce, no sortable time), so the job record
names nothing new: a record written by this driver reads the same to an older
one, and whoever takes a job out of firing knows which key to delete from the
agent and the id alone.  When the job entered firing is the listing's own
timestamp of the entry (written when it entered, rewritten while it stays
only by that op itself, after a pause: below): a claim lease taken then
cannot lapse before ``lapse`` has passed since, so a runner needs to try a
job's lease only from then on.

Crash order, as the due index's: the entry is written *before* the record
that puts the job in firing, and deleted *after* the record that takes it
out.  A crash between the two leaves an entry whose record holds no firing
job: ``entries`` reads the record of an entry older than ``GRACE`` (at most
``VERIFY_MAX`` a call, a live one not again for ``CONFIRMED_FOR``) and
deletes it when no firing job is there; ``gc`` reclaims the rest.  A pause
between the two (past ``GRACE``) is met as in the due index (due_index.py):
the op whose record landed ``LATE`` or more after it began writing the entry
writes it again (jobs.py), and a reader judges by the time before its read
and deletes only the version it listed.  An entry written again is dated
from then: a recovery tries that job's lease later than it might have, never
sooner.  A job put in firing by a driver older than this index has no entry:
the runner's slow per-agent sweep finds it (runner.py).  So does one whose
entry a late ``drop`` took: the key being the job's own, the delete of an
op that took the job out of firing (a finish, a remove, a shift, a claim
that lost), stopped before it was sent while the same id was put back and
claimed into firing again, takes the new claim's entry.  Left so: it needs
a pause across a whole new put and claim of that id, and costs only the
fast recovery of that one job.

A key this layout did not write is foreign garbage: passed over by every
reader, shown by ``inspect``, reclaimed by ``gc``; never an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..generations import NotFound, Overwrite, PreconditionFailed, StoreError
from .confirmed import Confirmed
from .keys import AgentKeys, claim_entry, claim_record, claim_root, decode_part, is_hashed, is_name_part
from .space import Space

GRACE = 60.0  # seconds: an entry this old whose record holds no firing job is a crash's leftover
LATE = GRACE / 2  # seconds from an entry's write to its record's reply past which its op writes it again
VERIFY_MAX = 8  # record reads at most per ``entries`` call


@dataclass(frozen=True)
class ClaimEntry:
    """One job in firing as the index names it (``job_claims``).

    ``age`` is how long ago (store seconds, by the store clock's estimate)
    the entry was written: when the job entered firing.  ``job`` is None when
    the key keeps only the id's hash.
    """

    key: str  # below the index root
    agent: str  # owner/id as keys spell them
    job: str | None
    age: float

    def wire(self) -> dict[str, Any]:
        return {"key": self.key, "agent": self.agent, "job": self.job, "age_ms": int(self.age * 1000)}


def parse_entry(rest: str) -> tuple[str, str, str | None] | None:
    """A key below the index root as (agent token, job part, job id or None when hashed); None for
    foreign garbage."""
    parts = rest.split("/")
    if len(parts) != 3:
        return None
    owner, agent_id, job = parts
    if not (owner == "-" or is_name_part(owner)) or not is_name_part(agent_id) or not is_name_part(job):
        return None
    try:
        name = None if is_hashed(job) else decode_part(job)
    except (ValueError, AssertionError, UnicodeDecodeError):
        return None
    return f"{owner}/{agent_id}", job, name


class ClaimIndex:
    """Add, drop and list the shared claim index."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.root = claim_root(space.root)
        self._confirmed = Confirmed()

    def add(self, keys: AgentKeys, job_id: str) -> None:
        """Write the entry of a job about to enter firing (a blind write: the same key again is fine)."""
        self.space.store.put(claim_entry(self.space.root, keys, job_id), b"", Overwrite())

    def drop(self, keys: AgentKeys, job_id: str) -> None:
        """Delete the entry of a job that has just left firing; gone already is fine."""
        try:
            self.space.store.delete(claim_entry(self.space.root, keys, job_id))
        except NotFound:
            pass

    def entries(self, firing_of: Callable[[Any], bool], limit: int,
                after: str | None = None) -> tuple[list[ClaimEntry], bool]:
        """The first ``limit`` entries after ``after`` (a key below the root), and whether the listing
        was full (more may follow).

        One listing; a record read only for an entry older than ``GRACE`` not
        confirmed lately (``firing_of`` says whether the record holds a job in
        firing): deleted when it does not.  Every other entry is answered as
        listed: the runner's lease ``take`` is the judge of whether its job is
        still in firing and orphaned.
        """
        listed = self.space.store.list(self.root, start_after=self.root + after if after else None, limit=limit)
        now = self.space.store.clock.now()  # ages err long: a lease is tried early, never late
        oldest = self.space.store.clock.earliest()  # leftovers judged by the least plausible age
        found: list[ClaimEntry] = []
        reads = 0
        for item in listed:
            rest = item.key[len(self.root):]
            parsed = parse_entry(rest)
            if parsed is None:
                continue
            token, job_part, name = parsed
            if reads < VERIFY_MAX and oldest - item.modified >= GRACE and not self._confirmed.fresh(item.key):
                reads += 1
                _, record = self.space.get_json(claim_record(self.space.root, token, job_part))
                if not firing_of(record):
                    self._drop_listed(item.key, item.version)
                    continue
                self._confirmed.add(item.key)
            found.append(ClaimEntry(key=rest, agent=token, job=name, age=max(0.0, now - item.modified)))
        return found, len(listed) >= limit

    def _drop_listed(self, key: str, version: str | None) -> None:
        """Delete a leftover only at the version listed: a claim writing the key again meanwhile
        (its job entering firing anew) keeps it."""
        try:
            self.space.store.delete(key, version)
        except (PreconditionFailed, NotFound, StoreError):
            pass  # rewritten, gone, or the store failing: the next listing judges it again


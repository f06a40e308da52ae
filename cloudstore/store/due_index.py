"""The shared job_next index: one tiny object per waiting job, keyed by due time.

Keys are ``_due/<16 hex of the due, order-preserving>/<owner>/<id>/<job>/<nonce>``
below the store's prefix, for every agent in the store.  A listing returns
keys in byte order, so the first key is the soonest due (the bucket keeps the
priority queue).  ``job_next`` is one LIST of a few keys plus one GET that
confirms the first; however many agents there are.

No hot object: each entry is its own key, created once and deleted once, so
no write of one agent touches an object another agent writes.

Never late, sometimes early:

* An entry is written *before* the job record that names it, so a waiting
  job always has its entry.  The record keeps the entry's key (the nonce makes
  it unique to that op), and whoever replaces or moves the record deletes
  exactly that key, never someone else's.
* A crash between the two leaves an entry no record names.  ``next`` finds it
  when it is first in line, and deletes it once older than ``GRACE`` seconds
  (well past any write still in flight: calls are stopped at 30 s).
  Until then it is answered as is: an early wake-up, never a missed due.
  Its age is judged in the store's time both ways (the listing's timestamp
  against the store's clock as this process knows it, clock.py), so a
  machine whose clock runs ahead cannot take a new entry for a stale one.
* A process can also stop (SIGSTOP, a VM stall) for longer than ``GRACE``
  between the two writes, its record write's time check passed: its entry
  then looks like a crash's leftover and is deleted, and the record lands
  after.  So both sides watch the time.  The putter, when the entry's write
  and the record's reply are ``LATE`` apart or more, writes the entry again
  (``again``; jobs.py): a reader that judges it after that reads the record.
  A reader judges an entry by the time *before* it read the record, and
  deletes it only at the version it listed (``_drop_listed``): a delete
  judged before the putter woke, landing after it wrote the entry again,
  fails.  (Not on a store that ignores a delete's version, fake-gcs-server:
  there a reader stopped between its judgment and its delete for as long can
  still take it; docs/design.md, known limits.)

The index is shared by every agent of the store, so nothing in it is trusted
beyond what its key may say.  A due becomes a key only within ``DUE_MAX``
(validate.py refuses a waiting due past it before anything is written); a key
this layout did not write, or one whose due is out of that range (a stray
object, an old version's ``10**400``), is foreign garbage: every reader skips
it, for everyone, ``inspect`` shows it and ``gc`` reclaims it, and it is never
an error in anyone's reply.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..generations import Listed, NotFound, Overwrite, PreconditionFailed, new_nonce
from .confirmed import Confirmed
from .keys import AgentKeys, decode_part, due_entry, due_record, due_root, is_hashed
from .model import WAITING_DUE_RULE, RequestError, due_in_range
from .space import Space

GRACE = 60.0
#: An op whose index entry's write and its record's reply are this far apart (seconds) may have met a reader
#: that judged the entry a leftover meanwhile: it writes the entry again (the module's docstring).
LATE = GRACE / 2
LOOK = 16  # entries listed per round
ROUNDS = 8  # rounds of stale entries deleted before answering
VERIFY_MAX = 8  # record reads at most per ``entries`` call: a backlog of old entries costs no read storm
SKIP_LOOK = 1000  # entries listed per round once a round found only foreign garbage to skip
_SORTABLE = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class DueEntry:
    """One waiting job as the index names it (``job_due``): no spec, no record read.

    ``agent`` is the agent's owner/id as keys spell it (``AgentKeys.due_token``);
    ``job`` the job's id, or None when the key holds only its hash.
    """

    key: str  # below the index root: unique to one write of one job
    due: float | int
    agent: str
    job: str | None

    def wire(self) -> dict[str, Any]:
        return {"key": self.key, "due": self.due, "agent": self.agent, "job": self.job}


def sortable(due: Any) -> str:
    """16 hex digits whose byte order is the numeric order of ``due`` (IEEE-754 trick).

    Only for a due within range (``due_in_range``): callers validate first, so
    no key is ever written for an infinity or a number no double holds."""
    if not due_in_range(due):
        raise RequestError(WAITING_DUE_RULE)
    value = float(due)
    bits = struct.unpack(">Q", struct.pack(">d", value))[0]
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return f"{bits:016x}"


def unsortable(text: str) -> float | int:
    """The due a ``sortable`` key part stands for: a double, whole ones as integers."""
    bits = int(text, 16)
    bits = bits & ~(1 << 63) if bits >> 63 else bits ^ 0xFFFFFFFFFFFFFFFF
    value = float(struct.unpack(">d", struct.pack(">Q", bits))[0])
    return int(value) if value.is_integer() else value


class DueIndex:
    """Add, drop and ask the shared index."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.root = due_root(space.root)
        self._confirmed = Confirmed()

    def add(self, keys: AgentKeys, job_id: str, due: Any) -> str:
        """Write a fresh entry for a job about to be put in waiting; its key.

        A due out of range (a job put in ending with ``2**70``, shifted to
        waiting) is refused here, before anything of the op is written."""
        key = due_entry(self.space.root, sortable(due), keys, job_id, new_nonce())
        self.space.store.put(key, b"", Overwrite())
        return key

    def again(self, entry: str) -> None:
        """Write an entry of this op's own anew (a new version), after its record landed late (``LATE``)."""
        self.space.store.put(entry, b"", Overwrite())

    def drop(self, entry: str | None) -> None:
        """Delete one entry (its own key only); gone already is fine."""
        if entry:
            try:
                self.space.store.delete(entry)
            except NotFound:
                pass

    def entries(self, waiting_of: Callable[[Any], dict[str, Any] | None], limit: int,
                after: str | None = None) -> tuple[list[DueEntry], bool]:
        """The first ``limit`` entries after ``after`` (a key below the root), soonest first; and
        whether the listing was full (more may follow).

        One listing, and a record read only for an entry that is both due and
        older than ``GRACE`` (a crash's leftover looks like that): it is kept
        when its record still names it, deleted otherwise; at most
        ``VERIFY_MAX`` such reads a call, so a backlog of another agent's old
        entries costs a poll no more than that (``gc`` reclaims the rest).  A live one is not
        read again for ``CONFIRMED_FOR`` seconds, so a job nobody fires (its
        agent's runners are down) does not cost every poll a read.  Any other
        entry is answered as listed: at worst an early wake-up, never a late one.
        """
        listed = self.space.store.list(self.root, start_after=start_key(self.root, after), limit=limit)
        found: list[DueEntry] = []
        now_store = self.space.store.clock.earliest()  # an orphan is judged old by the least plausible age
        reads = 0
        for item in listed:
            entry = parse_entry(item.key[len(self.root):])
            if entry is None:
                continue
            if (reads < VERIFY_MAX and entry.due <= now_store and now_store - item.modified >= GRACE
                    and not self._confirmed.fresh(item.key)):
                reads += 1
                _, record = self.space.get_json(self._record_key(item.key))
                waiting = waiting_of(record)
                if waiting is not None and waiting.get("entry") == item.key:
                    self._confirmed.add(item.key)
                elif self._drop_listed(item):
                    continue
            found.append(entry)
        return found, len(listed) >= limit

    def _drop_listed(self, item: Listed) -> bool:
        """Delete a leftover only at the version listed; False when it was written again meanwhile (by its
        own op, whose record landed late: the module's docstring), True when deleted or gone."""
        try:
            self.space.store.delete(item.key, item.version)
        except PreconditionFailed:
            return False
        except NotFound:
            pass
        return True

    def _record_key(self, entry: str) -> str:
        return due_record(self.space.root, entry)

    def next(self, waiting_of: Callable[[Any], dict[str, Any] | None]) -> Any | None:
        """The soonest due of any agent's waiting job, or None.

        ``waiting_of`` takes a job record (parsed JSON or None) and returns
        its waiting entry ``{"job", "entry"}`` or None.  Foreign garbage (a key
        this layout did not write, a due out of range in the key or in the
        record) is passed over, never deleted here and never answered.
        """
        after: str | None = None
        look = LOOK
        for _ in range(ROUNDS):
            listed = self.space.store.list(self.root, start_after=after, limit=look)
            if not listed:
                return None
            dropped = False
            for item in listed:
                entry = parse_entry(item.key[len(self.root):])
                if entry is None:
                    continue
                read = time.time()
                _, record = self.space.get_json(self._record_key(item.key))
                waiting = waiting_of(record)
                if waiting is not None and waiting.get("entry") == item.key:
                    due = waiting["job"].get("due") if isinstance(waiting.get("job"), dict) else None
                    if due_in_range(due):
                        return due
                    continue  # a record no validated write made: garbage, passed over
                # Its age as of the read (a pause since then must not make it old), in the store's time.
                read_at = self.space.store.clock.earliest() - max(0.0, time.time() - read)
                if read_at - item.modified < GRACE or not self._drop_listed(item):
                    return entry.due  # new, or written again since it was listed: answered as is
                dropped = True
            if len(listed) < look:
                return None
            if dropped:
                after, look = None, LOOK  # the front changed: look at it again
            else:
                after, look = listed[-1].key, SKIP_LOOK
        # Still only stale entries or garbage after ROUNDS rounds: answer the next real entry as an
        # early wake-up (never late); the next call goes on deleting.
        for item in self.space.store.list(self.root, start_after=after, limit=SKIP_LOOK):
            entry = parse_entry(item.key[len(self.root):])
            if entry is not None:
                return entry.due
        return None


def start_key(root: str, after: str | None) -> str | None:
    """The ``start_after`` of a listing of the entries after ``after`` (a key below the root, or a bare due).

    A bare due (16 hex digits: the fast scan's floor, scheduling/watch.py) is
    a folder's own name, and SeaweedFS skips that folder's children when
    listing after it.  So it becomes a key that is no folder's name and lies
    between the due just before it and it in both orders: after every entry
    of the due one step lower (their owner parts are ``-``, ``_...`` or
    ``~`` + hex, all below ``~~``) and before every entry of ``after``.
    """
    if not after:
        return None
    if _SORTABLE.fullmatch(after):
        below = int(after, 16) - 1
        return None if below < 0 else f"{root}{below:016x}/~~"
    return root + after


def parse_entry(rest: str) -> DueEntry | None:
    """A key below the index root as an entry; None for foreign garbage: a key this layout did not
    write, or a due out of range (``validate.DUE_MAX``)."""
    parts = rest.split("/")
    if len(parts) != 5:
        return None
    sortable_due, owner, agent_id, job, _nonce = parts
    if not _SORTABLE.fullmatch(sortable_due):
        return None
    try:
        due = unsortable(sortable_due)
        name = None if is_hashed(job) else decode_part(job)
    except (ValueError, AssertionError, UnicodeDecodeError):
        return None
    if not due_in_range(due):
        return None
    return DueEntry(key=rest, due=due, agent=f"{owner}/{agent_id}", job=name)

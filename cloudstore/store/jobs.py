"""Jobs: one record per job ID holding its entries in every place.

A record is ``{"places": {"waiting": {"job", "entry"}, "firing": {"job"}, ...}}``.
Keeping all of an ID's places in ONE object makes ``job_shift`` a single
conditional write: of any number of shifters of one job out of one place,
exactly one write wins, and the job is never in two places nor in none,
whatever crashes (there is no second step to crash between).  A change
rewrites only that ID's record, never the agent's other jobs.

The waiting place is mirrored in the shared due index (``due_index``) and in
the agent's mark: every change that touches waiting writes one of the mark's
shards anew, which moves the number ``job_mark`` derives from their listing
(job_mark.py: no object of it a write hot spot; it never comes back).

Order, so that a crash between any two requests leaves nothing a watcher
misses: a job put into waiting gets its index entry first, then a new mark,
then the record that makes it waiting.  A watcher woken by the mark asks
``job_next``, which already answers the entry's due (early, never late); a
crash before the record leaves only an early wake-up and an entry the index
deletes after ``GRACE``.  A change taking a job out of waiting writes the
mark first too: the mark moves whenever waiting changed, crash or not (and
sometimes when it did not, which the contract allows).

A pause is not a crash: a process stopped between an index entry and the
record (SIGSTOP, a VM stall, past ``GRACE``, its record write's time check
passed) wakes and lands the record after another machine deleted the entry
as a crash's leftover.  So an op whose record landed ``LATE`` or more after
it began writing the entry writes the entry again before it answers
(``_keep_entry``), whatever its own window says; due_index.py says why that
and the readers' side close the gap.  A put that was not stopped sends no
request more.

A record is read back from a bucket other agents share, so it is believed
only as far as its own key allows (stored.py): its jobs must be of its own
id, and its waiting entry, the one key the driver deletes on a record's
word, must be a due-index key of this agent's this job (``keys.is_due_entry_of``)
before anything is deleted or written.  A record that is not one this driver
writes makes that op answer an error naming the job record; the due index,
read for every agent, takes such a record for no waiting job at all.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, TypeVar

from ..generations import Listed, NotFound, Object, PreconditionFailed, StoreError, StoreUnavailable, op_overtime
from ..runtime import wake
from . import claim_index, due_index, job_mark, stored
from .claim_index import ClaimEntry, ClaimIndex
from .due_index import DueEntry, DueIndex
from .keys import AgentKeys, is_due_entry_of
from .model import PLACES, Agent
from .space import KEEP, Space

WAITING = "waiting"
FIRING = "firing"
T = TypeVar("T")
#: How long a record left with no place stays as a tombstone before a listing deletes it: far past
#: any write that could still land late (requests time out in seconds), so none can bring a job back.
TOMBSTONE_MS = 3600 * 1000


RECORD = "job record"
#: Seconds waited before each read of a record its claim found missing (``Jobs._read_late_record``):
#: together over two round trips of a cloud, the rest of a put's writes after its due entry.
LATE_RECORD_WAITS = (0.0, 0.05, 0.1, 0.2)
#: Seconds an index entry's write again is given once a pause has spent the op's window (``_keep_entry``).
AGAIN_SECONDS = 5.0


def _began() -> tuple[float, float]:
    """Now by both of this process's clocks: a pause that one of them misses (a VM stall) the other shows."""
    return time.monotonic(), time.time()


class _Indexed(NamedTuple):
    """An index entry an op wrote before the record that puts its job in ``place`` (``Jobs._keep_entry``):
    when the op began writing it (``_began``), and which entry (``entry`` in the due index for waiting, the
    claim index's of ``keys``' ``job_id`` for firing)."""

    began: tuple[float, float]
    keys: AgentKeys
    job_id: str
    place: str
    entry: str | None = None


def _places(record: dict[str, Any] | None) -> dict[str, Any]:
    return {} if record is None else dict(record.get("places", {}))


def _emptied(record: dict[str, Any] | None) -> int | None:
    """When a tombstone record (no place) was left empty, in store milliseconds; None for a live record."""
    if record is None or _places(record):
        return None
    return int(record.get("emptied", 0))


def _job(value: Any) -> dict[str, Any]:
    """A job as a record holds it: ``{"id", "spec", "due"}``, its due a finite number."""
    job = stored.obj(value, RECORD, "a job")
    stored.expect(set(job) == {"id", "spec", "due"}, RECORD, "a job is not {id, spec, due}")
    stored.text(job["id"], RECORD, "a job's id")
    stored.finite(job["due"], RECORD, "a job's due")
    return job


def checked(keys: AgentKeys, key: str | None, record: Any) -> dict[str, Any] | None:
    """The record stored at ``key`` (one of ``keys``' job records), as this driver writes them;
    ``stored.Malformed`` otherwise.

    Every job in it must be of the record's own id (``keys.job(id) == key``), and
    a waiting place's entry a due-index key of this agent's this job: the
    driver deletes that key when the job leaves waiting, so an entry naming
    anything else (another agent's file, another job's entry) is never believed.
    With ``key`` None (a listing, which checks ids against keys itself: ``_kept``),
    its jobs must be of one id.
    """
    if record is None:
        return None
    stored.obj(record, RECORD)
    stored.expect(set(record) <= {"places", "emptied"}, RECORD, "it holds fields no driver writes")
    places = stored.obj(record.get("places", {}), RECORD, "its places")
    if "emptied" in record:
        stored.count(record["emptied"], RECORD, "its emptied time")
    ids = set()
    for place, held in places.items():
        stored.expect(place in PLACES, RECORD, "it names a place that is none of the contract's")
        stored.obj(held, RECORD, "a place")
        stored.expect(set(held) <= {"job", "entry"} and "job" in held, RECORD, "a place is not {job, entry}")
        job = _job(held["job"])
        ids.add(job["id"])
        stored.expect(len(ids) == 1 and (key is None or keys.job(job["id"]) == key), RECORD,
                      "it holds a job of another id")
        entry = held.get("entry")
        if entry is not None:
            stored.expect(place == WAITING, RECORD, "a place other than waiting names a due entry")
            stored.expect(is_due_entry_of(keys.root, keys, job["id"], entry), RECORD,
                          "its due entry is not a key of this agent's own job in the due index")
    return record  # type: ignore[no-any-return]


def waiting_of(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The waiting entry of a job record, for the due index (read for every agent of the store).

    A record that is not one this driver writes, or whose waiting job's due
    is no finite number, holds no waiting job as far as the index is
    concerned: never an error in another agent's ``job_next``.  (The index
    compares the entry with the key it listed, and derives the record's key
    from that key, so the record is this entry's agent's.)
    """
    if not isinstance(record, dict):
        return None
    places = record.get("places")
    waiting = places.get(WAITING) if isinstance(places, dict) else None
    if not isinstance(waiting, dict) or not isinstance(waiting.get("entry"), str):
        return None
    try:
        _job(waiting.get("job"))
    except stored.Malformed:
        return None
    return waiting


def firing_of(record: dict[str, Any] | None) -> bool:
    """Whether a job record (read for the claim index, any agent's) holds a job in firing."""
    places = record.get("places") if isinstance(record, dict) else None
    return isinstance(places, dict) and isinstance(places.get(FIRING), dict)


@dataclass(frozen=True)
class Claimed:
    """What a runner's ``job_claim`` did: the lease's answer, and the job it is to fire (if any).

    ``took`` is ``take``'s answer (``took``, ``lapsed``, ``held``) and
    ``holder`` who holds the lease when ``held``.  ``job`` is the job moved
    from waiting to firing, or with ``recovered`` the job a holder that died
    left in firing; None when there is nothing to fire (then the lease, if
    taken, has been let go).  ``fence`` is the lease's fence (leases.py) when
    there is a job to fire: the fire's token, and what its finish names.
    """

    took: str
    holder: str | None
    job: dict[str, Any] | None
    recovered: bool = False
    fence: int | None = None

    def wire(self) -> dict[str, Any]:
        return {"reply": "claimed", "job": self.job, "took": self.took, "holder": self.holder,
                "recovered": self.recovered, "fence": self.fence}


@dataclass(frozen=True)
class Finished:
    """What a runner's ``job_finish`` did: ``finished``, the job left firing by this op; ``ours``, the
    claim's lease was the runner's (with its fence) when the record was written or judged; ``holder``,
    who holds the lease when it was not (None: nobody)."""

    finished: bool
    ours: bool
    holder: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"reply": "finished", "finished": self.finished, "ours": self.ours, "holder": self.holder}


@dataclass
class _IndexSpace(Space):
    """The toolkit the shared due index reads job records through: one that is no JSON reads as none.

    The index reads the record behind an entry for EVERY agent's ``job_next``
    and ``job_due``; a record that cannot be parsed must cost its own agent
    its entry (an entry no record names: the index deletes it once stale),
    never another agent an error reply.  ``waiting_of`` judges what parses.
    """

    def get_json(self, key: str, remember: bool = False) -> tuple[Object | None, Any]:
        try:
            return super().get_json(key, remember)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError; nesting past the parser
            return None, None


class Jobs:
    """job_put, job_get, job_remove, job_list, job_count, job_shift, job_next, day and mark."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.index = DueIndex(_IndexSpace(**{f.name: getattr(space, f.name) for f in fields(space)}))
        self.claimed = ClaimIndex(self.index.space)  # jobs in firing, for recovery (claim_index.py)
        # Called after a job enters waiting, with a name for it: this machine's sleeping runners claim
        # it at once (wake.py).  Not when one leaves it: nothing becomes due by that, and claims would
        # wake every runner.
        self.nudge: Callable[[bytes], Any] = lambda name: wake.notify(name=name)
        self.shards = job_mark.ShardPicker()
        self._backend = getattr(space.store, "backend", space.store)  # what OldMarks is shared by (job_mark.py)

    def _bump_mark(self, agent: Agent) -> None:
        """The mark moves: one blind write of one of its shards, fresh bytes every attempt (job_mark.py).

        Not a compare-and-set: every runner claiming this agent's jobs bumps
        it, and a conditional write would make it a hot object whose lost
        rounds cost reads and retries.  Nothing needs the old value; what is
        promised is that the mark changes and never comes back.  Sharded, so
        that no object of it is written more often than a cloud allows.
        The first change of an agent in this process also overwrites the
        older drivers' single mark with a refusal, in parallel (job_mark.py,
        ``OldMarks``): they answer an error instead of a mark that no longer
        moves.
        """
        self.space.at_once(*self._mark_writes(agent))

    def _mark_writes(self, agent: Agent) -> list[Callable[[], Any]]:
        """The writes that move the mark, to be sent at once: the shard's, and the old mark's refusal
        when it is due.  A list, so that a caller with a write of its own sends all of them in one
        ``at_once`` (a ``beside`` task never waits on another)."""
        keys, store = self.space.keys(agent), self.space.store
        old = job_mark.old_marks(self._backend)
        bump: Callable[[], Any] = lambda: job_mark.bump(store, keys, self.shards)  # noqa: E731
        return [lambda: old.refuse(store, keys), bump] if old.due(keys) else [bump]

    def _sweep(self, listed: list[Listed], emptied: list[int | None]) -> None:
        """Delete the records a listing found empty for over TOMBSTONE_MS, each only at the version listed."""
        now = self.space.store.clock.earliest_ms()  # judged old by the least plausible age
        for item, when in zip(listed, emptied, strict=False):
            if when is not None and now - when > TOMBSTONE_MS:
                try:
                    self.space.store.delete(item.key, item.version)
                except (PreconditionFailed, NotFound, StoreError):
                    pass  # changed meanwhile, gone, or the store is failing: the next listing tries again

    def _drop(self, keys: AgentKeys, job_id: str, held: dict[str, Any]) -> None:
        """Delete the due entry a waiting place named, only if it is this agent's this job's.

        Every record is ``checked`` before it gets here; this is the last word
        before a key named in a stored object is deleted, so it checks again:
        ``DueIndex.drop`` deletes whatever key it is given.
        """
        entry = held.get("entry")
        if entry is None:
            return
        if not is_due_entry_of(self.space.root, keys, job_id, entry):
            raise stored.Malformed(RECORD, "its due entry is not a key of this agent's own job in the due index")
        self.index.drop(entry)

    def put(self, agent: Agent, place: str, job: dict[str, Any]) -> None:
        keys = self.space.keys(agent)
        entry = None
        began = _began()  # before the index entry (``_keep_entry``)
        if place == WAITING:  # the entry, then the mark, then the record: see the module docstring
            entry = self.index.add(keys, job["id"], job["due"])
            self._bump_mark(agent)
        elif place == FIRING:  # the claim-index entry before the record (claim_index.py)
            self.claimed.add(keys, job["id"])

        key = keys.job(job["id"])

        def change(record: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
            places = _places(checked(keys, key, record))
            old = places.get(place)
            places[place] = {"job": job, "entry": entry} if entry else {"job": job}
            return {"places": places}, old

        # A put is most often of a new job id: its record is created without a read first (a
        # record already there costs the refused create, then the usual read and write).
        indexed = _Indexed(began, keys, job["id"], place, entry)
        try:
            old = self._update(key, change, absent=True, indexed=indexed)
        except stored.Malformed:
            self.index.drop(entry)  # our own fresh entry (None outside waiting): no record will name it
            raise
        self._keep_entry(indexed)
        if place == WAITING:
            if old is not None:
                self._drop(keys, job["id"], old)
            self.nudge(wake.encode_name(agent.wire(), job["id"], job["due"]))

    def _keep_entry(self, indexed: _Indexed) -> None:
        """Once the record that puts a job in a place has landed (or may have): its index entry written
        again when the op began writing it ``LATE`` or more ago (by either clock), before the op answers.

        A reader may have met the entry meanwhile, older than ``GRACE`` with no record naming it, and
        deleted it as a crash's leftover; a reader meeting it after this reads the record.  Sent past the
        op's window if need be (``op_overtime``): a pause that long has spent it, and an entry written
        again is harmless whenever it lands (at worst a leftover, if the job has left the place since).
        """
        began, keys, job_id, place, entry = indexed
        late = {WAITING: due_index.LATE, FIRING: claim_index.LATE}.get(place)
        if late is None or max(now - then for now, then in zip(_began(), began, strict=True)) < late:
            return
        with op_overtime(AGAIN_SECONDS):
            if place == WAITING and entry is not None:
                self.index.again(entry)
            elif place == FIRING:
                self.claimed.add(keys, job_id)

    def _read_late_record(self, keys: AgentKeys, key: str) -> dict[str, Any] | None:
        """The record of a job whose due entry was listed but whose record was not there: read again
        after each of ``LATE_RECORD_WAITS`` while it is still missing.

        A put writes its due entry, then the mark, then the record: a runner that listed the entry
        at once reads up to two round trips before the record lands.  The lease is already ours
        meanwhile, and reads cost no write; letting the lease go and taking it again for the same
        put was three writes of one object within a second, the third refused on GCS (measured: one
        re-read right away still came 16 ms before the record at 20 ms round trips)."""
        record = None
        for wait in LATE_RECORD_WAITS:
            if wait:
                time.sleep(wait)
            record = self._read(keys, key, remember=True)
            if record is not None:
                break
        return record

    def _read(self, keys: AgentKeys, key: str, remember: bool = False) -> dict[str, Any] | None:
        """The job record at ``key``, checked (``checked``)."""
        with stored.parsing(RECORD):
            _, record = self.space.get_json(key, remember=remember)
        return checked(keys, key, record)

    def _update(self, key: str, change: Callable[[Any], tuple[Any, T]], absent: bool = False,
                indexed: _Indexed | None = None) -> T:
        """``Space.update`` of a job record (from memory first); one that is no JSON is ``Malformed``.

        With ``indexed`` (the op wrote the job's index entry first), a write the op gives up on though it
        may have landed (``outcome unknown``: a reply lost, then the window spent by a pause) keeps the
        entry as a landed one does (``_keep_entry``), and the error stands.
        """
        with stored.parsing(RECORD):
            try:
                return self.space.update(key, change, cached=True, absent=absent)
            except StoreUnavailable as exc:
                if indexed is not None and exc.outcome_unknown:
                    with contextlib.suppress(StoreError):
                        self._keep_entry(indexed)
                raise

    def get(self, agent: Agent, place: str, job_id: str) -> dict[str, Any] | None:
        keys = self.space.keys(agent)
        record = self._read(keys, keys.job(job_id))
        entry = _places(record).get(place)
        return None if entry is None else entry["job"]

    def remove(self, agent: Agent, place: str, job_id: str) -> bool:
        keys = self.space.keys(agent)
        key = keys.job(job_id)
        if place == WAITING:
            self._bump_mark(agent)

        now = self.space.store.clock.now_ms()

        def change(record: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
            places = _places(checked(keys, key, record))
            if place not in places:
                return KEEP, None
            old = places.pop(place)
            # Left empty, the record stays as a tombstone: deleted, a create of it landing
            # late (sent before, held in the network) would bring back a job removed since.
            return ({"places": places} if places else {"places": {}, "emptied": now}), old

        old = self._update(key, change)
        if old is None:
            return False
        if place == WAITING:
            self._drop(keys, job_id, old)
        elif place == FIRING:  # out of firing: its claim-index entry goes after the record
            self.claimed.drop(keys, job_id)
        return True

    def shift(self, agent: Agent, job_id: str, source: str, target: str) -> bool:
        return self.move(agent, job_id, source, target) is not None

    def move(self, agent: Agent, job_id: str, source: str, target: str) -> dict[str, Any] | None:
        """``job_shift``, answering the job it moved (None: none was in ``source``).

        The job is what the winning conditional write moved, so a claimer
        (``job_claim``) fires exactly what it shifted without reading it back.
        """
        keys = self.space.keys(agent)
        key = keys.job(job_id)
        if source == target:
            return self.get(agent, source, job_id)
        entry: str | None = None
        current: dict[str, Any] | None = None
        if target == WAITING:  # the index entry comes first, so its due must be read first
            current = self.get(agent, source, job_id)
            if current is None:
                return None
        elif source == WAITING:
            # Read first: a shift finding nothing in waiting (a claim a moment too late) answers
            # at once, without moving the mark; the update below starts from this read.
            record = self._read(keys, key, remember=True)
            if source not in _places(record):
                return None
        began = _began()  # before the index entry (``_keep_entry``)
        if current is not None:  # into waiting: the due entry, then the mark, then the record
            entry = self.index.add(keys, job_id, current["due"])
        elif target == FIRING:  # the claim-index entry before the record (claim_index.py)
            self.claimed.add(keys, job_id)
        if WAITING in (source, target):
            self._bump_mark(agent)

        def change(record: dict[str, Any] | None) -> tuple[Any, tuple[dict[str, Any], dict[str, Any] | None] | None]:
            places = _places(checked(keys, key, record))
            if source not in places:
                return KEEP, None
            moved = places.pop(source)
            replaced = places.get(target)
            if current is not None and moved["job"]["due"] != current["due"]:
                return KEEP, None  # changed under us: the caller tries again
            places[target] = {"job": moved["job"], "entry": entry} if entry else {"job": moved["job"]}
            return {"places": places}, (moved, replaced)

        indexed = _Indexed(began, keys, job_id, target, entry)
        try:
            outcome = self._update(key, change, indexed=indexed)
        except stored.Malformed:
            self.index.drop(entry)  # our own fresh entry, if any: no record names it
            raise
        if outcome is None:
            self.index.drop(entry)
            if entry is not None and self.get(agent, source, job_id) is not None:
                return self.move(agent, job_id, source, target)
            return None
        moved, replaced = outcome
        self._keep_entry(indexed)
        if source == WAITING:
            self._drop(keys, job_id, moved)
        if source == FIRING:  # out of firing: its claim-index entry goes after the record
            self.claimed.drop(keys, job_id)
        if target == WAITING and replaced is not None:
            self._drop(keys, job_id, replaced)
        job: dict[str, Any] = moved["job"]
        if target == WAITING:
            self.nudge(wake.encode_name(agent.wire(), job_id, job["due"]))
        return job

    def claim(self, agent: Agent, job_id: str,
              take: Callable[[Callable[[str], bool]], tuple[str, str | None, int | None]],
              release: Callable[[], None], not_after: float, recover: bool = False) -> Claimed:
        """The runner's claim: its lease with the record read, then the mark and the claim entry, then the record.

        First, at once: the claim lease is taken (``take``: one request for a
        fresh job id) and the record read.  Only with the lease ours and the
        job read in waiting, due by ``not_after``, does the claim write: a new
        mark and the job's claim-index entry at once, then the record with the
        job moved to firing (three round trips in all).  So a job in
        firing always has its runner's lease (the lease came first), the mark
        has moved before waiting changes (the module's crash order), and a
        claim that loses (the lease held by another runner, the job gone or
        replaced with a later due) writes nothing that it leaves useless: no
        mark, no record.  (The mark was once written beside the take, in the
        first round; at three runners per agent most claims lost, and each
        loser's mark write was a write of a hot object for nothing.)

        A job due after ``not_after`` (replaced with a later due since it was
        listed) is not moved.  With nothing to fire, the lease just taken is
        let go after the reply (``release``); so is the claimed job's index
        entry, which no answer depends on (an entry no record names is
        already a crash's leftover the index tolerates).

        A job its last holder left in firing (the lease ``lapsed``, or with
        ``recover`` also a lease found free: recovery of a job in firing, never
        one from waiting) is fired again only after its record is written anew
        under the new lease (``_restamp``): a finish of the old holder that
        read its lease before the takeover writes on the version it knew, and
        that write now fails (``finish``), so it can never take out of firing a
        job its new holder fires.
        """
        keys = self.space.keys(agent)
        key = keys.job(job_id)
        read: list[dict[str, Any] | None] = []  # the record, once its read is back

        def read_record() -> dict[str, Any] | None:
            record = self._read(keys, key, remember=True)
            read.append(record)
            return record

        def wanted(answer: str) -> bool:
            """Asked by a take whose guess met a head: is the lease still worth a write?  Not when the
            record read beside it shows the job gone from waiting (and, for a lapsed lease, from
            firing): taken, it would only be let go.  Unknown yet, or no record yet: yes."""
            if not read or read[0] is None:
                return True
            places = _places(read[0])
            if recover:
                return FIRING in places
            return WAITING in places or (answer == "lapsed" and FIRING in places)

        lease, record = self.space.at_once(lambda: take(wanted), read_record)
        took, holder, fence = lease
        if took == "held":
            return Claimed(took, holder, None)
        if took == "skipped":  # no lease taken: nothing to fire, nothing to let go
            return Claimed(took, None, None)
        if record is None and not recover:
            record = self._read_late_record(keys, key)
        places = _places(record)
        if (took == "lapsed" or recover) and FIRING in places:  # its last runner died firing it: that one comes first
            job = self._restamp(keys, key)
            if job is None:  # it left firing since the read: nothing to fire
                self.space.defer(release)
                return Claimed(took, None, None)
            return Claimed(took, None, job, recovered=True, fence=fence)

        def due_now(held: dict[str, Any] | None) -> bool:
            return held is not None and float(held["job"]["due"]) <= not_after

        if recover or not due_now(places.get(WAITING)):  # gone, or not due: nothing written but the lease, let go
            self.space.defer(release)
            return Claimed(took, None, None)
        # The mark and the claim-index entry at once, both before the record (the crash order: the
        # mark moves before waiting changes; claim_index.py's entry comes before the job enters firing).
        # Either alone, landed, is a leftover the readers tolerate: a mark moved for nothing, an entry
        # no record names.  (No order between them: recovery reads the index, pollers the mark.)
        began = _began()  # before the claim-index entry (``_keep_entry``)
        self.space.at_once(*self._mark_writes(agent), lambda: self.claimed.add(keys, job_id))

        def change(record: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
            places = _places(checked(keys, key, record))
            moved = places.get(WAITING)
            if moved is None or not due_now(moved):
                return KEEP, None
            del places[WAITING]
            places[FIRING] = {"job": moved["job"]}
            return {"places": places}, moved

        indexed = _Indexed(began, keys, job_id, FIRING)
        moved = self._update(key, change, indexed=indexed)
        if moved is None:
            self.space.defer(release)
            if FIRING not in places:  # our own entry, for nothing
                self.space.defer(lambda: self.claimed.drop(keys, job_id))
            return Claimed(took, None, None)
        self._keep_entry(indexed)
        self.space.defer(lambda: self._drop(keys, job_id, moved))
        return Claimed(took, None, moved["job"], fence=fence)

    def _restamp(self, keys: AgentKeys, key: str) -> dict[str, Any] | None:
        """Write the record anew, unchanged, while its job is in firing: the job to fire again (None when
        it has left firing).  Every write gets a new version (the seam's nonce), so a write decided on an
        older version (a superseded holder's finish) fails and is judged again."""
        def change(record: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
            places = _places(checked(keys, key, record))
            held = places.get(FIRING)
            if held is None:
                return KEEP, None
            return {**(record or {}), "places": places}, held["job"]

        return self._update(key, change)

    def finish(self, agent: Agent, job_id: str, ours: Callable[[], str | None], release: Callable[[], None],
               keep_ending: bool) -> Finished:
        """The runner's finish of a fire that ended: out of firing (into ending when kept, else removed),
        only while the claim is the runner's in the store, then its lease ended (``release``).

        ``ours()`` reads the lease and answers None while it is the runner's
        with the claim's fence (lapsed but not taken over counts), else who holds
        it ("" for nobody).  It is asked inside the record's compare-and-set,
        after the record version the write names was read (or remembered from
        this process's own write): a recovery takes the lease and then writes
        the record anew before it fires (``_restamp``), so either that write
        came first, and this one fails and reads the lease again (not ours:
        nothing changes), or this one came first, and the recovery finds the
        job gone from firing and fires nothing.
        """
        keys = self.space.keys(agent)
        key = keys.job(job_id)
        now = self.space.store.clock.now_ms()
        held_by: list[str | None] = [None]

        def change(record: dict[str, Any] | None) -> tuple[Any, bool]:
            places = _places(checked(keys, key, record))
            held_by[0] = ours()
            if held_by[0] is not None or FIRING not in places:
                return KEEP, False
            moved = places.pop(FIRING)
            if keep_ending:
                places["ending"] = {"job": moved["job"]}
            return ({"places": places} if places else {"places": {}, "emptied": now}), True

        finished = self._update(key, change)
        if held_by[0] is not None:
            return Finished(False, False, held_by[0] or None)
        if finished:
            self.claimed.drop(keys, job_id)  # out of firing: its claim-index entry goes after the record
        release()
        return Finished(finished, True)

    def _kept(self, agent: Agent, kind: str, keep: Callable[[dict[str, Any]], T], absent: T) -> list[T]:
        """What ``keep`` takes of each of the agent's job records (read, or remembered by version);
        records left empty for over TOMBSTONE_MS are swept on the way."""
        keys = self.space.keys(agent)

        def parse(obj: Object) -> tuple[T, int | None, str | None]:
            with stored.parsing(RECORD):
                record = checked(keys, None, json.loads(obj.data))
            ids = {held["job"]["id"] for held in _places(record).values()}
            return keep(record), _emptied(record), next(iter(ids), None)  # type: ignore[arg-type]

        # Only keys a job record can have (one part below j/): anything else there is no job of this agent's.
        listed = [item for item in self.space.store.list(keys.jobs()) if "/" not in item.key[len(keys.jobs()):]]
        values = [v or (absent, None, None) for v in self.space.listed_values(listed, parse, kind=kind)]
        for item, (_, _, job_id) in zip(listed, values, strict=True):
            stored.expect(job_id is None or keys.job(job_id) == item.key, RECORD, "it holds a job of another id")
        self._sweep(listed, [emptied for _, emptied, _ in values])
        return [kept for kept, _, _ in values]

    def listing(self, agent: Agent, place: str) -> list[dict[str, Any]]:
        """The jobs in ``place``: only that place's job of each record is kept."""
        def job_in_place(record: dict[str, Any]) -> dict[str, Any] | None:
            entry = _places(record).get(place)
            return None if entry is None else entry["job"]

        return [job for job in self._kept(agent, place + ":", job_in_place, None) if job is not None]

    def count(self, agent: Agent, place: str) -> int:
        """How many jobs ``place`` holds: only the places of each record are kept, never the jobs."""
        empty: frozenset[str] = frozenset()
        held = self._kept(agent, "places:", lambda record: frozenset(_places(record)), empty)
        return sum(1 for places in held if place in places)

    def next(self) -> Any | None:
        return self.index.next(waiting_of)

    def due(self, limit: int, after: str | None = None) -> tuple[list[DueEntry], bool]:
        """Every agent's waiting jobs as the due index names them, soonest first (``job_due``)."""
        return self.index.entries(waiting_of, limit, after)

    def claims(self, limit: int, after: str | None = None) -> tuple[list[ClaimEntry], bool]:
        """Every agent's jobs in firing as the claim index names them (``job_claims``)."""
        return self.claimed.entries(firing_of, limit, after)

    def mark(self, agent: Agent) -> int:
        """One listing of the mark's shards, hashed (job_mark.py): no object is read, none can be malformed."""
        return job_mark.read(self.space.store, self.space.keys(agent), job_mark.old_marks(self._backend))

    def day(self, agent: Agent) -> tuple[int, int]:
        value = self._small(self.space.keys(agent).day(), "job day")
        if value is None:
            return (0, 0)
        stored.expect(set(value) == {"day", "sent"}, "job day", "it is not {day, sent}")
        unbounded = 10**4300  # job_set_day takes any integer from 0 (docs/protocol.md): only the type is checked
        return (stored.count(value["day"], "job day", "the day", maximum=unbounded),
                stored.count(value["sent"], "job day", "sent", maximum=unbounded))

    def _small(self, key: str, kind: str) -> dict[str, Any] | None:
        """The day record: a JSON object, remembered for the next write."""
        with stored.parsing(kind):
            _, value = self.space.get_json(key, remember=True)
        return None if value is None else stored.obj(value, kind)

    def set_day(self, agent: Agent, day: int, sent: int) -> None:
        """Conditional on the record read, so a write landing late cannot undo a newer one."""
        with stored.parsing("job day"):
            self.space.update(self.space.keys(agent).day(), lambda _: ({"day": day, "sent": sent}, None), cached=True)

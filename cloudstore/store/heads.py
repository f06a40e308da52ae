"""A conversation's head: its epoch and its lease, in ONE object, so ``remove`` is one write.

``remove`` forgets a conversation's events and its lease.  Kept in two
objects, no single write could do both, and a crash between the two writes
left a removed conversation whose lease lived on (or a live one whose lease
was gone).  In one object, the write that bumps the epoch (which hides every
event of the old one) also ends the lease: the op commits in one
compare-and-set, and everything after it is cleanup a crash cannot make
visible.

The head lives at the lease's key (``l/<thread>``), so ``leases`` stays one
listing.  Its fields::

    {"thread": t, "epoch": e}                                   no lease
    {"thread": t, "epoch": e, "holder": h, "started": ms, "renewed": ms}
    {"thread": t, "epoch": e, "started": ms}                   an ended lease: its start kept as the fence
    {"thread": t, "epoch": e, "removed": [{"epoch", "at", "fence"}], ...}
                                  epochs a remove left to fence or purge (removal.py)
    {"thread": t, "epoch": e, "packed": {"epoch": e, "last": n}, ...}
                                  events 1..n of epoch e exist and are packed (packing.py):
                                  in 0.3.0's layout, a hint where to list the last number
                                  from, so ``last`` costs two requests however long the
                                  conversation
    {"thread": t, "epoch": e, "packed": {"epoch": e, "last": n, "newest": true}, ...}
                                  the same of an epoch in the newest-first layout (keys.py):
                                  a hint which blocks a read may fetch before it knows the
                                  last number (conversations.py)

An ended lease keeps no holder; a head with no epoch is at epoch 0.

A lease's ``started`` is also its *fence* (since 0.7.0, store format 5): each
take that gives the lease to a holder (``took`` from no lease, ``lapsed``)
sets it to ``max(now, started before + 1)`` in store milliseconds, and an
ended lease keeps it, so a thread's successive holders get numbers that only
grow, and a take after the head was deleted (gc) or rewritten by an older
driver that dropped it still gets a larger one, because store time has moved
on (a hybrid logical clock's rule).  The scheduler hands it to the fired
command (``LNK_JOB_FENCE``) and finishes a job only under it (``job_finish``).
Older drivers read such heads as they always did: ``started`` was always a
field of the lease, and a head without a holder was never asked for it.  (0.1.0
kept the epoch in a separate object and ended leases as ``{"ended": true}``:
0.2.0 does not read stores written by 0.1.0, see CHANGELOG.md.)

A head is read back from a bucket other agents share, so it is believed only
in the shape above (``checked``, stored.py): its thread its key's own, its
numbers integers in range, its removal records of epochs before its own.
Every key a head leads to (the events and blocks of an epoch, a removed
epoch's fence and purge) is built from the head's own agent and thread by
keys.py, never taken from the head; what the head gives is numbers, and
those are bounded here.  Anything else makes the op answer an error naming
the conversation head.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

from ..generations import Object
from . import stored
from .cache import Bounded
from .keys import EPOCH_DIGITS, SEQ_DIGITS, AgentKeys
from .space import SEEN_OBJECT_MAX, Space, written_charge

HEAD = "conversation head"
#: The largest epoch a head may hold: its next one must still have a key (``keys.inverted``).
EPOCH_MAX = 10**EPOCH_DIGITS - 2
#: The largest event number a head (or a key) may name.
SEQ_MAX = 10**SEQ_DIGITS - 2
#: Removed epochs a head may hold records of: each is one fence or one purge, finished on the next read.
REMOVED_MAX = 1024
_FIELDS = frozenset({"thread", "epoch", "holder", "started", "renewed", "removed", "packed", "ended", "at"})

T = TypeVar("T")

#: Seconds between two writes of one head that only move its packing hint and this process's last write
#: of it: GCS takes about one write a second per object (burst 2), and the head is also the lease a
#: holder renews, so a hint never comes sooner than this after any write of ours (``hint_due``).
HINT_GAP_SECONDS = 1.0
#: The clock of ``HINT_GAP_SECONDS`` (a test may step it).
monotonic: Callable[[], float] = time.monotonic

#: The fields of a lease within a head; the rest (thread, epoch, removed, and ``started`` as the fence) outlive it.
LEASE_FIELDS = ("holder", "started", "renewed")
#: What an ended lease leaves of its lease's fields: its start, the fence the next take must pass.
FENCE_FIELD = "started"


def has_lease(head: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    """Whether a head holds a live lease."""
    return head is not None and "holder" in head and not head.get("ended", False)


def without_lease(head: dict[str, Any]) -> dict[str, Any]:
    """The head with its lease ended (and 0.1.0's tombstone fields gone); the lease's start stays as
    the fence (``fence_of``)."""
    return {k: v for k, v in head.items() if k == FENCE_FIELD or k not in LEASE_FIELDS and k not in ("ended", "at")}


def fence_of(head: dict[str, Any]) -> int:
    """The fence of the head's lease, or of the last lease it held (0: none known).  Only ``checked``
    heads: an ended lease of 0.1.0 (``ended``) kept its holder, whose start is the fence all the same."""
    started = head.get(FENCE_FIELD, 0)
    return int(started) if stored.validate_int(started) and started >= 0 else 0


def next_fence(head: dict[str, Any], now_ms: int) -> int:
    """The fence a take that gives the lease to a holder writes: later than any before it, and than now."""
    return max(now_ms, fence_of(head) + 1)


def epoch_of(head: dict[str, Any]) -> int:
    """The head's epoch.  The drivers ask it of heads ``checked`` already; a tool reading raw heads
    (the admin's gc) gets 0 for one that holds no epoch in range, under which it judges nothing dead."""
    epoch = head.get("epoch", 0)
    return int(epoch) if stored.validate_int(epoch) and 0 <= epoch <= EPOCH_MAX else 0


def packed_last(head: dict[str, Any]) -> int:
    """Up to which number the head says the current epoch's events exist (0: it does not say).

    The hint names its epoch, so one left from an epoch since removed is never believed.
    """
    packed = head.get("packed")
    if isinstance(packed, dict) and packed.get("epoch") == epoch_of(head):
        last = packed.get("last", 0)
        return int(last) if stored.validate_int(last) and 0 <= last <= SEQ_MAX else 0
    return 0


def packed_newest(head: dict[str, Any]) -> int:
    """Up to which number the head says the current epoch's events are packed in the newest-first layout.

    0 when it does not say so; a hint of 0.3.0's layout names blocks under
    other keys, so it is never taken for one of this layout.
    """
    packed = head.get("packed")
    return packed_last(head) if isinstance(packed, dict) and packed.get("newest") is True else 0


def with_packed(head: dict[str, Any], epoch: int, last: int, newest: bool = False) -> dict[str, Any] | None:
    """The head with its hint moved on to ``last``; None when it is of another epoch or already as far.

    ``newest``: the epoch keeps the newest-first layout, so its blocks are
    where ``packed_newest`` readers look for them.
    """
    if epoch_of(head) != epoch or packed_last(head) >= last:
        return None
    return {**head, "packed": {"epoch": epoch, "last": last, **({"newest": True} if newest else {})}}


def checked(thread: str, head: Any) -> dict[str, Any] | None:
    """The head stored for ``thread``, as this driver writes them; ``stored.Malformed`` otherwise."""
    if head is None:
        return None
    stored.obj(head, HEAD)
    stored.expect(set(head) <= _FIELDS, HEAD, "it holds fields no driver writes")
    stored.expect(head.get("thread") == thread, HEAD, "it is of another conversation")
    epoch = stored.count(head.get("epoch", 0), HEAD, "its epoch", maximum=EPOCH_MAX)
    if "holder" in head:
        stored.text(head["holder"], HEAD, "its holder")
        for name in ("started", "renewed"):
            stored.count(head.get(name), HEAD, f"its lease's {name} time")
    elif "started" in head:
        stored.count(head["started"], HEAD, "its ended lease's fence")
    if "ended" in head:
        stored.expect(isinstance(head["ended"], bool), HEAD, "its ended mark is not a boolean")
    if "at" in head:
        stored.finite(head["at"], HEAD, "its ended time")
    if "packed" in head:
        packed = stored.obj(head["packed"], HEAD, "its packing hint")
        stored.expect(set(packed) <= {"epoch", "last", "newest"}, HEAD,
                      "its packing hint holds fields no driver writes")
        stored.count(packed.get("epoch"), HEAD, "its packing hint's epoch", maximum=EPOCH_MAX)
        stored.count(packed.get("last", 0), HEAD, "its packing hint's last", maximum=SEQ_MAX)
        stored.expect(packed.get("newest", True) is True, HEAD, "its packing hint's layout is not true")
    removed = head.get("removed", [])
    stored.expect(isinstance(removed, list) and len(removed) <= REMOVED_MAX, HEAD,
                  f"its removal records are not a list of at most {REMOVED_MAX}")
    seen: set[int] = set()
    for record in removed:
        stored.obj(record, HEAD, "a removal record")
        stored.expect(set(record) <= {"epoch", "at", "fence", "known"}, HEAD,
                      "a removal record holds fields no driver writes")
        old = stored.count(record.get("epoch"), HEAD, "a removal record's epoch", maximum=max(epoch - 1, 0))
        stored.expect(old < epoch and old not in seen, HEAD, "a removal record is not of an earlier epoch, once")
        seen.add(old)
        stored.count(record.get("at"), HEAD, "a removal record's time")
        if record.get("fence") is not None:
            stored.count(record["fence"], HEAD, "a removal record's fence", minimum=1, maximum=SEQ_MAX)
        stored.count(record.get("known", 0), HEAD, "a removal record's known last", maximum=SEQ_MAX)
    return head  # type: ignore[no-any-return]


class Heads:
    """Reading and changing heads: a conversation without one is at epoch 0, with no lease."""

    def __init__(self, space: Space) -> None:
        self.space = space

    @staticmethod
    def _complete(thread: str, head: dict[str, Any] | None) -> dict[str, Any]:
        return {"thread": thread, "epoch": 0} if head is None else head

    def read(self, keys: AgentKeys, thread: str) -> dict[str, Any]:
        with stored.parsing(HEAD):
            _, head = self.space.get_json(keys.lease(thread))
        return self._complete(thread, checked(thread, head))

    def update(self, keys: AgentKeys, thread: str, change: Callable[[dict[str, Any]], tuple[Any, T]],
               cached: bool = False, absent: bool = False) -> T:
        """``Space.update`` on the head; ``change`` always gets a whole head (epoch included)."""
        key = keys.lease(thread)
        written = _written_at(self.space)
        last = written.get(key)
        if cached and last is not None:  # this process's newest write of it, whichever service made it
            self.space._remember_written(key, last[1], last[2])

        def remember(obj: Object, value: Any) -> None:
            written[key] = (monotonic(), obj, value)

        with stored.parsing(HEAD):
            return self.space.update(key, lambda head: change(self._complete(thread, checked(thread, head))),
                                     cached=cached, absent=absent, on_written=remember)

    def hint_due(self, keys: AgentKeys, thread: str) -> bool:
        """Whether a write that only moves the head's packing hint may go now: none of this process's
        writes of the head (a renew, a take, a hint) in the last ``HINT_GAP_SECONDS``.

        Why: a lease renewed every lapse/3 at the smallest lapse the docs allow
        on GCS (``leases.GCS_LAPSE_MIN_MS``) writes its head every 2 s, half of
        the object's rate; hints spaced a second from every other write keep
        the head within the rest.  A hint not written costs speed only (a read
        fetches fewer blocks ahead, or lists a little further) and moves with
        the next one.
        """
        last = _written_at(self.space).when(keys.lease(thread))
        return last is None or monotonic() - last >= HINT_GAP_SECONDS


#: Per backend (one SDK client, one process): when this process last wrote each head, by key, and what.
#: The services of one process (the Python API's pool) each keep their own last write of a head; a renew
#: starting from its own while another service moved the hint would spend a refused write (a token, on
#: GCS) before reading: so every update of a head starts from the newest write any of them made.
_Written = tuple[float, Object, Any]
#: Bytes of heads remembered, per backend: part of ``cache.BOOKKEEPING_BUDGET``.  A head is charged its key
#: and, where it is small enough to keep (``space.SEEN_OBJECT_MAX``), its object and parse, as ``Space``
#: charges an object written (``space.written_charge``); of a larger one (a holder of any length, up to
#: ``REMOVED_MAX`` removal records) only when it was written is kept.  It was 4,096 whole heads, by number:
#: with long holders, hundreds of MiB (issue 44).
WRITTEN_BUDGET = 4 * 1024 * 1024


class _Recent:
    """Writes by key, the least recently used forgotten first past ``WRITTEN_BUDGET`` bytes.

    Forgetting costs speed only: a head's hint is then due (``hint_due``), and an update starts
    with a read instead of from the object written.
    """

    def __init__(self) -> None:
        self._kept: Bounded[str, _Written | float] = Bounded(WRITTEN_BUDGET)

    def get(self, key: str) -> _Written | None:
        """The last write of ``key`` (when, the object, its value), if its object is kept."""
        kept = self._kept.get(key)
        return kept if isinstance(kept, tuple) else None

    def when(self, key: str) -> float | None:
        """When (``monotonic``) this process last wrote ``key``, if it remembers."""
        kept = self._kept.get(key)
        return kept[0] if isinstance(kept, tuple) else kept

    def __setitem__(self, key: str, value: _Written) -> None:
        at, obj, _ = value
        if len(obj.data) <= SEEN_OBJECT_MAX:
            self._kept.put(key, value, written_charge(key, obj))
        else:
            self._kept.put(key, at, len(key))


_WRITTEN: weakref.WeakKeyDictionary[Any, _Recent] = weakref.WeakKeyDictionary()
_WRITTEN_LOCK = threading.Lock()


def _written_at(space: Space) -> _Recent:
    backend = getattr(space.store, "backend", space.store)
    with _WRITTEN_LOCK:
        try:
            found = _WRITTEN.get(backend)
        except TypeError:  # no weak reference to it: remembered per call, so every hint is due
            return _Recent()
        if found is None:
            found = _WRITTEN[backend] = _Recent()
        return found

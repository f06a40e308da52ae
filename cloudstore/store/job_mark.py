"""The job mark, sharded so that no object of it is a write hot spot.

``job_mark`` promises a number that differs once a job is put in, shifted to
or from, or removed from waiting, and never comes back.  It was one object,
``a/<owner>/<id>/mark``, written blind on every such change: on GCS, which
takes about one write a second to one object name (a short burst of two),
an agent could change about half a job a second before its puts and claims
answered errors.

So the mark is ``SHARDS`` objects ``a/<owner>/<id>/m/<k>``.  A change writes
ONE of them with fresh bytes (``put_fresh``): the one this process wrote
least recently (ties at random, so writers of other processes spread too).
A write refused for its rate was certainly not applied and is not waited
out: the next shard is tried at once, only the last of ``TRIES`` waits.
``job_mark`` is ONE listing of the agent's ``m`` prefix, hashed over each
listed key and its version (GCS generation, S3 ETag, the local frame's
nonce: every write of a shard, fresh bytes each time, gives it a version it
never had), into 1..2**53-1; 0 while nothing is listed, as before any mark.
Any write of any shard changes the listing, so the number changes; no
listing is ever seen again (versions never repeat), so it never comes back.
The listing also returns the single ``mark`` object that older drivers write,
so a change they make moves the mark here too.

Versions are the backend's, so a migrated agent answers another mark than
its source: one spurious change, which the contract allows.

Drivers before the shards (0.3.0, 0.4.0, 0.4.1) read only the single
``mark``, which a change made here never moves: beside this driver they
would answer one number while waiting changes under them (issue 41,
finding 4).  Writing ``mark`` on every change would make it the hot spot
the shards removed, so instead the first change of waiting an agent gets
from this process also reads ``mark`` and, where it is not a refusal yet,
overwrites it with one (``refusal_body``: ``{"mark": "<why, what to do>
<nonce>"}``), in parallel with the shard: their ``job_mark`` then answers an
error naming the cause (0.3.0 and 0.4.0 fail ``int()`` on it, 0.4.1 refuses
a mark that is no count) instead of a number that no longer moves.  It is
one read per agent and process (``OldMarks``), a write only where the old
mark is missing or renumbered: never a hot spot.  An old
driver's own change of waiting writes a number there again; a process here
that lists the mark (``read``) and finds ``mark`` that small again writes
the refusal with its next change of that agent.  What stays open: an old
reader beside an old writer and a process here that changes this agent's
waiting but never reads its mark sees the old writer's number, which that
process's later changes do not move (docs/design.md, "Older releases").
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import weakref
from typing import Any

from ..generations import Listed, RetryingStore, StoreError, Throttled, entropy, new_nonce
from .cache import Bounded
from .keys import AgentKeys
from .model import compact

log = logging.getLogger("cloudstore")

#: Shards per agent.  At 10 jobs a second an agent's mark is written 20 times a second (a put and a
#: claim each) by a dozen processes, each picking alone: at 32 shards two processes met on one shard
#: within its second often enough for 25-48 refused writes in 20 s at the proxy's per-object limit
#: (a model of it: 35 in 400 writes); at 128 the model gives about 2, and the listing ``job_mark``
#: reads is still one page (GCS and S3 give 1,000 keys a page) of names and versions only.
SHARDS = 128
#: Shards tried at once after a throttle before the last one waits the throttle out (within the op's deadline).
TRIES = 4
MARK_MAX = 2**53 - 1


#: Bytes of agents this process remembers its shard order of (LRU): part of ``cache.BOOKKEEPING_BUDGET``.
#: An agent is charged its base and one byte a shard (``ShardPicker.charge``): about 3,600 agents of
#: 60-character bases.  A forgotten agent's next writes start from a fresh random order: at worst one of
#: them meets a shard this process wrote within the second (a throttled write gives way at once to the
#: next, ``bump``), which only an agent whose mark this process writes often could, and those stay.
PICKER_BUDGET = 2 * 1024 * 1024


class ShardPicker:
    """Which shard this process writes next: the least recently written by it, ties at random.

    Per agent, its shards in the order this process last wrote them (one byte each, least recent first),
    the never written first in a random order: the same choice as the least recent time with ties at
    random, in ``shards`` bytes instead of a time per shard (15.5 kB a busy agent as a dict of times,
    with no bound on agents: issue 44).  Agents beyond ``budget`` bytes are forgotten, least recently
    used first.
    """

    def __init__(self, shards: int = SHARDS, rng: random.Random | None = None, budget: int = PICKER_BUDGET) -> None:
        assert 0 < shards <= 256, "a shard is one byte of the order"
        self.shards = shards
        self.rng = rng or random.Random(int.from_bytes(entropy(8), "big"))
        self._order: Bounded[str, bytearray] = Bounded(budget)  # agent base -> shards, least recent first
        self._lock = threading.Lock()

    def charge(self, base: str) -> int:
        """What an agent's order is charged: its base, a byte a shard and the bytearray's own header
        (``ENTRY_OVERHEAD`` on top: an agent of a 30-character base is charged 542 bytes, measured 414)."""
        return len(base) + self.shards + 64

    def _of(self, base: str) -> bytearray:
        order = self._order.get(base)
        if order is None:
            fresh = list(range(self.shards))
            self.rng.shuffle(fresh)  # never written by this process: ties, at random
            order = bytearray(fresh)
            self._order.put(base, order, self.charge(base))
        return order

    @staticmethod
    def _written(order: bytearray, shard: int) -> None:
        order.remove(shard)
        order.append(shard)

    def order(self, base: str, count: int) -> list[int]:
        """``count`` distinct shards to try in turn; the first is marked as written now."""
        with self._lock:
            order = self._of(base)
            chosen = list(order[:count])
            self._written(order, chosen[0])
            return chosen

    def used(self, base: str, shard: int) -> None:
        with self._lock:
            self._written(self._of(base), shard)


def fresh_body() -> bytes:
    """A new random body: even an attempt landing late shows bytes (and a version) nobody saw."""
    return compact({"mark": int.from_bytes(entropy(7), "big") % MARK_MAX + 1}).encode("ascii")


def bump(store: RetryingStore, keys: AgentKeys, picker: ShardPicker) -> None:
    """One write of one shard; a throttled shard gives way at once to the next, the last waits."""
    order = picker.order(keys.base, TRIES)
    for shard in order[:-1]:
        picker.used(keys.base, shard)
        try:
            store.put_fresh(keys.mark_shard(shard), fresh_body, wait_throttles=False)
            return
        except Throttled:
            continue  # refused, so certainly not written: another shard serves as well
    picker.used(keys.base, order[-1])
    store.put_fresh(keys.mark_shard(order[-1]), fresh_body)


#: What the single ``mark`` of drivers before the shards is overwritten with: their ``job_mark`` fails on it
#: (``int()`` of it in 0.3.0 and 0.4.0, not a count in 0.4.1), and the error they answer carries this text.
OLD_MARK_REFUSAL = ("this store's job_mark is sharded (a/<owner>/<id>/m/<k>, cloudstore 0.5.0 and later) and "
                    "this single mark no longer moves: upgrade this driver")
#: The least stored size of a refusal (its text alone); an older driver's ``{"mark": N}``, framed, is under
#: 70 bytes, so a listed ``mark`` smaller than this holds a number an older driver wrote.
REFUSAL_SIZE = len(OLD_MARK_REFUSAL)
#: Bytes of agents' bases a process remembers having refused the old mark of (LRU: forgetting costs one write).
OLD_MARKS_BUDGET = 1024 * 1024


def refusal_body() -> bytes:
    """The refusal, with a nonce: every write of it is bytes nobody saw (a new S3 ETag, a new version)."""
    return compact({"mark": f"{OLD_MARK_REFUSAL} ({new_nonce()})"}).encode("ascii")


class OldMarks:
    """The agents whose single old ``mark`` this process has overwritten with the refusal."""

    def __init__(self) -> None:
        self._done: Bounded[str, bool] = Bounded(OLD_MARKS_BUDGET)

    def due(self, keys: AgentKeys) -> bool:
        return self._done.get(keys.mark()) is None

    def refuse(self, store: RetryingStore, keys: AgentKeys) -> None:
        """Make the old mark the refusal, where it is not one already; a failure is logged and tried again
        with the next change.

        Read first (a read has no per-object write limit), written only where
        the old mark is missing or holds a number (an older driver's): every
        process meets the agent once, and writing on each meeting made the
        old mark the hot spot the shards removed (16-23 writes refused for
        GCS's rate in 20 s of ten jobs a second, tests/scheduler/
        test_throttle_scheduler.py).  Never waits out a throttle: this write
        is a courtesy to older drivers, and the op's own writes (the shard,
        the record) come first.
        """
        try:
            there = store.get(keys.mark())
            if there is None or OLD_MARK_REFUSAL.encode("ascii") not in there.data:
                store.put_fresh(keys.mark(), refusal_body, wait_throttles=False)
        except StoreError as exc:
            log.warning("the old job mark was left as it was (tried again with the next change): %s", exc)
            return
        self._done.put(keys.mark(), True, len(keys.mark()))

    def seen(self, keys: AgentKeys, listed: list[Listed]) -> None:
        """A listing of the mark found ``mark`` holding a number again (an older driver's change): refuse anew."""
        for item in listed:
            if item.key == keys.mark() and item.size is not None and item.size < REFUSAL_SIZE:
                self._done.pop(keys.mark())


_OLD: weakref.WeakKeyDictionary[Any, OldMarks] = weakref.WeakKeyDictionary()
_OLD_LOCK = threading.Lock()


def old_marks(backend: Any) -> OldMarks:
    """The ``OldMarks`` of every service of this process on ``backend`` (one write per agent and process)."""
    with _OLD_LOCK:
        try:
            found = _OLD.get(backend)
        except TypeError:  # a backend that takes no weak reference: one of its own
            return OldMarks()
        if found is None:
            found = _OLD[backend] = OldMarks()
        return found


def is_mark_key(keys: AgentKeys, key: str) -> bool:
    """A key ``job_mark`` counts: a shard, or the older single mark."""
    prefix = keys.mark_shards() + "/"
    return key == keys.mark() or (key.startswith(prefix) and "/" not in key[len(prefix):])


def value(keys: AgentKeys, listed: list[Listed]) -> int:
    """The mark a listing of ``keys.mark_shards()`` says: a hash of what is there, 0 when nothing is.

    Keys are hashed below the agent's base, so the number does not depend on the store's prefix
    (a seed's history replays the same under any prefix)."""
    named = sorted((item.key[len(keys.base):], item.version or f"{item.modified!r}:{item.size}")
                   for item in listed if is_mark_key(keys, item.key))
    if not named:
        return 0
    digest = hashlib.blake2b(digest_size=8)
    for key, version in named:
        digest.update(key.encode("utf-8", "surrogatepass") + b"\0" + version.encode("utf-8", "surrogatepass") + b"\n")
    return int.from_bytes(digest.digest(), "big") % MARK_MAX + 1


def read(store: RetryingStore, keys: AgentKeys, old: OldMarks | None = None) -> int:
    """``job_mark``: one listing (which also tells ``old`` whether an older driver renumbered ``mark``)."""
    listed = store.list(keys.mark_shards())
    if old is not None:
        old.seen(keys, listed)
    return value(keys, listed)

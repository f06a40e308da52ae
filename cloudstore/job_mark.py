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
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable

from .generations import Listed, RetryingStore, Throttled, entropy
from .keys import AgentKeys
from .validate import compact

#: Shards per agent.  At 10 jobs a second an agent's mark is written 20 times a second (a put and a
#: claim each) by a dozen processes, each picking alone: at 32 shards two processes met on one shard
#: within its second often enough for 25-48 refused writes in 20 s at the proxy's per-object limit
#: (a model of it: 35 in 400 writes); at 128 the model gives about 2, and the listing ``job_mark``
#: reads is still one page (GCS and S3 give 1,000 keys a page) of names and versions only.
SHARDS = 128
#: Shards tried at once after a throttle before the last one waits the throttle out (within the op's deadline).
TRIES = 4
MARK_MAX = 2**53 - 1


class ShardPicker:
    """Which shard this process writes next: the least recently written by it, ties at random."""

    def __init__(self, shards: int = SHARDS, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.shards = shards
        self.clock = clock
        self.rng = rng or random.Random(int.from_bytes(entropy(8), "big"))
        self._last: dict[tuple[str, int], float] = {}  # (agent base, shard) -> when last written or refused
        self._lock = threading.Lock()

    def order(self, base: str, count: int) -> list[int]:
        """``count`` distinct shards to try in turn; the first is marked as written now."""
        with self._lock:
            ranked = sorted(range(self.shards),
                            key=lambda k: (self._last.get((base, k), float("-inf")), self.rng.random()))
            chosen = ranked[:count]
            self._last[(base, chosen[0])] = self.clock()
            return chosen

    def used(self, base: str, shard: int) -> None:
        with self._lock:
            self._last[(base, shard)] = self.clock()


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


def read(store: RetryingStore, keys: AgentKeys) -> int:
    """``job_mark``: one listing."""
    return value(keys, store.list(keys.mark_shards()))

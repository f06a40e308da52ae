"""The shared toolkit of every collection: JSON objects, parallel reads, CAS loops.

Each collection (conversations, leases, jobs, files, tools) is a small module
of rules; the mechanics they share live here once: reading a JSON object,
fetching many objects at once, and the read-modify-conditional-write loop
that settles every race on one object.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import CloudstoreError
from ..generations import (
    AlreadyExists,
    Create,
    Listed,
    Object,
    Overwrite,
    PreconditionFailed,
    PutMode,
    RetryingStore,
    Update,
    backoff_sleep,
)
from ..runtime import metrics
from ..runtime.pools import ContextPool
from .cache import Bounded
from .keys import AgentKeys, decode_part, is_hashed
from .model import Agent, compact

T = TypeVar("T")
U = TypeVar("U")

log = logging.getLogger("cloudstore")

# A CAS loop that keeps losing for this long is contention we cannot beat.
CAS_ROUNDS = 200
# What a serve process keeps of objects it listed and read (see listed_values),
# and of objects it wrote (see update): byte budgets, part of cache.CACHE_BUDGET.
SEEN_BUDGET = 40 * 1024 * 1024
WRITTEN_BUDGET = 8 * 1024 * 1024
# Only small objects are kept at all.
SEEN_OBJECT_MAX = 64 * 1024
# Parsed JSON takes up to about 12 times its text in memory (many small values).
PARSED_FACTOR = 12
# What an object read or written holds beyond its bytes: its version, nonce and lineage (16 tags).
# Measured 1,520 bytes (tracemalloc, an object of 110 bytes read back from a folder store).
OBJECT_OVERHEAD = 1536


def written_charge(key: str, obj: Object) -> int:
    """What keeping ``obj`` written at ``key``, with its parsed value, costs: key, object and parse."""
    return len(key) + OBJECT_OVERHEAD + len(obj.data) * (1 + PARSED_FACTOR)


class Contention(CloudstoreError):
    """A compare-and-set loop lost every round; nothing of ours was written."""


@dataclass
class Space:
    """One store, its key prefix, and a pool for parallel reads."""

    store: RetryingStore
    root: str
    pool: ThreadPoolExecutor = field(default_factory=lambda: ContextPool(max_workers=16))
    #: For one request sent beside another (``together``): its tasks are single requests that never wait
    #: on a task, so a ``pool`` task may use it without ever waiting on itself.
    beside: ThreadPoolExecutor = field(default_factory=lambda: ContextPool(max_workers=16))
    # key -> (version, what a reader made of it), and key -> (object written, its value): see update
    _seen: Bounded[str, tuple[str, Any]] = field(default_factory=lambda: Bounded(SEEN_BUDGET))
    _written: Bounded[str, tuple[Object, Any]] = field(default_factory=lambda: Bounded(WRITTEN_BUDGET))
    #: Work a reply leaves for after it is sent (packing, a claimed job's index entry): a driver sets
    #: a list and runs it once the reply is out (``run_deferred``); None does it before answering.
    deferred: list[Callable[[], None]] | None = None
    #: Whether a read writes back what it learned: the tail it found missing or stale
    #: (``Conversations._write_tail``), the file ledger of an agent it found none of (``Files._made``).
    #: The drivers' reads do; the admin tools (inspect, migrate's verify) do not: they promise to
    #: change nothing they only read, and an operator may run them on a store an old release serves.
    reads_write_back: bool = True

    def keys(self, agent: Agent) -> AgentKeys:
        return AgentKeys(self.root, agent.owner, agent.id)

    # -- after the reply

    def defer(self, task: Callable[[], None]) -> None:
        """Run ``task`` once the reply is out (see ``deferred``): only work no answer depends on."""
        if self.deferred is None:
            task()
        else:
            self.deferred.append(task)

    def run_deferred(self) -> None:
        """Do what the last replies left for after them; a failure only costs speed or leaves litter
        that readers already tolerate (a crash there is no different)."""
        while self.deferred:
            task = self.deferred.pop(0)
            try:
                task()
            except Exception:  # noqa: BLE001 - the reply is out; a bug here must not end the process
                log.exception("work deferred past a reply failed")

    # -- reads

    def together(self, aside: Callable[[], T], here: Callable[[], U]) -> tuple[T, U]:
        """Two independent requests at once (one round trip, not two): ``aside`` on ``beside``, ``here`` here."""
        theirs, mine = self.at_once(aside, here)
        return theirs, mine

    def at_once(self, *tasks: Callable[[], Any]) -> list[Any]:
        """Independent requests sent at once, their results in order: all but the last on ``beside``.

        Every task is waited for before anything is raised (the first
        failure, in order), so an op that fails here never answers while a
        write of its own is still on its way: whether it changed anything is
        judged once all of them have landed or failed.
        """
        futures = [self.beside.submit(task) for task in tasks[:-1]]
        outcomes: list[tuple[Any, BaseException | None]] = []
        try:
            last: tuple[Any, BaseException | None] = (tasks[-1](), None)
        except Exception as exc:  # noqa: BLE001 - raised once the others are done
            last = (None, exc)
        for future in futures:
            try:
                outcomes.append((future.result(), None))
            except Exception as exc:  # noqa: BLE001 - raised once the others are done
                outcomes.append((None, exc))
        outcomes.append(last)
        failure = next((exc for _, exc in outcomes if exc is not None), None)
        if failure is not None:
            raise failure
        return [value for value, _ in outcomes]

    def get_json(self, key: str, remember: bool = False) -> tuple[Object | None, Any]:
        """(object, parsed JSON) or (None, None).

        With ``remember``, the object read is where the next ``update(cached=True)``
        of ``key`` starts (a watcher that polls an object then writes it
        writes with one request).
        """
        obj = self.store.get(key)
        value = None if obj is None else json.loads(obj.data)
        if remember and obj is not None:
            self._remember_written(key, obj, value)
        return obj, value

    def get_many(self, keys: Iterable[str], head: int | None = None) -> list[Object | None]:
        """Objects of many keys, fetched in parallel, in the order given (heads only, with ``head``)."""
        keys = list(keys)
        if len(keys) <= 1:
            return [self.store.get(k, head) for k in keys]
        return list(self.pool.map(lambda k: self.store.get(k, head), keys))

    def get_many_json(self, keys: Iterable[str]) -> list[Any]:
        """Parsed JSON of many keys (None where absent), in parallel."""
        return [None if o is None else json.loads(o.data) for o in self.get_many(keys)]

    def listed_json(self, listed: Iterable[Listed]) -> list[Any]:
        """Parsed JSON of the objects a listing named (None where gone since), see ``listed_values``."""
        return self.listed_values(listed, lambda obj: json.loads(obj.data))

    def listed_values(self, listed: Iterable[Listed], parse: Callable[[Object], Any],
                      head: int | None = None, kind: str = "") -> list[Any]:
        """``parse`` of each object a listing named, fetching only those changed since seen.

        A listing gives each object's version; a ``serve`` process keeps what
        it parsed of the objects it has read by (key, version), and versions
        are never reused (the frame's nonce makes every write new), so a
        listing of many unchanged records (an agent's jobs) costs the LIST
        alone.  With ``head``, only that many bytes of each payload are read.
        Each object is parsed on its own and only what ``parse`` keeps of it
        stays, so a listing's memory is what it answers, not every object
        whole; ``kind`` names what ``parse`` makes, when one key is parsed
        two ways.
        """
        items = list(listed)
        hits = [self._seen_value(item, kind) for item in items]
        missing = [item.key for item, hit in zip(items, hits, strict=False) if hit is None]
        fetched = dict(zip(missing, self.get_many(missing, head), strict=False))
        out: list[Any] = []
        for item, hit in zip(items, hits, strict=False):
            if hit is None:
                obj = fetched[item.key]
                if obj is None:
                    out.append(None)
                    continue
                hit = parse(obj)
                if obj.version is not None:
                    self._remember(kind + item.key, obj.version, len(obj.data), hit)
            out.append(hit)
        return out

    def _seen_value(self, item: Listed, kind: str = "") -> Any:
        seen = self._seen.get(kind + item.key)
        return seen[1] if seen is not None and item.version is not None and seen[0] == item.version else None

    def _remember_written(self, key: str, obj: Object, value: Any) -> None:
        """Where the next ``update(cached=True)`` of ``key`` starts: small objects of known version only."""
        if obj.version is not None and len(obj.data) <= SEEN_OBJECT_MAX:
            self._written.put(key, (obj, value), written_charge(key, obj))

    def remember_seen(self, key: str, version: str, size: int, value: Any) -> None:
        """Keep what a reader made of ``key`` at ``version`` (see ``listed_values``)."""
        self._remember(key, version, size, value)

    def _remember(self, key: str, version: str, size: int, value: Any) -> None:
        if size > SEEN_OBJECT_MAX:
            return
        self._seen.put(key, (version, value), len(key) + len(version) + size * PARSED_FACTOR)

    # -- writes

    def put_json(self, key: str, value: Any, mode: PutMode) -> Object:
        return self.store.put(key, compact(value).encode("ascii"), mode)

    def update(self, key: str, change: Callable[[Any | None], tuple[Any, T]], raw: bool = False,
               cached: bool = False, on_written: Callable[[Object, Any], None] | None = None,
               absent: bool = False) -> T:
        """Read-modify-write ``key`` until our conditional write wins.

        ``change`` gets the current value (None when absent) and returns
        ``(new value, result)``; a new value of ``KEEP`` writes nothing and
        returns the result at once.  With ``raw``, values are bytes.

        With ``cached``, the first round starts from the object this process
        last wrote at ``key`` (every winning write is remembered) or read with
        ``get_json(remember=True)``, without a read: a write that wins
        proves that object was current, so the common case is one request.
        A round from memory that loses, or that would write nothing, reads the
        store and starts again (an answer is never given from memory alone).
        Only for changes that are pure functions of the value: ``change`` may
        be called with a stale value whose result is thrown away.

        ``on_written(object, value)`` is told of the write that won, so a
        caller can remember what it wrote (a listing then need not read it).

        With ``absent`` (and nothing remembered), the first round guesses the
        object does not exist: a create-if-absent without a read, for keys
        that are new in the common case (a claim lease of a fresh job id).
        A wrong guess costs the one refused create, then reads as usual.
        """
        remembered: tuple[Object | None, Any] | None = self._written.get(key) if cached else None
        if remembered is None and absent:
            remembered = (None, None)
        obj: Object | None
        for attempt in range(CAS_ROUNDS):
            if remembered is not None:
                obj, current = remembered
            else:
                obj = self.store.get(key)
                current = None if obj is None else (obj.data if raw else json.loads(obj.data))
            new, result = change(current)
            if new is KEEP:
                if remembered is None:
                    return result
                remembered = None
                continue
            mode: PutMode = Create() if obj is None else Update.of(obj)
            payload = new if raw else compact(new).encode("ascii")
            try:
                written = self.store.put(key, payload, mode)
            except (AlreadyExists, PreconditionFailed):
                metrics.CAS_LOST.inc(self.store.label, metrics.current_op())
                if remembered is None:
                    backoff_sleep(attempt)
                remembered = None
                self._written.pop(key)
                continue
            self._remember_written(key, written, new)
            if on_written is not None and written.version is not None:
                on_written(written, new)
            return result
        raise Contention(f"gave up after {CAS_ROUNDS} lost compare-and-set rounds on one object")

    # -- names behind hashed key parts

    def remember_name(self, keys: AgentKeys, part: str, name: str) -> None:
        """Keep the name of a hashed key part, so listings can say it."""
        if is_hashed(part):
            self.put_json(keys.name_record(part), {"name": name}, Overwrite())

    def names_of(self, keys: AgentKeys, parts: list[str]) -> list[str | None]:
        """The names of key parts: inline ones decoded, hashed ones looked up."""
        hashed = [p for p in parts if is_hashed(p)]
        looked = dict(zip(hashed, self.get_many_json(keys.name_record(p) for p in hashed), strict=False))
        out: list[str | None] = []
        for part in parts:
            if is_hashed(part):
                record = looked.get(part)
                out.append(None if record is None else record["name"])
            else:
                out.append(decode_part(part))
        return out


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()

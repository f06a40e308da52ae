"""The shared toolkit of every collection: JSON objects, parallel reads, CAS loops.

Each collection (conversations, leases, jobs, files, tools) is a small module
of rules; the mechanics they share live here once: reading a JSON object,
fetching many objects at once, and the read-modify-conditional-write loop
that settles every race on one object.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from .generations import AlreadyExists, Create, Listed, Object, PreconditionFailed, RetryingStore, Update, backoff_sleep
from .keys import AgentKeys, decode_part, is_hashed
from .validate import Agent, compact

T = TypeVar("T")

# A CAS loop that keeps losing for this long is contention we cannot beat.
CAS_ROUNDS = 200
# What a serve process keeps of objects it listed and read (see listed_json).
SEEN_MAX = 20_000
SEEN_OBJECT_MAX = 64 * 1024


class Contention(Exception):
    """A compare-and-set loop lost every round; nothing of ours was written."""


@dataclass
class Space:
    """One store, its key prefix, and a pool for parallel reads."""

    store: RetryingStore
    root: str
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=16))
    _seen: dict[str, tuple[str, Any]] = field(default_factory=dict)  # key -> (version, parsed JSON)

    def keys(self, agent: Agent) -> AgentKeys:
        return AgentKeys(self.root, agent.owner, agent.id)

    # -- reads

    def get_json(self, key: str) -> tuple[Optional[Object], Any]:
        """(object, parsed JSON) or (None, None)."""
        obj = self.store.get(key)
        return (obj, None) if obj is None else (obj, json.loads(obj.data))

    def get_many(self, keys: Iterable[str]) -> list[Optional[Object]]:
        """Objects of many keys, fetched in parallel, in the order given."""
        keys = list(keys)
        if len(keys) <= 1:
            return [self.store.get(k) for k in keys]
        return list(self.pool.map(self.store.get, keys))

    def get_many_json(self, keys: Iterable[str]) -> list[Any]:
        """Parsed JSON of many keys (None where absent), in parallel."""
        return [None if o is None else json.loads(o.data) for o in self.get_many(keys)]

    def listed_json(self, listed: Iterable[Listed]) -> list[Any]:
        """Parsed JSON of the objects a listing named, fetching only those changed since seen.

        A listing gives each object's version; a ``serve`` process keeps the
        small objects it has read by (key, version), and versions are never
        reused (the frame's nonce makes every write new), so a listing of
        many unchanged records (an agent's jobs) costs the LIST alone.
        """
        listed = list(self.listed_cache_hits(listed))
        missing = [item.key for item, hit in listed if hit is None]
        fetched = dict(zip(missing, self.get_many(missing)))
        out: list[Any] = []
        for item, hit in listed:
            if hit is None:
                obj = fetched[item.key]
                if obj is None:
                    out.append(None)
                    continue
                hit = json.loads(obj.data)
                self._remember(item.key, obj.version, len(obj.data), hit)
            out.append(hit)
        return out

    def listed_cache_hits(self, listed: Iterable[Listed]) -> Iterator[tuple[Listed, Any]]:
        for item in listed:
            seen = self._seen.get(item.key)
            yield item, (seen[1] if seen is not None and item.version is not None and seen[0] == item.version else None)

    def _remember(self, key: str, version: str, size: int, value: Any) -> None:
        if size > SEEN_OBJECT_MAX:
            return
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()
        self._seen[key] = (version, value)

    # -- writes

    def put_json(self, key: str, value: Any, mode: Any) -> Object:
        return self.store.put(key, compact(value).encode("ascii"), mode)

    def update(self, key: str, change: Callable[[Optional[Any]], tuple[Any, T]], raw: bool = False) -> T:
        """Read-modify-write ``key`` until our conditional write wins.

        ``change`` gets the current value (None when absent) and returns
        ``(new value, result)``; a new value of ``KEEP`` writes nothing and
        returns the result at once.  With ``raw``, values are bytes.
        """
        for attempt in range(CAS_ROUNDS):
            obj = self.store.get(key)
            current = None if obj is None else (obj.data if raw else json.loads(obj.data))
            new, result = change(current)
            if new is KEEP:
                return result
            mode = Create() if obj is None else Update(obj.version)
            payload = new if raw else compact(new).encode("ascii")
            try:
                self.store.put(key, payload, mode)
                return result
            except (AlreadyExists, PreconditionFailed):
                backoff_sleep(attempt)
        raise Contention(f"gave up after {CAS_ROUNDS} lost compare-and-set rounds on one object; nothing was written")

    # -- names behind hashed key parts

    def remember_name(self, keys: AgentKeys, part: str, name: str) -> None:
        """Keep the name of a hashed key part, so listings can say it."""
        if is_hashed(part):
            from .generations import Overwrite

            self.put_json(keys.name_record(part), {"name": name}, Overwrite())

    def names_of(self, keys: AgentKeys, parts: list[str]) -> list[Optional[str]]:
        """The names of key parts: inline ones decoded, hashed ones looked up."""
        hashed = [p for p in parts if is_hashed(p)]
        looked = dict(zip(hashed, self.get_many_json(keys.name_record(p) for p in hashed)))
        out: list[Optional[str]] = []
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

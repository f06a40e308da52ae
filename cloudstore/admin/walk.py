"""Enumerating a store: every key under its prefix, what kind of thing it is, and whose.

The drivers never list a whole store (no op needs to), so the admin tool is
the one place that does.  A key below the store's root is classified by the
layout of ``cloudstore/store/keys.py``; names are decoded from key parts where the
part holds them inline.  An agent whose owner or id is hashed (``~`` +
SHA-256: a name over ``keys.INLINE_MAX`` bytes encoded) has no name record
anywhere, so it cannot be addressed through ops: callers fall back to keys
for it (``ListedAgent.name`` is None).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..gate import server_check, store_format
from ..gate.store_gate import StoreGate
from ..generations import Listed, RetryingStore
from ..protocol.service import Service
from ..settings import Location, open_store, parse_location
from ..store.keys import AgentKeys, ConversationKey, conversation_key, decode_part, is_hashed
from ..store.space import Space

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger("cloudstore.admin")

#: Where the admin tool keeps its own objects below a store's root (probes, the migrate marker).
#: Not part of the drivers' layout: no driver reads or lists it, and migrate never copies it.
ADMIN_PREFIX = "_admin/"

#: Every kind of key, in the order tables show them.
KINDS = ("event", "segment", "head", "tools", "job", "mark", "day", "file", "name", "due", "claim", "format",
         "probe", "admin", "other")
#: The store's own objects, not any agent's data: its format record and the server probe's keys
#: (store_format.py, server_check.py), and the admin tool's.  migrate neither copies nor compares them:
#: each store has its own (the destination's record is written by its first write, then raised to the
#: source's: migrate.py).
STORE_KINDS = frozenset({"format", "probe", "admin"})

#: Threads for parallel requests: enough to hide a bucket's round trip, few enough for a shared machine.
WORKERS = 16


@dataclass(frozen=True)
class Key:
    """One listed key: where it is, what it is, and whose."""

    key: str  # the whole key, root included
    rel: str  # below the store's root
    kind: str
    agent: tuple[str, str] | None  # (owner part, id part) for agents' keys
    size: int
    modified: float
    version: str | None

    @property
    def parts(self) -> list[str]:
        return self.rel.split("/")

    @property
    def in_conversation(self) -> ConversationKey:
        """An event's or segment's epoch and number (keys.py, either layout)."""
        found = conversation_key("/".join(self.parts[5:]))
        if found is None:
            raise ValueError(f"not a conversation's key: {self.rel}")
        return found


def classify(rel: str) -> tuple[str, tuple[str, str] | None]:
    """(kind, (owner part, id part) or None) of a key below the store's root (keys.py's layout)."""
    if rel.startswith(ADMIN_PREFIX):
        return "admin", None
    if rel == store_format.KEY:
        return "format", None
    if rel.startswith(server_check.PREFIX):
        return "probe", None
    if rel.startswith("_due/"):
        return "due", None
    if rel.startswith("_claim/"):  # the claim index (claim_index.py)
        return "claim", None
    parts = rel.split("/")
    if parts[0] != "a" or len(parts) < 4:
        return "other", None
    agent = (parts[1], parts[2])
    sub = parts[3]
    if len(parts) == 4:
        return ({"mark": "mark", "day": "day"}.get(sub, "other")), agent
    if sub == "m":  # the mark's shards (jobs.py, job_mark.py): m/<k>
        return ("mark" if len(parts) == 5 and parts[4].isdigit() else "other"), agent
    if sub == "c":
        found = conversation_key("/".join(parts[5:])) if len(parts) > 5 else None
        return (found.kind if found is not None else "other"), agent
    kind = {"l": "head", "t": "tools", "j": "job", "f": "file", "n": "name"}.get(sub, "other")
    if kind in ("head", "tools", "job", "name") and len(parts) != 5:
        kind = "other"
    return kind, agent


def part_name(part: str) -> str | None:
    """The name an inline key part holds; None for a hashed part."""
    return None if is_hashed(part) else decode_part(part)


@dataclass(frozen=True)
class ListedAgent:
    """An agent found in the listing, by its key parts; ``name`` is its wire form when decodable.

    Not ``validate.ListedAgent`` (the identity of a request): an agent whose owner
    or id is hashed in its keys has no name to give, yet is in the store.
    """

    owner_part: str
    id_part: str

    @property
    def name(self) -> dict | None:
        """``{"id", "owner"}`` for requests, or None when a part is hashed (no op can reach it)."""
        if is_hashed(self.id_part) or is_hashed(self.owner_part):
            return None
        owner = None if self.owner_part == "-" else decode_part(self.owner_part)
        return {"id": decode_part(self.id_part), "owner": owner}

    @property
    def label(self) -> str:
        name = self.name
        if name is None:
            return f"(hashed) {self.owner_part}/{self.id_part}"
        return f"{'-' if name['owner'] is None else name['owner']!r}/{name['id']!r}"

    def keys(self, root: str) -> AgentKeys:
        """This agent's key builder, usable for hashed agents too (built from the parts)."""
        return PartKeys(root, None, "", self.owner_part, self.id_part)


@dataclass(frozen=True)
class PartKeys(AgentKeys):
    """``AgentKeys`` from key parts rather than names: reaches agents whose names are hashed."""

    owner_part: str = "-"
    id_part: str = ""

    @property
    def base(self) -> str:
        return f"{self.root}a/{self.owner_part}/{self.id_part}/"

    def due_token(self) -> str:
        return f"{self.owner_part}/{self.id_part}"


@dataclass
class Opened:
    """One store opened for the admin tool: its location, seam, toolkit and request handler."""

    url: str
    location: Location
    store: RetryingStore
    space: Space
    service: Service

    @property
    def root(self) -> str:
        return self.location.prefix

    def op(self, agent: dict, op: str, **args: Any) -> dict:
        """One request through the drivers' own handler; an error reply raises (the tool stops)."""
        reply = self.service.answer({"op": op, "agent": agent, **args})
        if reply.get("reply") == "error":
            raise OpError(f"{op} for {agent!r}: {reply['error']}")
        return reply


class OpError(Exception):
    """An op the tool sent answered an error."""


def open_url(url: str, what: str = "URL", create: bool = False) -> Opened:
    """Open ``file:///...``, ``s3://bucket/prefix`` or ``gs://bucket/prefix``; endpoints and
    credentials come from the environment the drivers read (``settings.py``).  A ``file://``
    folder that does not exist is refused unless ``create`` (a migration's destination)."""
    location = parse_location(what, url, ("gs", "s3", "file"))
    store = open_store(location, create, setting=what, eager_probe=False)  # inspect, a gc dry run: no write
    space = Space(store, location.prefix, reads_write_back=False)  # a tool's reads leave the store as it was
    return Opened(url, location, store, space, Service(space))


def readable(opened: Opened) -> dict | None:
    """Check that this release may read the store (its format record, its server); the record, as shown.

    Raises ``store_gate.FormatRefused`` (or ``ServerIgnoresPreconditions``) naming why not.  Every admin
    command but ``format`` (which shows a refused store's record too) asks before it reads.
    """
    gate = opened.store.gate
    if not isinstance(gate, StoreGate):
        return None
    gate.require_read()
    return None if gate.record is None else gate.record.wire()


def list_all(opened: Opened) -> list[Key]:
    """Every key of the store, in byte order, classified (and how many, in the log: a listing of a large
    store takes seconds, one request a thousand keys, with nothing else to show for it)."""
    root = opened.root
    out = []
    began = time.monotonic()
    for item in opened.store.list(root):
        rel = item.key[len(root):]
        kind, agent = classify(rel)
        out.append(Key(item.key, rel, kind, agent, int(item.size or 0), item.modified, item.version))
    seconds = time.monotonic() - began
    log.info("listed %d objects of %s in %.1f s", len(out), opened.url, seconds,
             extra={"event": "listed", "store": opened.url, "objects": len(out), "seconds": round(seconds, 3)})
    return out


def agents_of(keys: Iterable[Key]) -> list[ListedAgent]:
    """The agents that own at least one key, in key order."""
    seen: dict[tuple[str, str], ListedAgent] = {}
    for k in keys:
        if k.agent is not None and k.agent not in seen:
            seen[k.agent] = ListedAgent(owner_part=k.agent[0], id_part=k.agent[1])
    return list(seen.values())


def parallel(fn: Callable[[T], R], items: Iterable[T], workers: int = WORKERS,
             done: Callable[[], object] | None = None) -> list[R]:
    """``fn`` of each item, in order, on a few threads (requests spend their time waiting).

    ``done`` is called as each item is finished (a ``Progress``'s ``tick``): a long phase says how far it is.
    """
    items = list(items)
    if done is not None:
        fn = _then_tick(fn, done)
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def _then_tick(fn: Callable[[T], R], done: Callable[[], object]) -> Callable[[T], R]:
    def counted(item: T) -> R:
        result = fn(item)
        done()
        return result

    return counted


def bounded(fn: Callable[[T], R], items: Iterable[T], workers: int = WORKERS,
            done: Callable[[], object] | None = None) -> Iterator[R]:
    """Like ``parallel`` but yielding as results come in order, with at most ``2 * workers`` in flight,
    so that a store of millions of keys never has millions of futures (or bodies) alive at once.
    ``done`` as ``parallel``'s."""
    from collections import deque

    if done is not None:
        fn = _then_tick(fn, done)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        window: deque = deque()
        for item in items:
            window.append(pool.submit(fn, item))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


@dataclass
class Counter:
    """A thread-safe tally."""

    counts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def get(self, name: str) -> int:
        with self._lock:
            return self.counts.get(name, 0)


def listed(item: Key) -> Listed:
    """The seam's form of a listed key (for helpers that take listings)."""
    return Listed(item.key, item.modified, item.version, item.size)

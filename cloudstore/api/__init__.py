"""The Python API: a store used from a program, without a driver subprocess.

``cloudstore.open(url)`` opens the store a driver setting names (``file://``,
``s3://``, ``gs://``, the URL forms of ``LNK_BUCKET_URL`` / ``LNK_GCS_URL``)
and ``store.agent(owner, id)`` gives a handle whose methods are the ops of
docs/protocol.md, one method per op, with typed results::

    with cloudstore.open("file:///home/me/lnk-bucket", create=True) as store:
        me = store.agent("o1", "a1")
        me.append("t1", {"seq": 1, "text": "hello"})
        me.read("t1")                      # [{"seq": 1, "text": "hello"}]

Why on top of ``Service``: the drivers' promises (every race settled once,
every op whole, the words of every error) are kept by one implementation.
Each method builds the request dict docs/protocol.md shows and sends it down the very
path a ``serve`` process uses: the request is written as its JSON line and
answered by the drivers' ``Answerer`` (``protocol.answerer``: ``parse_request``,
then ``Service.answer``), and the work a reply leaves for after it (packing
events) runs after the reply is handed back, as ``serve`` does it.  So a
request the API lets through is exactly a request line a driver could get,
and it is refused with the same words.  The reply dict then becomes a typed
value, and an error reply an exception of ``cloudstore.errors``.

Concurrency.  A ``serve`` process answers one request at a time, so a
``Service`` is not made to be used by two threads at once.  A store keeps a
small pool of them (``concurrency``, 8 by default), each used by one call at
a time and all sharing one backend (one SDK client, one store clock): calls
from several threads run side by side exactly as requests to that many
``serve`` processes on one store would, which is what the contract settles
races between.  A service still packing after a reply is not answering, so
up to ``concurrency`` more are made while others pack (``Engine``).  Each
``Service`` remembers up to 80 MiB (``cache.MEMORY_BUDGET``), so a store's memory is
bounded by 2 x ``concurrency`` x 80 MiB plus what calls hold.

Settings other than the URL come from the environment, as the drivers read
them (``AWS_ENDPOINT_URL_S3``, ``AWS_*`` credentials, ``STORAGE_EMULATOR_HOST``,
``GOOGLE_*``); for ``s3://``, ``endpoint_url`` and ``region_name`` may be
given as keyword arguments instead.  ``LNK_STORE_FAILPOINT`` (a test hook
that kills the driver's process) is never honoured here: a library must not
kill its host.

Refusals are the drivers'.  A ``file://`` folder that does not exist is
refused (``StoreNotFoundError``) as the drivers refuse it, unless the caller
asks for it with ``create=True``: a typo must not make, and leave behind, an
empty store that answers every read with nothing.  A bucket the store says
does not exist is the same error, naming the URL the caller passed (the
drivers name their setting, which an API user never set).  A store failure
names the store's URL and the endpoint its SDK reached (``StoreFailure``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from .calls import Call, ops, who
from .engine import Engine, store_repr
from .opening import DEFAULT_CONCURRENCY, checked_keywords, close_backend, open_sync_backend, resolved
from .values import Appended, File, FileWrite, Job, JobDay, Json, Lease, Place, ThreadInfo, Took

__all__ = [
    "AgentHandle", "Appended", "File", "FileWrite", "Job", "JobDay", "Lease", "Place", "Store", "ThreadInfo", "Took",
    "open",
]

T = TypeVar("T")


def open(url: str, *, create: bool = False, endpoint_url: str | None = None, region_name: str | None = None,
         concurrency: int = DEFAULT_CONCURRENCY) -> Store:
    """Open the store ``url`` names: ``file:///ABSOLUTE/FOLDER``, ``s3://BUCKET[/PREFIX]``, ``gs://BUCKET[/PREFIX]``.

    Settings come from the environment as the drivers read them;
    ``endpoint_url`` / ``region_name`` override boto3's for ``s3://``.
    ``create=True`` makes a ``file://`` folder that does not exist (without
    it the folder is refused, as the drivers refuse it; buckets are never
    made).  ``concurrency`` bounds the calls that run at once (see the module
    docstring).  Raises ``ArgumentError`` for a keyword of the wrong type or
    value, ``LocationError`` for a malformed URL or a store that cannot be
    opened, ``StoreNotFoundError`` (one of those) for a folder that does not
    exist.  The SDK of the URL's kind is imported here, not before.
    """
    checked_keywords(create, endpoint_url, region_name, concurrency)
    location, client_args = resolved(url, create, endpoint_url, region_name)
    backend = open_sync_backend(location, client_args, create)
    return Store(Engine(backend, location, concurrency, on_close=lambda: close_backend(backend)))


# --------------------------------------------------------------------------
# The synchronous flavour


class Store:
    """An open store (bucket and prefix, or folder); ``agent(owner, id)`` gives an agent's ops.

    Thread-safe: calls from many threads run at once, up to ``concurrency``.
    Close it (``close()`` or ``with``) to wait for after-work and free connections.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __repr__(self) -> str:
        return store_repr(self, self._engine)

    def agent(self, owner: str | None, id: str) -> AgentHandle:
        """The ops of the agent (``owner``, ``id``); ``owner`` None is an agent with no owner.

        ``(None, "a")``, ``("", "a")`` and ``("x", "a")`` are three agents that
        never see each other's things (except through ``job_next``).
        """
        return AgentHandle(self, who(owner, id))

    def close(self) -> None:
        """Wait for calls under way and the work left after their replies; then release the store."""
        self._engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _answer(self, call: Call[T], agent: Mapping[str, Json]) -> T:
        return self._engine.answer(call, agent)


class AgentHandle:
    """One agent's ops on a ``Store``: the methods are docs/protocol.md's ops, with typed results.

    Every method raises ``RefusedError`` for a request that breaks a rule,
    ``FailedError`` when the store failed and nothing changed,
    ``OutcomeUnknownError`` when a write may have landed (cloudstore.errors).
    """

    def __init__(self, store: Store, named: dict[str, Json]) -> None:
        self._store = store
        self._who = named
        self.owner: str | None = named["owner"]
        self.id: str = named["id"]

    def __repr__(self) -> str:
        return f"AgentHandle(owner={self.owner!r}, id={self.id!r})"

    def _do(self, call: Call[T]) -> T:
        return self._store._answer(call, self._who)

    # -- conversations

    def append(self, thread: str, event: Mapping[str, Json]) -> Appended:
        """Store ``event`` (an object with an integer ``seq`` >= 1) if ``seq`` is last + 1; else taken, with last."""
        return self._do(ops.append(thread, event))

    def read(self, thread: str, first: int = 1) -> list[dict[str, Json]]:
        """The events from number ``first`` on, each equal as JSON to what was appended."""
        return self._do(ops.read(thread, first))

    def last(self, thread: str) -> int:
        """The conversation's last number (0 for none)."""
        return self._do(ops.last(thread))

    def threads(self) -> list[ThreadInfo]:
        """The conversations with at least one event, sorted by name."""
        return self._do(ops.threads())

    def remove(self, thread: str) -> None:
        """Forget the conversation's events and lease (its tools narrowing stays)."""
        return self._do(ops.remove(thread))

    # -- leases

    def take(self, thread: str, holder: str, lapse_ms: int) -> Took:
        """Take the conversation's lease for ``holder``: took, lapsed (taken over) or held (by another)."""
        return self._do(ops.take(thread, holder, lapse_ms))

    def renew(self, thread: str, holder: str) -> bool:
        """Renew ``holder``'s lease; False when it is not the holder's any more (``lost``)."""
        return self._do(ops.renew(thread, holder))

    def end(self, thread: str, holder: str) -> None:
        """Release the lease if it is ``holder``'s; nothing otherwise."""
        return self._do(ops.end(thread, holder))

    def leases(self, lapse_ms: int) -> list[Lease]:
        """Every lease held, judged lapsed or not by ``lapse_ms``."""
        return self._do(ops.leases(lapse_ms))

    # -- jobs

    def job_put(self, place: Place, job: Job | Mapping[str, Json]) -> None:
        """Put ``job`` in ``place``, replacing any job of its id there."""
        return self._do(ops.job_put(place, job))

    def job_get(self, place: Place, id: str) -> Job | None:
        """The job ``id`` in ``place``, or None."""
        return self._do(ops.job_get(place, id))

    def job_remove(self, place: Place, id: str) -> bool:
        """Remove job ``id`` from ``place``; whether it was there."""
        return self._do(ops.job_remove(place, id))

    def job_list(self, place: Place) -> list[Job]:
        """Every job in ``place``, in any order."""
        return self._do(ops.job_list(place))

    def job_count(self, place: Place) -> int:
        """How many jobs are in ``place``."""
        return self._do(ops.job_count(place))

    def job_shift(self, id: str, source: Place, target: Place) -> bool:
        """Move job ``id`` from ``source`` to ``target``; of racing shifts exactly one is True."""
        return self._do(ops.job_shift(id, source, target))

    def job_next(self) -> float | None:
        """The soonest due of any waiting job of ANY agent in this store (bucket and prefix), or None."""
        return self._do(ops.job_next())

    def job_day(self) -> JobDay:
        """The day and count kept by ``job_set_day`` (0 and 0 for none)."""
        return self._do(ops.job_day())

    def job_set_day(self, day: int, sent: int) -> None:
        """Keep ``day`` and ``sent`` (integers >= 0)."""
        return self._do(ops.job_set_day(day, sent))

    def job_mark(self) -> int:
        """A number that changes whenever a waiting job of this agent is put, shifted or removed."""
        return self._do(ops.job_mark())

    # -- files

    def file_read(self, path: str) -> File | None:
        """The file at ``path`` (under ``instructions/`` or ``skills/``), or None."""
        return self._do(ops.file_read(path))

    def file_list(self, folder: str) -> list[str]:
        """Every file under ``folder`` at any depth, sorted by UTF-8 bytes (over 4,096 is an error)."""
        return self._do(ops.file_list(folder))

    def file_write(self, path: str, data: bytes, version: int) -> FileWrite:
        """Write ``data`` if the file is at ``version`` (0: absent): wrote at a new version, or stale (version now)."""
        return self._do(ops.file_write(path, data, version))

    def file_remove(self, path: str, version: int) -> bool:
        """Remove the file if it is at ``version``; whether it removed it."""
        return self._do(ops.file_remove(path, version))

    def file_append(self, path: str, data: bytes) -> int:
        """Add ``data`` at the file's end (made if absent); its new version."""
        return self._do(ops.file_append(path, data))

    # -- tools

    def tools_read(self, thread: str) -> list[str] | None:
        """The tools the conversation may use; None: never narrowed, every tool."""
        return self._do(ops.tools_read(thread))

    def tools_list(self) -> dict[str, list[str]]:
        """Every narrowed conversation (removed ones included) and its tools."""
        return self._do(ops.tools_list())

    def tools_narrow(self, thread: str, tools: Sequence[str]) -> list[str]:
        """Narrow the conversation's tools to their intersection with ``tools``; what it may use now."""
        return self._do(ops.tools_narrow(thread, tools))

    # -- any op

    def request(self, op: str, **args: Json) -> dict[str, Json]:
        """Any op as protocol.md writes it (``request("last", thread="t")``): the reply dict; an error reply raised."""
        return self._do(ops.raw(op, args))

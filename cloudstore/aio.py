"""The asyncio flavour of the Python API: ``await cloudstore.aio.open(url)``, the same methods as coroutines.

    async with cloudstore.aio.open("file:///home/me/lnk-bucket", create=True) as store:
        me = store.agent("o1", "a1")
        await me.append("t1", {"seq": 1})

Why it looks like this.  The logic of every collection (conversations, jobs,
files...) is synchronous code, shared with the drivers, and is not written
twice: each call runs it on a worker thread (``concurrency`` of them, 8 by
default), through the same ``Engine`` as the synchronous flavour, while the
caller's coroutine awaits it.  What differs is where the I/O happens:

* ``s3://``: on aiobotocore.  The store has ONE aiobotocore client, living on
  the event loop that opened it.  Its backend is the drivers' own
  ``S3Backend`` (s3.py), so every request is built, made conditional
  (``If-None-Match: *`` / ``If-Match``) and its failure mapped by the same
  code as the drivers'; only its client differs: each call the backend makes
  is a coroutine of the aiobotocore client, submitted to the loop with
  ``asyncio.run_coroutine_threadsafe`` and waited for by the worker thread.
  The loop is free to run it because the caller is awaiting the worker.
  Each request is sent once: botocore's retries are off (the same
  ``Config``, s3.config_options) and so is aiohttp's own re-send of a PUT
  or GET whose keep-alive connection dropped (``_NoResendSession``): a
  re-sent conditional write would meet its own first attempt and be told
  "already exists"; the seam (generations.RetryingStore) does every retry.
* ``gs://`` and ``file://``: google-cloud-storage has no asyncio API, and a
  folder none worth having, so the synchronous backend runs on the worker
  threads, exactly as in ``cloudstore.open``.

Limits.  At most ``concurrency`` calls of one store run at once (others wait
their turn, without blocking the loop), and S3 connections are bounded by
the client's pool (32).  A store belongs to the event loop that opened it:
use it from that loop only, and close it (``aclose()`` or ``async with``)
while the loop runs, so work left after a reply (packing events) finishes.
Cancelling a call does not stop its op: it runs to its end on its worker,
like a request already sent to a driver; what it did is then unknown to the
cancelled caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from .api.calls import Call, ops, who
from .api.engine import Engine, store_repr
from .api.opening import (
    DEFAULT_CONCURRENCY,
    checked_keywords,
    close_backend,
    open_sync_backend,
    opening_failed,
    resolved,
)
from .api.values import Appended, File, FileWrite, Job, JobDay, Lease, Place, ThreadInfo, Took
from .errors import ClosedError, CloudstoreError

if TYPE_CHECKING:
    from .generations import Backend
    from .settings import Location

__all__ = ["AsyncAgentHandle", "AsyncStore", "open"]

Json = Any
T = TypeVar("T")

#: How long a worker waits for one request on the loop before giving up on it (a transient failure).
#: aiohttp's own timeouts (connect 5 s, each read 10 s) end a request well before in practice.
REQUEST_WAIT = 60.0


ASYNC_EXTRA_NEEDED = ("cloudstore.aio on s3:// needs aiobotocore, which is not installed: "
                      "pip install 'cloudstore[async]' (from a checkout: pip install '.[async]')")


class MissingExtra(CloudstoreError, ImportError):
    """A package of an optional extra is not installed; the message names the extra to install.

    Not a ``LocationError``: the URL is right, the environment lacks
    aiobotocore (the ``async`` extra), and saying "cannot be opened" sent
    people looking at their bucket.  An ``ImportError`` too, for callers
    that catch that.
    """


# --------------------------------------------------------------------------
# S3 on aiobotocore, behind the drivers' S3Backend


class _Body:
    """A body already read on the loop, with the ``read()`` of boto3's ``StreamingBody``."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self) -> bytes:
        return self._data


class _LoopClient:
    """A boto3-shaped S3 client whose every call is one request of an aiobotocore client on ``loop``.

    ``S3Backend`` calls it from a worker thread exactly as it calls boto3's
    (``get_object``, ``put_object``, ``delete_object``, ``list_objects_v2``,
    ``meta.events``); each call blocks that thread until the loop has run the
    request.  A ``get_object``'s body is read inside the same coroutine, so a
    body cut short fails the call itself, as reading boto3's body inside
    ``S3Backend.get``'s classified block does.  aiohttp errors that escape
    aiobotocore while a body is read become the botocore error boto3 raises
    for the same failure, so s3.py's one mapping (``_classify``) judges both.
    """

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self.meta = client.meta  # S3Backend registers its clock hooks here; they run on the loop

    def _run(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError("a store request was made on its event loop's own thread: it would wait forever")
        future = asyncio.run_coroutine_threadsafe(self._botocore_errors(make), self._loop)
        try:
            return future.result(timeout=REQUEST_WAIT)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise TimeoutError(f"no reply within {REQUEST_WAIT:.0f} s") from exc

    @staticmethod
    async def _botocore_errors(make: Callable[[], Awaitable[T]]) -> T:
        import aiohttp
        from botocore.exceptions import ResponseStreamingError

        try:
            return await make()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise ResponseStreamingError(error=exc) from exc

    def get_object(self, **args: Any) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            got = await self._client.get_object(**args)
            async with got["Body"] as body:
                data = await body.read()
            return {**got, "Body": _Body(data)}

        return self._run(get)

    def put_object(self, **args: Any) -> dict[str, Any]:
        return self._run(lambda: self._client.put_object(**args))

    def delete_object(self, **args: Any) -> dict[str, Any]:
        return self._run(lambda: self._client.delete_object(**args))

    def list_objects_v2(self, **args: Any) -> dict[str, Any]:
        return self._run(lambda: self._client.list_objects_v2(**args))


@functools.cache
def _no_resend_session() -> type:
    """aiobotocore's HTTP session, with aiohttp's re-send of idempotent requests switched off.

    aiohttp sends a PUT, GET or DELETE again, once, when its connection is
    closed or reset before a reply (``ClientSession._retry_connection``, for
    keep-alive connections the server dropped).  For a conditional PUT whose
    reply was lost after the store applied it, that second send meets the
    first and is answered 412: "already exists" about our own write, which the
    contract forbids.  botocore's urllib3 never re-sends (s3.py); neither may
    this.  aiohttp has no public switch, so the session's flag is cleared as
    the session is made (tests/test_api.py proves one send at the wire).
    """
    from aiobotocore.httpsession import AIOHTTPSession

    class _NoResendSession(AIOHTTPSession):  # type: ignore[misc,unused-ignore]
        async def _get_session(self, proxy_url: Any) -> Any:
            session = await super()._get_session(proxy_url)
            if getattr(session, "_retry_connection", False):
                session._retry_connection = False
            return session

    return _NoResendSession


async def _open_aio_s3(location: Location, client_args: Mapping[str, str],
                       stack: contextlib.AsyncExitStack) -> Backend:
    """The drivers' S3Backend on one aiobotocore client, entered on ``stack`` (closed with the store)."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    from .s3 import S3Backend, config_options

    config = AioConfig(http_session_cls=_no_resend_session(), **config_options())
    client = await stack.enter_async_context(get_session().create_client("s3", config=config, **client_args))
    return S3Backend(location.bucket, client=_LoopClient(client, asyncio.get_running_loop()))


# --------------------------------------------------------------------------
# Opening


class _Opening:
    """What ``open`` returns: awaited, the store; used with ``async with``, the store, closed at the end."""

    def __init__(self, url: str, create: bool, endpoint_url: str | None, region_name: str | None,
                 concurrency: int) -> None:
        self._args = (url, create, endpoint_url, region_name, concurrency)
        self._store: AsyncStore | None = None

    def __await__(self) -> Generator[Any, None, AsyncStore]:
        return _open(*self._args).__await__()

    async def __aenter__(self) -> AsyncStore:
        self._store = await _open(*self._args)
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.aclose()


def open(url: str, *, create: bool = False, endpoint_url: str | None = None, region_name: str | None = None,
         concurrency: int = DEFAULT_CONCURRENCY) -> _Opening:
    """Open the store ``url`` names, for asyncio: ``await open(url)`` or ``async with open(url) as store``.

    The same URLs, settings and errors as ``cloudstore.open``: settings from
    the environment as the drivers read them, ``endpoint_url`` /
    ``region_name`` overriding them for ``s3://``, ``create=True`` making a
    ``file://`` folder that does not exist; ``ArgumentError`` for a keyword of
    the wrong type, at this call; ``LocationError`` for a URL or store that
    cannot be opened.  ``s3://`` does its I/O on
    aiobotocore (the ``async`` extra); ``gs://`` and ``file://`` run the
    synchronous backend on worker threads (google-cloud-storage has no
    asyncio API).  See the module docstring for how and its limits.
    """
    checked_keywords(create, endpoint_url, region_name, concurrency)
    return _Opening(url, create, endpoint_url, region_name, concurrency)


async def _open(url: str, create: bool, endpoint_url: str | None, region_name: str | None,
                concurrency: int) -> AsyncStore:
    location, client_args = resolved(url, create, endpoint_url, region_name)
    loop = asyncio.get_running_loop()
    stack = contextlib.AsyncExitStack()
    executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="cloudstore-aio")
    try:
        if location.scheme == "s3":
            try:
                backend = await _open_aio_s3(location, client_args, stack)
            except ImportError as exc:
                raise MissingExtra(ASYNC_EXTRA_NEEDED) from exc
            except Exception as exc:  # noqa: BLE001 - no credentials, a bad endpoint...
                raise opening_failed(exc, location) from exc
            on_close: Callable[[], None] | None = None
        else:
            backend = await loop.run_in_executor(executor, open_sync_backend, location, client_args, create)
            on_close = lambda: close_backend(backend)  # noqa: E731
        engine = Engine(backend, location, concurrency, on_close=on_close)
    except BaseException:
        executor.shutdown(wait=False)
        await stack.aclose()
        raise
    return AsyncStore(engine, executor, stack, loop)


# --------------------------------------------------------------------------
# The asyncio flavour


class AsyncStore:
    """An open store for asyncio; ``agent(owner, id)`` gives an agent's ops as coroutines.

    Belongs to the event loop that opened it.  Close it with ``await aclose()``
    (or ``async with``): it waits for calls under way and for the work left
    after their replies, then closes the aiobotocore client.
    """

    def __init__(self, engine: Engine, executor: ThreadPoolExecutor, stack: contextlib.AsyncExitStack,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._executor = executor
        self._stack = stack
        self._loop = loop
        self._closed = False

    def __repr__(self) -> str:
        return store_repr(self, self._engine)

    def agent(self, owner: str | None, id: str) -> AsyncAgentHandle:
        """The ops of the agent (``owner``, ``id``) as coroutines; ``owner`` None is an agent with no owner."""
        return AsyncAgentHandle(self, who(owner, id))

    async def _answer(self, call: Call[T], agent: Mapping[str, Json]) -> T:
        if asyncio.get_running_loop() is not self._loop:
            raise CloudstoreError("this store belongs to another event loop: open one on this loop", call.op)
        if self._closed:
            raise ClosedError("the store is closed", call.op)
        return await self._loop.run_in_executor(self._executor, self._engine.answer, call, agent)

    async def aclose(self) -> None:
        """Wait for calls under way and their after-work; then close the workers and the S3 client."""
        if self._closed:
            return
        self._closed = True
        await self._loop.run_in_executor(None, self._engine.close)  # its workers may still need the loop
        self._executor.shutdown(wait=False)
        await self._stack.aclose()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncAgentHandle:
    """One agent's ops on an ``AsyncStore``: the protocol's ops as coroutines, as in ``api.AgentHandle``."""

    def __init__(self, store: AsyncStore, named: dict[str, Json]) -> None:
        self._store = store
        self._who = named
        self.owner: str | None = named["owner"]
        self.id: str = named["id"]

    def __repr__(self) -> str:
        return f"AsyncAgentHandle(owner={self.owner!r}, id={self.id!r})"

    async def _do(self, call: Call[T]) -> T:
        return await self._store._answer(call, self._who)

    # -- conversations

    async def append(self, thread: str, event: Mapping[str, Json]) -> Appended:
        """Store ``event`` if its ``seq`` is last + 1; else taken, with last (see ``api.AgentHandle.append``)."""
        return await self._do(ops.append(thread, event))

    async def read(self, thread: str, first: int = 1) -> list[dict[str, Json]]:
        """The events from number ``first`` on."""
        return await self._do(ops.read(thread, first))

    async def last(self, thread: str) -> int:
        """The conversation's last number (0 for none)."""
        return await self._do(ops.last(thread))

    async def threads(self) -> list[ThreadInfo]:
        """The conversations with at least one event, sorted by name."""
        return await self._do(ops.threads())

    async def remove(self, thread: str) -> None:
        """Forget the conversation's events and lease (its tools narrowing stays)."""
        return await self._do(ops.remove(thread))

    # -- leases

    async def take(self, thread: str, holder: str, lapse_ms: int) -> Took:
        """Take the conversation's lease for ``holder``: took, lapsed or held."""
        return await self._do(ops.take(thread, holder, lapse_ms))

    async def renew(self, thread: str, holder: str) -> bool:
        """Renew ``holder``'s lease; False when it was lost."""
        return await self._do(ops.renew(thread, holder))

    async def end(self, thread: str, holder: str) -> None:
        """Release the lease if it is ``holder``'s."""
        return await self._do(ops.end(thread, holder))

    async def leases(self, lapse_ms: int) -> list[Lease]:
        """Every lease held, judged by ``lapse_ms``."""
        return await self._do(ops.leases(lapse_ms))

    # -- jobs

    async def job_put(self, place: Place, job: Job | Mapping[str, Json]) -> None:
        """Put ``job`` in ``place``, replacing any job of its id there."""
        return await self._do(ops.job_put(place, job))

    async def job_get(self, place: Place, id: str) -> Job | None:
        """The job ``id`` in ``place``, or None."""
        return await self._do(ops.job_get(place, id))

    async def job_remove(self, place: Place, id: str) -> bool:
        """Remove job ``id`` from ``place``; whether it was there."""
        return await self._do(ops.job_remove(place, id))

    async def job_list(self, place: Place) -> list[Job]:
        """Every job in ``place``."""
        return await self._do(ops.job_list(place))

    async def job_count(self, place: Place) -> int:
        """How many jobs are in ``place``."""
        return await self._do(ops.job_count(place))

    async def job_shift(self, id: str, source: Place, target: Place) -> bool:
        """Move job ``id`` from ``source`` to ``target``; of racing shifts exactly one is True."""
        return await self._do(ops.job_shift(id, source, target))

    async def job_next(self) -> float | None:
        """The soonest due of any waiting job of ANY agent in this store, or None."""
        return await self._do(ops.job_next())

    async def job_day(self) -> JobDay:
        """The day and count kept by ``job_set_day``."""
        return await self._do(ops.job_day())

    async def job_set_day(self, day: int, sent: int) -> None:
        """Keep ``day`` and ``sent``."""
        return await self._do(ops.job_set_day(day, sent))

    async def job_mark(self) -> int:
        """A number that changes whenever a waiting job of this agent is put, shifted or removed."""
        return await self._do(ops.job_mark())

    # -- files

    async def file_read(self, path: str) -> File | None:
        """The file at ``path``, or None."""
        return await self._do(ops.file_read(path))

    async def file_list(self, folder: str) -> list[str]:
        """Every file under ``folder`` at any depth, sorted by UTF-8 bytes."""
        return await self._do(ops.file_list(folder))

    async def file_write(self, path: str, data: bytes, version: int) -> FileWrite:
        """Write ``data`` if the file is at ``version`` (0: absent): wrote, or stale with the version now."""
        return await self._do(ops.file_write(path, data, version))

    async def file_remove(self, path: str, version: int) -> bool:
        """Remove the file if it is at ``version``; whether it removed it."""
        return await self._do(ops.file_remove(path, version))

    async def file_append(self, path: str, data: bytes) -> int:
        """Add ``data`` at the file's end (made if absent); its new version."""
        return await self._do(ops.file_append(path, data))

    # -- tools

    async def tools_read(self, thread: str) -> list[str] | None:
        """The tools the conversation may use; None: every tool."""
        return await self._do(ops.tools_read(thread))

    async def tools_list(self) -> dict[str, list[str]]:
        """Every narrowed conversation and its tools."""
        return await self._do(ops.tools_list())

    async def tools_narrow(self, thread: str, tools: Sequence[str]) -> list[str]:
        """Narrow the conversation's tools to their intersection with ``tools``; what it may use now."""
        return await self._do(ops.tools_narrow(thread, tools))

    # -- any op

    async def request(self, op: str, **args: Json) -> dict[str, Json]:
        """Any op as docs/protocol.md writes it: the reply dict; an error reply raised."""
        return await self._do(ops.raw(op, args))

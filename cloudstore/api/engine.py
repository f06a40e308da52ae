"""The engine of the Python API: a pool of the drivers' answerers on one backend (``Engine``).

Each call goes down the very path a ``serve`` process's request takes (its
JSON line, ``Answerer``, ``Service``), so the API refuses and answers with the
drivers' words; see ``cloudstore.api``'s docstring for why and for the pool.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from ..errors import ClosedError, CloudstoreError, ErrorKind, StoreNotFoundError, error_of
from .calls import Call, encode
from .opening import DEFAULT_CONCURRENCY, checked_concurrency, endpoint_of, url_of
from .values import Json

if TYPE_CHECKING:
    from ..gate.store_gate import StoreGate
    from ..generations import Backend
    from ..protocol.answerer import Answerer
    from ..protocol.service import Answered
    from ..settings import Location

T = TypeVar("T")


class Engine:
    """Answers calls on one store: a pool of the drivers' ``Answerer``s, one call each at a time.

    Each answerer holds a ``Service`` of its own (its own memory and its own
    count of writes, so an error's ``outcome unknown`` is judged by its own
    op's writes only) over one shared backend.  The pool grows on demand to
    ``concurrency`` answering calls; a call beyond them waits for a free one.

    The work a reply leaves for after it (``Answerer.after_reply``: packing)
    runs on a thread of ``_after`` while the caller already has its reply; the
    answerer goes back to the pool when it is done, as a ``serve`` process
    reads its next line only after it.  An answerer busy so is not answering:
    a call finding every other answerer at such work gets a new one, up to
    ``concurrency`` more in all.  Counted against the calls, packing made one
    of eight writers wait now and then for an answerer of its own: eight
    writers appended at 0.88 of raw creates' rate on fake-gcs-server at 20 ms
    round trips, 0.92 with the answerers apart (issue 26, case 7).
    """

    def __init__(self, backend: Backend, location: Location, concurrency: int = DEFAULT_CONCURRENCY,
                 on_close: Callable[[], None] | None = None) -> None:
        checked_concurrency(concurrency)
        self.backend = backend
        self.location = location
        self.concurrency = concurrency
        self.url = url_of(location)  # what its errors and repr name: the caller's store, and where it was reached
        self.endpoint = endpoint_of(backend)
        self._on_close = on_close
        self._idle: list[Answerer] = []
        self._all: list[Answerer] = []
        self._finishing = 0  # answerers doing what their last reply left for after it
        self._cond = threading.Condition()
        self._closed = False
        self._after = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="cloudstore-after")
        self._gate: StoreGate | None = None  # made with the first service

    def _make(self) -> Answerer:
        """A new answerer as a driver's first request makes one (``Answerer._service``), on our backend."""
        from ..gate.store_gate import StoreGate
        from ..generations import RetryingStore, backend_label
        from ..protocol.answerer import setting_of
        from ..protocol.service import Service
        from ..store.space import Space

        with self._cond:  # one gate for every service of the pool: the record read and the server probed once
            if self._gate is None:
                self._gate = StoreGate(self.backend, self.location.prefix,
                                       check_server=backend_label(self.backend) != "file")
        store = RetryingStore(self.backend)
        store.gate = self._gate
        service = Service(Space(store, self.location.prefix))
        service.space.deferred = []  # packing and index drops wait until the reply is out, as in serve
        return api_answerer()(setting_of(self.location.scheme), service=service)

    def _checkout(self) -> Answerer:
        with self._cond:
            while True:
                if self._closed:
                    raise ClosedError("the store is closed")
                if self._idle:
                    return self._idle.pop()  # the most recently used: its memory is the warmest
                answering = len(self._all) - self._finishing
                if answering < self.concurrency and len(self._all) < 2 * self.concurrency:
                    break
                self._cond.wait()
            answerer = self._make()
            self._all.append(answerer)
            return answerer

    def _release(self, answerer: Answerer, finished: bool = False) -> None:
        """Back to the pool; ``finished``: from the work after its reply, so no longer counted at it."""
        with self._cond:
            if finished:
                self._finishing -= 1
            self._idle.append(answerer)
            self._cond.notify_all()

    def _finish(self, answerer: Answerer) -> None:
        try:
            answerer.after_reply()
        finally:
            self._release(answerer, finished=True)

    def answer(self, call: Call[T], agent: Mapping[str, Json]) -> T:
        """Send ``call`` for ``agent`` down the driver's path; its value, or its error raised (``error``)."""
        line = encode({"op": call.op, "agent": agent, **call.args})
        answered = self.answered(line)
        if answered.kind is not None:
            raise self.error(call.op, answered.kind, str(answered.reply.get("error", "")))
        return call.result(answered.reply)

    def error(self, op: str, kind: ErrorKind, message: str) -> CloudstoreError:
        """The exception of an error reply: the class of its kind, chosen by type, never by the reply's words
        (``errors.error_of``), a store failure naming this store and its endpoint.

        One exception to that: a store failure saying the bucket does not exist is the caller's URL
        naming no store, ``StoreNotFoundError`` naming that URL (the drivers' reply names their setting
        instead, which an API user never set: ``ApiAnswerer``).
        """
        from ..http_status import BUCKET_GONE

        if kind == "failed" and BUCKET_GONE in message:
            at = f" at {self.endpoint}" if self.endpoint else ""
            return StoreNotFoundError(f"the store URL {self.url} names a bucket that does not exist{at}: make it, "
                                      f"or correct the URL ({message})", op)
        return error_of(kind, op, message, self.url, self.endpoint)

    def reply(self, line: bytes) -> dict[str, Json]:
        """The reply dict a ``serve`` process would write for request ``line``."""
        return self.answered(line).reply

    def answered(self, line: bytes) -> Answered:
        """The reply a ``serve`` process would write for request ``line``, with its kind when an error."""
        answerer = self._checkout()
        handed_off = False
        try:
            answered = answerer.answered(line)
            if answerer.pending:
                with self._cond:
                    self._finishing += 1
                try:
                    self._after.submit(self._finish, answerer)
                    handed_off = True
                except RuntimeError:  # closing: do it here, before the answerer goes back
                    with self._cond:
                        self._finishing -= 1
                    answerer.after_reply()
        finally:
            if not handed_off:
                self._release(answerer)
        return answered

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (calls are refused from then on)."""
        return self._closed

    def close(self) -> None:
        """Refuse new calls, wait for the calls under way and their after-work, then free the SDK client."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            while len(self._idle) < len(self._all):
                self._cond.wait()
        self._after.shutdown(wait=True)
        for answerer in self._all:
            if answerer.service is not None:
                answerer.service.space.pool.shutdown(wait=True)
                answerer.service.space.beside.shutdown(wait=True)
        if self._on_close is not None:
            self._on_close()


@functools.cache
def api_answerer() -> type[Answerer]:
    """The drivers' ``Answerer``, but for the words it adds to a reply saying a bucket does not exist.

    A driver adds the setting that names the bucket (``LNK_BUCKET_URL``: check
    the setting); an API user set no setting, and ``Engine.error`` names the
    URL they passed instead.  Made on first use: the answerer's module is
    imported when a store is, not with ``cloudstore``.
    """
    from ..protocol.answerer import Answerer

    class ApiAnswerer(Answerer):
        def named(self, reply: dict[str, Json]) -> dict[str, Json]:
            return reply

    return ApiAnswerer


def store_repr(store: object, engine: Engine) -> str:
    """``<Store s3://bucket/prefix endpoint=http://... concurrency=8>``: which store a program holds, and
    whether it is closed; never a credential (``url_of``, ``endpoint_of``)."""
    at = f" endpoint={engine.endpoint}" if engine.endpoint else ""
    state = " closed" if engine.closed else ""
    return f"<{type(store).__name__} {engine.url}{at} concurrency={engine.concurrency}{state}>"

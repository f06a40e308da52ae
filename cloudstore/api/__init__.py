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

import base64
import binascii
import functools
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ..errors import (
    ArgumentError,
    ClosedError,
    CloudstoreError,
    ErrorKind,
    LocationError,
    RefusedError,
    SettingError,
    StoreNotFoundError,
    error_of,
)

if TYPE_CHECKING:
    from ..gate.store_gate import StoreGate
    from ..generations import Backend
    from ..protocol.answerer import Answerer
    from ..protocol.service import Answered
    from ..settings import Location

__all__ = [
    "AgentHandle", "Appended", "File", "FileWrite", "Job", "JobDay", "Lease", "Place", "Store", "ThreadInfo", "Took",
    "open",
]

Json = Any
T = TypeVar("T")

#: Where a job is kept (docs/protocol.md): anything else is refused.
Place = Literal["waiting", "firing", "ending"]

#: How many calls of one store run at once by default (and so how many ``Service``s it keeps).
DEFAULT_CONCURRENCY = 8


# --------------------------------------------------------------------------
# What the ops answer


@dataclass(frozen=True)
class Appended:
    """``append``'s answer: ``done`` (the event is stored) or taken, with the conversation's last number.

    ``last`` is the event's own ``seq`` when ``done``; else the number a
    writer must follow (append ``last + 1`` to go on).
    """

    done: bool
    last: int

    @property
    def taken(self) -> bool:
        return not self.done


@dataclass(frozen=True)
class ThreadInfo:
    """One conversation of ``threads``: its name and last number."""

    thread: str
    last: int


class Took(str, Enum):
    """``take``'s answer; a ``str`` equal to the wire's word (``Took.HELD == "held"``)."""

    TOOK = "took"  # it was free (or already this holder's): it is the holder's now
    LAPSED = "lapsed"  # another holder's lease had lapsed: it is the holder's now
    HELD = "held"  # another holder holds it

    @property
    def won(self) -> bool:
        """Whether the holder holds the lease now (``took`` or ``lapsed``)."""
        return self is not Took.HELD


@dataclass(frozen=True)
class Lease:
    """One lease of ``leases``: times in seconds since 1970 (millisecond precision), judged by ``lapse_ms``."""

    thread: str
    holder: str
    started: float
    renewed: float
    lapsed: bool


@dataclass(frozen=True)
class Job:
    """A job: an id (1 to 256 bytes of UTF-8, no control character), any JSON ``spec``, ``due`` in seconds."""

    id: str
    spec: Json
    due: float

    def wire(self) -> dict[str, Json]:
        return {"id": self.id, "spec": self.spec, "due": self.due}


@dataclass(frozen=True)
class JobDay:
    """``job_day``'s answer (0 and 0 when none was kept)."""

    day: int
    sent: int


@dataclass(frozen=True)
class File:
    """A file read: its bytes and its version."""

    data: bytes
    version: int


@dataclass(frozen=True)
class FileWrite:
    """``file_write``'s answer: ``wrote`` the file at ``version``, or stale: ``version`` is the file's now (0: none)."""

    wrote: bool
    version: int

    @property
    def stale(self) -> bool:
        return not self.wrote


# --------------------------------------------------------------------------
# One op: the request docs/protocol.md shows, and how its reply becomes a value


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request (without its agent) and what its success reply becomes.

    Both flavours build their calls here, so the request and the reading of
    its reply are written once; a flavour only decides where ``Engine.answer``
    runs.
    """

    op: str
    args: dict[str, Json]
    parse: Callable[[dict[str, Json]], T]

    def result(self, reply: dict[str, Json]) -> T:
        """The value of a reply that is no error (``Engine.answer`` raises those, by their kind)."""
        if reply.get("reply") == "error":  # every error the service answers has its kind: a bug, not the caller's
            raise CloudstoreError(f"an error reply to {self.op} came without its kind: {reply.get('error')!r}",
                                  self.op)
        try:
            return self.parse(reply)
        except (KeyError, TypeError, ValueError) as exc:  # a reply protocol.md lacks: a bug, not the caller's
            raise CloudstoreError(f"unexpected reply to {self.op}: {reply.get('reply')!r}", self.op) from exc


def _kind(reply: dict[str, Json], *kinds: str) -> str:
    kind = reply.get("reply")
    if kind not in kinds:
        raise ValueError(f"reply {kind!r}, expected {' or '.join(kinds)}")
    return str(kind)


def _none(kind: str) -> Callable[[dict[str, Json]], None]:
    def parse(reply: dict[str, Json]) -> None:
        _kind(reply, kind)

    return parse


def _field(kind: str, name: str, make: Callable[[Any], T]) -> Callable[[dict[str, Json]], T]:
    def parse(reply: dict[str, Json]) -> T:
        _kind(reply, kind)
        return make(reply[name])

    return parse


def _same(value: T) -> T:
    return value


def _job(value: Json) -> Job:
    return Job(value["id"], value["spec"], value["due"])


def _b64(data: bytes | bytearray | memoryview) -> str:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RefusedError(f"'data' must be bytes, not {type(data).__name__}")
    return base64.b64encode(bytes(data)).decode("ascii")


def _file(value: Json) -> File | None:
    if value is None:
        return None
    try:
        data = base64.b64decode(value["data"], validate=True)
    except binascii.Error as exc:
        raise ValueError("the file's data is not base64") from exc
    return File(data, int(value["version"]))


class ops:
    """The calls of every op of docs/protocol.md, one function each (see the flavours' methods for what they mean)."""

    # -- conversations

    @staticmethod
    def append(thread: str, event: Mapping[str, Json]) -> Call[Appended]:
        seq = event.get("seq") if isinstance(event, Mapping) else None

        def parse(reply: dict[str, Json]) -> Appended:
            if _kind(reply, "done", "taken") == "done":
                return Appended(True, int(seq))  # type: ignore[arg-type]  # validated by the service
            return Appended(False, int(reply["last"]))

        return Call("append", {"thread": thread, "event": event}, parse)

    @staticmethod
    def read(thread: str, first: int = 1) -> Call[list[dict[str, Json]]]:
        return Call("read", {"thread": thread, "first": first}, _field("events", "events", list))

    @staticmethod
    def last(thread: str) -> Call[int]:
        return Call("last", {"thread": thread}, _field("last", "last", int))

    @staticmethod
    def threads() -> Call[list[ThreadInfo]]:
        return Call("threads", {}, _field("threads", "threads",
                                          lambda ts: [ThreadInfo(t["thread"], int(t["last"])) for t in ts]))

    @staticmethod
    def remove(thread: str) -> Call[None]:
        return Call("remove", {"thread": thread}, _none("done"))

    # -- leases

    @staticmethod
    def take(thread: str, holder: str, lapse_ms: int) -> Call[Took]:
        return Call("take", {"thread": thread, "holder": holder, "lapse_ms": lapse_ms}, _field("took", "took", Took))

    @staticmethod
    def renew(thread: str, holder: str) -> Call[bool]:
        return Call("renew", {"thread": thread, "holder": holder},
                    lambda reply: _kind(reply, "done", "lost") == "done")

    @staticmethod
    def end(thread: str, holder: str) -> Call[None]:
        return Call("end", {"thread": thread, "holder": holder}, _none("done"))

    @staticmethod
    def leases(lapse_ms: int) -> Call[list[Lease]]:
        def make(items: list[dict[str, Json]]) -> list[Lease]:
            return [Lease(i["thread"], i["holder"], i["started"], i["renewed"], bool(i["lapsed"])) for i in items]

        return Call("leases", {"lapse_ms": lapse_ms}, _field("leases", "leases", make))

    # -- jobs

    @staticmethod
    def job_put(place: Place, job: Job | Mapping[str, Json]) -> Call[None]:
        wire = job.wire() if isinstance(job, Job) else job
        return Call("job_put", {"place": place, "job": wire}, _none("done"))

    @staticmethod
    def job_get(place: Place, id: str) -> Call[Job | None]:
        return Call("job_get", {"place": place, "id": id},
                    _field("job", "job", lambda j: None if j is None else _job(j)))

    @staticmethod
    def job_remove(place: Place, id: str) -> Call[bool]:
        return Call("job_remove", {"place": place, "id": id}, _field("found", "found", bool))

    @staticmethod
    def job_list(place: Place) -> Call[list[Job]]:
        return Call("job_list", {"place": place}, _field("jobs", "jobs", lambda js: [_job(j) for j in js]))

    @staticmethod
    def job_count(place: Place) -> Call[int]:
        return Call("job_count", {"place": place}, _field("count", "count", int))

    @staticmethod
    def job_shift(id: str, source: Place, target: Place) -> Call[bool]:
        return Call("job_shift", {"id": id, "from": source, "to": target}, _field("found", "found", bool))

    @staticmethod
    def job_next() -> Call[float | None]:
        return Call("job_next", {}, _field("next", "next", _same))

    @staticmethod
    def job_day() -> Call[JobDay]:
        return Call("job_day", {}, lambda r: (_kind(r, "day"), JobDay(int(r["day"]), int(r["sent"])))[1])

    @staticmethod
    def job_set_day(day: int, sent: int) -> Call[None]:
        return Call("job_set_day", {"day": day, "sent": sent}, _none("done"))

    @staticmethod
    def job_mark() -> Call[int]:
        return Call("job_mark", {}, _field("mark", "mark", int))

    # -- files

    @staticmethod
    def file_read(path: str) -> Call[File | None]:
        return Call("file_read", {"path": path}, _field("file", "file", _file))

    @staticmethod
    def file_list(folder: str) -> Call[list[str]]:
        return Call("file_list", {"folder": folder}, _field("files", "files", list))

    @staticmethod
    def file_write(path: str, data: bytes, version: int) -> Call[FileWrite]:
        def parse(reply: dict[str, Json]) -> FileWrite:
            return FileWrite(_kind(reply, "wrote", "stale") == "wrote", int(reply["version"]))

        return Call("file_write", {"path": path, "data": _b64(data), "version": version}, parse)

    @staticmethod
    def file_remove(path: str, version: int) -> Call[bool]:
        return Call("file_remove", {"path": path, "version": version}, _field("found", "found", bool))

    @staticmethod
    def file_append(path: str, data: bytes) -> Call[int]:
        return Call("file_append", {"path": path, "data": _b64(data)}, _field("wrote", "version", int))

    # -- tools

    @staticmethod
    def tools_read(thread: str) -> Call[list[str] | None]:
        return Call("tools_read", {"thread": thread},
                    _field("tools", "tools", lambda t: None if t is None else list(t)))

    @staticmethod
    def tools_list() -> Call[dict[str, list[str]]]:
        return Call("tools_list", {}, _field("narrowed", "narrowed", dict))

    @staticmethod
    def tools_narrow(thread: str, tools: Sequence[str]) -> Call[list[str]]:
        names = list(tools) if isinstance(tools, (list, tuple)) else tools
        return Call("tools_narrow", {"thread": thread, "tools": names}, _field("tools", "tools", list))

    # -- any op, as docs/protocol.md writes it

    @staticmethod
    def raw(op: str, args: Mapping[str, Json]) -> Call[dict[str, Json]]:
        return Call(op, dict(args), dict)


# --------------------------------------------------------------------------
# The engine: a pool of the drivers' answerers on one backend


def who(owner: str | None, id: str) -> dict[str, Json]:
    """An agent as a request names it; refused at once when it breaks docs/protocol.md's rule (the driver's check)."""
    from ..protocol.validate import RequestError, agent

    named = {"id": id, "owner": owner}
    try:
        agent({"agent": named})
    except RequestError as exc:
        raise RefusedError(str(exc)) from exc
    return named


def encode(request: Mapping[str, Json]) -> bytes:
    """The request as a driver gets it: one line of JSON (ASCII, so any string crosses as JSON escapes it).

    A value JSON cannot write (NaN, infinity, bytes, a set...) is refused here:
    no driver could be sent it.
    """
    try:
        return json.dumps(request, ensure_ascii=True, allow_nan=False).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise RefusedError(f"the request cannot be written as JSON: {exc}", str(request.get("op"))) from exc


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


# --------------------------------------------------------------------------
# Opening


def url_of(location: Location) -> str:
    """The store's URL as errors and ``repr`` show it: scheme, bucket (or folder) and prefix.

    Built from the parsed location, never echoed from the caller's string: a
    URL the parser accepts holds no user or password (a bucket name has no
    ``@``, a ``file://`` URL no host), so what is shown is what was opened
    and nothing secret.
    """
    if location.scheme == "file":
        return f"file://{location.bucket}"
    return f"{location.scheme}://{location.bucket}/{location.prefix}".rstrip("/")


def endpoint_of(backend: object) -> str | None:
    """Where the backend's SDK sends its requests, without any user or password; None for a folder.

    boto3 and aiobotocore say it in ``meta.endpoint_url``, google-cloud-storage
    in ``api_endpoint``: the setting the environment or ``endpoint_url=`` gave,
    or the cloud's own address.
    """
    client = getattr(backend, "client", None)
    found = getattr(getattr(client, "meta", None), "endpoint_url", None) or getattr(client, "api_endpoint", None)
    if not isinstance(found, str) or not found:
        return None
    parts = urlsplit(found)
    if "@" not in parts.netloc:
        return found
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def checked_concurrency(concurrency: object) -> None:
    """``concurrency`` is an ``int`` of at least 1; ``ArgumentError`` naming it otherwise."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise ArgumentError(f"concurrency must be an int (how many calls run at once, at least 1), "
                            f"not {type(concurrency).__name__}")
    if concurrency < 1:
        raise ArgumentError(f"concurrency must be at least 1, not {concurrency}")


def checked_keywords(create: object, endpoint_url: object, region_name: object, concurrency: object) -> None:
    """``open``'s keywords, each of its type and in its range; ``ArgumentError`` naming the keyword otherwise.

    Checked before anything is opened: a program's mistake (``concurrency="8"``
    read from a config file) is said at the call that made it, not met as a
    comparison of a ``str`` and an ``int`` deep inside the pool.
    """
    if not isinstance(create, bool):
        raise ArgumentError(f"create must be True or False, not {type(create).__name__}")
    for name, value in (("endpoint_url", endpoint_url), ("region_name", region_name)):
        if value is not None and not (isinstance(value, str) and value):
            raise ArgumentError(f"{name} must be a non-empty string or None, not {value!r}"
                                if isinstance(value, str) else
                                f"{name} must be a non-empty string or None, not {type(value).__name__}")
    checked_concurrency(concurrency)


def location_of(url: str) -> Location:
    """The parsed URL, as the drivers parse their setting; LocationError saying what is wrong."""
    from ..settings import SettingError, parse_location

    if not isinstance(url, str):
        raise LocationError(f"the store URL must be a string, not {type(url).__name__}")
    try:
        return parse_location("the store URL", url, ("file", "s3", "gs"))
    except SettingError as exc:
        raise LocationError(str(exc)) from exc


def s3_client_args(location: Location, endpoint_url: str | None, region_name: str | None) -> dict[str, str]:
    """The keyword overrides of an S3 client; refused for the schemes they do not apply to."""
    args = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region_name)) if v is not None}
    if args and location.scheme != "s3":
        raise LocationError(f"{' and '.join(args)} apply to s3:// stores only")
    return args


def check_create(location: Location, create: bool) -> None:
    """``create=True`` is for folders: refused for a bucket (``ArgumentError``), which no driver makes either."""
    if create and location.scheme != "file":
        raise ArgumentError(f"create=True applies to file:// stores only: buckets are never made ({url_of(location)})")


def opening_failed(exc: Exception, location: Location) -> LocationError:
    """An SDK or folder failure while opening, said as the driver says it (its kind, not its detail), with the
    URL the caller passed (``url_of``: never a credential), which a program opening several stores needs."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return LocationError(f"the store URL {url_of(location)} names a store that cannot be opened: {why}")


def open_sync_backend(location: Location, client_args: Mapping[str, str], create: bool = False) -> Backend:
    """The drivers' own backend for ``location`` (settings.open_backend), the S3 client overridden if asked.

    A ``file://`` folder that does not exist is refused as the drivers refuse
    it (``StoreNotFoundError``), unless ``create``: then it is made, mode
    0700, with any folders above it.  ``create`` applies to folders only:
    buckets are never made.
    """
    from ..settings import open_backend

    url = url_of(location)
    if location.scheme == "file" and not create and not os.path.lexists(location.bucket):
        raise StoreNotFoundError(f"the store URL {url} names a folder that does not exist: it is not made (make "
                                 "it first, mkdir -p, or pass create=True; or correct the URL)")
    try:
        if location.scheme == "s3" and client_args:
            from ..s3 import S3Backend, make_client

            return S3Backend(location.bucket, client=make_client(client_args=client_args))
        return open_backend(location, create=create, setting=f"the store URL {url}")
    except SettingError as exc:  # a folder another user controls (local.py): its words name the rule
        raise LocationError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a folder that cannot be made, an SDK that finds no credentials
        raise opening_failed(exc, location) from exc


def close_backend(backend: Backend) -> None:
    """Close the SDK client's connections, where the SDK has a way to (boto3 and google-cloud-storage do)."""
    close = getattr(getattr(backend, "client", None), "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing is best effort; nothing is lost
            pass


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
    location = location_of(url)
    check_create(location, create)
    backend = open_sync_backend(location, s3_client_args(location, endpoint_url, region_name), create)
    return Store(Engine(backend, location, concurrency, on_close=lambda: close_backend(backend)))


def store_repr(store: object, engine: Engine) -> str:
    """``<Store s3://bucket/prefix endpoint=http://... concurrency=8>``: which store a program holds, and
    whether it is closed; never a credential (``url_of``, ``endpoint_of``)."""
    at = f" endpoint={engine.endpoint}" if engine.endpoint else ""
    state = " closed" if engine.closed else ""
    return f"<{type(store).__name__} {engine.url}{at} concurrency={engine.concurrency}{state}>"


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

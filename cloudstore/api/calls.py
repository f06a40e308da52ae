"""One op of the Python API: the request docs/protocol.md shows, and how its reply becomes a value.

Both flavours (``cloudstore.api`` and ``cloudstore.aio``) build their calls
here (``ops``), so a request and the reading of its reply are written once;
a flavour only decides where ``Engine.answer`` runs.  ``who`` and ``encode``
refuse, before anything is sent, what no driver could be sent.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..errors import CloudstoreError, RefusedError
from .values import Appended, File, FileWrite, Job, JobDay, Json, Lease, Place, ThreadInfo, Took

T = TypeVar("T")


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

"""What the ops of the Python API answer: one frozen value (or enum) per kind of reply.

Kept apart from the calls that make them (``calls``) and the engine that
answers those (``engine``), so a program that only types its own functions
with ``Job`` or ``Appended`` imports nothing of the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

Json = Any

#: Where a job is kept (docs/protocol.md): anything else is refused.
Place = Literal["waiting", "firing", "ending"]


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

"""The store's format record: which layout a store holds, and which drivers may read and write it.

A store lives for years.  Its drivers are upgraded one machine at a time,
sometimes rolled back, and every release may change what it stores.  So the
store says what it needs, in one object at its root, ``_format`` (Delta
Lake's protocol action is the model): the least *reader* version a driver
must have to read anything in it correctly, the least *writer* version to
write it, and named features beyond those numbers a driver must know::

    {"reader": 3, "writer": 3, "features": [], "by": "cloudstore 0.6.0"}

A driver whose format is below ``reader`` (or that lacks a named feature)
refuses every op; below ``writer``, it answers reads and refuses writes.
Each refusal names both versions and what to do, and changes nothing.

Store formats, by the release that first wrote each (CHANGELOG.md):

====== ========= ===========================================================
format release   what it added
====== ========= ===========================================================
1      0.3.0     conversations oldest first (``e<epoch>/ev/<seq>``), one job
                 mark, file keys ``f/<path>``
2      0.4.0     conversations newest first (``d<~epoch>/<~seq>``), packing
                 hints in heads
3      0.5.0     file keys ending ``%`` (and hashed ``f/~/``), the file
                 ledger, 128 mark shards, the claim index
4      0.6.0     this record and the server probe objects (``_probe/``);
                 nothing a format-3 driver misreads: records say reader 3
5      0.7.0     a lease's ``started`` is its fence: each take that gives it
                 to a holder writes max(now, the one before + 1), and an
                 ended lease keeps it (heads.py); format-3 and -4 drivers
                 read such heads as before and their writes only drop it,
                 which the next take's "now" covers: records say reader 3
6      0.8.0     tails: a reader packs the single events after the last
                 block of 32 at ``p<epoch>/<b>.0`` (packing.py), a name
                 every release since 0.4.0 parses as a segment of the
                 epoch (purged, collected and copied with its blocks) and
                 none reads: records say reader 3
====== ========= ===========================================================

A store with no record holds the legacy layouts (1 to 3, possibly mixed),
which every driver of this release reads.  A record is written (create if
absent) before the first write a process of this release makes, so no
store reaches a layout above the legacy ones without saying so; a record
asking less than this release writes is raised first (``needed``).  Drivers
of releases before 0.6.0 know no record: docs/admin.md, "Upgrading and
rolling back", says what each may and may not meet.

Everything read here is untrusted: a record another credential holder wrote
may be any bytes.  One that is not a record of this shape is refused as
malformed (every op answers so) rather than guessed at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__

#: The object at the store's root holding the record.
KEY = "_format"
#: The store format this release writes.
FORMAT = 6
#: The least store format this release reads (the legacy layouts included).
READS_FROM = 1
#: Named features this release knows (none yet: every change so far raised the numbers).
KNOWN_FEATURES: frozenset[str] = frozenset()
#: What this release's own writes need of a reader and a writer: format-3 drivers read and write formats 4 to 6.
NEEDS_READER = 3
NEEDS_WRITER = 3

RECORD_MAX = 64 * 1024  # bytes of a record read at all
_VERSION_MAX = 1_000_000
_FEATURE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_BY_MAX = 200


class MalformedRecord(ValueError):
    """The bytes at ``_format`` are not a format record."""


@dataclass(frozen=True)
class Record:
    """A format record as read (or as this release writes one)."""

    reader: int
    writer: int
    features: tuple[str, ...] = ()
    by: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # fields a later release added, kept

    def body(self) -> bytes:
        """The record's JSON, fields a later release added kept as they were."""
        fields = {**self.extra, "reader": self.reader, "writer": self.writer,
                  "features": list(self.features), "by": self.by}
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")

    def wire(self) -> dict[str, Any]:
        """The record as ``inspect`` and ``format`` show it."""
        return {"reader": self.reader, "writer": self.writer, "features": list(self.features), "by": self.by}


def release_name() -> str:
    """This release as records and errors name it."""
    return f"cloudstore {__version__}"


def ours() -> Record:
    """The record this release writes on a store that has none."""
    return Record(NEEDS_READER, NEEDS_WRITER, (), release_name())


def _shown(text: str) -> str:
    """A string from the store, fit to be shown: printable ASCII, bounded."""
    kept = "".join(c if c.isascii() and c.isprintable() else "?" for c in text[:_BY_MAX])
    return kept + ("..." if len(text) > _BY_MAX else "")


def parse(payload: bytes) -> Record:
    """The record ``payload`` holds; ``MalformedRecord`` naming the first rule it breaks."""
    if len(payload) > RECORD_MAX:
        raise MalformedRecord(f"it is over {RECORD_MAX} bytes")
    try:
        value = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedRecord("it is not JSON") from None
    if not isinstance(value, dict):
        raise MalformedRecord("it is not a JSON object")
    numbers = []
    for name in ("reader", "writer"):
        number = value.get(name)
        if type(number) is not int or not 1 <= number <= _VERSION_MAX:
            raise MalformedRecord(f"'{name}' is not a whole number from 1 to {_VERSION_MAX}")
        numbers.append(number)
    features = value.get("features", [])
    if not isinstance(features, list) or len(features) > 64 or not all(
            isinstance(f, str) and _FEATURE.match(f) for f in features):
        raise MalformedRecord("'features' is not a list of at most 64 feature names")
    by = value.get("by", "")
    if not isinstance(by, str):
        raise MalformedRecord("'by' is not a string")
    extra = {k: v for k, v in value.items() if k not in ("reader", "writer", "features", "by")}
    return Record(numbers[0], numbers[1], tuple(features), _shown(by), extra)


def supported() -> str:
    """What this release reads and writes, as ``--version`` and refusals say it."""
    return f"store format {FORMAT}; reads formats {READS_FROM} to {FORMAT}"


def _written_by(record: Record) -> str:
    return f" (its record was written by {record.by})" if record.by else ""


def read_refusal(record: Record) -> str | None:
    """Why this release must not read a store with ``record``; None when it may."""
    unknown = sorted(set(record.features) - KNOWN_FEATURES)
    if record.reader > FORMAT or unknown:
        needs = f"a reader of store format {record.reader}" + (
            f" knowing the features {', '.join(unknown)}" if unknown else "")
        return (f"this store needs {needs}{_written_by(record)}; this driver is {release_name()} "
                f"({supported()}): upgrade the driver (docs/admin.md, 'Upgrading and rolling back')")
    return None


def write_refusal(record: Record) -> str | None:
    """Why this release must not write a store with ``record``; None when it may (reads are judged apart)."""
    if record.writer > FORMAT:
        return (f"this store needs a writer of store format {record.writer}{_written_by(record)}; "
                f"this driver is {release_name()} ({supported()}): it answers reads but changes nothing: "
                "upgrade the driver (docs/admin.md, 'Upgrading and rolling back')")
    return None


def needed(record: Record | None, floor: Record | None = None) -> Record | None:
    """The record to write before this release's first write, or None when ``record`` already says enough.

    A store without a record gets ours; a record asking less than this
    release's writes need (lowered by ``lnk-store-admin format --lower``), or
    than ``floor`` (a migration's source's record), is raised to it, its
    features and any later fields kept.
    """
    least = ours() if floor is None else Record(max(floor.reader, NEEDS_READER), max(floor.writer, NEEDS_WRITER),
                                                floor.features, release_name(), floor.extra)
    if record is None:
        return least
    features = tuple(sorted(set(record.features) | set(least.features)))
    if record.reader >= least.reader and record.writer >= least.writer and features == tuple(sorted(record.features)):
        return None
    return Record(max(record.reader, least.reader), max(record.writer, least.writer), features,
                  release_name(), {**least.extra, **record.extra})

"""``migrate``: copy a whole store between any two of file://, s3://, gs://, resumably, then verify.

How it copies.  Key by key, the stored bytes as they are (the seam's frame
included: nonce and lineage travel with the object), each written with
``Create`` (only if absent), on a few threads.  A key already there is
compared byte for byte with what would be written: equal is skipped (a
resumed run), different is a conflict (overwritten only with ``--force``).
An interrupted run is resumed by running it again: every key it finished is
found equal and skipped, the rest are copied.  Nothing is ever deleted in
the destination, so a run cut anywhere loses nothing.

Do stored bodies refer to backend-specific things?  No body holds a version
(generation, ETag or nonce of another object): leases, removal records,
packing hints, files' versions and marks are the drivers' own counters and
times, in the body.  Lineage tags are nonces in the bodies themselves, so
they are the same on every backend.  But one body holds another object's
*key*: a job record's waiting place names its due-index entry by its whole
key, store prefix included (``<prefix>_due/...``).  Copied as is into a store
with another prefix, the record would name an entry that is not there, and
``job_next`` would treat the real entry as stale and delete it after a
minute: a waiting job would then never be answered again.  So job records are
translated: each ``entry`` under the source's ``_due/`` is rewritten under the
destination's, the rest of the record byte for byte, re-framed with the same
nonce and lineage (deterministic, so a resumed run still finds it equal).
Listing times are not carried (a backend sets its own): the only reader of
them is the due index's grace for entries no record names, which restarts.

Hostile records.  A job record's entry is the one key a driver deletes on a
stored object's word, so a record whose entry is not a due-index key of its
own agent's own job (a bug's, an old version's, or a machine's with bucket
credentials: one naming another agent's file, say) is not copied: it is named
as refused, and the run fails (exit 1) after copying everything else, so an
operator decides what that job should be.  Drivers refuse such a record too
(``jobs.checked``); migrate must not carry it into a store where some other
code might believe it.

The marker.  A non-empty destination is refused, unless ``--force`` or it is
a migration of the same source being resumed: the first run writes
``<dst prefix>_admin/migrate`` naming the source before copying anything, and
a run finding it (and the same source) resumes.  The marker is deleted once
the copy is verified, leaving the destination exactly a store.

The destination must not be used, and the source not written, until migrate
says the stores are equal: verification reads both through the drivers' ops
and reports every difference (exit 1).

What it logs (stderr, logger ``cloudstore.admin``; ``runtime.jsonlog``'s
schema with JSON logs): ``migrate_start`` and ``migrate_verify`` (INFO),
the copy's and the verification's progress (``progress.Progress``), each
conflict, refused object and mismatch as a WARNING of its own
(``migrate_conflict``, ``migrate_refused``, ``migrate_mismatch``), and at
the end ``migrate_verified`` (INFO) or ``migrate_failed`` (ERROR, with the
counts): an alert on ERROR sees a migration that did not verify.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..gate.store_gate import StoreGate
from ..generations import (
    Create,
    NotFound,
    Overwrite,
    PreconditionFailed,
    failpoint,
)
from ..store.model import compact
from .copying import Raw, expectation, refusal, translator
from .progress import Progress
from .verify import compare
from .walk import ADMIN_PREFIX, STORE_KINDS, WORKERS, Key, Opened, bounded, list_all, open_url, readable

#: The marker a migration writes in its destination first (below the destination's prefix).
MARKER = ADMIN_PREFIX + "migrate"
#: Tests only: the process kills itself (SIGKILL) once this many objects are done, as a crash would.
FAILPOINT = "LNK_ADMIN_FAILPOINT"


admin_log = logging.getLogger("cloudstore.admin")


def _teller(log: Callable[[str], None] | None) -> Callable[..., None]:
    """How migrate says things: ``log`` (a caller's own, the text only) or the admin log at each line's level,
    ``event`` and fields (``tell(level, event, text, **fields)``)."""
    def tell(level: int, event: str, text: str, **fields: object) -> None:
        if log is not None:
            log(text)
        else:
            admin_log.log(level, "%s", text, extra={"event": event, **fields})

    return tell


class Refused(Exception):
    """The destination is not one migrate may write into (the message says why and what to do)."""


@dataclass
class Summary:
    """What a migration did, for the report at its end."""

    source: str
    destination: str
    objects: int = 0
    copied: int = 0
    equal: int = 0
    overwritten: int = 0
    conflicts: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why each source object was not copied (``refusal``)
    vanished: int = 0
    extra: int = 0
    bytes: int = 0
    seconds: float = 0.0
    resumed: bool = False
    agents_compared: int = 0
    problems: list[str] = field(default_factory=list)
    verify_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.problems and not self.refused

    def as_dict(self) -> dict:
        rate = self.objects / self.seconds if self.seconds > 0 else 0.0
        return {
            "source": self.source, "destination": self.destination, "resumed": self.resumed,
            "objects": self.objects, "copied": self.copied, "already_equal": self.equal,
            "overwritten": self.overwritten, "conflicts": len(self.conflicts),
            "refused": len(self.refused), "vanished": self.vanished,
            "extra_in_destination": self.extra, "bytes": self.bytes, "seconds": round(self.seconds, 3),
            "objects_per_second": round(rate, 1), "verify_seconds": round(self.verify_seconds, 3),
            "agents_compared": self.agents_compared, "mismatches": len(self.problems), "ok": self.ok,
        }


def _where(opened: Opened) -> str:
    loc = opened.location
    return f"{loc.scheme}://{loc.bucket}/{loc.prefix}" if loc.scheme != "file" else f"file://{loc.bucket}/"


def _overlap(a: Opened, b: Opened) -> bool:
    """Whether one store lies inside the other (a copy would read its own output)."""
    la, lb = a.location, b.location
    if la.scheme != lb.scheme:
        return False
    if la.scheme == "file":
        pa, pb = la.bucket.rstrip("/") + "/", lb.bucket.rstrip("/") + "/"
        return pa.startswith(pb) or pb.startswith(pa)
    return la.bucket == lb.bucket and (la.prefix.startswith(lb.prefix) or lb.prefix.startswith(la.prefix))


def _carry_record(src: Opened, dst: Opened) -> None:
    """The destination's format record asks at least what the source's does (each store keeps its own:
    the destination's was written by its first write, the marker; the copy never copies records)."""
    src_gate, dst_gate = src.store.gate, dst.store.gate
    if isinstance(src_gate, StoreGate) and isinstance(dst_gate, StoreGate) and src_gate.record is not None:
        dst_gate.raise_to(src_gate.record)


def migrate(src_url: str, dst_url: str, force: bool = False, workers: int = WORKERS,
            log: Callable[[str], None] | None = None) -> Summary:
    """Copy, resume, verify: see the module docstring (``log``: each line's text to it, not to the log)."""
    tell = _teller(log)
    src, dst = open_url(src_url, "SRC"), open_url(dst_url, "DST", create=True)
    if _overlap(src, dst):
        raise Refused("the source and the destination overlap (one lies inside the other)")
    summary = Summary(_where(src), _where(dst))
    readable(src)  # a source this release must not read, or a destination it must not write, is refused
    readable(dst)
    src_keys = [k for k in list_all(src) if k.kind not in STORE_KINDS]
    dst_listed = list_all(dst)
    dst_data = [k for k in dst_listed if k.kind not in STORE_KINDS]
    marker_key = dst.root + MARKER
    marker = dst.store.get(marker_key)
    named = None
    if marker is not None:
        try:
            named = json.loads(marker.data).get("source")
        except (ValueError, AttributeError):
            named = None
    summary.resumed = named == summary.source
    if dst_data and not summary.resumed and not force:
        other = f" (a migration from {named} was under way)" if named else ""
        raise Refused(f"the destination holds {len(dst_data)} objects{other}; "
                      "use --force to copy into it anyway (nothing there is deleted; keys that differ are overwritten)")
    if not summary.resumed:
        body = compact({"source": summary.source, "started": time.time()}).encode("ascii")
        marker = dst.store.put(marker_key, body, Create() if marker is None else Overwrite())
    tell(logging.INFO, "migrate_start", f"{'resuming' if summary.resumed else 'starting'} migration of "
         f"{len(src_keys)} objects from {summary.source} to {summary.destination}",
         source=summary.source, destination=summary.destination, objects=len(src_keys), resumed=summary.resumed)

    translate = translator(src.root, dst.root)
    src_raw, dst_raw = Raw(src), Raw(dst)
    present = {k.rel for k in dst_data}
    summary.extra = len(present - {k.rel for k in src_keys})
    progress = Progress(len(src_keys), phase="copy")
    stop_after = os.environ.get(FAILPOINT, "")
    die_at = int(stop_after) if stop_after.isdigit() else None
    started = time.monotonic()

    def copy(key: Key) -> tuple[str, int, str]:
        raw = src_raw.get(key.key)
        if raw is None:
            return "vanished", 0, key.rel
        why = refusal(src.root, key, raw)
        if why is not None:
            progress.add(1, 0)
            return "refused", 0, why
        want = translate(key, raw)
        target = dst.root + key.rel
        if key.rel not in present and dst_raw.create(target, want):
            outcome = "copied"
        else:
            got = dst_raw.get(target)
            if got is None and dst_raw.create(target, want):
                outcome = "copied"
            elif got == want:
                outcome = "equal"
            elif force:
                dst_raw.overwrite(target, want)
                outcome = "overwritten"
            else:
                outcome = "conflict"
        done = progress.add(1, len(want) if outcome in ("copied", "overwritten") else 0)
        if die_at is not None and done >= die_at:
            failpoint()
        return outcome, len(want), key.rel

    for outcome, size, rel in bounded(copy, src_keys, workers):
        summary.objects += 1
        if outcome == "copied":
            summary.copied += 1
            summary.bytes += size
        elif outcome == "overwritten":
            summary.overwritten += 1
            summary.bytes += size
        elif outcome == "equal":
            summary.equal += 1
        elif outcome == "vanished":
            summary.vanished += 1
        elif outcome == "refused":
            summary.refused.append(rel)
        else:
            summary.conflicts.append(rel)
    progress.close()
    summary.seconds = time.monotonic() - started
    for rel in summary.conflicts:
        tell(logging.WARNING, "migrate_conflict", f"conflict: {rel} differs in the destination (kept; --force "
             "overwrites)", key=rel)
    for why in summary.refused:
        tell(logging.WARNING, "migrate_refused", f"refused: {why}")

    _carry_record(src, dst)
    tell(logging.INFO, "migrate_verify", "verifying through the drivers' ops on both sides")
    began = time.monotonic()
    expected = expectation(src, dst, src_keys)
    after = [k for k in list_all(dst) if k.kind not in STORE_KINDS]
    summary.problems, summary.agents_compared = compare(src, dst, src_keys, after, expected, copied=True)
    summary.verify_seconds = time.monotonic() - began
    for problem in summary.problems:
        tell(logging.WARNING, "migrate_mismatch", f"mismatch: {problem}")
    _conclude(tell, summary)
    if summary.ok and marker is not None and marker.version is not None:
        try:
            dst.store.delete(marker_key, marker.version)
        except (PreconditionFailed, NotFound):
            pass  # another run's marker now, or gone: not ours to delete
    elif summary.ok:
        current = dst.store.get(marker_key)
        if current is not None and current.version is not None:
            try:
                dst.store.delete(marker_key, current.version)
            except (PreconditionFailed, NotFound):
                pass
    return summary


def _conclude(tell: Callable[..., None], summary: Summary) -> None:
    """The run's verdict in the log: one ERROR line when it failed (what an alert on ERROR is to catch)."""
    counts = {"conflicts": len(summary.conflicts), "refused": len(summary.refused),
              "mismatches": len(summary.problems)}
    if summary.ok:
        tell(logging.INFO, "migrate_verified", f"verified: {summary.agents_compared} agents equal on both sides",
             agents=summary.agents_compared)
        return
    said = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    tell(logging.ERROR, "migrate_failed", f"the migration failed: {said} (the destination is not a copy of the "
         "source; see the lines above)", **counts)


def text(summary: Summary) -> str:
    """The summary for people."""
    d = summary.as_dict()
    lines = [
        f"migrated {d['source']} -> {d['destination']}{' (resumed)' if d['resumed'] else ''}",
        f"objects {d['objects']}: copied {d['copied']}, already there {d['already_equal']}, "
        f"overwritten {d['overwritten']}, conflicts {d['conflicts']}, vanished {d['vanished']}; "
        f"{d['extra_in_destination']} other objects in the destination left alone",
        f"{d['bytes']} bytes in {d['seconds']} s: {d['objects_per_second']} objects/s",
        f"verified {d['agents_compared']} agents in {d['verify_seconds']} s: "
        + ("equal" if not d["mismatches"] else f"{d['mismatches']} MISMATCHES"),
    ]
    if d["conflicts"]:
        lines.append("FAILED: conflicting objects in the destination")
    if summary.refused:
        lines.append(f"FAILED: {len(summary.refused)} objects refused, not copied:")
        lines.extend(f"  {why}" for why in summary.refused)
    return "\n".join(lines)

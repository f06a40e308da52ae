"""Snapshots: a driver's counters carried to the exporter of the process that started it.

A driver is a process of its own (the bridge's and the scheduler's ``serve``
processes), and the exporter is another.  When ``LNK_METRICS_DIR`` is set, a
driver writes its registry as JSON to ``<dir>/<program>-<pid>-<token>.json``
after each request that changed it (``SnapshotWriter``), written to a
temporary file and renamed, so a reader never sees half of one.  The token
keeps a reused pid from overwriting a dead process's file.

The exporter (``Collector``) sums its own registry, the families its
program makes per scrape (``extra``, ``process``) and every snapshot in its
folder.  Snapshots of processes that have exited are folded into one
``archive.json`` there (and removed), so the folder stays small and the sums
never go down while the exporter lives.  A histogram is carried and folded
as its counters are: each bucket's count, the sum and (their total) the
count add up across processes, so the exporter's histogram is the one all
its drivers would have made together.

The file is ``{"families": {name: {"help", "samples": [[labels, n], ...]}},
"histograms": {name: {"help", "bounds", "samples": [[labels, counts,
sum], ...]}}}``; a reader of a release before histograms reads the
counters and passes over ``histograms``, and this one reads a snapshot
without it.

Why not ``prometheus_client``'s multiprocess mode: it keeps each process's
values in mmap files under ``PROMETHEUS_MULTIPROC_DIR``, which must be set
before the library is imported in every process, and
``mark_process_dead`` removes only live gauges' files, so the counters of
every driver that ever ran stay as files, read at every scrape.  Here a dead
driver's counts are folded into one archive at the next scrape, and a
driver imports nothing but the standard library to write its file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from . import REGISTRY, AnyFamily, Family, HistogramFamily, Observed, Registry
from .exposition import render

log = logging.getLogger("cloudstore.runtime.metrics")

#: The folder a driver writes its snapshot into (set by the bridge and the scheduler for their drivers).
METRICS_DIR = "LNK_METRICS_DIR"
ARCHIVE = "archive.json"


def snapshot_json(registry: Registry = REGISTRY) -> dict[str, Any]:
    """The registry as the JSON a snapshot file holds."""
    return _families_json(registry.families())


def _families_json(families: Mapping[str, AnyFamily]) -> dict[str, Any]:
    """Families as a snapshot (or the archive) holds them: counters under ``families``, histograms apart."""
    counters, histograms = {}, {}
    for f in families.values():
        if isinstance(f, HistogramFamily):
            histograms[f.name] = {"help": f.help, "bounds": list(f.bounds), "samples": [
                [dict(labels), seen.counts, seen.sum] for labels, seen in f.series.items()]}
        else:
            counters[f.name] = {"help": f.help, "samples": [[dict(labels), n] for labels, n in f.samples.items()]}
    return {"families": counters, "histograms": histograms}


def _number(n: Any) -> bool:
    return isinstance(n, int | float) and not isinstance(n, bool)


def _finite(n: Any) -> bool:
    """A number a histogram's bound or sum may be: ``json`` reads ``NaN`` and ``Infinity`` too."""
    return _number(n) and math.isfinite(n)


def _families_from_json(value: Any) -> dict[str, AnyFamily]:
    """The families a snapshot or archive holds; ValueError when it is not one."""
    out: dict[str, AnyFamily] = {}
    if not isinstance(value, dict) or not isinstance(value.get("families"), dict):
        raise ValueError("not a metrics snapshot")
    for name, fam in value["families"].items():
        family = Family(name, str(fam.get("help", "")))
        out[name] = family
        for labels, n in fam["samples"]:
            if not isinstance(labels, dict) or not _number(n):
                raise ValueError(f"a sample of {name} is malformed")
            family.add(tuple((str(k), str(v)) for k, v in labels.items()), n)
    histograms = value.get("histograms", {})  # absent from the snapshots of a release before histograms
    if not isinstance(histograms, dict):
        raise ValueError("not a metrics snapshot")
    for name, fam in histograms.items():
        bounds = fam["bounds"]
        if name in out or not isinstance(bounds, list) or not bounds or not all(map(_finite, bounds)) \
                or bounds != sorted(set(bounds)):
            raise ValueError(f"the histogram {name} is malformed")
        hist = HistogramFamily(name, str(fam.get("help", "")), tuple(float(b) for b in bounds))
        out[name] = hist
        for labels, counts, total in fam["samples"]:
            if not isinstance(labels, dict) or not isinstance(counts, list) or len(counts) != len(bounds) + 1 \
                    or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) \
                    or not _finite(total):
                raise ValueError(f"a sample of {name} is malformed")
            hist.add(tuple((str(k), str(v)) for k, v in labels.items()), Observed(counts, float(total)))
    return out


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: readers see the old or the new whole."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)


class SnapshotWriter:
    """Writes this process's counters to its snapshot file when they changed since the last write."""

    def __init__(self, folder: str, program: str, registry: Registry = REGISTRY) -> None:
        self.registry = registry
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", program)
        self.path = os.path.join(folder, f"{safe}-{os.getpid()}-{os.urandom(4).hex()}.json")
        self._written = -1
        self._failed = False

    def flush(self) -> None:
        """Write the snapshot if anything was counted since; a failure is logged once, never raised."""
        generation = self.registry.generation
        if generation == self._written:
            return
        try:
            write_atomically(self.path, json.dumps(snapshot_json(self.registry), separators=(",", ":")))
        except OSError as exc:
            if not self._failed:
                log.warning("cannot write metrics to %s: %s", self.path, exc)
                self._failed = True
            return
        self._written = generation


def snapshot_writer(program: str, environ: Mapping[str, str] = os.environ) -> SnapshotWriter | None:
    """The writer ``LNK_METRICS_DIR`` asks for, or None when it is not set."""
    folder = environ.get(METRICS_DIR)
    return SnapshotWriter(folder, program) if folder else None


# --------------------------------------------------------------------------
# The exporter's side: its registry plus every snapshot in its folder

_SNAPSHOT_NAME = re.compile(r"^[A-Za-z0-9_.-]+-(\d+)-[0-9a-f]{8}\.json$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_unmerged: set[str] = set()  # names already logged as not merged


def merge(into: dict[str, AnyFamily], more: Mapping[str, AnyFamily]) -> None:
    """Add ``more``'s samples to ``into``'s, family by family (a histogram's buckets, sum and count alike).

    A histogram whose bounds differ from those ``into`` holds under its name
    (a driver of another release), or a name that is a histogram on one side
    only, cannot be added up: it is left out, and logged once.
    """
    for name, fam in more.items():
        target = into.get(name)
        if isinstance(fam, HistogramFamily):
            if target is None:
                target = into[name] = HistogramFamily(name, fam.help, fam.bounds)
            if isinstance(target, HistogramFamily) and target.bounds == fam.bounds:
                for labels, seen in fam.series.items():
                    target.add(labels, seen)
                continue
        else:
            if target is None:
                target = into[name] = Family(name, fam.help, kind=fam.kind)
            if isinstance(target, Family):
                for labels, n in fam.samples.items():
                    target.add(labels, n)
                continue
        if name not in _unmerged:
            _unmerged.add(name)
            log.warning("metrics: %s differs between processes (kind or buckets); one of them is left out", name)


class Collector:
    """Sums this process's registry and the snapshots of ``folder`` (the drivers it started).

    Snapshots of processes that have exited are folded into ``archive.json``
    (which remembers the names it folded until they are gone, so a crash
    between writing the archive and removing a snapshot never counts it twice).
    """

    def __init__(self, folder: str | None, registry: Registry = REGISTRY,
                 extra: Callable[[], Mapping[str, AnyFamily]] | None = None,
                 process: Callable[[], Mapping[str, AnyFamily]] | None = None,
                 own: tuple[str, ...] | None = None) -> None:
        self.folder = folder
        self.registry = registry
        self.extra = extra  # the program's families made per scrape (the scheduler's requests and reach)
        self.process = process  # what describes the exporting process itself (process.py), made per scrape
        #: The name prefixes of the registry's and the snapshots' families this program exports (None: all).
        self.own = own
        self._lock = threading.Lock()

    def families(self) -> dict[str, AnyFamily]:
        """What one scrape shows: the program's own families of the registry and its drivers' snapshots,
        what the process says of itself, and the program's families made per scrape.

        The registry holds every family of every module the process imported,
        and a scheduler with an agent behind a bridge imports the bridge's
        client, and with it the bridge's counter: ``own`` keeps such a
        family, which the program never counts in, out of its export.
        """
        out = self._owned(self.registry.families())
        if self.process is not None:
            merge(out, self.process())
        if self.extra is not None:
            merge(out, self.extra())
        if self.folder is not None:
            with self._lock:
                merge(out, self._owned(self._folder()))
        return out

    def _owned(self, families: dict[str, AnyFamily]) -> dict[str, AnyFamily]:
        if self.own is None:
            return families
        return {name: family for name, family in families.items() if name.startswith(self.own)}

    def render(self) -> str:
        return render(self.families())

    def _folder(self) -> dict[str, AnyFamily]:
        assert self.folder is not None
        archive_path = os.path.join(self.folder, ARCHIVE)
        archive, folded = self._read_archive(archive_path)
        try:
            names = sorted(os.listdir(self.folder))
        except OSError as exc:
            log.warning("cannot list the metrics folder %s: %s", self.folder, exc)
            return archive
        present = set(names)
        changed = not folded <= present  # names folded and since removed: forget them
        folded &= present
        live: dict[str, AnyFamily] = {}
        for name in names:
            match = _SNAPSHOT_NAME.match(name)
            if match is None:
                continue
            path = os.path.join(self.folder, name)
            if name in folded:  # folded before a crash kept us from removing it
                _remove(path)
                folded.discard(name)
                changed = True
                continue
            dead = not _alive(int(match.group(1)))  # judged before reading: its last write is then in
            try:
                with open(path, encoding="utf-8") as f:
                    families = _families_from_json(json.load(f))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.debug("skipping metrics snapshot %s: %s", name, exc)
                continue
            if dead:
                merge(archive, families)
                folded.add(name)
                changed = True
            else:
                merge(live, families)
        if changed:
            try:
                write_atomically(archive_path, json.dumps(
                    {**_families_json(archive), "folded": sorted(folded)}, separators=(",", ":")))
            except OSError as exc:
                log.warning("cannot write %s: %s", archive_path, exc)
                merge(archive, live)
                return archive
            for name in folded:
                _remove(os.path.join(self.folder, name))
        merge(archive, live)
        return archive

    @staticmethod
    def _read_archive(path: str) -> tuple[dict[str, AnyFamily], set[str]]:
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
            return _families_from_json(value), {str(n) for n in value.get("folded", [])}
        except FileNotFoundError:
            return {}, set()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring an unreadable metrics archive %s: %s", path, exc)
            return {}, set()


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)

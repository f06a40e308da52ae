"""Counters of this process, their export in the Prometheus text format, and their way between processes.

Why in-house: what is counted is a handful of monotonic counters with a few
labels, and the drivers must start in about 0.1 s without a new dependency;
the Prometheus text exposition format is a few lines to write.  This module
imports only the standard library (and ``http.server`` only when serving).

Three parts:

* **The registry** (``counter``, ``Counter.inc``): process-wide, thread-safe,
  keyed by metric name and label values.  ``inc`` is a dict update under a
  lock, cheap enough for every backend request.  The wire op being answered
  is kept in a context variable (``op_scope``), so the seam counts requests
  by op without being told; a request made outside any op counts as op "".
* **Snapshots** (``SnapshotWriter``): a driver is a separate process (the
  bridge's and the scheduler's ``serve`` processes).  When ``LNK_METRICS_DIR``
  is set, a driver writes its counters as JSON to
  ``<dir>/<program>-<pid>-<token>.json`` after each request that changed
  them, written to a temporary file and renamed, so a reader never sees half
  of one.  The token keeps a reused pid from overwriting a dead process's file.
* **The exporter** (``Collector``, ``Exporter``): the bridge and the scheduler
  sum their own registry and every snapshot in their folder, and serve the
  sum on ``GET /metrics`` or rewrite it to a file.  Snapshots of processes
  that have exited are folded into one ``archive.json`` there (and removed),
  so the folder stays small and the sums never go down while the exporter lives.

Every counter is a ``*_total`` counter: Prometheus handles the reset when the
exporter restarts (it starts a new folder).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

log = logging.getLogger("cloudstore.metrics")

#: The folder a driver writes its snapshot into (set by the bridge and the scheduler for their drivers).
METRICS_DIR = "LNK_METRICS_DIR"
ARCHIVE = "archive.json"

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs, in the family's label order
Samples = dict[Labels, float]


class Family:
    """One metric's name, help text and samples (what the exporter merges and renders)."""

    __slots__ = ("name", "help", "samples")

    def __init__(self, name: str, help: str, samples: Samples | None = None) -> None:
        self.name = name
        self.help = help
        self.samples: Samples = samples if samples is not None else {}

    def add(self, labels: Labels, value: float) -> None:
        self.samples[labels] = self.samples.get(labels, 0) + value


class Registry:
    """The counters of one process.  ``generation`` grows with every change (snapshots skip when unchanged)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.generation = 0
        self.counters: dict[str, Counter] = {}

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        """The counter ``name``, made on first use; the same labels every time."""
        with self.lock:
            found = self.counters.get(name)
            if found is None:
                found = self.counters[name] = Counter(self, name, help, labels)
            elif found.labels != labels:
                raise ValueError(f"metric {name} has labels {found.labels}, not {labels}")
            return found

    def families(self) -> dict[str, Family]:
        """A copy of every counter, as families."""
        with self.lock:
            return {
                name: Family(name, c.help, {tuple(zip(c.labels, vals, strict=True)): n for vals, n in c.values.items()})
                for name, c in self.counters.items()
            }


class Counter:
    """A monotonic counter with fixed label names; ``inc(*label_values)``."""

    __slots__ = ("registry", "name", "help", "labels", "values")

    def __init__(self, registry: Registry, name: str, help: str, labels: tuple[str, ...]) -> None:
        if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
            raise ValueError(f"not a metric name: {name!r}")
        self.registry = registry
        self.name = name
        self.help = help
        self.labels = labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *label_values: str, by: float = 1) -> None:
        """Add ``by`` (at least 0) to the sample of these label values, in the order of ``labels``.

        Label values must come from a bounded set (op names checked against
        the table of ops, never a caller's raw string): each one is kept for
        the life of the process.
        """
        if len(label_values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}")
        registry = self.registry
        with registry.lock:
            self.values[label_values] = self.values.get(label_values, 0) + by
            registry.generation += 1

    def value(self, *label_values: str) -> float:
        """The current count (0 when never counted): for tests and logs."""
        with self.registry.lock:
            return self.values.get(label_values, 0)


REGISTRY = Registry()


def counter(name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
    """A counter of this process's registry."""
    return REGISTRY.counter(name, help, labels)


# --------------------------------------------------------------------------
# What the store drivers count (backend: gcs, s3 or file; op: the wire op being answered)

REQUESTS = counter(
    "lnk_store_requests_total",
    "Backend (bucket or folder) requests made, by the wire op being answered (op \"\" outside any op).",
    ("backend", "op"),
)
RETRIES = counter(
    "lnk_store_retries_total",
    "Backend requests tried again after a transient failure (timeout, 429, 5xx, reset).",
    ("backend", "op"),
)
THROTTLED = counter(
    "lnk_store_throttled_total",
    "Backend requests the store refused for its rate (GCS 429 rateLimitExceeded, S3 503 SlowDown), "
    "each retried until the op's deadline; nothing was applied.",
    ("backend", "op"),
)
OUTCOME_UNKNOWN = counter(
    "lnk_store_outcome_unknown_total",
    "Error replies saying outcome unknown: a write of the op may or may not have landed.",
    ("backend", "op"),
)
CAS_LOST = counter(
    "lnk_store_cas_lost_total",
    "Conditional writes of a compare-and-set loop that lost their round to another write (read again, retried).",
    ("backend", "op"),
)
REPLIES = counter(
    "lnk_store_replies_total",
    "Replies answered, by reply kind (error included); backend \"\" when no store could be opened.",
    ("backend", "op", "reply"),
)

_op: contextvars.ContextVar[str] = contextvars.ContextVar("lnk_metrics_op", default="")


def current_op() -> str:
    """The wire op this thread (or task) is answering, "" outside any."""
    return _op.get()


@contextlib.contextmanager
def op_scope(op: str) -> Iterator[None]:
    """Count what happens inside as done for ``op`` (a name from the table of ops, never raw input)."""
    token = _op.set(op)
    try:
        yield
    finally:
        _op.reset(token)


# --------------------------------------------------------------------------
# Snapshots: a driver's counters, for the exporter of the process that started it


def snapshot_json(registry: Registry = REGISTRY) -> dict[str, Any]:
    """The registry as the JSON a snapshot file holds."""
    return {"families": _families_json(registry.families())}


def _families_json(families: Mapping[str, Family]) -> dict[str, Any]:
    return {
        f.name: {"help": f.help, "samples": [[dict(labels), n] for labels, n in f.samples.items()]}
        for f in families.values()
    }


def _families_from_json(value: Any) -> dict[str, Family]:
    """The families a snapshot or archive holds; ValueError when it is not one."""
    out: dict[str, Family] = {}
    if not isinstance(value, dict) or not isinstance(value.get("families"), dict):
        raise ValueError("not a metrics snapshot")
    for name, fam in value["families"].items():
        family = out[name] = Family(name, str(fam.get("help", "")))
        for labels, n in fam["samples"]:
            if not isinstance(labels, dict) or not isinstance(n, int | float) or isinstance(n, bool):
                raise ValueError(f"a sample of {name} is malformed")
            family.add(tuple((str(k), str(v)) for k, v in labels.items()), n)
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


def merge(into: dict[str, Family], more: Mapping[str, Family]) -> None:
    for name, fam in more.items():
        target = into.setdefault(name, Family(name, fam.help))
        for labels, n in fam.samples.items():
            target.add(labels, n)


class Collector:
    """Sums this process's registry and the snapshots of ``folder`` (the drivers it started).

    Snapshots of processes that have exited are folded into ``archive.json``
    (which remembers the names it folded until they are gone, so a crash
    between writing the archive and removing a snapshot never counts it twice).
    """

    def __init__(self, folder: str | None, registry: Registry = REGISTRY,
                 extra: Callable[[], Mapping[str, Family]] | None = None) -> None:
        self.folder = folder
        self.registry = registry
        self.extra = extra
        self._lock = threading.Lock()

    def families(self) -> dict[str, Family]:
        out = self.registry.families()
        if self.extra is not None:
            merge(out, self.extra())
        if self.folder is not None:
            with self._lock:
                merge(out, self._folder())
        return out

    def render(self) -> str:
        return render(self.families())

    def _folder(self) -> dict[str, Family]:
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
        live: dict[str, Family] = {}
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
                    {**{"families": _families_json(archive)}, "folded": sorted(folded)}, separators=(",", ":")))
            except OSError as exc:
                log.warning("cannot write %s: %s", archive_path, exc)
                merge(archive, live)
                return archive
            for name in folded:
                _remove(os.path.join(self.folder, name))
        merge(archive, live)
        return archive

    @staticmethod
    def _read_archive(path: str) -> tuple[dict[str, Family], set[str]]:
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


# --------------------------------------------------------------------------
# The Prometheus text exposition format (version 0.0.4)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: Mapping[str, Family]) -> str:
    """Every family as ``# HELP`` / ``# TYPE`` lines and one line a sample, sorted (stable for diffs and tests)."""
    lines: list[str] = []
    for name in sorted(families):
        fam = families[name]
        lines.append(f"# HELP {name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {name} counter")
        for labels in sorted(fam.samples):
            shown = ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels)
            lines.append(f"{name}{{{shown}}} {_number(fam.samples[labels])}" if labels
                         else f"{name} {_number(fam.samples[labels])}")
    return "\n".join(lines) + "\n" if lines else ""


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[tuple[str, Labels], float]:
    """Samples of an exposition text, keyed by (name, sorted labels): for tests and for tools reading a file."""
    out: dict[tuple[str, Labels], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"not a sample line: {line!r}")
        name, inner, value = match.groups()
        labels = tuple(sorted(
            (k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for k, v in _LABEL.findall(inner or "")
        ))
        out[(name, labels)] = float(value)
    return out


def total(samples: Mapping[tuple[str, Labels], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


# --------------------------------------------------------------------------
# Serving and writing


def parse_listen(text: str | int, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (0: any free port); ValueError when neither."""
    host, sep, port = str(text).rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be PORT or HOST:PORT with a port from 0 to 65535, not {text!r}")
    return (host.strip("[]") or default_host) if sep else default_host, int(port)


class Exporter:
    """Serves ``collector``'s text on ``GET /metrics`` and / or rewrites it to a file every ``interval`` s.

    A plain ``http.server`` on a thread of its own (one more thread per
    scrape, daemons): a scrape costs the exporter a listing of the folder and
    a read of each snapshot, never a store request.  The file is written at
    ``start``, every ``interval`` and at ``stop``, atomically.
    """

    def __init__(self, collector: Collector, listen: tuple[str, int] | None = None, file: str | None = None,
                 interval: float = 5.0, owns_folder: bool = False) -> None:
        self.collector = collector
        self.owns_folder = owns_folder  # the folder is removed at stop (``export`` made it)
        self.listen = listen
        self.file = file
        self.interval = interval
        self.address: tuple[str, int] | None = None  # where it serves, once started (the real port when 0)
        self._server: Any = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._write_lock = threading.Lock()
        self._started = False

    def start(self) -> Exporter:
        self._started = True
        if self.listen is not None:
            self._serve()
        if self.file is not None:
            self.write_file()
            thread = threading.Thread(target=self._write_loop, name="metrics-file", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _serve(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        collector = self.collector

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is here")
                    return
                body = collector.render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                log.debug("metrics: " + format, *args)

        assert self.listen is not None
        server = ThreadingHTTPServer(self.listen, Handler)
        server.daemon_threads = True
        self._server = server
        host, port = server.server_address[:2]
        self.address = (str(host), int(port))
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        self._threads.append(thread)
        log.info("metrics at http://%s:%d/metrics", self.address[0], self.address[1],
                 extra={"metrics_port": self.address[1]})

    def _write_loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.write_file()

    def write_file(self) -> None:
        """Write the text to ``file`` now; a failure is logged, never raised."""
        if self.file is None:
            return
        with self._write_lock:
            try:
                write_atomically(self.file, self.collector.render())
            except OSError as exc:
                log.warning("cannot write metrics to %s: %s", self.file, exc)

    def stop(self) -> None:
        """Stop serving, and write the file a last time."""
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._started:
            self.write_file()
        if self.owns_folder and self.collector.folder is not None:
            import shutil

            shutil.rmtree(self.collector.folder, ignore_errors=True)

    @property
    def driver_env(self) -> dict[str, str]:
        """What the drivers this process starts need in their environment to be counted here."""
        return {METRICS_DIR: self.collector.folder} if self.collector.folder else {}


def export(listen: str | int | None, file: str | None, interval: float = 5.0,
           extra: Callable[[], Mapping[str, Family]] | None = None) -> Exporter | None:
    """The exporter a program's ``--metrics-port`` / ``--metrics-file`` ask for (None when neither), not started.

    Its drivers' snapshots go to a new private folder (mode 0700), removed at
    ``stop``: the counts live as long as the exporter, as Prometheus expects
    of a process's counters.  ValueError for a malformed ``listen``.
    """
    if listen is None and file is None:
        return None
    address = None if listen is None else parse_listen(listen)
    import tempfile

    folder = tempfile.mkdtemp(prefix="lnk-metrics-")
    return Exporter(Collector(folder, extra=extra), address, file, interval, owns_folder=True)

"""The scheduler's log: one JSON object a line, on stderr or in a file of its own; nothing on stdout.

Each event is a line of the one schema every program writes
(``runtime.jsonlog``): ``time`` (UTC, ms: it replaced the float ``at`` of
0.7 and before, so a scheduler's line and its bridge's sort and join by
the same key), ``level`` (``LEVELS``: INFO unless the event says something
went wrong), ``logger`` ``cloudstore.scheduler``, ``program``
``lnk-cloud-scheduler``, ``event`` (``fired``, ``store_error``, ...),
``message`` (the event's name: the scheduler's events are their fields),
then the event's own fields, as before.

One writer for every thread (main loop, lease renewer, fire workers), so lines
never interleave; each line is written whole in one ``write`` and flushed, so a
supervisor or a test reading the stream sees complete events even if the
runner is killed.

Where it goes: stderr by default, which a supervisor keeps (journald under
the systemd unit, the container runtime under Kubernetes: each rotates and
bounds it, docs/scheduler.md "Logs").  With ``log_file`` (``to_file``) the
runner's own lines go to that file instead, rotated by size as
``logging.handlers.RotatingFileHandler`` does: before a line that would take
the file past ``max_bytes`` it is renamed ``FILE.1`` (``FILE.1`` to
``FILE.2``, and so on; the oldest past ``backups`` is deleted) and a new one
begun.  So the files never hold more than ``(backups + 1) x max_bytes``, a
line is never split between two files, and what is lost is only the oldest
file's lines, whole.  A line that alone is longer than ``max_bytes`` is
written alone into a fresh file.  The fire commands' output and the
runner's drivers' lines are written by those processes to the descriptor
they inherited (stderr) and stay there.

A ``fired`` line is about 240 bytes plus the lengths of the owner, agent id,
job id and runner id (docs/scheduler.md).

Every event is also counted (``lnk_scheduler_events_total{event}``), so the
runner's metrics export has one counter per kind of line of this log
without any other part of the scheduler knowing of metrics; but for the
lines in ``NOT_COUNTED``, which say what the runner is (its start, its stop,
where its metrics are, a setting below the recommended) rather than what
happened to its jobs and stores: a counter of starts would count each
process once, which ``process_start_time_seconds`` already says.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from ..runtime.jsonlog import entry
from ..runtime.metrics import counter

#: Who the lines say wrote them (``program``, ``logger`` of the schema).
PROGRAM = "lnk-cloud-scheduler"
LOGGER = "cloudstore.scheduler"
#: Events that say something went wrong, by level; every other event is INFO.  A ``fired`` whose command
#: was killed or could not start is a WARNING (``level_of``).  An operator alerting on WARNING sees these.
LEVELS = {
    **dict.fromkeys(("claim_failed", "finish_retry", "finish_later", "finish_not_ours", "lapse_below_recommended",
                     "lease_end_failed", "lease_renew_failed", "not_started", "paused", "renew_slow",
                     "store_error", "store_unreachable", "wake_refused"), "WARNING"),
    **dict.fromkeys(("finish_failed", "lease_lost", "lost_job", "renewer_failed", "worker_failed",
                     "log_file_failed", "refused"), "ERROR"),
}

_lock = threading.Lock()
EVENTS = counter("lnk_scheduler_events_total", "Events of the scheduler's log (fired, claim_failed, lease_lost, "
                 "recovering, store_error, ...), by event; not its start, stop and settings lines.", ("event",))
#: The lines about the runner itself, once a process, which ``EVENTS`` does not count (the module docstring).
NOT_COUNTED = frozenset({"started", "stopped", "metrics", "lapse_below_recommended", "test_stopping", "refused"})


class RotatingFile:
    """``path``, rotated by size: at most ``max_bytes`` a file, ``backups`` old files kept (``path.1`` newest).

    Not thread-safe by itself: ``log`` writes under its lock.
    """

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        assert max_bytes > 0 and backups >= 1
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd = -1
        self._size = 0
        self._open()  # now: a file that cannot be made stops the runner at start-up (OSError)

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o640)
        self._size = os.fstat(self._fd).st_size

    def write(self, data: bytes) -> None:
        """One line (or lines) whole, in the current file or, past ``max_bytes``, a fresh one."""
        if self._size and self._size + len(data) > self.max_bytes:
            self.rotate()
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._size += written

    def rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        for n in range(self.backups - 1, 0, -1):
            older = f"{self.path}.{n}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{n + 1}")
        if os.path.exists(self.path):
            os.replace(self.path, f"{self.path}.1")
        self._open()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_file: RotatingFile | None = None


def to_file(path: str, max_bytes: int, backups: int) -> None:
    """From now on, the log's lines go to ``path``, rotated (see the module docstring); OSError when it cannot
    be opened."""
    global _file
    made = RotatingFile(path, max_bytes, backups)
    with _lock:
        old, _file = _file, made
    if old is not None:
        old.close()


def to_stderr() -> None:
    """Back to stderr (the default), the file closed."""
    global _file
    with _lock:
        old, _file = _file, None
    if old is not None:
        old.close()


def _write(line: str) -> None:
    """Write one line where the log goes; called under ``_lock``."""
    if _file is not None:
        try:
            _file.write(line.encode("utf-8", "surrogatepass"))
            return
        except OSError as exc:  # a full disk, a folder gone: the line goes to stderr rather than nowhere
            line = _line("log_file_failed", {"error": str(exc)}) + line
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # stderr closed: nothing left to tell


def level_of(event: str, fields: dict[str, Any]) -> str:
    """The level an event is logged at: ``LEVELS``, and a ``fired`` killed or not started is a WARNING."""
    if event == "fired" and (fields.get("killed") or fields.get("error")):
        return "WARNING"
    return LEVELS.get(event, "INFO")


def _line(event: str, fields: dict[str, Any], message: str | None = None) -> str:
    """One event as one line of the schema (``runtime.jsonlog.entry``), compact, newline included;
    ``message`` the event's name unless given."""
    record = entry(PROGRAM, level_of(event, fields), LOGGER, event, event if message is None else message, fields)
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"


def log(event: str, **fields: Any) -> None:
    """Write ``event`` and its ``fields`` as one line of the schema (stderr, or the log file)."""
    if event not in NOT_COUNTED:
        EVENTS.inc(event)
    line = _line(event, fields)
    with _lock:
        _write(line)


def refuse(reason: str) -> None:
    """A start-up refusal (a bad setting, a store no retry can fix) as one ERROR line of the schema (event
    ``refused``, ``message`` the reason), always on stderr.

    Up to 0.8 these were plain ``lnk-cloud-scheduler: REASON`` lines, the one shape of the runner's output
    a JSON log reader could not parse, and no alert on ERROR saw a runner that never started.  They go to
    stderr even with ``log_file``: the supervisor that sees the exit status (journald, the container's log)
    shows why beside it.  (A usage error is the parser's: ``jsonlog.ArgumentParser``.)
    """
    line = _line("refused", {}, reason)
    with _lock:
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


class Lines(io.TextIOBase):
    """A text stream whose whole lines go where the log goes: for the runner's Python logging handler, so its
    lines (a module's warning, an uncaught exception) share the log file and its rotation."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""

    def write(self, text: str) -> int:
        with _lock:
            self._buffer += text
            whole, newline, self._buffer = self._buffer.rpartition("\n")
            if newline:
                _write(whole + "\n")
        return len(text)

    def writable(self) -> bool:
        return True


def read_events(path: Path, name: str | None = None) -> list[dict[str, Any]]:
    """The events called ``name`` (every event when None) in a log file this module wrote.

    Other lines, such as a driver's, are skipped.

    For the tests and benchmarks that run runners as processes and judge them by their log."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                out.append(event)
    return out

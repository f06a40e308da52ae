"""Structured logs: one JSON object a line on stderr, one schema for every program of the project.

``LNK_LOG_FORMAT=json`` (or a program's ``--log-format json``) replaces the
text lines of the drivers, the bridge and the admin tool by JSON objects
a log shipper parses without a regex; the scheduler writes them always.
Every line of every program has the same keys first (``SCHEMA``)::

    {"time": "2025-01-02T03:04:05.678Z", "level": "WARNING", "logger": "cloudstore.bridge",
     "program": "lnk-store-bridge", "event": "log", "message": "busy for o/a: ...", ...}

``time`` is UTC to the millisecond in that one format; ``level`` is
Python's level name (a warning is ``WARNING`` whoever wrote it); ``event``
names the kind of line (a scheduler event such as ``fired``, an admin
tool's ``progress`` or ``migrate_mismatch``; ``log`` for a plain log
message), ``message`` says it in words (a scheduler event's message is its
name).  Then the line's own fields (``log.debug(..., extra={"op": ...})``,
a scheduler event's ``job`` or ``lateness_ms``) and, for an exception,
``exc`` (the traceback as one string).  So a filter on ``level`` catches
every program's warnings, one on ``event`` every program's kind of line.

``json.dumps`` escapes newlines, so a traceback never splits a line.  In
JSON mode the uncaught exceptions of the main thread and of other threads,
and whatever else is written to ``sys.stderr`` (a stray print, a library's
progress line: logger ``stderr``, level INFO, a record a line) go through
the same formatter, so every line the program writes on stderr parses.
In either mode Python's warnings (``warnings.warn``) and libraries' log
records (urllib3's "Connection pool is full", botocore's retries) go
through the program's one handler, in its format and at their level.
(Child processes writing to the inherited descriptor 2 are on their own:
the bridge and the scheduler set ``LNK_LOG_FORMAT`` for their drivers.)
The scheduler's events are written by ``scheduling.log`` through ``entry``,
in the same schema.

Standard library only: the drivers import this at start-up.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, NoReturn, TextIO

#: The environment variable choosing the format: ``json`` or ``text`` (the default).
FORMAT_SETTING = "LNK_LOG_FORMAT"
FORMATS = ("text", "json")

#: The keys every line begins with, whichever program wrote it (the module docstring says what each holds).
SCHEMA = ("time", "level", "logger", "program", "event", "message")
#: The ``event`` of a log record that names none (``extra={"event": ...}`` names one).
PLAIN_EVENT = "log"

# What every LogRecord carries: not the caller's own fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def wants_json(flag: str | None = None) -> bool:
    """Whether logs are to be JSON: ``flag`` when given, else ``LNK_LOG_FORMAT`` (anything but json: text)."""
    chosen = flag if flag is not None else os.environ.get(FORMAT_SETTING, "text")
    return chosen.strip().lower() == "json"


def timestamp(seconds: float) -> str:
    """``seconds`` since the epoch as every line's ``time``: ``2025-01-02T03:04:05.678Z`` (UTC, milliseconds)."""
    whole = int(seconds)
    millis = min(int((seconds - whole) * 1000 + 1e-6), 999)  # 1.678 is 1.67799...: still .678
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def entry(program: str, level: str, logger: str, event: str, message: str, fields: dict[str, Any],
          at: float | None = None) -> dict[str, Any]:
    """One line of the schema: ``SCHEMA``'s keys in order, then ``fields`` (a field never replaces them).

    The one place a line is shaped, for the log records (``JsonFormatter``) and the scheduler's
    events (``scheduling.log``) alike, so the two cannot drift apart.
    """
    out: dict[str, Any] = {"time": timestamp(time.time() if at is None else at), "level": level,
                           "logger": logger, "program": program, "event": event, "message": message}
    for key, value in fields.items():
        out.setdefault(key, value)
    return out


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line, in the schema (``entry``), with the record's extra fields."""

    def __init__(self, program: str) -> None:
        super().__init__()
        self.program = program

    def format(self, record: logging.LogRecord) -> str:
        fields = {key: value for key, value in record.__dict__.items()
                  if key not in _STANDARD and not key.startswith("_") and key != "event"}
        event = record.__dict__.get("event")
        out = entry(self.program, record.levelname, record.name, event if isinstance(event, str) else PLAIN_EVENT,
                    record.getMessage(), fields, record.created)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False, default=str)  # the scheduler's spacing


def configure(program: str, level: int | str, text_format: str, json_format: bool | None = None,
              capture_stderr: bool = True) -> None:
    """Log to stderr at ``level`` (the root logger's), as JSON or as ``text_format`` lines.

    ``json_format`` None: as ``LNK_LOG_FORMAT`` says.  Python's warnings
    become records in either mode (``logging.captureWarnings``: one format,
    not the warnings module's own two lines).  In JSON mode uncaught
    exceptions become records too, and with ``capture_stderr`` so does every
    other line written to ``sys.stderr`` (the scheduler, which writes its own
    JSON lines there, says no).  Like ``logging.basicConfig`` (which it
    calls), it does nothing when the root logger already has a handler.
    """
    as_json = wants_json() if json_format is None else json_format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(program) if as_json else logging.Formatter(text_format))
    configured = bool(logging.getLogger().handlers)
    logging.basicConfig(handlers=[handler], level=level)
    if configured:
        return
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").addFilter(_warning_line)
    if as_json:
        _route_the_rest(sys.stderr, capture_stderr)


def _warning_line(record: logging.LogRecord) -> bool:
    """A captured warning as one line, ``FILE:LINE: Category: message``: the warnings module's text adds
    the source line below it, a second line in the text format that belongs to no record."""
    lines = record.getMessage().strip().splitlines()
    record.msg, record.args = (lines[0] if lines else ""), ()
    return True


class StrayLines(io.TextIOBase):
    """Stands for ``sys.stderr`` in JSON mode: each line written to it becomes a log record (logger ``stderr``).

    The log handler keeps the real stream, so records never come back here;
    a write made while a record is being logged (a handler of a library's
    own on ``sys.stderr``) goes to the real stream as it is, never in a loop.
    """

    def __init__(self, real: TextIO) -> None:
        super().__init__()
        self.real = real
        self.logger = logging.getLogger("stderr")
        self.logger.setLevel(logging.INFO)
        self._buffer = ""
        self._lock = threading.RLock()
        self._inside = threading.local()

    def write(self, text: str) -> int:
        if getattr(self._inside, "on", False):
            return self.real.write(text)
        with self._lock:
            self._buffer += text.replace("\r", "\n")
            *lines, self._buffer = self._buffer.split("\n")
            self._inside.on = True
            try:
                for line in lines:
                    if line.strip():
                        self.logger.info("%s", line)
            finally:
                self._inside.on = False
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._buffer.strip() and not getattr(self._inside, "on", False):
                line, self._buffer = self._buffer, ""
                self.write(line + "\n")
        self.real.flush()

    def isatty(self) -> bool:
        return False  # a progress bar drawn in place would be one record per redraw

    def fileno(self) -> int:
        return self.real.fileno()  # children inherit the real descriptor

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse``'s parser, whose usage error is one ERROR record once the program's logs are JSON.

    argparse prints its usage and then ``PROG: error: ...`` on stderr and
    exits 2; in JSON mode each of those lines became a stray record at INFO
    (logger ``stderr``), or, for the scheduler (whose stderr is not captured),
    two plain lines among its JSON ones: an alert on ERROR missed a program
    that never started.  Here the error is one record at ERROR (``event``
    ``usage_error``, the usage as a field), and the exit is still 2.  In text
    mode, or before logging is set up, it is argparse's own.
    """

    def error(self, message: str) -> NoReturn:
        if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers):
            logging.getLogger(self.prog).error("%s: error: %s", self.prog, message, extra={
                "event": "usage_error", "usage": " ".join(self.format_usage().split())})
            sys.exit(2)
        super().error(message)


def _route_the_rest(real: TextIO, capture_stderr: bool) -> None:
    """Uncaught exceptions and stray writes to stderr as JSON lines too: nothing is left unparsed."""
    if capture_stderr:
        sys.stderr = StrayLines(real)
    crash = logging.getLogger("cloudstore.crash")

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        crash.critical("uncaught %s: %s", kind.__name__, exc, exc_info=(kind, exc, tb))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or issubclass(args.exc_type, SystemExit):
            return
        name = args.thread.name if args.thread is not None else "?"
        crash.critical("uncaught %s in thread %s: %s", args.exc_type.__name__, name, args.exc_value,
                       exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = hook
    threading.excepthook = thread_hook

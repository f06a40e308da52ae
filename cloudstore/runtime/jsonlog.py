"""Structured logs: one JSON object a line on stderr, for every program of the project.

``LNK_LOG_FORMAT=json`` (or a program's ``--log-format json``) replaces the
text lines of the drivers, the bridge and the admin tool by JSON objects
a log shipper parses without a regex::

    {"time": "2025-01-02T03:04:05.678Z", "level": "WARNING", "logger": "cloudstore.bridge",
     "program": "lnk-store-bridge", "message": "busy for o/a: ...", ...}

plus the record's own fields (``log.debug(..., extra={"op": ...})``) and,
for an exception, ``exc`` (the traceback as one string).  ``json.dumps``
escapes newlines, so a traceback never splits a line.  In JSON mode the
uncaught exceptions of the main thread and of other threads, Python's
warnings, and whatever else is written to ``sys.stderr`` (a stray print, a
library's progress line: logger ``stderr``, level INFO, a record a line) go
through the same formatter, so every line the program writes on stderr
parses.  (Child processes writing to the inherited descriptor 2 are on
their own: the bridge and the scheduler set ``LNK_LOG_FORMAT`` for their
drivers.)  The scheduler writes JSON lines of its own (``scheduling.log``),
whatever this setting.

Standard library only: the drivers import this at start-up.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

#: The environment variable choosing the format: ``json`` or ``text`` (the default).
FORMAT_SETTING = "LNK_LOG_FORMAT"
FORMATS = ("text", "json")

# What every LogRecord carries: not the caller's own fields.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def wants_json(flag: str | None = None) -> bool:
    """Whether logs are to be JSON: ``flag`` when given, else ``LNK_LOG_FORMAT`` (anything but json: text)."""
    chosen = flag if flag is not None else os.environ.get(FORMAT_SETTING, "text")
    return chosen.strip().lower() == "json"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line: time (UTC, ms), level, logger, program, message, extra fields."""

    def __init__(self, program: str) -> None:
        super().__init__()
        self.program = program

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "program": self.program,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(program: str, level: int | str, text_format: str, json_format: bool | None = None,
              capture_stderr: bool = True) -> None:
    """Log to stderr at ``level`` (the root logger's), as JSON or as ``text_format`` lines.

    ``json_format`` None: as ``LNK_LOG_FORMAT`` says.  In JSON mode, warnings
    and uncaught exceptions become records, and with ``capture_stderr`` so does
    every other line written to ``sys.stderr`` (the scheduler, which writes its
    own JSON lines there, says no).  Like ``logging.basicConfig`` (which it
    calls), it does nothing when the root logger already has a handler.
    """
    as_json = wants_json() if json_format is None else json_format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(program) if as_json else logging.Formatter(text_format))
    configured = bool(logging.getLogger().handlers)
    logging.basicConfig(handlers=[handler], level=level)
    if as_json and not configured:
        _route_the_rest(sys.stderr, capture_stderr)


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


def _route_the_rest(real: TextIO, capture_stderr: bool) -> None:
    """Warnings, uncaught exceptions and stray writes to stderr as JSON lines too: nothing is left unparsed."""
    logging.captureWarnings(True)
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

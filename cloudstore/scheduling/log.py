"""The scheduler's log: one JSON object a line on stderr, nothing on stdout.

One writer for every thread (main loop, lease renewer, fire workers), so lines
never interleave; each line is written and flushed whole, so a supervisor or
a test reading the stream sees complete events even if the runner is killed.

Every event is also counted (``lnk_scheduler_events_total{event}``), so the
runner's metrics export has one counter per kind of line of this log
without any other part of the scheduler knowing of metrics.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..runtime.metrics import counter

_lock = threading.Lock()
EVENTS = counter("lnk_scheduler_events_total", "Events of the scheduler's log (fired, claim_failed, lease_lost, "
                 "recovering, store_error, ...), by event.", ("event",))


def log(event: str, **fields: Any) -> None:
    """Write ``{"event": event, **fields, "at": <now>}`` as one line on stderr."""
    EVENTS.inc(event)
    record = {"event": event, **fields}
    record.setdefault("at", round(time.time(), 3))
    line = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"
    with _lock:
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # stderr closed: nothing left to tell


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

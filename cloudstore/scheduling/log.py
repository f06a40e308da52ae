"""The scheduler's log: one JSON object a line on stderr, nothing on stdout.

One writer for every thread (main loop, lease renewer, fire workers), so lines
never interleave; each line is written and flushed whole, so a supervisor or
a test reading the stream sees complete events even if the runner is killed.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

_lock = threading.Lock()


def log(event: str, **fields: Any) -> None:
    """Write ``{"event": event, **fields, "at": <now>}`` as one line on stderr."""
    record = {"event": event, **fields}
    record.setdefault("at", round(time.time(), 3))
    line = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"
    with _lock:
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # stderr closed: nothing left to tell

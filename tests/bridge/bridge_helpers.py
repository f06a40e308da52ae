"""Small helpers the bridge's tests share (imported by name: this folder is on sys.path)."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from support import wait_for as support_wait_for

from cloudstore.bridge import bridge_error_word as error_word  # noqa: F401 (shared by the tests)

FAKE_DRIVER = [sys.executable, str(Path(__file__).with_name("fake_driver.py"))]


#: The tests' one hang guard (tests/support.py), polling the bridge's state every 10 ms.
wait_for = partial(support_wait_for, every=0.01)


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True

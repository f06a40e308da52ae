"""Small helpers the bridge's tests share (imported by name: this folder is on sys.path)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudstore.bridge import bridge_error_word as error_word  # noqa: F401 (shared by the tests)

FAKE_DRIVER = [sys.executable, str(Path(__file__).with_name("fake_driver.py"))]


def wait_for(predicate: Callable[[], Any], seconds: float = 30.0, what: str = "condition") -> Any:
    """Poll until ``predicate`` is truthy; fail the test past ``seconds``.

    Used to wait for a state (a driver process gone, a request recorded),
    never to judge how fast the bridge is.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    pytest.fail(f"timed out waiting for {what}")


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True

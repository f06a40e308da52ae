"""How the bridge shares its driver places among agents, and what a driver it
stops leaves behind (issue 43): no pipe, no watch, no process."""

from __future__ import annotations

import os

from cloudstore.bridge import Limits
from cloudstore.bridge.drivers import _WATCHDOG


def open_fds() -> int:
    """Descriptors this process holds: the bridge runs in it (the rig)."""
    return len(os.listdir("/proc/self/fd"))


def test_drivers_replaced_call_after_call_leave_no_pipe_or_watch_behind(rig):
    # Five agents by turns on four places: every call stops another agent's idle
    # driver and starts its own. A long call timeout: nothing may wait for it to free.
    r = rig(agents=[("o", f"a{i}") for i in range(5)], limits=Limits(call_timeout=600.0))
    clients = [r.client(i) for i in range(5)]

    def calls(n: int) -> None:
        for k in range(n):
            assert clients[k % 5].op("last", thread="t")["reply"] == "done"

    calls(10)
    fds = open_fds()
    calls(60)
    assert len({rec["pid"] for rec in r.records()}) >= 60  # drivers really were replaced
    assert open_fds() - fds <= 4  # bounded, not one (or two) per replaced driver
    # Disarmed watches are dropped (a rebuild past COMPACT_AT), not kept until their deadline.
    assert _WATCHDOG.size() <= 2 * _WATCHDOG.COMPACT_AT + 2

"""How the bridge shares its driver places among agents, and what a driver it
stops leaves behind (issue 43): no pipe, no watch, no process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bridge_helpers import wait_for

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


@pytest.mark.parametrize("shared", [False, True], ids=["own-drivers", "shared-drivers"])
def test_an_agent_flooding_every_driver_gets_no_more_than_its_share_while_another_waits(rig, shared):
    from test_bridge_limits import run_at_once

    r = rig(agents=[("o", "flood"), ("o", "other")], limits=Limits(call_timeout=20.0, shared_drivers=shared))
    flood, other = r.client(0), r.client(1)
    results = run_at_once([lambda k=k: flood.op("last", thread=f"gate-f{k}") for k in range(8)])
    wait_for(lambda: len(r.records()) == 4 and r.bridge.slots.under_way() == 8, what="4 calls in, 4 waiting")
    late = run_at_once([lambda: other.op("last", thread="t")])
    wait_for(lambda: r.bridge.slots.under_way() == 9, what="the other agent's call to wait")
    # Every driver holds one of the flooder's calls; the other agent's call waits behind 4 more of them.
    # One flooder call ends: its place goes to the other agent (the flooder holds 3, over its share of 2).
    first = r.records()[0]["thread"]
    Path(str(r.gate) + first[4:]).touch()
    reply = late.get(timeout=60)
    assert reply["reply"] == "done", reply  # not busy after the call's time, as before
    if shared:  # the flooder's freed driver answered it: the place was handed on with its process
        assert reply["store_dir"] is None and reply["pid"] == r.records()[0]["pid"]
    else:  # a driver of its own, started in the place the flooder's was stopped to free
        assert reply["store_dir"] == os.path.join(r.agents[1].folder, "chats")
    assert results.get(timeout=60)["reply"] == "done"  # the flooder call that ended
    # The flooder's 4 waiting calls have not run before it (after it, one may: the place it frees).
    assert [rec["agent"]["id"] for rec in r.records()[:5]] == ["flood"] * 4 + ["other"]
    for k in range(8):
        Path(f"{r.gate}-f{k}").touch()
    assert [results.get(timeout=60)["reply"] for _ in range(7)] == ["done"] * 7
    assert r.bridge.pool.started == (4 if shared else 6)  # unshared: one start for "other", one after it


def test_a_reply_over_the_bridges_most_is_refused_whole_and_its_driver_replaced(rig):
    from bridge_helpers import error_word

    r = rig(limits=Limits(max_reply_bytes=1024 * 1024))
    c = r.client()
    fine = c.op("read", thread=f"big-{1024 * 1024 - 100}")
    assert fine["reply"] == "events" and len(fine["pad"]) == 1024 * 1024 - 100  # up to the most: passed on whole
    over = c.op("read", thread=f"big-{3 * 1024 * 1024}")
    assert error_word(over) == "refused", over  # never a part of it
    assert "over the 1 MiB" in over["error"] and "nothing was changed" in over["error"]
    after = c.op("last", thread="t")  # the surplus went with the driver: the next call is answered whole
    assert after["reply"] == "done"
    pids = [rec["pid"] for rec in r.records()]
    assert pids[-1] != pids[-2]

"""The bridge's limits with calls that really overlap: the fake driver holds
each "gate" call until the test opens the gate, so which calls are under way
when the extra one arrives is certain, not a matter of timing."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable

from bridge_helpers import error_word, wait_for

from cloudstore.bridge import Limits, exchange


def run_at_once(calls: list[Callable[[], dict]]) -> queue.Queue[dict]:
    """Start every call in its own thread, released together at a barrier."""
    barrier = threading.Barrier(len(calls))
    results: queue.Queue[dict] = queue.Queue()

    def run(call: Callable[[], dict]) -> None:
        barrier.wait()
        results.put(call())

    for call in calls:
        threading.Thread(target=run, args=(call,), daemon=True).start()
    return results


def gate_call(client) -> Callable[[], dict]:
    return lambda: client.op("last", thread="gate")


def test_ninth_call_of_one_agent_is_busy(rig):
    r = rig()
    results = run_at_once([gate_call(r.client())] * 9)
    first = results.get(timeout=60)  # the eight others wait at the gate
    assert error_word(first) == "busy", first
    assert "this agent" in first["error"]
    r.open_gate()
    rest = [results.get(timeout=60) for _ in range(8)]
    assert [x["reply"] for x in rest] == ["done"] * 8


def test_seventeenth_call_across_agents_is_busy(rig):
    r = rig(agents=[("o", "a1"), ("o", "a2"), ("o", "a3")])
    calls = [gate_call(r.client(0))] * 6 + [gate_call(r.client(1))] * 6 + [gate_call(r.client(2))] * 5
    results = run_at_once(calls)
    first = results.get(timeout=60)
    assert error_word(first) == "busy", first
    assert "the bridge" in first["error"]  # the total, not one agent's share
    r.open_gate()
    rest = [results.get(timeout=60) for _ in range(16)]
    assert [x["reply"] for x in rest] == ["done"] * 16


def test_at_most_four_drivers_run_at_once(rig):
    r = rig(agents=[("o", f"a{i}") for i in range(3)])
    results = run_at_once([gate_call(r.client(i % 3)) for i in range(9)])
    wait_for(lambda: len(r.records()) >= 4, what="four calls to reach drivers")
    wait_for(lambda: r.bridge.slots.under_way() == 9, what="nine calls under way")
    assert len(r.records()) == 4  # five wait for a driver place
    assert r.bridge.pool.counts()["places"] == 4
    r.open_gate()
    assert [results.get(timeout=60)["reply"] for _ in range(9)] == ["done"] * 9
    assert r.bridge.pool.counts()["places"] <= 4


def test_proved_caller_that_never_sends_is_closed_and_its_slot_freed(rig):
    # 1.5 s: long enough for the busy call below to be made while the slot is surely held.
    r = rig(limits=Limits(request_timeout=1.5, max_calls_per_agent=1))
    c = r.client()
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.settimeout(30)
    idle.connect(r.socket_path)
    started = time.monotonic()
    idle.sendall(c.proof + b"\n")
    wait_for(lambda: r.bridge.slots.under_way() == 1, what="the silent caller to hold its slot")
    busy = c.op("last", thread="t")
    assert error_word(busy) == "busy"  # the silent caller holds the agent's one slot
    assert idle.recv(100) == b""  # closed by the bridge, no answer
    assert time.monotonic() - started >= 1.4
    idle.close()
    assert c.op("last", thread="t")["reply"] == "done"
    assert [x["thread"] for x in r.records()] == ["t"]


def test_caller_that_never_proves_is_closed(rig):
    r = rig(limits=Limits(request_timeout=0.5))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.settimeout(30)
        idle.connect(r.socket_path)
        assert idle.recv(100) == b""
    assert r.client().op("last", thread="t")["reply"] == "done"


def test_request_sent_late_but_in_time_is_answered(rig):
    r = rig(limits=Limits(request_timeout=5.0))
    c = r.client()
    line = b'{"op": "last", "agent": {"id": "a1", "owner": "o1"}, "thread": "t"}'
    reply = exchange(r.socket_path, [c.proof, line], pause=0.3)
    assert b'"done"' in reply

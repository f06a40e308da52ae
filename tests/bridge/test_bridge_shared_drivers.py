"""``--shared-drivers`` (``Limits.shared_drivers``): driver processes serve every agent (issue 43).

Without it a driver process is started with one agent's ``LNK_STORE_DIR`` and
serves that agent only, so with more agents than places almost every call
starts a driver. With it drivers run without ``LNK_STORE_DIR`` and any
agent's call reuses a running one: driver starts are counted (the pool's
``started``, and the fake driver's pids), never timed. Places stay shared
fairly by agent (tests/bridge/test_bridge_sharing.py runs its fairness test
both ways).
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

from bridge_helpers import error_word, wait_for
from test_bridge_cli import two_agents_bridge

from cloudstore.bridge import BridgeClient, Limits

SHARED = Limits(shared_drivers=True, call_timeout=120.0)
AGENTS = [("o", f"a{i}") for i in range(24)]


def test_without_the_flag_each_agents_call_starts_a_driver_with_it_one_driver_serves_all(rig):
    # 24 agents by turns, one call at a time, on 4 places: the same calls both ways.
    calls = [i % 24 for i in range(72)]
    alone = rig(agents=AGENTS, limits=Limits(call_timeout=120.0))
    replies = [alone.client(i).op("last", thread="t") for i in calls]
    assert [r["store_dir"] for r in replies] == [os.path.join(alone.agents[i].folder, "chats") for i in calls]
    assert len({r["pid"] for r in replies}) == 72 == alone.bridge.pool.started  # a driver start a call

    shared = rig(agents=AGENTS, limits=SHARED)
    replies = [shared.client(i).op("last", thread="t") for i in calls]
    assert {r["reply"] for r in replies} == {"done"}
    assert {r["store_dir"] for r in replies} == {None}  # no agent's folder: it serves them all
    assert len({r["pid"] for r in replies}) == 1 == shared.bridge.pool.started
    assert [rec["agent"]["id"] for rec in shared.records()] == [f"a{i}" for i in calls]  # each call its agent


def test_calls_from_24_agents_at_once_start_at_most_one_driver_a_place(rig):
    r = rig(agents=AGENTS, limits=SHARED)
    replies: list[dict] = []
    lock = threading.Lock()
    barrier = threading.Barrier(24)

    def agent(i: int) -> None:
        client = r.client(i)
        barrier.wait()
        for k in range(10):
            # 24 callers on 16 call slots: a call answered busy reached no driver, and is sent again.
            while error_word(reply := client.op("last", thread=f"t{k}")) == "busy":
                pass
            with lock:
                replies.append(reply)

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(replies) == 240 and {x["reply"] for x in replies} == {"done"}, replies[:3]
    assert r.bridge.pool.started <= 4  # 240 calls, 24 agents: never more drivers than places
    assert len({x["pid"] for x in replies}) <= 4
    assert r.bridge.pool.counts()["places"] <= 4


def test_a_shared_driver_never_gets_the_bridges_own_store_dir(rig, monkeypatch):
    # Unset, not inherited: a driver that did keep things there would mix every agent's in one folder.
    monkeypatch.setenv("LNK_STORE_DIR", "/nowhere/of/any/agent")
    r = rig(agents=AGENTS[:2], limits=SHARED)
    assert r.client(0).op("last", thread="t")["store_dir"] is None
    alone = rig(agents=AGENTS[:2])  # without the flag each driver has its agent's, as before
    assert alone.client(1).op("last", thread="t")["store_dir"] == os.path.join(alone.agents[1].folder, "chats")


def test_one_driver_serving_two_agents_answers_each_with_its_own_data(rig, store):
    r = rig(agents=[("o", "a1"), ("o", "a2")], driver=store.program, env=dict(store.env),
            limits=Limits(shared_drivers=True, call_timeout=60))
    one, two = r.client(0), r.client(1)
    thread = f"t-{uuid.uuid4().hex[:8]}"  # the same conversation name for both agents
    mine = [{"seq": 1, "text": "one's"}, {"seq": 2, "text": "one's again"}]
    theirs = [{"seq": 1, "text": "two's"}]
    # Interleaved, one at a time: the same driver process takes every call.
    assert one.op("append", thread=thread, event=mine[0]) == {"reply": "done"}
    assert two.op("append", thread=thread, event=theirs[0]) == {"reply": "done"}
    assert one.op("append", thread=thread, event=mine[1]) == {"reply": "done"}
    assert two.op("read", thread=thread, first=1) == {"reply": "events", "events": theirs}
    assert one.op("read", thread=thread, first=1) == {"reply": "events", "events": mine}
    assert two.op("last", thread=thread) == {"reply": "last", "last": 1}
    assert one.op("threads")["threads"] == [{"thread": thread, "last": 2}]
    assert r.bridge.pool.started == 1
    # The bridge still checks the request's agent against the proof: no agent reads another's.
    assert one.op("read", agent={"id": "a2", "owner": "o"}, thread=thread, first=1)["error"].startswith("refused:")


def test_the_program_takes_the_flag(short_dir):
    proc, sock, key1, key2, _ = two_agents_bridge(short_dir, "--shared-drivers")
    try:
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, what="the bridge's socket")
        one = BridgeClient(sock, "o", "a1", key1).op("last", thread="t")
        two = BridgeClient(sock, None, "a2", key2).op("last", thread="t")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert one["pid"] == two["pid"] and one["store_dir"] is None is two["store_dir"]
    assert out == b""
    # Not one of this project's drivers: the operator is told what the flag takes on trust.
    assert b"--shared-drivers with " in err and b"keeps nothing there" in err

"""What the format record and the server check cost a process, counted at a proxy (never timed).

store_gate.py promises: one round trip per process, beside the first op's own requests (a read op waits
for nothing more; a write op's first write waits for it), three requests (the record's GET, the probe's
create and stale update), nothing more for the rest of a ``serve`` process's life; the record's create
once per store; the probe's second create once per probe shard.  Each figure is counted at a proxy in
front of moto and fake-gcs-server that holds every request ``LATENCY`` (so requests sent together are
seen together: the rounds are the design's, not the emulator's speed).  A change that adds a request or
a round to these paths fails here; raising a bound needs a line in docs/design.md saying why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from faults.http_proxy import FaultProxy, Seen
from faults.rounds import gate_kind, rounds_of
from support import StoreUnderTest, fresh_agent, location_of, make_store

from cloudstore.gate import server_check
from cloudstore.generations import RetryingStore
from cloudstore.protocol.client import ServeProcess, call_once
from cloudstore.settings import open_backend

LATENCY = 0.05  # seconds held at the proxy: longer than any gap between requests a process sends together
GATE_REQUESTS = 3  # the record's GET, the probe's create and its update at a version never had


@dataclass
class Counted:
    direct: StoreUnderTest
    through: StoreUnderTest
    proxy: FaultProxy

    def gate_requests(self) -> list[Seen]:
        return [s for s in self.proxy.requests() if what(s) is not None]

    def op_requests(self) -> list[Seen]:
        return [s for s in self.proxy.requests() if what(s) is None]

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.proxy.clear()
        self.proxy.latency = LATENCY
        lines, err, code = call_once(self.through.program, request, env=self.through.env, timeout=120)
        assert code == 0 and len(lines) == 1, err[-2000:]
        return json.loads(lines[0])


what = gate_kind


@pytest.fixture(params=["moto", "gcs"])
def counted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    base = make_store(request.param, request, tmp_path_factory, own_bucket=True)
    setting = "AWS_ENDPOINT_URL_S3" if request.param == "moto" else "STORAGE_EMULATOR_HOST"
    with FaultProxy(base.env[setting], flavor="s3" if request.param == "moto" else "gcs") as proxy:
        yield Counted(base, replace(base, env=proxy.redirect(base.env)), proxy)


def probed(store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every probe shard made (as the first probes of a store make them), straight at the emulator."""
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    location = location_of(store)
    raw = RetryingStore(open_backend(location, create=False))
    for shard in range(server_check.SHARDS):
        server_check.Probe(raw, location.prefix, raw.label, shard).create()


def wire(agent: Any) -> dict[str, Any]:
    return agent if isinstance(agent, dict) else {"id": agent.id, "owner": agent.owner}


def test_a_read_in_call_mode_pays_three_requests_and_no_round(counted: Counted,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    probed(counted.direct, monkeypatch)
    agent = fresh_agent()
    assert counted.call({"op": "append", "agent": agent, "thread": "t", "event": {"seq": 1}})["reply"] == "done"
    got = counted.call({"op": "last", "agent": agent, "thread": "t"})
    assert got == {"reply": "last", "last": 1}
    gate = counted.gate_requests()
    assert sorted(what(s) or "" for s in gate) == ["format", "probe", "probe"], gate
    assert [s.method for s in gate if what(s) == "format"] == ["GET"]
    assert len(counted.op_requests()) == 2  # the head and a one-key listing, as without the gate
    assert rounds_of(counted.proxy.requests()) == 1  # the gate's round travels beside the op's


def test_an_append_in_call_mode_pays_three_requests_and_no_round(counted: Counted,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process's append reads the conversation's head before it writes: the gate's round travels
    beside that read, and the write waits for both."""
    probed(counted.direct, monkeypatch)
    agent = fresh_agent()
    assert counted.call({"op": "append", "agent": agent, "thread": "w", "event": {"seq": 1}})["reply"] == "done"
    got = counted.call({"op": "append", "agent": agent, "thread": "w", "event": {"seq": 2}})
    assert got == {"reply": "done"}
    assert len(counted.gate_requests()) == GATE_REQUESTS
    ops = counted.op_requests()
    assert rounds_of(counted.proxy.requests()) == rounds_of(ops) == 2


def test_a_serve_process_pays_once_for_its_life(counted: Counted, monkeypatch: pytest.MonkeyPatch) -> None:
    probed(counted.direct, monkeypatch)
    agent = fresh_agent()
    assert counted.call({"op": "append", "agent": fresh_agent(), "thread": "t", "event": {"seq": 1}})["reply"] == "done"
    counted.proxy.clear()  # the store has its record and every probe shard: what any process but the first meets
    proc = ServeProcess(counted.through.program, env=counted.through.env)
    try:
        ops: list[dict[str, Any]] = [{"op": "last", "thread": "t"}]
        ops += [{"op": "append", "thread": "t", "event": {"seq": n}} for n in range(1, 6)]
        ops += [{"op": "file_write", "path": "skills/a", "data": "aGk=", "version": 0}, {"op": "threads"},
                {"op": "job_put", "place": "waiting", "job": {"id": "j", "spec": {}, "due": 1}}, {"op": "job_mark"}]
        for op in ops:
            assert proc.request({**op, "agent": agent}, timeout=60)["reply"] != "error", op
    finally:
        proc.close()
    assert len(counted.gate_requests()) == GATE_REQUESTS


def test_the_first_write_to_a_store_writes_its_record_once_and_probes_a_new_shard_twice(
        counted: Counted) -> None:
    agent = fresh_agent()
    assert counted.call({"op": "append", "agent": agent, "thread": "t", "event": {"seq": 1}}) == {"reply": "done"}
    first = counted.gate_requests()
    # The record's GET and create; the probe's create (accepted: the shard was new), stale update, create again.
    assert sorted((what(s) or "", s.method) for s in first if what(s) == "format")[0][1] == "GET"
    assert sum(1 for s in first if what(s) == "format") == 2
    assert sum(1 for s in first if what(s) == "probe") == 3
    assert counted.call({"op": "append", "agent": agent, "thread": "t", "event": {"seq": 2}}) == {"reply": "done"}
    again = counted.gate_requests()
    assert sum(1 for s in again if what(s) == "format") == 1  # read, never written again
    assert sum(1 for s in again if what(s) == "probe") in (2, 3)  # 3 only where it drew another new shard
    assert os.environ.get("LNK_STORE_FAILPOINT") is None

"""Issue 25, case 1: one agent's due, or one stray object in the shared due index, stops no one.

On eafe802 a ``job_put`` to waiting with ``"due": -10**400`` was answered
``done``; from then on ``job_due``, every runner's poll, answered "the reply
could not be written as JSON" for every agent of the store (the entry sorted
as -inf, first in every page), and ``lnk-store-admin inspect --json`` printed
``-Infinity``.  Now a waiting due outside ``validate.DUE_MAX`` is refused
before anything is written, and every reader of the index (``job_next``,
``job_due``, ``inspect``, ``gc``) passes over a key it cannot parse, or whose
due is out of range, as foreign garbage: shown by ``inspect``, reclaimed by
``gc --apply``, never an error in anyone's reply.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from support import Session, fresh_agent, service_of, serving

from cloudstore.admin import gc
from cloudstore.admin.walk import open_url
from cloudstore.generations import Overwrite
from cloudstore.protocol.validate import DUE_MAX, Agent
from cloudstore.store.keys import AgentKeys, due_entry, due_root

OUT_OF_RANGE = [-(10**400), 10**400, DUE_MAX + 1, -(DUE_MAX + 1), 1e300, -1e17]


def _old_sortable(value: float) -> str:
    """How eafe802's ``due_index.sortable`` keyed a due (an overflow became +-inf)."""
    bits = struct.unpack(">Q", struct.pack(">d", value))[0]
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
    return f"{bits:016x}"


def _error(reply: dict) -> str:
    assert reply.get("reply") == "error" and set(reply) == {"reply", "error"}, reply
    return str(reply["error"])


@pytest.mark.parametrize("due", OUT_OF_RANGE, ids=lambda d: f"{d:.3g}" if isinstance(d, float) else str(d)[:8])
def test_a_waiting_due_out_of_range_is_refused_and_nothing_is_stored(session: Session, due: float) -> None:
    why = _error(session("job_put", place="waiting", job={"id": "j", "spec": None, "due": due}))
    assert "within" in why, why
    assert session("job_list", place="waiting") == {"reply": "jobs", "jobs": []}
    assert session("job_next") == {"reply": "next", "next": None}


def test_a_big_due_may_stay_in_ending_but_is_not_shifted_to_waiting(session: Session) -> None:
    job = {"id": "big", "spec": 1, "due": 2**70}
    assert session("job_put", place="ending", job=job) == {"reply": "done"}
    why = _error(session("job_shift", id="big", **{"from": "ending", "to": "waiting"}))
    assert "within" in why, why
    assert session("job_get", place="ending", id="big") == {"reply": "job", "job": job}
    assert session("job_get", place="waiting", id="big") == {"reply": "job", "job": None}
    assert session("job_next") == {"reply": "next", "next": None}
    edge = {"id": "edge", "spec": 1, "due": DUE_MAX}
    assert session("job_put", place="waiting", job=edge) == {"reply": "done"}
    assert session("job_next") == {"reply": "next", "next": DUE_MAX}


def _plant_garbage(store: object, agent: dict) -> list[str]:
    """Stray objects in the shared index: eafe802's +-inf and NaN keys, non-hex dues, wrong shapes."""
    service = service_of(store)
    root = service.space.root
    keys = AgentKeys(root, agent["owner"], agent["id"])
    stray = [
        due_entry(root, _old_sortable(float("-inf")), keys, "neg", "n1"),
        due_entry(root, _old_sortable(float("inf")), keys, "pos", "n2"),
        due_entry(root, _old_sortable(float("nan")), keys, "nan", "n3"),
        due_entry(root, _old_sortable(-1e300), keys, "huge", "n4"),
        due_root(root) + "0x00000000000000/o/a/j/n",
        due_root(root) + "zzzzzzzzzzzzzzzz/o/a/j/n",
        due_root(root) + "0000000000000000",
        due_root(root) + "0000000000000000/only/three",
        due_root(root) + "0000000000000000/a/b/c/d/e/f",
    ]
    for key in stray:
        service.space.store.put(key, b"", Overwrite())
    return stray


def test_stray_index_objects_stop_no_reader(store, store_env) -> None:  # noqa: ANN001 - fixtures
    victim, hostile = fresh_agent(), fresh_agent()
    stray = _plant_garbage(store, hostile)
    with serving(store) as (proc,):
        put = proc.request({"op": "job_put", "agent": victim, "place": "waiting",
                            "job": {"id": "due-now", "spec": None, "due": 1_800_000_000}}, timeout=60)
        assert put == {"reply": "done"}
        assert proc.request({"op": "job_next", "agent": victim}, timeout=60) == {"reply": "next",
                                                                                "next": 1_800_000_000}
    env = {**store.env, "LNK_SCHEDULER_OPS": "1"}
    from cloudstore.protocol.client import ServeProcess

    runner_driver = ServeProcess(store.program, env=env)
    try:
        reply = runner_driver.request({"op": "job_due", "agent": victim, "limit": 100}, timeout=60)
    finally:
        runner_driver.close()
    assert reply["reply"] == "due", reply
    assert [(e["job"], e["due"]) for e in reply["due"]] == [("due-now", 1_800_000_000)]
    # inspect: valid JSON (no -Infinity), the garbage counted as foreign, the soonest the real entry.
    out = subprocess.run([sys.executable, "-m", "cloudstore.admin.cli", "inspect", "--json", store.url],
                         env={**store_env_of(store)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout, parse_constant=_no_constant)
    assert report["due_index"]["foreign"] == len(stray)
    assert report["due_index"]["soonest"] == 1_800_000_000
    # gc --apply reclaims the garbage once past its grace, and leaves the real entry (whose record names it).
    opened = open_url(store.url)
    plan, _, _ = gc.run(opened, True, gc.Policy(min_age=0, now=lambda: opened.store.clock.now() + 600))
    assert sorted(d.key for d in plan.doomed if d.kind == "due-foreign") == sorted(stray)
    service = service_of(store)
    left = {item.key for item in service.space.store.list(due_root(service.space.root))}
    assert not left & set(stray), left & set(stray)
    assert len(left) == 1
    with serving(store) as (proc,):
        assert proc.request({"op": "job_next", "agent": victim}, timeout=60) == {"reply": "next",
                                                                                "next": 1_800_000_000}


def store_env_of(store: object) -> dict[str, str]:
    import os

    return {**os.environ, **store.env}  # type: ignore[attr-defined]


def _no_constant(name: str) -> None:
    raise AssertionError(f"inspect --json printed {name}, which is not JSON")


def test_a_record_with_a_due_out_of_range_is_passed_over_by_job_next(store_env) -> None:  # noqa: ANN001
    """A record whose waiting due is ``10**400`` (valid JSON, no double holds it) under an in-range key:
    passed over, not answered (eafe802 answered it, a number no reader of the reply can hold)."""
    service = service_of(store_env)
    victim, hostile = Agent(**fresh_agent()), Agent(**fresh_agent())
    service.jobs.put(hostile, "waiting", {"id": "h", "spec": None, "due": 5})
    service.jobs.put(victim, "waiting", {"id": "v", "spec": None, "due": 10})
    key = service.space.keys(hostile).job("h")
    obj = service.space.store.get(key)
    record = json.loads(obj.data)
    record["places"]["waiting"]["job"]["due"] = 10**400
    service.space.store.put(key, json.dumps(record).encode(), Overwrite())
    fresh = service_of(store_env)
    early = fresh.jobs.next()  # its entry is young: answered as listed, an early wake-up, never the record's due
    assert early in (5, 10)
    later = fresh.space.store.clock.now() + 600
    fresh.space.store.clock.now = lambda: later  # type: ignore[method-assign]
    fresh.space.store.clock.earliest = lambda: later  # type: ignore[method-assign]
    assert fresh.jobs.next() == 10

"""Issue 26 item 4: a lease renewed every lapse/3 at the smallest lapse the docs allow never meets GCS's limit.

fake-gcs-server behind ``FaultProxy`` with GCS's per-object write limit
(``RateLimit``: 1 write a second per object name, burst 2, a write forwarded
takes a token even if its precondition then fails), in virtual time: the
limit's buckets and the heads' hint clock (``heads.monotonic``) move only
when the test steps them, so the run is the same on any machine.  The
holder renews every ``GCS_LAPSE_MIN_MS / 3`` while it appends to the same
conversation, the packing hint due often (its interval made small), so the
head is written by renewals and hints both.  Asserted: every renewal
answers ``done``, every append ``done``, and the proxy throttled nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from faults.http_proxy import FaultProxy, RateLimit
from support import fresh_agent, location_of, make_store

from cloudstore.generations import RetryingStore
from cloudstore.protocol.service import Service
from cloudstore.settings import open_backend
from cloudstore.store import conversations, heads
from cloudstore.store.leases import GCS_LAPSE_MIN_MS
from cloudstore.store.space import Space

RENEWALS = 6  # each renewal 128 appends and 4 hints: 768 appends through fake-gcs-server a run
HINT = 32  # the hint's interval (512 in use), so that one is due at every block of 32
APPENDS_PER_RENEWAL = 4 * HINT


class VirtualTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def gcs_proxy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultProxy, Any]]:
    base = make_store("gcs", request, tmp_path_factory)
    with FaultProxy(base.env["STORAGE_EMULATOR_HOST"], flavor="gcs") as proxy:
        store = replace(base, env=proxy.redirect(base.env))
        for key, value in store.env.items():
            monkeypatch.setenv(key, value)
        yield proxy, store


@pytest.mark.parametrize("appender", ["same service", "another service of the process"])
def test_renewals_at_a_third_of_the_smallest_lapse_meet_no_throttle_hints_included(
        gcs_proxy: tuple[FaultProxy, Any], monkeypatch: pytest.MonkeyPatch, appender: str) -> None:
    """The appends come from the renewing service (a serve process) or from another service on the
    same backend (the Python API's pool, each service with a cache of its own)."""
    proxy, store = gcs_proxy
    clock = VirtualTime()
    monkeypatch.setattr(heads, "monotonic", clock, raising=False)
    monkeypatch.setattr(conversations, "PREFETCH_HINT_EVERY", HINT)
    loc = location_of(store)
    service = Service(Space(RetryingStore(open_backend(loc)), loc.prefix))
    service.space.deferred = []  # packing (and the hint) after each reply, as serve does

    other = service
    if appender != "same service":
        other = Service(Space(RetryingStore(service.space.store.backend), loc.prefix))
        other.space.deferred = []

    def call(op: str, **args: Any) -> dict:
        by = other if op == "append" else service
        reply = by.answer({"op": op, "agent": agent, **args})
        by.space.run_deferred()
        return reply

    agent, thread, holder = fresh_agent(), "t", "holder-1"
    assert call("take", thread=thread, holder=holder, lapse_ms=GCS_LAPSE_MIN_MS) == {"reply": "took", "took": "took"}
    limit = proxy.limit(RateLimit("gcs-object", rate=1.0, burst=2.0, seed=26, clock=clock))
    seq = 0
    renewals = []
    for _ in range(RENEWALS):
        for _ in range(APPENDS_PER_RENEWAL // HINT):  # the appends of one interval, spread across it
            for _ in range(HINT):
                seq += 1
                assert call("append", thread=thread, event={"seq": seq}) == {"reply": "done"}, seq
            clock.step(GCS_LAPSE_MIN_MS / 1000 / 3 / (APPENDS_PER_RENEWAL // HINT))
        renewals.append(call("renew", thread=thread, holder=holder))
    assert renewals == [{"reply": "done"}] * RENEWALS
    assert limit.refused == 0, f"throttled {limit.refused} writes: {limit.refused_names}"
    got = call("read", thread=thread, first=1)
    assert [e["seq"] for e in got["events"]] == list(range(1, seq + 1))

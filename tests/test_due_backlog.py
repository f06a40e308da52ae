"""Issue 25, case 2: a backlog of another agent's due entries hides none of ours, and costs a bounded poll.

On eafe802 a runner's poll (``watch.IndexSource``) read at most 10 pages of
100 entries of the shared due index and started again from the top: an
agent no runner serves put 1,001 waiting jobs due in 1970, and another
agent's job due now was never fired.  Here 10,000 foreign entries stand in
the index, due in 1970 (case A) or due now (case B), and the poll is driven
directly, its ``job_due`` requests counted at the asker (one listing each),
with the runner's monotonic clock faked so the sweep's cadence is exact.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from support import BACKENDS, fresh_agent, make_store, service_of

from cloudstore.generations import Overwrite
from cloudstore.protocol.validate import Agent
from cloudstore.scheduling import watch
from cloudstore.store.keys import AgentKeys, due_entry

FOREIGN = 10_000


@dataclass
class Asker:
    """The runner's own driver as ``IndexSource`` uses it: ``job_due``, answered in-process, counted."""

    service: Any
    agent: Agent
    calls: list[str | None] = field(default_factory=list)

    def due(self, limit: int, after: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        self.calls.append(after)
        entries, more = self.service.jobs.due(limit, after)
        return [e.wire() for e in entries], more

    def list(self, place: str) -> list[dict[str, Any]]:
        return self.service.jobs.listing(self.agent, place)


def _plant(service: Any, dues: list[float]) -> None:
    """Entries of an agent no runner serves, written straight into the shared index, in parallel."""
    foreign = Agent(**fresh_agent())
    keys = AgentKeys(service.space.root, foreign.owner, foreign.id)
    from cloudstore.store.due_index import sortable

    def write(i: int) -> None:
        key = due_entry(service.space.root, sortable(dues[i]), keys, f"backlog-{i:05d}", f"n{i:05d}")
        service.space.store.put(key, b"", Overwrite())

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(write, range(len(dues))))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _source(service: Any, mine: Agent, clock: Clock) -> tuple[watch.IndexSource, Asker]:
    asker = Asker(service, mine)
    source = watch.IndexSource([asker])  # type: ignore[list-item]
    source.clock = clock  # the sweep's cadence, in the runner's monotonic seconds
    return source, asker


def _ours(poll: watch.Poll) -> set[str]:
    return {due.job for due in poll.found}


#: On the folder only (conftest): planting 10,000 objects costs a minute a test on moto and more on
#: fake-gcs-server, and the poll's paging is the same code above the seam on every backend; each
#: listing's own start-after and limit are the seam tests' (tests/test_seam.py, on every backend), and
#: paging through thousands of keys on the emulators is tests/test_file_list_cost.py's.
GCS_TESTS: frozenset[str] = frozenset()
MOTO_TESTS: frozenset[str] = frozenset()


@pytest.fixture(params=BACKENDS)
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh store in a bucket of its own (10,000 objects are planted in it)."""
    store = make_store(request.param, request, tmp_path_factory, own_bucket=True)
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    return service_of(store)


@pytest.fixture(scope="module", params=BACKENDS)
def in_1970(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One store per backend holding FOREIGN entries due in 1970 of an agent nobody serves (planted once)."""
    store = make_store(request.param, request, tmp_path_factory, own_bucket=True)  # 10,000 objects: their own
    with pytest.MonkeyPatch.context() as patch:
        for key, value in store.env.items():
            patch.setenv(key, value)
        service = service_of(store)
        _plant(service, [float(i + 1) for i in range(FOREIGN)])
        yield service


def test_a_1970_backlog_of_another_agent_hides_no_due_job_and_costs_one_listing_a_poll(in_1970: Any) -> None:
    service = in_1970
    mine = Agent(**fresh_agent())
    now = time.time()
    service.jobs.put(mine, "waiting", {"id": "due-now", "spec": None, "due": now})
    source, asker = _source(service, mine, clock := Clock())
    assert "due-now" in _ours(source.poll(now))
    start_up = len(asker.calls)
    assert start_up <= 1 + watch.PAGES  # the fast scan's one page, and the start-up sweep's pages
    for i in range(5):  # idle polls within one sweep period: one listing each, whatever the backlog
        asker.calls.clear()
        clock.now += watch.SWEEP_EVERY / 10
        assert "due-now" in _ours(source.poll(now + i))
        assert len(asker.calls) == 1, asker.calls
    asker.calls.clear()
    clock.now += watch.SWEEP_EVERY
    source.poll(now + 10)
    assert len(asker.calls) == 2  # and one sweep page per SWEEP_EVERY


def test_a_job_put_due_long_ago_behind_a_1970_backlog_is_found_by_the_sweep(in_1970: Any) -> None:
    service = in_1970
    mine = Agent(**fresh_agent())
    now = time.time()
    service.jobs.put(mine, "waiting", {"id": "an-hour-late", "spec": None, "due": now - 3600})
    source, asker = _source(service, mine, clock := Clock())
    found: set[str] = set()
    sweeps = 0
    while "an-hour-late" not in found and sweeps < FOREIGN // watch.PAGE + 2:
        found |= _ours(source.poll(now))
        clock.now += watch.SWEEP_EVERY
        sweeps += 1
    assert "an-hour-late" in found
    assert sweeps <= 2  # the start-up sweep's PAGES pages, then one page a SWEEP_EVERY


def test_a_backlog_due_now_is_paged_through_and_then_left_behind(service: Any) -> None:
    now = time.time()
    _plant(service, [now - 1.0] * FOREIGN)  # 10,000 due now, an agent nobody serves
    mine = Agent(**fresh_agent())
    service.jobs.put(mine, "waiting", {"id": "mine", "spec": None, "due": now})
    source, asker = _source(service, mine, clock := Clock())
    polls = 0
    found: set[str] = set()
    while "mine" not in found and polls < 10:
        poll = source.poll(now)
        found |= _ours(poll)
        polls += 1
        assert len(asker.calls) <= 2 * watch.PAGES + 1  # never more than PAGES pages a poll (+ sweep)
        asker.calls.clear()
    assert "mine" in found
    assert polls <= -(-(FOREIGN + 1) // (watch.PAGE * watch.PAGES))  # the cursor goes on where it stopped
    # Past RECENT seconds the backlog is behind the fast scan's range: one listing a poll again.
    later = now + watch.RECENT + 1
    clock.now += 1
    for step in range(3):
        asker.calls.clear()
        source.poll(later + step)
    assert len(asker.calls) == 1, asker.calls

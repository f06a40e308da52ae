"""Issue 43, part 4: an op has one budget for its whole time, and stops before its next write when it is spent.

The op's window (``RetryingStore.op_window``, ``LNK_OP_SECONDS``) is spent
here by a store whose reads move a fake clock on, never by waiting: each
test says which request spends it, and asserts what the op then sends (no
more writes) and what it answers (``nothing was changed`` when no write of
it was sent, ``outcome unknown`` when one was).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudstore import generations
from cloudstore.errors import FailedError, OutcomeUnknownError, from_reply
from cloudstore.generations import Create, RetryingStore, RetryPolicy, StoreUnavailable, Transient
from cloudstore.local import LocalBackend
from cloudstore.protocol.service import Service
from cloudstore.settings import SettingError, retry_policy
from cloudstore.store.space import Space

AGENT = {"id": "a1", "owner": None}


class Clock:
    """The op windows' clock, moved on only by the store below."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Spending:
    """A folder store whose chosen requests spend ``seconds`` of the clock (a store holding its replies)."""

    def __init__(self, root: Path, clock: Clock) -> None:
        self.inner = LocalBackend(str(root))
        self.clock = clock
        self.label = "file"
        self.spend_on: set[str] = set()  # "get", "put": which requests spend the time
        self.seconds = 0.0
        self.fail_put = False  # the put is applied, then its reply is lost (a timeout)
        self.puts = 0

    def _spend(self, kind: str) -> None:
        if kind in self.spend_on:
            self.clock.now += self.seconds

    def get(self, key, head=None):
        self._spend("get")
        return self.inner.get(key, head)

    def put(self, key, raw, mode):
        self.puts += 1
        version = self.inner.put(key, raw, mode)
        self._spend("put")
        if self.fail_put:
            raise Transient("the reply was held past the try's timeout")
        return version

    def delete(self, key, version):
        self.puts += 1
        return self.inner.delete(key, version)

    def list(self, prefix, start_after, limit):
        self._spend("get")
        return self.inner.list(prefix, start_after, limit)

    def list_dirs(self, prefix):
        self._spend("get")
        return self.inner.list_dirs(prefix)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(generations, "_now", c)
    yield c


def seam(tmp_path: Path, clock: Clock, budget: float = 5.0) -> tuple[RetryingStore, Spending]:
    backend = Spending(tmp_path, clock)
    return RetryingStore(backend, RetryPolicy(deadline=budget, first_delay=0.0, max_delay=0.0)), backend


def test_a_write_after_the_budget_is_spent_is_not_sent(tmp_path: Path, clock: Clock) -> None:
    store, backend = seam(tmp_path, clock)
    backend.spend_on, backend.seconds = {"get"}, 6.0  # one read takes more than the op's 5 s
    with store.op_window():
        assert store.get("k") is None
        with pytest.raises(StoreUnavailable) as raised:
            store.put("k", b"v", Create())
    assert "ran out before its next write" in str(raised.value)
    assert raised.value.changed is False  # certainly not written: it was never sent
    assert backend.puts == 0 and store.writes == 0
    assert store.get("k") is None  # outside any window: nothing was stored


def test_a_retry_after_the_budget_is_spent_says_outcome_unknown(tmp_path: Path, clock: Clock) -> None:
    store, backend = seam(tmp_path, clock)
    backend.spend_on, backend.seconds, backend.fail_put = {"put"}, 6.0, True
    with store.op_window(), pytest.raises(StoreUnavailable) as raised:
        store.put("k", b"v", Create())
    assert backend.puts == 1  # the try that spent the budget; its retry was not sent
    assert raised.value.outcome_unknown and "outcome unknown" in str(raised.value)
    assert store.get("k") is not None  # and indeed it had landed


def service(tmp_path: Path, clock: Clock, budget: float) -> tuple[Service, Spending]:
    store, backend = seam(tmp_path, clock, budget)
    return Service(Space(store, "")), backend


def job_put(spec: object) -> dict:
    return {"op": "job_put", "agent": AGENT, "place": "ending", "job": {"id": "j1", "spec": spec, "due": 1}}


def test_job_put_whose_budget_a_read_spends_says_nothing_was_changed(tmp_path: Path, clock: Clock) -> None:
    first, _ = service(tmp_path, clock, budget=5.0)
    assert first.answer(job_put({"n": 1})) == {"reply": "done"}
    # Another process puts the job again: its create is refused (the job is there), it reads the job
    # (this read spends the op's time), and the update it would write next is not sent.
    svc, backend = service(tmp_path, clock, budget=5.0)
    backend.spend_on, backend.seconds = {"get"}, 6.0
    reply = svc.answer(job_put({"n": 2}))
    assert reply["reply"] == "error", reply
    assert "ran out before its next write" in reply["error"] and reply["error"].endswith("nothing was changed")
    assert isinstance(from_reply("job_put", reply["error"]), FailedError)
    assert backend.puts == 1  # the create the store refused; no write after the read
    backend.spend_on = set()
    got = svc.answer({"op": "job_get", "agent": AGENT, "place": "ending", "id": "j1"})
    assert got == {"reply": "job", "job": {"id": "j1", "spec": {"n": 1}, "due": 1}}


def test_job_put_whose_budget_a_write_spends_says_outcome_unknown(tmp_path: Path, clock: Clock) -> None:
    svc, backend = service(tmp_path, clock, budget=5.0)
    backend.spend_on, backend.seconds, backend.fail_put = {"put"}, 6.0, True
    reply = svc.answer(job_put({"n": 2}))
    assert reply["reply"] == "error", reply
    assert isinstance(from_reply("job_put", reply["error"]), OutcomeUnknownError), reply
    assert backend.puts == 1  # the op stopped before its next write


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_malformed_op_budget_is_refused_by_name(value: str) -> None:
    with pytest.raises(SettingError, match="LNK_OP_SECONDS is malformed"):
        retry_policy(value)


def test_the_op_budget_sets_the_window() -> None:
    assert retry_policy("2.5").deadline == 2.5
    assert retry_policy(None) == RetryPolicy()

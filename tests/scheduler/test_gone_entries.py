"""A due-index entry whose record is not there yet is tried again soon; only one gone twice is let be.

A put writes a job's due-index entry, then its mark, then its record
(``store.jobs``), so a runner that polls between the first write and the
last is shown the job and told "gone" when it claims it.  Until now that
told the runner to leave the entry alone for ``GONE_FOR`` (180 s): the job,
put to fire at once, fired three minutes late.  Now the first "gone" is tried
again after ``backoff`` like a "held"; a second "gone" for the same entry is
a stale one (a job claimed by another runner, a crash's leftover) and is let
be for ``GONE_FOR``, so a stale entry costs one claim more than before, not
one a poll.

Deterministic: no store and no process, as tests/scheduler/test_peers.py
(whose runner and recording claimer it uses); the runner's clocks are the
test's (``time.time`` and ``time.monotonic`` in ``scheduling.runner``).
"""

from __future__ import annotations

import types

import pytest
from test_peers import polled, runner

from cloudstore.scheduling import runner as runner_module
from cloudstore.scheduling.runner import GONE_FOR


class Clock:
    """Wall and monotonic time the test moves; the runner module reads both from it."""

    def __init__(self, at: float) -> None:
        self.at = at

    def time(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    made = Clock(1000.0)
    monkeypatch.setattr(runner_module, "time", types.SimpleNamespace(time=made.time, monotonic=made.monotonic))
    return made


def test_a_job_polled_before_its_record_landed_is_claimed_after_a_backoff(clock: Clock) -> None:
    r, claimer, store = runner("A")
    assert r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)[0] == 1
    claimer.told["j"]("gone")  # the record is not there yet: the put is under way
    clock.at += r.timing.backoff
    handed, _ = r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)  # the record has landed
    assert handed == 1 and claimer.handed == ["j", "j"], "claimed again a backoff later, not GONE_FOR later"


def test_not_before_the_backoff(clock: Clock) -> None:
    """Nothing faster than a held claim: a "gone" does not make the runner claim the job at every poll."""
    r, claimer, store = runner("A")
    r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)
    claimer.told["j"]("gone")
    clock.at += r.timing.backoff / 2
    assert r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)[0] == 0 and claimer.handed == ["j"]


def test_an_entry_gone_twice_is_let_be_for_gone_for(clock: Clock) -> None:
    r, claimer, store = runner("A")
    for _ in range(2):  # a stale entry: claimed by another runner (or a crash's leftover), its record gone
        assert r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)[0] == 1
        claimer.told["j"]("gone")
        clock.at += r.timing.backoff
    assert r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)[0] == 0
    clock.at += GONE_FOR
    assert r.claim_due(polled(r, store, {"j": 999.0}, clock.at), clock.at)[0] == 1, "once the entry's time is up"
    assert claimer.handed == ["j"] * 3

"""The store's clock as a process knows it (cloudstore/clock.py): evidence in, smallest correction out.

These are the arithmetic promises the skew tests (test_clock_skew.py, real
processes under libfaketime) stand on: a process whose clock agrees with the
store's is never corrected; one that is off by any amount is corrected to
within what the replies prove; contradicting evidence (a clock stepped)
starts the estimate again.
"""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest

from cloudstore.clock import StoreClock


def replies(clock: StoreClock, true_offset: float, rtt: float, count: int, seed: int, resolution: float = 1.0) -> None:
    """``count`` replies at random local times, each stamped with the store's time floored to ``resolution``."""
    rng = random.Random(seed)
    local = 1_700_000_000.0
    for _ in range(count):
        local += rng.uniform(0.05, 0.9)
        answered = local + rng.uniform(0, rtt)  # when the store stamped it, local clock
        stamp = (answered + true_offset) // resolution * resolution
        clock.observe(local, local + rtt, stamp, resolution)


@pytest.mark.parametrize("seed", range(20))
def test_a_clock_that_agrees_with_the_store_is_never_corrected(seed: int) -> None:
    clock = StoreClock()
    replies(clock, true_offset=0.0, rtt=0.02, count=50, seed=seed)
    assert clock.offset == 0.0


@pytest.mark.parametrize("true_offset", [-120.0, -5.0, -1.3, 1.3, 5.0, 62.0, 120.0])
@pytest.mark.parametrize("seed", range(5))
def test_a_skewed_clock_is_corrected_to_within_the_evidence(true_offset: float, seed: int) -> None:
    clock = StoreClock()
    replies(clock, true_offset=true_offset, rtt=0.02, count=1, seed=seed)
    assert abs(clock.offset - true_offset) <= 1.0 + 0.02, "one reply: within the Date header's second and the trip"
    replies(clock, true_offset=true_offset, rtt=0.02, count=60, seed=seed + 100)
    assert abs(clock.offset - true_offset) <= 0.1, "replies straddling second boundaries narrow it"


def test_fine_evidence_corrects_to_the_millisecond() -> None:
    clock = StoreClock()
    replies(clock, true_offset=-7.25, rtt=0.002, count=3, seed=1, resolution=0.01)
    assert abs(clock.offset + 7.25) <= 0.012


def test_a_stepped_clock_starts_the_estimate_again() -> None:
    clock = StoreClock()
    replies(clock, true_offset=5.0, rtt=0.02, count=30, seed=3)
    replies(clock, true_offset=-30.0, rtt=0.02, count=30, seed=4)
    assert abs(clock.offset + 30.0) <= 1.02


def test_http_date_headers_and_junk() -> None:
    clock = StoreClock()
    clock.observe_http_date(1000.0, 1000.1, None)
    clock.observe_http_date(1000.0, 1000.1, "not a date")
    assert clock.offset == 0.0, "no evidence: no correction"
    clock.observe_http_date(1000.0, 1000.1, formatdate(1100.0, usegmt=True))
    assert 98.9 <= clock.offset <= 101.0
    assert abs(clock.now() - (__import__("time").time() + clock.offset)) < 0.05


def test_the_probe_runs_only_without_evidence() -> None:
    probes: list[int] = []
    clock = StoreClock(probe=lambda: probes.append(1))
    assert clock.offset == 0.0 and probes == [1]
    clock.observe(10.0, 10.01, 10.005, 0.01)
    assert clock.offset == 0.0 and probes == [1]

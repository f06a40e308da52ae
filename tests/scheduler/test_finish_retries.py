"""Issue 26, case 2: a fire is never repeated because its finish was throttled.

On eafe802 a runner whose ``job_remove`` from firing failed once (a throttle
outlasting the op's deadline) logged ``finish_failed`` and let the claim go:
its lease lapsed with the job still in firing, and recovery fired the job
again.  Now the finish is tried again while the claim is ours (its lease
still renewed), and the lease is ended only once the job has left firing.
The store is a scripted driver, so the failures come exactly where chosen.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from scheduler_rig import QuickFire

from cloudstore.scheduling import claiming
from cloudstore.scheduling.claim_leases import Claims
from cloudstore.scheduling.claiming import Claimer
from cloudstore.scheduling.store_client import Agent, AgentStore

THROTTLED = "the store kept throttling (429 rateLimitExceeded) past the op's deadline; nothing was changed"


class ScriptedDriver:
    """The runner's own driver: the claim and the lease succeed; the finish fails ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.ops: list[str] = []
        self.lock = threading.Lock()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.ops.append(request["op"])
            op = request["op"]
            if op == "job_claim":
                return {"reply": "claimed", "took": "took", "holder": None, "recovered": False,
                        "job": {"id": request["id"], "spec": None, "due": 0}}
            if op == "job_remove":
                if self.failures > 0:
                    self.failures -= 1
                    return {"reply": "error", "error": THROTTLED}
                return {"reply": "found", "found": True}
            if op in ("end", "renew"):
                return {"reply": "done"}
            raise AssertionError(f"unexpected op {request}")

    def close(self) -> None:
        pass



def run_one(driver: ScriptedDriver) -> tuple[QuickFire, list[str]]:
    claims = Claims("runner-A", 30.0)
    fire = QuickFire()
    claimer = Claimer(claims, fire, 1, keep_ending=False)  # type: ignore[arg-type]
    told: list[str] = []
    try:
        assert claimer.acquire_slot(lambda: False)
        assert claimer.dispatch(AgentStore(Agent(owner=None, id="a"), driver, own_driver=True), "j", told.append)
        claimer.shutdown()
    finally:
        claims.close()
    return fire, told


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claiming, "FINISH_WAIT", 0.0)


def test_a_throttled_finish_is_tried_again_and_the_lease_ended_only_after_it() -> None:
    driver = ScriptedDriver(failures=3)
    fire, told = run_one(driver)
    assert fire.fired == 1 and told == ["claimed"]
    assert driver.ops.count("job_remove") == 4, driver.ops  # three throttled, the fourth removes it
    assert "end" in driver.ops and driver.ops.index("end") > max(
        i for i, op in enumerate(driver.ops) if op == "job_remove"), driver.ops  # the lease goes after, never before


def test_a_finish_that_never_succeeds_leaves_the_lease_to_lapse_not_ended() -> None:
    driver = ScriptedDriver(failures=10**6)
    fire, _ = run_one(driver)
    assert fire.fired == 1
    assert driver.ops.count("job_remove") == claiming.FINISH_TRIES
    assert "end" not in driver.ops  # where the job is is unknown: recovery looks once the lease lapses

"""Recovery that does not slow with the number of agents (issue 26, case 5).

Runners serving many agents, the one firing a job SIGKILLed: the job is fired
again once, by a live runner, within a bound in lapses and polls that does not
depend on the number of agents, whether or not the dead runner held the job's
agent's ``scheduler:recovery`` lease (the sweep's scanner).  The job is on the
last agent of the config, whose per-agent step came last: the per-agent design
(eafe802) looked at it only ``agents x 3`` polls after start-up (150 s with
100 agents at 0.5 s), and with its scanner dead three such cadences later, so
it cannot meet the bound.  A runner's start-up lists the store's claim index,
not every agent's firing: the listings it sends are counted, and bounded
whatever the number of agents.  The bounds are wide (this is no speed test):
the check is that the delay is counted in lapses and polls, not agents.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scheduler_rig import FIRE, Rig, wait_for

AGENTS = {"file": 100, "moto": 30, "gcs": 30}  # agents a runner serves, by backend
LAPSE, POLL = 5.0, 0.5
RUNNERS = 3


def agents(rig: Rig) -> list[dict[str, Any]]:
    return [{"owner": "o" if i % 2 else None, "id": f"agent{i:04d}"} for i in range(AGENTS[rig.backend.name])]


def start(rig: Rig, name: str, served: list[dict[str, Any]]) -> subprocess.Popen:
    config = {"agents": served, "driver": rig.backend.driver, "driver_env": rig.backend.env,
              "fire": FIRE + [str(rig.record)], "poll_interval": POLL, "lapse": LAPSE, "runner": name}
    path = rig.root / f"{name}.json"
    path.write_text(json.dumps(config))
    with open(rig.root / f"{name}.log", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(path)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)


def events(rig: Rig, name: str, event: str) -> list[dict[str, Any]]:
    lines = (rig.root / f"{name}.log").read_text(errors="replace").splitlines()
    found = []
    for line in lines:
        if line.startswith("{"):
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if parsed.get("event") == event:
                found.append(parsed)
    return found


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: No runs on fake-gcs-server (conftest): the index and the recovery are the same code above the seam
#: as on moto, where they run against a real HTTP emulator; a third backend adds CI minutes, not cases.
GCS_TESTS: frozenset[str] = frozenset()


@pytest.mark.parametrize("scanner", ["dead", "alive"])
def test_a_dead_runners_job_is_fired_again_within_a_lapse_and_polls(rig: Rig, scanner: str) -> None:
    served = agents(rig)
    names = [f"runner-{i}" for i in range(RUNNERS)]
    procs = {name: start(rig, name, served) for name in names}
    try:
        wait_for(lambda: all(events(rig, n, "started") for n in names), 120, "runners to start")
        target = served[-1]  # the agent the per-agent design looks at last
        rig.put(target, "victim", time.time(), {"sleep": 15})
        wait_for(lambda: rig.records("start"), 60, "the job to start")
        first = rig.records("start")[0]
        victim = next(n for n, p in procs.items() if p.pid == first["ppid"])
        survivors = [n for n in names if n != victim]
        # The sweep's scanner of that agent: the dying runner, or a live one (as if it had stepped there).
        holder = victim if scanner == "dead" else survivors[0]
        took = rig.store.request({"op": "take", "agent": target, "thread": "scheduler:recovery",
                                  "holder": holder, "lapse_ms": 600_000})
        assert took == {"reply": "took", "took": "took"}, took
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        killed_at = time.time()
        bound = 2 * LAPSE + 10 * POLL  # the lapse, a poll, and a wide margin: no agent count in it
        wait_for(lambda: any(r["ppid"] != first["ppid"] for r in rig.records("start")), 120,
                 "the job to be fired again")
        again = [r for r in rig.records("start") if r["ppid"] != first["ppid"]]
        time.sleep(2 * LAPSE)  # a second refire would show by now
        again = [r for r in rig.records("start") if r["ppid"] != first["ppid"]]
        assert len(again) == 1 and again[0]["recovered"], again
        delay = again[0]["t"] - killed_at
        print(f"\n[{rig.backend.name}] {len(served)} agents, scanner {scanner}: fired again {delay:.2f}s "
              f"after the kill (lapse {LAPSE}s, poll {POLL}s; bound {bound}s)")
        assert delay <= bound, (f"fired again {delay:.1f}s after its runner died: more than a lapse and polls "
                                f"({bound}s) with {len(served)} agents")
    finally:
        stop(list(procs.values()))


def test_start_up_lists_the_claim_index_not_every_agent(rig: Rig, tmp_path: Path) -> None:
    """One runner started and stopped: the recovery listings it sent (each agent's ``job_list``, the
    claim index's ``job_claims``) are a few, however many agents it serves."""
    served = agents(rig)
    proc = start(rig, "runner-solo", served)
    try:
        wait_for(lambda: events(rig, "runner-solo", "started"), 120, "the runner to start")
        time.sleep(POLL)
    finally:
        stop([proc])
    stopped = events(rig, "runner-solo", "stopped")
    assert len(stopped) == 1, stopped
    by_op = stopped[0]["by_op"]
    listings = by_op.get("job_list", 0) + by_op.get("job_claims", 0)
    print(f"\n[{rig.backend.name}] {len(served)} agents: start-up recovery listings {listings} ({by_op})")
    assert listings <= 5, f"{listings} recovery listings at start-up for {len(served)} agents: {by_op}"

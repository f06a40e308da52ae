"""The runner's parts without a fleet: its config, its fire command's environment, its bridge seam.

* config: flags and JSON agree on agents (null owner vs ""), bad configs (a
  driver that isn't a program included) exit 2 with a reason on stderr and
  nothing on stdout;
* fire: LNK_OWNER is set only for an agent with an owner (an inherited one is
  removed), the spec arrives on stdin, a command past its timeout is killed
  with its whole process group;
* bridge: a runner whose agents are configured with ``bridge`` and
  ``key_file`` reaches its store through a real StoreBridge and fires.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from scheduler_rig import FIRE, wait_for

import cloudstore.scheduling.fire as fire_module
from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling.config import ConfigError, load
from cloudstore.scheduling.fire import FireCommand
from cloudstore.scheduling.store_client import Agent


def test_agents_from_flags_and_json(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"agents": [{"owner": None, "id": "x:y"}, {"owner": "", "id": "e"}],
                                  "driver": ["lnk-bucket-store"], "fire": ["true"], "lapse": 9}))
    s = load(["--config", str(config), "--agent", "a", "--agent", "o:b:c", "--agent", ":z", "--lapse", "3",
              "--driver-env", "K=V=W"])
    assert [a.agent for a in s.agents] == [
        Agent(owner=None, id="x:y"),
        Agent(owner="", id="e"),
        Agent(owner=None, id="a"),
        Agent(owner="o", id="b:c"),
        Agent(owner="", id="z"),
    ]
    assert s.timing.lapse == 3.0 and s.timing.poll_interval == 2.0 and s.timing.max_sleep == 30.0
    assert s.driver_env == {"K": "V=W"} and s.fire == ["true"] and s.workers == 4 and s.runner


@pytest.mark.parametrize("argv, why", [
    (["--agent", "a", "--fire", "true"], "driver"),
    (["--agent", "a", "--driver", "d"], "fire"),
    (["--driver", "d", "--fire", "true"], "agent"),
    (["--agent", "a", "--agent", "a", "--driver", "d", "--fire", "true"], "twice"),
    (["--agent", "a", "--driver", "d", "--fire", "true", "--lapse", "0"], "lapse"),
])
def test_bad_settings_are_refused(argv: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load(argv)
    done = subprocess.run([sys.executable, "-m", "cloudstore.scheduler", *argv], capture_output=True, timeout=30)
    assert done.returncode == 2 and done.stdout == b"" and why.encode() in done.stderr


def test_missing_driver_program_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "cloudstore.scheduler", "--agent", "a", "--driver", "no-such-driver-x",
                           "--fire", "true"], capture_output=True, timeout=30)
    assert done.returncode == 2 and done.stdout == b"" and b"no-such-driver-x" in done.stderr


def test_bad_config_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"agents": [{"id": "a", "bridge": "/s"}], "fire": "true"}))
    with pytest.raises(ConfigError, match="key_file"):
        load(["--config", str(config)])
    config.write_text(json.dumps({"agents": [{"id": "a"}], "fire": "true", "driver": "d", "lapes": 3}))
    with pytest.raises(ConfigError, match="lapes: unknown key"):
        load(["--config", str(config)])


def test_fire_environment_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LNK_OWNER", "inherited")
    record = tmp_path / "r.jsonl"
    fire = FireCommand(FIRE + [str(record)], timeout=30)
    job = {"id": "j 1", "spec": {"k": ["é", 1.5]}, "due": 12.25}
    for agent in (Agent(owner=None, id="a"), Agent(owner="", id="b"), Agent(owner="o", id="c")):
        result = fire.run(agent, job, recovered=agent.id == "c", stop=lambda: None)
        assert result.exit == 0 and result.killed is None
    starts = [json.loads(line) for line in record.read_text().splitlines() if '"start"' in line]
    assert [(r["owner"], r["agent"], r["recovered"]) for r in starts] == [(None, "a", False), ("", "b", False),
                                                                          ("o", "c", True)]
    assert all(r["spec"] == job["spec"] and r["due"] == 12.25 and r["job"] == "j 1" for r in starts)


def test_the_fire_watcher_runs_before_a_command_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner killed between a command's start and its group's registration leaves the group running:
    so the watcher is started first, and registering is one pipe write.  Seen in CI under load, where the
    watcher's own start (a Python process) came after the command's, and a SIGKILL of the runner between the
    two left ``sleep 60`` running (tests/scheduler/test_fire_orphans.py)."""
    watcher = fire_module.FireWatcher()
    monkeypatch.setattr(fire_module, "WATCHER", watcher)
    real = subprocess.Popen
    watching_at_start: list[bool] = []

    def popen(argv: list[str], *args: object, **kwargs: object) -> subprocess.Popen:
        if not any("fire_watch.py" in str(a) for a in argv):
            watching_at_start.append(watcher._proc is not None and watcher._proc.poll() is None)
        return real(argv, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(fire_module.subprocess, "Popen", popen)
    result = FireCommand(["true"], timeout=30).run(Agent(owner=None, id="a"), {"id": "j", "spec": None, "due": 1},
                                                 recovered=False, stop=lambda: None)
    assert result.exit == 0 and watching_at_start == [True]


def test_fire_timeout_kills_the_group(tmp_path: Path) -> None:
    marker = tmp_path / "child-survived"
    # The shell starts a child in the same group; both must go at the timeout.
    fire = FireCommand(f"(sleep 3; touch {marker}) & sleep 30", timeout=0.5)
    clock = time.monotonic()
    result = fire.run(Agent(owner=None, id="a"), {"id": "j", "spec": None, "due": 0}, False, stop=lambda: None)
    assert result.killed == "timeout" and result.exit is not None and result.exit < 0
    assert time.monotonic() - clock < 10
    time.sleep(3.5)
    assert not marker.exists(), "a process of the fire's group outlived its timeout"


def test_fire_stops_when_claim_is_lost() -> None:
    fire = FireCommand(["sleep", "30"], timeout=60)
    asked = []

    def stop() -> str | None:
        asked.append(1)
        return "lost" if len(asked) > 3 else None

    result = fire.run(Agent(owner=None, id="a"), {"id": "j", "spec": None, "due": 0}, False, stop)
    assert result.killed == "lost" and result.duration < 10


def test_runner_through_store_bridge(tmp_path: Path) -> None:
    """The StoreClient seam: agents with ``bridge``/``key_file`` go through a real bridge, no driver of their own."""
    from cloudstore.bridge import AgentSpec, StoreBridge
    from cloudstore.bridge.proof import new_key_hex

    short = Path(tempfile.mkdtemp(prefix="lsch", dir="/tmp"))  # a socket path must fit in 108 bytes
    store = tmp_path / "store"
    store.mkdir()
    env = {"LNK_BUCKET_URL": store.as_uri()}
    agents, specs = [], []
    for owner, agent_id in ((None, "a"), ("o", "b")):
        folder = short / f"ag-{agent_id}"
        (folder / "chats").mkdir(parents=True)
        key_hex = new_key_hex()
        key_file = short / f"{agent_id}.key"
        key_file.write_text(key_hex + "\n")
        key_file.chmod(0o600)
        specs.append(AgentSpec(owner=owner, id=agent_id, key=bytes.fromhex(key_hex), folder=str(folder)))
        agents.append({"owner": owner, "id": agent_id, "bridge": str(short / "h" / ".link-store.sock"),
                       "key_file": str(key_file)})
    (short / "h").mkdir()
    bridge = StoreBridge(short / "h", specs, "lnk-bucket-store", env).start()
    record = tmp_path / "fired.jsonl"
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"agents": agents, "fire": FIRE + [str(record)]}))
    log = tmp_path / "runner.log"
    direct = ServeProcess("lnk-bucket-store", env)
    with open(log, "wb") as err:
        runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                  stdout=subprocess.PIPE, stderr=err)
    try:
        now = time.time()
        for agent in agents:
            reply = direct.request({"op": "job_put", "agent": {"owner": agent["owner"], "id": agent["id"]},
                                    "place": "waiting", "job": {"id": "j", "spec": 1, "due": now + 0.5}})
            assert reply == {"reply": "done"}
        wait_for(lambda: record.exists() and record.read_text().count('"end"') == 2, 30, "both jobs fired via bridge")
    finally:
        runner.terminate()
        out, _ = runner.communicate(timeout=20)
        bridge.stop()
        direct.close()
        shutil.rmtree(short, ignore_errors=True)
    assert out == b""
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    stopped = [e for e in events if e["event"] == "stopped"]
    assert stopped and stopped[0]["fired"] == 2 and stopped[0]["requests"] > 0
    assert {(e["owner"], e["agent"]) for e in events if e["event"] == "fired"} == {(None, "a"), ("o", "b")}


def test_a_driver_too_old_to_take_the_claim_lease_fires_nothing() -> None:
    """An older own driver answers ``job_claim`` without ``took``: it shifted the job without a lease.
    The runner must not fire it (no lease guards it): it reports an error and leaves it to recovery."""
    from cloudstore.scheduling.claim_leases import Claims
    from cloudstore.scheduling.claiming import Claimer
    from cloudstore.scheduling.store_client import AgentStore

    class OldDriver:
        def request(self, request: dict) -> dict:
            assert request["op"] == "job_claim", request
            return {"reply": "claimed", "job": {"id": request["id"], "spec": None, "due": 0}}

        def close(self) -> None:
            pass

    class NeverFire:
        def run(self, *args: object) -> None:
            raise AssertionError("a job claimed without its lease was fired")

    claims = Claims("runner-A", 30.0)
    claimer = Claimer(claims, NeverFire(), 1, keep_ending=False)  # type: ignore[arg-type]
    told: list[str] = []
    try:
        assert claimer.acquire_slot(lambda: False)
        assert claimer.dispatch(AgentStore(Agent(owner=None, id="a"), OldDriver(), own_driver=True), "j", told.append)
        claimer.shutdown()
    finally:
        claims.close()
    assert told == ["error"]
    assert not claimer.busy(Agent(owner=None, id="a"), "j") and claimer.acquire_slot(lambda: False), "slot kept"

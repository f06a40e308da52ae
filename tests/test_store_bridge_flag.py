"""``lnk-cloud-scheduler --store-bridge SOCKET --key-file FILE`` (issue 29, item 9).

On eafe802 the flag was ``unrecognized arguments``: only the config file's
per-agent ``bridge``/``key_file`` reached agents behind a store bridge.  Here
two agents behind one real bridge (started by the test, on a folder store)
are given on the command line only, a job is put for each through the bridge,
and each is fired once.  The flags are held to the config's rules: a bridge
needs its key file and the other way round, they apply to ``--agent`` agents
(at least one), and a count of key files that pairs with no agent list is
refused; each exits 2 with a message naming the flags, before anything starts.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import clean_env, wait_for

from cloudstore.bridge.client import BridgeClient
from cloudstore.bridge.proof import read_key_file

FIRE_RECORD = Path(__file__).parent / "scheduler" / "fire_record.py"
AGENTS = [("o", "a"), ("o", "b")]




def key_file(path: Path) -> Path:
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder (a Unix socket's path has at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="sbf-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def scheduler(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloudstore.scheduler", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def test_two_agents_behind_a_bridge_given_by_flags_fire_once_each(short_dir: Path) -> None:
    harness, store, wake = short_dir / "h", short_dir / "store", short_dir / "wake"
    for made in (harness, store):
        made.mkdir()
    keys = {agent_id: key_file(short_dir / f"{agent_id}.key") for _, agent_id in AGENTS}
    config = short_dir / "bridge.json"
    config.write_text(json.dumps({"agents": [
        {"owner": owner, "id": agent_id, "key_file": str(keys[agent_id]), "folder": str(short_dir / agent_id)}
        for owner, agent_id in AGENTS]}))
    for _, agent_id in AGENTS:
        (short_dir / agent_id).mkdir()
    env = clean_env(LNK_WAKE_DIR=str(wake))
    bridge = subprocess.Popen(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--config", str(config),
         "--driver", "lnk-bucket-store", "--driver-env", f"LNK_BUCKET_URL=file://{store}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    socket_path = harness / ".link-store.sock"
    record = short_dir / "fired.jsonl"
    log = short_dir / "runner.log"
    runner = None
    try:
        wait_for(lambda: socket_path.exists() or bridge.poll() is not None, 60, "the bridge's socket")
        assert bridge.poll() is None, "the bridge stopped"
        argv = [sys.executable, "-m", "cloudstore.scheduler", "--store-bridge", str(socket_path)]
        for owner, agent_id in AGENTS:
            argv += ["--agent", f"{owner}:{agent_id}", "--key-file", str(keys[agent_id])]
        argv += ["--fire", f"{sys.executable} -S {FIRE_RECORD} {record}", "--poll-interval", "0.5"]
        with open(log, "wb") as err:  # no --driver: every agent is bridged
            runner = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env)
        wait_for(lambda: '"started"' in log.read_text() or runner.poll() is not None, 60, "the runner's start")
        assert runner.poll() is None, log.read_text()[-3000:]
        for owner, agent_id in AGENTS:  # put as the harness does: through the bridge, with the agent's key
            client = BridgeClient(str(socket_path), owner, agent_id, read_key_file(keys[agent_id]))
            reply = client.request({"op": "job_put", "agent": {"owner": owner, "id": agent_id}, "place": "waiting",
                                    "job": {"id": f"job-{agent_id}", "spec": {"n": 1}, "due": time.time()}})
            assert reply == {"reply": "done"}, reply

        def ended() -> list[dict]:
            if not record.exists():
                return []
            lines = [json.loads(line) for line in record.read_text().splitlines()]
            return [r for r in lines if r["ev"] == "end"]

        wait_for(lambda: len(ended()) >= 2, 60, "both jobs to fire")
        # Once each: after both fired, one more poll's worth finds nothing to fire again.
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(30) == 0
        fired = sorted((r["owner"], r["agent"], r["job"]) for r in ended())
        assert fired == [("o", "a", "job-a"), ("o", "b", "job-b")], fired
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        assert sorted((e["owner"], e["agent"]) for e in events if e.get("event") == "fired") == AGENTS
        assert runner.stdout is not None and runner.stdout.read() == b""
    finally:
        if runner is not None and runner.poll() is None:
            runner.kill()
            runner.wait()
        bridge.terminate()
        bridge.wait(30)


@pytest.mark.parametrize("flags, needed", [
    (["--agent", "o:a", "--store-bridge", "/h/.link-store.sock"], "--store-bridge needs --key-file"),
    (["--agent", "o:a", "--key-file", "KEY"], "--key-file needs --store-bridge"),
    (["--store-bridge", "/h/.link-store.sock", "--key-file", "KEY"], "give at least one --agent"),
    (["--store-bridge", "/h/.link-store.sock", "--agent", "o:a", "--agent", "o:b", "--agent", "o:c",
      "--key-file", "KEY", "--key-file", "KEY"], "--key-file given 2 times for 3 --agent agents"),
    (["--store-bridge", "", "--agent", "o:a", "--key-file", "KEY"], "--store-bridge"),
])
def test_wrong_combinations_are_refused_with_exit_2(tmp_path: Path, flags: list[str], needed: str) -> None:
    key = str(key_file(tmp_path / "k.key"))
    done = scheduler([*(key if f == "KEY" else f for f in flags), "--fire", "true"], clean_env())
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert needed in done.stderr and "Traceback" not in done.stderr and done.stdout == "", done.stderr


def test_a_key_file_that_cannot_be_used_is_refused_naming_the_agent(tmp_path: Path) -> None:
    key = key_file(tmp_path / "k.key")
    key.chmod(0o644)
    done = scheduler(["--store-bridge", str(tmp_path / ".link-store.sock"), "--agent", "o:a", "--key-file", str(key),
                      "--fire", "true"], clean_env())
    assert done.returncode == 2 and "key_file of o/a" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_help_names_the_flags() -> None:
    done = scheduler(["--help"], clean_env())
    assert done.returncode == 0 and "--store-bridge SOCKET" in done.stdout and "--key-file FILE" in done.stdout
    text = (Path(__file__).parent.parent / "docs" / "scheduler.md").read_text()
    assert "--store-bridge SOCKET" in text and "--key-file FILE" in text

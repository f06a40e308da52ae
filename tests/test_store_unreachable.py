"""A store that is only unreachable is retried with backoff and shown (issue 29, item 8).

Not a misconfiguration: a bridge whose socket is there but refuses (it is
restarting) does not stop the runner at start-up.  The runner logs
``store_unreachable``, retries with a growing wait (``store_error`` with
``retry_in``), and exports ``lnk_scheduler_store_unreachable{owner,agent}``
= 1; once the bridge is back, the agent's job fires and the gauge is 0.  On
eafe802 the runner retried every second and no metric showed the state.
A bridge started with no setting for its driver warns, naming the setting
(and its start-up line names the driver's contract in words, not as
``Contract(version=1, ...)``: item 13).
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import clean_env, wait_for

from cloudstore.bridge.client import BridgeClient
from cloudstore.bridge.proof import read_key_file
from cloudstore.runtime.metrics import exposition as metrics
from cloudstore.scheduling.log import read_events

FIRE_RECORD = Path(__file__).parent / "scheduler" / "fire_record.py"




@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="su-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)




def gauge(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    assert "# TYPE lnk_scheduler_store_unreachable gauge" in text
    return {labels: v for (name, labels), v in metrics.parse(text).items() if name == "lnk_scheduler_store_unreachable"}


def test_an_unreachable_bridge_is_retried_with_backoff_and_shown_in_a_gauge(short_dir: Path) -> None:
    harness, store, folder = short_dir / "h", short_dir / "store", short_dir / "b"
    for made in (harness, store, folder):
        made.mkdir()
    key = short_dir / "b.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    socket_path = harness / ".link-store.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))  # a socket nobody listens on: connect() is refused, as while a bridge restarts
    stale.close()
    record, log = short_dir / "fired.jsonl", short_dir / "runner.log"
    config = short_dir / "runner.json"
    config.write_text(json.dumps({
        "agents": [{"owner": "o", "id": "b", "bridge": str(socket_path), "key_file": str(key)}],
        "fire": [sys.executable, "-S", str(FIRE_RECORD), str(record)],
        "metrics_port": 0, "poll_interval": 0.5,
    }))
    env = clean_env(LNK_WAKE_DIR=str(short_dir / "wake"))
    bridge = None
    with open(log, "wb") as err:
        runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        wait_for(lambda: len(read_events(log, "store_error")) >= 3 or runner.poll() is not None, 60, "three retries")
        assert runner.poll() is None, log.read_text()[-3000:]
        unreachable = read_events(log, "store_unreachable")
        assert unreachable and unreachable[0]["owner"] == "o" and "nothing was sent" in unreachable[0]["error"]
        waits = [e["retry_in"] for e in read_events(log, "store_error")[:3]]
        assert waits[0] < waits[1] < waits[2], waits  # backoff: each wait longer than the one before
        assert not any("outcome unknown" in e["error"] for e in read_events(log, "store_error"))
        port = read_events(log, "metrics")[0]["port"]
        assert gauge(port) == {(("agent", "b"), ("owner", "o")): 1.0}

        bridge = subprocess.Popen(
            [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "b",
             "--agent-owner", "o", "--key-file", str(key), "--agent-folder", str(folder),
             "--driver", "lnk-bucket-store", "--driver-env", f"LNK_BUCKET_URL=file://{store}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

        def put() -> bool:
            try:
                client = BridgeClient(str(socket_path), "o", "b", read_key_file(key))
                return client.request({"op": "job_put", "agent": {"owner": "o", "id": "b"}, "place": "waiting",
                                       "job": {"id": "j", "spec": None, "due": time.time()}}) == {"reply": "done"}
            except OSError:
                return False  # the bridge is not listening yet

        wait_for(put, 60, "the bridge to take a put")
        wait_for(lambda: record.exists() and '"end"' in record.read_text(), 90, "the job to fire")
        assert gauge(port) == {(("agent", "b"), ("owner", "o")): 0.0}
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(30) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        if bridge is not None:
            bridge.terminate()
            bridge.wait(30)


def test_a_bridge_started_with_no_driver_setting_warns_naming_it(short_dir: Path) -> None:
    """And, since issue 46 (item 1), refuses to start (exit 2) with one line naming it, as the runner does."""
    harness, folder = short_dir / "h", short_dir / "a"
    harness.mkdir()
    folder.mkdir()
    key = short_dir / "a.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    argv = [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a", "--no-owner",
            "--key-file", str(key), "--agent-folder", str(folder), "--driver", "lnk-bucket-store"]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=clean_env())
    assert done.returncode == 2, done.stderr
    assert "LNK_BUCKET_URL" in done.stderr and "WARNING" in done.stderr, done.stderr
    assert "ERROR cannot start" in done.stderr and "--driver-env" in done.stderr, done.stderr
    assert done.stdout == ""
    # Item 13: the start-up line says what the driver does in words, not as a Python repr.
    (short_dir / "store").mkdir()
    bridge = subprocess.Popen(argv + [f"--driver-env=LNK_BUCKET_URL=file://{short_dir / 'store'}"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=clean_env())
    try:
        wait_for(lambda: (harness / ".link-store.sock").exists() or bridge.poll() is not None, 60, "the bridge")
    finally:
        bridge.send_signal(signal.SIGTERM)
        out, err = bridge.communicate(timeout=30)
    assert out == b""
    assert "Contract(" not in err.decode() and "contract version 1: serve" in err.decode(), err

"""Ctrl-C in a terminal ends the scheduler and the bridge without a traceback (issue 29, item 13).

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the
program and every driver it started.  On eafe802 each driver printed a
``KeyboardInterrupt`` traceback (about 60 lines for a scheduler), and a
driver gone that way could not finish the fire under way.  Now a serve
driver fed by a program leaves the SIGINT to that program and ends when its
stdin closes; one a person runs at a terminal ends quietly on Ctrl-C.
Each program here runs in a session of its own, as a shell's job does, and
the whole group is sent SIGINT once.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from support import clean_env, wait_for

from cloudstore.bridge.client import BridgeClient
from cloudstore.protocol.client import ServeProcess

FIRE_RECORD = Path(__file__).parent / "scheduler" / "fire_record.py"




def assert_quiet(stderr: str) -> None:
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-4000:]


def test_ctrl_c_on_a_scheduler_prints_no_traceback_and_the_fire_under_way_is_finished(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    env = {"LNK_BUCKET_URL": f"file://{store}"}
    record, log = tmp_path / "fired.jsonl", tmp_path / "runner.log"
    agent = {"owner": None, "id": "a"}
    config = tmp_path / "runner.json"
    config.write_text(json.dumps({
        "agents": [agent], "driver": "lnk-bucket-store", "driver_env": env,
        "fire": [sys.executable, "-S", str(FIRE_RECORD), str(record)], "poll_interval": 0.5,
    }))
    with open(log, "wb") as err:
        runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  env=clean_env(LNK_WAKE_DIR=str(tmp_path / "wake")), start_new_session=True)
    try:
        wait_for(lambda: '"started"' in log.read_text() or runner.poll() is not None, 60, "the runner's start")
        with ServeProcess("lnk-bucket-store", env) as client:
            reply = client.request({"op": "job_put", "agent": agent, "place": "waiting",
                                    "job": {"id": "j", "spec": {"sleep": 2}, "due": time.time()}})
            assert reply == {"reply": "done"}, reply
            wait_for(lambda: record.exists() and '"start"' in record.read_text(), 60, "the fire to start")
            os.killpg(runner.pid, signal.SIGINT)  # Ctrl-C: the runner and its drivers, all at once
            assert runner.wait(60) == 0
            assert '"end"' in record.read_text(), "the fire under way was cut short"
            for place in ("waiting", "firing"):  # finished through its drivers after the Ctrl-C
                assert client.request({"op": "job_count", "agent": agent, "place": place})["count"] == 0, place
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    assert_quiet(log.read_text())
    assert '"event": "stopped"' in log.read_text() or '"event":"stopped"' in log.read_text()


def test_ctrl_c_on_a_bridge_prints_no_traceback(tmp_path: Path) -> None:
    harness, folder, store = tmp_path / "h", tmp_path / "a", tmp_path / "store"
    for made in (harness, folder, store):
        made.mkdir()
    key = tmp_path / "a.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    bridge = subprocess.Popen(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a", "--no-owner",
         "--key-file", str(key), "--agent-folder", str(folder), "--driver", "lnk-bucket-store",
         "--driver-env", f"LNK_BUCKET_URL=file://{store}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
        start_new_session=True)
    try:
        socket_path = harness / ".link-store.sock"
        wait_for(lambda: socket_path.exists() or bridge.poll() is not None, 60, "the bridge's socket")
        me = BridgeClient(str(socket_path), None, "a", bytes.fromhex(key.read_text().strip()))
        assert me.request({"op": "append", "agent": me.agent, "thread": "t", "event": {"seq": 1}})["reply"] == "done"
        os.killpg(bridge.pid, signal.SIGINT)
        out, err = bridge.communicate(timeout=60)
    finally:
        if bridge.poll() is None:
            os.killpg(bridge.pid, signal.SIGKILL)
            bridge.wait()
    assert bridge.returncode == 0, err
    assert_quiet(err.decode())
    assert out == b""


def test_a_driver_at_a_terminal_ends_quietly_on_ctrl_c(tmp_path: Path) -> None:
    """``lnk-bucket-store serve`` typed at a terminal (its stdin a tty): Ctrl-C ends it, exit 130, no traceback."""
    import pty

    leader, follower = pty.openpty()
    try:
        driver = subprocess.Popen([sys.executable, "-c", "from cloudstore.driver import main_bucket; main_bucket()",
                                   "serve"],
                                  stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=clean_env(LNK_BUCKET_URL=f"file://{tmp_path}"), start_new_session=True,
                                  # As a shell starts a foreground job: SIGINT at its default, whatever this
                                  # process inherited (a suite run in the background has it ignored, and a
                                  # program started with SIGINT ignored rightly keeps ignoring it).
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        os.write(leader, b'{"op": "last", "agent": {"owner": null, "id": "a"}, "thread": "t"}\n')
        line = driver.stdout.readline() if driver.stdout else b""
        assert b'"reply"' in line, line
        os.killpg(driver.pid, signal.SIGINT)
        out, err = driver.communicate(timeout=30)
    finally:
        os.close(leader)
        os.close(follower)
    assert driver.returncode == 130, err
    assert_quiet(err.decode())

"""``lnk-store-bridge`` as a program: serves until SIGTERM, refuses unsafe keys."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

from bridge_helpers import FAKE_DRIVER, wait_for
from cloudstore.bridge import SOCKET_NAME, BridgeClient
from cloudstore.bridge.proof import new_key_hex

BRIDGE = [sys.executable, "-m", "cloudstore.bridge.cli"]


def key_file(path, mode: int = 0o600) -> tuple[str, bytes]:
    hex_key = new_key_hex()
    path.write_text(hex_key + "\n")
    os.chmod(path, mode)
    return str(path), bytes.fromhex(hex_key)


def test_serves_flag_and_config_agents_until_sigterm(short_dir):
    harness, a1, a2 = short_dir / "h", short_dir / "a1", short_dir / "a2"
    for d in (harness, a1 / "chats", a2 / "chats"):
        d.mkdir(parents=True)
    k1, key1 = key_file(short_dir / "k1")
    k2, key2 = key_file(short_dir / "k2")
    config = short_dir / "bridge.json"
    config.write_text(json.dumps({"agents": [{"id": "a2", "owner": None, "key_file": k2, "folder": str(a2)}]}))
    record = short_dir / "record.jsonl"
    proc = subprocess.Popen(
        BRIDGE + ["--harness", str(harness), "--agent-id", "a1", "--agent-owner", "o", "--key-file", k1,
                  "--agent-folder", str(a1), "--config", str(config),
                  "--driver", shlex.join(FAKE_DRIVER), "--driver-env", f"FAKE_RECORD={record}",
                  "--call-timeout", "10", "--request-timeout", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        sock = str(harness / SOCKET_NAME)
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, what="the bridge's socket")
        one = BridgeClient(sock, "o", "a1", key1).op("last", thread="t")
        two = BridgeClient(sock, None, "a2", key2).op("last", thread="t")
        assert one["reply"] == two["reply"] == "done"
        assert two["store_dir"] == str(a2 / "chats")
        assert BridgeClient(sock, "o", "a2", key2).op("last", thread="t")["reply"] == "error"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == b""  # logs go to stderr only
    assert not os.path.exists(sock)
    assert len(record.read_text().splitlines()) == 2


def test_refuses_to_start_with_a_key_others_may_read(short_dir):
    k, _ = key_file(short_dir / "k", 0o644)
    done = subprocess.run(
        BRIDGE + ["--harness", str(short_dir), "--agent-id", "a", "--no-owner", "--key-file", k,
                  "--agent-folder", str(short_dir), "--driver", shlex.join(FAKE_DRIVER)],
        capture_output=True, timeout=60,
    )
    assert done.returncode == 1
    assert b"0600" in done.stderr
    assert not os.path.exists(short_dir / SOCKET_NAME)


def test_an_agent_by_flags_must_say_its_owner(short_dir):
    k, _ = key_file(short_dir / "k")
    done = subprocess.run(
        BRIDGE + ["--harness", str(short_dir), "--agent-id", "a", "--key-file", k,
                  "--agent-folder", str(short_dir), "--driver", shlex.join(FAKE_DRIVER)],
        capture_output=True, timeout=60,
    )
    assert done.returncode == 2 and b"--no-owner" in done.stderr

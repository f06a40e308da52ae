"""``lnk-store-bridge`` as a program: serves until SIGTERM, refuses unsafe keys and bad configs.

A config that is not ``{"agents": [{id, owner, key_file, folder}, ...]}``
with exactly those types (a JSON list, a number for a path or an id, an
unknown key, an agent twice, JSON that isn't) exits 2 with the key path on
stderr and no traceback, before any key is read or socket made.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bridge_helpers import FAKE_DRIVER, wait_for

from cloudstore.bridge import SOCKET_NAME, BridgeClient, cli
from cloudstore.bridge.proof import new_key_hex
from cloudstore.bridge.store_check import CHECK_THREAD

BRIDGE = [sys.executable, "-m", "cloudstore.bridge.cli"]


def key_file(path, mode: int = 0o600) -> tuple[str, bytes]:
    hex_key = new_key_hex()
    path.write_text(hex_key + "\n")
    os.chmod(path, mode)
    return str(path), bytes.fromhex(hex_key)


def two_agents_bridge(short_dir, *extra: str) -> tuple[subprocess.Popen[bytes], str, bytes, bytes, Path]:
    """``lnk-store-bridge`` as a program serving a1 (owner o, by flags) and a2 (no owner, by its config)
    with the fake driver and ``extra`` flags: (the process, its socket, a1's key, a2's key, a2's folder)."""
    harness, a1, a2 = short_dir / "h", short_dir / "a1", short_dir / "a2"
    for d in (harness, a1 / "chats", a2 / "chats"):
        d.mkdir(parents=True)
    k1, key1 = key_file(short_dir / "k1")
    k2, key2 = key_file(short_dir / "k2")
    config = short_dir / "bridge.json"
    config.write_text(json.dumps({"agents": [{"id": "a2", "owner": None, "key_file": k2, "folder": str(a2)}]}))
    proc = subprocess.Popen(
        BRIDGE + ["--harness", str(harness), "--agent-id", "a1", "--agent-owner", "o", "--key-file", k1,
                  "--agent-folder", str(a1), "--config", str(config), "--driver", shlex.join(FAKE_DRIVER),
                  *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    return proc, str(harness / SOCKET_NAME), key1, key2, a2


def test_serves_flag_and_config_agents_until_sigterm(short_dir):
    record = short_dir / "record.jsonl"
    proc, sock, key1, key2, a2 = two_agents_bridge(
        short_dir, "--driver-env", f"FAKE_RECORD={record}", "--call-timeout", "10", "--request-timeout", "2")
    try:
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
    asked = [json.loads(line) for line in record.read_text().splitlines()]
    # The bridge's own start-up question (issue 46: a store it cannot open stops it), then the two calls.
    assert [r["thread"] for r in asked] == [CHECK_THREAD, "t", "t"]


def test_refuses_to_start_with_a_key_others_may_read(short_dir):
    k, _ = key_file(short_dir / "k", 0o644)
    done = subprocess.run(
        BRIDGE + ["--harness", str(short_dir), "--agent-id", "a", "--no-owner", "--key-file", k,
                  "--agent-folder", str(short_dir), "--driver", shlex.join(FAKE_DRIVER)],
        capture_output=True, timeout=60,
    )
    assert done.returncode == 2  # no restart mends it (RestartPreventExitStatus=2)
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


def _agent(short_dir, name: str = "a", **change) -> dict:
    return {"id": name, "owner": None, "key_file": str(short_dir / f"{name}.key"), "folder": str(short_dir), **change}


def _never_started(*args, **kwargs):
    raise AssertionError("a bad config was taken: the bridge was about to start")


BAD_CONFIGS = [
    (lambda d: [_agent(d)], "must be an object, not ["),
    (lambda d: {"agents": {"id": "a"}}, "agents: must be a list of objects"),
    (lambda d: {"agents": ["a"]}, "agents[0]: must be an object"),
    (lambda d: {}, "agents: is required"),
    (lambda d: {"agents": [], "harness": "/x"}, "harness: unknown key"),
    (lambda d: {"agents": [_agent(d), _agent(d, "b", key_file=5)]}, "agents[1].key_file: must be a non-empty string"),
    (lambda d: {"agents": [_agent(d, folder=["/x"])]}, "agents[0].folder: must be a non-empty string"),
    (lambda d: {"agents": [_agent(d, id=5)]}, "agents[0].id: must be a non-empty string, not 5"),
    (lambda d: {"agents": [_agent(d, owner=False)]}, "agents[0].owner: must be a string or null, not false"),
    (lambda d: {"agents": [{k: v for k, v in _agent(d).items() if k != "owner"}]}, "agents[0].owner: is required"),
    (lambda d: {"agents": [_agent(d, extra=1)]}, "agents[0].extra: unknown key"),
    (lambda d: {"agents": [_agent(d), _agent(d, key_file="/other")]}, "agents[1]: the same agent as agents[0]"),
    (lambda d: '{"agents": [}', "not valid JSON"),
]


@pytest.mark.parametrize("make, why", BAD_CONFIGS, ids=[w.split(":")[0] for _, w in BAD_CONFIGS])
def test_bad_config_exits_2_naming_the_key(short_dir, capsys, monkeypatch, make, why):
    key_file(short_dir / "a.key")
    monkeypatch.setattr(cli, "StoreBridge", _never_started)  # a config taken by mistake fails, never serves
    config = make(short_dir)
    path = short_dir / "bridge.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(SystemExit) as exited:
        cli.main(["--harness", str(short_dir), "--config", str(path), "--driver", shlex.join(FAKE_DRIVER)])
    out, err = capsys.readouterr()
    assert exited.value.code == 2, err
    assert why in err and str(path) in err and "Traceback" not in err
    assert out == ""
    assert not os.path.exists(short_dir / SOCKET_NAME)


def test_a_config_list_exits_2_as_a_program(short_dir):
    """The whole program (not main in-process): a JSON list used to raise an uncaught AttributeError."""
    path = short_dir / "bridge.json"
    path.write_text(json.dumps([_agent(short_dir)]))
    done = subprocess.run(BRIDGE + ["--harness", str(short_dir), "--config", str(path),
                                    "--driver", shlex.join(FAKE_DRIVER)], capture_output=True, timeout=60)
    assert done.returncode == 2 and done.stdout == b""
    assert b"must be an object" in done.stderr and b"Traceback" not in done.stderr


def test_flag_agent_twice_in_config_exits_2(short_dir, capsys, monkeypatch):
    k, _ = key_file(short_dir / "a.key")
    monkeypatch.setattr(cli, "StoreBridge", _never_started)
    path = short_dir / "bridge.json"
    path.write_text(json.dumps({"agents": [_agent(short_dir)]}))
    with pytest.raises(SystemExit) as exited:
        cli.main(["--harness", str(short_dir), "--agent-id", "a", "--no-owner", "--key-file", k,
                  "--agent-folder", str(short_dir), "--config", str(path), "--driver", shlex.join(FAKE_DRIVER)])
    assert exited.value.code == 2 and "given twice" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--call-timeout", "--request-timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_timeouts_must_be_finite_and_positive(short_dir, capsys, monkeypatch, flag, value):
    k, _ = key_file(short_dir / "a.key")
    monkeypatch.setattr(cli, "StoreBridge", _never_started)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--harness", str(short_dir), "--agent-id", "a", "--no-owner", "--key-file", k,
                  "--agent-folder", str(short_dir), "--driver", shlex.join(FAKE_DRIVER), flag, value])
    assert exited.value.code == 2 and f"{flag}: must be a number" in capsys.readouterr().err

"""Structured logs (issue 15): ``LNK_LOG_FORMAT=json`` / ``--log-format json``.

Every line a program writes on stderr must parse as one JSON object with
time, level, logger, program, event and message (``jsonlog.SCHEMA``, issue
46: the scheduler's lines too, tests/test_log_schema.py), while stdout keeps
carrying what it carried (a driver's replies only, the admin tool's
report); the text format stays the default.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudstore.bridge import SOCKET_NAME, BridgeClient
from cloudstore.bridge.proof import new_key_hex
from cloudstore.runtime.jsonlog import SCHEMA, JsonFormatter

KEYS = set(SCHEMA)


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr`` as JSON; fails naming the first line that is not one object with KEYS."""
    out = []
    for line in stderr.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            pytest.fail(f"a stderr line is not JSON: {line!r}\nwhole stderr:\n{stderr}")
        assert isinstance(value, dict) and KEYS <= set(value), line
        out.append(value)
    return out


def test_formatter_writes_one_line_with_the_fields_and_the_traceback() -> None:
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record = logging.LogRecord("cloudstore", logging.ERROR, __file__, 1, "op=%s failed", ("append",),
                                   sys.exc_info())
    record.op = "append"
    record.requests = 3
    line = JsonFormatter("lnk-test").format(record)
    assert "\n" not in line
    value = json.loads(line)
    assert value["level"] == "ERROR" and value["logger"] == "cloudstore" and value["program"] == "lnk-test"
    assert value["message"] == "op=append failed" and value["event"] == "log"
    assert value["op"] == "append" and value["requests"] == 3
    assert "ValueError: bad\nthing" in value["exc"]
    assert value["time"].endswith("Z") and value["time"][10] == "T"


def _call(env: dict[str, str], request: dict[str, Any], command: str = "call") -> subprocess.CompletedProcess:
    return subprocess.run(["lnk-bucket-store", command], input=json.dumps(request), capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def test_driver_logs_json_on_stderr_and_replies_only_on_stdout(tmp_path: Path) -> None:
    env = {"LNK_BUCKET_URL": f"file://{tmp_path}", "LNK_LOG_FORMAT": "json", "LNK_STORE_LOG": "debug"}
    agent = {"id": "a", "owner": None}
    done = _call(env, {"op": "append", "agent": agent, "thread": "t", "event": {"seq": 1}})
    assert done.returncode == 0
    assert done.stdout == '{"reply": "done"}\n'
    lines = json_lines(done.stderr)
    debug = [line for line in lines if line.get("op") == "append"]
    assert len(debug) == 1 and debug[0]["level"] == "DEBUG" and debug[0]["program"] == "lnk-bucket-store"
    assert debug[0]["reply"] == "done" and debug[0]["requests"] > 0 and isinstance(debug[0]["ms"], float)


def test_driver_error_log_is_json_too(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = {"LNK_BUCKET_URL": f"file://{blocker}/store", "LNK_LOG_FORMAT": "json"}
    done = _call(env, {"op": "last", "agent": {"id": "a", "owner": None}, "thread": "t"})
    reply = json.loads(done.stdout)
    assert reply["reply"] == "error" and "LNK_BUCKET_URL" in reply["error"]
    errors = [line for line in json_lines(done.stderr) if line["level"] == "ERROR"]
    assert errors and "cannot open the store" in errors[0]["message"]


def test_text_stays_the_default(tmp_path: Path) -> None:
    env = {"LNK_BUCKET_URL": f"file://{tmp_path}", "LNK_STORE_LOG": "debug"}
    done = _call(env, {"op": "last", "agent": {"id": "a", "owner": None}, "thread": "t"})
    assert done.stderr.startswith("lnk-bucket-store: DEBUG op=last")


def test_stray_writes_warnings_and_crashes_are_json_lines() -> None:
    code = """
import sys, threading, warnings
from cloudstore.runtime import jsonlog
jsonlog.configure("lnk-x", "WARNING", "%(message)s")
print("a stray line\\nand a second", file=sys.stderr)
sys.stderr.write("no newline yet")
sys.stderr.flush()
warnings.warn("careful")
t = threading.Thread(target=lambda: 1 / 0, name="worker")
t.start(); t.join()
raise RuntimeError("the end")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LNK_LOG_FORMAT": "json"})
    assert done.returncode == 1
    lines = json_lines(done.stderr)
    messages = [line["message"] for line in lines]
    assert messages[:3] == ["a stray line", "and a second", "no newline yet"]
    assert any("careful" in m for m in messages)
    crashes = [line for line in lines if line["logger"] == "cloudstore.crash"]
    assert len(crashes) == 2
    assert "ZeroDivisionError" in crashes[0]["exc"] and "worker" in crashes[0]["message"]
    assert "RuntimeError: the end" in crashes[1]["exc"]


# --------------------------------------------------------------------------
# The bridge, with its drivers' lines in the same stream


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkj", dir="/tmp"))  # a socket path fits in 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_bridge_and_its_drivers_log_json_with_the_flag(short_dir: Path) -> None:
    harness, folder = short_dir / "h", short_dir / "a1"
    for d in (harness, folder / "chats"):
        d.mkdir(parents=True)
    hex_key = new_key_hex()
    (short_dir / "k1").write_text(hex_key + "\n")
    os.chmod(short_dir / "k1", 0o600)
    env = {k: v for k, v in os.environ.items() if k != "LNK_LOG_FORMAT"}
    (short_dir / "bucket").mkdir(exist_ok=True)  # drivers refuse a folder that does not exist
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a1",
         "--no-owner", "--key-file", str(short_dir / "k1"), "--agent-folder", str(folder),
         "--driver", "lnk-bucket-store", "--driver-env", f"LNK_BUCKET_URL=file://{short_dir / 'bucket'}",
         "--driver-env", "LNK_STORE_LOG=debug", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        sock = str(harness / SOCKET_NAME)
        deadline = time.monotonic() + 30
        while not os.path.exists(sock) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        client = BridgeClient(sock, None, "a1", bytes.fromhex(hex_key))
        assert client.op("append", thread="t", event={"seq": 1}) == {"reply": "done"}
        assert client.op("file_read", path="../x")["error"].startswith("refused:")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out == b""
    lines = json_lines(err.decode("utf-8"))
    programs = {line["program"] for line in lines}
    assert programs == {"lnk-store-bridge", "lnk-bucket-store"}, programs
    assert any(line["level"] == "WARNING" and "refused" in line["message"] for line in lines)
    assert any(line.get("op") == "append" and line["program"] == "lnk-bucket-store" for line in lines)


# --------------------------------------------------------------------------
# The admin tool


def test_admin_logs_json_and_keeps_its_report_on_stdout(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    (tmp_path / "store").mkdir()  # drivers refuse a folder that does not exist
    put = subprocess.run(["lnk-bucket-store", "call"], capture_output=True, text=True, timeout=60,
                         input=json.dumps({"op": "append", "agent": {"id": "a", "owner": None}, "thread": "t",
                                           "event": {"seq": 1}}), env={**os.environ, "LNK_BUCKET_URL": url})
    assert put.stdout == '{"reply": "done"}\n'
    done = subprocess.run(["lnk-store-admin", "--log-format", "json", "migrate", url, f"file://{tmp_path / 'copy'}",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True  # the summary, whole, on stdout
    messages = [line["message"] for line in json_lines(done.stderr)]  # its progress lines, one record each
    assert any(m.startswith("starting migration") for m in messages), messages

    bad = subprocess.run(["lnk-store-admin", "inspect", "ftp://nowhere"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LNK_LOG_FORMAT": "json"})
    assert bad.returncode == 2 and bad.stdout == ""
    (line,) = json_lines(bad.stderr)
    assert line["level"] == "ERROR" and line["program"] == "lnk-store-admin"

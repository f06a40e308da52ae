"""One log schema for every program (issue 46, item 2).

On 0.7 the scheduler wrote ``{"event", "at": <float>, ...}`` and every other
program ``{"time", "level", "logger", "program", "message"}``: one pod's two
containers logged two shapes, and ``lnk-store-admin migrate`` wrote its
mismatch lines as logger ``stderr`` at INFO, so an alert on WARNING missed
a migration that did not verify.  Now every line begins with
``jsonlog.SCHEMA`` (time in one format, level, logger, program, event,
message) and then carries its own fields:

* ``test_a_scheduler_line_and_a_driver_line_have_the_same_keys``: a real
  runner's lines (``started``, a ``fired`` with the keys docs/scheduler.md
  shows, ``stopped``) and a real driver's debug line;
* ``test_scheduler_events_keep_their_fields_at_their_level``;
* ``test_migrate_says_a_mismatch_as_a_warning_and_the_failure_as_an_error``;
* ``test_library_warnings_take_the_program_s_format``: urllib3's "Connection
  pool is full" and ``warnings.warn`` in the program's text format, or as
  schema lines with JSON logs, at WARNING.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from cloudstore.runtime.jsonlog import SCHEMA
from cloudstore.scheduling import log as schedlog

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
#: The admin tool's text lines: its format (``%(asctime)s %(levelname)s %(message)s``), every one.
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def schema_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr``, each one JSON object that begins with the schema's keys, in order, and
    written alike, byte for byte: compact, UTF-8 as it is (a scheduler's line and a bridge's in one pod's
    log differed in their spacing)."""
    out = []
    for line in stderr.splitlines():
        value = json.loads(line)
        assert isinstance(value, dict) and tuple(value)[:len(SCHEMA)] == SCHEMA, line
        assert line == json.dumps(value, separators=(",", ":"), ensure_ascii=False), line
        assert TIME.match(value["time"]), line
        out.append(value)
    return out


def test_a_scheduler_line_and_a_driver_line_have_the_same_keys(tmp_path: Path) -> None:
    store, wake = tmp_path / "store", tmp_path / "wake"
    store.mkdir()
    wake.mkdir(mode=0o700)
    driver_env = {"LNK_BUCKET_URL": f"file://{store}", "LNK_WAKE_DIR": str(wake)}
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"agents": [{"owner": "o", "id": "a"}], "driver": "lnk-bucket-store",
                                  "driver_env": driver_env, "fire": ["true"], "poll_interval": 0.5,
                                  "runner": "runner-r"}))
    runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "LNK_WAKE_DIR": str(wake)})
    assert runner.stderr is not None
    said = []
    try:
        for line in runner.stderr:  # until it says it started, then fired (or ends: the assertions below say so)
            said.append(line)
            if '"event":"started"' in line:
                _put(f"file://{store}", {"op": "job_put", "agent": {"owner": "o", "id": "a"}, "place": "waiting",
                                         "job": {"id": "j1", "spec": None, "due": 1}}, wake=wake)
            if '"event":"fired"' in line:
                break
    finally:
        runner.send_signal(signal.SIGTERM)
        _, rest = runner.communicate(timeout=60)
    scheduler = schema_lines("".join(said) + rest)  # the runner's lines, and its own drivers', all of them
    assert [line["event"] for line in scheduler][-1] == "stopped", scheduler
    started = next(line for line in scheduler if line["event"] == "started")
    fired = next(line for line in scheduler if line["event"] == "fired")
    assert list(fired) == documented_fired(), "docs/scheduler.md shows a fired line's keys, in order"

    driver = subprocess.run(["lnk-bucket-store", "call"], capture_output=True, text=True, timeout=60,
                            input=json.dumps({"op": "last", "agent": {"id": "a", "owner": "o"}, "thread": "t"}),
                            env={**os.environ, **driver_env, "LNK_LOG_FORMAT": "json", "LNK_STORE_LOG": "debug"})
    assert driver.returncode == 0, driver.stderr
    (debug,) = [line for line in schema_lines(driver.stderr) if line.get("op") == "last"]

    assert tuple(started)[:len(SCHEMA)] == tuple(debug)[:len(SCHEMA)] == SCHEMA
    assert (started["program"], started["logger"], started["level"], started["message"]) == (
        "lnk-cloud-scheduler", "cloudstore.scheduler", "INFO", "started")
    assert started["runner"] == "runner-r" and "at" not in started, "its fields kept; one time, the schema's"
    assert (debug["program"], debug["level"], debug["event"]) == ("lnk-bucket-store", "DEBUG", "log")
    assert debug["reply"] == "last"


def documented_fired() -> list[str]:
    """The keys of the ``fired`` line docs/scheduler.md shows under "Logs", in order."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "scheduler.md").read_text()
    logs = doc[doc.index("\n## Logs\n"):]
    block = re.search(r"^```json\n(.*?)^```", logs, re.S | re.M)
    assert block is not None
    return re.findall(r'"(\w+)":', block.group(1))


def test_scheduler_events_keep_their_fields_at_their_level(tmp_path: Path) -> None:
    path = tmp_path / "s.log"
    schedlog.to_file(str(path), 1 << 20, 1)
    try:
        schedlog.log("fired", job="j1", exit=0, killed=None, lateness_ms=1.5)
        schedlog.log("fired", job="j2", exit=None, killed="timeout", lateness_ms=2.5)
        schedlog.log("store_error", agent="a", error="boom")
        schedlog.log("lease_lost", job="j3")
    finally:
        schedlog.to_stderr()
    lines = schema_lines(path.read_text())
    assert [(line["event"], line["level"]) for line in lines] == [
        ("fired", "INFO"), ("fired", "WARNING"), ("store_error", "WARNING"), ("lease_lost", "ERROR")]
    assert lines[1]["job"] == "j2" and lines[1]["killed"] == "timeout" and lines[1]["lateness_ms"] == 2.5
    assert lines[2]["error"] == "boom"


def _put(url: str, *requests: dict[str, Any], wake: Path | None = None) -> None:
    """Each request through a driver of the store at ``url`` (nudging the runners of ``wake``)."""
    env = {**os.environ, "LNK_BUCKET_URL": url, **({"LNK_WAKE_DIR": str(wake)} if wake else {})}
    for request in requests:
        done = subprocess.run(["lnk-bucket-store", "call"], input=json.dumps(request), capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.stdout == '{"reply": "done"}\n', done.stdout + done.stderr


def test_migrate_says_a_mismatch_as_a_warning_and_the_failure_as_an_error(tmp_path: Path) -> None:
    src, dst = f"file://{tmp_path / 'src'}", f"file://{tmp_path / 'dst'}"
    (tmp_path / "src").mkdir()
    agent = {"id": "a", "owner": None}
    _put(src, {"op": "append", "agent": agent, "thread": "t1", "event": {"seq": 1}})
    first = subprocess.run(["lnk-store-admin", "migrate", src, dst], capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    _put(dst, {"op": "append", "agent": agent, "thread": "t2", "event": {"seq": 1}})  # the copy did not make it

    again = subprocess.run(["lnk-store-admin", "--log-format", "json", "migrate", src, dst, "--force"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    lines = schema_lines(again.stderr)
    assert {line["program"] for line in lines} == {"lnk-store-admin"}
    assert not [line for line in lines if line["logger"] == "stderr"], "no line of the tool's own is a stray"
    mismatches = [line for line in lines if line["event"] == "migrate_mismatch"]
    assert mismatches and all(line["level"] == "WARNING" for line in mismatches), mismatches
    assert any("threads differs" in line["message"] for line in mismatches), mismatches
    (failed,) = [line for line in lines if line["level"] == "ERROR"]
    assert failed["event"] == "migrate_failed" and failed["mismatches"] == len(mismatches)

    text = subprocess.run(["lnk-store-admin", "migrate", src, dst, "--force"], capture_output=True, text=True,
                          timeout=120)
    assert text.returncode == 1
    assert all(TEXT_LINE.match(line) for line in text.stderr.splitlines()), text.stderr
    assert re.search(r" WARNING mismatch: .*threads differs", text.stderr), text.stderr
    assert re.search(r" ERROR the migration failed: ", text.stderr), text.stderr


PROGRAM = """
import logging, sys, warnings
import urllib3
from cloudstore.runtime import jsonlog
jsonlog.configure("lnk-store-admin", "WARNING", "%(asctime)s %(levelname)s %(message)s", sys.argv[1] == "json")
pool = urllib3.HTTPConnectionPool("127.0.0.1", 9, maxsize=1, block=False)
first, second = pool._get_conn(), pool._get_conn()
pool._put_conn(first)
pool._put_conn(second)  # urllib3's own "Connection pool is full, discarding connection" warning
warnings.warn("careful")
"""


def test_library_warnings_take_the_program_s_format() -> None:
    env = {k: v for k, v in os.environ.items() if k != "LNK_LOG_FORMAT"}
    text = subprocess.run([sys.executable, "-c", PROGRAM, "text"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stderr.splitlines()
    assert len(lines) == 2 and all(TEXT_LINE.match(line) for line in lines), text.stderr
    assert " WARNING Connection pool is full, discarding connection: 127.0.0.1" in lines[0]
    assert " WARNING " in lines[1] and "UserWarning: careful" in lines[1]

    as_json = subprocess.run([sys.executable, "-c", PROGRAM, "json"], capture_output=True, text=True, timeout=60,
                             env=env)
    assert as_json.returncode == 0, as_json.stderr
    pool, warned = schema_lines(as_json.stderr)
    assert (pool["level"], pool["logger"], pool["program"]) == ("WARNING", "urllib3.connectionpool",
                                                                 "lnk-store-admin")
    assert pool["message"].startswith("Connection pool is full")
    assert (warned["level"], warned["logger"]) == ("WARNING", "py.warnings") and "careful" in warned["message"]


def test_a_usage_error_with_json_logs_is_one_error_record(tmp_path: Path) -> None:
    """A bridge told ``--log-format json`` whose flags name no whole agent: argparse's usage and error were
    ten records at INFO (logger ``stderr``); an alert on ERROR missed a bridge that never started."""
    harness = tmp_path / "h"
    harness.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a", "--no-owner",
         "--driver", "lnk-bucket-store", "--log-format", "json"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    (line,) = schema_lines(done.stderr)
    assert (line["level"], line["event"], line["program"]) == ("ERROR", "usage_error", "lnk-store-bridge"), line
    assert line["message"].startswith("lnk-store-bridge: error: an agent by flags needs"), line
    assert line["usage"].startswith("usage: lnk-store-bridge "), line


def test_the_scheduler_s_refusals_at_start_up_are_error_records(tmp_path: Path) -> None:
    """The runner's log is JSON from its first line: a usage error, a bad setting and a store no retry can fix
    (a ``file://`` folder that does not exist) were plain ``lnk-cloud-scheduler: ...`` lines, the one shape a
    log reader could not parse; each is now one ERROR record of the schema, and the exit status still 2."""
    runs = {
        "usage_error": ["--no-such-flag"],
        "refused": ["--agent", "a", "--driver", "no-such-driver-q", "--fire", "true"],
        "store": ["--agent", "a", "--driver", "lnk-bucket-store", "--fire", "true",
                  "--driver-env", f"LNK_BUCKET_URL=file://{tmp_path}/not-made"],
    }
    for name, argv in runs.items():
        done = subprocess.run([sys.executable, "-m", "cloudstore.scheduler", *argv], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, "LNK_LOG_FORMAT": "json"})
        assert done.returncode == 2 and done.stdout == "", (name, done.stderr)
        ours = [line for line in schema_lines(done.stderr) if line["program"] == "lnk-cloud-scheduler"]
        (line,) = [line for line in ours if line["level"] == "ERROR"]
        assert line["event"] == ("usage_error" if name == "usage_error" else "refused"), line
        assert {"usage_error": "--no-such-flag", "refused": "no-such-driver-q", "store": "LNK_BUCKET_URL"}[name] \
            in line["message"], line
    assert not (tmp_path / "not-made").exists()

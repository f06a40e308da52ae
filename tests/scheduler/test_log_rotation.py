"""The scheduler's log has a bound: its own file, rotated by size, or stderr for a supervisor to rotate (issue 44).

A soak of 4-10 minutes found the runner's log growing 253 bytes a fire (44 MB
a day at 2 jobs a second) with no rotation and no word on it.  Its stderr is
kept by what runs it (journald under deploy/systemd, the container runtime
under Kubernetes), which rotates it; for anything else ``log_file`` sends the
runner's own lines to a file it rotates itself (``log.RotatingFile``).

* ``test_the_files_keep_their_bound_and_lose_only_the_oldest_lines``: 3,000
  events through a 4 KiB file and 3 old ones: no file over 4 KiB, four files
  at most, every line whole, and what is kept is the newest lines without a
  gap, at least three files' worth;
* ``test_a_line_longer_than_a_file_is_written_alone``;
* ``test_the_runner_s_python_logging_goes_there_too``;
* ``test_a_runner_logs_to_its_file_rotated``: a real runner with
  ``log_file`` fires 80 jobs: its events are in the files (none on stderr),
  the files keep their bound and hold the newest lines in order, and
  each ``fired`` line is at most ``FIRED_FIXED`` bytes plus its ids, as
  docs/scheduler.md says;
* the settings' errors: tests/scheduler/test_config_schema.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proc_watch import stop
from scheduler_rig import wait_for

from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling import log as schedlog
from cloudstore.scheduling.log import Lines, log, read_events

#: What a ``fired`` line holds beside its owner, agent id, job id and runner id (docs/scheduler.md, "Logs").
FIRED_FIXED = 373  # 240, the fire's fence (issue 44): `,"fence":` and 13 digits; and the schema shared with
# every program (issue 46): time, level, logger, program, message in place of the float `at`, 111 more


@pytest.fixture
def to_file(tmp_path: Path) -> Iterator[Path]:
    """This process's scheduler log sent to ``tmp_path/s.log`` (4 KiB a file, 3 old ones), stderr again after."""
    path = tmp_path / "s.log"
    schedlog.to_file(str(path), 4096, 3)
    yield path
    schedlog.to_stderr()


def files_of(path: Path) -> list[Path]:
    """The log's files, oldest first: ``path.N`` ... ``path.1``, then ``path``."""
    old = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    return old + [path]


def lines_of(path: Path) -> list[dict[str, Any]]:
    out = []
    for p in files_of(path):
        text = p.read_text()
        assert text == "" or text.endswith("\n"), f"{p.name} ends inside a line"
        out += [json.loads(line) for line in text.splitlines()]  # every line whole: each parses
    return out


def test_the_files_keep_their_bound_and_lose_only_the_oldest_lines(to_file: Path) -> None:
    for n in range(3000):
        log("fired", n=n, pad="p" * (n % 50))
    files = files_of(to_file)
    assert [p.name for p in files] == ["s.log.3", "s.log.2", "s.log.1", "s.log"], "the bound: 3 old files and one"
    assert all(p.stat().st_size <= 4096 for p in files), [p.stat().st_size for p in files]
    kept = [line["n"] for line in lines_of(to_file)]
    assert kept == list(range(kept[0], 3000)), "the newest lines, in order, with no gap: only the oldest went"
    longest = len(schedlog._line("fired", {"n": 2999, "pad": "p" * 49}))
    assert sum(p.stat().st_size for p in files[:-1]) >= 3 * (4096 - longest), "every old file was full"


def test_a_line_longer_than_a_file_is_written_alone(to_file: Path) -> None:
    log("small")
    log("huge", pad="x" * 10_000)
    log("after")
    assert [e["event"] for e in read_events(to_file.with_name("s.log.2"))] == ["small"]
    assert [e["event"] for e in read_events(to_file.with_name("s.log.1"))] == ["huge"]
    assert [e["event"] for e in read_events(to_file)] == ["after"]


def test_the_runner_s_python_logging_goes_there_too(to_file: Path) -> None:
    """The runner's handler writes to ``Lines`` once it logs to a file: a warning shares the file's rotation."""
    logger = logging.getLogger("test_log_rotation")
    handler = logging.StreamHandler(Lines())
    logger.addHandler(handler)
    try:
        log("before")
        logger.warning("a warning\nof two lines")
        log("after")
    finally:
        logger.removeHandler(handler)
    assert to_file.read_text().splitlines()[1:3] == ["a warning", "of two lines"]
    assert [e["event"] for e in read_events(to_file)] == ["before", "after"]


def test_a_runner_logs_to_its_file_rotated(tmp_path: Path) -> None:
    """A real runner, its log in a file of 8 KiB and 2 old ones: 80 jobs fired, about 20 KiB of log."""
    store, wake = tmp_path / "store", tmp_path / "wake"
    store.mkdir()
    wake.mkdir(mode=0o700)  # its own: no nudge of another test's runner, nor theirs here
    driver_env = {"LNK_BUCKET_URL": f"file://{store}", "LNK_WAKE_DIR": str(wake)}
    agent = {"owner": "owner-o", "id": "agent-a"}
    path = tmp_path / "log" / "runner.log"
    path.parent.mkdir()
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"agents": [agent], "driver": "lnk-bucket-store", "driver_env": driver_env,
                                  "fire": ["true"], "poll_interval": 0.5, "runner": "runner-r",
                                  "log_file": str(path), "log_max_bytes": 8192, "log_backups": 2}))
    err = tmp_path / "stderr"
    with open(err, "wb") as stderr:
        runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                  env={**os.environ, "LNK_WAKE_DIR": str(wake)})
    feeder = ServeProcess("lnk-bucket-store", driver_env, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: [e for p in files_of(path) if p.exists() for e in read_events(p, "started")], 60,
                 "the runner to start")
        jobs = [f"job-{n:03d}" for n in range(80)]
        for job in jobs:
            reply = feeder.request({"op": "job_put", "agent": agent, "place": "waiting",
                                    "job": {"id": job, "spec": None, "due": time.time()}}, timeout=60)
            assert reply == {"reply": "done"}, reply

        def fired() -> list[str]:
            return [e["job"] for p in files_of(path) if p.exists() for e in read_events(p, "fired")]

        wait_for(lambda: jobs[-1] in fired() and not feeder.request(
            {"op": "job_count", "agent": agent, "place": "waiting"})["count"], 120, "every job to fire")
    finally:
        feeder.close()
        stop(runner)
    assert runner.returncode == 0 and runner.stdout is not None and runner.stdout.read() == b""
    runner.stdout.close()
    assert not read_events(err), "the runner's events went to its file, none to stderr"
    files = files_of(path)
    assert len(files) == 3 and all(p.stat().st_size <= 8192 for p in files), [p.stat().st_size for p in files]
    events = lines_of(path)
    assert events[-1]["event"] == "stopped"
    kept = [e["job"] for e in events if e["event"] == "fired"]
    assert len(kept) >= 40 and len(set(kept)) == len(kept) and set(kept) <= set(jobs) and jobs[-1] in kept
    at = [e["time"] for e in events]  # one format, to the millisecond: sorted as text is sorted in time
    assert at == sorted(at), "the files, oldest first, hold the lines in the order they were written"
    for line in (p for f in files for p in f.read_text().splitlines()):
        event = json.loads(line)
        if event["event"] == "fired":
            ids = len(event["owner"]) + len(event["agent"]) + len(event["job"]) + len(event["runner"])
            assert len(line) + 1 <= FIRED_FIXED + ids, line

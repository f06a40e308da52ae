"""Progress of the admin tool's long phases (issue 46, item 3).

On 0.7 ``gc`` of a 4,700-object store on moto ran 14-22 s with nothing on
stderr, and migrate's verification 46 s (120 s to fake-gcs-server) with
nothing between "verifying" and the result.  Now gc's reads and deletes,
migrate's copy and verification, and inspect's agents each say how far they
are, every ``LNK_PROGRESS_EVERY`` seconds (``--progress-every``; default 5),
as lines of the program's log: ``event`` ``progress`` in the one schema with
JSON logs, the program's text format without.

A cadence of 0 writes a line for every unit of work, so the tests below see
every count from 1 to the total, in order, without waiting on a clock:

* ``test_gc_migrate_and_inspect_show_progress_as_they_go``: JSON logs;
* ``test_progress_in_text_takes_the_text_format``;
* ``test_the_cadence_is_steady``: with a clock the test moves, a line every
  3 s of work (``LNK_PROGRESS_EVERY=3``), not one per item, and the last
  always;
* ``test_a_malformed_cadence_stops_the_tool_before_any_work``: exit 2,
  naming the setting or the option and the rule.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_log_schema import TEXT_LINE, schema_lines

from cloudstore.admin import progress
from cloudstore.protocol.client import ServeProcess

AGENTS = 4


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A folder store of AGENTS agents, each with a conversation, an ended lease (a tombstone gc deletes with
    ``--min-age 0``) and a waiting job."""
    folder = tmp_path / "store"
    folder.mkdir()
    url = f"file://{folder}"
    driver = ServeProcess("lnk-bucket-store", {"LNK_BUCKET_URL": url}, stderr=subprocess.DEVNULL)
    try:
        for n in range(AGENTS):
            agent = {"id": f"a{n}", "owner": None}
            for request in ({"op": "append", "thread": "t", "event": {"seq": 1}},
                            {"op": "take", "thread": "job:x", "holder": "r", "lapse_ms": 60_000},
                            {"op": "end", "thread": "job:x", "holder": "r"},
                            {"op": "job_put", "place": "waiting", "job": {"id": "j", "spec": {}, "due": 1.9e9}}):
                reply = driver.request({**request, "agent": agent}, timeout=60)
                assert "error" not in reply, reply
    finally:
        driver.close()
    return url


def admin(*args: str, every: str = "0", **env: str) -> subprocess.CompletedProcess:
    """``lnk-store-admin ARGS`` with a cadence of ``every`` (LNK_PROGRESS_EVERY) and JSON logs unless ``env``
    says otherwise."""
    base = {k: v for k, v in os.environ.items() if k not in ("LNK_LOG_FORMAT", "LNK_STORE_LOG")}
    return subprocess.run(["lnk-store-admin", *args], capture_output=True, text=True, timeout=300,
                          env={**base, "LNK_LOG_FORMAT": "json", progress.EVERY_SETTING: every, **env})


def counted(lines: list[dict[str, Any]], phase: str, what: str) -> list[dict[str, Any]]:
    """The progress lines of one phase's count, each checked: its fields agree with each other."""
    out = [line for line in lines if line["event"] == "progress" and line["phase"] == phase and line["what"] == what]
    for line in out:
        assert line["level"] == "INFO" and line["program"] == "lnk-store-admin", line
        assert line["message"].startswith(f"{line['done']}/{line['total']} {what}"), line
    return out


def every_count(lines: list[dict[str, Any]], total: int) -> None:
    """A cadence of 0: a line for each unit, 1 to ``total`` in order, the last one the phase's end."""
    assert [line["done"] for line in lines] == list(range(1, total + 1)), lines
    assert {line["total"] for line in lines} == {total}
    assert [line["finished"] for line in lines] == [False] * (total - 1) + [True]


def test_gc_migrate_and_inspect_show_progress_as_they_go(store: str, tmp_path: Path) -> None:
    gc = admin("gc", store, "--apply", "--min-age", "0", "--json")
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["deleted"] == {"lease-tombstone": AGENTS}, gc.stdout
    lines = schema_lines(gc.stderr)
    heads = counted(lines, "gc judge", "heads")
    every_count(heads, AGENTS)  # the lease tombstone of each agent (appends write no head)
    every_count(counted(lines, "gc delete", "objects"), AGENTS)
    assert lines.index(heads[-1]) < lines.index(counted(lines, "gc delete", "objects")[0])

    copy = f"file://{tmp_path / 'copy'}"
    migrate = admin("migrate", store, copy, "--json")
    assert migrate.returncode == 0, migrate.stderr
    summary = json.loads(migrate.stdout)
    lines = schema_lines(migrate.stderr)
    copied = counted(lines, "copy", "objects")
    every_count(copied, summary["objects"])
    assert copied[-1]["bytes"] == summary["bytes"] > 0
    verified = counted(lines, "verify", "objects")
    every_count(verified, summary["objects"])
    every_count(counted(lines, "verify", "agents"), AGENTS)
    every_count(counted(lines, "verify", "job records"), AGENTS)
    events = [line["event"] for line in lines]
    assert events.index("migrate_start") < lines.index(copied[0]) < lines.index(copied[-1]) \
        < events.index("migrate_verify") < lines.index(verified[0]) < events.index("migrate_verified")

    inspect = admin("inspect", copy, "--json")
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["totals"]["agents"] == AGENTS
    every_count(counted(schema_lines(inspect.stderr), "inspect", "agents"), AGENTS)


def test_progress_in_text_takes_the_text_format(store: str) -> None:
    done = admin("inspect", store, LNK_LOG_FORMAT="text")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert all(TEXT_LINE.match(line) for line in lines), done.stderr
    shown = [line for line in lines if re.search(r" INFO \d+/4 agents, \d+/s \(inspect, \d+ s\)$", line)]
    assert len(shown) == AGENTS, done.stderr


def test_the_cadence_is_steady(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    monkeypatch.setenv(progress.EVERY_SETTING, "3")
    out = io.StringIO()
    shown = progress.Progress(30, what="objects", stream=out)
    for _ in range(30):  # one object a second
        shown.add(1, 10)
        now[0] += 1.0
    shown.close()
    lines = out.getvalue().splitlines()
    # The first at once, then one each 3 s of work, and the last whatever the clock says.
    assert [line.split(" ", 1)[0] for line in lines] == [f"{n}/30" for n in range(1, 30, 3)] + ["30/30"], lines
    assert lines[-1].startswith("30/30 objects, 300 bytes, 1/s (copy, 30 s)"), lines


def test_a_malformed_cadence_stops_the_tool_before_any_work(store: str) -> None:
    for value in ("soon", "-1", "nan"):
        done = admin("gc", store, "--apply", "--min-age", "0", every=value)
        assert done.returncode == 2 and done.stdout == "", (value, done.stderr)
        (line,) = schema_lines(done.stderr)
        assert line["level"] == "ERROR" and "LNK_PROGRESS_EVERY must be a number of seconds >= 0" in line["message"]
    flag = admin("--progress-every", "-1", "gc", store, "--apply", "--min-age", "0")
    assert flag.returncode == 2 and flag.stdout == ""
    assert "--progress-every must be a number of seconds >= 0" in flag.stderr, flag.stderr
    kept = admin("gc", store, "--json", every="")  # nothing was deleted by the refused runs
    assert json.loads(kept.stdout)["judged_dead"] == {}, kept.stdout

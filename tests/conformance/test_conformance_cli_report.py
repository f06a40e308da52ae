"""What `lnk-store-check` says about a run besides its verdicts: header, JSON report, leftovers, progress.

Issue 46, item 5: a report that names what it judged (program, contract,
store, mode; no credential), a machine-readable report for CI dashboards,
what the run left in the store, and progress on stderr while it runs.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from test_conformance_cli import TOY_PROGRAM, cli, results_of, toy_args

from cloudstore.conformance import header, leftovers
from cloudstore.conformance.harness import Result
from cloudstore.conformance.progress import Progress


def test_the_header_names_program_contract_store_and_mode(tmp_path: Path) -> None:
    secret = "do-not-print-me-1234"
    done = cli(*toy_args(tmp_path, "--env", f"AWS_SECRET_ACCESS_KEY={secret}",
                         "--env", f"AWS_ENDPOINT_URL=http://someone:{secret}@127.0.0.1:9/",
                         "--family", "check_narrowing", "--check", "only", "--quick"))
    assert done.returncode == 0, done.stdout + done.stderr
    head = done.stdout.splitlines()[:4]
    assert head[0].startswith("# lnk-store-check ") and head[0].endswith(f"judging {shlex.join(TOY_PROGRAM)}")
    assert head[1] == '# contract: {"version": 1, "serve": true, "jobs": true, "files": true}'
    assert head[2] == (f"# store: TOY_STORE_DIR={tmp_path / 'store'}; AWS_SECRET_ACCESS_KEY=<hidden>; "
                       "AWS_ENDPOINT_URL=http://127.0.0.1:9/")
    assert head[3] == "# mode: conformance, serve, quick (slow checks left out), 3 rounds a race; " \
                      "families check_narrowing; checks naming 'only'"
    assert secret not in done.stdout + done.stderr


def test_the_header_names_the_program_as_resolved_on_path(tmp_path: Path) -> None:
    done = cli("--env", f"LNK_BUCKET_URL=file://{tmp_path}", "--check", "append_gaps", "--mode", "call",
               "lnk-bucket-store")
    assert done.returncode == 0, done.stdout + done.stderr
    head = done.stdout.splitlines()[:4]
    program = head[0].split(" judging ", 1)[1]
    assert program.startswith("/") and program.endswith("/lnk-bucket-store"), head[0]
    assert head[2] == f"# store: LNK_BUCKET_URL=file://{tmp_path}"
    assert head[3].startswith("# mode: conformance, call, full, ")


def test_the_header_names_every_mode() -> None:
    """Which family set, how requests travel and what --quick leaves out, as each run kind means it."""
    def words(**given: object) -> str:
        options = {"mode": "serve", "via_bridge": False, "quick": False, "faults": False, "crash": False,
                   "rounds": 3, "families": None, "checks": ()}
        return header.mode_words(**{**options, **given})  # type: ignore[arg-type]

    assert words() == "conformance, serve, full, 3 rounds a race"
    assert words(mode="both", rounds=1) == "conformance, both, full, 1 round a race"
    assert words(via_bridge=True, quick=True) == \
        "conformance, through a store bridge (--via-bridge), quick (slow checks left out), 3 rounds a race"
    assert words(faults=True, quick=True) == "faults, quick (one seeded fault per op)"
    assert words(crash=True, checks=["crash.append"]) == "crash, full; checks naming 'crash.append'"


def test_without_env_the_header_shows_this_environments_store_settings_only(tmp_path: Path) -> None:
    """The driver then reads its settings here: the store's are shown, credentials hidden, and no other
    variable (a webhook's URL is a secret; an unrelated file:/// folder is never walked either)."""
    environ = {"LNK_BUCKET_URL": f"file://{tmp_path}", "AWS_ENDPOINT_URL": "http://key:secret@127.0.0.1:9000",
               "AWS_SECRET_ACCESS_KEY": "s3cr3t", "SLACK_WEBHOOK_URL": "https://hooks.example/T0/B0/secret",
               "OTHER_URL": "file:///"}
    assert header.shown_settings({}, environ) == {"LNK_BUCKET_URL": f"file://{tmp_path}",
                                                  "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    assert leftovers.local_folders({}, environ) == {"LNK_BUCKET_URL": str(tmp_path)}


#: The JSON report's fields and their types; each check's, and the outcomes a check may have.
REPORT_FIELDS = {"schema": str, "program": list, "contract": dict, "store": dict, "mode": str, "outcome": str,
                 "exit": int, "error": str, "summary": dict, "checks": list, "not_kept": dict, "notes": list,
                 "left_in_store": dict}
CHECK_FIELDS = {"name": str, "label": str, "family": str, "mode": str, "outcome": str, "duration_ms": float,
                "message": str}


def test_the_json_report_has_every_check_with_its_outcome(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = cli(*toy_args(tmp_path, "--env", "TOY_BREAK=widen_narrowing", "--family", "check_narrowing", "--quick",
                         "--json", str(out)))
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert {k: type(v) for k, v in doc.items()} == REPORT_FIELDS
    assert doc["schema"] == "lnk-store-check report 1"
    assert doc["outcome"] == "failed" and doc["exit"] == 1 and doc["error"] == ""
    assert doc["program"] == list(TOY_PROGRAM) and doc["contract"]["version"] == 1
    assert doc["store"] == {"TOY_STORE_DIR": str(tmp_path / "store"), "TOY_BREAK": "widen_narrowing"}
    lines = results_of(done.stdout)
    assert len(doc["checks"]) == len(lines) == doc["summary"]["passed"] + doc["summary"]["failed"]
    for check, line in zip(doc["checks"], lines, strict=True):
        assert {k: type(v) for k, v in check.items()} == CHECK_FIELDS
        assert check["family"] == "check_narrowing" and line.startswith(check["label"] + "  ")
        assert check["outcome"] == ("pass" if "  PASS  " in line else "fail")
        assert (check["message"] == "") == (check["outcome"] == "pass")
        if check["outcome"] == "fail":
            assert line.endswith(check["message"]) and "expected" in check["message"]
    failed = {c["name"] for c in doc["checks"] if c["outcome"] == "fail"}
    assert {"check_narrowing.only_narrows", "check_narrowing.race_narrow"} <= failed
    assert doc["summary"]["failed"] == len(failed) and doc["summary"]["seconds"] > 0


def test_the_run_says_what_it_left_in_the_store(tmp_path: Path) -> None:
    """The agents it made, by the run's id prefix, and how much the store's folder grew: all of it, the
    folder being empty before."""
    store = tmp_path / "bucket"
    store.mkdir(mode=0o700)
    out = tmp_path / "report.json"
    done = cli("--env", f"LNK_BUCKET_URL=file://{store}", "--check", "append_gaps", "--check", "lease_take",
               "--json", str(out), "lnk-bucket-store")
    assert done.returncode == 0, done.stdout + done.stderr
    files = [p for p in store.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    doc = json.loads(out.read_text())
    left = doc["left_in_store"]
    assert left["folders"] == [{"setting": "LNK_BUCKET_URL", "folder": str(store), "files_added": len(files),
                                "bytes_added": size}]
    assert re.fullmatch(r"lsc-[0-9a-f]{8}-", left["agent_prefix"]) and left["agents"] >= 2
    notes = [line for line in done.stdout.splitlines() if line.startswith("# ")]
    assert (f"# left in the store: {left['agents']} agents named {left['agent_prefix']}* (with their conversations, "
            f"jobs and files); {left['how_to_remove']}") in notes
    assert (f"# LNK_BUCKET_URL's folder {store} grew by {len(files)} files, {size / 1e6:.1f} MB during the run"
            in notes)
    # every agent the run wrote is named under the prefix the report gives (their owners lsc-owner-*)
    written = {p.name for p in store.rglob("*") if "lsc-" in p.name and "lsc-owner-" not in p.name}
    assert written and all(left["agent_prefix"] in name for name in written), sorted(written)[:5]


def test_progress_after_every_check_on_stderr(tmp_path: Path) -> None:
    """``--progress 0``: a line after each check (checks done / total), on stderr, never on stdout."""
    done = cli(*toy_args(tmp_path, "--family", "check_narrowing", "--quick", "--progress", "0"))
    assert done.returncode == 0, done.stdout + done.stderr
    total = len(results_of(done.stdout))
    assert done.stderr.splitlines() == [f"lnk-store-check: progress: {n}/{total} checks done, 0 failed, "
                                        + line.split(" failed, ", 1)[1]
                                        for n, line in enumerate(done.stderr.splitlines(), 1)]
    assert "checks done" not in done.stdout


def test_progress_in_the_log_schema_with_json_logs(tmp_path: Path) -> None:
    done = cli(*toy_args(tmp_path, "--family", "check_narrowing", "--check", "only", "--quick", "--progress", "0",
                         "--log-format", "json"))
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["level"], r["program"], r["done"], r["total"], r["failed"]) for r in records] == [
        ("INFO", "lnk-store-check", 1, 1, 0)]
    assert records[0]["message"].startswith("progress: 1/1 checks done")


def test_progress_keeps_its_cadence() -> None:
    """A line when a check ends and ``every`` seconds passed since the last one; none sooner."""
    now = [0.0]
    said: list[tuple[int, int]] = []
    progress = Progress(lambda text, fields: said.append((fields["done"], fields["total"])), every=5.0,
                        clock=lambda: now[0])
    progress.total = 4  # as planned() would, without its ticker thread
    for at in (1.0, 5.5, 7.0, 11.0):
        now[0] = at
        progress.starting("check.x")
        progress.finished(Result("check.x", "check", "serve", True, 1.0))
    assert said == [(2, 4), (4, 4)]
    assert progress.line()[0] == "progress: 4/4 checks done, 0 failed, 11 s"

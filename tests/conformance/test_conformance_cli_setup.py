"""`lnk-store-check`'s pre-flight: a setup mistake is one line on stderr and exit 2, never a verdict.

Issue 46, item 5: without --env the suite ran 25 s and printed 58 FAIL lines
`LNK_BUCKET_URL is not set`, then a NOT KEPT and a PASS; a typo in the
program's name gave 22 FAIL lines and exit 1.  Each mistake here must stop
the run before any check: exit 2, nothing on stdout (no header, no result
line), exactly one line on stderr saying what to fix.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path

import pytest
from test_conformance_cli import TOY_PROGRAM, cli

from cloudstore.conformance import SetupError, run


def without(*names: str) -> dict[str, str]:
    """This environment without ``names`` (the test's own shell may set a store)."""
    return {k: v for k, v in os.environ.items() if k not in names}


def assert_one_setup_line(done, *words: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("lnk-store-check: ")
    assert "FAIL" not in lines[0] and "PASS" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_no_env_names_the_setting_once() -> None:
    done = cli("lnk-bucket-store", env=without("LNK_BUCKET_URL"))
    line = assert_one_setup_line(done, "LNK_BUCKET_URL is not set", "--env LNK_BUCKET_URL=VALUE")
    assert "NOT KEPT" not in done.stderr and line.count("LNK_BUCKET_URL is not set") == 1


def test_a_typo_in_the_program_name() -> None:
    done = cli("--env", "LNK_BUCKET_URL=file:///tmp", "lnk-bucket-stroe")
    assert_one_setup_line(done, "cannot run PROGRAM 'lnk-bucket-stroe'", "no program of that name on PATH")


def test_a_folder_that_does_not_exist_is_not_made(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    done = cli("--env", f"LNK_BUCKET_URL=file://{missing}", "lnk-bucket-store")
    assert_one_setup_line(done, "LNK_BUCKET_URL", "its folder does not exist", "correct --env LNK_BUCKET_URL")
    assert not missing.exists()


def test_a_file_that_is_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text("print('never run')\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    done = cli(str(script))
    assert_one_setup_line(done, f"cannot run PROGRAM {str(script)!r}: the file is not executable")


def test_a_contract_that_fails(tmp_path: Path) -> None:
    """`false contract` exits 1: no contract to choose the families by, so nothing to judge."""
    done = cli("--env", f"LNK_BUCKET_URL=file://{tmp_path}", "false")
    assert_one_setup_line(done, "`contract` exited 1")


def test_the_json_report_of_a_setup_error(tmp_path: Path) -> None:
    """A CI dashboard sees a setup error as one, not as a run with no check."""
    out = tmp_path / "report.json"
    done = cli("--json", str(out), "lnk-bucket-store", env=without("LNK_BUCKET_URL"))
    assert_one_setup_line(done, "LNK_BUCKET_URL is not set")
    doc = json.loads(out.read_text())
    assert doc["outcome"] == "setup error" and doc["exit"] == 2 and doc["checks"] == []
    assert "LNK_BUCKET_URL is not set" in doc["error"]


def test_the_python_api_raises_the_setup_error(tmp_path: Path) -> None:
    """run() tells setup from verdict too: SetupError (a ValueError), no report of failed checks."""
    with pytest.raises(SetupError, match="TOY_STORE_DIR is not set"):
        run(TOY_PROGRAM, env={}, quick=True)
    with pytest.raises(SetupError, match="no such file"):
        run(str(tmp_path / "nothing-here"), quick=True)


def test_an_error_naming_no_setting_is_left_to_the_checks(tmp_path: Path) -> None:
    """A driver that refuses conversations answers the first read an error naming no setting: its own
    behaviour, judged by the checks (exit 1 with FAIL lines), not a setup error."""
    done = cli("--env", f"TOY_STORE_DIR={tmp_path / 'store'}", "--env", "TOY_KEEPS=jobs", "--check", "append_gaps",
               shlex.join(TOY_PROGRAM))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "0 passed, 1 failed"


def test_the_readme_shows_the_line_it_prints() -> None:
    """The README's pre-flight sample is the program's own line, word for word."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    sample = readme.split("$ lnk-store-check lnk-bucket-store\n", 1)[1].split("\n", 1)[0]
    done = cli("lnk-bucket-store", env=without("LNK_BUCKET_URL"))
    assert done.stderr.splitlines() == [sample]

"""`lnk-store-check` as a command: its lines, its summary and its exit codes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cloudstore.conformance.harness import Check, CheckSet, Report, Result

# As tests/conformance/conftest.py says it (not imported by the name "conftest": with tests/bridge
# collected in the same run, that name can be the bridge's conftest).
TOY_PROGRAM = (sys.executable, str(Path(__file__).resolve().parent.parent / "broken_drivers" / "toy_driver.py"))

LINE = re.compile(r"^(check\w*)\.\w+( \[(serve|call)\])?  (PASS|FAIL)  \d+ ms(  .+: expected .+; got .+)?$")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["lnk-store-check", *args], capture_output=True, text=True, timeout=600, env=env)


def results_of(stdout: str) -> list[str]:
    """The result lines: neither the header nor notes (``#``) nor the summary (the last line)."""
    return [line for line in stdout.splitlines()[:-1] if not line.startswith("#")]


def toy_args(tmp_path: Path, *more: str) -> list[str]:
    return ["--env", f"TOY_STORE_DIR={tmp_path / 'store'}", *more, shlex.join(TOY_PROGRAM)]


def test_a_passing_run(tmp_path: Path) -> None:
    done = cli(*toy_args(tmp_path, "--family", "check_narrowing", "--quick"))
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.fullmatch(r"\d+ passed, 0 failed", lines[-1])
    results = results_of(done.stdout)
    assert results and all(LINE.match(line) for line in results), results
    assert len(results) == int(lines[-1].split()[0])


def test_a_failing_run_says_what_and_exits_1(tmp_path: Path) -> None:
    done = cli(
        *toy_args(tmp_path, "--env", "TOY_BREAK=widen_narrowing", "--family", "check_narrowing", "--check", "only")
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines[-1] == "0 passed, 1 failed"
    lines = results_of(done.stdout)
    assert lines[0].startswith("check_narrowing.only_narrows  FAIL  ")
    assert "expected" in lines[0] and "got" in lines[0] and LINE.match(lines[0])


def test_both_modes_are_labelled(tmp_path: Path) -> None:
    done = cli(*toy_args(tmp_path, "--mode", "both", "--check", "check.append_gaps", "--rounds", "1"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split("  ")[0] for line in results_of(done.stdout)] == [
        "check.append_gaps [serve]", "check.append_gaps [call]"]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in ([], ["--env", "NOEQUALS", "x"], ["--family", "nope", "x"], ["--mode", "fast", "x"],
                 ["--rounds", "0", "x"], toy_args(tmp_path, "--check", "no such check")):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr


def test_a_program_that_does_not_exist_is_a_setup_error(tmp_path: Path) -> None:
    """Not a verdict (it was FAIL lines and exit 1): the pre-flight's one line and exit 2, no check run."""
    done = cli("--family", "check", "--check", "contract", str(tmp_path / "no-such-driver"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"lnk-store-check: cannot run PROGRAM {str(tmp_path / 'no-such-driver')!r}: "
                                        "no such file (a typo in the name?)"]


def test_a_check_built_on_a_failed_one_is_reported_not_judged() -> None:
    """One defect reported once: the check that builds on a failed one says so, and counts as neither."""
    family = CheckSet("demo")
    with pytest.raises(ValueError, match="not registered before it"):
        family.add(Check("demo.later", "demo", lambda ctx: None, builds_on="demo.first"))
    report = Report(results=[Result("demo.first", "demo", "serve", False, 3.0, expected="a", got="b"),
                              Result("demo.later", "demo", "serve", False, 0.0, unjudged="(builds on demo.first)")])
    assert report.failed == 1 and report.unjudged == 1 and report.passed == 0 and not report.ok
    assert report.failed_names() == {"demo.first"} and report.unjudged_names() == {"demo.later"}
    assert report.summary() == "0 passed, 1 failed, 1 not judged"
    assert report.results[1].line() == "demo.later  NOT JUDGED  (builds on demo.first)"

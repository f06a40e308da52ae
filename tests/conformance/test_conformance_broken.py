"""Each defect of the toy driver is caught by the check that names it, and by little else.

A check that cannot fail is a defect of the suite: these show that the
races, the millisecond lapse, exact values, versions, narrowing, stdout and
refusals each fail when the driver gets exactly that wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support import ZOO_PROGRAM

from cloudstore.conformance import Report, run

#: TOY_BREAK -> the checks that must fail (every one of them).
CAUGHT_BY = {
    "double_append": {"check.race_append"},
    "version_reuse": {"check_files.versions_never_return"},
    "widen_narrowing": {"check_narrowing.only_narrows", "check_narrowing.race_narrow"},
    "double_shift": {"check_jobs.race_shift"},
    "stdout_log": {"check.call_stdout_discipline", "check.serve_stdout_discipline",
                   "check_jobs.call_stdout_discipline", "check_files.serve_stdout_discipline"},
    "lease_seconds": {"check.lease_lapse_ms"},
    "lost_event_value": {"check.event_values"},
    "partial_error": {"check.refuse_bad_append"},
}
#: How many checks a defect may fail in all (stdout_log breaks every family's two stdout checks).
AT_MOST = {"stdout_log": 8, "widen_narrowing": 3, "lease_seconds": 2}


#: The one defect the fast loop (-m "not slow") keeps: each run is the whole quick suite (about 8 s).
FAST_LOOP_DEFECT = "lease_seconds"


@pytest.mark.parametrize(
    "defect", [pytest.param(d, marks=() if d == FAST_LOOP_DEFECT else pytest.mark.slow) for d in sorted(CAUGHT_BY)]
)
def test_defect_is_caught_by_its_check(toy: Callable[..., Report], defect: str) -> None:
    report = toy(TOY_BREAK=defect)
    failed = report.failed_names()
    assert CAUGHT_BY[defect] <= failed, f"{defect}: expected {sorted(CAUGHT_BY[defect])} to fail\n{report.failures()}"
    assert len(failed) <= AT_MOST.get(defect, 1), report.failures()
    assert report.passed >= len(report.results) - 8
    assert not report.ok
    assert report.summary() == f"{report.passed} passed, {report.failed} failed"


def test_a_stale_appender_that_packs_what_it_sent_fails_taken_at_a_block_end(tmp_path: Path) -> None:
    """zoo_s3's ``packing_rewrites`` (lnk-bucket-store, on a folder: no fault is needed to show it)."""
    check = "check.taken_at_a_block_end"
    report = run(ZOO_PROGRAM, env={"LNK_BUCKET_URL": f"file://{tmp_path}",
                                                  "ZOO_BREAK": "packing_rewrites"}, checks=[check])
    assert report.failed_names() == {check}, report.failures()
    assert "the stored one, not the one told taken" in report.failures()
    plain = run("lnk-bucket-store", env={"LNK_BUCKET_URL": f"file://{tmp_path}"}, checks=[check])
    assert plain.ok and plain.names() == {check}, plain.failures()

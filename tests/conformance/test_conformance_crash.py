"""``lnk-store-check --crash``: this project's drivers pass on every backend; each crash zoo driver fails its check.

lnk-bucket-store on a folder, moto and SeaweedFS and lnk-gcs on
fake-gcs-server, in quick mode as CI runs it. The folder backend honours
``LNK_STORE_FAILPOINT`` as the cloud ones do, so the zoo's kill points are
the same requests without an emulator.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import SEAWEEDFS, ZOO_PROGRAM, make_store

from cloudstore.conformance import crash_checks, run

SEED = 20261202


@pytest.mark.slow  # about half a minute each: a process started and killed per kill point
@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["file", "moto", "gcs", SEAWEEDFS])
def test_the_drivers_pass_crash_quick(backend: str, request: pytest.FixtureRequest,
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    store = make_store(backend, request, tmp_path_factory)
    report = run(store.program, env=store.env, crash=True, quick=True, seed=SEED)
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert report.names() == {c.name for c in crash_checks.checks.checks}
    killed = next(n for n in report.notes if n.startswith("crash: ") and "killed" in n)
    assert " by failpoint" in killed and " by moment" in killed, killed


#: Each crash zoo driver's defect, the check named for it, and what its failure says.
CAUGHT_BY = {
    "shift_in_two": ("crash.job_shift", "in exactly one place"),
    "due_before_record": ("crash.job_shift", "job_next answered"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("defect", sorted(CAUGHT_BY))
def test_a_crash_zoo_driver_fails_the_check_named_for_it(tmp_path: Path, defect: str) -> None:
    check, says = CAUGHT_BY[defect]
    report = run(ZOO_PROGRAM, env={"LNK_BUCKET_URL": f"file://{tmp_path}", "ZOO_BREAK": defect},
                 crash=True, quick=True, seed=SEED, checks=[check])
    assert report.failed_names() == {check}, report.failures()
    notes = "\n".join(report.notes)
    assert says in report.failures() and "history that broke:" in notes, report.failures()

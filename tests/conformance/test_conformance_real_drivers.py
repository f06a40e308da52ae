"""The suite against this project's real drivers, straight and behind the store bridge.

store-interface.txt: "Every driver's tests run the contract's checks, run
here and behind the store bridge".  lnk-bucket-store on a folder (file://)
and on moto's S3 server, lnk-gcs on fake-gcs-server (the root conftest's
``store`` fixture: a fresh folder or prefix each, so job_next sees only this
run).  The straight run on the folder includes the 4,097-file check; the
others are quick: the limit is the driver's, above the seam, and the
listing of 4,096 files and 4,096 tombstones through each backend's pages is
tests/test_file_list_cost.py's (on moto and fake-gcs-server the check's
4,097 writes took 1-2 CI minutes each and showed nothing more).

Behind the bridge the suite runs once, on lnk-bucket-store with a folder:
the bridge passes lines to the driver's process whatever its backend, each
driver's backends pass the suite straight (above), and the bridge's own
tests run lnk-gcs and lnk-bucket-store on the emulators behind it
(tests/bridge/test_bridge_real_drivers.py).  On fake-gcs-server it took
100 s of CI and showed nothing those do not; on moto, 2.5 min.

On SeaweedFS (a real S3 server whose keys are paths, as MinIO's are) the
store's checks run, not the driver program's own (its commands and stdout
discipline, the same process whatever the server, shown above) nor the
4,097-file list (the driver's limit, shown on the folder): what moto cannot show
is how the keys and conditional writes fare on a real path-keyed server.
"""

from __future__ import annotations

import pytest
from support import SEAWEEDFS, make_store

from cloudstore.conformance import commands, conversations, files, jobs, narrowing, run
from cloudstore.conformance.bridge_transport import BridgeTransport
from cloudstore.conformance.program import Driver

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


#: The checks of what the store keeps (not of the driver program's commands), the quick ones.
STORE_CHECKS = tuple(c.name for m in (commands, conversations, jobs, files, narrowing)
                     for c in m.checks.checks if not c.program and not c.slow)


def test_driver_passes_every_family(store) -> None:
    on_seaweed = store.backend == SEAWEEDFS
    report = run(store.program, env=store.env, quick=store.backend != "file",
                 checks=STORE_CHECKS if on_seaweed else ())
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert {"check", "check_jobs", "check_files", "check_narrowing"} <= {r.family for r in report.results}
    if on_seaweed:
        assert {r.name for r in report.results} == set(STORE_CHECKS)
    else:
        assert any(r.name.endswith("list_limit") for r in report.results) == (store.backend == "file")


def test_driver_passes_every_family_behind_the_bridge(request: pytest.FixtureRequest,
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    store = make_store("file", request, tmp_path_factory)
    transport = BridgeTransport(Driver(store.program, store.env))
    try:
        report = run(store.program, env=store.env, transports=[transport], quick=True, rounds=2)
    finally:
        transport.close()
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert {r.mode for r in report.results} == {"bridge", "program"}

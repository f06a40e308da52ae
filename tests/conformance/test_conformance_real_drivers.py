"""The suite against this project's real drivers, straight and behind the store bridge.

store-interface.txt: "Every driver's tests run the contract's checks, run
here and behind the store bridge".  lnk-bucket-store on a folder (file://)
and on moto's S3 server, lnk-gcs on fake-gcs-server (the root conftest's
``store`` fixture: a fresh folder or prefix each, so job_next sees only this
run).  Straight runs include the 4,097-file check; runs behind the bridge
are quick (the limit is the driver's, and is shown straight).

Behind the bridge, each driver runs once: lnk-bucket-store on the folder,
lnk-gcs on fake-gcs-server.  lnk-bucket-store on moto is not run behind it
again (it was the slowest test, about 2.5 min): the bridge passes lines to
the driver's process whatever its backend, that driver's S3 backend passes
the suite straight (above), and the bridge's own tests run it on moto
(tests/bridge/test_bridge_real_drivers.py).

On SeaweedFS (a real S3 server whose keys are paths, as MinIO's are) the
store's checks run, not the driver program's own (its commands and stdout
discipline, the same process whatever the server, shown above) nor the
4,097-file list (the driver's limit, shown on moto): what moto cannot show
is how the keys and conditional writes fare on a real path-keyed server.
"""

from __future__ import annotations

import pytest
from support import SEAWEEDFS, StoreUnderTest, make_store

from cloudstore.conformance import commands, conversations, files, jobs, narrowing, run
from cloudstore.conformance.bridge_transport import BridgeTransport
from cloudstore.conformance.program import Driver

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


#: The checks of what the store keeps (not of the driver program's commands), the quick ones.
STORE_CHECKS = tuple(c.name for m in (commands, conversations, jobs, files, narrowing)
                     for c in m.checks.checks if not c.program and not c.slow)


def test_driver_passes_every_family(store) -> None:
    on_seaweed = store.backend == SEAWEEDFS
    report = run(store.program, env=store.env, quick=on_seaweed, checks=STORE_CHECKS if on_seaweed else ())
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert {"check", "check_jobs", "check_files", "check_narrowing"} <= {r.family for r in report.results}
    if on_seaweed:
        assert {r.name for r in report.results} == set(STORE_CHECKS)
    else:
        assert any(r.name.endswith("list_limit") for r in report.results)


@pytest.fixture(params=("file", "gcs"))
def each_driver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StoreUnderTest:
    """A fresh store of each driver: lnk-bucket-store on a folder, lnk-gcs on fake-gcs-server."""
    return make_store(request.param, request, tmp_path_factory)


def test_driver_passes_every_family_behind_the_bridge(each_driver: StoreUnderTest) -> None:
    store = each_driver
    transport = BridgeTransport(Driver(store.program, store.env))
    try:
        report = run(store.program, env=store.env, transports=[transport], quick=True, rounds=2)
    finally:
        transport.close()
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert {r.mode for r in report.results} == {"bridge", "program"}

"""The suite against this project's real drivers, straight and behind the store bridge.

store-interface.txt: "Every driver's tests run the contract's checks, run
here and behind the store bridge".  lnk-bucket-store on a folder (file://)
and on moto's S3 server, lnk-gcs on fake-gcs-server (the root conftest's
``store`` fixture: a fresh folder or prefix each, so job_next sees only this
run).  Straight runs include the 4,097-file check; runs behind the bridge
are quick (the limit is the driver's, and is shown straight).
"""

from __future__ import annotations

import pytest

from cloudstore.bridge.transport import BridgeTransport
from cloudstore.conformance import run
from cloudstore.conformance.program import Driver

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow]


def test_driver_passes_every_family(store) -> None:
    report = run(store.program, env=store.env, quick=False)
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert {"check", "check_jobs", "check_files", "check_narrowing"} <= {r.family for r in report.results}
    assert any(r.name.endswith("list_limit") for r in report.results)


def test_driver_passes_every_family_behind_the_bridge(store) -> None:
    transport = BridgeTransport(Driver(store.program, store.env))
    try:
        report = run(store.program, env=store.env, transports=[transport], quick=True, rounds=2)
    finally:
        transport.close()
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert {r.mode for r in report.results} == {"bridge", "program"}

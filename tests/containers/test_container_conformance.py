"""The conformance suite, run against both drivers on containerised emulators.

``lnk-bucket-store`` against MinIO (real S3 conditional writes) and ``lnk-gcs``
against fake-gcs-server, each on a prefix of its own, the whole suite (no
``quick``), through ``cloudstore.conformance.run`` as ``lnk-store-check`` runs
it. On this project's machines (loopback emulators as processes) the full
suite takes about 2 to 3 minutes per driver.
"""

from __future__ import annotations

import pytest

from cloudstore.conformance import run

pytestmark = pytest.mark.containers


def check(program: str, env: dict[str, str]) -> None:
    report = run(program, env=env)
    assert report.results, f"no check ran against {program}"
    assert report.ok, f"{report.summary()}\n{report.failures()}"
    assert report.passed > 0 and report.failed == 0, report.summary()


@pytest.mark.timeout(900)
def test_bucket_store_on_minio(minio_container):
    url = f"s3://{minio_container.bucket}/{minio_container.fresh_prefix()}"
    check("lnk-bucket-store", {**minio_container.env, "LNK_BUCKET_URL": url})


@pytest.mark.timeout(900)
def test_gcs_on_fake_gcs_server(fake_gcs_container):
    url = f"gs://{fake_gcs_container.bucket}/{fake_gcs_container.fresh_prefix()}"
    check("lnk-gcs", {**fake_gcs_container.env, "LNK_GCS_URL": url})

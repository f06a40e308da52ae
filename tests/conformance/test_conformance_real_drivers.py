"""The suite against this project's real drivers, on each backend they keep things in.

lnk-bucket-store on a folder (file://) and on moto's S3 server, lnk-gcs on
fake-gcs-server, each at a prefix of its own so job_next sees only this run.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest

from cloudstore.conformance import run
from cloudstore.emulators import Emulator, start_fake_gcs, start_moto

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def moto() -> Iterator[Emulator]:
    em = start_moto(bucket="conformance")
    yield em
    em.stop()


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[Emulator]:
    em = start_fake_gcs(bucket="conformance")
    yield em
    em.stop()


def test_bucket_store_on_a_folder(tmp_path: Path) -> None:
    report = run("lnk-bucket-store", env={"LNK_BUCKET_URL": f"file://{tmp_path}"}, quick=True)
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)


def test_bucket_store_on_moto(moto: Emulator) -> None:
    env = {**moto.env, "LNK_BUCKET_URL": f"s3://{moto.bucket}/{uuid.uuid4().hex}"}
    report = run("lnk-bucket-store", env=env, quick=True)
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)


def test_gcs_on_fake_gcs_server(fake_gcs: Emulator) -> None:
    env = {**fake_gcs.env, "LNK_GCS_URL": f"gs://{fake_gcs.bucket}/{uuid.uuid4().hex}"}
    report = run("lnk-gcs", env=env, quick=True)
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)

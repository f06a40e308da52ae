"""Container fixtures: MinIO and fake-gcs-server started with testcontainers.

Every test in this folder needs a Docker engine. Where none answers (as on
this project's own machines, which have the docker CLI but no daemon), each
test here is skipped with one reason, reported once by ``pytest -rs``; the
engine is asked once per run, with a short timeout.

The images are pinned to the same releases as ``docker-compose.yml``
(``tests/test_deploy_files.py`` checks that they agree) and can be overridden
with ``LNK_TEST_MINIO_IMAGE`` / ``LNK_TEST_FAKE_GCS_IMAGE``.

MinIO runs from testcontainers' generic ``DockerContainer`` rather than
``testcontainers.minio.MinioContainer``: that class imports the ``minio``
client package (not among the test dependencies) and defaults to a 2022
MinIO, older than MinIO's conditional writes.
"""

from __future__ import annotations

import functools
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

MINIO_IMAGE = os.environ.get("LNK_TEST_MINIO_IMAGE", "minio/minio:RELEASE.2025-04-22T22-12-26Z")
FAKE_GCS_IMAGE = os.environ.get("LNK_TEST_FAKE_GCS_IMAGE", "fsouza/fake-gcs-server:1.54.0")
MINIO_USER = "minioadmin"
MINIO_PASSWORD = "minioadmin"
BUCKET = "cloudstore-test"
PING_TIMEOUT_S = 3
START_TIMEOUT_S = 120


@functools.cache
def docker_problem() -> str | None:
    """Why no Docker engine can be used here, or None when one answers a ping."""
    try:
        import docker
    except ImportError as exc:
        return f"the docker package is missing ({exc}): pip install '.[test]'; container tests need a Docker engine"
    host: str | None = None
    try:  # where testcontainers itself will look (its properties file, DOCKER_HOST, the docker context)
        from testcontainers.core.docker_client import get_docker_host

        host = get_docker_host()
    except Exception:  # noqa: BLE001 - an older testcontainers: docker.from_env's own lookup below
        host = None
    where = host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.DockerClient(base_url=host, timeout=PING_TIMEOUT_S) if host else docker.from_env(
            timeout=PING_TIMEOUT_S)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure to reach the engine means "no engine"
        return (f"no Docker engine answers at {where} ({type(exc).__name__}): "
                "container tests (MinIO, fake-gcs-server) need one")
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip every test in this folder, before any fixture starts a container, when no engine answers.

    Raised here rather than in a fixture, the skip has one location (this
    line), so ``pytest -rs`` reports it once, with the count of tests.
    """
    problem = docker_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """The same guard for the container fixtures, whoever asks for them."""
    problem = docker_problem()
    if problem:
        pytest.skip(problem)


def wait_http(url: str, container: Any, seconds: float = START_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers 2xx; fail early if the container stopped."""
    deadline = time.monotonic() + seconds
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if 200 <= reply.status < 300:
                    return
                last = reply.status
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = exc
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        if wrapped.status in ("exited", "dead"):
            out, err = container.get_logs()
            raise RuntimeError(f"{container.image} stopped before answering {url}:\n{out.decode()}{err.decode()}")
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer within {seconds}s (last: {last!r})")


@dataclass
class Running:
    """A started emulator: how the drivers reach it, and a ready client."""

    name: str
    endpoint: str
    bucket: str
    env: dict[str, str] = field(default_factory=dict)
    client: Any = None

    def fresh_prefix(self) -> str:
        """A prefix nobody else in the run uses (job_next answers for the whole prefix)."""
        return f"run-{uuid.uuid4().hex[:12]}"


def s3_client(endpoint: str) -> Any:
    """A boto3 client for MinIO: no retries, so every 412 is the server's own answer."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=MINIO_USER,
        aws_secret_access_key=MINIO_PASSWORD,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, max_pool_connections=32),
    )


@pytest.fixture(scope="session")
def minio_container(docker_engine: None) -> Iterator[Running]:
    """MinIO with ``BUCKET`` made; env for ``lnk-bucket-store`` (LNK_BUCKET_URL still to add)."""
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer(MINIO_IMAGE)
        .with_command("server /data --address :9000")
        .with_env("MINIO_ROOT_USER", MINIO_USER)
        .with_env("MINIO_ROOT_PASSWORD", MINIO_PASSWORD)
        .with_exposed_ports(9000)
    )
    with container:
        endpoint = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(9000)}"
        wait_http(f"{endpoint}/minio/health/live", container)
        client = s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        env = {
            "AWS_ENDPOINT_URL_S3": endpoint,
            "AWS_ACCESS_KEY_ID": MINIO_USER,
            "AWS_SECRET_ACCESS_KEY": MINIO_PASSWORD,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        yield Running("minio", endpoint, BUCKET, env, client)


@pytest.fixture(scope="session")
def fake_gcs_container(docker_engine: None) -> Iterator[Running]:
    """fake-gcs-server (memory backend: it keeps generations) with ``BUCKET`` made.

    No ``-external-url``: the mapped port is known only after the start, and the
    drivers' objects are small enough for single-request uploads, which never
    follow the upload ``Location`` that option sets.
    """
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer(FAKE_GCS_IMAGE)
        .with_command(["-scheme", "http", "-host", "0.0.0.0", "-port", "4443", "-backend", "memory",
                       "-log-level", "warn"])
        .with_exposed_ports(4443)
    )
    with container:
        endpoint = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(4443)}"
        wait_http(f"{endpoint}/storage/v1/b", container)
        made = urllib.request.Request(
            f"{endpoint}/storage/v1/b?project=test", data=json.dumps({"name": BUCKET}).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(made, timeout=10) as reply:
            assert json.load(reply)["name"] == BUCKET
        env = {"STORAGE_EMULATOR_HOST": endpoint, "GOOGLE_CLOUD_PROJECT": "test"}
        yield Running("fake-gcs-server", endpoint, BUCKET, env)

"""Real runner processes against real drivers: file://, moto (S3) and fake-gcs-server.

The emulators and the fresh store of each test (a folder, or a new prefix in
the bucket, so ``job_next`` sees only that test's jobs) come from the root
conftest's ``store`` fixture.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from scheduler_rig import Backend, Rig

from cloudstore.protocol.client import ServeProcess

# Emulators are slower than a folder: job counts are scaled down on them.
SCALE = {"file": 1.0, "moto": 0.5, "gcs": 0.5}


@pytest.fixture
def backend(store) -> Backend:
    """The root conftest's fresh store on each backend, with its job scale."""
    return Backend(store.backend, store.program, store.env, SCALE[store.backend])


@pytest.fixture
def rig(backend: Backend, tmp_path: Path) -> Iterator[Rig]:
    store = ServeProcess(backend.driver, backend.env, stderr=subprocess.DEVNULL)
    made = Rig(backend, tmp_path, store)
    yield made
    made.stop_all()
    for r in made.runners:
        assert r.proc.stdout is not None
        assert r.proc.stdout.read() == b"", "a runner wrote on stdout"
        r.proc.stdout.close()
    store.close()

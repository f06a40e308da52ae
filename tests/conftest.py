"""Shared fixtures: the emulators, started once per run as processes, and one
fresh store location per test on each of the three backends.

Every test that takes ``store`` runs three times: on a local folder
(``file://``), on moto's S3 server and on fake-gcs-server.  Each run gets a
prefix of its own (a new folder, or ``bucket/<uuid>``), so ``job_next``,
which answers for the whole store, sees that test's jobs only.

The fast loop, ``python3 -m pytest -q -m "not slow"``, leaves out what
:func:`pytest_collection_modifyitems` marks ``slow``: besides the tests marked
so by hand, every run on moto or fake-gcs-server (a ``moto``/``gcs``
parameter, or the ``moto_server``/``gcs_server`` fixture) except in the files
of ``EMULATORS_IN_THE_FAST_LOOP``, which keep ``s3.py`` and ``gcs.py`` (and
the SDKs' replies) in the loop; the run on the folder goes through the same
code above the seam.  The full command runs everything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from emulators import Emulator, start_fake_gcs, start_moto
from faults.machines import Machines
from support import BACKENDS, Session, StoreUnderTest, fresh_agent, make_store, serving

#: The backends that are emulators (processes speaking S3 / GCS) rather than the local folder.
EMULATED = ("moto", "gcs")

#: Test files whose runs on the emulators stay in the fast loop: the seam's own tests and the
#: SDK-level ones, so that every backend module runs there.
EMULATORS_IN_THE_FAST_LOOP = frozenset({"test_seam.py", "test_sdk_faults.py", "test_cloud_permissions.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` each run on an emulator whose file is not in ``EMULATORS_IN_THE_FAST_LOOP``."""
    for item in items:
        if item.path.name in EMULATORS_IN_THE_FAST_LOOP:
            continue
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        on_emulator = any(isinstance(v, str) and v in EMULATED for v in params)
        if on_emulator or {"moto_server", "gcs_server"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Emulator]:
    em = start_moto()
    yield em
    em.stop()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Emulator]:
    em = start_fake_gcs()
    yield em
    em.stop()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StoreUnderTest:
    """A fresh location on each backend in turn."""
    return make_store(request.param, request, tmp_path_factory)


@pytest.fixture
def store_env(store: StoreUnderTest, monkeypatch: pytest.MonkeyPatch) -> StoreUnderTest:
    """The same, with its settings laid into this process's environment (in-process tests)."""
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    return store


@pytest.fixture
def machines(store_env: StoreUnderTest) -> Iterator[Machines]:
    """Several in-process "machines" on one store (faults/machines.py), closed after the test."""
    group = Machines(store_env)
    yield group
    group.close()


def pytest_report_header(config: pytest.Config) -> str:
    return f"cloudstore backends under test: {', '.join(BACKENDS)} (emulators started as processes); cwd {os.getcwd()}"


@pytest.fixture
def session(store: StoreUnderTest) -> Iterator[Session]:
    """A serve process of the store's driver, bound to a fresh agent."""
    with serving(store) as procs:
        yield Session(procs[0], fresh_agent())

"""Shared fixtures: the emulators, started once per run as processes, and one
fresh store location per test on each of the three backends.

Every test that takes ``store`` runs three times: on a local folder
(``file://``), on moto's S3 server and on fake-gcs-server.  Each run gets a
prefix of its own (a new folder, or ``bucket/<uuid>``), so ``job_next``,
which answers for the whole store, sees that test's jobs only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support import BACKENDS, Session, StoreUnderTest, fresh_agent, make_store, serving

from cloudstore.emulators import Emulator, start_fake_gcs, start_moto


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


def pytest_report_header(config: pytest.Config) -> str:
    return f"cloudstore backends under test: {', '.join(BACKENDS)} (emulators started as processes); cwd {os.getcwd()}"


@pytest.fixture
def session(store: StoreUnderTest) -> Iterator[Session]:
    """A serve process of the store's driver, bound to a fresh agent."""
    with serving(store) as procs:
        yield Session(procs[0], fresh_agent())

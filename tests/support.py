"""Helpers for driving the real driver programs in tests: sessions and racers."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cloudstore.conformance.racing import at_once
from cloudstore.protocol.client import ServeProcess
from cloudstore.settings import Location, parse_location

Json = Any

#: The three backends every store test runs on.
BACKENDS = ("file", "moto", "gcs")

#: SeaweedFS (``weed mini``): a real S3 server whose keys are filer paths, as MinIO's are.  The
#: ``store`` fixture runs on it too, but only in the files of conftest's ``ON_SEAWEEDFS`` (what
#: moto cannot show: path semantics, real conditional writes), to keep CI's time.
SEAWEEDFS = "seaweedfs"

#: lnk-bucket-store with one defect, chosen by ``ZOO_BREAK`` (tests/broken_drivers/zoo_s3.py), as a program.
ZOO_PROGRAM = (sys.executable, str(Path(__file__).resolve().parent / "broken_drivers" / "zoo_s3.py"))

#: The S3 servers: the ones ``lnk-bucket-store`` reaches through ``AWS_ENDPOINT_URL_S3``.
S3_SERVERS = ("moto", SEAWEEDFS)


def wait_for(check: Callable[[], Any], seconds: float = 30.0, what: str = "condition", every: float = 0.05) -> Any:
    """Poll ``check`` until it is truthy and return that value; fail naming ``what`` past ``seconds``.

    A hang guard for waiting on a state (a process gone, a record written),
    never a judgement of how fast anything is.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


def fresh_agent(owner: str | None = "o") -> dict:
    """A new agent nobody else in the run uses."""
    return {"id": f"agent-{uuid.uuid4().hex[:10]}", "owner": owner}


class Session:
    """One ``serve`` process bound to one agent, with a terse request method."""

    def __init__(self, proc: ServeProcess, agent: dict) -> None:
        self.proc = proc
        self.agent = agent

    def __call__(self, op: str, **args: Json) -> Json:
        return self.proc.request({"op": op, "agent": self.agent, **args}, timeout=60)


@contextmanager
def serving(store: Any, count: int = 1) -> Iterator[list[ServeProcess]]:
    """``count`` serve processes of the store's driver, closed afterwards."""
    procs = [ServeProcess(store.program, env=store.env) for _ in range(count)]
    try:
        for p in procs:  # warm: the SDK import and first connection happen here
            p.request({"op": "last", "agent": {"id": "warm", "owner": None}, "thread": "warm"}, timeout=60)
        yield procs
    finally:
        for p in procs:
            p.close()


def race(procs: list[ServeProcess], make: Callable[[int], Json]) -> list[Json]:
    """Send ``make(i)`` from every process at once (released at a barrier); replies by i."""
    def ready(i: int) -> Callable[[], Json]:
        request = make(i)
        return lambda: procs[i].request(request, timeout=60)

    return at_once([partial(ready, i) for i in range(len(procs))])


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ`` inside, as they were after (an SDK client reads its endpoint when made).

    For code that runs outside a test function's ``monkeypatch`` (a fixture's helper, a class's method)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def location_of(store: Any) -> Location:
    """The parsed location of a store under test."""
    setting = "LNK_GCS_URL" if store.backend == "gcs" else "LNK_BUCKET_URL"
    return parse_location(setting, store.env[setting], ("gs", "s3", "file"))


def service_of(store: Any) -> Any:
    """The drivers' request handler in this process, on a store under test (its env must be set)."""
    from cloudstore.protocol.service import Service
    from cloudstore.settings import open_store
    from cloudstore.store.space import Space

    loc = location_of(store)
    return Service(Space(open_store(loc), loc.prefix))


@dataclass(frozen=True)
class StoreUnderTest:
    """One fresh location: which driver program, and the environment for it."""

    backend: str
    program: str
    env: dict[str, str]
    url: str


def make_store(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
    own_bucket: bool = False,
) -> StoreUnderTest:
    """A fresh location on ``backend``; with ``own_bucket``, on an emulator, in a bucket of its own.

    fake-gcs-server's writes slow down as their bucket fills, not as the
    server does (measured: 300 creates took 0.29 s into an empty bucket, 6.5 s
    beside 15,000 objects, 0.31 s into another bucket of the same server), so
    on it every store is a bucket of its own: in one shared bucket the suite's
    later GCS tests ran several times slower than alone.  moto's do not (2.2 s
    and 2.6 s), so there only a test that plants tens of thousands of objects
    asks for one."""
    tag = uuid.uuid4().hex[:12]
    if backend == "file":
        folder = tmp_path_factory.mktemp("bucket")
        url = f"file://{folder}"
        return StoreUnderTest("file", "lnk-bucket-store", {"LNK_BUCKET_URL": url}, url)
    if backend in S3_SERVERS:
        em = request.getfixturevalue("moto_server" if backend == "moto" else "seaweed_server")
        bucket = new_bucket(em, tag) if own_bucket else em.bucket
        url = f"s3://{bucket}/{tag}"
        return StoreUnderTest(backend, "lnk-bucket-store", {**em.env, "LNK_BUCKET_URL": url}, url)
    em = request.getfixturevalue("gcs_server")
    bucket = new_bucket(em, tag)
    url = f"gs://{bucket}/{tag}"
    return StoreUnderTest("gcs", "lnk-gcs", {**em.env, "LNK_GCS_URL": url}, url)


def new_bucket(em: Any, tag: str) -> str:
    """Make bucket ``cs-<tag>`` on the emulator ``em`` (moto: a PUT of the bucket; SeaweedFS: a signed
    CreateBucket; fake-gcs-server: a POST)."""
    import urllib.request

    from emulators import new_seaweed_bucket

    name = f"cs-{tag}"
    if em.name == SEAWEEDFS:
        new_seaweed_bucket(em, name)
    elif em.name == "moto":
        endpoint = em.env["AWS_ENDPOINT_URL_S3"]
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{name}", method="PUT"), timeout=30).read()
    else:
        host = em.env["STORAGE_EMULATOR_HOST"]
        urllib.request.urlopen(urllib.request.Request(
            f"{host}/storage/v1/b?project=test", data=f'{{"name": "{name}"}}'.encode(), method="POST",
            headers={"Content-Type": "application/json"}), timeout=30).read()
    return name


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any store setting or credentials, plus ``extra``: a program started with it
    knows only what the test gives it (no emulator of the session leaks in)."""
    drop = ("LNK_BUCKET_URL", "LNK_GCS_URL", "AWS_", "GOOGLE_", "STORAGE_EMULATOR_HOST", "LNK_STORE_LOG")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env

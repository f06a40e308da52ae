"""Opening a store from Python as the drivers open it, and errors whose classes say the mistake (issue 46, item 6).

On c81d270 ``cloudstore.open("file:///typo")`` made the folder the driver
refuses; a missing bucket raised an error telling the user to "check the
setting LNK_BUCKET_URL", which they never set; a store failure named no
endpoint and was no ``OSError``; ``cloudstore.open(url, **settings: Any)`` hid
its keywords (``concurrency="8"`` a raw comparison ``TypeError``); and
``repr(store)`` showed no URL.  Each test here runs both flavours where both
can be opened, through test_api.py's ``open_store``.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_api import FLAVOURS, Loop, open_store

import cloudstore
import cloudstore.aio
import cloudstore.api
from cloudstore.errors import (
    ArgumentError,
    CloudstoreError,
    FailedError,
    LocationError,
    OutcomeUnknownError,
    RefusedError,
    StoreFailure,
    StoreNotFoundError,
)


@pytest.fixture(scope="module")
def loop() -> Any:
    running = Loop()
    yield running
    running.stop()


def moto_in_env(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's moto server, its settings laid into this process's environment."""
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    return moto


def first_call_fails(store: Any, expected: type[CloudstoreError]) -> Any:
    """The error of a first call (``last``) on ``store``, which must be of class ``expected``; the store closed."""
    try:
        with pytest.raises(expected) as caught:
            store.agent("o", "a").last("t")
    finally:
        store.close()
    return caught.value


# --------------------------------------------------------------------------
# The same refusals as the drivers


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_folder_that_does_not_exist_is_refused_as_the_driver_refuses_it(flavour: str, tmp_path: Path,
                                                                          loop: Loop) -> None:
    """No folder made silently: the driver refuses ``file:///typo``, and so does ``open``; ``create=True`` asks."""
    typo = tmp_path / "typo" / "store"
    url = f"file://{typo}"
    driver = subprocess.run(["lnk-bucket-store", "call"], input='{"op": "last", "agent": {"owner": null, "id": "a"}, '
                            '"thread": "t"}', capture_output=True, text=True, timeout=60,
                            env={**os.environ, "LNK_BUCKET_URL": url})
    assert "folder does not exist" in driver.stdout, driver.stdout + driver.stderr
    with pytest.raises(StoreNotFoundError) as caught:
        open_store(flavour, url, loop)
    error = caught.value
    assert isinstance(error, LocationError) and isinstance(error, ValueError)
    assert isinstance(error, FileNotFoundError) and error.errno == 2  # as the built-in open says it of a file
    assert url in str(error) and "create=True" in str(error), str(error)
    assert not (tmp_path / "typo").exists(), "a folder was made"

    store = open_store(flavour, url, loop, create=True)
    try:
        assert typo.is_dir() and typo.stat().st_mode & 0o777 == 0o700
        me = store.agent("o", "a")
        assert me.append("t", {"seq": 1}).done and me.last("t") == 1
    finally:
        store.close()
    with pytest.raises(ArgumentError, match="file:// stores only"):
        open_store(flavour, "s3://some-bucket/p", loop, create=True, endpoint_url="http://127.0.0.1:9")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_store_that_cannot_be_opened_is_named_by_its_url(flavour: str, loop: Loop) -> None:
    """An SDK that refuses to open (boto3: an endpoint that is no URL) says which of a program's stores it was."""
    with pytest.raises(LocationError, match="cannot be opened") as caught:
        open_store(flavour, "s3://some-bucket/the/prefix", loop, endpoint_url="not-a-url", region_name="us-east-1")
    assert "s3://some-bucket/the/prefix" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_missing_bucket_names_the_url_not_a_setting(flavour: str, moto_server: Any,
                                                      monkeypatch: pytest.MonkeyPatch, loop: Loop) -> None:
    """A bucket that does not exist: ``StoreNotFoundError`` naming the URL the caller passed and the endpoint,
    not "check the setting LNK_BUCKET_URL" (the driver's words, of a setting an API user never set)."""
    moto = moto_in_env(moto_server, monkeypatch)
    monkeypatch.delenv("LNK_BUCKET_URL")
    url = f"s3://missing-{uuid.uuid4().hex[:12]}/some/prefix"
    error = first_call_fails(open_store(flavour, url, loop), StoreNotFoundError)
    assert url in str(error) and moto.env["AWS_ENDPOINT_URL_S3"] in str(error), str(error)
    assert "LNK_BUCKET_URL" not in str(error) and "check the setting" not in str(error), str(error)
    assert error.op == "last" and error.changed is False
    assert isinstance(error, LocationError) and isinstance(error, FileNotFoundError)


# --------------------------------------------------------------------------
# Store failures are OSErrors that say which store, reached where


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_store_failure_is_an_oserror_naming_the_store_and_its_endpoint(flavour: str, moto_server: Any,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         loop: Loop) -> None:
    """The store refuses every read (403 at the proxy): ``FailedError``, an ``OSError`` whose text names the URL
    and the endpoint; its ``message`` stays the driver's words, which name neither."""
    from faults.http_proxy import FaultProxy, Rule

    moto = moto_in_env(moto_server, monkeypatch)
    url = f"s3://{moto.bucket}/{uuid.uuid4().hex[:12]}"
    with FaultProxy(moto.env["AWS_ENDPOINT_URL_S3"], flavor="s3") as proxy:
        proxy.add(Rule("fail", method="GET", status=403, times=1_000_000))
        error = first_call_fails(open_store(flavour, url, loop, endpoint_url=proxy.url), FailedError)
    assert isinstance(error, OSError) and isinstance(error, StoreFailure) and isinstance(error, CloudstoreError)
    assert error.store == url and error.endpoint == proxy.url
    assert url in str(error) and proxy.url in str(error), str(error)
    assert url not in error.message and proxy.url not in error.message and "nothing was changed" in error.message
    assert not isinstance(error, ValueError), "a failing store is not the caller's bad input"


def test_the_classes_say_the_mistake_and_the_old_names_stay() -> None:
    """Refused input and a wrong URL are ``ValueError``s, a failing store an ``OSError``, all under one root;
    every name code imported before is still there with the bases it caught by."""
    assert issubclass(RefusedError, ValueError) and not issubclass(RefusedError, OSError)
    assert issubclass(LocationError, ValueError) and not issubclass(LocationError, OSError)
    assert issubclass(StoreNotFoundError, LocationError) and issubclass(StoreNotFoundError, FileNotFoundError)
    for cls in (FailedError, OutcomeUnknownError):
        assert issubclass(cls, StoreFailure) and issubclass(cls, OSError) and not issubclass(cls, ValueError)
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentError, ValueError)
    for cls in (RefusedError, LocationError, StoreNotFoundError, StoreFailure, ArgumentError):
        assert issubclass(cls, CloudstoreError)
    assert OutcomeUnknownError("x", "append").outcome_unknown and not FailedError("x").outcome_unknown
    assert str(FailedError("the store kept failing", "last")) == "the store kept failing"  # made as before


# --------------------------------------------------------------------------
# Typed keywords on cloudstore.open itself


def test_cloudstore_open_spells_the_keywords_of_the_api() -> None:
    """``cloudstore.open`` shows its keywords (a checker and ``help()`` see them), the same as the API's own."""
    ours = inspect.signature(cloudstore.open).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in ours.values()), ours
    for other in (cloudstore.api.open, cloudstore.aio.open):
        theirs = inspect.signature(other).parameters
        assert [(p.name, p.kind, p.default, p.annotation) for p in ours.values()] == \
               [(p.name, p.kind, p.default, p.annotation) for p in theirs.values()], other
    assert ours["concurrency"].default == cloudstore.api.DEFAULT_CONCURRENCY
    assert ours["create"].default is False and ours["create"].annotation == "bool"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_keyword_of_the_wrong_type_is_named(flavour: str, tmp_path: Path, loop: Loop) -> None:
    """``concurrency="8"`` (read from a config file) is said at the call, naming the keyword, before anything opens."""
    url = f"file://{tmp_path}"
    for keywords, named in (({"concurrency": "8"}, "concurrency must be an int"),
                            ({"concurrency": True}, "concurrency must be an int"),
                            ({"concurrency": 0}, "concurrency must be at least 1"),
                            ({"create": "yes"}, "create must be True or False"),
                            ({"endpoint_url": 9}, "endpoint_url must be a non-empty string"),
                            ({"region_name": ""}, "region_name must be a non-empty string")):
        with pytest.raises(ArgumentError, match=named) as caught:
            open_store(flavour, url, loop, **keywords)
        assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)
    with pytest.raises(TypeError, match="bucket_url"):
        cloudstore.open(url, bucket_url="s3://b/p")  # type: ignore[call-arg]


# --------------------------------------------------------------------------
# repr


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_repr_names_the_store_and_endpoint_never_a_credential(flavour: str, tmp_path: Path, loop: Loop,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-of-the-test")
    store = open_store(flavour, f"file://{tmp_path}", loop)
    shown = repr(getattr(store, "_target", store))  # the asyncio store itself, not test_api's blocking face
    assert shown.startswith("<") and f"file://{tmp_path}" in shown and "concurrency=8" in shown, shown
    store.close()
    assert repr(getattr(store, "_target", store)).endswith(" closed>")

    store = open_store(flavour, "s3://some-bucket/a/prefix", loop, endpoint_url="http://user:hunter2@127.0.0.1:9",
                       region_name="us-east-1", concurrency=3)
    try:
        shown = repr(getattr(store, "_target", store))
    finally:
        store.close()
    assert "s3://some-bucket/a/prefix" in shown and "endpoint=http://127.0.0.1:9" in shown, shown
    assert "concurrency=3" in shown
    for secret in ("hunter2", "user:", "AKIDEXAMPLE", "secret-of-the-test"):
        assert secret not in shown, shown

"""The backends' shortcuts around their SDKs' per-request costs answer what the SDKs would (issue 45).

Each shortcut (gcs.py's ``_updated`` and ``_EnvironmentOnce``, s3.py's
``timestamp_parser``) saves CPU on every request or listed key of a
driver's reads; what it gives must be what the SDK's own path gives, on
the same input.  Checked here offline, against the SDK's functions
themselves; benchmarks/cloud_round_trips.py measures what they save.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("google.cloud.storage")

from cloudstore.gcs import _EnvironmentOnce, _updated  # noqa: E402


def _blob(updated: str | None) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="test", credentials=AnonymousCredentials())
    blob = client.bucket("b").blob("k")
    if updated is not None:
        blob._properties["updated"] = updated
    return blob


@pytest.mark.parametrize("text", [
    "2026-12-05T06:03:30Z", "2026-12-05T06:03:30.1Z", "2026-12-05T06:03:30.123Z", "2026-12-05T06:03:30.123456Z",
    "2026-12-05T06:03:30.123456789Z", "2026-12-05T06:03:30.000000999Z", "1970-01-01T00:00:00Z",
    "2024-02-29T23:59:59.999999999Z", "2026-12-05T06:03:30.5Z and more",
])
def test_updated_is_the_sdks_timestamp(text: str) -> None:
    blob = _blob(text)
    assert _updated(blob) == blob.updated.timestamp()


def test_updated_of_a_listing_without_it_is_zero() -> None:
    assert _updated(_blob(None)) == 0.0


@pytest.mark.parametrize("text", ["2026-02-30T06:03:30Z", "2026-12-05 06:03:30Z", "yesterday"])
def test_an_updated_the_sdk_refuses_is_refused_alike(text: str) -> None:
    blob = _blob(text)
    with pytest.raises(ValueError):
        blob.updated  # noqa: B018 - the SDK's own refusal
    with pytest.raises(ValueError):
        _updated(blob)


def _session() -> Any:
    import requests

    return requests.Session()


URLS = ("http://127.0.0.1:4443/storage/v1/b/b/o?prefix=x", "https://storage.googleapis.com/download/storage/v1/b/b/o/k",
        "https://storage.googleapis.com/upload/storage/v1/b/b/o?uploadType=multipart", "http://other:80/x")


@pytest.mark.parametrize("env", [
    {},
    {"HTTPS_PROXY": "http://proxy:3128", "HTTP_PROXY": "http://proxy:3129"},
    {"https_proxy": "http://proxy:3128", "NO_PROXY": "storage.googleapis.com"},
    {"HTTP_PROXY": "http://proxy:3129", "no_proxy": "127.0.0.1"},
    {"REQUESTS_CA_BUNDLE": "/etc/ssl/bundle.pem"},
    {"CURL_CA_BUNDLE": "/etc/ssl/curl.pem", "ALL_PROXY": "socks5://proxy:1080"},
])
def test_environment_once_answers_as_requests(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name.endswith("_CA_BUNDLE"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    plain, once = _session(), _session()
    once.merge_environment_settings = _EnvironmentOnce(once)
    for url in URLS:
        for stream, verify, proxies in ((None, None, {}), (True, None, {}), (False, "/my.pem", {"http": "h:1"}),
                                        (None, False, {"no_proxy": "other"})):
            for _ in range(2):  # the second from what was kept
                asked = plain.merge_environment_settings(url, dict(proxies), stream, verify, None)
                assert once.merge_environment_settings(url, dict(proxies), stream, verify, None) == asked


def test_environment_once_follows_the_sessions_own_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    plain, once = _session(), _session()
    once.merge_environment_settings = _EnvironmentOnce(once)
    url = URLS[1]
    first = once.merge_environment_settings(url, {}, None, None, None)
    first["proxies"]["https"] = "changed by a caller"  # a copy: what is kept stays
    assert once.merge_environment_settings(url, {}, None, None, None)["proxies"]["https"] == "http://proxy:3128"
    for change in ({"proxies": {"https": "http://mine:8080"}}, {"verify": "/session.pem"}, {"stream": True},
                   {"cert": ("/c.pem", "/k.pem")}, {"trust_env": False}):
        for session in (plain, once):
            for name, value in change.items():
                setattr(session, name, value)
        assert once.merge_environment_settings(url, {}, None, None, None) == \
            plain.merge_environment_settings(url, {}, None, None, None), change


def test_environment_once_reads_the_environment_once_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import requests.sessions

    reads: list[str] = []
    real = requests.sessions.get_environ_proxies

    def counted(url: str, no_proxy: Any = None) -> Any:
        reads.append(url)
        return real(url, no_proxy=no_proxy)

    monkeypatch.setattr(requests.sessions, "get_environ_proxies", counted)
    session = _session()
    session.merge_environment_settings = _EnvironmentOnce(session)
    for key in range(20):
        session.merge_environment_settings(f"http://127.0.0.1:4443/download/storage/v1/b/b/o/{key}", {}, True,
                                           None, None)
    assert len(reads) == 1


STAMPS = ["2026-12-05T06:03:30.000Z", "2026-12-05T06:03:30Z", "2026-12-05T06:03:30.5Z", "2026-12-05T06:03:30.123456Z",
          "2024-02-29T23:59:59.999Z", "1970-01-01T00:00:00.000Z", "Sat, 05 Dec 2026 06:03:30 GMT",
          "Mon, 05 Dec 2026 06:03:30 GMT", "Thu, 29 Feb 2024 23:59:59 GMT", "Thu, 01 Jan 1970 00:00:00 GMT",
          # not the two forms: botocore's own way
          "2026-12-05T06:03:30.123456789Z", "2026-12-05T06:03:30+02:00", "1733378610", "Sat, 5 Dec 2026 06:03:30 GMT",
          "2026-12-05 06:03:30"]


@pytest.mark.parametrize("text", STAMPS)
def test_s3_timestamps_are_botocores_instants(text: str) -> None:
    from botocore.utils import parse_timestamp

    from cloudstore.s3 import timestamp_parser

    mine, theirs = timestamp_parser()(text), parse_timestamp(text)
    assert mine.timestamp() == theirs.timestamp() and mine.utcoffset() == theirs.utcoffset()


@pytest.mark.parametrize("text", ["2026-02-30T06:03:30.000Z", "Mon, 30 Feb 2026 06:03:30 GMT", "never"])
def test_s3_timestamps_botocore_refuses_are_refused_alike(text: str) -> None:
    from botocore.utils import parse_timestamp

    from cloudstore.s3 import timestamp_parser

    with pytest.raises(ValueError) as theirs:
        parse_timestamp(text)
    with pytest.raises(ValueError) as mine:
        timestamp_parser()(text)
    assert str(mine.value) == str(theirs.value)


def test_the_drivers_s3_client_parses_with_it() -> None:
    from cloudstore.s3 import make_client

    client = make_client(client_args={"region_name": "us-east-1", "endpoint_url": "http://127.0.0.1:9"})
    parser = client._endpoint._response_parser_factory.create_parser("rest-xml")
    assert parser._timestamp_parser.__qualname__ == "timestamp_parser.<locals>.parse"

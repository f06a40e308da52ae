"""The backends' shortcuts around their SDKs' per-request costs answer what the SDKs would (issue 45).

Each shortcut (gcs.py's ``_updated``) saves CPU
on every request or listed key of a driver's reads; what it gives must be
what the SDK's own path gives, on the same input.  Checked here offline,
against the SDK's functions themselves; benchmarks/cloud_round_trips.py
measures what they save.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("google.cloud.storage")

from cloudstore.gcs import _updated  # noqa: E402


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

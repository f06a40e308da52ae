"""The S3 conditional writes the bucket driver relies on, asked of MinIO directly.

MinIO has had bugs in exactly these (If-None-Match on PUT, If-Match on a
missing key, conditional DELETE), so each is checked through boto3 with no
retries: what a driver would see. "Must not succeed" is asserted as: the call
raises, and the object is as it was.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

pytestmark = pytest.mark.containers

WRONG_ETAG = '"00000000000000000000000000000000"'


def status_of(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def refused(call: Callable[[], Any]) -> ClientError:
    """Run ``call``, which must be refused by the server; the error."""
    with pytest.raises(ClientError) as caught:
        call()
    return caught.value


def body_of(s3: Any, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def missing(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if status_of(exc) == 404:
            return True
        raise
    return False


def test_create_if_absent_refuses_the_second_writer(minio_container):
    s3, bucket, key = minio_container.client, minio_container.bucket, f"cond/{uuid.uuid4().hex}"
    first = s3.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
    assert first["ETag"]
    err = refused(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*"))
    assert status_of(err) == 412, err.response
    assert body_of(s3, bucket, key) == b"first"


def test_if_match_replaces_only_the_version_it_names(minio_container):
    s3, bucket, key = minio_container.client, minio_container.bucket, f"cond/{uuid.uuid4().hex}"
    v1 = s3.put_object(Bucket=bucket, Key=key, Body=b"v1", IfNoneMatch="*")["ETag"]

    err = refused(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"wrong", IfMatch=WRONG_ETAG))
    assert status_of(err) == 412, err.response
    assert body_of(s3, bucket, key) == b"v1"

    v2 = s3.put_object(Bucket=bucket, Key=key, Body=b"v2", IfMatch=v1)["ETag"]
    assert v2 != v1
    assert body_of(s3, bucket, key) == b"v2"

    err = refused(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"stale", IfMatch=v1))
    assert status_of(err) == 412, err.response
    assert body_of(s3, bucket, key) == b"v2"


def test_if_match_on_a_missing_key_writes_nothing(minio_container):
    s3, bucket, key = minio_container.client, minio_container.bucket, f"cond/{uuid.uuid4().hex}"
    err = refused(lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"ghost", IfMatch=WRONG_ETAG))
    assert status_of(err) in (404, 412), err.response
    assert missing(s3, bucket, key)


def test_conditional_delete_keeps_an_object_that_changed(minio_container):
    s3, bucket, key = minio_container.client, minio_container.bucket, f"cond/{uuid.uuid4().hex}"
    etag = s3.put_object(Bucket=bucket, Key=key, Body=b"keep me", IfNoneMatch="*")["ETag"]

    err = refused(lambda: s3.delete_object(Bucket=bucket, Key=key, IfMatch=WRONG_ETAG))
    assert status_of(err) == 412, err.response
    assert body_of(s3, bucket, key) == b"keep me"

    s3.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
    assert missing(s3, bucket, key)


def _race(n: int, attempt: Callable[[int], Any]) -> list[Any]:
    """Run ``attempt(i)`` from n threads released together; each result or ClientError."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = attempt(i)
        except ClientError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a racer hung"
    return results


def _one_winner(results: list[Any]) -> int:
    """Exactly one racer succeeded; every other was refused with 412 (or 409, a lost race)."""
    winners = [i for i, r in enumerate(results) if not isinstance(r, ClientError)]
    assert len(winners) == 1, f"winners: {winners}; results: {results}"
    losers = [r for r in results if isinstance(r, ClientError)]
    assert all(status_of(r) in (409, 412) for r in losers), [r.response for r in losers]
    return winners[0]


@pytest.mark.parametrize("trial", range(3))
def test_racing_creators_have_exactly_one_winner(minio_container, trial):
    s3, bucket, key = minio_container.client, minio_container.bucket, f"race/{uuid.uuid4().hex}"
    results = _race(8, lambda i: s3.put_object(Bucket=bucket, Key=key, Body=f"racer {i}".encode(), IfNoneMatch="*"))
    winner = _one_winner(results)
    assert body_of(s3, bucket, key) == f"racer {winner}".encode()


@pytest.mark.parametrize("trial", range(3))
def test_racing_updaters_of_one_version_have_exactly_one_winner(minio_container, trial):
    s3, bucket, key = minio_container.client, minio_container.bucket, f"race/{uuid.uuid4().hex}"
    base = s3.put_object(Bucket=bucket, Key=key, Body=b"base", IfNoneMatch="*")["ETag"]
    results = _race(8, lambda i: s3.put_object(Bucket=bucket, Key=key, Body=f"update {i}".encode(), IfMatch=base))
    winner = _one_winner(results)
    assert body_of(s3, bucket, key) == f"update {winner}".encode()

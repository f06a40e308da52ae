"""The drivers need only what deploy/ grants: object requests under their prefix, never the bucket's metadata.

deploy/gcs/iam-role.yaml grants object permissions only, and its condition
limits them (listing included, by the list-prefix attribute) to the
driver's prefix; deploy/s3/iam-policy.json does the same with object ARNs
and an ``s3:prefix`` condition.  A client library that also read the bucket
(google-cloud-storage's ``get_bucket``, boto3's ``GetBucketLocation``) or a
listing that asked outside the prefix would fail with 403 under those
grants, while passing every emulator test.  So every request a real
``serve`` process makes over every family is recorded at a proxy and
judged against what the grants allow.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from faults.http_proxy import FaultProxy
from support import Session, StoreUnderTest, fresh_agent, location_of, make_store, serving


@pytest.fixture(params=("moto", "gcs"))
def proxied(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FaultProxy, StoreUnderTest]]:
    base = make_store(request.param, request, tmp_path_factory)
    setting = "AWS_ENDPOINT_URL_S3" if request.param == "moto" else "STORAGE_EMULATOR_HOST"
    with FaultProxy(base.env[setting], flavor="s3" if request.param == "moto" else "gcs") as proxy:
        yield proxy, replace(base, env=proxy.redirect(base.env))


def every_family(s: Session) -> None:
    """One of each op a deployment makes, and the multi-request paths (remove, packing, take)."""
    data = base64.b64encode(b"hello").decode()
    for seq in range(1, 66):  # the 8th, 16th ... 64th pack blocks (packing.py)
        assert s("append", thread="t", event={"seq": seq})["reply"] == "done"
    assert s("read", thread="t", first=1)["reply"] == "events"
    assert s("threads")["reply"] == "threads"
    assert s("take", thread="t", holder="h", lapse_ms=10_000) == {"reply": "took", "took": "took"}
    assert s("leases", lapse_ms=10_000)["reply"] == "leases"
    assert s("remove", thread="t") == {"reply": "done"}
    assert s("job_put", job={"id": "j", "spec": {}, "due": 5}, place="waiting") == {"reply": "done"}
    assert s("job_next")["reply"] == "next"
    assert s("job_shift", id="j", **{"from": "waiting", "to": "firing"}) == {"reply": "found", "found": True}
    assert s("job_count", place="firing") == {"reply": "count", "count": 1}
    assert s("file_write", path="skills/a/SKILL.md", data=data, version=0) == {"reply": "wrote", "version": 1}
    assert s("file_list", folder="skills") == {"reply": "files", "files": ["skills/a/SKILL.md"]}
    assert s("file_remove", path="skills/a/SKILL.md", version=1) == {"reply": "found", "found": True}
    assert s("tools_narrow", thread="t2", tools=["a"]) == {"reply": "tools", "tools": ["a"]}


def test_every_request_is_an_object_request_under_the_prefix(proxied) -> None:
    proxy, store = proxied
    loc = location_of(store)
    with serving(store) as (proc,):
        proxy.clear()
        every_family(Session(proc, fresh_agent()))
    seen = proxy.requests()
    assert len(seen) > 50, "the workload reached the proxy"
    bucket, prefix = loc.bucket, loc.prefix
    assert prefix, "the stores under test keep a prefix, so the check means something"
    for r in seen:
        parts = urlsplit(r.target)
        path, query = unquote(parts.path), parse_qs(parts.query)
        if store.backend == "gcs":
            # Objects: /storage/v1/b/B/o/NAME, /download/storage/v1/b/B/o/NAME, uploads to
            # /upload/storage/v1/b/B/o (the name in the body); listings: /storage/v1/b/B/o?prefix=...
            m = re.match(rf"^(/download|/upload)?/storage/v1/b/{re.escape(bucket)}/o(/(?P<name>.*))?$", path)
            assert m, f"{r.method} {r.target}: not an object request (bucket metadata needs storage.buckets.get)"
            name = m.group("name")
            if name is not None:
                assert name.startswith(prefix), f"{r.method} {r.target}: an object outside the prefix"
            elif r.method == "GET":
                assert query.get("prefix", [""])[0].startswith(prefix), f"{r.target}: a listing outside the prefix"
        else:
            m = re.match(rf"^/{re.escape(bucket)}(/(?P<key>.*))?$", path)
            assert m, f"{r.method} {r.target}: not this bucket"
            key = m.group("key")
            if key:
                assert key.startswith(prefix), f"{r.method} {r.target}: an object outside the prefix"
            else:
                assert r.method == "GET" and "list-type" in query, f"{r.method} {r.target}: a bucket request"
                assert query.get("prefix", [""])[0].startswith(prefix), f"{r.target}: a listing outside the prefix"


def test_job_next_over_many_agents_is_two_requests(proxied) -> None:
    """One listing of the due index (16 keys) and one read to confirm, however many agents wait.

    boto3's paginator once asked for the next page of a listing already cut
    at its limit: every ``job_next`` on S3 paid a third request, in series.
    """
    proxy, store = proxied
    with serving(store) as (proc,):
        for i in range(20):
            s = Session(proc, fresh_agent())
            assert s("job_put", job={"id": f"j{i}", "spec": {}, "due": 1000 + i}, place="waiting") == {"reply": "done"}
        proxy.clear()
        assert Session(proc, fresh_agent())("job_next") == {"reply": "next", "next": 1000}
    assert len(proxy.requests()) == 2, [(r.method, r.target) for r in proxy.requests()]

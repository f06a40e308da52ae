"""Issue 41, finding 6: a server that ignores preconditions is refused, never trusted.

Every race the drivers settle (two appenders of one seq, takers of one
lease, writers of one file version) is settled by the server refusing a
conditional write.  A server that accepts them anyway makes every answer
silently wrong, so a driver checks its server before its first write and,
on one that ignores them, answers every write an error naming it
("... ignores preconditions ..."), writing nothing of any agent.

The servers that ignore them, each first shown to (so that a release that
fixes one fails here loudly instead of proving nothing):

* gcp-storage-emulator (PyPI), which ignores ``ifGenerationMatch``, under ``lnk-gcs``;
* moto and SeaweedFS behind the fault proxy's ``strip_all`` (every
  ``If-None-Match`` / ``If-Match`` taken off, SeaweedFS's requests signed
  again), under ``lnk-bucket-store``; and fake-gcs-server behind it
  (``ifGenerationMatch`` taken off) under ``lnk-gcs``.

On each: every write op answers an error naming the server's failure; the
races ``lnk-store-check --quick`` runs (2 appenders of one seq, 4 takers of a
free lease, 8 writers of a file at version 0, real processes released
together) never have two winners; and every write that reached the server
was the probe's (``_probe`` at the store's root), none an agent's.  The
honest servers (moto, fake-gcs-server, SeaweedFS, no proxy stripping) pass
the probe: the same ops answer their successes, the probe was sent, and a
race has exactly one winner.

Requests are counted at a fault proxy (``tests/faults/http_proxy.py``) in
front of every server; nothing is timed.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from emulators import Emulator, new_gcs_bucket, start_gcp_storage_emulator
from faults.http_proxy import FaultProxy, _gcs_written_name, _Request, resign_sigv4, strip_preconditions
from support import SEAWEEDFS, make_store, race, serving

pytestmark = pytest.mark.timeout(600)

Json = Any
IGNORES = "ignores preconditions"
#: Where the driver's server check writes (the lead's ``server_check``: ``_probe`` at the store's root).
PROBE = "_probe"


@dataclass(frozen=True)
class Target:
    """A driver program, the environment that reaches its store, and how its requests look at the proxy."""

    program: str
    env: dict[str, str]
    flavor: str  # "s3" or "gcs"


# -- the servers


@pytest.fixture(scope="module")
def gse_server() -> Iterator[Emulator]:
    """gcp-storage-emulator, once for this module (nothing else runs on it)."""
    em = start_gcp_storage_emulator()
    yield em
    em.stop()


def gcs_client(host: str) -> Any:
    """The raw google-cloud-storage SDK on an emulator (anonymous)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": host})


def s3_client(endpoint: str, env: dict[str, str]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], config=Config(retries={"total_max_attempts": 1}))


def gcs_ignores_preconditions(host: str, bucket: str) -> tuple[bool, bool]:
    """(a second create at generation 0 accepted, a write at a wrong generation accepted), by the raw SDK."""
    from google.api_core import exceptions

    blob_name = f"fact-{uuid.uuid4().hex[:8]}"
    b = gcs_client(host).bucket(bucket)
    b.blob(blob_name).upload_from_string(b"one", if_generation_match=0)
    accepted = []
    for generation in (0, 123456789):
        try:
            b.blob(blob_name).upload_from_string(b"again", if_generation_match=generation)
            accepted.append(True)
        except exceptions.PreconditionFailed:
            accepted.append(False)
    return accepted[0], accepted[1]


def s3_ignores_preconditions(endpoint: str, env: dict[str, str], bucket: str) -> tuple[bool, bool]:
    """(a second create with If-None-Match: * accepted, a write with another ETag's If-Match accepted)."""
    from botocore import exceptions as bexc

    client, key = s3_client(endpoint, env), f"fact-{uuid.uuid4().hex[:8]}"
    client.put_object(Bucket=bucket, Key=key, Body=b"one", IfNoneMatch="*")
    accepted = []
    for args in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"again", **args)
            accepted.append(True)
        except bexc.ClientError as exc:
            assert exc.response["Error"]["Code"] == "PreconditionFailed", exc.response
            accepted.append(False)
    return accepted[0], accepted[1]


@contextmanager
def ignoring(server: str, request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Target, FaultProxy]]:
    """A store whose server ignores preconditions, behind a proxy that counts (and, but for
    gcp-storage-emulator, strips) every request; the server shown to ignore them first."""
    if server == "gse":
        em = request.getfixturevalue("gse_server")
        bucket = f"cs-{uuid.uuid4().hex[:12]}"
        new_gcs_bucket(em, bucket)
        host = em.env["STORAGE_EMULATOR_HOST"]
        assert gcs_ignores_preconditions(host, bucket) == (True, True), (
            "gcp-storage-emulator honours ifGenerationMatch now: these tests prove nothing on it; "
            "put lnk-gcs behind the stripping proxy instead")
        with FaultProxy(host, flavor="gcs") as proxy:
            yield Target("lnk-gcs", {**proxy.redirect(em.env), "LNK_GCS_URL": f"gs://{bucket}/s"}, "gcs"), proxy
        return
    store = make_store(server, request, tmp_path_factory)
    setting = "STORAGE_EMULATOR_HOST" if server == "gcs" else "AWS_ENDPOINT_URL_S3"
    flavor = "gcs" if server == "gcs" else "s3"
    credentials = {store.env["AWS_ACCESS_KEY_ID"]: store.env["AWS_SECRET_ACCESS_KEY"]} if flavor == "s3" else {}
    with FaultProxy(store.env[setting], flavor=flavor, strip_all=True, credentials=credentials) as proxy:
        bucket = urlsplit(store.url).netloc
        if flavor == "gcs":
            facts = gcs_ignores_preconditions(proxy.url, bucket)
        else:
            facts = s3_ignores_preconditions(proxy.url, store.env, bucket)
        assert facts == (True, True), f"the stripping proxy left {server} honouring a precondition: {facts}"
        proxy.clear()
        yield Target(store.program, proxy.redirect(store.env), flavor), proxy


def written(proxy: FaultProxy, flavor: str) -> list[str]:
    """The object names every write request that reached the proxy named (key, or GCS object name)."""
    names = []
    for seen in proxy.requests():
        if seen.method not in ("PUT", "POST", "PATCH", "DELETE"):
            continue
        parts = urlsplit(seen.target)
        if flavor == "gcs":
            name = _gcs_written_name(seen.method, parts.path, parts.query, seen.content)
        else:
            name = unquote(parts.path.lstrip("/").split("/", 1)[-1])
        names.append(str(name))
    return names


# -- what is asked


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_ops() -> list[tuple[str, dict[str, Json], Callable[[Json], bool]]]:
    """Every write op of the wire, in an order that succeeds op by op on an honest server, with its success."""
    t = f"t-{uuid.uuid4().hex[:8]}"
    job = {"id": "j1", "spec": {"x": 1}, "due": 1}
    done = {"reply": "done"}
    found = {"reply": "found", "found": True}
    return [
        ("append", {"thread": t, "event": {"seq": 1, "x": 1}}, lambda r: r == done),
        ("take", {"thread": t, "holder": "h", "lapse_ms": 600_000}, lambda r: r == {"reply": "took", "took": "took"}),
        ("renew", {"thread": t, "holder": "h"}, lambda r: r == done),
        ("end", {"thread": t, "holder": "h"}, lambda r: r == done),
        ("tools_narrow", {"thread": t, "tools": ["a", "b"]}, lambda r: r.get("reply") == "tools"),
        ("remove", {"thread": t}, lambda r: r == done),
        ("job_put", {"place": "waiting", "job": job}, lambda r: r == done),
        ("job_shift", {"id": "j1", "from": "waiting", "to": "firing"}, lambda r: r == found),
        ("job_remove", {"place": "firing", "id": "j1"}, lambda r: r == found),
        ("file_write", {"path": "skills/a.md", "data": b64(b"A"), "version": 0},
         lambda r: r == {"reply": "wrote", "version": 1}),
        ("file_remove", {"path": "skills/a.md", "version": 1}, lambda r: r == found),
    ]


def refused(reply: Json) -> bool:
    return reply.get("reply") == "error" and IGNORES in str(reply.get("error"))


def races(target: Target) -> list[tuple[str, list[Json], Callable[[Json], bool]]]:
    """The races of ``lnk-store-check --quick`` (check.race_append, race_take, race_write_same_version),
    each among fresh processes released together: (name, replies, what counts as a win)."""
    out = []
    agent = {"id": f"agent-{uuid.uuid4().hex[:10]}", "owner": "o"}
    for name, count, make, wins in (
        ("append seq 1", 2,
         lambda i, t: {"op": "append", "thread": t, "event": {"seq": 1, "by": i}},
         lambda r: r == {"reply": "done"}),
        ("take a free lease", 4,
         lambda i, t: {"op": "take", "thread": t, "holder": f"h{i}", "lapse_ms": 600_000},
         lambda r: r == {"reply": "took", "took": "took"}),
        ("file_write at version 0", 8,
         lambda i, t: {"op": "file_write", "path": f"skills/{t}.md", "data": b64(f"w{i}".encode()), "version": 0},
         lambda r: r.get("reply") == "wrote"),
    ):
        thread = f"r-{uuid.uuid4().hex[:8]}"
        with serving(target, count) as procs:
            replies = race(procs, lambda i, make=make, thread=thread: {**make(i, thread), "agent": agent})
        out.append((name, replies, wins))
    return out


# -- servers that ignore preconditions

IGNORING = ["gse", "moto", SEAWEEDFS, "gcs"]


@pytest.mark.slow
@pytest.mark.parametrize("server", IGNORING)
def test_every_write_is_refused_naming_the_server(server: str, request: pytest.FixtureRequest,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    with ignoring(server, request, tmp_path_factory) as (target, proxy), serving(target) as (proc,):
        agent = {"id": f"agent-{uuid.uuid4().hex[:10]}", "owner": "o"}
        replies = {op: proc.request({"op": op, "agent": agent, **fields}, timeout=60)
                   for op, fields, _ in write_ops()}
        wrong = {op: r for op, r in replies.items() if not refused(r)}
        assert not wrong, f"writes not refused on a server that ignores preconditions: {wrong}"
        assert all(r["error"].endswith("nothing was changed") for r in replies.values()), replies
        names = written(proxy, target.flavor)
        assert names and all(PROBE in n for n in names), f"writes that were not the probe's: {names}"
        if server != "gse":  # the proxy took the preconditions off (gcp-storage-emulator ignores them itself)
            assert any(s.stripped for s in proxy.requests()), "no request carried a precondition to take off"


@pytest.mark.slow
@pytest.mark.parametrize("server", IGNORING)
def test_racers_never_both_win(server: str, request: pytest.FixtureRequest,
                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """On c81d270 (no probe) gcp-storage-emulator told both appenders `done`, all 4 takers `took`, all 8
    writers `wrote 1`."""
    with ignoring(server, request, tmp_path_factory) as (target, proxy):
        raced = races(target)
        winners = {name: sum(map(wins, replies)) for name, replies, wins in raced}
        assert all(n <= 1 for n in winners.values()), f"winners on a server that ignores preconditions: {winners}"
        for name, replies, _ in raced:
            assert all(map(refused, replies)), f"{name}: {replies}"
        names = written(proxy, target.flavor)
        assert all(PROBE in n for n in names), f"writes that were not the probe's: {names}"


# -- honest servers

HONEST = ["moto", "gcs", SEAWEEDFS]


@pytest.mark.slow
@pytest.mark.parametrize("server", HONEST)
def test_an_honest_server_passes_the_probe(server: str, request: pytest.FixtureRequest,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same ops answer their successes; the probe was sent (its writes refused, as they must be, or the
    first create of its key); a race of two appenders has exactly one winner."""
    store = make_store(server, request, tmp_path_factory)
    setting = "STORAGE_EMULATOR_HOST" if server == "gcs" else "AWS_ENDPOINT_URL_S3"
    flavor = "gcs" if server == "gcs" else "s3"
    with FaultProxy(store.env[setting], flavor=flavor) as proxy:
        target = Target(store.program, proxy.redirect(store.env), flavor)
        with serving(target) as (proc,):
            agent = {"id": f"agent-{uuid.uuid4().hex[:10]}", "owner": "o"}
            for op, fields, success in write_ops():
                reply = proc.request({"op": op, "agent": agent, **fields}, timeout=60)
                assert success(reply), (op, reply)
        probes = [s for s in proxy.requests() if PROBE in s.target or PROBE.encode() in s.content]
        assert probes, "the driver never probed its server"
        assert any(s.status == 412 for s in probes), [(s.method, s.target, s.status) for s in probes]
        assert not any(s.stripped for s in proxy.requests())
        (name, replies, wins), *_ = races(target)
        assert sum(map(wins, replies)) == 1, (name, replies)


# -- the stripping proxy itself (no emulator)


def test_strip_takes_off_every_precondition_and_nothing_else() -> None:
    s3 = _Request("PUT", "/b/k?x-id=PutObject", "HTTP/1.1",
                  [("Host", "h"), ("If-None-Match", "*"), ("Content-Type", "a"), ("if-match", '"e"')], b"body")
    assert strip_preconditions(s3) == ("If-None-Match", "if-match")
    assert s3.headers == [("Host", "h"), ("Content-Type", "a")] and s3.target == "/b/k?x-id=PutObject"
    gcs = _Request("POST", "/upload/storage/v1/b/b/o?uploadType=multipart&ifGenerationMatch=0&name=a%2Fb"
                           "&ifMetagenerationMatch=3&ifGenerationNotMatch=2", "HTTP/1.1", [], b"")
    assert strip_preconditions(gcs) == ("ifGenerationMatch", "ifMetagenerationMatch", "ifGenerationNotMatch")
    assert gcs.target == "/upload/storage/v1/b/b/o?uploadType=multipart&name=a%2Fb"
    assert gcs.as_sent.endswith("&ifGenerationNotMatch=2")  # what the proxy records: the target as sent
    assert strip_preconditions(gcs) == () and len(gcs.stripped) == 3  # once is all it takes
    plain = _Request("GET", "/b/k", "HTTP/1.1", [("Host", "h")], b"")
    assert strip_preconditions(plain) == () and plain.target == "/b/k" and not plain.as_sent


def test_resign_matches_botocore_signing_without_the_header() -> None:
    """A request signed with If-None-Match, stripped and signed again, carries exactly the signature botocore
    gives the same request without it (what a server that checks signatures recomputes)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    creds = Credentials("AKIDTEST", "secret/key+1")
    url = "http://127.0.0.1:9/bucket/a%20b/k?x-id=PutObject&b=2"

    def signed(headers: dict[str, str]) -> dict[str, str]:
        req = AWSRequest("PUT", url, headers={"Host": "127.0.0.1:9", "X-Amz-Content-SHA256": "abc", **headers},
                         data=b"body")
        req.context["timestamp"] = "20261204T210000Z"
        auth = S3SigV4Auth(creds, "s3", "us-east-1")
        r = req
        r.headers["X-Amz-Date"] = "20261204T210000Z"
        canonical = auth.canonical_request(r)
        signature = auth.signature(auth.string_to_sign(r, canonical), r)
        names = auth.signed_headers(auth.headers_to_sign(r))
        r.headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential=AKIDTEST/20261204/us-east-1/s3/aws4_request, "
                                      f"SignedHeaders={names}, Signature={signature}")
        return dict(r.headers.items())

    with_it = signed({"If-None-Match": "*"})
    request = _Request("PUT", "/bucket/a%20b/k?x-id=PutObject&b=2", "HTTP/1.1", list(with_it.items()), b"body")
    assert "if-none-match" in request.header("authorization")  # type: ignore[operator]
    assert strip_preconditions(request, {"AKIDTEST": "secret/key+1"}) == ("If-None-Match",)
    assert request.header("authorization") == signed({})["Authorization"]
    unknown = _Request("PUT", "/b/k", "HTTP/1.1", list(with_it.items()), b"")
    assert not resign_sigv4(unknown, {"OTHER": "x"})


def test_strip_on_the_kth_request_only(moto_server: Emulator) -> None:
    """The seeded form, for schedules: the core's ``Rule("strip", nth=k)`` and the suite's
    ``Fault("strip", "write", k)`` take the preconditions off that one request; the others keep theirs."""
    from botocore import exceptions as bexc

    from cloudstore.conformance.fault_proxy import Rule
    from cloudstore.conformance.faults import Fault, SuiteProxy

    def creates(proxy: FaultProxy) -> list[bool]:
        client, key = s3_client(proxy.url, moto_server.env), f"kth-{uuid.uuid4().hex[:8]}"
        accepted = []
        for _ in range(4):
            try:
                client.put_object(Bucket=moto_server.bucket, Key=key, Body=b"x", IfNoneMatch="*")
                accepted.append(True)
            except bexc.ClientError:
                accepted.append(False)
        return accepted

    with FaultProxy(moto_server.env["AWS_ENDPOINT_URL_S3"], flavor="s3") as proxy:
        proxy.add(Rule("strip", method="PUT", nth=3))
        assert creates(proxy) == [True, False, True, False]
        assert [s.stripped for s in proxy.requests()] == [(), (), ("If-None-Match",), ()]
    suite = SuiteProxy(moto_server.env["AWS_ENDPOINT_URL_S3"], "s3").start()
    try:
        suite.set(Fault("strip", "write", 2))
        assert creates(suite) == [True, True, False, False]
        assert [s.stripped for s in suite.requests()] == [(), ("If-None-Match",), (), ()]
    finally:
        suite.stop()

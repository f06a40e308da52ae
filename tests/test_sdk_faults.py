"""Issue 10 through the real SDKs: a fault proxy between boto3 / google-cloud-storage and the emulators.

``tests/faults/http_proxy.py`` sits in front of moto's S3 server and
fake-gcs-server and, by rule, loses a reply after the store applied the
request, answers 503 / 429 itself, resets the connection before forwarding,
or cuts a reply body short.  Each test runs on both, through
``cloudstore.settings.open_backend`` (the drivers' own clients and their
configuration) and ``RetryingStore``, or through a real ``serve`` process.

What is checked is the contract: a write whose reply was lost is the
writer's own success (never ``taken`` / ``stale`` / "already exists"), a
transient failure is retried by the seam and succeeds, and the SDKs
themselves send every request exactly once (counted at the proxy), so that
every retry is the seam's, which knows its own writes.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import pytest
from faults.http_proxy import FaultProxy, Rule, Stall
from support import S3_SERVERS, SEAWEEDFS, Session, StoreUnderTest, fresh_agent, location_of, make_store, serving

from cloudstore.generations import (
    Create,
    RetryingStore,
    RetryPolicy,
    StoreUnavailable,
    Transient,
    Update,
)
from cloudstore.settings import open_backend
from cloudstore.store.keys import EPOCH_DIGITS, SEQ_DIGITS, inverted, path_part

BODY = bytes(range(256)) * 64  # 16 KiB: a cut reply is a real cut

#: The tests run on SeaweedFS too (conftest): a real server meeting a write of its own whose reply
#: was lost, and its ranged reads.  The others check the SDK's, the seam's and the proxy's own
#: behaviour, the same whatever S3 server answers, shown on moto.
SEAWEEDFS_TESTS = frozenset({
    "test_conditional_write_whose_reply_was_lost_is_our_success",
    "test_get_head_fetches_only_the_first_bytes_with_the_whole_objects_version",
    "test_a_head_read_cut_short_is_transient",
    "test_driver_append_whose_reply_was_lost_is_done_once",
    "test_driver_file_write_whose_reply_was_lost_is_wrote",
    "test_driver_file_append_whose_reply_was_lost_is_stored_once",
})


@dataclass
class Proxied:
    """One backend behind a fresh proxy, and a fresh store location reached through it."""

    backend: str  # "moto", "seaweedfs" or "gcs"
    proxy: FaultProxy
    store: StoreUnderTest  # its env points the SDK at the proxy

    def writes_of(self, key_end: str) -> dict[str, Any]:
        """Rule matcher for uploads of the object whose key ends with ``key_end``.

        S3: ``PUT /bucket/KEY``.  GCS: ``POST /upload/...?uploadType=multipart``,
        the object's name in the JSON metadata part of the body.
        """
        if self.backend in S3_SERVERS:
            return {"method": "PUT", "path": re.escape(quote(key_end, safe="/~")) + r"(\?|$)"}
        return {"method": "POST", "path": r"^/upload/", "content": re.escape(key_end.encode()) + b'"'}

    def reads_of(self, key_end: str) -> dict[str, Any]:
        """Rule matcher for GETs of the object's bytes (GCS: ``/download/.../o/NAME?alt=media``)."""
        if self.backend in S3_SERVERS:
            return {"method": "GET", "path": re.escape(quote(key_end, safe="/~")) + r"(\?|$)"}
        return {"method": "GET", "path": r"^/download/.*" + re.escape(quote(key_end, safe="")) + r"\?"}


@pytest.fixture(params=("moto", "gcs", SEAWEEDFS))
def proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    base = make_store(request.param, request, tmp_path_factory)
    setting = "AWS_ENDPOINT_URL_S3" if request.param in S3_SERVERS else "STORAGE_EMULATOR_HOST"
    flavor = "s3" if request.param in S3_SERVERS else "gcs"
    with FaultProxy(base.env[setting], flavor=flavor) as proxy:
        yield Proxied(request.param, proxy, replace(base, env=proxy.redirect(base.env)))


@pytest.fixture
def seam_on(proxied: Proxied, monkeypatch: pytest.MonkeyPatch):
    """Make a RetryingStore on the real SDK client, through the proxy: (store, key prefix)."""
    for key, value in proxied.store.env.items():
        monkeypatch.setenv(key, value)
    loc = location_of(proxied.store)

    def make(policy: RetryPolicy = RetryPolicy()) -> tuple[RetryingStore, str]:
        return RetryingStore(open_backend(loc), policy), loc.prefix

    return make


# --------------------------------------------------------------------------
# Lost replies of conditional writes


@pytest.mark.parametrize("mode", ["create", "update"])
def test_conditional_write_whose_reply_was_lost_is_our_success(proxied: Proxied, seam_on, mode: str) -> None:
    s, root = seam_on()
    key = root + "lost"
    put_mode: Any = Create()
    if mode == "update":
        put_mode = Update(s.put(key, b"before", Create()).version or "")
        proxied.proxy.clear()
    lose = proxied.proxy.add(Rule("lose_reply", **proxied.writes_of(key)))

    written = s.put(key, BODY, put_mode)

    assert lose.fired == 1
    assert proxied.proxy.count(**proxied.writes_of(key)) == 2, (
        "one upload lost by the proxy after the store applied it, one the seam's retry, none the SDK's own: "
        f"{proxied.proxy.requests()}")
    now = s.get(key)
    assert now is not None and now.data == BODY
    assert written.version == now.version


# --------------------------------------------------------------------------
# Transient failures: the SDK sends each request once, the seam retries it

FAULTS = {  # the request hit (a conditional create, or a GET of the object), and the rule
    "lost reply to a create": ("write", {"action": "lose_reply"}),
    "503 on create": ("write", {"action": "fail", "status": 503}),
    "429 on create": ("write", {"action": "fail", "status": 429}),
    "reset on create": ("write", {"action": "reset"}),
    "503 on read": ("read", {"action": "fail", "status": 503}),
    "500 on read": ("read", {"action": "fail", "status": 500}),
    "429 on read": ("read", {"action": "fail", "status": 429}),
    "reset on read": ("read", {"action": "reset"}),
    "body cut short": ("read", {"action": "truncate"}),
}


def inject(proxied: Proxied, s: RetryingStore, key: str, fault: str) -> tuple[str, Rule, dict[str, Any]]:
    """Arm ``fault`` on the next write (or, after writing the object, the next read) of ``key``."""
    op, action = FAULTS[fault]
    if op == "read":
        RetryingStore(s.backend).put(key, BODY, Create())
    match = proxied.writes_of(key) if op == "write" else proxied.reads_of(key)
    return op, proxied.proxy.add(Rule(**action, **match)), match


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_sdk_sends_each_request_once_and_the_failure_is_transient(proxied: Proxied, seam_on, fault: str) -> None:
    """With one try allowed, the seam gives up with StoreUnavailable after exactly one request.

    A second request at the proxy would be the SDK's own retry (botocore with
    ``max_attempts: 1`` re-sends once); any other error than StoreUnavailable
    means the backend did not classify the failure as ``Transient``.  A 429
    is a throttle: retried until the deadline, not by attempts (so the
    deadline is 0 here), and a write it refused certainly did not land.
    """
    s, root = seam_on(RetryPolicy(attempts=1, deadline=0.0))
    op, _, match = inject(proxied, s, root + "once", fault)

    with pytest.raises(StoreUnavailable) as info:
        s.put(root + "once", BODY, Create()) if op == "write" else s.get(root + "once")

    assert info.value.outcome_unknown == (op == "write" and "429" not in fault)
    assert proxied.proxy.count(**match) == 1, proxied.proxy.requests()


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_transient_failure_is_retried_by_the_seam(proxied: Proxied, seam_on, fault: str) -> None:
    s, root = seam_on()
    key = root + "retried"
    op, injected, match = inject(proxied, s, key, fault)
    before = s.requests

    written = s.put(key, BODY, Create()) if op == "write" else None
    got = s.get(key)

    assert injected.fired == 1
    assert proxied.proxy.count(**match) == 2, proxied.proxy.requests()
    assert s.requests - before >= 2, "the retry was the seam's, not the SDK's"
    assert got is not None and got.data == BODY
    assert written is None or got.version == written.version


# --------------------------------------------------------------------------
# get(key, head): the first bytes, the whole object's version


@pytest.fixture
def bare(seam_on) -> tuple[Any, str]:
    """The backend itself (no seam, no retries) through the proxy, and the key prefix."""
    s, root = seam_on()
    return s.backend, root


def test_get_head_fetches_only_the_first_bytes_with_the_whole_objects_version(proxied: Proxied, bare) -> None:
    backend, root = bare
    long_v = backend.put(root + "long", BODY, Create())
    short_v = backend.put(root + "short", b"abc", Create())
    empty_v = backend.put(root + "empty", b"", Create())

    assert backend.get(root + "long", head=10) == (BODY[:10], long_v)
    assert backend.get(root + "long") == (BODY, long_v)
    assert backend.get(root + "short", head=10) == (b"abc", short_v)
    assert backend.get(root + "short", head=3) == (b"abc", short_v)
    assert backend.get(root + "empty", head=10) == (b"", empty_v)
    assert backend.get(root + "absent", head=10) is None
    with pytest.raises(ValueError):
        backend.get(root + "long", head=0)
    assert [r.sent for r in proxied.proxy.requests(**proxied.reads_of(root + "long"))] == [10, len(BODY)], (
        "a head read fetches the head only")


def test_a_head_read_cut_short_is_transient(proxied: Proxied, bare) -> None:
    backend, root = bare
    version = backend.put(root + "k", BODY, Create())
    proxied.proxy.add(Rule("truncate", keep=100, **proxied.reads_of(root + "k")))
    with pytest.raises(Transient):
        backend.get(root + "k", head=1000)
    assert backend.get(root + "k", head=1000) == (BODY[:1000], version)
    assert proxied.proxy.count(**proxied.reads_of(root + "k")) == 2


# --------------------------------------------------------------------------
# The proxy itself: keep-alive, delays, latency


def test_the_proxy_keeps_client_connections_alive_and_holds_requests(proxied: Proxied, seam_on) -> None:
    s, root = seam_on()
    for i in range(6):
        s.put(f"{root}k{i}", b"x", Create())
        s.get(f"{root}k{i}")
    assert proxied.proxy.connections < 12, "the SDK's pooled connections are reused through the proxy"
    proxied.proxy.latency = 0.02
    proxied.proxy.add(Rule("delay", before=0.1, after=0.1, **proxied.reads_of(root + "k0")))
    started = time.monotonic()
    assert s.get(root + "k0").data == b"x"
    assert time.monotonic() - started >= 0.22
    assert [r.action for r in proxied.proxy.requests(**proxied.reads_of(root + "k0"))] == [None, "delay"]


# --------------------------------------------------------------------------
# The drivers: a serve process behind the proxy, its first conditional write's reply lost

THREAD = "t-sdk-faults"
PATH = "skills/sdk-faults/SKILL.md"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture
def driver(proxied: Proxied) -> Iterator[Session]:
    with serving(proxied.store) as procs:
        yield Session(procs[0], fresh_agent())


def test_driver_append_whose_reply_was_lost_is_done_once(proxied: Proxied, driver: Session) -> None:
    assert driver("append", thread=THREAD, event={"seq": 1, "n": 2**60 + 1}) == {"reply": "done"}
    # The event's object is where the drivers keep it today: .../d<~epoch>/<~seq> (keys.py).
    lose = proxied.proxy.add(Rule("lose_reply", **proxied.writes_of(
        "/d" + inverted(0, EPOCH_DIGITS) + "/" + inverted(2, SEQ_DIGITS))))

    reply = driver("append", thread=THREAD, event={"seq": 2, "n": 2**60 + 2})

    assert reply == {"reply": "done"}, f"the append's own write landed; it must not be told {reply}"
    assert lose.fired == 1
    assert driver("read", thread=THREAD) == {
        "reply": "events", "events": [{"seq": 1, "n": 2**60 + 1}, {"seq": 2, "n": 2**60 + 2}]}
    assert driver("last", thread=THREAD) == {"reply": "last", "last": 2}


def test_driver_file_write_whose_reply_was_lost_is_wrote(proxied: Proxied, driver: Session) -> None:
    assert driver("file_write", path=PATH, data=b64(b"one"), version=0) == {"reply": "wrote", "version": 1}
    lose = proxied.proxy.add(Rule("lose_reply", **proxied.writes_of("f/" + path_part(PATH))))

    reply = driver("file_write", path=PATH, data=b64(b"two"), version=1)

    assert reply == {"reply": "wrote", "version": 2}, f"the write landed; never stale about it: {reply}"
    assert lose.fired == 1
    assert driver("file_read", path=PATH) == {"reply": "file", "file": {"data": b64(b"two"), "version": 2}}


def test_driver_file_append_whose_reply_was_lost_is_stored_once(proxied: Proxied, driver: Session) -> None:
    assert driver("file_append", path=PATH, data=b64(b"first;")) == {"reply": "wrote", "version": 1}
    lose = proxied.proxy.add(Rule("lose_reply", **proxied.writes_of("f/" + path_part(PATH))))

    reply = driver("file_append", path=PATH, data=b64(b"second;"))

    assert reply == {"reply": "wrote", "version": 2}, reply
    assert lose.fired == 1
    got = driver("file_read", path=PATH)
    assert got == {"reply": "file", "file": {"data": b64(b"first;second;"), "version": 2}}, (
        f"the chunk is kept once: {base64.b64decode(got['file']['data']) if got.get('file') else got}")


def test_rules_fire_by_nth_match_and_times(proxied: Proxied, seam_on) -> None:
    """The proxy's matching, on one backend's real traffic: the 2nd and 3rd reads fail, no other."""
    s, root = seam_on(RetryPolicy(attempts=1))
    s.put(root + "n", b"x", Create())
    rule = proxied.proxy.add(Rule("fail", status=503, nth=2, times=2, **proxied.reads_of(root + "n")))
    outcomes = []
    for _ in range(4):
        try:
            outcomes.append(s.get(root + "n").data)
        except StoreUnavailable:
            outcomes.append(None)
    assert outcomes == [b"x", None, None, b"x"]
    assert (rule.matched, rule.fired) == (4, 2)
    assert [r.status for r in proxied.proxy.requests(**proxied.reads_of(root + "n"))] == [200, 503, 503, 200]


# --------------------------------------------------------------------------
# The floor: what the SDKs' own retry rules retry is Transient here


def test_gcs_retries_at_least_what_python_storage_retries() -> None:
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc
    from google.cloud.storage import retry

    from cloudstore.gcs import _TRANSIENT_CODES, _classify, _transport_errors

    assert set(retry._RETRYABLE_STATUS_CODES) <= _TRANSIENT_CODES
    for kind in retry._RETRYABLE_TYPES:
        if issubclass(kind, gexc.GoogleAPICallError):
            assert kind.code in _TRANSIENT_CODES, kind
        else:
            assert issubclass(kind, _transport_errors()), kind
    for exc in (requests.exceptions.ChunkedEncodingError("cut"), aexc.TransportError(ConnectionError("down")),
                aexc.TransportError("token endpoint unreachable"), gexc.ServiceUnavailable("503"),
                gexc.TooManyRequests("429")):
        assert isinstance(_classify(exc), Transient), exc
    assert not isinstance(_classify(gexc.Forbidden("403")), Transient)


def test_s3_retries_at_least_what_botocores_standard_mode_retries() -> None:
    import urllib3.exceptions
    from botocore import exceptions as bexc
    from botocore.retries.standard import ThrottledRetryableChecker, TransientRetryableChecker

    from cloudstore.s3 import _TRANSIENT_CODES, _classify, _transport_errors

    codes = set(TransientRetryableChecker._TRANSIENT_ERROR_CODES) | set(
        ThrottledRetryableChecker._THROTTLED_ERROR_CODES
    )
    assert codes <= _TRANSIENT_CODES
    for kind in TransientRetryableChecker._TRANSIENT_EXCEPTION_CLS:
        assert issubclass(kind, _transport_errors()), kind
    for status in TransientRetryableChecker._TRANSIENT_STATUS_CODES:
        error = bexc.ClientError({"Error": {"Code": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")
        assert isinstance(_classify(error), Transient), status
    for exc in (bexc.IncompleteReadError(actual_bytes=1, expected_bytes=2),
                bexc.ResponseStreamingError(error=urllib3.exceptions.ProtocolError("cut")),
                urllib3.exceptions.ProtocolError("cut")):
        assert isinstance(_classify(exc), Transient), exc
    denied = bexc.ClientError(
        {"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject"
    )
    assert not isinstance(_classify(denied), Transient)


# --------------------------------------------------------------------------
# The proxy's HTTP on its own: chunked bodies, 100-continue, HEAD, rewritten links; stalls


class Echo(http.server.BaseHTTPRequestHandler):
    """An upstream that answers 201 at once with what it got, its own address in a header and a JSON body."""

    protocol_version = "HTTP/1.1"

    def _answer(self, body: bytes) -> None:
        me = f"http://127.0.0.1:{self.server.server_address[1]}"
        doc = f'{{"method": "{self.command}", "got": {len(body)}, "selfLink": "{me}/o"}}'.encode()
        self.send_response(201)
        self.send_header("Location", me + "/next")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(doc)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(doc)

    def do_PUT(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

    do_HEAD = do_GET = lambda self: self._answer(b"")  # noqa: E731

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def echo_upstream() -> Iterator[str]:
    """An ``Echo`` server on a free loopback port, for the proxy's own tests: its URL."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{upstream.server_address[1]}"
    finally:
        upstream.shutdown()
        upstream.server_close()


def test_the_proxy_forwards_chunked_bodies_head_and_rewrites_the_upstreams_links() -> None:
    with echo_upstream() as url, FaultProxy(url) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.putrequest("PUT", "/o?x=1")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.putheader("Expect", "100-continue")
        conn.endheaders()
        conn.send(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        put = conn.getresponse()
        assert (put.status, put.read()) == (
            201,
            f'{{"method": "PUT", "got": 11, "selfLink": "{proxy.url}/o"}}'.encode(),
        )
        assert put.getheader("Location") == proxy.url + "/next"
        conn.request("HEAD", "/o")  # the same connection: kept alive
        head = conn.getresponse()
        assert head.status == 201 and head.read() == b"" and int(head.getheader("Content-Length")) > 0
        conn.request("GET", "/o")
        assert conn.getresponse().read().startswith(b'{"method": "GET"')
        conn.close()
        assert proxy.connections == 1
        assert [(r.method, r.target, r.status) for r in proxy.requests()] == [
            ("PUT", "/o?x=1", 201), ("HEAD", "/o", 201), ("GET", "/o", 201)]


def test_a_stall_answers_nothing_in_its_window_then_everything() -> None:
    """A request held (by a delay) when the window opens, and one arriving in it, are both answered only once
    it ends; one arriving after is answered at once; a request the stall does not match is not held."""
    got: dict[str, float] = {}

    def get(target: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.request("GET", target)
        assert conn.getresponse().status == 201
        got[target] = time.monotonic()
        conn.close()

    with echo_upstream() as url, FaultProxy(url) as proxy:
        proxy.add(Rule("delay", "GET", r"^/held$", after=0.4))
        began = time.monotonic()
        stall = proxy.stall(Stall(seconds=2.0, at=0.2, path=r"^/(held|arrives)"))
        ends = began + 2.2
        held = threading.Thread(target=get, args=("/held",))
        held.start()  # arrives before the window; its reply is ready inside it
        time.sleep(0.5)
        arrives = threading.Thread(target=get, args=("/arrives",))
        arrives.start()
        get("/other")  # in the window, but not the stall's
        assert got["/other"] < ends - 0.3, "a request the stall does not match went on"  # 1.4 s to spare
        for t in (held, arrives):
            t.join(10)
        assert got["/held"] >= ends - 0.01 and got["/arrives"] >= ends - 0.01, (got, ends)
        get("/after")
        assert got["/after"] - got["/arrives"] < 0.5 + 2.0  # answered at once (a loaded machine's slack)
        stalled = {r.target: r.stalled for r in proxy.requests()}
        assert stalled["/held"] > 0.3 and stalled["/arrives"] > 0.3
        assert stalled["/other"] == stalled["/after"] == 0.0
        assert stall.held == 2
        assert [round(b - began, 1) for w in stall.windows for b in w] == [0.2, 2.2]


def test_a_stalls_windows_are_drawn_from_its_seed() -> None:
    """Ranged windows replay from the seed; ``times`` bounds them; a stepped clock shows which requests wait."""
    ranged = {"seconds": (0.5, 2.0), "at": (0.0, 5.0), "gap": (1.0, 10.0), "times": None}
    plan = Stall(**ranged, seed=7).plan(6)
    assert plan == Stall(**ranged, seed=7).plan(6) != Stall(**ranged, seed=8).plan(6)
    assert 0.0 <= plan[0][0] <= 5.0
    assert all(0.5 <= end - start <= 2.0 for start, end in plan)
    assert all(1.0 <= b[0] - a[1] <= 10.0 for a, b in zip(plan, plan[1:], strict=False))
    assert len(Stall(**{**ranged, "times": 3}, seed=7).plan(6)) == 3
    now = [100.0]
    stall = Stall(seconds=2.0, at=1.0, gap=3.0, times=2, method="PUT", clock=lambda: now[0]).begin()
    assert stall.until("PUT", "/k", b"") is None  # before the first window
    now[0] = 101.5
    assert stall.until("PUT", "/k", b"") == 103.0 and stall.until("GET", "/k", b"") is None
    now[0] = 104.0
    assert stall.until("PUT", "/k", b"") is None  # between windows
    now[0] = 106.0
    assert stall.until("PUT", "/k", b"") == 108.0
    now[0] = 200.0
    assert stall.until("PUT", "/k", b"") is None  # both were
    assert stall.windows == [(101.0, 103.0), (106.0, 108.0)]
    stall.active = False
    now[0] = 107.0
    assert stall.until("PUT", "/k", b"") is None

"""The HTTP fault proxy's core, in the package so ``lnk-store-check --faults`` can run it in front of any driver.

Moved here from ``tests/faults/http_proxy.py`` (which re-exports every name,
so the project's own fault tests import it as before).  What follows is that
module's description, unchanged:

A small HTTP/1.1 reverse proxy in front of an emulator, for the real SDKs' faults.

``FaultProxy`` listens on a free loopback port and forwards every request to
one upstream (moto's S3 server, fake-gcs-server), each on a connection of its
own, reading the whole reply before answering.  Rules decide, request by
request, what the client gets instead; they are matched by method, a regex
on the path and query, and the nth match, so a test says exactly which
request fails and how, and a run replays the same way every time:

* ``lose_reply`` - forward, let the store apply it, then close the client's
  connection without answering (the write landed; the client cannot know).
* ``fail``       - answer a status (503, 500, 429, ...) without forwarding, with
  an S3-style XML or GCS-style JSON error body (``flavor``) or a bare one.
* ``reset``      - reset the client's connection before forwarding.
* ``truncate``   - forward, then send the status line, the headers and only
  ``keep`` bytes of the body (half by default), and close.
* ``delay``      - hold the request ``before`` seconds before forwarding and / or
  the reply ``after`` seconds before sending it.
* ``strip``      - forward without its preconditions (``strip_preconditions``:
  S3's ``If-None-Match`` / ``If-Match`` headers, GCS's ``ifGenerationMatch``,
  ``ifGenerationNotMatch``, ``ifMetagenerationMatch`` and
  ``ifMetagenerationNotMatch`` parameters and ``x-goog-if-*`` headers), so the
  store applies it unconditionally: a server, or a proxy in front of one, that
  ignores preconditions.  ``strip_all`` does it to every request, whatever
  the rules (``lnk-store-check``'s ``faults.server_ignores_preconditions``).
  An S3 request signed with SigV4 signed the headers it loses: with the
  secret of its access key in ``credentials``, the proxy signs it again
  (``resign_sigv4``), as a rewriting proxy holding the key would, so a server
  that checks signatures (SeaweedFS) takes it; without, it goes as it is
  (moto checks none).

Besides rules, a proxy may carry rate limits (``RateLimit``), the cloud's
own throttles as a fault: GCS's per-object write limit (a token bucket per
object name, 1 write a second with a burst of 2 by default, answered 429
``rateLimitExceeded`` with GCS's JSON error body) and S3's per-prefix
``SlowDown`` (a token bucket per key prefix, answered 503 with S3's XML
body), either optionally with a ``Retry-After`` header.  A request a rule
fires on is not limited; every other one takes a token before it is
forwarded (so a write that then fails its precondition has spent one, as
on GCS).  Where a limit refuses at random (``chance``, a prefix still
scaling), its own seeded generator decides, so a run replays.

A rule may also match a regex in the request body (``content``: a GCS
upload names its object in its body, not its URL).  Each rule fires
``times`` times (once by default), from its ``nth`` match on;
the first rule that fires for a request wins, and every rule counts every
request it matches.  Every request is recorded (``Seen``: method, target,
status the client got, status the store answered, time, action), so a test
can assert how many requests reached the store (and how many body bytes
each request carried, ``received``, and each reply, ``sent``).  ``latency`` adds a fixed
delay to every request (half on the way in, half on the way out), for
round-trip figures closer to a real bucket's.

A proxy may also shift the ``Date`` header of chosen replies (``DateShift``,
``proxy.shift_dates``), the clock faults of issue 27: a front-end or a
proxy with a wrong clock.  A shift matches requests as a rule does and
picks, among its matches, the ``nth`` on, ``times`` of them (or all), every
``every``-th (one replica of several), or at random (``chance``, its own
seeded generator); its ``seconds`` are one offset, or several taken in turn
(replicas that disagree).  ``active`` False ends a window of shifts.  Each
reply's shift is recorded (``Seen.shifted``).

A proxy may also *stall* (``Stall``, ``proxy.stall``): the store stops
answering for a window of time, then goes on, as a front end in a long GC
pause or a failover does.  Every request the stall matches (as a rule
does) that arrives in a window waits until the window ends before the proxy
does anything with it, and so does every reply, or closing, the proxy is
about to send in a window (a request that arrived before it, held by a
delay or upstream): nothing is answered in the window, then everything at
once.  Windows are ``seconds`` long, the first ``at`` seconds after the
stall is given to the proxy, the next ``gap`` after one ends, ``times`` of
them (or for ever); each of the three may be a range ``(low, high)`` drawn
by the stall's own seeded generator, so a run replays.  Each request's wait
is recorded (``Seen.stalled``).

The SDKs reach it through their usual settings: ``proxy.redirect(env)``
replaces the upstream URL by the proxy's in an emulator's environment
(``AWS_ENDPOINT_URL_S3``, ``STORAGE_EMULATOR_HOST``).  Absolute URLs the
upstream puts in ``Location`` headers and JSON bodies (fake-gcs-server's
``selfLink`` / ``mediaLink`` name its own address, whatever the ``Host``) are
rewritten to the proxy's, so a client that follows one stays behind it.

    with FaultProxy(emulator.env["AWS_ENDPOINT_URL_S3"], flavor="s3") as proxy:
        proxy.add(Rule("lose_reply", method="PUT", path=r"/bucket/key$"))
        env = proxy.redirect(emulator.env)
        ...
        assert proxy.count("PUT", r"/bucket/key$") == 2
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from urllib.parse import parse_qs, unquote, urlsplit

ACTIONS = ("lose_reply", "fail", "reset", "truncate", "delay", "strip")
CONTENT_KEPT = 4096  # bytes of each request body kept in its record (a GCS upload's metadata comes first)

# Headers that describe one connection, not the message: never forwarded as they are.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length", "expect"}

_REASONS = {408: "RequestTimeout", 429: "SlowDown", 500: "InternalError", 502: "BadGateway",
            503: "ServiceUnavailable", 504: "GatewayTimeout"}
_GCS_REASONS = {429: "rateLimitExceeded", 500: "backendError", 502: "backendError", 503: "backendError",
                504: "backendError", 408: "requestTimeout"}


@dataclass
class Rule:
    """What to do with the ``nth`` .. ``nth + times - 1``-th requests that match."""

    action: str
    method: str | None = None  # e.g. "PUT"; None matches every method
    path: str | None = None  # a regex searched in the path and query; None matches every one
    nth: int = 1
    times: int = 1
    content: bytes | None = None  # a regex searched in the request body (a GCS upload names its object there)
    status: int = 503  # fail
    reply_body: bytes | None = None  # fail: this body instead of the flavor's error body
    reply_type: str = "text/plain"  # fail: the Content-Type of ``reply_body``
    reply_headers: tuple[tuple[str, str], ...] = ()  # fail: more headers (a Retry-After...)
    keep: int | None = None  # truncate: body bytes sent (half the body by default)
    before: float = 0.0  # delay: seconds held before forwarding
    hold: threading.Event | None = None  # delay: also held, before forwarding, until the test sets this
    after: float = 0.0  # delay: seconds held before the reply is sent
    matched: int = 0  # requests matched so far
    fired: int = 0  # times it fired so far

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; one of {ACTIONS}")
        if self.nth < 1 or self.times < 1:
            raise ValueError("nth and times count from 1")
        for pattern in (self.path, self.content):
            if pattern is not None:
                re.compile(pattern)  # a bad regex fails here, not in the proxy's thread

    def matches(self, method: str, target: str, body: bytes) -> bool:
        return selects(self.method, self.path, self.content, method, target, body)


def selects(method: str | None, path: str | None, content: bytes | None,
            seen_method: str, target: str, body: bytes) -> bool:
    """Whether a request (method, path and query, body) is one that the matcher selects."""
    return ((method is None or method == seen_method)
            and (path is None or re.search(path, target) is not None)
            and (content is None or re.search(content, body) is not None))


@dataclass(frozen=True)
class Seen:
    """One request that reached the proxy, and what became of it."""

    method: str
    target: str  # path and query, as sent
    status: int | None  # what the client got; None when it got no reply
    upstream: int | None  # what the store answered; None when not forwarded
    at: float  # time.monotonic() when the request was read
    action: str | None  # the rule's action that fired, if any ("throttle": a RateLimit refused it)
    sent: int = 0  # body bytes sent to the client
    content: bytes = field(default=b"", repr=False)  # the first CONTENT_KEPT bytes of the request body
    answered: float = 0.0  # time.monotonic() when its reply (or none) was settled, before it was written
    shifted: float = 0.0  # seconds its reply's Date header was moved (DateShift)
    stripped: tuple[str, ...] = ()  # the preconditions taken off it before it was forwarded (``strip``)
    received: int = 0  # body bytes the client sent (a body in one request, or one part of a multi-request upload)
    stalled: float = 0.0  # seconds it waited for stall windows (on arrival and before its reply)


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes
    stripped: tuple[str, ...] = ()  # preconditions taken off before forwarding (``strip_preconditions``)
    as_sent: str = ""  # the target as the client sent it, when stripping changed it
    stalled: float = 0.0  # seconds it waited for stall windows so far

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass
class _Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    bodiless: bool = False  # a reply to HEAD, or 1xx / 204 / 304: Content-Length passed as is


#: The request headers that make a write conditional: S3's (and HTTP's) and GCS's XML API's.
PRECONDITION_HEADERS = frozenset({"if-none-match", "if-match", "x-goog-if-generation-match",
                                  "x-goog-if-metageneration-match"})
#: The query parameters that make a GCS JSON-API request conditional.
PRECONDITION_PARAMS = frozenset({"ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch",
                                 "ifMetagenerationNotMatch"})


def strip_preconditions(request: _Request, credentials: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Take every precondition off ``request`` (in place); the names taken off, in order.

    Headers in ``PRECONDITION_HEADERS`` and query parameters in
    ``PRECONDITION_PARAMS`` go; the rest of the target keeps its order and
    its encoding.  When a header that went was signed (SigV4) and
    ``credentials`` holds the secret of the request's access key, the request
    is signed again without it (``resign_sigv4``).
    """
    gone = [name for name, _ in request.headers if name.lower() in PRECONDITION_HEADERS]
    if gone:
        request.headers = [(k, v) for k, v in request.headers if k.lower() not in PRECONDITION_HEADERS]
        if credentials:
            resign_sigv4(request, credentials)
    path, sep, query = request.target.partition("?")
    if sep:
        kept = []
        for pair in query.split("&"):
            if unquote(pair.partition("=")[0]) in PRECONDITION_PARAMS:
                gone.append(unquote(pair.partition("=")[0]))
            else:
                kept.append(pair)
        if len(kept) < len(query.split("&")):
            request.as_sent = request.as_sent or request.target
            request.target = path + ("?" + "&".join(kept) if kept else "")
    request.stripped = (*request.stripped, *gone)
    return tuple(gone)


_SIGV4 = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/,]+)/([^/,]+)/aws4_request,\s*"
                    r"SignedHeaders=([^,\s]+),\s*Signature=[0-9a-f]+")


def resign_sigv4(request: _Request, credentials: Mapping[str, str]) -> bool:
    """Sign ``request`` again (SigV4, header-signed, as botocore signs S3 requests) over the headers it
    still has; whether it was (False: not SigV4-signed, or its access key's secret is not known).

    The canonical request is the one S3 checks: the path as sent (S3 does
    not normalise it), the query's pairs sorted as sent, the signed headers
    that remain (trimmed; repeated ones joined by commas), the payload hash
    the client declared (``x-amz-content-sha256``), at the client's
    ``x-amz-date``.
    """
    found = _SIGV4.match(request.header("authorization") or "")
    if found is None:
        return False
    key_id, day, region, service, signed = found.groups()
    secret = credentials.get(key_id)
    stamp = request.header("x-amz-date")
    if secret is None or stamp is None:
        return False
    names = [n for n in signed.split(";") if any(k.lower() == n for k, _ in request.headers)]
    canonical_headers = "".join(
        f"{n}:{','.join(' '.join(v.split()) for k, v in request.headers if k.lower() == n)}\n" for n in names)
    path, _, query = request.target.partition("?")
    pairs = sorted(tuple(pair.partition("=")[::2]) for pair in query.split("&")) if query else []
    canonical = "\n".join([request.method.upper(), path, "&".join(f"{k}={v}" for k, v in pairs), canonical_headers,
                           ";".join(names), request.header("x-amz-content-sha256") or "UNSIGNED-PAYLOAD"])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    auth = (f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={';'.join(names)}, "
            f"Signature={signature}")
    request.headers = [(k, auth if k.lower() == "authorization" else v) for k, v in request.headers]
    return True


class _Closed(Exception):
    """The client closed its connection (or sent something unreadable)."""


def _read_line(reader, limit: int = 65536) -> bytes:
    line = reader.readline(limit + 1)
    if not line:
        raise _Closed()
    if len(line) > limit:
        raise _Closed()
    return line


def _read_request(reader, wfile) -> _Request:
    line = _read_line(reader)
    while line in (b"\r\n", b"\n"):  # tolerated between requests
        line = _read_line(reader)
    try:
        method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    except ValueError:
        raise _Closed() from None
    headers: list[tuple[str, str]] = []
    while True:
        line = _read_line(reader)
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    request = _Request(method, target, version, headers, b"")
    if (request.header("expect") or "").lower() == "100-continue":
        wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        wfile.flush()
    if "chunked" in (request.header("transfer-encoding") or "").lower():
        parts = []
        while True:
            size = int(_read_line(reader).split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while _read_line(reader) not in (b"\r\n", b"\n"):  # trailers, dropped
                    pass
                break
            parts.append(reader.read(size))
            _read_line(reader)
        request.body = b"".join(parts)
    elif request.header("content-length") is not None:
        size = int(request.header("content-length") or "0")
        request.body = reader.read(size)
        if len(request.body) != size:
            raise _Closed()
    return request


def _status_line(reply: _Reply) -> bytes:
    return f"HTTP/1.1 {reply.status} {reply.reason}\r\n".encode("latin-1")


def _head_bytes(reply: _Reply, close: bool) -> bytes:
    lines = [_status_line(reply)]
    for name, value in reply.headers:
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not reply.bodiless:
        lines.append(f"Content-Length: {len(reply.body)}\r\n".encode("latin-1"))
    lines.append(b"Connection: close\r\n" if close else b"Connection: keep-alive\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def error_body(flavor: str, status: int) -> tuple[bytes, str]:
    """An error body as the store would send it: (body, content type)."""
    if flavor == "s3":
        code = _REASONS.get(status, f"Error{status}")
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>injected by the test proxy</Message><RequestId>faultproxy</RequestId></Error>")
        return body.encode(), "application/xml"
    if flavor == "gcs":
        reason = _GCS_REASONS.get(status, "error")
        doc = {"error": {"code": status, "message": "injected by the test proxy",
                         "errors": [{"message": "injected by the test proxy", "domain": "global", "reason": reason}]}}
        return json.dumps(doc).encode(), "application/json; charset=UTF-8"
    return f"injected {status}\n".encode(), "text/plain"


#: GCS's message for its per-object mutation limit (the object's bucket/name is put after "The object").
GCS_RATE_MESSAGE = ("The object {name} exceeded the rate limit for object mutation operations "
                    "(create, update, and delete). Please reduce your request rate. "
                    "See https://cloud.google.com/storage/docs/gcs429.")
LIMIT_KINDS = ("gcs-object", "s3-prefix")


@dataclass
class RateLimit:
    """A cloud's rate limit as a fault: a token bucket per GCS object name or per S3 key prefix.

    ``gcs-object``: writes (uploads, deletes, metadata patches, the target
    of a rewrite or compose) of one object name share a bucket of ``burst``
    tokens refilled at ``rate`` a second; over it, 429 with GCS's body
    (``usageLimits`` / ``rateLimitExceeded``).  Reads are not limited, as
    on GCS.  ``s3-prefix``: writes (PUT, POST, DELETE) under one prefix
    (the bucket and the key up to its last ``/``) share a bucket; with
    ``reads`` GETs and HEADs share another (``read_rate``, ``read_burst``);
    over it, 503 ``SlowDown``.  ``retry_after`` (seconds) is sent as a
    ``Retry-After`` header when set.  ``chance`` refuses a request a token
    would have admitted, decided by ``random.Random(seed)``.  ``clock`` is
    the time the buckets refill by (a test may step it).
    """

    kind: str = "gcs-object"
    rate: float = 1.0
    burst: float = 2.0
    reads: bool = False
    read_rate: float = 5500.0
    read_burst: float = 5500.0
    retry_after: float | None = None
    chance: float = 0.0
    seed: int = 0
    clock: Callable[[], float] = time.monotonic
    admitted: int = 0  # requests that took a token
    refused: int = 0  # requests answered with the throttle
    refused_names: dict[str, int] = field(default_factory=dict)  # refusals by object name / prefix
    admitted_names: dict[str, int] = field(default_factory=dict)  # requests that took a token, by name / prefix

    def __post_init__(self) -> None:
        if self.kind not in LIMIT_KINDS:
            raise ValueError(f"unknown rate limit {self.kind!r}; one of {LIMIT_KINDS}")
        if self.rate < 0 or self.burst < 0:
            raise ValueError("rate and burst are at least 0")
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self._tokens: dict[tuple[str, bool], tuple[float, float]] = {}  # (name, write) -> (tokens, when)

    def subject(self, method: str, target: str, body: bytes) -> tuple[str, bool] | None:
        """(object name or prefix, whether a write) of a request this limit counts; None when it counts none."""
        parts = urlsplit(target)
        path = parts.path
        if self.kind == "gcs-object":
            name = _gcs_written_name(method, path, parts.query, body)
            return None if name is None else (name, True)
        segments = path.lstrip("/").split("/", 1)
        if len(segments) < 2 or not segments[1]:
            return None  # the bucket itself (a listing, a multi-object delete): not per prefix here
        key = unquote(segments[1])
        prefix = segments[0] + "/" + (key.rsplit("/", 1)[0] + "/" if "/" in key else "")
        if method in ("PUT", "POST", "DELETE"):
            return prefix, True
        if self.reads and method in ("GET", "HEAD"):
            return prefix, False
        return None

    def admit(self, method: str, target: str, body: bytes) -> bool:
        """Whether the request may pass (it then takes a token); a refusal is counted."""
        subject = self.subject(method, target, body)
        if subject is None:
            return True
        rate, burst = (self.rate, self.burst) if subject[1] else (self.read_rate, self.read_burst)
        with self._lock:
            now = self.clock()
            tokens, then = self._tokens.get(subject, (burst, now))
            tokens = min(burst, tokens + max(0.0, now - then) * rate)
            lucky = self.chance <= 0 or self._random.random() >= self.chance
            if tokens >= 1.0 and lucky:
                self._tokens[subject] = (tokens - 1.0, now)
                self.admitted += 1
                self.admitted_names[subject[0]] = self.admitted_names.get(subject[0], 0) + 1
                return True
            self._tokens[subject] = (tokens, now)
            self.refused += 1
            self.refused_names[subject[0]] = self.refused_names.get(subject[0], 0) + 1
            return False

    def reply(self, method: str, target: str, body: bytes) -> _Reply:
        """The throttle's reply, as the cloud sends it."""
        headers: list[tuple[str, str]] = []
        if self.retry_after is not None:
            headers.append(("Retry-After", f"{self.retry_after:g}"))
        if self.kind == "gcs-object":
            subject = self.subject(method, target, body)
            bucket = _gcs_bucket(urlsplit(target).path) or "bucket"
            message = GCS_RATE_MESSAGE.format(name=f"{bucket}/{subject[0] if subject else ''}")
            doc = {"error": {"code": 429, "message": message,
                             "errors": [{"message": message, "domain": "usageLimits",
                                         "reason": "rateLimitExceeded"}]}}
            headers.append(("Content-Type", "application/json; charset=UTF-8"))
            return _Reply(429, "Too Many Requests", headers, json.dumps(doc).encode())
        xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
               "<Message>Please reduce your request rate.</Message>"
               "<RequestId>faultproxy</RequestId><HostId>faultproxy</HostId></Error>")
        headers.append(("Content-Type", "application/xml"))
        return _Reply(503, "Slow Down", headers, xml.encode())


def _gcs_bucket(path: str) -> str | None:
    match = re.match(r"^(?:/upload)?/storage/v1/b/([^/]+)", path)
    return unquote(match.group(1)) if match else None


def _gcs_written_name(method: str, path: str, query: str, body: bytes) -> str | None:
    """The object name a GCS JSON-API request mutates, or None for a read or a listing.

    An upload (``POST /upload/storage/v1/b/B/o``) names it in its ``name``
    query parameter or in the JSON metadata part of its body; a delete or a
    patch in its path; a rewrite or a compose names its target in its path.
    """
    if path.startswith("/upload/storage/v1/b/") and method in ("POST", "PUT"):
        named = parse_qs(query).get("name")
        if named:
            return named[0]
        found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
        if found is None:
            return None
        try:
            return str(json.loads(b'"' + found.group(1) + b'"'))
        except ValueError:
            return None
    match = re.match(r"^/storage/v1/b/[^/]+/o/(.+)$", path)
    if match is None:
        return None
    rest = match.group(1)
    for verb in ("/rewriteTo/b/", "/copyTo/b/"):
        if verb in rest and method == "POST":
            return unquote(rest.split(verb, 1)[1].split("/o/", 1)[-1])
    if rest.endswith("/compose") and method == "POST":
        return unquote(rest[: -len("/compose")])
    if method in ("DELETE", "PATCH", "PUT"):
        return unquote(rest)
    return None


@dataclass
class DateShift:
    """Move the ``Date`` header of chosen replies by ``seconds`` (a clock fault: a front-end's clock is off).

    Matched as a rule is (``method``, ``path``, ``content``); of the matches, those from the ``nth`` on,
    ``times`` of them (None: all), each ``every``-th one, and with ``chance`` below 1 those that
    ``random.Random(seed)`` picks.  ``seconds`` may be a tuple: the shifted replies take its offsets in
    turn (replicas that disagree: ``(2.0, -2.0)``).  While ``active`` is False it shifts nothing and
    counts nothing (a window: set it, run an op, clear it).
    """

    seconds: float | tuple[float, ...]
    method: str | None = None
    path: str | None = None
    content: bytes | None = None
    nth: int = 1
    times: int | None = None
    every: int = 1
    chance: float = 1.0
    seed: int = 0
    active: bool = True
    matched: int = 0  # replies matched so far (while active)
    shifted: int = 0  # replies shifted so far

    def __post_init__(self) -> None:
        if self.nth < 1 or self.every < 1 or (self.times is not None and self.times < 1):
            raise ValueError("nth, every and times count from 1")
        offsets = self.seconds if isinstance(self.seconds, tuple) else (self.seconds,)
        if not offsets:
            raise ValueError("at least one offset")
        self._offsets = tuple(float(o) for o in offsets)
        self._random = random.Random(self.seed)
        for pattern in (self.path, self.content):
            if pattern is not None:
                re.compile(pattern)

    def pick(self, method: str, target: str, body: bytes) -> float:
        """The offset for this reply (0.0: not shifted); counts it."""
        if not self.active or not selects(self.method, self.path, self.content, method, target, body):
            return 0.0
        self.matched += 1
        if self.matched < self.nth or (self.times is not None and self.shifted >= self.times):
            return 0.0
        if (self.matched - self.nth) % self.every != 0:
            return 0.0
        if self.chance < 1.0 and self._random.random() >= self.chance:
            return 0.0
        offset = self._offsets[self.shifted % len(self._offsets)]
        self.shifted += 1
        return offset


def shifted_date(headers: list[tuple[str, str]], seconds: float) -> list[tuple[str, str]]:
    """``headers`` with their Date moved by ``seconds`` (a Date of now when there was none)."""
    when = time.time()
    for name, value in headers:
        if name.lower() == "date":
            try:
                when = parsedate_to_datetime(value).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                pass
    date = formatdate(when + seconds, usegmt=True)
    return [*((k, v) for k, v in headers if k.lower() != "date"), ("Date", date)]


Span = float | tuple[float, float]  # seconds, or a range (low, high) a stall draws from


@dataclass
class Stall:
    """The store stops answering for windows of time, then goes on (see the module's docstring).

    The first window begins ``at`` seconds after ``begin`` (``proxy.stall`` calls it), lasts
    ``seconds``, and the next begins ``gap`` after one ends, ``times`` windows in all (None: for
    ever).  Each of the three is a number or a range ``(low, high)``, drawn window by window, in
    that order (at, seconds, gap, seconds, gap, ...), by ``random.Random(seed)``: the same seed
    gives the same windows (``plan``).  Requests are matched as a rule matches them (``method``,
    ``path``, ``content``; all by default).  ``clock`` is the time the windows are in (a test may
    step it); ``active`` False ends the stall at once, and requests waiting on it go on.
    """

    seconds: Span = 1.0
    at: Span = 0.0
    gap: Span = 0.0
    times: int | None = 1
    method: str | None = None
    path: str | None = None
    content: bytes | None = None
    seed: int = 0
    clock: Callable[[], float] = time.monotonic
    active: bool = True
    held: int = 0  # requests (or replies) that waited for a window

    def __post_init__(self) -> None:
        for span in (self.seconds, self.at, self.gap):
            low, high = span if isinstance(span, tuple) else (span, span)
            if not 0.0 <= low <= high:
                raise ValueError(f"a stall's times are seconds >= 0, a range low <= high: not {span!r}")
        if self.times is not None and self.times < 1:
            raise ValueError("times counts from 1 (None: for ever)")
        for pattern in (self.path, self.content):
            if pattern is not None:
                re.compile(pattern)
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()
        self._origin: float | None = None
        self._windows: list[tuple[float, float]] = []  # drawn so far, seconds after the origin

    def _draw(self, span: Span) -> float:
        return self._random.uniform(*span) if isinstance(span, tuple) else float(span)

    def _drawn(self, count: int) -> list[tuple[float, float]]:
        """The first ``count`` windows (fewer when ``times`` says so), as (start, end) after the origin."""
        while len(self._windows) < count and (self.times is None or len(self._windows) < self.times):
            start = self._draw(self.at) if not self._windows else self._windows[-1][1] + self._draw(self.gap)
            self._windows.append((start, start + self._draw(self.seconds)))
        return self._windows[:count]

    def plan(self, count: int) -> list[tuple[float, float]]:
        """The first ``count`` windows as (start, end), seconds after ``begin``: a function of the seed."""
        with self._lock:
            return list(self._drawn(count))

    def begin(self, now: float | None = None) -> Stall:
        """Start the windows' time from ``now`` (the clock's now by default)."""
        with self._lock:
            self._origin = self.clock() if now is None else now
        return self

    @property
    def windows(self) -> list[tuple[float, float]]:
        """The windows begun so far, as (start, end) in the clock's time."""
        with self._lock:
            if self._origin is None:
                return []
            since = self.clock() - self._origin
            return [(self._origin + a, self._origin + b) for a, b in self._windows if a <= since]

    def count_held(self) -> None:
        with self._lock:
            self.held += 1

    def until(self, method: str, target: str, body: bytes) -> float | None:
        """When the window that holds a request now ends (in the clock's time); None when none does."""
        if not self.active or not selects(self.method, self.path, self.content, method, target, body):
            return None
        with self._lock:
            if self._origin is None:
                return None
            since = self.clock() - self._origin
            n = 1
            while True:
                drawn = self._drawn(n)
                if len(drawn) < n or drawn[-1][0] > since:
                    return None  # every window is over, or the next has not begun
                start, end = drawn[-1]
                if start <= since < end:
                    return self._origin + end
                n += 1


@dataclass
class FaultProxy:
    """A reverse proxy on 127.0.0.1 in front of ``upstream`` (``http://HOST:PORT``)."""

    upstream: str
    flavor: str = "bare"  # error bodies of ``fail``: "s3", "gcs" or "bare"
    latency: float = 0.0  # seconds added to every request
    upstream_timeout: float = 30.0
    rewrite: bool = True  # upstream's address in Location headers and JSON bodies -> the proxy's
    rules: list[Rule] = field(default_factory=list)
    limits: list[RateLimit] = field(default_factory=list)  # the cloud's throttles (see RateLimit)
    dates: list[DateShift] = field(default_factory=list)  # replies whose Date is moved (see DateShift)
    stalls: list[Stall] = field(default_factory=list)  # windows in which the store answers nothing (see Stall)
    seen: list[Seen] = field(default_factory=list)
    #: Every request forwarded without its preconditions (a server that ignores them), whatever the rules.
    strip_all: bool = False
    #: Access key id -> secret: what a stripped SigV4 request is signed again with (``resign_sigv4``).
    credentials: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://HOST:PORT, not {self.upstream!r}")
        self._up_host, self._up_port = parts.hostname, parts.port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._clients: set[socket.socket] = set()
        self.port = 0
        self.connections = 0  # client connections accepted (fewer than requests: keep-alive works)

    # -- life

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop, "faultproxy-accept")
        return self

    def stop(self) -> None:
        """Stop listening, close every client connection, wait for the handlers."""
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in list(self._threads):
            thread.join(timeout=self.upstream_timeout + 5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def redirect(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with every value naming the upstream URL pointed at the proxy instead."""
        up = self.upstream.rstrip("/")
        return {k: (self.url if v.rstrip("/") == up else v) for k, v in env.items()}

    # -- rules and records

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def limit(self, limit: RateLimit) -> RateLimit:
        """Throttle the requests ``limit`` counts, from now on (``clear`` removes it)."""
        with self._lock:
            self.limits.append(limit)
        return limit

    def shift_dates(self, shift: DateShift) -> DateShift:
        """Move the Date of the replies ``shift`` picks, from now on (``clear`` removes it)."""
        with self._lock:
            self.dates.append(shift)
        return shift

    def stall(self, stall: Stall) -> Stall:
        """Stall as ``stall`` says, its windows timed from now (``clear`` removes it)."""
        stall.begin()
        with self._lock:
            self.stalls.append(stall)
        return stall

    def on(self, action: str, method: str | None = None, path: str | None = None, **kw: object) -> Rule:
        """Shorthand: ``proxy.on("fail", "GET", r"/o/key", status=429)``."""
        return self.add(Rule(action, method, path, **kw))  # type: ignore[arg-type]

    def requests(self, method: str | None = None, path: str | None = None,
                 content: bytes | None = None) -> list[Seen]:
        """The recorded requests, in order; optionally only those a matcher (as a rule's) selects."""
        with self._lock:
            seen = list(self.seen)
        return [s for s in seen if selects(method, path, content, s.method, s.target, s.content)]

    def count(self, method: str | None = None, path: str | None = None,
              content: bytes | None = None) -> int:
        return len(self.requests(method, path, content))

    def counts(self) -> dict[str, int]:
        """Requests by method."""
        out: dict[str, int] = {}
        for s in self.requests():
            out[s.method] = out.get(s.method, 0) + 1
        return out

    def clear(self) -> None:
        """Forget the records and the rules (between phases of one test)."""
        with self._lock:
            self.seen.clear()
            self.rules.clear()
            self.limits.clear()
            self.dates.clear()
            self.stalls.clear()

    def _choose(self, request: _Request) -> Rule | None:
        chosen = None
        with self._lock:
            for rule in self.rules:
                if not rule.matches(request.method, request.target, request.body):
                    continue
                rule.matched += 1
                if chosen is None and rule.matched >= rule.nth and rule.fired < rule.times:
                    rule.fired += 1
                    chosen = rule
        return chosen

    def _record(self, request: _Request, at: float, status: int | None, upstream: int | None,
                rule: Rule | None, sent: int = 0, action: str | None = None, shifted: float = 0.0) -> None:
        """Record a request whose reply (or closing) is about to go; first, wait out any stall window."""
        self._wait_stalls(request)
        with self._lock:
            self.seen.append(Seen(request.method, request.as_sent or request.target, status, upstream, at,
                                  rule.action if rule else action, sent, request.body[:CONTENT_KEPT],
                                  time.monotonic(), shifted, request.stripped, len(request.body),
                                  request.stalled))

    def _wait_stalls(self, request: _Request) -> None:
        """Wait while a stall's window holds ``request`` (windows may follow one another); counted on it."""
        began = time.monotonic()
        counted: set[int] = set()
        while not self._stopping.is_set():
            with self._lock:
                stalls = list(self.stalls)
            left: list[float] = []
            for stall in stalls:
                end = stall.until(request.method, request.target, request.body)
                if end is None:
                    continue
                left.append(end - stall.clock())
                if id(stall) not in counted:
                    counted.add(id(stall))
                    stall.count_held()
            if not left:
                break
            self._stopping.wait(min(max(min(left), 0.001), 0.05))  # polled: ``active`` or a test's clock may end it
        if counted:
            request.stalled += time.monotonic() - began

    def _shift(self, request: _Request, reply: _Reply) -> float:
        """Move the reply's Date as the first DateShift that picks it says; the seconds moved."""
        with self._lock:
            offset = 0.0
            for shift in self.dates:
                picked = shift.pick(request.method, request.target, request.body)
                if picked and not offset:
                    offset = picked
        if offset:
            reply.headers = shifted_date(reply.headers, offset)
        return offset

    # -- the work

    def _spawn(self, target, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._clients.add(sock)
                self.connections += 1
            self._spawn(self._serve, "faultproxy-conn", sock)

    def _hold(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)

    def _serve(self, sock: socket.socket) -> None:
        reader = sock.makefile("rb")
        wfile = sock.makefile("wb")
        try:
            while not self._stopping.is_set():
                try:
                    request = _read_request(reader, wfile)
                except (_Closed, OSError, ValueError):
                    return
                if not self._answer(sock, wfile, request):
                    return
        finally:
            with self._lock:
                self._clients.discard(sock)
            for f in (reader, wfile):
                try:
                    f.close()
                except OSError:
                    pass
            try:
                sock.close()
            except OSError:
                pass

    def _answer(self, sock: socket.socket, wfile, request: _Request) -> bool:
        """Handle one request; whether the client connection stays open."""
        at = time.monotonic()
        self._wait_stalls(request)  # a store in a stall window sees nothing until it ends
        rule = self._choose(request)
        action = rule.action if rule else None
        close = (request.header("connection") or "").lower() == "close" or request.version == "HTTP/1.0"
        if action == "reset":
            self._record(request, at, None, None, rule)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if action in (None, "delay", "strip"):
            with self._lock:
                limits = list(self.limits)
            for limit in limits:
                if not limit.admit(request.method, request.target, request.body):
                    reply = limit.reply(request.method, request.target, request.body)
                    self._hold(self.latency)
                    self._record(request, at, reply.status, None, None, len(reply.body), action="throttle")
                    wfile.write(_head_bytes(reply, close) + reply.body)
                    wfile.flush()
                    return not close
        if action == "fail":
            assert rule is not None
            body, ctype = ((rule.reply_body, rule.reply_type) if rule.reply_body is not None
                           else error_body(self.flavor, rule.status))
            reply = _Reply(rule.status, http.client.responses.get(rule.status, "Error"),
                           [("Content-Type", ctype), *rule.reply_headers], body)
            self._hold(self.latency)
            self._record(request, at, reply.status, None, rule, len(reply.body))
            wfile.write(_head_bytes(reply, close) + reply.body)
            wfile.flush()
            return not close
        self._hold(self.latency / 2 + (rule.before if rule is not None and action == "delay" else 0.0))
        if rule is not None and action == "delay" and rule.hold is not None:
            while not rule.hold.wait(0.05) and not self._stopping.is_set():
                pass
        if action == "strip":
            strip_preconditions(request, self.credentials)
        try:
            reply = self._forward(request)
        except OSError:
            self._record(request, at, None, None, rule)
            return False  # upstream unreachable: the client sees its connection closed
        self._hold(self.latency / 2 + (rule.after if rule is not None and action == "delay" else 0.0))
        if self._stopping.is_set():
            self._record(request, at, None, reply.status, rule)
            return False
        if action == "lose_reply":
            self._record(request, at, None, reply.status, rule)
            return False
        shifted = self._shift(request, reply)
        if action == "truncate":
            assert rule is not None
            keep = len(reply.body) // 2 if rule.keep is None else min(rule.keep, len(reply.body))
            self._record(request, at, reply.status, reply.status, rule, keep, shifted=shifted)
            wfile.write(_head_bytes(reply, True) + reply.body[:keep])
            wfile.flush()
            return False
        body = b"" if reply.bodiless else reply.body
        self._record(request, at, reply.status, reply.status, rule, len(body), shifted=shifted)
        wfile.write(_head_bytes(reply, close) + body)
        wfile.flush()
        return not close

    def _forward(self, request: _Request) -> _Reply:
        """Send ``request`` upstream on a connection of its own; the whole reply (``strip_all``: without its
        preconditions, whichever way it came: a late landing too)."""
        if self.strip_all:
            strip_preconditions(request, self.credentials)
        conn = http.client.HTTPConnection(self._up_host, self._up_port, timeout=self.upstream_timeout)
        try:
            conn.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers:
                if name.lower() not in _HOP:
                    conn.putheader(name, value)
            if request.body or request.header("content-length") is not None \
                    or request.header("transfer-encoding") is not None:
                conn.putheader("Content-Length", str(len(request.body)))
            conn.putheader("Connection", "close")
            conn.endheaders(request.body or None)
            resp = conn.getresponse()
            body = resp.read()
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
            bodiless = request.method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
            if bodiless:
                length = resp.getheader("Content-Length")
                if length is not None:
                    headers.append(("Content-Length", length))
            reply = _Reply(resp.status, resp.reason, headers, body, bodiless)
        finally:
            conn.close()
        return self._rewrite(reply) if self.rewrite else reply

    def _rewrite(self, reply: _Reply) -> _Reply:
        up = f"{self._up_host}:{self._up_port}"
        mine = f"127.0.0.1:{self.port}"
        reply.headers = [(k, v.replace(up, mine) if k.lower() == "location" else v) for k, v in reply.headers]
        ctype = next((v for k, v in reply.headers if k.lower() == "content-type"), "")
        if "json" in ctype.lower() and up.encode() in reply.body:
            reply.body = reply.body.replace(up.encode(), mine.encode())
        return reply

"""``lnk-store-check --faults``: the suite's own fault proxy between a driver and its HTTP store.

A driver that reaches its store over HTTP names the endpoint in a setting
(``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for S3, ``STORAGE_EMULATOR_HOST``
for GCS).  :func:`open_world` starts a :class:`SuiteProxy` in front of that
endpoint and points the setting at it, so every request of every driver
process the fault checks start passes through it, and the checks decide, op
by op, which request of the op fails and how (:class:`Fault`).

The proxy core is ``fault_proxy`` (the project's own, also used by its
tests); this module adds what the core has no rule for:

* ``hold``: the request waits, its client still waiting on its connection,
  until the check releases it (another process's writes go first).
* ``late``: the request is read, the client's connection reset at once (as a
  client whose timeout ran out sees it), and the request is forwarded only
  when the check releases it: a write landing after the driver's retry and
  after the ops that followed it.
* faults counted over a *class* of requests (``write``: PUT, POST, PATCH,
  DELETE; ``read``: GET, HEAD; ``any``), the k-th of an op, whatever the
  driver names its keys, so the schedule is the same for any driver.

The core's ``strip`` is a kind too (the k-th request forwarded without its
preconditions), and :meth:`World.ignoring_preconditions` strips every
request while it lasts: a server that ignores preconditions.  The proxy
knows the driver's S3 secret (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` from ``--env`` or the environment) only to sign a
stripped request again, so a server that checks signatures takes it.

Error replies carry the services' real bodies (S3's XML ``SlowDown`` and
``InternalError``, GCS's JSON ``rateLimitExceeded`` and ``backendError``).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .fault_proxy import GCS_RATE_MESSAGE, DateShift, FaultProxy, Rule, Seen, _Request

#: Settings that name an HTTP store endpoint, in the order looked for, and the error flavour of each.
ENDPOINT_SETTINGS = (("AWS_ENDPOINT_URL_S3", "s3"), ("AWS_ENDPOINT_URL", "s3"), ("STORAGE_EMULATOR_HOST", "gcs"))

KINDS = ("lose_reply", "late", "hold", "fail", "throttle", "reset", "truncate", "strip")
CLASSES = {"write": ("PUT", "POST", "PATCH", "DELETE"), "read": ("GET", "HEAD"), "any": None}

S3_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
               b"<Message>Please reduce your request rate.</Message>"
               b"<RequestId>4442587FB7D0A2F9</RequestId><HostId>faults</HostId></Error>")
S3_INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
               b"<Message>We encountered an internal error. Please try again.</Message>"
               b"<RequestId>4442587FB7D0A2F9</RequestId><HostId>faults</HostId></Error>")


def gcs_error(status: int) -> bytes:
    """GCS's JSON error body for a 429 (per-object rate) or a 5xx (backendError)."""
    if status == 429:
        message = GCS_RATE_MESSAGE.format(name="bucket/object")
        domain, reason = "usageLimits", "rateLimitExceeded"
    else:
        message, domain, reason = "Backend Error", "global", "backendError"
    doc = {"error": {"code": status, "message": message,
                     "errors": [{"message": message, "domain": domain, "reason": reason}]}}
    return json.dumps(doc).encode()


@dataclass
class Fault:
    """The ``nth`` request of ``klass`` (counted from when the fault was set) gets ``kind``."""

    kind: str
    klass: str = "write"
    nth: int = 1
    status: int = 503  # fail / throttle
    release: threading.Event = field(default_factory=threading.Event)  # late / hold: forwarded once set
    matched: int = 0
    fired: Seen | None = None  # the request it fired on
    landed: int | None = None  # late: the status the store answered when it finally got the request

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.klass not in CLASSES:
            raise ValueError(f"no fault {self.kind!r} on {self.klass!r}")

    def matches(self, method: str) -> bool:
        methods = CLASSES[self.klass]
        return methods is None or method in methods

    def describe(self) -> str:
        extra = f" {self.status}" if self.kind in ("fail", "throttle") else ""
        where = f" {self.fired.method} {self.fired.target.split('?')[0][-60:]}" if self.fired else " (not reached)"
        return f"{self.kind}{extra} at {self.klass} #{self.nth}:{where}"


class SuiteProxy(FaultProxy):
    """The core proxy with :class:`Fault` s on top (late landings, faults by request class)."""

    def __init__(self, upstream: str, flavor: str) -> None:
        super().__init__(upstream, flavor=flavor)
        self.faults: list[Fault] = []
        self._chosen: dict[int, Rule] = {}  # a request's core rule, chosen by its Fault (by id of the request)

    def set(self, *faults: Fault) -> list[Fault]:
        """Arm ``faults`` from now on (replacing the earlier ones; a late one still held stays held)."""
        with self._lock:
            self.faults = list(faults)
        return list(faults)

    def disarm(self) -> None:
        with self._lock:
            self.faults = []

    def _pick(self, request: _Request) -> Fault | None:
        chosen = None
        with self._lock:
            for fault in self.faults:
                if fault.fired is not None or not fault.matches(request.method):
                    continue
                fault.matched += 1
                if chosen is None and fault.matched == fault.nth:
                    chosen = fault
        return chosen

    def _body(self, fault: Fault) -> tuple[bytes, str, tuple[tuple[str, str], ...]]:
        if self.flavor == "gcs":
            return gcs_error(fault.status), "application/json; charset=UTF-8", ()
        if fault.kind == "throttle" or fault.status == 503:
            return S3_SLOWDOWN, "application/xml", ()
        return S3_INTERNAL, "application/xml", ()

    def _answer(self, sock: socket.socket, wfile: Any, request: _Request) -> bool:
        fault = self._pick(request)
        if fault is None:
            return super()._answer(sock, wfile, request)
        seen = Seen(request.method, request.target, None, None, time.monotonic(), fault.kind)
        fault.fired = seen
        if fault.kind == "late":
            with self._lock:
                self.seen.append(seen)
            self._spawn(self._land_late, "faultproxy-late", request, fault)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if fault.kind in ("fail", "throttle"):
            body, ctype, headers = self._body(fault)
            rule = Rule("fail", status=fault.status, reply_body=body, reply_type=ctype, reply_headers=headers)
        elif fault.kind == "hold":  # the client kept waiting on its connection until the check releases it
            rule = Rule("delay", hold=fault.release)
        else:
            rule = Rule(fault.kind)
        rule.matched = rule.fired = 1
        with self._lock:
            self._chosen[id(request)] = rule
        return super()._answer(sock, wfile, request)

    def _choose(self, request: _Request) -> Rule | None:
        with self._lock:
            rule = self._chosen.pop(id(request), None)
        return rule if rule is not None else super()._choose(request)

    def _land_late(self, request: _Request, fault: Fault) -> None:
        while not fault.release.wait(0.05):
            if self._stopping.is_set():
                return
        try:
            fault.landed = self._forward(request).status
        except OSError:
            fault.landed = -1

    def settle_late(self, fault: Fault, seconds: float = 30.0) -> bool:
        """Release a late request and wait until the store has answered it; whether it did."""
        fault.release.set()
        ends = time.monotonic() + seconds
        while fault.fired is not None and fault.landed is None and time.monotonic() < ends:
            time.sleep(0.02)
        return fault.landed is not None

    def release_all(self) -> None:
        with self._lock:
            faults = list(self.faults)
        for fault in faults:
            fault.release.set()


def endpoint_of(env: Mapping[str, str]) -> tuple[str, str, str] | None:
    """(setting, URL, flavour) of the HTTP endpoint the driver's settings name; None when none does."""
    for name, flavor in ENDPOINT_SETTINGS:
        value = env.get(name) or os.environ.get(name)
        if value and value.startswith("http://"):
            return name, value.rstrip("/"), flavor
    return None


@dataclass
class World:
    """A proxy in front of the driver's store, the settings that reach it, and the run's seeded choices."""

    proxy: SuiteProxy
    env: dict[str, str]
    seed: int
    rng: random.Random
    quick: bool
    setting: str

    def shift_dates(self, seconds: float | tuple[float, ...], **kw: Any) -> DateShift:
        return self.proxy.shift_dates(DateShift(seconds, seed=self.rng.randrange(1 << 30), **kw))

    def unshift(self) -> None:
        with self.proxy._lock:
            self.proxy.dates.clear()

    @contextmanager
    def ignoring_preconditions(self) -> Iterator[None]:
        """While it lasts, every request reaches the store without its preconditions."""
        self.proxy.strip_all = True
        try:
            yield
        finally:
            self.proxy.strip_all = False

    def close(self) -> None:
        self.proxy.release_all()
        self.proxy.stop()


def open_world(env: Mapping[str, str], seed: int, quick: bool) -> World:
    """Start the proxy in front of the endpoint ``env`` names; ValueError when it names none."""
    found = endpoint_of(env)
    if found is None:
        names = ", ".join(name for name, _ in ENDPOINT_SETTINGS)
        raise ValueError(f"--faults needs the driver's store endpoint as an http:// setting ({names}) in --env")
    setting, url, flavor = found
    proxy = SuiteProxy(url, flavor)
    key, secret = (env.get(name) or os.environ.get(name) for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"))
    if key and secret:
        proxy.credentials[key] = secret
    proxy.start()
    redirected = dict(env)
    for name, _ in ENDPOINT_SETTINGS:
        value = env.get(name) or os.environ.get(name)
        if value and value.rstrip("/") == url:
            redirected[name] = proxy.url
    return World(proxy, redirected, seed, random.Random(seed), quick, setting)

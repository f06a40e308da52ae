"""A small HTTP/1.1 reverse proxy in front of an emulator, for the real SDKs' faults.

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
each reply carried, ``sent``).  ``latency`` adds a fixed
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

# The proxy's core lives in the package now (``lnk-store-check --faults`` runs it in front of any
# driver); every name this module had, private ones included, is the same object there.
from cloudstore.conformance.fault_proxy import (  # noqa: F401
    _GCS_REASONS,
    _HOP,
    _REASONS,
    ACTIONS,
    CONTENT_KEPT,
    GCS_RATE_MESSAGE,
    LIMIT_KINDS,
    DateShift,
    FaultProxy,
    RateLimit,
    Rule,
    Seen,
    _Closed,
    _gcs_bucket,
    _gcs_written_name,
    _head_bytes,
    _read_line,
    _read_request,
    _Reply,
    _Request,
    _status_line,
    error_body,
    selects,
    shifted_date,
)

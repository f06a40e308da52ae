"""Issue 26 item 3 and issue 28's 4xx: a cloud's throttle is outlasted, and a refusal says nothing changed.

Through ``tests/faults/http_proxy.py`` in front of moto and fake-gcs-server,
with the rate-limit fault (``RateLimit``: GCS's per-object write limit, S3's
per-prefix ``SlowDown``, each answered with the body the cloud sends), the
drivers' own request handler (``Service``) on the drivers' own SDK clients.

The writer at 2 writes a second runs in virtual time, so that it is
deterministic: every ``time.sleep`` of this process (the pacing, the
seam's backoff) advances a clock instead of waiting, and the limit's token
buckets refill by that clock only.  So what a run proves depends on the
retry policy's decisions, never on how fast the machine is; and since the
retry loop's deadline runs on the real clock, which barely moves, the new
policy retries a throttle until it ends, while the old one (six tries,
about 0.8 s of waits) gave up inside it.  The jitter is seeded.
"""

from __future__ import annotations

import base64
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import pytest
from faults.http_proxy import FaultProxy, RateLimit, Rule
from support import StoreUnderTest, fresh_agent, location_of, make_store

from cloudstore.errors import UNCHANGED_WORDS, FailedError, from_reply
from cloudstore.generations import RetryingStore, RetryPolicy, Throttled, Transient, op_deadline, retry_transient
from cloudstore.protocol.service import Service
from cloudstore.runtime import metrics
from cloudstore.settings import open_backend
from cloudstore.store.keys import path_part
from cloudstore.store.space import Space

PATH = "skills/throttle/SKILL.md"
WRITES = 24  # at 2 a second: 12 s of virtual time, against a limit of 1 a second (burst 2)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class Proxied:
    """One backend behind a fresh proxy, and the drivers' handler on a fresh location through it."""

    backend: str  # "moto" or "gcs"
    proxy: FaultProxy
    store: StoreUnderTest
    agent: dict

    def service(self, policy: RetryPolicy = RetryPolicy()) -> Service:
        loc = location_of(self.store)
        return Service(Space(RetryingStore(open_backend(loc), policy), loc.prefix))

    def call(self, service: Service, op: str, **args: Any) -> dict:
        return service.answer({"op": op, "agent": self.agent, **args})

    def limit(self, **kw: Any) -> RateLimit:
        """The cloud's own limit for this backend: GCS's per object name, S3's per prefix."""
        kind = "s3-prefix" if self.backend == "moto" else "gcs-object"
        return self.proxy.limit(RateLimit(kind, **kw))

    def writes_of(self, key_end: str) -> dict[str, Any]:
        """Rule matcher for uploads of the object whose key ends with ``key_end`` (as test_sdk_faults)."""
        if self.backend == "moto":
            return {"method": "PUT", "path": re.escape(quote(key_end, safe="/~")) + r"(\?|$)"}
        return {"method": "POST", "path": r"^/upload/", "content": re.escape(key_end.encode()) + b'"'}


@pytest.fixture(params=("moto", "gcs"))
def throttled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxied]:
    base = make_store(request.param, request, tmp_path_factory)
    setting = "AWS_ENDPOINT_URL_S3" if request.param == "moto" else "STORAGE_EMULATOR_HOST"
    flavor = "s3" if request.param == "moto" else "gcs"
    with FaultProxy(base.env[setting], flavor=flavor) as proxy:
        store = replace(base, env=proxy.redirect(base.env))
        for key, value in store.env.items():
            monkeypatch.setenv(key, value)
        yield Proxied(request.param, proxy, store, fresh_agent())


class VirtualTime:
    """A clock that moves only when this process sleeps: ``time.sleep`` advances it and returns."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


# --------------------------------------------------------------------------
# The fault itself


def test_the_rate_limit_is_a_token_bucket_per_object_name_and_per_prefix() -> None:
    clock = VirtualTime()
    gcs = RateLimit("gcs-object", rate=1.0, burst=2.0, clock=clock)
    upload = "/upload/storage/v1/b/bk/o?uploadType=multipart&ifGenerationMatch=0"

    def body(name: str) -> bytes:
        return b'--x\r\ncontent-type: application/json\r\n\r\n{"name": "' + name.encode() + b'"}\r\n--x--'

    assert [gcs.admit("POST", upload, body("a/k")) for _ in range(3)] == [True, True, False]
    assert gcs.admit("POST", upload, body("a/other")), "another object has its own bucket"
    assert gcs.admit("GET", "/download/storage/v1/b/bk/o/a%2Fk?alt=media", b""), "reads are not limited"
    assert not gcs.admit("DELETE", "/storage/v1/b/bk/o/a%2Fk", b""), "a delete is a mutation of the same object"
    clock.sleep(1.0)
    assert [gcs.admit("POST", upload, body("a/k")) for _ in range(2)] == [True, False]
    assert (gcs.admitted, gcs.refused, gcs.refused_names) == (4, 3, {"a/k": 3})
    reply = gcs.reply("POST", upload, body("a/k"))
    assert reply.status == 429 and b'"reason": "rateLimitExceeded"' in reply.body
    assert b'"domain": "usageLimits"' in reply.body and b"bk/a/k exceeded the rate limit" in reply.body

    s3 = RateLimit("s3-prefix", rate=2.0, burst=1.0, retry_after=1.5, clock=clock)
    assert [s3.admit("PUT", "/bk/p/q/k1", b""), s3.admit("PUT", "/bk/p/q/k2?x=1", b"")] == [True, False]
    assert s3.admit("PUT", "/bk/p/other", b""), "another prefix"
    assert s3.admit("GET", "/bk/p/q/k1", b""), "reads are limited only with reads=True"
    slow = s3.reply("PUT", "/bk/p/q/k2", b"")
    assert slow.status == 503 and b"<Code>SlowDown</Code>" in slow.body
    assert ("Retry-After", "1.5") in slow.headers


def test_a_random_refusal_is_seeded() -> None:
    def refusals(seed: int) -> list[bool]:
        limit = RateLimit("s3-prefix", rate=1e9, burst=1e9, chance=0.3, seed=seed)
        return [limit.admit("PUT", f"/bk/p/k{i}", b"") for i in range(40)]

    assert refusals(7) == refusals(7) and False in refusals(7) and True in refusals(7)


# --------------------------------------------------------------------------
# The retry rule on its own


def failing(*kinds: Exception) -> tuple[list[int], Any]:
    """A call that raises each of ``kinds`` in turn, then answers "ok"; and the list of its tries."""
    tries: list[int] = []

    def call() -> str:
        tries.append(1)
        if len(tries) <= len(kinds):
            raise kinds[len(tries) - 1]
        return "ok"

    return tries, call


def test_throttles_spend_no_attempts_but_other_failures_do() -> None:
    quick = RetryPolicy(attempts=2, first_delay=0.0, max_delay=0.0, throttle_delay=0.0)
    tries, call = failing(*[Throttled("429")] * 10)
    assert retry_transient(quick, call) == "ok" and len(tries) == 11
    tries, call = failing(Transient("503"), Throttled("429"), Throttled("429"), Transient("reset"))
    with pytest.raises(Transient, match="reset"):
        retry_transient(quick, call)
    assert len(tries) == 4, "two unsure failures end it, the throttles between them spent nothing"


def test_retry_after_is_bounded_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    tries, call = failing(Throttled("429", retry_after=300.0))
    assert retry_transient(RetryPolicy(deadline=5.0), call) == "ok"
    assert len(waits) == 1 and 0 < waits[0] <= 5.0


def test_inside_an_op_window_every_retry_loop_shares_its_deadline() -> None:
    tries, call = failing(*[Throttled("429")] * 3)
    with op_deadline(0.0):
        with pytest.raises(Throttled):
            retry_transient(RetryPolicy(throttle_delay=0.0), call)
    assert len(tries) == 1, "no time is left of the op: one try, then the throttle is answered"


# --------------------------------------------------------------------------
# The retries outlast the throttle


def test_file_write_at_2_a_second_on_one_path_under_the_cloud_limit_never_fails(
        throttled: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer at twice the per-object limit: every write is a ``wrote``, none ``outcome unknown``.

    On eafe802 six quick tries gave up inside the throttle and answered
    ``outcome unknown`` although every try had been refused.
    """
    service = throttled.service()
    assert throttled.call(service, "file_write", path=PATH, data=b64(b"v1"), version=0)["reply"] == "wrote"
    clock = VirtualTime()
    monkeypatch.setattr(time, "sleep", clock.sleep)
    random.seed(26)  # the seam's jitter
    limit = throttled.limit(rate=1.0, burst=2.0, clock=clock)
    counter = metrics.REGISTRY.counters.get("lnk_store_throttled_total")
    before = counter.value(service.space.store.label, "file_write") if counter is not None else 0
    replies = []
    for n in range(2, WRITES + 2):
        due = (n - 2) * 0.5
        if clock.now < due:
            time.sleep(due - clock.now)  # virtual: the pacing of 2 writes a second
        replies.append(throttled.call(service, "file_write", path=PATH, data=b64(b"v%d" % n), version=n - 1))

    assert replies == [{"reply": "wrote", "version": n} for n in range(2, WRITES + 2)], [
        r for r in replies if r.get("reply") != "wrote"]
    assert limit.refused > 0, "the writer did meet the limit"
    assert counter is not None and counter.value(service.space.store.label, "file_write") - before == limit.refused
    got = throttled.call(service, "file_read", path=PATH)
    assert got["file"] == {"data": b64(b"v%d" % (WRITES + 1)), "version": WRITES + 1}


def test_a_write_refused_for_the_rate_until_the_deadline_says_nothing_was_changed(throttled: Proxied) -> None:
    """Every try of the op's only write answered 429 / SlowDown: certainly not applied, so not outcome unknown."""
    service = throttled.service(RetryPolicy(deadline=1.0))
    assert throttled.call(service, "file_write", path=PATH, data=b64(b"v1"), version=0)["reply"] == "wrote"
    throttled.limit(rate=0.0, burst=0.0)  # nothing passes

    reply = throttled.call(service, "file_write", path=PATH, data=b64(b"v2"), version=1)

    assert reply["reply"] == "error", reply
    assert reply["error"].endswith(UNCHANGED_WORDS) and "outcome unknown" not in reply["error"], reply
    assert isinstance(from_reply("file_write", reply["error"]), FailedError)
    throttled.proxy.clear()
    got = throttled.call(service, "file_read", path=PATH)
    assert got["file"] == {"data": b64(b"v1"), "version": 1}


def test_a_throttle_after_a_lost_reply_is_still_outcome_unknown(throttled: Proxied) -> None:
    """Only a write refused on *every* try is certainly unchanged: one lost reply before leaves it unknown."""
    service = throttled.service(RetryPolicy(deadline=1.0))
    assert throttled.call(service, "file_write", path=PATH, data=b64(b"v1"), version=0)["reply"] == "wrote"
    match = throttled.writes_of("f/" + path_part(PATH))
    throttled.proxy.add(Rule("reset", **match))  # not forwarded, but the client cannot know that
    throttled.proxy.add(Rule("fail", status=429 if throttled.backend == "gcs" else 503, times=10_000, **match,
                             reply_body=throttled.limit(rate=0.0, burst=0.0).reply("PUT", "/", b"").body,
                             reply_type="application/xml" if throttled.backend == "moto" else "application/json"))

    reply = throttled.call(service, "file_write", path=PATH, data=b64(b"v2"), version=1)

    assert reply["reply"] == "error" and "outcome unknown" in reply["error"], reply


def test_retry_after_is_honoured_within_the_deadline(throttled: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    """A throttle that says when to come back is asked again then, once, not in a burst of quick tries."""
    service = throttled.service()
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)  # virtual: the seam's waits, recorded
    match = throttled.writes_of("f/" + path_part(PATH))
    throttled.proxy.add(Rule("fail", status=429 if throttled.backend == "gcs" else 503, times=1, **match,
                             reply_body=throttled.limit(rate=0.0, burst=0.0).reply("PUT", "/", b"").body,
                             reply_type="application/xml" if throttled.backend == "moto" else "application/json",
                             reply_headers=(("Retry-After", "0.3"),)))
    throttled.proxy.limits.clear()

    reply = throttled.call(service, "file_write", path=PATH, data=b64(b"v1"), version=0)

    assert reply == {"reply": "wrote", "version": 1}
    tries = throttled.proxy.requests(**match)
    assert [t.status for t in tries] == [429 if throttled.backend == "gcs" else 503, 200]
    assert waits == [0.3], "the retry waited the Retry-After, no more, no less"


# --------------------------------------------------------------------------
# A 4xx refusal is never outcome unknown


def test_a_key_too_long_refusal_says_nothing_was_changed_and_names_the_limit(throttled: Proxied) -> None:
    """SeaweedFS / MinIO refuse a key part over 255 bytes with 400 KeyTooLongError; GCS a name over 1,024 bytes."""
    service = throttled.service()
    match = throttled.writes_of("f/" + path_part(PATH))
    if throttled.backend == "moto":
        body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>KeyTooLongError</Code>'
                b"<Message>Your key is too long</Message><RequestId>r</RequestId></Error>")
        kind = "application/xml"
    else:
        body = (b'{"error": {"code": 400, "message": "The maximum object length is 1024 characters, but got a '
                b'name with 1100 characters", "errors": [{"message": "The maximum object length is 1024 '
                b'characters, but got a name with 1100 characters", "domain": "global", "reason": "invalid"}]}}')
        kind = "application/json; charset=UTF-8"
    throttled.proxy.add(Rule("fail", status=400, times=10, reply_body=body, reply_type=kind, **match))

    reply = throttled.call(service, "file_write", path=PATH, data=b64(b"v1"), version=0)

    assert reply["reply"] == "error", reply
    assert "outcome unknown" not in reply["error"] and reply["error"].endswith(UNCHANGED_WORDS), reply
    assert "a path part is longer than the store accepts" in reply["error"], reply
    assert throttled.proxy.count(**match) == 1, "a refusal is not retried"


@pytest.mark.parametrize("status,code", [(403, "AccessDenied"), (404, "NoSuchBucket"), (405, "MethodNotAllowed"),
                                         (411, "MissingContentLength"), (413, "EntityTooLarge")])
def test_a_4xx_refusal_of_a_write_says_nothing_was_changed(throttled: Proxied, status: int, code: str) -> None:
    service = throttled.service()
    match = throttled.writes_of("f/" + path_part(PATH))
    if throttled.backend == "moto":
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>refused</Message><RequestId>r</RequestId></Error>").encode()
        kind = "application/xml"
    else:
        text = "The specified bucket does not exist." if code == "NoSuchBucket" else "refused"
        body = (f'{{"error": {{"code": {status}, "message": "{text}", '
                f'"errors": [{{"message": "{text}", "domain": "global", "reason": "x"}}]}}}}').encode()
        kind = "application/json; charset=UTF-8"
    throttled.proxy.add(Rule("fail", status=status, times=10, reply_body=body, reply_type=kind, **match))

    reply = throttled.call(service, "file_write", path=PATH, data=b64(b"v1"), version=0)

    assert reply["reply"] == "error", reply
    assert "outcome unknown" not in reply["error"] and reply["error"].endswith(UNCHANGED_WORDS), reply
    assert f"({status}" in reply["error"], reply


class Racing:
    """A backend in memory whose first write of each key is refused for its rate while another
    writer's write of that key lands (``rival``: what the other does then); records every request."""

    def __init__(self, rival: str) -> None:
        self.rival = rival
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.sent: list[tuple[str, str]] = []  # (op, key)
        self.refused: set[str] = set()
        self.versions = iter(range(1, 10**6))

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        self.sent.append(("get", key))
        got = self.objects.get(key)
        return None if got is None else (got[0] if head is None else got[0][:head], got[1])

    def put(self, key: str, raw: bytes, mode: Any) -> str:
        from cloudstore.generations import AlreadyExists, Create, PreconditionFailed, Update, frame

        self.sent.append(("put", key))
        if key not in self.refused:
            self.refused.add(key)
            if self.rival == "writes":  # another writer's write lands meanwhile
                self.objects[key] = (frame("f" * 32, b"theirs"), f"v{next(self.versions)}")
            raise Throttled("429 rateLimitExceeded")
        current = self.objects.get(key)
        if isinstance(mode, Create) and current is not None:
            raise AlreadyExists(key)
        if isinstance(mode, Update) and (current is None or current[1] != mode.version):
            raise PreconditionFailed(key)
        version = f"v{next(self.versions)}"
        self.objects[key] = (raw, version)
        return version

    def delete(self, key: str, version: str | None) -> None:
        raise AssertionError("not used")

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Any]:
        raise AssertionError("not used")

    def list_dirs(self, prefix: str) -> list[str]:
        raise AssertionError("not used")


QUICK = RetryPolicy(first_delay=0.0, max_delay=0.0, throttle_delay=0.0)


@pytest.mark.parametrize("kind", ["create", "update"])
def test_a_conditional_write_whose_precondition_fell_while_throttled_is_not_sent_again(kind: str) -> None:
    """Others write an object its throttle names: read before the retry, and a write that can only be
    refused is refused here, with no second write sent (on GCS even a refused write spends the second)."""
    from cloudstore.generations import AlreadyExists, Create, PreconditionFailed, Update

    backend = Racing(rival="writes")
    store = RetryingStore(backend, QUICK)  # type: ignore[arg-type]
    if kind == "update":
        backend.refused.add("k")
        mode: Any = Update(store.put("k", b"first", Create()).version or "")
        backend.refused.discard("k")
    else:
        mode = Create()
    backend.sent.clear()
    with pytest.raises(AlreadyExists if kind == "create" else PreconditionFailed):
        store.put("k", b"mine", mode)
    assert backend.sent == [("put", "k"), ("get", "k")], backend.sent
    assert store.writes == (1 if kind == "update" else 0), "a refused write is no change"


def test_a_throttled_write_whose_precondition_still_holds_is_sent_again() -> None:
    from cloudstore.generations import Create

    backend = Racing(rival="idle")
    store = RetryingStore(backend, QUICK)  # type: ignore[arg-type]
    written = store.put("k", b"mine", Create())
    assert backend.sent == [("put", "k"), ("get", "k"), ("put", "k")], backend.sent
    assert store.get("k") is not None and store.get("k").data == b"mine" and written.version  # type: ignore[union-attr]

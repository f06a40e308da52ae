"""The Python API (cloudstore.open, cloudstore.aio.open): wire.md's promises through typed methods.

The same test functions run on both flavours and on all three backends
(file, moto's S3 server, fake-gcs-server): the asyncio flavour is driven
through ``Blocking``, which runs each coroutine on one event loop kept in a
thread of its own, so a test reads the same either way.  What only the
asyncio flavour has (many coroutines of one loop racing) is tested on its
own, as is what the API adds: errors as exceptions, the lazy imports, and
S3 requests sent once on aiobotocore.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import quote

import pytest
from support import StoreUnderTest, location_of, service_of

import cloudstore
import cloudstore.aio
from cloudstore.api import Appended, Engine, File, FileWrite, Job, JobDay, Store, ThreadInfo, Took
from cloudstore.errors import (
    ClosedError,
    CloudstoreError,
    FailedError,
    LocationError,
    OutcomeUnknownError,
    RefusedError,
)

FLAVOURS = ("sync", "async")


# --------------------------------------------------------------------------
# Both flavours behind one face


class Loop:
    """An event loop running in a thread of its own, for the asyncio flavour's stores."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-api-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Blocking:
    """An asyncio store or agent seen through blocking calls: each method's coroutine run on ``loop``."""

    def __init__(self, target: Any, loop: Loop) -> None:
        self._target = target
        self._loop = loop

    def agent(self, owner: str | None, id: str) -> Blocking:
        return Blocking(self._target.agent(owner, id), self._loop)

    def close(self) -> None:
        self._loop.run(self._target.aclose())

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if not asyncio.iscoroutinefunction(method):
            return method  # a property (``id``, ``owner``)
        return lambda *args, **kwargs: self._loop.run(method(*args, **kwargs))


@pytest.fixture(scope="module")
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.stop()


def open_store(flavour: str, url: str, loop: Loop, **settings: Any) -> Any:
    """A store of ``flavour`` at ``url`` with blocking methods (the asyncio one through ``Blocking``)."""
    if flavour == "sync":
        return cloudstore.open(url, **settings)
    return Blocking(loop.run(_await(cloudstore.aio.open(url, **settings))), loop)


async def _await(opening: Any) -> Any:
    return await opening


@pytest.fixture(params=FLAVOURS)
def api(request: pytest.FixtureRequest, store_env: StoreUnderTest, loop: Loop) -> Iterator[Any]:
    """A store of each flavour on a fresh location of each backend (settings from the environment)."""
    opened = open_store(request.param, store_env.url, loop)
    yield opened
    opened.close()


def fresh(owner: str | None = "o") -> tuple[str | None, str]:
    return owner, f"agent-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------
# The families


def test_conversations(api: Any) -> None:
    me = api.agent(*fresh())
    event = {"seq": 1, "big": 2**80, "neg": -(2**64), "f": 0.1, "e": 1e300, "s": "é\u2028\x00",
             "n": None, "b": [True, False], "o": {"k": {"": []}}}
    assert me.append("t/1 é", event) == Appended(True, 1)
    assert me.append("t/1 é", {"seq": 1}) == Appended(False, 1), "a number is never given twice"
    assert me.append("t/1 é", {"seq": 3}).last == 1
    assert me.read("t/1 é") == [event]
    assert json.dumps(me.read("t/1 é")[0]) == json.dumps(event), "equal as JSON: integers exactly, same doubles"
    for seq in range(2, 21):  # past the packing points (8, 16): the after-reply work runs
        assert me.append("t/1 é", {"seq": seq}).done
    assert [e["seq"] for e in me.read("t/1 é", 15)] == list(range(15, 21))
    assert me.read("t/1 é")[0] == event
    assert me.last("t/1 é") == 20 and me.last("never") == 0
    assert me.append("a", {"seq": 1}).done
    assert me.threads() == [ThreadInfo("a", 1), ThreadInfo("t/1 é", 20)]

    for other in ((None, me.id), ("", me.id), ("x", me.id)):
        assert api.agent(*other).threads() == [], f"{other} is another agent"
    me.remove("t/1 é")
    assert me.last("t/1 é") == 0 and me.read("t/1 é") == []
    assert me.threads() == [ThreadInfo("a", 1)]
    assert me.append("t/1 é", {"seq": 1, "again": True}).done, "a removed conversation starts again at 1"


def test_leases(api: Any) -> None:
    me = api.agent(*fresh(None))
    assert me.take("t", "h1", 60_000) is Took.TOOK
    assert me.take("t", "h1", 60_000) == "took", "the holder's own lease is renewed"
    assert me.take("t", "h2", 60_000) is Took.HELD and not Took.HELD.won
    assert me.renew("t", "h2") is False
    assert me.renew("t", "h1") is True
    [lease] = me.leases(60_000)
    assert (lease.thread, lease.holder, lease.lapsed) == ("t", "h1", False)
    assert 1.7e9 < lease.started <= lease.renewed and isinstance(lease.renewed, float)
    assert me.leases(0)[0].lapsed is True
    assert me.take("t", "h2", 0) is Took.LAPSED, "renewed 0 ms or more ago: lapsed"
    assert me.renew("t", "h1") is False, "lost"
    me.end("t", "h1")  # not its lease: nothing
    assert [x.holder for x in me.leases(60_000)] == ["h2"]
    me.end("t", "h2")
    assert me.leases(60_000) == []
    assert me.take("t", "h3", 60_000) is Took.TOOK


def test_jobs(api: Any) -> None:
    me = api.agent(*fresh())
    assert me.job_next() is None and me.job_day() == JobDay(0, 0)
    mark = me.job_mark()
    spec = {"run": ["x", 1], "big": 2**70}
    me.job_put("waiting", Job("j1", spec, 100))
    me.job_put("waiting", {"id": "j2 é/..", "spec": None, "due": 50.5})
    assert me.job_mark() != mark
    assert me.job_get("waiting", "j1") == Job("j1", spec, 100)
    assert me.job_get("waiting", "nope") is None and me.job_get("firing", "j1") is None
    assert sorted(j.id for j in me.job_list("waiting")) == ["j1", "j2 é/.."]
    assert me.job_count("waiting") == 2 and me.job_count("ending") == 0
    assert me.job_next() == 50.5

    assert me.job_shift("j2 é/..", "waiting", "firing") is True
    assert me.job_shift("j2 é/..", "waiting", "firing") is False, "of two shifts exactly one found it"
    assert me.job_get("firing", "j2 é/..") == Job("j2 é/..", None, 50.5)
    assert me.job_next() == 100
    assert me.job_remove("firing", "j2 é/..") is True
    assert me.job_remove("firing", "j2 é/..") is False
    assert me.job_list("firing") == []
    me.job_set_day(19000, 7)
    assert me.job_day() == JobDay(19000, 7)
    assert api.agent(None, me.id).job_count("waiting") == 0
    assert api.agent(None, me.id).job_next() == 100, "job_next answers for the whole store"


def test_files(api: Any) -> None:
    me = api.agent(*fresh())
    every_byte = bytes(range(256)) * 3
    given: list[int] = []

    first = me.file_write("skills/greet/SKILL.md", every_byte, 0)
    assert first == FileWrite(True, 1) and not first.stale
    assert me.file_write("skills/greet/SKILL.md", b"late", 0) == FileWrite(False, 1), "stale: the version now"
    assert me.file_write("skills/greet/SKILL.md", b"two", 1) == FileWrite(True, 2)
    assert me.file_write("skills/greet/SKILL.md", b"three", 1).stale
    assert me.file_read("skills/greet/SKILL.md") == File(b"two", 2)
    given += [1, 2]
    given.append(me.file_append("skills/greet/SKILL.md", b"+more"))
    assert me.file_read("skills/greet/SKILL.md") == File(b"two+more", given[-1])
    assert me.file_write("instructions/main.md", b"", 0).wrote
    assert me.file_write("skills/a b/é", every_byte, 0).wrote
    assert me.file_read("skills/a b/é") == File(every_byte, 1)
    assert me.file_list("skills") == me.file_list("skills/") == ["skills/a b/é", "skills/greet/SKILL.md"]
    assert me.file_list("skills/greet/") == ["skills/greet/SKILL.md"] and me.file_list("instructions") == [
        "instructions/main.md"]

    assert me.file_remove("skills/greet/SKILL.md", 2) is False, "not at that version"
    assert me.file_remove("skills/greet/SKILL.md", given[-1]) is True
    assert me.file_read("skills/greet/SKILL.md") is None
    assert me.file_remove("skills/greet/SKILL.md", given[-1]) is False
    again = me.file_write("skills/greet/SKILL.md", b"new", 0)
    assert again.wrote and again.version not in given, "a version is never given twice, also after removal"
    given.append(again.version)
    appended = me.file_append("skills/new.txt", b"a")
    assert me.file_append("skills/new.txt", b"b") == appended + 1
    assert me.file_read("skills/new.txt") == File(b"ab", appended + 1)
    assert me.file_list("skills/none") == []
    assert api.agent("other", me.id).file_list("skills") == []


def test_tools(api: Any) -> None:
    me = api.agent(*fresh())
    assert me.tools_read("t") is None and me.tools_list() == {}
    assert me.tools_narrow("t", ["a", "b", "c", "a"]) == ["a", "b", "c"]
    assert me.tools_narrow("t", ("c", "x", "a")) == ["c", "a"], "only ever narrows, in the order given"
    assert me.tools_read("t") == ["c", "a"]
    assert me.append("t", {"seq": 1}).done
    me.remove("t")
    assert me.tools_list() == {"t": ["c", "a"]}, "a removed conversation keeps its narrowing"
    assert me.tools_narrow("u", []) == []
    assert me.tools_list() == {"t": ["c", "a"], "u": []}


# --------------------------------------------------------------------------
# Errors


def test_refusals_are_the_drivers_words(api: Any, store_env: StoreUnderTest) -> None:
    owner, name = fresh()
    me = api.agent(owner, name)
    driver = service_of(store_env)
    agent = {"id": name, "owner": owner}
    refused: list[tuple[Callable[[], Any], dict[str, Any]]] = [
        (lambda: me.append("t", {"seq": 0}), {"op": "append", "thread": "t", "event": {"seq": 0}}),
        (lambda: me.job_count("nowhere"), {"op": "job_count", "place": "nowhere"}),
        (lambda: me.file_read("../x"), {"op": "file_read", "path": "../x"}),
        (lambda: me.file_write("skills/x", b"x", -1), {"op": "file_write", "path": "skills/x", "data": "eA==",
                                                      "version": -1}),
        (lambda: me.take("t", "h", True), {"op": "take", "thread": "t", "holder": "h", "lapse_ms": True}),
        (lambda: me.tools_narrow("t", [""]), {"op": "tools_narrow", "thread": "t", "tools": [""]}),
        (lambda: me.request("nope"), {"op": "nope"}),
    ]
    for call, request in refused:
        with pytest.raises(RefusedError) as caught:
            call()
        assert caught.value.message == driver.answer({**request, "agent": agent})["error"]
        assert isinstance(caught.value, CloudstoreError) and isinstance(caught.value, ValueError)
        assert caught.value.changed is False and not caught.value.outcome_unknown
    with pytest.raises(RefusedError, match="JSON"):
        me.append("t", {"seq": 1, "x": float("nan")})
    with pytest.raises(RefusedError, match="bytes"):
        me.file_write("skills/x", "text", 0)  # type: ignore[arg-type]
    with pytest.raises(RefusedError, match="agent.id"):
        api.agent(None, "")
    assert me.last("t") == 0, "a refused request changed nothing"
    assert me.request("last", thread="t") == {"reply": "last", "last": 0}


def test_bad_locations() -> None:
    for url in ("ftp://x/y", "file://relative", "s3://UPPER", "gs://b/a/../c", "file:///"):
        with pytest.raises(LocationError):
            cloudstore.open(url)
    with pytest.raises(LocationError, match="s3:// stores only"):
        cloudstore.open("file:///tmp/x", endpoint_url="http://127.0.0.1:9")


class _StoreFails:
    """A plan for tests/faults' FaultyBackend: every put (or every get) fails before the store sees it."""

    def __init__(self, op: str) -> None:
        self.op = op

    def __call__(self, call: Any) -> Any:
        from faults.backend import Fault

        return Fault.FAIL_BEFORE if call.op == self.op else Fault.NONE


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_store_failures_say_whether_anything_changed(flavour: str, tmp_path: Any, loop: Loop) -> None:
    """A write that kept failing: outcome unknown; a read that kept failing: nothing was changed."""
    from faults.backend import FaultyBackend

    from cloudstore.local import LocalBackend

    location = location_of(StoreUnderTest("file", "", {"LNK_BUCKET_URL": f"file://{tmp_path}"}, ""))
    for op, error, call in (("put", OutcomeUnknownError, lambda a: a.append("t", {"seq": 1})),
                            ("get", FailedError, lambda a: a.last("t"))):
        engine = Engine(FaultyBackend(LocalBackend(location.bucket), plan=_StoreFails(op)), location)
        store: Any = Store(engine)
        if flavour == "async":
            async def make(engine: Engine = engine) -> Any:
                return cloudstore.aio.AsyncStore(engine, ThreadPoolExecutor(2), AsyncExitStack(),
                                                 asyncio.get_running_loop())
            store = Blocking(loop.run(make()), loop)
        with pytest.raises(error) as caught:
            call(store.agent("o", "a"))
        assert "the store kept failing" in caught.value.message
        assert caught.value.outcome_unknown is (error is OutcomeUnknownError)
        store.close()
        with pytest.raises(ClosedError):
            store.agent("o", "a").last("t")


# --------------------------------------------------------------------------
# Concurrency


def test_threads_racing_on_one_store(api: Any) -> None:
    """Calls from many threads at once: of racing creates one wins, of racing takes one holds."""
    me = api.agent(*fresh())
    with ThreadPoolExecutor(12) as pool:
        writes = list(pool.map(lambda i: me.file_write("skills/race", b"%d" % i, 0), range(12)))
        takes = list(pool.map(lambda i: me.take("t", f"h{i}", 60_000), range(12)))
    assert sum(w.wrote for w in writes) == 1 and {w.version for w in writes} == {1}
    assert sorted(takes) == [Took.HELD] * 11 + [Took.TOOK]


def test_a_call_never_waits_for_another_calls_packing(store_env: StoreUnderTest,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``concurrency=1``, the one answerer packing after the 32nd append's reply is not answering:
    the next call gets an answerer of its own and is answered while that packing is still held.  The
    answerers made stay within twice the concurrency, and closing waits for the packing."""
    from cloudstore.store.conversations import Conversations

    packing, release = threading.Event(), threading.Event()
    original = Conversations._pack

    def held(self: Conversations, *args: Any) -> None:
        packing.set()
        assert release.wait(30), "the test never let the packing go"
        original(self, *args)

    monkeypatch.setattr(Conversations, "_pack", held)
    store = cloudstore.open(store_env.url, concurrency=1)
    me = store.agent(*fresh())
    for seq in range(1, 33):  # the 32nd leaves a block of 32 to pack after its reply
        assert me.append("t", {"seq": seq}).done
    assert packing.wait(30)
    answered = ThreadPoolExecutor(1).submit(lambda: (me.last("t"), me.append("t", {"seq": 33}).done))
    try:
        assert answered.result(timeout=30) == (32, True), "a call waited for another call's after-work"
        assert not release.is_set() and len(store._engine._all) == 2
    finally:
        release.set()
    assert [e["seq"] for e in me.read("t")] == list(range(1, 34))
    store.close()


def test_async_many_coroutines_in_one_loop(store_env: StoreUnderTest) -> None:
    """50 appenders of one conversation in one event loop get 50 distinct consecutive numbers;
    20 racing creates of one file, exactly one wins; 10 agents at once stay apart.

    Every appender retries until it wins a number, so n of them make about n^2/2
    appends: on moto (one Python process answering every request, ~6 ms each on this
    machine) 30 appenders keep the test to a few seconds; SeaweedFS, whose conditional writes
    go through its filer, the same.
    """
    appenders = 30 if store_env.backend in ("moto", "seaweedfs") else 50

    async def main() -> None:
        async with cloudstore.aio.open(store_env.url) as store:
            me = store.agent(*fresh())

            async def appender(i: int) -> int:
                seq = 1
                while True:
                    got = await me.append("t", {"seq": seq, "by": i})
                    if got.done:
                        return seq
                    seq = got.last + 1

            numbers = await asyncio.gather(*(appender(i) for i in range(appenders)))
            assert sorted(numbers) == list(range(1, appenders + 1))
            events = await me.read("t")
            assert [e["seq"] for e in events] == list(range(1, appenders + 1))
            assert {e["by"]: e["seq"] for e in events} == dict(enumerate(numbers))

            writes = await asyncio.gather(*(me.file_write("skills/one", b"%d" % i, 0) for i in range(20)))
            assert sum(w.wrote for w in writes) == 1 and all(w.version == 1 for w in writes)
            [winner] = [i for i, w in enumerate(writes) if w.wrote]
            assert await me.file_read("skills/one") == File(b"%d" % winner, 1)

            agents = [store.agent("o", f"{me.id}-{i}") for i in range(10)]
            await asyncio.gather(*(a.append("t", {"seq": 1, "me": i}) for i, a in enumerate(agents)))
            reads = await asyncio.gather(*(a.read("t") for a in agents))
            assert reads == [[{"seq": 1, "me": i}] for i in range(10)]

    asyncio.run(main())


# --------------------------------------------------------------------------
# S3 requests are sent once, on boto3 and on aiobotocore alike


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_s3_write_whose_reply_was_lost_is_sent_once_and_wrote(flavour: str, request: pytest.FixtureRequest,
                                                              monkeypatch: pytest.MonkeyPatch, loop: Loop) -> None:
    """A conditional PUT whose reply the proxy loses after moto applied it: the seam's retry finds its
    own write (``wrote``); no third send (aiohttp re-sends a PUT whose connection dropped unless stopped)."""
    from faults.http_proxy import FaultProxy, Rule

    from cloudstore.store.keys import path_part

    moto = request.getfixturevalue("moto_server")
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    url = f"s3://{moto.bucket}/{uuid.uuid4().hex[:12]}"
    with FaultProxy(moto.env["AWS_ENDPOINT_URL_S3"], flavor="s3") as proxy:
        store = open_store(flavour, url, loop, endpoint_url=proxy.url)  # the keyword beats the environment
        try:
            me = store.agent(*fresh())
            assert me.file_write("skills/warm", b"w", 0).wrote  # the connection pool is warm: keep-alive
            match = {"method": "PUT", "path": re.escape(quote("f/" + path_part("skills/lost"), safe="/~")) + r"(\?|$)"}
            lose = proxy.add(Rule("lose_reply", **match))
            assert me.file_write("skills/lost", b"x" * 5000, 0) == FileWrite(True, 1)
            assert lose.fired == 1
            assert proxy.count(**match) == 2, proxy.requests()
            assert me.file_read("skills/lost") == File(b"x" * 5000, 1)
        finally:
            store.close()


# --------------------------------------------------------------------------
# Imports


def test_import_cloudstore_imports_no_cloud_sdk(tmp_path: Any) -> None:
    """``import cloudstore`` (and the API modules) load no SDK; a store loads its own kind's only."""
    sdks = ("boto3", "botocore", "aiobotocore", "aiohttp", "google.cloud", "google.auth")
    script = f"""
import sys
SDKS = {sdks!r}
loaded = lambda: sorted(m for m in sys.modules if m.startswith(SDKS))
import cloudstore
assert loaded() == [], loaded()
assert callable(cloudstore.open) and cloudstore.aio.open
import cloudstore.api, cloudstore.aio, cloudstore.errors
assert loaded() == [], loaded()
with cloudstore.open("file://{tmp_path}") as store:
    assert store.agent("o", "a").last("t") == 0
assert loaded() == [], loaded()
store = cloudstore.open("s3://some-bucket", endpoint_url="http://127.0.0.1:9", region_name="us-east-1")
assert "boto3" in sys.modules and not any(m.startswith(("google.cloud", "aiobotocore")) for m in sys.modules)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_data_travels_as_base64_the_driver_checks() -> None:
    """The API encodes bytes itself: what it sends is canonical standard base64 (never refused for it)."""
    from cloudstore.api import ops

    call = ops.file_write("skills/x", bytes(range(256)), 0)
    assert base64.b64decode(call.args["data"], validate=True) == bytes(range(256))

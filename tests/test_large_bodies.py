"""Issue 41, finding 7: a large body takes the one request path the preconditions (and the server check) cover.

google-cloud-storage sends a body over 8 MiB as a resumable upload: a
session request, then the data, two requests.  fake-gcs-server checks no
``ifGenerationMatch`` on that path, so at c81d270 two ``lnk-gcs serve``
processes appending seq 2 with 9,000,000-byte events, released together, were
both told ``done`` (4 rounds of 4; at 100 bytes exactly one).  Every body now
goes in ONE request (multipart), at any size.

* The fact first, with the raw SDK: a 9 MB create at generation 0 of an
  object that exists is accepted by fake-gcs-server (the resumable path),
  a 1 MiB one refused (412).  Should a release of fake-gcs-server check it
  there too, that test fails, and the race below would prove nothing.
* The race: 4 rounds, exactly one ``done`` and one ``taken`` each, and the
  conversation reads back with the winner's event alone.
* The path: behind the fault proxy, an append of a 9,000,000-byte event
  reaches the server as ONE request carrying the whole body, a multipart
  upload, and no request of the op is a resumable one.

Requests are counted at the proxy; nothing is timed.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from faults.http_proxy import FaultProxy
from support import make_store, race, serving

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: An event body past the SDK's 8 MiB (8,388,608 bytes) multipart limit.
BIG = 9_000_000
ROUNDS = 4


def big_event(seq: int, by: str) -> dict[str, Any]:
    return {"seq": seq, "by": by, "pad": "x" * BIG}


def test_fake_gcs_server_ignores_generation_match_on_a_resumable_upload(gcs_server,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The fact the race rests on, with the raw SDK: over 8 MiB (resumable) the precondition is ignored."""
    from google.api_core import exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import blob as sdk_blob

    # The SDK's own limit, whatever a driver's backend made of it in this process.
    monkeypatch.setattr(sdk_blob, "_MAX_MULTIPART_SIZE", 8 * 1024 * 1024)
    with FaultProxy(gcs_server.env["STORAGE_EMULATOR_HOST"], flavor="gcs") as proxy:
        client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": proxy.url})
        bucket = client.bucket(gcs_server.bucket)
        name = f"large-{uuid.uuid4().hex[:8]}"
        bucket.blob(name).upload_from_string(b"first", if_generation_match=0)
        with pytest.raises(exceptions.PreconditionFailed):
            bucket.blob(name).upload_from_string(b"s" * (1 << 20), if_generation_match=0)  # one request: refused
        proxy.clear()
        # Resumable (a session, then the data): accepted, though the object exists.  If this raises
        # PreconditionFailed, fake-gcs-server checks the resumable path now and the race below proves nothing.
        bucket.blob(name).upload_from_string(b"b" * BIG, if_generation_match=0)
        uploads = [(s.method, s.target.partition("?")[2][:40], s.received) for s in proxy.requests()]
        assert bucket.blob(name).download_as_bytes()[:1] == b"b"
    assert [u[0] for u in uploads] == ["POST", "PUT"] and "uploadType=resumable" in uploads[0][1], uploads
    assert uploads[1][2] == BIG, uploads


def test_two_appenders_of_a_large_event_one_wins(request: pytest.FixtureRequest,
                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """At c81d270 both were told `done` in every round (the second event overwrote the first)."""
    store = make_store("gcs", request, tmp_path_factory)
    agent = {"id": f"agent-{uuid.uuid4().hex[:10]}", "owner": "o"}
    outcomes = []
    with serving(store, 2) as procs:
        for n in range(ROUNDS):
            thread = f"big-{n}-{uuid.uuid4().hex[:6]}"
            first = procs[0].request({"op": "append", "agent": agent, "thread": thread,
                                      "event": {"seq": 1, "small": True}}, timeout=60)
            assert first == {"reply": "done"}, first
            events = [big_event(2, f"p{i}") for i in range(2)]
            replies = race(procs, lambda i, thread=thread, events=events: {
                "op": "append", "agent": agent, "thread": thread, "event": events[i]})
            outcomes.append(replies)
            if sorted(map(str, replies)) != sorted(map(str, [{"reply": "done"}, {"reply": "taken", "last": 2}])):
                continue
            winner = replies.index({"reply": "done"})
            read = procs[1 - winner].request({"op": "read", "agent": agent, "thread": thread}, timeout=120)
            assert read.get("events") == [{"seq": 1, "small": True}, events[winner]], \
                f"round {n}: not the winner's event alone"
    both = sum(r == [{"reply": "done"}] * 2 for r in outcomes)
    assert all(sorted(map(str, r)) == sorted(map(str, [{"reply": "done"}, {"reply": "taken", "last": 2}]))
               for r in outcomes), f"{both} of {ROUNDS} rounds told both appenders done: {outcomes}"


def test_a_large_append_is_one_request(request: pytest.FixtureRequest,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """The 9,000,000-byte event's write reaches the server as one multipart upload; nothing resumable."""
    store = make_store("gcs", request, tmp_path_factory)
    with FaultProxy(store.env["STORAGE_EMULATOR_HOST"], flavor="gcs") as proxy:
        target = type(store)(store.backend, store.program, proxy.redirect(store.env), store.url)
        agent = {"id": f"agent-{uuid.uuid4().hex[:10]}", "owner": "o"}
        with serving(target) as (proc,):
            assert proc.request({"op": "last", "agent": agent, "thread": "big"}, timeout=60)["reply"] == "last"
            proxy.clear()  # the process's first op (its server check, its record) behind it: only the append
            reply = proc.request({"op": "append", "agent": agent, "thread": "big", "event": big_event(1, "p")},
                                 timeout=120)
            assert reply == {"reply": "done"}, reply
        seen = proxy.requests()
        carrying = [s for s in seen if s.received >= BIG]
        shown = [(s.method, s.target.split("?")[0][-50:], s.target.partition("?")[2][:60], s.received) for s in seen]
        assert not [s for s in seen if "uploadType=resumable" in s.target or s.method == "PUT"], shown
        assert len(carrying) == 1, shown
        assert carrying[0].method == "POST" and "uploadType=multipart" in carrying[0].target, shown
        assert "ifGenerationMatch=" in carrying[0].target, shown  # conditional, on the path that checks it

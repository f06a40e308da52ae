"""Issue 26 item 7: appends cost at most 1.1 requests on average, packing included, and packing loses nothing.

Counted at the store seam (``RetryingStore.requests``: every request the
drivers make, retries included), in a ``Service`` that leaves packing for
after each reply as ``serve`` does (``space.deferred``, run after the op).
Reading back is from services that remember nothing (a process restart),
and from a conversation two services append to at once (two processes).
No timing is asserted.
"""

from __future__ import annotations

import threading
from typing import Any

from support import fresh_agent, service_of

from cloudstore.protocol.service import Service

EVENTS = 256


def serve_like(store_env: Any) -> Service:
    """A handler that packs after the reply, as ``serve`` does (``Answerer``)."""
    service = service_of(store_env)
    service.space.deferred = []
    return service


def call(service: Service, request: dict) -> dict:
    reply = service.answer(request)
    service.space.run_deferred()
    return reply


def append_all(service: Service, agent: dict, thread: str, events: int) -> list[dict]:
    sent = [{"seq": n, "text": f"{thread}-{n}"} for n in range(1, events + 1)]
    for event in sent:
        assert call(service, {"op": "append", "agent": agent, "thread": thread, "event": event}) == {"reply": "done"}
    return sent


def test_appends_cost_at_most_one_and_a_tenth_request_each_packing_included(store_env: Any) -> None:
    service = serve_like(store_env)
    agent = fresh_agent()
    before = service.space.store.requests
    append_all(service, agent, "t", EVENTS)
    spent = service.space.store.requests - before
    assert spent <= 1.1 * EVENTS, f"{spent} requests for {EVENTS} appends ({spent / EVENTS:.3f} each)"


def test_eight_services_of_one_process_share_what_they_appended(store_env: Any) -> None:
    """The Python API's pool: any of its services may take a conversation's next append, and none
    reads the head again for it (one memory per backend, as one serve process has)."""
    from cloudstore.generations import RetryingStore
    from cloudstore.store.space import Space

    first = serve_like(store_env)
    backend = first.space.store.backend
    services = [first] + [Service(Space(RetryingStore(backend), first.space.root)) for _ in range(7)]
    for s in services[1:]:
        s.space.deferred = []
    agent = fresh_agent()
    counted = [s.space.store.requests for s in services]
    for n in range(1, EVENTS + 1):
        s = services[n % len(services)]
        event = {"seq": n, "text": f"e{n}"}
        assert call(s, {"op": "append", "agent": agent, "thread": "t", "event": event}) == {"reply": "done"}
    spent = sum(s.space.store.requests - c for s, c in zip(services, counted, strict=True))
    assert spent <= 1.1 * EVENTS, f"{spent} requests for {EVENTS} appends over 8 services"


def test_every_event_reads_back_once_after_packing_and_a_restart(store_env: Any) -> None:
    writer = serve_like(store_env)
    agent = fresh_agent()
    sent = append_all(writer, agent, "t", 2 * EVENTS + 5)
    for reader in (writer, serve_like(store_env)):  # the writer's own memory, and a process that has none
        for first in (1, 2, 31, 32, 33, 100, 257, len(sent) - 4, len(sent)):
            got = call(reader, {"op": "read", "agent": agent, "thread": "t", "first": first})
            assert got == {"reply": "events", "events": sent[first - 1:]}, first
    again = serve_like(store_env)  # a restarted writer appends on, then a third process reads all
    more = {"seq": len(sent) + 1, "text": "after the restart"}
    assert call(again, {"op": "append", "agent": agent, "thread": "t", "event": more}) == {"reply": "done"}
    got = call(serve_like(store_env), {"op": "read", "agent": agent, "thread": "t", "first": 1})
    assert got == {"reply": "events", "events": [*sent, more]}


def test_two_processes_appending_at_once_read_back_each_event_once(store_env: Any) -> None:
    agent = fresh_agent()
    total = 2 * EVENTS
    won: dict[int, str] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        service = serve_like(store_env)
        seq = 1
        try:
            while seq <= total:
                event = {"seq": seq, "text": f"{name}-{seq}"}
                reply = call(service, {"op": "append", "agent": agent, "thread": "t", "event": event})
                if reply == {"reply": "done"}:
                    with lock:
                        assert seq not in won, f"{seq} won twice"
                        won[seq] = event["text"]
                    seq += 1
                else:
                    assert reply["reply"] == "taken", reply
                    seq = reply["last"] + 1
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(won) == list(range(1, total + 1))
    for reader in (serve_like(store_env), serve_like(store_env)):
        got = call(reader, {"op": "read", "agent": agent, "thread": "t", "first": 1})
        assert got["reply"] == "events"
        assert [e["seq"] for e in got["events"]] == list(range(1, total + 1))
        assert [e["text"] for e in got["events"]] == [won[n] for n in range(1, total + 1)]

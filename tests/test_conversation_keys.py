"""Issue 13: a conversation's newest event is its first key, read beside the head, in one round trip.

``last`` and the start of every ``read`` send two requests at once: the
head's read and a one-key listing of the conversation (keys.py: events sort
newest first).  These tests hold the three things that design must keep:

* the two requests really are in flight together (a barrier of two in the
  backend: sent one after the other, the first would wait alone);
* whichever the store serves first, and whatever another machine does
  between them (a remove, then new appends), a read answers the
  conversation as it stood at one moment of the read;
* conversations 0.3.0 began (events oldest first, ``e<epoch>/ev/<seq>``,
  written here key by key as 0.3.0 wrote them) are still read, appended to,
  removed and begun again.

Each runs on the local folder, moto and fake-gcs-server.  Orders are set by
hooks in a backend wrapper, never by time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from faults.machines import Machine, Machines
from support import location_of

from cloudstore.generations import Create
from cloudstore.settings import open_backend
from cloudstore.store.keys import AgentKeys

THREAD = "t-issue-13"
BARRIER_SECONDS = 20.0


def keys_of(machine: Machine) -> AgentKeys:
    return AgentKeys(machine.space.root, machine.agent["owner"], machine.agent["id"])


def listed(store: Any, machine: Machine) -> list[str]:
    """Every key below the conversation, straight from the store."""
    return [item.key for item in open_backend(location_of(store)).list(keys_of(machine).thread(THREAD), None, None)]


def is_head(key: str, machine: Machine) -> bool:
    return key == keys_of(machine).lease(THREAD)


def is_first_key_listing(prefix: str, limit: int | None, machine: Machine) -> bool:
    return prefix == keys_of(machine).thread(THREAD) and limit == 1


class Hooked:
    """A backend that runs ``hook(op, key, limit)`` before each request and ``after(op, key)`` after it."""

    def __init__(self, inner: Any, hook: Callable[[str, str, int | None], None],
                 after: Callable[[str, str], None] = lambda op, key: None) -> None:
        self.inner = inner
        self.hook = hook
        self.after = after

    def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self.hook("get", key, None)
        try:
            return self.inner.get(key, *args, **kwargs)
        finally:
            self.after("get", key)

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Any:
        self.hook("list", prefix, limit)
        try:
            return list(self.inner.list(prefix, start_after, limit))
        finally:
            self.after("list", prefix)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def hook_backend(machine: Machine, hook: Callable[[str, str, int | None], None],
                 after: Callable[[str, str], None] = lambda op, key: None) -> None:
    """Put ``Hooked`` between the machine's faulty view and the real store."""
    machine.backend.inner = Hooked(machine.backend.inner, hook, after)


def event(seq: int, who: str = "old") -> dict:
    return {"seq": seq, "who": who, "text": f"{who} event {seq}"}


def append_all(machine: Machine, events: list[dict], first: int = 1) -> None:
    for seq, ev in enumerate(events, start=first):
        assert machine.ok("append", thread=THREAD, event=ev) == {"reply": "done"}, (machine.name, seq)


# --------------------------------------------------------------------------
# In flight together


@pytest.mark.parametrize("op", ["last", "read"])
def test_the_head_and_the_newest_key_are_asked_for_at_once(machines: Machines, op: str) -> None:
    writer, reader = machines("writer"), machines("reader")
    append_all(writer, [event(s) for s in range(1, 8)])
    barrier = threading.Barrier(2, timeout=BARRIER_SECONDS)
    met: list[str] = []

    def hook(kind: str, key: str, limit: int | None) -> None:
        if (kind == "get" and is_head(key, reader)) or (kind == "list" and is_first_key_listing(key, limit, reader)):
            try:
                barrier.wait()
                met.append(kind)
            except threading.BrokenBarrierError:
                met.append(f"{kind} alone")

    hook_backend(reader, hook)
    reply = reader.ok(op, thread=THREAD, **({"first": 1} if op == "read" else {}))
    if op == "last":
        assert reply == {"reply": "last", "last": 7}
    else:
        assert [e["seq"] for e in reply["events"]] == list(range(1, 8))
    assert sorted(met) == ["get", "list"], (
        f"the head's read and the one-key listing must be in flight at once (one round trip); got {met}")


# --------------------------------------------------------------------------
# Another machine between the two requests


@pytest.mark.parametrize("first", ["head", "listing"])
def test_a_remove_and_new_appends_between_the_head_and_the_listing(machines: Machines, first: str) -> None:
    """Whichever request the store serves first, the read is the conversation at one moment of it."""
    a, b = machines("A"), machines("B")
    old = [event(s) for s in range(1, 6)]
    new = [event(s, "new") for s in range(1, 3)]
    append_all(b, old)
    served_first = threading.Event()
    ran_between = [False]

    def between() -> None:
        ran_between[0] = True
        assert b.ok("remove", thread=THREAD) == {"reply": "done"}
        append_all(b, new)

    def ours(kind: str, key: str, limit: int | None) -> bool:
        return (kind == "get" and is_head(key, a)) or (kind == "list" and is_first_key_listing(key, limit, a))

    def is_first(kind: str) -> bool:
        return (kind == "get") == (first == "head")

    def hook(kind: str, key: str, limit: int | None) -> None:
        if ours(kind, key, limit) and not is_first(kind) and not ran_between[0]:
            assert served_first.wait(BARRIER_SECONDS), "the other request never came"
            between()

    def after(kind: str, key: str) -> None:
        if kind == "get" and is_head(key, a) and first == "head":
            served_first.set()
        if kind == "list" and key == keys_of(a).thread(THREAD) and first == "listing":
            served_first.set()

    hook_backend(a, hook, after)
    got = a.ok("read", thread=THREAD, first=1)["events"]
    assert ran_between[0], "B's remove never ran between A's two requests"
    moments = [old] + [new[:n] for n in range(len(new) + 1)]
    assert got in moments, f"A's read must be the conversation at one moment (old, or new at some length); got {got}"
    # And what A now appends lands after what the store holds, or is told taken: never lost, never beside old ones.
    last = a.ok("last", thread=THREAD)["last"]
    assert last == len(new)
    assert a.ok("append", thread=THREAD, event=event(last + 1, "A")) == {"reply": "done"}
    assert b.ok("read", thread=THREAD, first=1)["events"] == new + [event(last + 1, "A")]


# --------------------------------------------------------------------------
# Conversations 0.3.0 began


def write_v03(store: Any, machine: Machine, events: list[dict], epoch: int = 0) -> None:
    """Events as 0.3.0 wrote them: ``c/<thread>/e<epoch, 10 digits>/ev/<seq, 20 digits>``, compact JSON."""
    backend = open_backend(location_of(store))
    base = keys_of(machine).thread(THREAD)
    for seq, ev in enumerate(events, start=1):
        raw = json.dumps(ev, separators=(",", ":")).encode("ascii")
        backend.put(f"{base}e{epoch:010d}/ev/{seq:020d}", raw, Create())


def test_a_conversation_0_3_0_began_is_read_appended_to_removed_and_begun_again(machines: Machines) -> None:
    a, b = machines("A"), machines("B")
    old = [event(s) for s in range(1, 41)]
    write_v03(machines.store, a, old)
    assert a.ok("last", thread=THREAD) == {"reply": "last", "last": 40}
    assert a.ok("read", thread=THREAD, first=1)["events"] == old
    assert a.ok("read", thread=THREAD, first=38)["events"] == old[37:]
    more = [event(s, "new") for s in range(41, 70)]  # crosses packing boundaries (blocks of 0.3.0's layout)
    append_all(a, more, first=41)
    assert a("append", thread=THREAD, event=event(41, "late")) == {"reply": "taken", "last": 69}
    for reader in (a, b):  # b: a fresh process, nothing remembered
        assert reader.ok("last", thread=THREAD) == {"reply": "last", "last": 69}
        assert reader.ok("read", thread=THREAD, first=1)["events"] == old + more
        assert reader.ok("read", thread=THREAD, first=60)["events"] == more[19:]
    kept = listed(machines.store, a)
    assert all("/e0000000000/" in key for key in kept), f"0.3.0's conversation keeps its layout: {kept}"

    assert b.ok("remove", thread=THREAD) == {"reply": "done"}
    # A still remembers 69 as the last: its next append must meet the old epoch's fence, in 0.3.0's layout.
    assert a("append", thread=THREAD, event=event(70, "after")) == {"reply": "taken", "last": 0}
    for reader in (a, b):
        assert reader.ok("last", thread=THREAD) == {"reply": "last", "last": 0}
        assert reader.ok("read", thread=THREAD, first=1)["events"] == []
    again = [event(s, "again") for s in range(1, 4)]
    append_all(a, again)
    assert b("append", thread=THREAD, event=event(1, "late")) == {"reply": "taken", "last": 3}
    for reader in (a, b):
        assert reader.ok("read", thread=THREAD, first=1)["events"] == again
    begun = [key for key in listed(machines.store, a) if "/e0000000000/" not in key]
    assert begun and all("/d" in key or "/p" in key for key in begun), (
        f"an epoch begun after 0.3.0's is in the new layout: {begun}")

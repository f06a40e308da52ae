"""Runners on one machine tell each other who they are (``wake.Presence``).

A presence names a runner and the agents it serves.  It goes where a job's
name goes and nowhere else: to the own sockets (``0600``) of our user's
runners in a folder the sender trusts, never to another user's socket, and
it is believed only from a sender the kernel says is our user or root.  It
is not a "look now": a runner that hears one polls no sooner for it.
Datagrams of other shapes, or a presence of the wrong types, are not
presences.  The cases with another local user need root (CI runs as root).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_wake_security import STRANGER, as_stranger, fork, reap, stranger_receives

from cloudstore.runtime.wake import (
    HOLDER_MAX,
    NAME_MAX,
    Presence,
    WakeListener,
    decode_presence,
    encode_name,
    encode_presences,
)

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user (CI runs as root)")
AGENTS = [{"owner": "o", "id": "a"}, {"owner": None, "id": "b"}]


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder every user may reach (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(prefix="lnk-wake-nearby-") as top:
        os.chmod(top, 0o755)
        path = Path(top) / "wake"
        path.mkdir(mode=0o755)
        yield path


def test_a_presence_says_who_and_whose_jobs_in_datagrams_that_fit() -> None:
    [one] = encode_presences("host-a", AGENTS, ask=True)
    assert decode_presence(one) == Presence("host-a", (("o", "a"), (None, "b")), ask=True, gone=False)
    many = [{"owner": "o", "id": f"agent-{n:04d}"} for n in range(500)]
    datagrams = encode_presences("host-a", many)
    assert len(datagrams) > 1 and all(len(d) <= NAME_MAX for d in datagrams)
    said = [pair for d in datagrams for pair in decode_presence(d).agents]  # type: ignore[union-attr]
    assert said == [("o", a["id"]) for a in many], "every agent said, in order, once"
    assert encode_presences("x" * (HOLDER_MAX + 1), AGENTS) == [], "a name too long is never sent"
    assert decode_presence(encode_presences("host-a", [])[0]) == Presence("host-a", ())


@pytest.mark.parametrize("value", [
    {"runner": "", "agents": [], "ask": False, "gone": False},
    {"runner": 7, "agents": [], "ask": False, "gone": False},
    {"runner": "x" * (HOLDER_MAX + 1), "agents": [], "ask": False, "gone": False},
    {"runner": "b", "agents": {}, "ask": False, "gone": False},
    {"runner": "b", "agents": [{"owner": 1, "id": "a"}], "ask": False, "gone": False},
    {"runner": "b", "agents": [{"owner": "o"}], "ask": False, "gone": False},
    {"runner": "b", "agents": [], "ask": 1, "gone": False},
    {"runner": "b", "agents": [], "ask": False},
    [1, 2],
])
def test_what_is_not_a_presence_this_module_sends_is_none(value: object) -> None:
    assert decode_presence(json.dumps(value).encode()) is None
    assert decode_presence(b"\xff{") is None
    assert decode_presence(encode_name({"owner": "o", "id": "a"}, "j", 1.0)) is None, "a name is not a presence"


def test_a_presence_reaches_the_other_runners_here_and_is_no_look_now(folder: Path) -> None:
    a, b = WakeListener(str(folder)), WakeListener(str(folder))
    try:
        assert a.listening and b.listening, (a.refused, b.refused)
        assert a.announce(encode_presences("host-a", AGENTS, ask=True)) == 1, "b, not a itself"
        assert b.wait(5.0)
        assert b.take_presences() == [Presence("host-a", (("o", "a"), (None, "b")), ask=True)]
        assert b.take_names() == ([], False), "nothing in waiting changed: no poll for it"
        a.wait(0.2)  # b's start woke a once ("look now" to the live ones): harmless
        assert a.take_presences() == [], "a runner does not hear itself"
    finally:
        a.close()
        b.close()


def test_a_runner_that_listens_for_nothing_says_nothing(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("not a folder")
    a = WakeListener(str(target))
    assert not a.listening
    assert a.announce(encode_presences("host-a", AGENTS)) == 0


@as_root
def test_another_users_socket_hears_no_presence(folder: Path) -> None:
    """In a shared sticky folder (as /tmp) another user's socket is sent nothing at all: a presence
    names our agents, and an empty datagram would only be a look now for nothing."""
    folder.chmod(0o1777)
    a = WakeListener(str(folder))
    try:
        got = stranger_receives(folder / "stranger.own.sock", None,
                                lambda: a.announce(encode_presences("host-a", AGENTS)))
        assert got == [], f"another user's socket heard: {got}"
    finally:
        a.close()


@as_root
def test_a_presence_another_user_sends_is_not_believed(folder: Path) -> None:
    """Anyone may write to a runner's ``0622`` socket: what a stranger sends there is a look now at
    most, never a runner this one would leave its jobs to."""
    folder.chmod(0o1777)
    a = WakeListener(str(folder))
    try:
        assert a.path is not None
        path = a.path
        forged = encode_presences("host-b", AGENTS)[0]

        def send() -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(forged, path)

        assert reap(fork(as_stranger(send))) == 0
        assert a.wait(5.0), "a stranger's datagram may still bring a poll forward"
        assert a.take_presences() == []
    finally:
        a.close()
    assert STRANGER != os.geteuid()

"""Named nudges (``wake``): a put on this machine tells its runners which job, and only trusted names count.

A runner believes a name only from a sender running as its own user or as
root, as the kernel reports it (``SO_PASSCRED``); any other datagram means
"look now" (a poll), never a claim of something a stranger named.  Every
other malformed datagram (not JSON, wrong fields, too long) is a plain
nudge too.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from cloudstore.runtime.wake import NAME_MAX, Named, WakeListener, decode_name, encode_name, notify


def send_as(uid: int | None, path: str, data: bytes) -> None:
    """Send one datagram from a child process running as ``uid`` (None: as we are)."""
    pid = os.fork()
    if pid == 0:  # the child: nothing but the send, then out without running any cleanup
        code = 1
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(data, path)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the sender failed"


def listening(tmp_path: Path) -> WakeListener:
    listener = WakeListener(str(tmp_path / "wake"))
    assert listener.listening
    return listener


def assert_a_name_only_wakes(tmp_path: Path) -> None:
    """A listener made now wakes on a named nudge but believes no name: a plain nudge, as a poll."""
    listener = listening(tmp_path)
    try:
        notify(listener.folder, encode_name({"owner": "o", "id": "a"}, "j", 1.0))
        assert listener.wait(5.0)
        assert listener.take_names() == ([], True)
    finally:
        listener.close()


def test_a_name_travels_whole_from_notify_to_the_listener(tmp_path: Path) -> None:
    listener = listening(tmp_path)
    try:
        name = encode_name({"owner": "o", "id": "a"}, "job/ü 1", 1234.5)
        assert notify(listener.folder, name) == 1
        assert listener.wait(5.0)
        assert listener.take_names() == ([Named("o", "a", "job/ü 1", 1234.5)], False)
        assert listener.take_names() == ([], False), "names are handed once"
    finally:
        listener.close()


def test_what_is_not_a_name_this_module_sends_is_a_plain_nudge(tmp_path: Path) -> None:
    listener = listening(tmp_path)
    try:
        for data in (b"", b"not json", b'{"agent": {"id": "a"}, "job": "j", "due": 1}',
                     b'{"agent": {"id": "a", "owner": null}, "job": 5, "due": 1}',
                     b'{"agent": {"id": "a", "owner": null}, "job": "j", "due": true}',
                     b'{"agent": {"id": "a", "owner": null}, "job": "j", "due": NaN}',
                     b'{"agent": {"id": "a", "owner": null}, "job": "' + b"j" * NAME_MAX + b'", "due": 1}'):
            notify(listener.folder, data)
            assert listener.wait(5.0), data
            assert listener.take_names() == ([], True), data
    finally:
        listener.close()
    assert decode_name(encode_name({"owner": None, "id": "a"}, "j", 1)) == Named(None, "a", "j", 1.0)
    assert encode_name({"owner": None, "id": "a"}, "j" * NAME_MAX, 1) == b"", "too long to name: sent plain"


def test_a_name_from_another_user_only_asks_for_a_poll(tmp_path: Path) -> None:
    """Any user may nudge (the folder is world-writable, as drivers of agents' users must reach it),
    but a name is believed only from our own user or root: a stranger's name costs a poll, no claim."""
    if os.getuid() != 0:
        pytest.skip("needs root to send as another user (CI runs as root)")
    reachable = Path(tempfile.mkdtemp(prefix="lnk-wake-test-"))  # pytest's own tmp_path is root's alone
    reachable.chmod(0o755)
    listener = listening(reachable)
    try:
        assert listener.path is not None
        name = encode_name({"owner": "o", "id": "a"}, "j", 1.0)
        send_as(65534, listener.path, name)
        assert listener.wait(5.0)
        assert listener.take_names() == ([], True), "a name from another user was believed"
        send_as(None, listener.path, name)
        assert listener.wait(5.0)
        assert listener.take_names() == ([Named("o", "a", "j", 1.0)], False), "root's own name was not"
    finally:
        listener.close()
        shutil.rmtree(reachable, ignore_errors=True)


def test_a_listener_without_credentials_believes_no_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel tells no sender (no ``SO_PASSCRED``), every nudge is plain."""
    monkeypatch.delattr(socket, "SO_PASSCRED")
    assert_a_name_only_wakes(tmp_path)


def test_a_kernel_refusing_credentials_still_wakes_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SO_PASSCRED`` refused: the socket still listens (nudges wake it), and no name is believed."""
    def refuse(self: socket.socket, *args: object) -> None:
        raise OSError("not here")

    monkeypatch.setattr(socket.socket, "setsockopt", refuse)
    assert_a_name_only_wakes(tmp_path)

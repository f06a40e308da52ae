"""A connect to a bridge that failed is never ``outcome unknown`` (issue 29, item 8).

Nothing was sent when ``connect()`` failed, so the runner says so
(``NotSent``: "nothing was sent"), whatever the reason: no socket, a socket
nobody listens on (a bridge restarting), or a bridge whose backlog is full
(EAGAIN on a Unix socket: busy, retried, not a misconfiguration).  On
eafe802 a missing socket said ``[Errno 2] No such file or directory
(outcome unknown)``; a full backlog still said so before this change.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import pytest

from cloudstore.scheduling.store_client import BridgeStoreClient, NotSent

REQUEST = {"op": "job_mark", "agent": {"owner": "o", "id": "a"}}


def client(path: Path) -> BridgeStoreClient:
    return BridgeStoreClient(str(path), "o", "a", secrets.token_bytes(32))


def assert_not_sent(path: Path, permanent: bool) -> None:
    with pytest.raises(NotSent) as caught:
        client(path).request(REQUEST)
    assert "nothing was sent" in str(caught.value) and "outcome unknown" not in str(caught.value)
    assert caught.value.permanent is permanent


def test_no_socket_is_not_sent_and_permanent(tmp_path: Path) -> None:
    assert_not_sent(tmp_path / "none.sock", permanent=True)


def test_a_socket_nobody_listens_on_is_not_sent_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    assert_not_sent(path, permanent=False)


def test_a_full_backlog_is_not_sent_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "busy.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(0)
        held = []
        try:
            for _ in range(8):  # fill the backlog: the next connect answers EAGAIN
                c = socket.socket(socket.AF_UNIX)
                c.setblocking(False)
                try:
                    c.connect(str(path))
                except BlockingIOError:
                    c.close()
                    break
                held.append(c)
            assert_not_sent(path, permanent=False)
        finally:
            for c in held:
                c.close()

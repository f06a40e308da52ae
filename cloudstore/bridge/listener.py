"""The bridge's Unix socket: made with mode 0600 from its first moment.

The mode is set on the socket before it is bound (Linux takes the new file's
mode from the socket), and checked after bind before listen; no connection
can arrive before ``listen``, so there is no moment when another user could
connect. An existing socket is never chmod-ed: the mode of a path in a folder
others write is not the bridge's safety anyway, the proof is.
"""

from __future__ import annotations

import errno
import os
import socket
import stat


class SocketInUse(Exception):
    """Something that is not a stale socket holds the bridge's path."""


def _clear_stale(path: str) -> None:
    """Remove a leftover socket nobody listens on; refuse anything else there."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; not removing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketInUse(f"{path}: cannot tell whether a bridge listens there: {exc}") from exc
    else:
        raise SocketInUse(f"{path}: another bridge is listening there")
    finally:
        probe.close()
    os.unlink(path)


def listen_private(path: str, backlog: int = 128) -> tuple[socket.socket, tuple[int, int]]:
    """A listening socket at ``path`` with mode 0600; also its (st_dev, st_ino)
    so that it is removed at the end only if it is still this one."""
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            os.fchmod(sock.fileno(), 0o600)
        except OSError:
            pass  # not every system takes a socket's mode this way; checked below
        sock.bind(path)
        info = os.lstat(path)
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.chmod(path, 0o600)  # our own new socket, not listening yet
            info = os.lstat(path)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock, (info.st_dev, info.st_ino)


def remove_if_ours(path: str, ident: tuple[int, int]) -> None:
    """Unlink the socket file only if it is the one this bridge made."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == ident:
        os.unlink(path)

"""The bridge's Unix socket: made with mode 0600 from its first moment.

The mode is set on the socket before it is bound (Linux takes the new file's
mode from the socket), and checked after bind before listen; no connection
can arrive before ``listen``, so there is no moment when another user could
connect. An existing socket is never chmod-ed: the mode of a path in a folder
others write is not the bridge's safety anyway, the proof is.

``fd_room`` says how many connections the gate may hold, from the process's
file-descriptor limit, which the bridge logs at start: at the limit
``accept`` fails (EMFILE), and a limit set too low (systemd's default soft
limit is 1,024) is worth seeing in the log before a flood shows it.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from typing import TYPE_CHECKING

from ..errors import CloudstoreError

if TYPE_CHECKING:
    from .limits import Limits

try:
    import resource
except ImportError:  # not a POSIX system
    resource = None  # type: ignore[assignment]


class SocketInUse(CloudstoreError):
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
    so that it is removed at the end only if it is still this one.

    Bound under a temporary name beside ``path`` and renamed into place once
    it listens: a client that waits for the file to appear then never meets
    a socket that refuses its connect (bound, not listening yet).  Where the
    temporary name would be too long for a socket address, it binds ``path``
    itself as before."""
    _clear_stale(path)
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{os.getpid()}.{name[:8]}")
    for target in (temporary, path) if len(os.fsencode(temporary)) < 100 else (path,):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                os.fchmod(sock.fileno(), 0o600)
            except OSError:
                pass  # not every system takes a socket's mode this way; checked below
            try:
                sock.bind(target)
            except OSError:
                if target == path:
                    raise
                sock.close()
                continue
            info = os.lstat(target)
            if stat.S_IMODE(info.st_mode) != 0o600:
                os.chmod(target, 0o600)  # our own new socket, not listening yet
            sock.listen(backlog)
            if target != path:
                os.rename(target, path)
            info = os.lstat(path)
        except BaseException:
            sock.close()
            if target != path:
                try:
                    os.unlink(target)
                except OSError:
                    pass
            raise
        return sock, (info.st_dev, info.st_ino)
    raise AssertionError("unreachable: the last target is path, whose failure raises")


def remove_if_ours(path: str, ident: tuple[int, int]) -> None:
    """Unlink the socket file only if it is the one this bridge made."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == ident:
        os.unlink(path)


def fd_room(limits: Limits) -> tuple[int | str, int | str, int, int]:
    """(soft limit, hard limit, descriptors open now, connections the gate may hold).

    The gate holds at most ``limits.max_pending`` unproved connections, and
    fewer when the soft limit leaves less room: descriptors open now, and a
    reserve for proved calls (a socket each), driver processes (three pipes
    each), the process's own and ``limits.reserved_fds`` (the metrics
    exporter's connections) stay free, so that a flood of unproved
    connections meets the gate's own bound (evicting the oldest) before
    the fd limit. At least 8 are held whatever the limit.
    """
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 0
    if resource is None:
        return "unknown", "unknown", open_now, max(8, limits.max_pending)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    reserve = 32 + 2 * limits.max_calls + 4 * limits.max_drivers + limits.reserved_fds
    most = limits.max_pending
    if soft != resource.RLIM_INFINITY:
        most = min(most, soft - open_now - reserve)

    def shown(n: int) -> int | str:
        return "unlimited" if n == resource.RLIM_INFINITY else n

    return shown(soft), shown(hard), open_now, max(8, most)

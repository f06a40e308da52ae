"""A machine-local nudge: "a job's waiting changed, look now".

The scheduler's runners learn of new jobs by polling the store's due index
(one listing every ``poll_interval``, whatever the number of agents).  That
alone would make a job put due now wait up to a poll for its runner.  A put
made on the SAME machine (through an agent's driver or its store bridge)
can do better for free: after a change to waiting, the driver sends a
datagram to every runner socket in a folder both know, and a sleeping runner
wakes at once.

A nudge may name what was put (``{"agent", "job", "due"}``, compact JSON).
A runner takes a name only from a sender of its own user (or root), as the
kernel tells it (``SO_PASSCRED``); any other datagram, or one it cannot read,
means just "look now".  A named job due now is claimed at once, without the
poll: the claim itself (``job_claim``) is the judge of whether it waits and
is due, so a wrong name costs that one claim, never a wrong fire.  Nothing
else in a datagram is trusted, and a runner looks at most once per
``MIN_GAP`` however many nudges arrive.  A lost nudge (no folder, a full
socket buffer, a runner started a moment later) costs only the poll
interval.  Other machines' puts are found by the poll alone.

The folder is ``LNK_WAKE_DIR`` (default ``/tmp/lnk-wake``), sticky and
world-writable like ``/tmp``, because the drivers an agent's bridge starts
may run as another user than the runner.  A runner binds
``<folder>/<pid>-<random>.sock`` and removes it when it stops; drivers only
ever ``sendto`` those sockets, never create or delete anything there.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WAKE_DIR_SETTING = "LNK_WAKE_DIR"
DEFAULT_WAKE_DIR = "/tmp/lnk-wake"
SUFFIX = ".sock"
MIN_GAP = 0.05  # a runner polls at most this often however many nudges arrive
MAX_SOCKETS = 256  # a driver nudges at most this many runners (a folder stuffed with files costs it nothing more)
NAME_MAX = 2048  # bytes of a named nudge; a longer name is sent as a plain "look now"
NAMES_MAX = 64  # names a runner keeps between two looks; past that it just polls
_CREDENTIALS = struct.Struct("3i")  # SCM_CREDENTIALS: pid, uid, gid of the sender, as the kernel saw it


@dataclass(frozen=True)
class Named:
    """A job a nudge says was just put in waiting: where to look first, nothing more."""

    owner: str | None
    agent: str
    job: str
    due: float


def encode_name(agent: Mapping[str, Any], job: str, due: float) -> bytes:
    """The datagram naming one put (empty, a plain nudge, when it would not fit)."""
    text = json.dumps({"agent": dict(agent), "job": job, "due": due}, separators=(",", ":"), ensure_ascii=True)
    return text.encode("ascii") if len(text) <= NAME_MAX else b""


def decode_name(data: bytes) -> Named | None:
    """A datagram's name, or None when it names nothing this module would have sent."""
    try:
        value = json.loads(data.decode("ascii"))
        agent, job, due = value["agent"], value["job"], value["due"]
        owner, agent_id = agent["owner"], agent["id"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not (isinstance(agent_id, str) and isinstance(job, str) and (owner is None or isinstance(owner, str))):
        return None
    if isinstance(due, bool) or not isinstance(due, (int, float)) or due != due or abs(due) > 1e15:
        return None
    return Named(owner, agent_id, job, float(due))


def wake_dir() -> str:
    return os.environ.get(WAKE_DIR_SETTING) or DEFAULT_WAKE_DIR


def notify(folder: str | None = None, name: bytes = b"") -> int:
    """Nudge every runner socket in ``folder`` (naming a put with ``encode_name``); how many took it.
    Never raises: a nudge is a courtesy."""
    try:
        return _nudge_all(folder or wake_dir(), forget_dead=False, payload=name)
    except OSError:
        return 0  # no folder: no runner on this machine


def _nudge_all(folder: str, forget_dead: bool, payload: bytes = b"") -> int:
    """Send ``payload`` (empty: "look now") to each socket in ``folder`` (the first ``MAX_SOCKETS``
    entries); how many took it.  With ``forget_dead``, a socket nobody reads (its runner died without
    closing) is removed."""
    sent = 0
    with os.scandir(folder) as entries, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for i, entry in enumerate(entries):
            if i >= MAX_SOCKETS:
                break
            if not entry.name.endswith(SUFFIX):
                continue
            try:
                sock.sendto(payload, entry.path)
                sent += 1
            except ConnectionRefusedError:
                if forget_dead:
                    try:
                        os.unlink(entry.path)  # in a sticky folder only its owner (or root) can
                    except OSError:
                        pass
            except OSError:
                pass  # a full buffer (it is waking anyway), not a socket
    return sent


class WakeListener:
    """A runner's socket in the wake folder: ``wait`` sleeps until a nudge, a timeout or ``interrupt``."""

    def __init__(self, folder: str | None = None) -> None:
        self.folder = folder or wake_dir()
        self.path: str | None = None
        self._sock: socket.socket | None = None
        self._last = 0.0
        self._interrupted = threading.Event()  # wakes ``wait`` when there is no socket
        self._named: list[Named] = []  # names taken from nudges since the last ``take_names``
        self._plain = False  # and whether any nudge since said only "look now"
        try:
            _make_folder(self.folder)
            _nudge_all(self.folder, forget_dead=True)  # and wake the live ones once: harmless
            path = os.path.join(self.folder, f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(path)
            os.chmod(path, 0o622)  # drivers of other users may nudge; only we read
            _pass_credentials(sock)
            sock.setblocking(False)
            self._sock, self.path = sock, path
        except OSError:
            self._sock = None  # no nudges: the runner still polls, only same-machine puts wait longer

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True when nudged (all pending nudges are taken at once)."""
        if self._sock is None:
            self._interrupted.wait(max(0.0, timeout))
            self._interrupted.clear()
            return False
        gap = self._last + MIN_GAP - time.monotonic()
        if gap > 0:  # a flood of nudges still leaves the runner its rest
            time.sleep(min(gap, max(0.0, timeout)))
            timeout -= gap
        ready, _, _ = select.select([self._sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        self._drain()
        self._last = time.monotonic()
        return True

    def interrupt(self) -> None:
        """Wake ``wait`` now (from another thread or a signal handler)."""
        self._interrupted.set()
        if self._sock is not None and self.path is not None:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                    s.sendto(b"", self.path)
            except OSError:
                pass

    def take_names(self) -> tuple[list[Named], bool]:
        """The jobs nudges named since the last call, and whether any nudge named nothing (or too
        many came to keep): then only a poll tells what changed."""
        named, plain = self._named, self._plain
        self._named, self._plain = [], False
        return named, plain

    def _drain(self) -> None:
        """Take every pending datagram: names from senders of our own user (or root), else "look now"."""
        assert self._sock is not None
        while True:
            try:
                data, ancillary, flags, _ = self._sock.recvmsg(NAME_MAX + 1, socket.CMSG_SPACE(_CREDENTIALS.size))
            except OSError:  # BlockingIOError once nothing is left
                return
            name = decode_name(data) if data and not flags & socket.MSG_TRUNC and _trusted(ancillary) else None
            if name is None or len(self._named) >= NAMES_MAX:
                self._plain = True
            else:
                self._named.append(name)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass
            self.path = None


def _pass_credentials(sock: socket.socket) -> None:
    """Have the kernel tell each sender's uid (``_trusted``); where it can't, names are never believed
    and every nudge is a plain one, which still wakes the runner."""
    try:
        if hasattr(socket, "SO_PASSCRED"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    except OSError:
        pass


def _trusted(ancillary: list[tuple[int, int, bytes]]) -> bool:
    """Whether the kernel says the sender runs as our user or as root (a name is then believed)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1) \
                and len(data) >= _CREDENTIALS.size:
            _, uid, _ = _CREDENTIALS.unpack(data[:_CREDENTIALS.size])
            return uid in (os.getuid(), 0)
    return False


def _make_folder(folder: str) -> None:
    """Create the folder sticky and world-writable (as /tmp is) if missing; refuse a link or a file."""
    try:
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o1777)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{folder} is not a folder")

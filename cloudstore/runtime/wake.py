"""A machine-local nudge: "a job's waiting changed, look now".

The scheduler's runners learn of new jobs by polling the store's due index
(one listing every ``poll_interval``, whatever the number of agents).  That
alone would make a job put due now wait up to a poll for its runner.  A put
made on the SAME machine (through an agent's driver or its store bridge)
can do better for free: after a change to waiting, the driver sends a
datagram to every runner socket in a folder both know, and a sleeping runner
wakes at once.

A nudge may name what was put (``{"agent", "job", "due"}``, compact JSON).
A name is private (an agent's and a job's names): a driver sends it only to
a socket owned by its own user or root (the socket file's owner, seen
without following a link, and the very file it sends to), and only in a
folder it can trust (below); every other runner socket gets an empty
datagram, which says only "look now".  A runner takes a name only from a
sender of its own user (or root), as the kernel tells it (``SO_PASSCRED``);
any other datagram, or one it cannot read, means just "look now".  A named
job due now is claimed at once, without the poll: the claim itself
(``job_claim``) is the judge of whether it waits and is due, so a wrong name
costs that one claim, never a wrong fire.  Nothing else in a datagram is
trusted.  A runner looks at most once per ``MIN_GAP`` however many nudges
arrive, and a nudge from another user (an untrusted sender) at most brings
its next poll forward, once per ``poll_interval``: anyone on the machine may
send them, so they must not multiply what the runner's polls cost.  A lost
nudge (no folder, a full socket buffer, a runner started a moment later)
costs only the poll interval.  Other machines' puts are found by the poll
alone.

The folder is ``LNK_WAKE_DIR`` (default ``/tmp/lnk-wake``).  A runner uses
it only when it is owned by root or by the runner's own user and, if group
or others may write in it, sticky (as ``/tmp`` is: nobody removes or renames
another's socket); otherwise it says so once on stderr and runs without
nudges (its ``started`` event says ``nudges: false``).  A folder a runner
makes is ``0755``: other users' drivers (the drivers an agent's bridge
starts may run as another user than the runner) need only to list it and
write to the runner's socket (``0622``), never to create anything there.
A runner binds ``<folder>/<pid>-<random>.sock`` (``0622``: any user's
driver may nudge it) and ``<pid>-<random>.own.sock`` (``0600``: only its
own user's drivers, and root's, can write to it, so another user's flood
never fills the queue our own user's nudges come through), and removes them
when it stops; drivers only ever ``sendto`` those sockets, never create or
delete anything there.

Runners on one machine also tell each other who they are (``Presence``:
the runner's name, the agents it serves, compact JSON), through the same own
sockets and under the same rules as a name: sent only to own sockets of our
user or root, believed only from a sender the kernel says is our user or
root.  A runner says so when it starts (asking the others to answer), every
``PRESENCE_EVERY`` seconds, and when it stops.  A nudge of our own user
reaches every runner that listens here, so a job one of them owns is left to
it (scheduling/runner.py) instead of every runner on the machine racing for
its lease; and the runners sharing an agent know each other at once, without
first losing claims to one another.  A presence is not "look now": nothing in
waiting changed.
"""

from __future__ import annotations

import errno
import json
import math
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
OWN_SUFFIX = ".own" + SUFFIX  # a runner's socket only its own user (and root) may write to
MIN_GAP = 0.05  # a runner polls at most this often however many nudges arrive
MAX_SOCKETS = 256  # a driver nudges at most this many runners (a folder stuffed with files costs it nothing more)
NAME_MAX = 2048  # bytes of a named nudge; a longer name is sent as a plain "look now"
NAMES_MAX = 64  # names a runner keeps between two looks; past that it just polls
PRESENCE_EVERY = 60.0  # seconds between a runner's presences (``Presence``), well within a peer's ttl
PRESENCE_DATAGRAMS = 64  # a presence's agents fill at most this many datagrams; past that the rest go unsaid
HOLDER_MAX = 256  # characters of a runner's name a presence carries; a longer one is not believed
_CREDENTIALS = struct.Struct("3i")  # SCM_CREDENTIALS: pid, uid, gid of the sender, as the kernel saw it


@dataclass(frozen=True)
class Named:
    """A job a nudge says was just put in waiting: where to look first, nothing more."""

    owner: str | None
    agent: str
    job: str
    due: float


@dataclass(frozen=True)
class Presence:
    """A runner on this machine, of our user or root: its name, some of the agents it serves, and
    whether it asks the others to say they are here (``ask``: it has just started) or is leaving."""

    holder: str
    agents: tuple[tuple[str | None, str], ...]  # (owner, id)
    ask: bool = False
    gone: bool = False


def encode_presences(holder: str, agents: list[Mapping[str, Any]], ask: bool = False,
                     gone: bool = False) -> list[bytes]:
    """The datagrams saying ``holder`` is here and serves ``agents`` (as many as they take, each
    within ``NAME_MAX``, at most ``PRESENCE_DATAGRAMS``); none when the name itself would not fit."""
    def encode(part: list[dict[str, Any]]) -> str:
        return json.dumps({"runner": holder, "agents": part, "ask": ask, "gone": gone},
                          separators=(",", ":"), ensure_ascii=True)

    if len(holder) > HOLDER_MAX or len(encode([])) > NAME_MAX:
        return []
    out: list[bytes] = []
    part: list[dict[str, Any]] = []
    for agent in [{"owner": a.get("owner"), "id": a.get("id")} for a in agents]:
        if len(encode(part + [agent])) > NAME_MAX:
            if not part:
                continue  # an agent whose names alone fill a datagram is left unsaid
            out.append(encode(part).encode("ascii"))
            part = []
            if len(out) >= PRESENCE_DATAGRAMS:
                return out
        part.append(agent)
    if part or not out:
        out.append(encode(part).encode("ascii"))
    return out[:PRESENCE_DATAGRAMS]


def decode_presence(data: bytes) -> Presence | None:
    """A datagram's presence, or None when it is not one this module would have sent."""
    try:
        value = json.loads(data.decode("ascii"))
        holder, agents, ask, gone = value["runner"], value["agents"], value["ask"], value["gone"]
        pairs = tuple((a["owner"], a["id"]) for a in agents)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if not (isinstance(holder, str) and 0 < len(holder) <= HOLDER_MAX and isinstance(agents, list)
            and isinstance(ask, bool) and isinstance(gone, bool)):
        return None
    if not all(isinstance(i, str) and (o is None or isinstance(o, str)) for o, i in pairs):
        return None
    return Presence(holder, pairs, ask, gone)


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
    """Nudge every runner socket in ``folder`` (naming a put with ``encode_name`` where the socket is
    our own user's or root's); how many took it.  Never raises: a nudge is a courtesy."""
    try:
        return _nudge_all(folder or wake_dir(), forget_dead=False, payload=name)
    except OSError:
        return 0  # no folder: no runner on this machine


def folder_refusal(info: os.stat_result, uid: int | None = None) -> str | None:
    """Why a wake folder (its ``lstat``) can't be trusted by ``uid`` (default: ours), or None when it can.

    Trusted: a real folder owned by root or ``uid``, and sticky when group or others may write in it,
    so that nobody else can remove, rename or replace a socket in it after it was checked."""
    me = os.geteuid() if uid is None else uid
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder (or a symbolic link)"
    if info.st_uid not in (0, me):
        return f"owned by uid {info.st_uid}, neither root nor this user ({me})"
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return f"writable by others and not sticky (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _nudge_all(folder: str, forget_dead: bool, payload: bytes = b"", own_only: bool = False,
               skip: frozenset[str] = frozenset()) -> int:
    """Nudge each runner with a socket in ``folder`` (the first ``MAX_SOCKETS`` entries); how many took it.

    A runner has two sockets: ``<base>.own.sock`` (``0600``: only its own user and root can write to
    it, so another user's flood cannot fill it) and ``<base>.sock`` (``0622``: anyone's "look now").
    A runner of our own user is nudged through the first, any other through the second (a runner of
    an older version, with only the second, through that).  ``payload`` (a name) goes only to a
    socket owned by our user or root with no other link to it, in a folder ``folder_refusal``
    trusts; any other socket is sent an empty datagram ("look now"), and what is not a socket (a
    symbolic link, a file) nothing.  With ``forget_dead``, the sockets of ours nobody reads (their
    runner died without closing) are removed.  With ``own_only`` (a presence), only the own sockets
    of runners of our user are sent to, and nothing at all when ``payload`` could not be; the
    runners whose base names are in ``skip`` (our own) are passed over."""
    me = os.geteuid()
    sent = 0
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        named = payload if payload and folder_refusal(os.fstat(dir_fd), me) is None else b""
        if own_only and not named:
            return 0
        runners: dict[str, dict[bool, str]] = {}  # a runner's base name -> {own socket?: entry name}
        with os.scandir(dir_fd) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_SOCKETS:
                    break
                if entry.name.endswith(OWN_SUFFIX):
                    runners.setdefault(entry.name[:-len(OWN_SUFFIX)], {})[True] = entry.name
                elif entry.name.endswith(SUFFIX):
                    runners.setdefault(entry.name[:-len(SUFFIX)], {})[False] = entry.name
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            for base, names in runners.items():
                if base in skip:
                    continue
                outcome = ""
                if True in names:  # its own user's socket: ours when we are that user
                    outcome = _send(sock, dir_fd, folder, names[True], named, me, own=True)
                if outcome == "" and False in names and not own_only:
                    outcome = _send(sock, dir_fd, folder, names[False], named, me, own=False)
                sent += outcome == "sent"
                if outcome == "dead" and forget_dead:
                    for name in names.values():
                        try:
                            if os.lstat(name, dir_fd=dir_fd).st_uid == me:
                                os.unlink(name, dir_fd=dir_fd)
                        except OSError:
                            pass
    finally:
        os.close(dir_fd)
    return sent


def _send(sock: socket.socket, dir_fd: int, folder: str, name: str, payload: bytes, me: int, own: bool) -> str:
    """Send to one entry of the folder: ``"sent"``, ``"dead"`` (nobody reads it), ``"failed"`` (a full
    buffer: it is waking anyway; gone meanwhile), or ``""`` when it is not a socket to send to (then
    a runner's other socket may be).  A runner's own-user socket is sent to only when we are that
    user; ``payload`` only to a socket of our user or root with no other link to it.  The file
    checked is the file sent to (``_Target``)."""
    try:
        with _Target(dir_fd, folder, name) as target:
            if not stat.S_ISSOCK(target.info.st_mode) or (own and target.info.st_uid != me):
                return ""  # a link (never followed), a file; another user's private socket
            ours = target.info.st_uid in (me, 0) and target.info.st_nlink == 1
            sock.sendto(payload if ours else b"", target.address)
            return "sent"
    except ConnectionRefusedError:
        return "dead"
    except OSError:
        return "failed"


class _Target:
    """One entry of the wake folder as it is sent to: its ``lstat`` and an address naming that very file.

    Where the system has ``O_PATH`` (Linux) the entry is opened without following a link and sent to
    as ``/proc/self/fd/N``, so it cannot be swapped between the check and the send; elsewhere it is
    ``lstat`` then sent to by path (the folder's own rules, sticky, keep others from swapping it)."""

    def __init__(self, dir_fd: int, folder: str, name: str) -> None:
        self.fd: int | None = None
        o_path = getattr(os, "O_PATH", 0)
        if o_path and os.path.isdir("/proc/self/fd"):
            self.fd = os.open(name, o_path | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            self.info = os.fstat(self.fd)
            self.address = f"/proc/self/fd/{self.fd}"
        else:
            self.info = os.lstat(name, dir_fd=dir_fd)
            self.address = os.path.join(folder, name)

    def __enter__(self) -> _Target:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class WakeListener:
    """A runner's sockets in the wake folder: ``wait`` sleeps until a nudge, a timeout or ``interrupt``.

    Two sockets: ``path`` (``<pid>-<random>.sock``, ``0622``: any user's driver may say "look now")
    and ``own_path`` (the same with ``.own.sock``, ``0600``: our own user's drivers, and root's),
    so that another user's flood, which fills the first one's queue, never crowds out our own
    user's nudges and names."""

    def __init__(self, folder: str | None = None) -> None:
        self.folder = folder or wake_dir()
        self.path: str | None = None
        self.own_path: str | None = None
        self.refused: str | None = None  # why this runner listens for no nudge, when it doesn't
        self._socks: list[socket.socket] = []
        self._last = 0.0
        self._last_untrusted = -math.inf  # when a stranger's nudge last woke us (monotonic)
        self._interrupted = threading.Event()  # wakes ``wait`` when there is no socket
        self._pipe: tuple[int, int] | None = None  # and when there is one (never blocks, a flood or not)
        self._named: list[Named] = []  # names taken from nudges since the last ``take_names``
        self._presences: list[Presence] = []  # presences heard since the last ``take_presences``
        self._base: str | None = None  # our sockets' base name in the folder (never sent a presence)
        self._plain = False  # and whether any nudge since said only "look now"
        try:
            _make_folder(self.folder)
            refusal = folder_refusal(os.lstat(self.folder))
            if refusal is not None:
                self.refused = f"wake folder {self.folder} is {refusal}"
                return
            _nudge_all(self.folder, forget_dead=True)  # and wake the live ones once: harmless
            self._base = f"{os.getpid()}-{secrets.token_hex(4)}"
            base = os.path.join(self.folder, self._base)
            try:
                # The own socket first: a driver that sees the other one finds it beside.
                for path, mode in ((base + OWN_SUFFIX, 0o600), (base + SUFFIX, 0o622)):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._socks.append(sock)
                    sock.bind(path)
                    if mode == 0o600:
                        self.own_path = path
                    else:
                        self.path = path
                    os.chmod(path, mode)  # 0622: drivers of other users may nudge; only we read
                    _pass_credentials(sock)
                    sock.setblocking(False)
                read, write = os.pipe()
                os.set_blocking(read, False)
                os.set_blocking(write, False)
                self._pipe = (read, write)
            except OSError:
                self.close()
                raise
        except OSError as exc:  # no nudges: the runner still polls, only same-machine puts wait longer
            self.refused = f"wake folder {self.folder}: {exc.strerror or exc}"

    @property
    def listening(self) -> bool:
        return bool(self._socks)

    def wait(self, timeout: float, untrusted_every: float = 0.0) -> bool:
        """Sleep up to ``timeout`` seconds; True when nudged (all pending nudges are taken at once).

        A nudge from our own user or root wakes us (at most once per ``MIN_GAP``).  One that only
        other users sent wakes us only if no such nudge did in the last ``untrusted_every`` seconds:
        the runner gives it ``poll_interval``, so anyone's flood at most doubles its polls."""
        if not self._socks or self._pipe is None:
            self._interrupted.wait(max(0.0, timeout))
            self._interrupted.clear()
            return False
        watched = [sock.fileno() for sock in self._socks] + [self._pipe[0]]
        end = time.monotonic() + max(0.0, timeout)
        rest_until = self._last + MIN_GAP  # a flood of nudges still leaves the runner its rest
        while True:
            now = time.monotonic()
            if rest_until > now:
                time.sleep(max(0.0, min(rest_until, end) - now))
            ready, _, _ = select.select(watched, [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return False
            woke = self._drain()
            now = time.monotonic()
            if woke == "stranger" and now - self._last_untrusted >= untrusted_every:
                self._last_untrusted = now
                self._plain = True
                woke = "trusted"
            if woke == "trusted":
                self._last = now
                return True
            rest_until = now + MIN_GAP  # strangers' datagrams alone: drained at most this often
            if now >= end:
                return False

    def interrupt(self) -> None:
        """Wake ``wait`` now (from another thread or a signal handler: never blocks)."""
        self._interrupted.set()
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], b"\0")
            except OSError:
                pass  # full: a wake-up is pending already

    def announce(self, datagrams: list[bytes]) -> int:
        """Send each of ``datagrams`` (``encode_presences``) to the other runners of our user here;
        how many runners took the first.  Never raises: a presence is a courtesy, said again later."""
        if not self._socks or self._base is None:
            return 0
        sent = 0
        for i, datagram in enumerate(datagrams):
            try:
                n = _nudge_all(self.folder, forget_dead=False, payload=datagram, own_only=True,
                               skip=frozenset({self._base}))
            except OSError:
                return sent
            sent = n if i == 0 else sent
        return sent

    def take_presences(self) -> list[Presence]:
        """The presences heard since the last call (from senders of our own user or root only)."""
        heard, self._presences = self._presences, []
        return heard

    def take_names(self) -> tuple[list[Named], bool]:
        """The jobs nudges named since the last call, and whether any nudge named nothing (or too
        many came to keep): then only a poll tells what changed."""
        named, plain = self._named, self._plain
        self._named, self._plain = [], False
        return named, plain

    def _drain(self) -> str:
        """Take every pending datagram: names from senders of our own user (or root), else "look now".

        Which woke us: ``"trusted"`` (a datagram of our own user or root, or ``interrupt``), else
        ``"stranger"`` (only other users' datagrams: not counted as "look now" here, ``wait`` judges
        whether one may be), else ``""``."""
        assert self._pipe is not None
        woke = ""
        try:
            while os.read(self._pipe[0], 512):
                woke, self._plain = "trusted", True
        except OSError:  # BlockingIOError once nothing is left
            pass
        for sock in self._socks:
            while True:
                try:
                    data, ancillary, flags, _ = sock.recvmsg(NAME_MAX + 1, socket.CMSG_SPACE(_CREDENTIALS.size))
                except OSError:  # BlockingIOError once nothing is left
                    break
                if not _trusted(ancillary):
                    woke = woke or "stranger"
                    continue
                woke = "trusted"
                whole = bool(data) and not flags & socket.MSG_TRUNC
                name = decode_name(data) if whole else None
                presence = decode_presence(data) if whole and name is None else None
                if presence is not None:  # not "look now": nothing in waiting changed
                    if len(self._presences) < NAMES_MAX:
                        self._presences.append(presence)
                elif name is None or len(self._named) >= NAMES_MAX:
                    self._plain = True
                else:
                    self._named.append(name)
        return woke

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
        self._socks = []
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
        for path in (self.path, self.own_path):
            if path is not None:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        self.path = self.own_path = None


def _pass_credentials(sock: socket.socket) -> None:
    """Have the kernel tell each sender's uid (``_trusted``); where it can't, no sender is trusted:
    names are never believed, and every nudge is a stranger's, which still brings a poll forward."""
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
            return uid in (os.geteuid(), 0)
    return False


def _make_folder(folder: str) -> None:
    """Create the folder ``0755`` if missing (ours: others may list it and send, not create); refuse a
    link or a file (``folder_refusal`` judges an existing folder)."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    else:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o755)  # whatever the umask: other users' drivers must reach our socket
        finally:
            os.close(fd)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, f"{folder} is not a folder")

"""The bridge's gate: every connection until it has proved who it is, on one thread.

Anyone who can reach the socket can connect, so nothing a connection costs
before its proof may grow with the number of connections but a file
descriptor and a few KiB. One thread runs a selector over the listening
socket and every unproved connection (non-blocking), each with:

* a buffer of at most the proof line's bound (a few KiB), never more;
* a deadline (``request_timeout`` from its accept), after which it is closed.

The gate holds at most ``most`` connections. One more, or a failed
``accept`` for want of file descriptors (EMFILE, ENFILE), evicts the OLDEST
held, never refuses the newest: a flood of slow or idle connections then
only churns itself, while a caller that sends its proof at once is read
within its first moments and never waits behind the flood. When nothing can
be evicted, accepting pauses for ``backoff`` seconds instead of spinning on
a listening socket that stays readable. Log lines go through ``RateLog``.

A whole proof line is passed to ``on_line``, which answers it (a refusal,
``busy``: the gate sends the line, then reads and drops what the caller
still sends for ``drain`` seconds so it reads the answer rather than a reset)
or takes the connection over (a proved call: handed to a worker).
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocol.client import dumps
from .ratelog import RateLog
from .rules import error_reply

log = logging.getLogger("cloudstore.bridge")

ACCEPT_BATCH = 32  # accepts per turn of the loop, so reading the held connections is never starved
OUT_OF_ROOM = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
TRANSIENT = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})

# A proof line seen whole: the reply to send (then the connection is drained and
# closed by the gate), or None when on_line took the connection over.
OnLine = Callable[[socket.socket, bytes, bytes], bytes | None]


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    closing: bool = False  # answered; reading and dropping until EOF or the deadline
    registered: bool = False


class Gate:
    """Accepts, reads proof lines and evicts on one thread (``run``) until woken to stop."""

    def __init__(
        self,
        listener: socket.socket,
        wake: socket.socket,
        on_line: OnLine,
        bound: Callable[[], int],
        timeout: float,
        most: int,
        evicted_reply: bytes,
        drain: float = 1.0,
        backoff: float = 0.1,
    ) -> None:
        self.listener = listener
        self.wake = wake
        self.on_line = on_line
        self.bound = bound
        self.timeout = timeout
        self.most = max(1, most)
        self.evicted_reply = evicted_reply
        self.drain = drain
        self.backoff = backoff
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()  # unproved, oldest first
        self._closing: OrderedDict[_Conn, None] = OrderedDict()  # answered, oldest first
        self._sel: selectors.BaseSelector | None = None
        self._paused_until: float | None = None
        self._scratch = bytearray(65536)  # what a closing connection still sends is read into this and dropped
        self._log = RateLog(log)
        # Counts, for logs, tests and the benchmark (written by the gate thread only).
        self.accepted = 0
        self.evicted = 0
        self.expired = 0
        self.accept_failures = 0

    def held(self) -> int:
        """Connections the gate holds now (unproved, and answered but still draining)."""
        return len(self._waiting) + len(self._closing)

    def _accept(self) -> tuple[socket.socket, object]:
        """One ``accept`` (its own method, so a test can make it fail as at the fd limit)."""
        return self.listener.accept()

    # -- the loop ---------------------------------------------------------------

    def run(self) -> None:
        self.listener.setblocking(False)
        with selectors.DefaultSelector() as sel:
            self._sel = sel
            sel.register(self.listener, selectors.EVENT_READ, "listen")
            sel.register(self.wake, selectors.EVENT_READ, "wake")
            try:
                while True:
                    now = time.monotonic()
                    self._expire(now)
                    if self._paused_until is not None and now >= self._paused_until:
                        self._paused_until = None
                        sel.register(self.listener, selectors.EVENT_READ, "listen")
                    for key, _ in sel.select(self._wait(now)):
                        if key.data == "wake":
                            return
                        if key.data == "listen":
                            self._accept_some()
                        elif key.data.registered:  # not evicted earlier in this same turn
                            self._readable(key.data)
            finally:
                for conns in (self._waiting, self._closing):
                    while conns:
                        self._close(conns.popitem(last=False)[0])
                self._sel = None

    def _wait(self, now: float) -> float | None:
        """Seconds until the next deadline or the end of a pause; None for none."""
        times = [c.deadline for c in (next(iter(self._waiting), None), next(iter(self._closing), None)) if c]
        if self._paused_until is not None:
            times.append(self._paused_until)
        return max(0.0, min(times) - now) if times else None

    def _expire(self, now: float) -> None:
        """Close what passed its deadline: deadlines grow in the order connections were added."""
        for conns in (self._waiting, self._closing):
            while conns:
                conn = next(iter(conns))
                if conn.deadline > now:
                    break
                del conns[conn]
                if not conn.closing:
                    self.expired += 1
                    self._log(
                        logging.INFO, "expired", "closed a connection that sent no proof within %g s", self.timeout
                    )
                self._close(conn)

    # -- accepting --------------------------------------------------------------

    def _accept_some(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in TRANSIENT:
                    continue
                self._out_of_room(exc)
                return
            self.accepted += 1
            self._admit(sock)

    def _out_of_room(self, exc: OSError) -> None:
        """``accept`` failed: free descriptors by evicting the oldest held, or pause accepting.

        Either way the loop goes on: a listening socket whose backlog holds
        connections stays readable, so retrying at once would spin.
        """
        self.accept_failures += 1
        freed = self._evict(max(1, min(ACCEPT_BATCH, self.held() // 8))) if exc.errno in OUT_OF_ROOM else 0
        if freed:
            self._log(logging.WARNING, "accept", "accept failed (%s): dropped the %d oldest connections not yet proved",
                      exc, freed)
            return
        self._log(logging.WARNING, "accept", "accept failed (%s): pausing accepts for %g s", exc, self.backoff)
        if self._paused_until is None and self._sel is not None:
            self._sel.unregister(self.listener)
        self._paused_until = time.monotonic() + self.backoff

    def _admit(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        conn = _Conn(sock, time.monotonic() + self.timeout)
        # A prompt caller's proof is often there already: read it before it could be held at all.
        if self._take_input(conn):
            return
        while self.held() >= self.most and self._evict(1):
            pass
        self._waiting[conn] = None
        self._register(conn)

    # -- reading ----------------------------------------------------------------

    def _readable(self, conn: _Conn) -> None:
        if conn.closing:
            try:
                n = conn.sock.recv_into(self._scratch)
            except BlockingIOError:
                return
            except OSError:
                n = 0
            if not n:
                self._forget(conn)
                self._close(conn)
            return
        self._take_input(conn)

    def _take_input(self, conn: _Conn) -> bool:
        """Read what the connection sent; True when it is dealt with (answered, handed on or
        closed) and no longer waits for its proof line."""
        bound = self.bound()
        try:
            chunk = conn.sock.recv(bound + 1 - len(conn.buf))
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
            conn.buf.clear()
        if not chunk:
            self._detach(conn)
            if conn.buf:  # a line left unended at EOF counts, as LineReader reads it
                self._dispatch(conn, bytes(conn.buf), b"")
            else:
                self._log(logging.DEBUG, "no-proof", "connection closed without a proof")
                self._close(conn)
            return True
        searched = len(conn.buf)
        conn.buf += chunk
        end = conn.buf.find(b"\n", searched)
        if end >= 0:
            self._detach(conn)
            self._dispatch(conn, bytes(conn.buf[:end]), bytes(conn.buf[end + 1:]))
            return True
        if len(conn.buf) > bound:
            self._detach(conn)
            self._log(logging.WARNING, "long-proof", "refused a proof line over %d bytes", bound)
            self._answer(conn, _error_line(f"refused: proof line over {bound} bytes"))
            return True
        return False

    def _dispatch(self, conn: _Conn, line: bytes, rest: bytes) -> None:
        conn.buf = bytearray()
        try:
            reply = self.on_line(conn.sock, line, rest)
        except Exception:  # a bug here must cost one connection, never the gate
            log.exception("a proof line failed")
            self._close(conn)
            return
        if reply is not None:
            self._answer(conn, reply)

    def _answer(self, conn: _Conn, reply: bytes) -> None:
        """Send the reply line, stop writing, and keep reading (and dropping) until
        EOF or ``drain`` seconds: closing with unread input would reset the
        caller, who may then fail its send before reading the answer."""
        try:
            conn.sock.send(reply + b"\n")  # one short line into an empty send buffer: whole
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.buf = bytearray()
        conn.closing = True
        conn.deadline = time.monotonic() + self.drain
        while self.held() >= self.most and self._evict(1):
            pass
        self._closing[conn] = None
        self._register(conn)

    # -- evicting and closing ---------------------------------------------------

    def _evict(self, count: int) -> int:
        """Close up to ``count`` of the oldest held connections, answered ones first; how many."""
        done = 0
        while done < count and (self._closing or self._waiting):
            if self._closing:
                conn = self._closing.popitem(last=False)[0]
            else:
                conn = self._waiting.popitem(last=False)[0]
                try:
                    conn.sock.send(self.evicted_reply + b"\n")
                except OSError:
                    pass
                self.evicted += 1
            self._forget(conn)
            self._close(conn)
            done += 1
        if done:
            self._log(
                logging.WARNING, "evict", "dropped the oldest connections not yet proved (%d held at most)", self.most
            )
        return done

    def _register(self, conn: _Conn) -> None:
        if self._sel is not None and not conn.registered:
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            conn.registered = True

    def _unregister(self, conn: _Conn) -> None:
        if self._sel is not None and conn.registered:
            self._sel.unregister(conn.sock)
            conn.registered = False

    def _detach(self, conn: _Conn) -> None:
        """No longer waiting for a proof line: neither watched nor counted as waiting."""
        self._unregister(conn)
        self._waiting.pop(conn, None)

    def _forget(self, conn: _Conn) -> None:
        self._unregister(conn)
        self._waiting.pop(conn, None)
        self._closing.pop(conn, None)

    def _close(self, conn: _Conn) -> None:
        self._unregister(conn)
        conn.buf = bytearray()
        try:
            conn.sock.close()
        except OSError:
            pass


def _error_line(reason: str) -> bytes:
    return dumps(error_reply(reason)).encode("utf-8")

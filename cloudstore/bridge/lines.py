"""Lines over a stream socket, each read against a deadline and a size bound.

Both ends of the bridge speak newline-ended lines, and both read them with
``LineReader`` (the bridge its callers' lines, ``bridge.client`` the reply);
a reader must never wait forever (a caller that proves and then says nothing) nor buffer without end
(a caller that never sends a newline). A reader may also hold its buffer
against a byte budget (``limits.Hold``): the bytes a proved caller has sent
but the bridge has not yet dealt with are the bridge's memory, and many
callers at once must not add up past the budget.
"""

from __future__ import annotations

import socket
import time

from ..errors import CloudstoreError
from .limits import Hold

CHUNK = 65536


class LineTimeout(CloudstoreError):
    """No whole line arrived before the deadline."""


class LineTooLong(CloudstoreError):
    """The line grew past its bound before its newline."""


class LineClosed(CloudstoreError):
    """The peer closed the connection before a line began."""


class LineOverBudget(CloudstoreError):
    """Buffering more of the line would take the bridge past its byte budget."""


class LineReader:
    """Reads line after line from one socket, keeping what follows a newline.

    ``start`` is what was read from the socket already (the bytes after the
    proof line's newline, read by the bridge's gate). With ``hold``, twice
    the buffered bytes (the buffer and the line copied out of it) plus the
    chunk about to be read are held in it before each read: a read that
    does not fit raises LineOverBudget. The caller releases the hold.
    """

    def __init__(self, sock: socket.socket, start: bytes = b"", hold: Hold | None = None) -> None:
        self.sock = sock
        self._buf = bytearray(start)
        self.hold = hold
        self.lines_read = 0

    def read_line(self, deadline: float, limit: int) -> bytes:
        """The next line without its newline; one left unended at EOF counts.

        ``deadline`` is a time.monotonic() value.
        """
        searched = 0
        while True:
            end = self._buf.find(b"\n", searched)
            if end >= 0:
                with memoryview(self._buf) as view:
                    line = view[:end].tobytes()  # one copy, not a bytearray slice and then another
                    rest = view[end + 1:].tobytes()
                # A fresh buffer: one emptied in place keeps its capacity (the line's size) while the line is used.
                self._buf = bytearray(rest)
                if len(line) > limit:
                    raise LineTooLong(f"line of {len(line)} bytes, over {limit}")
                self.lines_read += 1
                return line
            if len(self._buf) > limit:
                raise LineTooLong(f"line over {limit} bytes")
            searched = len(self._buf)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LineTimeout("no whole line in time")
            size = min(CHUNK, limit + 1 - len(self._buf))
            if self.hold is not None and not self.hold.resize(max(self.hold.size, 2 * (len(self._buf) + size))):
                raise LineOverBudget(f"{len(self._buf) + size} bytes buffered would be past the bridge's budget")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(size)
            except TimeoutError as exc:
                raise LineTimeout("no whole line in time") from exc
            except OSError as exc:
                raise LineClosed(str(exc)) from exc
            if not chunk:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf = bytearray()
                    self.lines_read += 1
                    return line
                raise LineClosed("closed before a line")
            self._buf += chunk


def send_line(sock: socket.socket, line: bytes, timeout: float) -> bool:
    """Send one line (newline added); False when the peer is gone or stalls."""
    sock.settimeout(timeout)
    try:
        sock.sendall(line + b"\n")
        return True
    except OSError:
        return False


def finish(sock: socket.socket, drain_seconds: float = 0.0) -> None:
    """End a connection so the peer reads all it was sent.

    Closing a Unix socket with unread input resets the peer, which may then
    fail writing a request it had not finished sending (Linux). So, when the
    peer may still be sending (``drain_seconds`` > 0: it was answered before
    its request was read), stop writing, read and drop what it still sends
    for a moment, then close.
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + drain_seconds
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not sock.recv(65536):
                break
    except OSError:
        pass
    finally:
        sock.close()

"""Lines over a stream socket, each read against a deadline and a size bound.

Both ends of the bridge speak newline-ended lines; a reader must never wait
forever (a caller that proves and then says nothing) nor buffer without end
(a caller that never sends a newline).
"""

from __future__ import annotations

import socket
import time


class LineTimeout(Exception):
    """No whole line arrived before the deadline."""


class LineTooLong(Exception):
    """The line grew past its bound before its newline."""


class LineClosed(Exception):
    """The peer closed the connection before a line began."""


class LineReader:
    """Reads line after line from one socket, keeping what follows a newline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self.lines_read = 0

    def read_line(self, deadline: float, limit: int) -> bytes:
        """The next line without its newline; one left unended at EOF counts.

        ``deadline`` is a time.monotonic() value.
        """
        searched = 0
        while True:
            end = self._buf.find(b"\n", searched)
            if end >= 0:
                line = bytes(self._buf[:end])
                del self._buf[: end + 1]
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
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout as exc:
                raise LineTimeout("no whole line in time") from exc
            except OSError as exc:
                raise LineClosed(str(exc)) from exc
            if not chunk:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
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

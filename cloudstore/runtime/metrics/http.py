"""``GET /metrics`` on one thread, with bounded cost: the exporter's HTTP side, and nothing else.

``Exporter`` serves a ``Collector``'s text on ``GET /metrics`` and / or
rewrites it to a file; ``export`` makes the one a program's
``--metrics-port`` / ``--metrics-file`` ask for.  The server knows nothing
of counters: it calls a render function per scrape.  It imports no
``prometheus_client`` either: the program hands ``export`` what the
process says of itself (``process.ProcessMetrics``).

Why not ``prometheus_client``'s ``start_http_server``: it is
``ThreadingWSGIServer`` (``http.server`` with a thread per connection,
daemon threads, no deadline), and any local user can connect to the port:
idle connections then take the process's threads and descriptors, which
once took a bridge down (issue 25).  Here one thread runs a selector over
the listener and every connection (``_HttpLoop``), with the bounds
``Exporter`` lists, so the exporter costs one thread and
``max_connections`` + 1 descriptors whatever is sent to it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping

from ..health import LIVE_PATH, READY_PATH, Health
from . import AnyFamily
from .exposition import CONTENT_TYPE
from .snapshots import METRICS_DIR, Collector, write_atomically

log = logging.getLogger("cloudstore.runtime.metrics")


def parse_listen(text: str | int, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (0: any free port); ValueError when neither."""
    host, sep, port = str(text).rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be PORT or HOST:PORT with a port from 0 to 65535, not {text!r}")
    return (host.strip("[]") or default_host) if sep else default_host, int(port)


#: The most connections the exporter holds at once (a scraper needs one; an operator's curl another).
MAX_CONNECTIONS = 8
#: Seconds a connection has to send its whole request head, and again to read the answer.
READ_TIMEOUT = 3.0
#: The longest request head read (request line and headers): a scrape's is a few hundred bytes.
MAX_REQUEST_HEAD = 8 * 1024
# Connections the kernel completes and queues for us (they cost the process nothing there): room for a
# flood of a thousand, so that a scraper's connection is queued behind it, not dropped and retried.
LISTEN_BACKLOG = 1024
ACCEPT_BATCH = 16  # accepts per turn of the loop, so reading the held connections is never starved
# Connections accepted per second at most (and at once after a quiet spell): a flood that reopens
# every connection closed could otherwise keep this thread accepting and closing, taking the
# interpreter's time from the bridge's calls. Past it they wait in the listen backlog (then the
# kernel drops their SYNs), costing the process nothing; a scrape a few seconds apart never meets it.
ACCEPT_RATE = 1000.0
ACCEPT_BURST = 32
ACCEPT_BACKOFF = 0.1  # seconds accepting pauses when the process is out of descriptors
_OUT_OF_ROOM = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Exporter:
    """Serves ``collector``'s text on ``GET /metrics`` and / or rewrites it to a file every ``interval`` s.

    Anyone on the machine can connect to the port, so what a connection
    costs is bounded (issue 25: a thread and a descriptor per idle
    connection, with no timeout, once took a bridge down). One thread runs a
    selector over the listening socket and every connection (``_HttpLoop``):

    * at most ``max_connections`` are held; one more closes the oldest still
      reading its request (so an idle flood only churns itself), or, when
      every one held is being answered, is itself closed at once;
    * each has ``read_timeout`` seconds to send its request head (at most
      ``MAX_REQUEST_HEAD`` bytes), and as long again to take the answer;
    * at most ``ACCEPT_RATE`` connections are accepted a second, so that a
      flood reopening every connection closed costs this thread a bounded
      share of the interpreter, whatever its rate;
    * accepting pauses ``ACCEPT_BACKOFF`` s when the process is out of
      descriptors, instead of spinning on a listener that stays readable.

    So the exporter costs one thread and ``max_connections`` + 1 descriptors
    whatever is sent to it; the bridge counts them in the room it keeps
    (``Limits.reserved_fds``). A scrape costs a listing of the folder and a
    read of each snapshot, never a store request. The file is written at
    ``start``, every ``interval`` and at ``stop``, atomically.

    With ``health`` (set before ``start``), the same port answers the
    probes: ``GET /healthz`` (live) and ``GET /readyz`` (ready), 200 or 503
    with a short JSON body, from the state the program keeps
    (``runtime.health``): under the same bounds, and never a store request,
    so a probe is answered as promptly as a scrape whatever the store does.
    """

    def __init__(self, collector: Collector, listen: tuple[str, int] | None = None, file: str | None = None,
                 interval: float = 5.0, owns_folder: bool = False, max_connections: int = MAX_CONNECTIONS,
                 read_timeout: float = READ_TIMEOUT, health: Health | None = None) -> None:
        self.collector = collector
        self.health = health
        self.owns_folder = owns_folder  # the folder is removed at stop (``export`` made it)
        self.listen = listen
        self.file = file
        self.interval = interval
        self.max_connections = max(1, max_connections)
        self.read_timeout = read_timeout
        self.address: tuple[str, int] | None = None  # where it serves, once started (the real port when 0)
        self._loop: _HttpLoop | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._write_lock = threading.Lock()
        self._started = False

    @property
    def descriptors(self) -> int:
        """The most descriptors serving may hold: the listener and each connection (0 when not serving)."""
        return 0 if self.listen is None else self.max_connections + 1

    def held(self) -> int:
        """Connections held now (for tests and logs)."""
        return 0 if self._loop is None else self._loop.held()

    def start(self) -> Exporter:
        self._started = True
        if self.listen is not None:
            self._serve()
        if self.file is not None:
            self.write_file()
            thread = threading.Thread(target=self._write_loop, name="metrics-file", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _serve(self) -> None:
        assert self.listen is not None
        loop = _HttpLoop(self.listen, self.collector.render, self.max_connections, self.read_timeout, self.health)
        self._loop = loop
        self.address = loop.address
        thread = threading.Thread(target=loop.run, name="metrics-http", daemon=True)
        thread.start()
        self._threads.append(thread)
        log.info("metrics at http://%s:%d/metrics (at most %d connections, %g s to send a request)",
                 self.address[0], self.address[1], self.max_connections, self.read_timeout,
                 extra={"metrics_port": self.address[1]})

    def _write_loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.write_file()

    def write_file(self) -> None:
        """Write the text to ``file`` now; a failure is logged, never raised."""
        if self.file is None:
            return
        with self._write_lock:
            try:
                write_atomically(self.file, self.collector.render())
            except OSError as exc:
                log.warning("cannot write metrics to %s: %s", self.file, exc)

    def stop(self) -> None:
        """Stop serving, and write the file a last time."""
        self._stop.set()
        if self._loop is not None:
            self._loop.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._started:
            self.write_file()
        if self.owns_folder and self.collector.folder is not None:
            import shutil

            shutil.rmtree(self.collector.folder, ignore_errors=True)

    @property
    def driver_env(self) -> dict[str, str]:
        """What the drivers this process starts need in their environment to be counted here."""
        return {METRICS_DIR: self.collector.folder} if self.collector.folder else {}


def export(listen: str | int | None, file: str | None, interval: float = 5.0,
           extra: Callable[[], Mapping[str, AnyFamily]] | None = None, *,
           process: Callable[[], Mapping[str, AnyFamily]] | None, own: tuple[str, ...]) -> Exporter | None:
    """The exporter a program's ``--metrics-port`` / ``--metrics-file`` ask for (None when neither), not started.

    Its drivers' snapshots go to a new private folder (mode 0700), removed at
    ``stop``: the counts live as long as the exporter, as Prometheus expects
    of a process's counters.  ``process`` makes what the exporting process
    says of itself at each scrape (``process.ProcessMetrics``: ``process_*``
    and the build), and ``own`` names the prefixes of the counters and
    histograms that are the program's (``Collector.own``: its own and its
    drivers', ``STORE_FAMILIES``); both are named by every program, so that
    none exports without its process, or with another program's families,
    by mistake.  ValueError for a malformed ``listen``.
    """
    if listen is None and file is None:
        return None
    address = None if listen is None else parse_listen(listen)
    import tempfile

    folder = tempfile.mkdtemp(prefix="lnk-metrics-")
    collector = Collector(folder, extra=extra, process=process, own=own)
    return Exporter(collector, address, file, interval, owns_folder=True)


# --------------------------------------------------------------------------
# The HTTP side of the exporter: one thread, a bounded number of connections


_READING, _WRITING, _DRAINING = "reading", "writing", "draining"
_DRAIN = 1.0  # seconds an answered connection is read and dropped until the caller closes (no reset)
_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: 28\r\nConnection: close\r\n\r\ntoo many metrics connections\n")


class _Conn:
    """One connection: its head read so far, or the answer being sent, and its deadline."""

    __slots__ = ("sock", "deadline", "state", "buf", "out", "sent")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.state = _READING
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.sent = 0


class _HttpLoop:
    """``GET /metrics`` (and ``HEAD``) on one thread: a selector over the listener and every connection.

    Connections are kept in the order they were accepted, so the one closed
    to make room is the oldest still reading its request (or answered and
    being drained); one being sent its answer is never cut, and when every
    one held is, the new one is told 503 and closed at once. Nothing here
    may raise out of ``run``: a failure to answer costs that connection.
    """

    def __init__(self, listen: tuple[str, int], render: Callable[[], str], most: int, timeout: float,
                 health: Health | None = None) -> None:
        host, port = listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.listener = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
        except OSError as exc:  # name the port: "Address already in use" alone leaves the operator guessing which
            raise OSError(exc.errno, f"metrics port {host}:{port} (--metrics-port / metrics_port): "
                                     f"{exc.strerror or exc}") from exc
        self.listener.setblocking(False)
        name = self.listener.getsockname()
        self.address: tuple[str, int] = (str(name[0]), int(name[1]))
        self.render = render
        self.health = health
        self.most = most
        self.timeout = timeout
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel = selectors.DefaultSelector()
        self._conns: dict[socket.socket, _Conn] = {}  # insertion order: oldest accepted first
        self._paused_until: float | None = None  # accepting paused for want of descriptors
        self._logged_room = -1e9
        self._tokens = float(ACCEPT_BURST)  # accepts allowed now (ACCEPT_RATE a second, ACCEPT_BURST at most)
        self._filled = time.monotonic()
        self.accepted = 0
        self.evicted = 0  # closed to make room for a newer one
        self.refused = 0  # closed at once: every one held was being answered
        self.timed_out = 0  # sent no whole request head, or took no answer, in time

    def held(self) -> int:
        return len(self._conns)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def run(self) -> None:
        sel = self._sel
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while True:
                for key, mask in sel.select(self._wait(time.monotonic())):
                    if key.fileobj is self._wake_r:
                        return
                    if key.fileobj is self.listener:
                        self._accept()
                    elif key.data is not None and key.data.sock in self._conns:
                        self._ready(key.data, mask)
                self._expire(time.monotonic())
        except Exception:  # a bug: serve no more, but never take the process with it
            log.exception("the metrics endpoint failed; it serves no more")
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            for sock in (self.listener, self._wake_r, self._wake_w):
                sock.close()
            sel.close()

    def _wait(self, now: float) -> float:
        """Seconds until the next deadline (or the end of a pause), at most 1."""
        soonest = now + 1.0
        if self._paused_until is not None:
            if now >= self._paused_until:
                self._paused_until = None
                self._sel.register(self.listener, selectors.EVENT_READ)
            else:
                soonest = min(soonest, self._paused_until)
        for conn in self._conns.values():
            soonest = min(soonest, conn.deadline)
        return max(0.0, soonest - now)

    def _accept(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(ACCEPT_BURST), self._tokens + (now - self._filled) * ACCEPT_RATE)
        self._filled = now
        for _ in range(ACCEPT_BATCH):
            if self._tokens < 1.0:  # the rest wait in the backlog until a token is due
                self._sel.unregister(self.listener)
                self._paused_until = now + (1.0 - self._tokens) / ACCEPT_RATE
                return
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_ROOM:
                    self._pause(exc)
                return  # a connection aborted before accept, or worse: the next turn tries again
            self.accepted += 1
            self._tokens -= 1.0
            sock.setblocking(False)
            if len(self._conns) >= self.most:
                victim = next((c for c in self._conns.values() if c.state != _WRITING), None)
                if victim is None:
                    self.refused += 1
                    with contextlib.suppress(OSError):
                        sock.send(_REFUSED)
                    sock.close()
                    continue
                self.evicted += 1
                self._close(victim)
            conn = _Conn(sock, time.monotonic() + self.timeout)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            # A scraper's request is usually in by the time it is accepted: read it now, so that it is
            # answered before the next connection of a flood could take its place.
            self._read(conn)

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors: stop watching the listener for a moment (it stays readable; no spin)."""
        now = time.monotonic()
        if now - self._logged_room >= 10.0:
            self._logged_room = now
            log.warning("metrics: accept failed (%s); pausing %g s", exc.strerror or exc, ACCEPT_BACKOFF)
        self._sel.unregister(self.listener)
        self._paused_until = now + ACCEPT_BACKOFF

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            if conn.state != _DRAINING:
                self.timed_out += 1
            self._close(conn)

    def _ready(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._write(conn)
        elif mask & selectors.EVENT_READ:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.state == _DRAINING:
            return
        conn.buf += data
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.buf.find(b"\n\n")
        if end < 0 or end > MAX_REQUEST_HEAD:
            if len(conn.buf) > MAX_REQUEST_HEAD:
                self._answer(conn, 431, "Request Header Fields Too Large", b"request head too long\n")
            return
        self._request(conn, bytes(conn.buf[:end]))

    def _request(self, conn: _Conn, head: bytes) -> None:
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._answer(conn, 400, "Bad Request", b"not an HTTP request\n")
            return
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            self._answer(conn, 405, "Method Not Allowed", b"only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
            return
        head_only = method == b"HEAD"
        path = target.split(b"?", 1)[0]
        if self.health is not None and path in (LIVE_PATH.encode(), READY_PATH.encode()):
            self._probe(conn, path.decode("ascii"), head_only)
            return
        if path != b"/metrics":
            here = b"/metrics, /healthz and /readyz are" if self.health is not None else b"/metrics is"
            self._answer(conn, 404, "Not Found", b"only " + here + b" here\n", head_only=head_only)
            return
        try:
            body = self.render().encode("utf-8")
        except Exception:
            log.exception("metrics: the text could not be made")
            self._answer(conn, 500, "Internal Server Error", b"the metrics could not be made\n", head_only=head_only)
            return
        self._answer(conn, 200, "OK", body, CONTENT_TYPE, head_only)

    def _probe(self, conn: _Conn, path: str, head_only: bool) -> None:
        """A probe's answer: 200 or 503 and the health's JSON body (state kept in memory: no wait)."""
        assert self.health is not None
        try:
            answered = self.health.answer(path)
        except Exception:
            log.exception("metrics: the health answer could not be made")
            answered = None
        if answered is None:
            self._answer(conn, 500, "Internal Server Error", b"the health answer could not be made\n",
                         head_only=head_only)
            return
        ok, body = answered
        status, reason = (200, "OK") if ok else (503, "Service Unavailable")
        self._answer(conn, status, reason, body, "application/json", head_only)

    def _answer(self, conn: _Conn, status: int, reason: str, body: bytes,
                content_type: str = "text/plain; charset=utf-8", head_only: bool = False, extra: str = "") -> None:
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n{extra}\r\n").encode("ascii")
        conn.state = _WRITING
        conn.buf = bytearray()
        conn.out = memoryview(head if head_only else head + body)
        conn.deadline = time.monotonic() + self.timeout
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            conn.sent += conn.sock.send(conn.out[conn.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.sent < len(conn.out):
            return
        # All sent: say so, then read and drop until the caller closes, so it reads the answer, not a reset.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = _DRAINING
        conn.out = memoryview(b"")
        conn.deadline = min(conn.deadline, time.monotonic() + _DRAIN)
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

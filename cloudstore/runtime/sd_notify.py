"""systemd's readiness and watchdog protocol (``Type=notify``, ``WatchdogSec=``), with the socket module alone.

A unit of ``Type=simple`` is "started" once the process is forked, before
the bridge has its socket or the scheduler has asked its store, so units
ordered after it start too early, and a hung loop is never noticed (issue
46, item 1).  systemd passes ``NOTIFY_SOCKET`` (a Unix datagram socket: a
path, or ``@name`` in the abstract namespace) and, with ``WatchdogSec=``,
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``); the program sends ``READY=1``
once it serves, ``WATCHDOG=1`` at least every half of that interval while
its loop is alive (``Watchdog``: it asks ``Health.live``), and
``STOPPING=1`` when told to stop.  Each message is one datagram of
``KEY=VALUE`` lines (sd_notify(3)).

The environment is untrusted: a ``NOTIFY_SOCKET`` that is no Unix socket
address this module can use, or a malformed ``WATCHDOG_USEC``, is ignored
with a warning naming it and the rule, never fatal: outside systemd the
program runs as it would without.  The three variables are removed from
the process's environment once read, as sd_notify(3)'s ``unset_environment``
does: the drivers and fire commands started later are not the unit's main
process and must not speak for it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, MutableMapping

log = logging.getLogger("cloudstore.runtime.sd_notify")

NOTIFY_SOCKET = "NOTIFY_SOCKET"
WATCHDOG_USEC = "WATCHDOG_USEC"
WATCHDOG_PID = "WATCHDOG_PID"
#: The longest Unix socket address (``sun_path`` is 108 bytes, one of them the path's closing NUL).
ADDRESS_MOST = 107
#: Seconds a datagram's send may wait for room in the receiver's queue before it is given up (logged).
SEND_TIMEOUT = 2.0
#: The longest watchdog interval taken (a day): past it, the value is a mistake, not a choice.
WATCHDOG_MOST_USEC = 86_400 * 1_000_000


def socket_address(text: str) -> str | None:
    """Why ``text`` is no ``NOTIFY_SOCKET`` this module can send to, or None when it is one."""
    if not text:
        return "is empty"
    if "\0" in text:
        return "holds a NUL character"
    if not text.startswith(("/", "@")):
        return "must be an absolute path or @name (an abstract Unix socket); no other kind is supported"
    if len(text.encode("utf-8", "surrogateescape")) > ADDRESS_MOST:
        return f"is longer than a Unix socket address may be ({ADDRESS_MOST} bytes)"
    if text == "@":
        return "names no abstract socket"
    return None


def watchdog_seconds(env: MutableMapping[str, str]) -> float | None:
    """The watchdog interval systemd asks of this process (``WATCHDOG_USEC``), if any; a warning when malformed.

    None when unset, or when ``WATCHDOG_PID`` names another process (the
    variables were inherited from a parent that was the unit's main process).
    """
    raw = env.get(WATCHDOG_USEC)
    if raw is None:
        return None
    pid = env.get(WATCHDOG_PID)
    if pid is not None and pid != str(os.getpid()):
        return None
    if not raw.isdigit() or not 0 < int(raw) <= WATCHDOG_MOST_USEC:
        log.warning("%s=%r ignored: it must be a whole number of microseconds from 1 to %d; no watchdog "
                    "pings are sent", WATCHDOG_USEC, raw[:40], WATCHDOG_MOST_USEC)
        return None
    return int(raw) / 1e6


class Notifier:
    """Sends state lines to systemd's notify socket; a failure is logged once, never raised."""

    def __init__(self, address: str, watchdog: float | None = None) -> None:
        # An abstract socket's name starts with a NUL byte where systemd's text has "@".
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.shown = address
        self.watchdog = watchdog  # seconds systemd waits for a WATCHDOG=1, or None
        self._failing = False
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None) -> Notifier | None:
        """The notifier ``NOTIFY_SOCKET`` names (None outside systemd, or when it is unusable: a warning).

        The variables are removed from ``env`` (``os.environ`` by default) once read.
        """
        env = os.environ if env is None else env
        watchdog = watchdog_seconds(env)
        address = env.get(NOTIFY_SOCKET)
        for name in (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID):
            env.pop(name, None)
        if address is None:
            return None
        problem = socket_address(address)
        if problem is not None:
            log.warning("%s=%r ignored: it %s; systemd is told nothing (with Type=notify the unit's start "
                        "will time out)", NOTIFY_SOCKET, address[:120], problem)
            return None
        return cls(address, watchdog)

    def send(self, *lines: str) -> bool:
        """Send ``lines`` (``READY=1``, ...) as one datagram; whether it was sent."""
        data = "\n".join(lines).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # A receiver that reads nothing (its queue full) blocks a datagram's send: bounded, so neither
                # the start (READY=1) nor the watchdog's thread hangs on it.
                sock.settimeout(SEND_TIMEOUT)
                sock.sendto(data, self.address)
        except OSError as exc:
            with self._lock:
                first, self._failing = not self._failing, True
            if first:  # once until it works again: a ping every few seconds must not flood the log
                log.warning("cannot notify systemd at %s=%s: %s", NOTIFY_SOCKET, self.shown, exc.strerror or exc)
            return False
        with self._lock:
            self._failing = False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def stopping(self) -> bool:
        return self.send("STOPPING=1")


class Watchdog:
    """Sends ``WATCHDOG=1`` every half of systemd's interval while ``alive()`` says the program's loop turns.

    A loop that stops turning is then restarted by systemd (``Restart=``)
    once the interval passes without a ping, as Kubernetes does on a failed
    liveness probe.  One daemon thread; ``stop`` ends it.
    """

    def __init__(self, notifier: Notifier, alive: Callable[[], bool]) -> None:
        self.notifier = notifier
        self.alive = alive
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        if self.notifier.watchdog is not None:
            self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        assert self.notifier.watchdog is not None
        every = self.notifier.watchdog / 2
        while True:
            try:
                if self.alive():
                    self.notifier.send("WATCHDOG=1")
            except Exception:  # a bug here must not end the pings' thread silently
                log.exception("the systemd watchdog check failed")
            if self._stop.wait(every):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def announce_ready(notifier: Notifier | None, alive: Callable[[], bool], status: str) -> Watchdog | None:
    """Tell systemd the program serves (``READY=1``, with ``status``) and start its watchdog pings, if asked."""
    if notifier is None:
        return None
    notifier.ready(status)
    return Watchdog(notifier, alive).start()


def announce_stopping(notifier: Notifier | None, watchdog: Watchdog | None) -> None:
    """Tell systemd the program is stopping (``STOPPING=1``) and end the pings."""
    if watchdog is not None:
        watchdog.stop()
    if notifier is not None:
        notifier.stopping()

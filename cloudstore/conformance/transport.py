"""How one request reaches a driver: the only thing the checks know about it.

A check builds request dicts (or raw bytes, to test malformed input) and gets
reply dicts back; whether they travel through a ``serve`` process, a ``call``
process each, or (later) the store bridge's socket is this module's business.
A new way in is a new :class:`Transport` subclass with :meth:`Transport.raw`
and :meth:`Transport.sessions`; no check changes.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from abc import ABC, abstractmethod
from typing import IO

from ..protocol.client import DriverError, ServeProcess, call_once, dumps
from .expect import Json
from .program import CALL_SECONDS, Driver


def _no_constants(name: str) -> Json:
    raise ValueError(f"{name} is not JSON")


def parse_reply(lines: list[str]) -> dict[str, Json]:
    """The one reply in ``lines``; DriverError unless it is exactly one JSON object with a string ``reply``.

    ``NaN``/``Infinity`` are refused: Python's json accepts them, JSON does not.
    """
    if len(lines) != 1:
        raise DriverError(f"expected one reply line, got {len(lines)}: {[line[:120] for line in lines[:4]]!r}")
    try:
        value = json.loads(lines[0], parse_constant=_no_constants)
    except ValueError as exc:
        raise DriverError(f"reply is not JSON ({exc}): {lines[0][:200]!r}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("reply"), str):
        raise DriverError(f"reply is not an object with a string `reply`: {lines[0][:200]!r}")
    return value


class Transport(ABC):
    """A way to send requests to one driver.

    ``mode`` names it in results; ``race_window_ms`` is how far apart (at
    worst) racers released together may reach the driver, which the lease
    races size their ``lapse_ms`` by.
    """

    mode: str = "?"
    race_window_ms: int = 1000

    @abstractmethod
    def raw(self, line: bytes) -> list[str]:
        """Send one request line as bytes (no newline inside); the stdout lines it answered."""

    def request(self, request: Json | bytes) -> dict[str, Json]:
        """Send a request (a JSON value, or raw bytes as they are); its one reply."""
        line = request if isinstance(request, bytes) else dumps(request).encode()
        return parse_reply(self.raw(line))

    @abstractmethod
    def sessions(self, count: int) -> list[Transport]:
        """``count`` channels that may be used at once, one thread each (racers)."""

    def warm(self, agent: dict[str, Json]) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Make this channel ready to answer at once (start its process, connect, import)."""

    def close(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Let everything this transport started go."""


class CallTransport(Transport):
    """``PROGRAM call`` once per request: every request is a process of its own.

    Also holds every reply to the call-mode discipline: one stdout line, exit 0.
    """

    mode = "call"
    race_window_ms = 5000  # racers each start a process (an SDK import may take a second)

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def raw(self, line: bytes) -> list[str]:
        try:
            lines, err, code = call_once(self.driver.argv, line, self.driver.env, timeout=CALL_SECONDS)
        except FileNotFoundError as exc:
            raise DriverError(f"cannot run {self.driver.argv!r}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise DriverError(f"call took past {CALL_SECONDS}s") from exc
        if code != 0:
            raise DriverError(
                f"call exited {code}; stdout {[x[:120] for x in lines[:3]]!r}; stderr {err.strip()[-300:]!r}"
            )
        return lines

    def sessions(self, count: int) -> list[Transport]:
        # Stateless: each request is its own process already, so one object serves all racers.
        return [self] * count


class ServeTransport(Transport):
    """One ``PROGRAM serve`` process, started when first needed and again after it failed.

    Its driver's stderr is kept in a temporary file, so a driver that dies
    explains itself in the failing check's line instead of the terminal.
    """

    mode = "serve"
    race_window_ms = 1000

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self._proc: ServeProcess | None = None
        self._stderr: IO[bytes] | None = None
        self._pool: list[ServeTransport] = []

    def _process(self) -> ServeProcess:
        if self._proc is None or not self._proc.alive():
            self._drop()
            self._stderr = tempfile.TemporaryFile()
            try:
                self._proc = ServeProcess(self.driver.argv, self.driver.env, stderr=self._stderr)
            except FileNotFoundError as exc:
                raise DriverError(f"cannot run {self.driver.argv!r}: {exc}") from exc
        return self._proc

    def _drop(self) -> str:
        """Kill the process (if any); the tail of what it wrote on stderr."""
        tail = ""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None
        if self._stderr is not None:
            self._stderr.seek(0)
            tail = self._stderr.read()[-400:].decode("utf-8", "replace").strip()
            self._stderr.close()
            self._stderr = None
        return tail

    def raw(self, line: bytes) -> list[str]:
        if b"\n" in line:
            raise ValueError("a serve request is one line")
        try:
            return [self._process().request_line(line, timeout=CALL_SECONDS)]
        except (DriverError, UnicodeDecodeError) as exc:
            # Out of step with the driver now (or it died): start afresh next time.
            tail = self._drop()
            raise DriverError(f"{exc}; driver stderr: {tail!r}") from exc

    def sessions(self, count: int) -> list[Transport]:
        while len(self._pool) < count:
            self._pool.append(ServeTransport(self.driver))
        return list(self._pool[:count])

    def warm(self, agent: dict[str, Json]) -> None:
        self.request({"op": "last", "agent": agent, "thread": "lnk-store-check warm"})

    def close(self) -> None:
        for member in self._pool:
            member.close()
        self._pool.clear()
        if self._proc is not None:
            self._proc.close(timeout=5)
            self._proc = None
        self._drop()

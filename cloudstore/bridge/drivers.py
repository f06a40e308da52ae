"""The bridge's driver processes: at most ``max_drivers`` at once, kept or run once.

A driver whose contract says ``serve`` is kept running between calls, one
process answering one call at a time. Each process is started with one
environment, and ``LNK_STORE_DIR`` differs per agent, so a process serves one
agent only: idle processes are kept per agent and the longest idle is stopped
when another agent needs the room. A driver without ``serve`` is run once per
call (``call``), and each such run takes one of the same places.

Every failure is turned into one of three exceptions the bridge words as its
answer: ``DriverTimeout`` (past ``call_timeout``; the process is killed),
``DriverFailed`` (died, or answered something that is not one reply line; the
process is dropped so the next call gets a fresh one) and ``NoDriverFree``.
"""

from __future__ import annotations

import heapq
import json
import logging
import subprocess
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CloudstoreError
from ..protocol.client import DriverError, ServeProcess, call_once, driver_env, program_argv

log = logging.getLogger("cloudstore.bridge")

STDERR_LOGGED = 2000  # characters of a failed call's stderr kept in the bridge's log


class DriverTimeout(CloudstoreError):
    """The driver took past the call's time; it was killed (what it did meanwhile: ``changed`` is None)."""

    changed = None


class DriverFailed(CloudstoreError):
    """The driver died or did not answer one JSON reply line (what it did: ``changed`` is None).

    ``sent`` False: the driver never ran (it could not be started), so the
    request reached no driver and certainly nothing was changed.
    """

    changed: bool | None = None

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent
        if not sent:
            self.changed = False


class NoDriverFree(CloudstoreError):
    """Every driver place stayed taken for as long as a call may take."""


@dataclass(frozen=True)
class Contract:
    """What a driver program says it does (``lnk-<name> contract``)."""

    version: int
    serve: bool = False
    jobs: bool = False
    files: bool = False

    @classmethod
    def from_json(cls, value: Any) -> Contract:
        """Only a literal ``true`` turns a capability on; a key left out means false."""
        if not isinstance(value, dict):
            raise ValueError("the contract is not a JSON object")
        version = value.get("version")
        if version != 1 or isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"contract version {version!r}: this bridge speaks version 1")
        return cls(1, *(value.get(k) is True for k in ("serve", "jobs", "files")))

    def __str__(self) -> str:
        """For the operator's log: ``contract version 1: serve, jobs, files`` (never a Python repr)."""
        able = [name for name in ("serve", "jobs", "files") if getattr(self, name)]
        return f"contract version {self.version}: " + (", ".join(able) if able else "no serve, jobs or files")


def read_contract(
    program: str | Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> Contract:
    """Ask the program once what it does; ValueError when it answers nothing usable.

    Strict: exit 0 and exactly one line, a valid contract.  (The conformance
    suite's ``program.printed_contract`` is the lenient look it runs by.)
    """
    try:
        done = subprocess.run(
            program_argv(program) + ["contract"], capture_output=True, env=driver_env(env), timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"{program!r} contract: {exc}") from exc
    lines = done.stdout.decode("utf-8", "replace").splitlines()
    if done.returncode != 0 or len(lines) != 1:
        err = done.stderr.decode("utf-8", "replace")[-500:]
        raise ValueError(f"{program!r} contract exited {done.returncode} with {len(lines)} lines; stderr: {err}")
    try:
        return Contract.from_json(json.loads(lines[0]))
    except ValueError as exc:
        raise ValueError(f"{program!r} contract: {exc}") from exc


def check_reply_line(text: str) -> str:
    """The driver's reply line if it is one JSON object with a string ``reply``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DriverFailed(f"the driver answered something that is not JSON: {text[:200]!r}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("reply"), str):
        raise DriverFailed(f"the driver answered something that is not a reply: {text[:200]!r}")
    return text


class _Watch:
    """One armed deadline: the process is killed at it unless disarmed first."""

    def __init__(self, proc: ServeProcess, at: float) -> None:
        self.proc = proc
        self.at = at
        self.done = False
        self.fired = False

    def disarm(self) -> bool:
        """Stop watching; whether the kill already happened."""
        with _Watchdog.lock:
            self.done = True
            return self.fired


class _Watchdog:
    """Kills serve processes at their calls' deadlines, whatever the caller is
    blocked on (writing a large request to a driver that stopped reading, or
    waiting for its line). One thread for every call: arming or disarming a
    deadline wakes nobody, so a call costs no thread switch of its own.
    Exactly one of ``disarm`` and the kill wins.
    """

    lock = threading.Lock()

    def __init__(self) -> None:
        self._cond = threading.Condition(self.lock)
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = 0
        self._thread: threading.Thread | None = None

    def arm(self, proc: ServeProcess, seconds: float) -> _Watch:
        watch = _Watch(proc, time.monotonic() + seconds)
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (watch.at, self._seq, watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bridge-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is watch:
                self._cond.notify()
        return watch

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, watch = heapq.heappop(self._heap)
                if watch.done:
                    continue
                watch.done = watch.fired = True
            watch.proc.kill()


_WATCHDOG = _Watchdog()


class DriverPool:
    """At most ``max_drivers`` driver processes, shared by every agent of a bridge."""

    def __init__(
        self,
        program: str | Sequence[str],
        contract: Contract,
        max_drivers: int = 4,
        call_timeout: float = 30.0,
    ) -> None:
        self.program = program
        self.contract = contract
        self.max_drivers = max_drivers
        self.call_timeout = call_timeout
        self._cond = threading.Condition()
        self._places = 0  # processes alive (idle or busy) plus call-mode runs under way
        self._idle: list[tuple[Hashable, ServeProcess]] = []  # longest idle first
        self._busy: set[ServeProcess] = set()
        self._waiting: dict[Hashable, int] = {}  # calls waiting for a place, per agent
        self._closed = False

    # -- places ------------------------------------------------------------

    def _take_place(self, key: Hashable, deadline: float) -> tuple[ServeProcess | None, list[ServeProcess]]:
        """Under the lock: an idle process of ``key``, or a free place (None).

        Also returns processes to stop outside the lock: dead idle ones found
        on the way, or the longest idle one of another agent, evicted to make
        room. An evicted process's place passes straight to this caller; a
        process some call of its own agent is waiting for is never evicted, so
        agents' calls do not churn each other's processes.
        """
        drop: list[ServeProcess] = []
        with self._cond:
            while True:
                if self._closed:
                    raise DriverFailed("the bridge is stopping", sent=False)
                for i, (k, proc) in enumerate(self._idle):
                    if k == key:
                        del self._idle[i]
                        if proc.alive():
                            self._busy.add(proc)
                            return proc, drop
                        self._places -= 1  # it died while idle (killed, crashed)
                        drop.append(proc)
                        break
                else:
                    if self._places < self.max_drivers:
                        self._places += 1
                        return None, drop
                    victim = next((i for i, (k, _) in enumerate(self._idle) if not self._waiting.get(k)), None)
                    if victim is not None:
                        drop.append(self._idle.pop(victim)[1])
                        return None, drop
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise NoDriverFree(f"all {self.max_drivers} drivers stayed busy for {self.call_timeout:g} s")
                    self._waiting[key] = self._waiting.get(key, 0) + 1
                    try:
                        self._cond.wait(remaining)
                    finally:
                        self._waiting[key] -= 1
                        if not self._waiting[key]:
                            del self._waiting[key]

    def _give_back(self, key: Hashable, proc: ServeProcess | None, keep: bool) -> None:
        """Return a place; a healthy serve process stays idle for its agent.

        One that failed is killed; a healthy one the stopping bridge no longer
        keeps is let go at end of stdin, as every serve process ends.
        """
        with self._cond:
            kept = proc is not None and keep and not self._closed and proc.alive()
            if proc is not None:
                self._busy.discard(proc)
            if kept and proc is not None:  # (kept implies a process: for the type checker)
                self._idle.append((key, proc))
            else:
                self._places -= 1
            self._cond.notify_all()
        if proc is not None and not kept:
            if keep:
                proc.close(timeout=5.0)
            else:
                proc.kill()

    # -- calls ---------------------------------------------------------------

    def call(self, key: Hashable, env: Mapping[str, str], line: bytes) -> bytes:
        """Answer one request line with the driver's reply line (no newline)."""
        deadline = time.monotonic() + self.call_timeout
        proc, drop = self._take_place(key, deadline)
        for old in drop:
            old.close(timeout=2.0)
        if not self.contract.serve:
            try:
                return self._call_once(env, line)
            finally:
                self._give_back(key, None, False)
        if proc is None:
            try:
                proc = ServeProcess(self.program, env)
            except OSError as exc:
                self._give_back(key, None, False)
                raise DriverFailed(f"cannot start the driver: {exc}", sent=False) from exc
            with self._cond:
                self._busy.add(proc)
        keep = False
        try:
            reply = self._serve_one(proc, line)
            keep = True
            return reply
        finally:
            self._give_back(key, proc, keep)

    def _serve_one(self, proc: ServeProcess, line: bytes) -> bytes:
        watch = _WATCHDOG.arm(proc, self.call_timeout)
        try:
            text = proc.request_line(line)
        except (DriverError, ValueError) as exc:
            if watch.disarm():
                raise DriverTimeout(f"the driver took past {self.call_timeout:g} s and was stopped") from exc
            raise DriverFailed(str(exc)) from exc
        if watch.disarm():
            # Answered just as it was killed: the answer stands, the process is gone.
            raise DriverFailed("the driver was stopped at its time limit as it answered")
        return check_reply_line(text).encode("utf-8")

    def _call_once(self, env: Mapping[str, str], line: bytes) -> bytes:
        try:
            lines, err, code = call_once(self.program, line, env, timeout=self.call_timeout)
        except subprocess.TimeoutExpired as exc:
            raise DriverTimeout(f"the driver took past {self.call_timeout:g} s and was stopped") from exc
        except OSError as exc:
            log.warning("cannot run the driver: %s", exc)
            raise DriverFailed(f"cannot run the driver ({type(exc).__name__})", sent=False) from exc
        if code != 0 or len(lines) != 1:
            # The driver's stderr is the operator's, not the caller's: it may name
            # folders, endpoints and buckets. It goes to the bridge's log, cut short.
            log.warning(
                "driver call exited %d with %d stdout lines; stderr ends: %s", code, len(lines), err[-STDERR_LOGGED:]
            )
            raise DriverFailed(f"call exited {code} with {len(lines)} stdout lines")
        return check_reply_line(lines[0]).encode("utf-8")

    # -- the end -------------------------------------------------------------

    def close(self) -> None:
        """Stop every process: idle ones end at end of stdin, busy ones are killed."""
        with self._cond:
            self._closed = True
            idle = [p for _, p in self._idle]
            busy = list(self._busy)
            self._places -= len(idle)
            self._idle.clear()
            self._cond.notify_all()
        for proc in idle:
            proc.close(timeout=5.0)
        for proc in busy:
            proc.kill()

    def counts(self) -> dict[str, int]:
        """How many places are taken and processes idle (for tests and logs)."""
        with self._cond:
            return {"places": self._places, "idle": len(self._idle), "busy": len(self._busy)}

"""The bridge's driver processes: at most ``max_drivers`` at once, kept or run once.

A driver whose contract says ``serve`` is kept running between calls, one
process answering one call at a time. Each process is started with one
environment, and ``LNK_STORE_DIR`` differs per agent, so by default a process
serves one agent only. Who gets a place, and for how long, is
``places.Places``: a fair share per agent, round-robin across agents and FIFO
within one, an agent's driver reused for its own waiting calls for a turn. A
driver without ``serve`` is run once per call (``call``), and each such run
takes one of the same places.

With ``shared`` (the operator's ``--shared-drivers``, for a driver that keeps
nothing in ``LNK_STORE_DIR``, as this project's cloud drivers keep nothing on
the machine), drivers run without ``LNK_STORE_DIR`` and a process is keyed by
its whole environment, the same for every agent: any agent's call reuses any
idle or handed-on process (each request names its agent, and the bridge has
checked that name against the proof), so with more agents than places calls
run at one agent's speed, not a driver start each. Places are still shared
by agent, as above.

Every failure is turned into one of three exceptions the bridge words as its
answer: ``DriverTimeout`` (past ``call_timeout``; the process is killed),
``DriverFailed`` (died, or answered something that is not one reply line; the
process is dropped so the next call gets a fresh one) and ``NoDriverFree``.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CloudstoreError
from ..protocol.client import DriverError, ReplyTooLong, ServeProcess, call_once, driver_env, program_argv
from .cost import parse_cost
from .places import QUANTUM, SHARED_QUANTUM, Grant, NoPlace, Places, PlacesClosed

log = logging.getLogger("cloudstore.bridge")

STDERR_LOGGED = 2000  # characters of a failed call's stderr kept in the bridge's log
STORE_DIR = "LNK_STORE_DIR"  # the agent's folder for a driver's own things (store-interface.txt)


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


class ReplyOverLimit(DriverFailed):
    """The driver's reply line is over what the bridge passes on; the driver was stopped."""


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


#: The most a reply line may cost to check by parsing it (``cost.parse_cost``); a longer one is
#: checked for its shape only: one object whose first member is a string ``reply``.
PARSE_MOST = 4 * 1024 * 1024
_REPLY_SHAPE = re.compile(rb'\s*\{\s*"reply"\s*:\s*"[a-z_]*"\s*[,}]')


def check_reply_line(text: str | bytes) -> bytes:
    """The driver's reply line if it is one JSON object with a string ``reply``.

    Parsed whole when that costs at most ``PARSE_MOST``; a longer line (a
    large ``read``) would cost ~24 times its bytes as Python objects, so it is
    checked for its shape, at no cost beyond the line.
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    if parse_cost(data) > PARSE_MOST:
        if _REPLY_SHAPE.match(data) and data.rstrip().endswith(b"}"):
            return data
        raise DriverFailed(f"the driver answered something that is not a reply: {data[:200]!r}")
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise DriverFailed(f"the driver answered something that is not JSON: {data[:200]!r}") from exc
    if not isinstance(value, dict) or not isinstance(value.get("reply"), str):
        raise DriverFailed(f"the driver answered something that is not a reply: {data[:200]!r}")
    return data


class _Watch:
    """One armed deadline: the process is killed at it unless disarmed first."""

    def __init__(self, proc: ServeProcess, at: float) -> None:
        self.proc: ServeProcess | None = proc
        self.at = at
        self.done = False
        self.fired = False

    def disarm(self) -> bool:
        """Stop watching; whether the kill already happened.

        The process is let go at once (not kept until the deadline), so a
        driver the pool stops is freed with its pipes whatever the call's time.
        """
        with _Watchdog.lock:
            if not self.done:
                self.done = True
                self.proc = None
                _WATCHDOG.dropped()
            return self.fired


class _Watchdog:
    """Kills serve processes at their calls' deadlines, whatever the caller is
    blocked on (writing a large request to a driver that stopped reading, or
    waiting for its line). One thread for every call: arming or disarming a
    deadline wakes nobody, so a call costs no thread switch of its own.
    Exactly one of ``disarm`` and the kill wins.

    A disarmed watch holds no process, and the heap is rebuilt without the
    disarmed ones once they are most of it: its size stays within twice the
    calls under way (plus a few), whatever the call timeout.
    """

    lock = threading.Lock()
    COMPACT_AT = 64  # disarmed entries tolerated before a rebuild is considered

    def __init__(self) -> None:
        self._cond = threading.Condition(self.lock)
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = 0
        self._disarmed = 0  # disarmed watches still in the heap
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

    def dropped(self) -> None:
        """Under the lock: one more watch was disarmed; rebuild the heap once most are."""
        self._disarmed += 1
        if self._disarmed > self.COMPACT_AT and 2 * self._disarmed > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].done]
            heapq.heapify(self._heap)
            self._disarmed = 0

    def size(self) -> int:
        """Watches held (armed and not yet dropped disarmed ones), for tests."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, watch = heapq.heappop(self._heap)
                if watch.done:
                    self._disarmed -= 1
                    continue
                watch.done = watch.fired = True
                proc, watch.proc = watch.proc, None
            if proc is not None:
                proc.kill()


_WATCHDOG = _Watchdog()


class DriverPool:
    """At most ``max_drivers`` driver processes, shared fairly by every agent of a bridge (``places``)."""

    def __init__(
        self,
        program: str | Sequence[str],
        contract: Contract,
        max_drivers: int = 4,
        call_timeout: float = 30.0,
        quantum: int | None = None,
        max_reply_bytes: int = 17 * 1024 * 1024,
        shared: bool = False,
    ) -> None:
        self.program = program
        self.max_reply_bytes = max_reply_bytes
        self.contract = contract
        self.max_drivers = max_drivers
        self.call_timeout = call_timeout
        self.shared = shared
        if quantum is None:
            quantum = SHARED_QUANTUM if shared else QUANTUM
        self.places: Places[ServeProcess] = Places(max_drivers, quantum)
        self._lock = threading.Lock()
        self._busy: set[ServeProcess] = set()
        self.started = 0  # driver processes started (serve or call): what sharing saves, for tests and logs

    def _kind(self, key: Hashable, env: Mapping[str, str]) -> Hashable:
        """Which processes may serve a call: its agent's own, or (shared) any started with
        the same environment but ``LNK_STORE_DIR``, which shared drivers never get."""
        if not self.shared:
            return key
        return tuple(sorted((k, v) for k, v in env.items() if k != STORE_DIR))

    def _env(self, env: Mapping[str, str]) -> tuple[Mapping[str, str], tuple[str, ...]]:
        """A driver's environment and the names it must not inherit from the bridge's own."""
        if not self.shared:
            return env, ()
        return {k: v for k, v in env.items() if k != STORE_DIR}, (STORE_DIR,)

    def _take_place(self, key: Hashable, kind: Hashable, deadline: float) -> Grant[ServeProcess]:
        try:
            grant = self.places.take(key, deadline, kind)
        except NoPlace as exc:
            raise NoDriverFree(f"all {self.max_drivers} drivers stayed busy for {self.call_timeout:g} s") from exc
        except PlacesClosed as exc:
            raise DriverFailed(str(exc), sent=False) from exc
        if grant.proc is not None:
            with self._lock:
                self._busy.add(grant.proc)
        return grant

    def _give_back(self, grant: Grant[ServeProcess], proc: ServeProcess | None, keep: bool) -> None:
        """Return a place; a healthy serve process is passed on or kept idle for its agent.

        One that failed is killed; a healthy one the stopping bridge no longer
        keeps is let go at end of stdin, as every serve process ends.
        """
        if proc is not None:
            with self._lock:
                self._busy.discard(proc)
        healthy = proc is not None and keep and proc.alive()
        left = self.places.give(grant.key, proc if healthy else None, grant.turns, grant.kind)
        if proc is not None and not healthy:
            proc.kill()
        if left is not None:
            left.close(timeout=5.0)

    # -- calls ---------------------------------------------------------------

    def call(self, key: Hashable, env: Mapping[str, str], line: bytes) -> bytes:
        """Answer one request line of agent ``key`` with the driver's reply line (no newline)."""
        deadline = time.monotonic() + self.call_timeout
        grant = self._take_place(key, self._kind(key, env), deadline)
        for old in grant.drop:
            old.close(timeout=2.0)
        env, unset = self._env(env)
        if not self.contract.serve:
            try:
                return self._call_once(env, line, unset)
            finally:
                self._give_back(grant, None, False)
        proc = grant.proc
        if proc is None:
            try:
                with self._lock:
                    self.started += 1
                proc = ServeProcess(self.program, env, unset=unset)
            except OSError as exc:
                self._give_back(grant, None, False)
                raise DriverFailed(f"cannot start the driver: {exc}", sent=False) from exc
            with self._lock:
                self._busy.add(proc)
        keep = False
        try:
            reply = self._serve_one(proc, line)
            keep = True
            return reply
        finally:
            self._give_back(grant, proc, keep)

    def _serve_one(self, proc: ServeProcess, line: bytes) -> bytes:
        watch = _WATCHDOG.arm(proc, self.call_timeout)
        try:
            data = proc.request_bytes(line, most=self.max_reply_bytes)
        except ReplyTooLong as exc:
            watch.disarm()
            raise ReplyOverLimit(
                f"the driver's reply is over the {self.max_reply_bytes // (1024 * 1024)} MiB "
                "the bridge passes on; it was not passed on"
            ) from exc
        except (DriverError, ValueError) as exc:
            if watch.disarm():
                raise DriverTimeout(f"the driver took past {self.call_timeout:g} s and was stopped") from exc
            raise DriverFailed(str(exc)) from exc
        if watch.disarm():
            # Answered just as it was killed: the answer stands, the process is gone.
            raise DriverFailed("the driver was stopped at its time limit as it answered")
        return check_reply_line(data)

    def _call_once(self, env: Mapping[str, str], line: bytes, unset: tuple[str, ...] = ()) -> bytes:
        with self._lock:
            self.started += 1
        try:
            lines, err, code = call_once(self.program, line, env, timeout=self.call_timeout, unset=unset)
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
        return check_reply_line(lines[0])

    # -- the end -------------------------------------------------------------

    def close(self) -> None:
        """Stop every process: idle ones end at end of stdin, busy ones are killed."""
        idle = self.places.close()
        with self._lock:
            busy = list(self._busy)
        for proc in idle:
            proc.close(timeout=5.0)
        for proc in busy:
            proc.kill()

    def counts(self) -> dict[str, int]:
        """How many places are taken and processes idle or busy (for tests and logs)."""
        counts = self.places.counts()
        with self._lock:
            counts["busy"] = len(self._busy)
            counts["started"] = self.started
        return counts

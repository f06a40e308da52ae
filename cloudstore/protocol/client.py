"""Talk to a store driver program through its commands, as Link does.

Used by the conformance suite, the store bridge, the scheduler and the
benchmarks, so that there is one place that knows how a driver is run:
``call`` (one request on stdin, one reply line) or ``serve`` (one request a
line, kept running).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..errors import CloudstoreError

Json = Any


def program_argv(program: str | Sequence[str]) -> list[str]:
    """A driver given as a name, a path or a shell-quoted command line."""
    if isinstance(program, str):
        return shlex.split(program)
    return list(program)


def dumps(value: Json) -> str:
    """Compact JSON on one line, UTF-8 kept as is (names may be any unicode)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def driver_env(extra: Mapping[str, str] | None = None, unset: Collection[str] = ()) -> dict[str, str]:
    """This process's environment with ``extra`` laid over it, without the names in ``unset``
    (a setting the caller means the driver not to have, even if this process has it)."""
    env = dict(os.environ)
    if extra:
        env.update(extra)
    for name in unset:
        env.pop(name, None)
    return env


def env_pairs(pairs: Sequence[str], option: str, fail: Callable[[str], Any] | None = None) -> dict[str, str]:
    """Settings given as repeated ``KEY=VALUE`` options.

    A malformed one is reported through ``fail`` (an argparse parser's
    ``error``, which exits), or raised as ValueError naming ``option``.
    """
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            why = f"{option} takes KEY=VALUE, not {pair!r}"
            if fail is not None:
                fail(why)
            raise ValueError(why)
        env[key] = value
    return env


class DriverError(CloudstoreError):
    """The driver did not answer one JSON reply line (died, hung, or wrote junk).

    Whether the request was acted on, nobody can tell (``changed`` is None).
    """

    changed = None


class ReplyTooLong(DriverError):
    """The reply line is longer than the reader takes; only its first part was read."""


def call_once(
    program: str | Sequence[str],
    request: Json | bytes,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    unset: Collection[str] = (),
) -> tuple[list[str], str, int]:
    """Run ``program call`` once; (stdout lines, stderr, exit code).

    ``request`` is a JSON value, or raw bytes sent as they are (to test how a
    driver meets malformed input).
    """
    data = request if isinstance(request, bytes) else dumps(request).encode()
    done = subprocess.run(
        program_argv(program) + ["call"],
        input=data,
        capture_output=True,
        env=driver_env(env, unset),
        timeout=timeout,
    )
    out = done.stdout.decode("utf-8", "replace")
    return out.splitlines(), done.stderr.decode("utf-8", "replace"), done.returncode


def call(program: str | Sequence[str], request: Json, env: Mapping[str, str] | None = None) -> Json:
    """One request in ``call`` mode; the reply, or DriverError when not exactly one JSON line."""
    lines, err, code = call_once(program, request, env)
    if code != 0 or len(lines) != 1:
        raise DriverError(f"call exited {code} with {len(lines)} stdout lines; stderr: {err[-500:]}")
    return json.loads(lines[0])


class ServeProcess:
    """One ``program serve`` process answering request after request.

    Thread-safe: one request is in flight at a time, as the contract says.
    Stderr goes to ``stderr`` (inherited by default) so driver logs stay
    visible and never block the pipe.
    """

    def __init__(
        self,
        program: str | Sequence[str],
        env: Mapping[str, str] | None = None,
        stderr: Any = None,
        unset: Collection[str] = (),
    ) -> None:
        self.argv = program_argv(program) + ["serve"]
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=driver_env(env, unset),
        )
        self._lock = threading.Lock()
        self._ended = False  # killed or closed: its pipes are to be closed

    def request_line(self, line: bytes, timeout: float | None = None) -> str:
        """Send one raw line (newline added); the raw reply line, newline stripped."""
        return self.request_bytes(line, timeout).decode("utf-8")

    def request_bytes(self, line: bytes, timeout: float | None = None, most: int | None = None) -> bytes:
        """Send one raw line; the reply line's bytes, newline stripped.

        With ``most``, at most that many bytes of reply are read (ReplyTooLong
        past it, the rest left in the pipe: the caller is to drop the process),
        so a reply never costs more than ``most`` to hold.
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            with self._lock:
                try:
                    self.proc.stdin.write(line.rstrip(b"\n") + b"\n")
                    self.proc.stdin.flush()
                except (BrokenPipeError, OSError, ValueError) as exc:
                    raise DriverError(f"driver gone: {exc}") from exc
                try:
                    if most is not None:
                        reply = self.proc.stdout.readline(most + 1)
                        if len(reply) > most and not reply.endswith(b"\n"):
                            raise ReplyTooLong(f"the driver's reply line is over {most} bytes")
                    elif timeout is None:
                        reply = self.proc.stdout.readline()
                    else:
                        reply = _readline_within(self.proc, timeout)
                except (OSError, ValueError) as exc:
                    raise DriverError(f"driver gone: {exc}") from exc
        finally:
            # Killed while this request held the lock: its pipes are closed now. (The
            # killer sets ``_ended`` before it tries the lock, so one of the two closes them.)
            if self._ended:
                self._release_pipes()
        if not reply:
            raise DriverError(f"driver closed its stdout (exit {self.proc.poll()})")
        return reply.rstrip(b"\n")

    def request(self, request: Json, timeout: float | None = None) -> Json:
        """Send one request; its reply as JSON."""
        text = self.request_line(dumps(request).encode(), timeout)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise DriverError(f"not a JSON reply line: {text[:200]!r}") from exc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 5.0) -> int:
        """End stdin and wait; the exit code (killed past ``timeout``).

        Every pipe is closed once the process has ended, so a process that
        is let go leaves no descriptor behind, however long this object lives.
        """
        self._close_stdin()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._release_pipes()
        return code

    def kill(self) -> None:
        """Kill and reap the process, and close its pipes (see ``_release_pipes``)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._release_pipes()

    def _close_stdin(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _release_pipes(self) -> None:
        """Close stdin and stdout once the process is gone.

        A request in flight holds ``_lock`` and may be blocked on a pipe (the
        watchdog kills a process while its caller waits for the line); closing
        a buffered pipe waits for its reader, so then the request closes them
        itself as it ends (``request_line``'s ``finally``).
        """
        self._ended = True
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._close_pipes()
        finally:
            self._lock.release()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:
                    pass

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _readline_within(proc: subprocess.Popen, timeout: float) -> bytes:
    """readline with a time limit: a thread reads, we wait; DriverError past it.

    Not ``bridge.lines.LineReader`` (the socket line reader with a deadline):
    this reads a child's stdout pipe, a buffered file with no timeout of its
    own, shared with ``readline`` calls without one; a socket's ``settimeout``
    and ``recv`` have no counterpart there.  Past the limit the reading
    thread (a daemon) stays blocked until the driver answers or dies: the
    caller is to drop that process.
    """
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise DriverError(f"no reply within {timeout}s")
    return box[0]

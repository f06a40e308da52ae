"""Running the operator's fire command for one job.

The command gets the job's spec as compact JSON on stdin and who/what in its
environment: ``LNK_AGENT_ID``, ``LNK_JOB_ID``, ``LNK_JOB_DUE`` (the due as
JSON writes it), ``LNK_OWNER`` only when the agent has an owner (so "no
owner" and "owner ''" stay different, as on the wire), and
``LNK_JOB_RECOVERED=1`` when this is a second firing after a runner died
mid-fire, and ``LNK_JOB_FENCE``, the claim's fencing token: a whole number that
only grows across the job's successive fires (the claim lease's, leases.py),
so that a system the command writes to can refuse a superseded fire (one whose
runner was paused past the lapse while another fired the job again).

The claim is judged right before the command starts (``ready()``, after any
pause between the claim and the start: the scheduler asks the store about a
claim confirmed more than lapse/3 ago): a claim fenced or lost by then starts
nothing (``FireResult.ran`` false).  Its stdout goes to the runner's stderr: the runner writes nothing
on stdout.

Its environment is NOT the runner's: the runner holds the store's
credentials (``AWS_SECRET_ACCESS_KEY``, ``GOOGLE_APPLICATION_CREDENTIALS``...)
for its driver, and a job's command has no business with them.  It gets only
``BASE_ENV`` (and ``LC_*``) from the runner's environment, the variables the
config names in ``fire_pass_env``, the fixed values of ``fire_env``, and the
job's ``LNK_*`` variables, in that order (later ones win).

It runs in a session (process group) of its own, and the fire IS that
group: it is killed whole past ``timeout`` (SIGTERM, then SIGKILL after
``GRACE``), at once when the claim is lost or fenced (``stop`` answers why),
and when the command exits, what it left running in its group is killed (a
fire that has ended leaves nothing behind).  So that it also dies with its
runner, even one killed with SIGKILL (which no handler sees), each group is
registered with the runner's fire watcher (``fire_watch.py``, one process per
runner): when the runner's end closes the watcher's pipe, the watcher kills
every group still registered, within milliseconds.  That keeps "never by two
machines at once" true for a runner process that dies on a machine that
lives on, also for a shell line whose shell forks, a command that ignores
SIGTERM and what it starts in its group.  What a command moves into a new
session or group of its own (``setsid``, a daemon) is beyond any of this.

Between the start of a command and its registration (a few microseconds) a
runner's death is covered by the parent-death signal: on Linux, when
``setpriv`` is present, the command is started with ``--pdeathsig KILL``.  The
kernel sends it when the THREAD that started the command ends, so commands
are started only from the runner's worker threads, which live as long as the
runner.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .log import log
from .store_client import Agent

GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a fire past its timeout
POLL = 0.05  # how often a worker looks at its fire's claim while it runs
SHELL = "/bin/sh"  # runs a fire command given as one line

# Taken from the runner's environment (when set), with every LC_*: what any
# program needs to find programs, its home and temporary folder, and to speak
# the machine's language and time zone.  Nothing that may hold a credential.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR")
# Set by the runner for each job: the config may not name them (they would be overwritten).
JOB_VARS = frozenset({"LNK_OWNER", "LNK_AGENT_ID", "LNK_JOB_ID", "LNK_JOB_DUE", "LNK_JOB_RECOVERED", "LNK_JOB_FENCE"})
#: Read by the tests only: a job id whose fire makes the runner stop itself (SIGSTOP) right before the
#: claim's last look and the command's start, after logging ``test_stopping`` (a pause between a claim
#: and its fire, made to happen on purpose; tests/scheduler/test_pauses.py).
TEST_STOP_ENV = "LNK_SCHEDULER_TEST_STOP_BEFORE_FIRE"

# A shell line's first word that is not a program: reserved words and builtins
# that exist only inside the shell (those that are also programs, such as
# ``true`` or ``echo``, are found on PATH).  Such a line is not checked further.
_SHELL_WORDS = frozenset(
    "! { } case do done elif else esac fi for if in then until while "
    ". : alias bg break cd command continue eval exit export fc fg getopts hash jobs "
    "local read readonly return set shift source times trap type ulimit umask unalias unset wait".split()
)
_SHELL_SPECIAL = frozenset("$`*?[]~{}()<>;&|\\'\"")  # in a first word: expansions, globs, redirections...
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class FireResult:
    """How one firing went."""

    started: float  # time.time() just before the command was started
    exit: int | None  # its exit code (negative: killed by that signal), None if it could not start
    duration: float  # seconds until it was reaped
    killed: str | None  # "timeout", "fenced", "lost", or None
    error: str | None = None  # why it could not start
    ran: bool = True  # False: not started, the claim judged fenced or lost right before (``killed`` says which)


class FireWatcher:
    """The runner's link to its fire watcher process: groups registered while their fire runs.

    Started on first use and shared by every ``FireCommand`` of the process.
    The pipe's write end is held by this process only (not inheritable), so
    its end, however it comes, is the watcher's end of file.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pipe: Any = None

    def _start(self) -> None:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fire_watch.py")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not in the runner's group: a kill of that group leaves it to clean up
            close_fds=True,
        )
        self._pipe = self._proc.stdin

    def ready(self) -> None:
        """Start the watcher now if it is not running: before a command starts, so that registering the
        command's group right after is one pipe write, never a process start (under load the start took
        long enough for a runner killed meanwhile to leave the group unregistered and running)."""
        with self._lock:
            self._alive()

    def _alive(self) -> None:
        if self._pipe is None or (self._proc is not None and self._proc.poll() is not None):
            self._start()

    def _send(self, line: str) -> None:
        with self._lock:
            self._alive()
            try:
                self._pipe.write(line.encode("ascii"))
                self._pipe.flush()
            except OSError:  # the watcher died: a new one, told again
                self._start()
                self._pipe.write(line.encode("ascii"))
                self._pipe.flush()

    def add(self, pgid: int) -> None:
        """Kill group ``pgid`` if this process ends before ``remove``."""
        self._send(f"+{pgid}\n")

    def remove(self, pgid: int) -> None:
        """Group ``pgid``'s leader has been reaped: nothing to do for it any more."""
        self._send(f"-{pgid}\n")


WATCHER = FireWatcher()


def _death_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` where it exists: the command dies with its runner."""
    path = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [path, "--pdeathsig", "KILL", "--"] if path else []


def base_environment(
    environ: Mapping[str, str], pass_env: Sequence[str] = (), fire_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What every firing's environment starts from: ``BASE_ENV`` and ``LC_*``, then ``pass_env``, then ``fire_env``.

    Names in ``pass_env`` that ``environ`` lacks are left out (not set empty).
    """
    env = {k: v for k, v in environ.items() if k in BASE_ENV or k.startswith("LC_")}
    env.update({name: environ[name] for name in pass_env if name in environ})
    env.update(fire_env or {})
    for name in JOB_VARS:
        env.pop(name, None)
    return env


def shell_first_program(line: str) -> str | None:
    """The program a shell line starts with, when its first word is a plain one; else None (not judged).

    Leading ``NAME=value`` assignments and ``exec`` are skipped.  A first word
    with quotes removed that still holds an expansion, a glob, a redirection or
    other shell syntax, a reserved word or a shell-only builtin gives None: the
    shell decides those, only when it runs.
    """
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    after_exec = False
    try:
        for word in lexer:
            if _ASSIGNMENT.match(word) and not after_exec:
                continue  # NAME=value before the command
            if word == "exec" and not after_exec:
                after_exec = True
                continue
            if not word or set(word) & _SHELL_SPECIAL or word in _SHELL_WORDS or word.startswith("-"):
                return None
            return word
    except ValueError:  # an unclosed quote: the shell will say what it makes of it
        return None
    return None


def program_problem(command: str | Sequence[str], path: str) -> str | None:
    """Why ``command`` cannot start (its program is not an executable file on ``path``), or None.

    For an argv list, its first word, as ``execvp`` finds it (a name with a
    ``/`` is taken as is, relative to the working folder).  For a shell line,
    ``/bin/sh`` and the line's first program when ``shell_first_program`` can
    tell it.  Checked once at start-up, so that a typo stops the runner
    instead of counting every job fired with exit 127.
    """
    if isinstance(command, str):
        programs = [SHELL] + [p for p in [shell_first_program(command)] if p is not None]
    else:
        programs = list(command[:1])
    for program in programs:
        if not program:
            return "the command is empty"
        if shutil.which(program, path=path) is None:
            where = "" if "/" in program else " found on the fire command's PATH"
            return f"{program!r} is not an executable file{where}"
    return None


class FireCommand:
    """The operator's command: an argv list, or one shell command line, and the environment it gets."""

    def __init__(
        self,
        command: str | Sequence[str],
        timeout: float,
        pass_env: Sequence[str] = (),
        fire_env: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        base = [SHELL, "-c", command] if isinstance(command, str) else list(command)
        if not base:
            raise ValueError("the fire command is empty")
        self.argv = _death_prefix() + base
        self.timeout = timeout
        # Taken once, at start-up: what a job sees does not drift with the runner's environment.
        self.base_env = base_environment(os.environ if environ is None else environ, pass_env, fire_env)
        self.stop_before = (os.environ if environ is None else environ).get(TEST_STOP_ENV)

    def environment(self, agent: Agent, job: dict[str, Any], recovered: bool,
                    fence: int | None = None) -> dict[str, str]:
        """The base environment with this job's ``LNK_*`` variables."""
        env = dict(self.base_env)
        if agent.owner is not None:
            env["LNK_OWNER"] = agent.owner
        env["LNK_AGENT_ID"] = agent.id
        env["LNK_JOB_ID"] = str(job["id"])
        env["LNK_JOB_DUE"] = json.dumps(job["due"])
        if recovered:
            env["LNK_JOB_RECOVERED"] = "1"
        if fence is not None:
            env["LNK_JOB_FENCE"] = str(fence)
        return env

    def run(self, agent: Agent, job: dict[str, Any], recovered: bool, stop: Callable[[], str | None],
            fence: int | None = None, ready: Callable[[], str | None] | None = None) -> FireResult:
        """Run the command for ``job`` until it exits or is killed; ``ready()`` (else ``stop()``) is asked
        right before the start (a claim gone by then starts nothing), ``stop()`` polled while it runs."""
        spec = json.dumps(job.get("spec"), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        env = self.environment(agent, job, recovered, fence)
        if self.stop_before is not None and self.stop_before == str(job["id"]):
            self.stop_before = None  # once
            log("test_stopping", job=job["id"], pid=os.getpid())
            # At this thread: stopped on its way out of the call (a SIGSTOP sent to the process may stop
            # the other threads first and let this one start the command).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        why = (ready or stop)()
        started, clock = time.time(), time.monotonic()
        if why is not None:
            return FireResult(started, None, 0.0, why, f"not started: the claim was {why}", ran=False)
        try:
            WATCHER.ready()
        except OSError:
            pass  # no watcher (cannot start a process): the parent-death signal still covers the command
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=_stderr_fd(),
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return FireResult(started, None, time.monotonic() - clock, None, str(exc))
        try:
            WATCHER.add(proc.pid)
        except OSError:
            pass  # no watcher (cannot start a process): the parent-death signal still covers the command
        threading.Thread(target=_feed, args=(proc, spec), daemon=True).start()
        try:
            killed = self._wait(proc, clock, stop)
        finally:
            if proc.returncode is None:  # this thread is being torn down: take the group with it
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
            try:
                WATCHER.remove(proc.pid)
            except OSError:
                pass
        return FireResult(started, proc.returncode, time.monotonic() - clock, killed)

    def _wait(self, proc: subprocess.Popen, clock: float, stop: Callable[[], str | None]) -> str | None:
        """Reap the command; why it was killed, if it was."""
        deadline, terminated = clock + self.timeout, False
        while True:
            if _exited(proc, POLL):
                # Before reaping it (while its pid still names its group): what it left running goes too.
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
                return "timeout" if terminated else None
            why = stop()
            if why is not None:
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
                return why
            if time.monotonic() >= deadline:
                if terminated:
                    _kill_group(proc, signal.SIGKILL)
                    proc.wait()
                    return "timeout"
                _kill_group(proc, signal.SIGTERM)
                terminated, deadline = True, time.monotonic() + GRACE


def _exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether the command has exited within ``timeout`` s, leaving it unreaped (a zombie) where possible.

    Unreaped, its pid cannot be reused, so its group can still be killed by
    that number.  Without ``os.waitid`` it is reaped here (``Popen.wait``).
    """
    if not hasattr(os, "waitid"):
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    end, delay = time.monotonic() + timeout, 0.0005
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:  # reaped already (by Popen's own poll)
            return True
        remaining = end - time.monotonic()
        if remaining <= 0:
            return False
        delay = min(delay * 2, remaining, 0.05)
        time.sleep(delay)


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    """Write the spec and close stdin; a command that doesn't read it is fine."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
    except OSError:
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _stderr_fd() -> int | None:
    """The command's stdout: our stderr, keeping the runner's stdout empty."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _kill_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

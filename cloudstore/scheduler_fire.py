"""Running the operator's fire command for one job.

The command gets the job's spec as compact JSON on stdin and who/what in its
environment: ``LNK_AGENT_ID``, ``LNK_JOB_ID``, ``LNK_JOB_DUE`` (the due as
JSON writes it), ``LNK_OWNER`` only when the agent has an owner (an inherited
``LNK_OWNER`` is removed otherwise, so "no owner" and "owner ''" stay
different, as on the wire), and ``LNK_JOB_RECOVERED=1`` when this is a second
firing after a runner died mid-fire.  Its stdout goes to the runner's stderr:
the runner writes nothing on stdout.

It runs in a session (process group) of its own, so the whole group can be
killed: past ``timeout`` (SIGTERM, then SIGKILL after ``GRACE``), or at once
when the claim is lost or fenced (``stop`` answers why).  On Linux, when
``setpriv`` is present, the command is started with ``--pdeathsig KILL`` so it
dies with its runner, even one killed with SIGKILL (what it starts in turn is
not covered); that keeps "never by two machines at once" true also for a
runner process that dies on a machine that lives on.  The kernel sends it
when the THREAD that started the command ends, so commands are started only
from the runner's worker threads, which live as long as the runner.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .scheduler_store import Agent

GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a fire past its timeout
POLL = 0.05  # how often a worker looks at its fire's claim while it runs


@dataclass
class FireResult:
    """How one firing went."""

    started: float  # time.time() just before the command was started
    exit: Optional[int]  # its exit code (negative: killed by that signal), None if it could not start
    duration: float  # seconds until it was reaped
    killed: Optional[str]  # "timeout", "fenced", "lost", or None
    error: Optional[str] = None  # why it could not start


def _death_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` where it exists: the command dies with its runner."""
    path = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [path, "--pdeathsig", "KILL", "--"] if path else []


class FireCommand:
    """The operator's command: an argv list, or one shell command line."""

    def __init__(self, command: str | Sequence[str], timeout: float) -> None:
        base = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not base:
            raise ValueError("the fire command is empty")
        self.argv = _death_prefix() + base
        self.timeout = timeout

    def environment(self, agent: Agent, job: dict[str, Any], recovered: bool) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("LNK_OWNER", None)
        env.pop("LNK_JOB_RECOVERED", None)
        if agent.owner is not None:
            env["LNK_OWNER"] = agent.owner
        env["LNK_AGENT_ID"] = agent.id
        env["LNK_JOB_ID"] = str(job["id"])
        env["LNK_JOB_DUE"] = json.dumps(job["due"])
        if recovered:
            env["LNK_JOB_RECOVERED"] = "1"
        return env

    def run(self, agent: Agent, job: dict[str, Any], recovered: bool, stop: Callable[[], Optional[str]]) -> FireResult:
        """Run the command for ``job`` until it exits or is killed; ``stop()`` is polled."""
        spec = json.dumps(job.get("spec"), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        started, clock = time.time(), time.monotonic()
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=_stderr_fd(),
                env=self.environment(agent, job, recovered),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return FireResult(started, None, time.monotonic() - clock, None, str(exc))
        threading.Thread(target=_feed, args=(proc, spec), daemon=True).start()
        killed = self._wait(proc, clock, stop)
        return FireResult(started, proc.returncode, time.monotonic() - clock, killed)

    def _wait(self, proc: subprocess.Popen, clock: float, stop: Callable[[], Optional[str]]) -> Optional[str]:
        """Reap the command; why it was killed, if it was."""
        deadline, terminated = clock + self.timeout, False
        while True:
            try:
                proc.wait(POLL)
                return "timeout" if terminated else None
            except subprocess.TimeoutExpired:
                pass
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


def _stderr_fd() -> Optional[int]:
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

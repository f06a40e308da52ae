"""The driver as a program: how to run its commands other than a request.

``cloudstore.protocol.client`` runs ``call`` and ``serve``; the suite also has to run
``contract``, ``--version``, ``--help`` and deliberate usage errors (``call x``)
and look at their exit codes and stdout, which ``client`` has no function for.
:func:`run_command` is that one function, built on client's own argv and
environment helpers so a program is spelled and set up the same way everywhere.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..protocol.client import driver_env, program_argv
from .expect import Json

#: The contract's limit for one call; nothing a driver does should take longer.
CALL_SECONDS = 30.0


@dataclass(frozen=True)
class Driver:
    """A driver program (name on PATH, path, or shell-quoted command line) and its settings."""

    program: str | tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return program_argv(self.program)


@dataclass(frozen=True)
class Ran:
    """What one command did: its stdout lines, stderr and exit code."""

    stdout: bytes
    stderr: str
    code: int

    @property
    def lines(self) -> list[str]:
        return self.stdout.decode("utf-8", "replace").splitlines()


def run_command(driver: Driver, args: Sequence[str], stdin: bytes = b"", timeout: float = CALL_SECONDS) -> Ran:
    """Run ``PROGRAM args...`` with ``stdin``; never raises for a failing program.

    A program that cannot be started (not on PATH) or that hangs is reported as
    exit code 127 / -1 with the reason on stderr, so a check fails with it
    instead of the suite crashing.
    """
    try:
        done = subprocess.run(
            driver.argv + list(args),
            input=stdin,
            capture_output=True,
            env=driver_env(driver.env),
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        return Ran(b"", f"cannot run {driver.argv!r}: {exc}", 127)
    except subprocess.TimeoutExpired:
        return Ran(b"", f"{' '.join(args)} took past {timeout}s", -1)
    return Ran(done.stdout, done.stderr.decode("utf-8", "replace"), done.returncode)


def printed_contract(driver: Driver) -> tuple[dict[str, Json] | None, str]:
    """The first JSON object the program's ``contract`` prints, as it is; or None and why not.

    Lenient on purpose: the runner only needs to know which families to run;
    ``check.contract`` judges the exact line.  (The bridge's
    ``drivers.read_contract`` is the strict reading: exactly one line, a
    valid ``Contract``, or the bridge does not start.)
    """
    ran = run_command(driver, ["contract"])
    if ran.code != 0:
        return None, f"`contract` exited {ran.code}: {ran.stderr.strip()[-300:]}"
    for line in ran.lines:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value, ""
    return None, f"`contract` printed no JSON object: {ran.stdout[:200]!r}"

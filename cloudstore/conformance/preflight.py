"""Before any check: can the driver be run at all, and can it reach its store with the settings given?

Without this a setup mistake came back as a verdict: a program name with a
typo gave 22 FAIL lines and exit 1, a missing ``LNK_BUCKET_URL`` 58 FAIL
lines each saying the setting is not set, and then ``NOT KEPT`` and PASS
lines as if the driver had been judged.  A setup mistake is no verdict on
the driver, so it is told apart here, once, and the suite stops (exit 2)
with the one thing to fix:

1. the program is found and may be executed (the same lookup ``subprocess``
   makes: PATH as the driver's environment has it);
2. ``contract`` exits 0 and prints a JSON object (which families to run
   hangs on it; ``check.contract`` judges the exact line later);
3. a first read (``last`` on a fresh agent, which writes nothing) does not
   answer an error naming a setting: wire.md has a missing or malformed
   setting make every request an error that names the setting, so that
   reply is the driver saying its setup is wrong, not a failed promise.

Any other odd answer to the first read (no reply line, an error naming no
setting) is left to the checks: that is the driver's own behaviour to judge.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ..protocol.client import call_once, driver_env
from .expect import Json
from .program import CALL_SECONDS, Driver, printed_contract

#: How a setting is spelled in an error reply: an upper-case name with an underscore (LNK_BUCKET_URL).
SETTING_NAME = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]\b")


def one_line(text: str, limit: int = 400) -> str:
    """``text`` (a driver's words: untrusted) as one printable line of at most ``limit`` characters."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


class SetupError(ValueError):
    """The driver cannot be judged as set up: the message says what to fix (exit 2, no check run)."""


@dataclass(frozen=True)
class Ready:
    """What the pre-flight found: the program as it will be run, and what its ``contract`` printed."""

    argv: list[str]
    contract: dict[str, Json]


def resolved_argv(driver: Driver) -> list[str]:
    """The driver's argv with its program as the absolute path that will run; SetupError when none will."""
    argv = driver.argv
    if not argv:
        raise SetupError("PROGRAM is empty: name the driver program (a name on PATH, a path or a command line)")
    name = argv[0]
    found = shutil.which(name, path=driver_env(driver.env).get("PATH", os.defpath))
    if found is not None:
        return [os.path.abspath(found), *argv[1:]]
    if os.sep in name and os.path.isfile(name):
        raise SetupError(f"cannot run PROGRAM {name!r}: the file is not executable "
                         f"(chmod +x it, or name its interpreter: 'python3 {name}')")
    where = "no such file" if os.sep in name else "no program of that name on PATH"
    raise SetupError(f"cannot run PROGRAM {name!r}: {where} (a typo in the name?)")


def setting_named(error: str, given: Mapping[str, str]) -> str | None:
    """The setting an error reply names (one given with --env first), or None when it names none."""
    for key in given:
        if re.search(rf"\b{re.escape(key)}\b", error):
            return key
    found = SETTING_NAME.search(error)
    return found.group(0) if found else None


def first_read(driver: Driver) -> dict[str, Json] | None:
    """The driver's reply to one ``last`` on a fresh agent (``call``: every driver has it), or None
    when it gave no one JSON object (the checks judge that)."""
    agent = {"id": f"lsc-preflight-{uuid.uuid4().hex[:12]}", "owner": None}
    request = {"op": "last", "agent": agent, "thread": "lnk-store-check pre-flight"}
    try:
        lines, _err, code = call_once(driver.argv, request, driver.env, timeout=CALL_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if code != 0 or len(lines) != 1:
        return None
    try:
        reply = json.loads(lines[0])
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def preflight(driver: Driver) -> Ready:
    """Check that ``driver`` can be judged at all; what it found, or SetupError saying what to fix."""
    argv = resolved_argv(driver)
    contract, why = printed_contract(driver)
    if contract is None:
        raise SetupError(f"{argv[0]}: {one_line(why)}")
    reply = first_read(driver)
    error = reply.get("error") if reply is not None and reply.get("reply") == "error" else None
    if isinstance(error, str):
        setting = setting_named(error, driver.env)
        if setting is not None:
            how = f"correct --env {setting}=..." if setting in driver.env else f"give it with --env {setting}=VALUE"
            raise SetupError(f"{one_line(error)} (the driver's answer to a first read, before any check: {how})")
    return Ready(argv, contract)

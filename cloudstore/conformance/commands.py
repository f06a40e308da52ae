"""Family ``check``, the program's commands: contract, --version, --help and usage errors.

These run the program itself (not a request), so they need a
:class:`~cloudstore.conformance.program.Driver` and are left out where the
suite reaches a driver only through the bridge.
"""

from __future__ import annotations

import json

from .expect import expect_that, is_int
from .harness import CheckSet, Ctx
from .program import Ran, run_command

checks = CheckSet("check")

CONTRACT_KEYS = {"version", "serve", "jobs", "files"}


def _ran(ran: Ran) -> str:
    return f"<exit {ran.code}, stdout {ran.stdout[:200]!r}, stderr {ran.stderr.strip()[-200:]!r}>"


@checks.check(program=True)
def contract(ctx: Ctx) -> None:
    """`contract` prints one JSON line {"version": 1, "serve"?, "jobs"?, "files"?} (booleans) and exits 0."""
    assert ctx.driver is not None
    ran = run_command(ctx.driver, ["contract"])
    expect_that(ran.code == 0, "exit code of `contract`", 0, _ran(ran))
    expect_that(len(ran.lines) == 1, "stdout of `contract`", "<one line>", _ran(ran))
    try:
        value = json.loads(ran.lines[0])
    except ValueError:
        value = None
    expect_that(isinstance(value, dict), "`contract`'s line", "<a JSON object>", ran.lines[0])
    expect_that(set(value) <= CONTRACT_KEYS, "`contract`'s keys", sorted(CONTRACT_KEYS), sorted(value))
    expect_that(is_int(value.get("version")) and value["version"] == 1, "`contract`'s version", 1, value.get("version"))
    for key in ("serve", "jobs", "files"):
        expect_that(key not in value or isinstance(value[key], bool), f"`contract`'s {key}", "<true or false>",
                    value.get(key))


@checks.check(program=True)
def version_and_help(ctx: Ctx) -> None:
    """`--version` prints one line and `--help` prints usage on stdout, both exiting 0."""
    assert ctx.driver is not None
    ran = run_command(ctx.driver, ["--version"])
    expect_that(
        ran.code == 0 and len(ran.lines) == 1 and bool(ran.lines[0].strip()),
        "`--version`",
        "<one line, exit 0>",
        _ran(ran),
    )
    ran = run_command(ctx.driver, ["--help"])
    expect_that(ran.code == 0 and ran.stdout.strip() != b"", "`--help`", "<usage on stdout, exit 0>", _ran(ran))


@checks.check(program=True)
def usage_extra_words(ctx: Ctx) -> None:
    """Extra words after a command (`call x`, `serve x`, `contract x`) exit 2 with nothing on stdout."""
    assert ctx.driver is not None
    for args in (["call", "x"], ["serve", "x"], ["contract", "x"]):
        ran = run_command(ctx.driver, args)
        expect_that(ran.code == 2 and ran.stdout == b"", f"`{' '.join(args)}`", "<exit 2, empty stdout>", _ran(ran))


@checks.check(program=True)
def usage_unknown_command(ctx: Ctx) -> None:
    """An unknown command, or none, is a usage error: exit 2, a message on stderr, nothing on stdout."""
    assert ctx.driver is not None
    for args in (["frobnicate"], ["CALL"], []):
        ran = run_command(ctx.driver, args)
        shown = " ".join(args) or "(no command)"
        expect_that(ran.code == 2 and ran.stdout == b"", f"`{shown}`", "<exit 2, empty stdout>", _ran(ran))
        expect_that(ran.stderr.strip() != "", f"stderr of `{shown}`", "<a usage message>", _ran(ran))

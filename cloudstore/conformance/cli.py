"""``lnk-store-check [options] PROGRAM``: run the conformance suite against a driver program.

First the pre-flight (``preflight``): a program that cannot be run, a
failing ``contract`` or a first read answering a setting error stops the
run with one line on stderr and exit 2, before any check, since a setup
mistake is no verdict on the driver.  Then a header (``#`` lines: the
program as run, its contract, the store's settings with credentials
hidden, the mode), one line per check (name, PASS/FAIL, time in ms, and for
a failure what was expected and what came back), notes as lines starting
with ``#``, what the run left in the store (``leftovers``), then ``N passed,
M failed`` (``, K not judged`` when a check was not run because one it
builds on failed) alone on the last line. Progress (checks done / total)
goes to stderr every few seconds, through the log (``--log-format json``
or ``LNK_LOG_FORMAT=json``: one JSON object a line).  ``--json PATH``
writes the run as one JSON document (``json_report``). Exits 0 when every
check passed, 1 when any failed, 2 on a usage or setup error (bad options,
options that select no check, the pre-flight).

How requests reach the driver is chosen in :func:`make_transports`: straight
to the program (``--mode``), or, with ``--via-bridge``, through the real store
bridge code run in-process over PROGRAM, each agent a check names served
with a fresh key and folder (``cloudstore.conformance.bridge_transport``).

``--faults`` runs the ``faults`` family instead (``fault_checks``): the suite
puts its own HTTP fault proxy in front of the store endpoint named with
``--env`` and judges the driver under seeded fault schedules; ``--seed``
replays one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ..protocol.client import env_pairs
from ..runtime import jsonlog
from . import bridge_transport, header, json_report, leftovers
from .harness import FAMILIES, Report
from .preflight import SetupError, preflight
from .program import Driver
from .progress import EVERY, Progress
from .runner import MODES, run
from .transport import Transport

log = logging.getLogger("cloudstore.conformance")


def parser() -> argparse.ArgumentParser:
    p = jsonlog.ArgumentParser(  # a usage error once logs are JSON: one ERROR record
        prog="lnk-store-check",
        description="Check that a Link store driver program keeps the store contract (docs/protocol.md), "
        "driving it only through its commands: contract, call and serve.",
        epilog="First a pre-flight: a PROGRAM that cannot be run, a `contract` that fails, or a first read "
        "answering an error that names a setting (LNK_BUCKET_URL is not set, a folder that does not exist) "
        "stops with one line on stderr and exit 2, before any check. Then a header (# lines: the program, its "
        "contract, the store's settings, credentials hidden, and the mode). "
        "Prints one line per check (name, PASS or FAIL, time; for a failure what was expected and what "
        "came back; NOT JUDGED for a check whose premise, another check, failed), then 'N passed, M failed'. "
        "At the end, what the run left in the store (its agents, and how much a file:// folder grew). "
        "Progress (checks done / total) goes to stderr every few seconds. "
        "Exit status: 0 when every check passed, 1 when any failed, "
        "2 on a usage error, a pre-flight error or when no check matched. "
        "With --faults (drivers that reach their store over HTTP: the endpoint an http:// setting in --env, "
        "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or STORAGE_EMULATOR_HOST) the suite starts its own fault proxy "
        "in front of that endpoint and runs the faults family instead: replies lost after the store applied "
        "a write, writes landing late after the client gave up, 5xx and 429 / SlowDown with the services' "
        "bodies, resets, cut bodies, shifted Dates. A driver may answer 'outcome unknown', never another's "
        "win about its own write, and every acknowledged write reads back exactly once; racers' histories "
        "must be linearizable. A server that ignores preconditions (every If-None-Match / If-Match / "
        "ifGenerationMatch taken off: faults.server_ignores_preconditions) must be refused: each write an "
        "error, never two racers of one seq 'done'. A failure prints "
        "the seed, the fault schedule and the history that broke; --seed N replays it. "
        "On moto --faults takes about 30 s (--quick 18 s), --crash about a minute (--quick 30 s). "
        "With --crash (any driver) the suite sends multi-request ops to serve processes it kills with SIGKILL "
        "before each store request in turn (where the driver honours LNK_STORE_FAILPOINT=N) and at seeded "
        "moments, and another process checks what the next ops see: no event lost or doubled, no job in two "
        "places or none, no version given twice, no narrowing widened, one lease holder at most.",
    )
    p.add_argument(
        "program", metavar="PROGRAM", help="the driver: a name on PATH, a path, or a shell-quoted command line"
    )
    p.add_argument("--mode", choices=MODES, default="serve",
                   help="how requests reach the driver: one serve process (default), a call process each, or both "
                        "(the call-mode stdout checks run in every mode)")
    p.add_argument("--family", action="append", choices=FAMILIES, dest="families", metavar="NAME",
                   help=f"run only this family (repeatable): {', '.join(FAMILIES)}")
    p.add_argument("--check", action="append", default=[], dest="checks", metavar="SUBSTRING",
                   help="run only checks whose name holds SUBSTRING (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for the driver's environment (repeatable)")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="how many times each race is run (default 3)")
    p.add_argument("--quick", action="store_true",
                   help="leave out the slow checks (the 4,097-file list); with --faults one seeded fault per op "
                        "(three without), with --crash one seeded kill moment per op (six without)")
    p.add_argument("--faults", action="store_true",
                   help="judge the driver under seeded HTTP faults, through a proxy in front of the endpoint "
                        "its --env names (see below)")
    p.add_argument("--crash", action="store_true",
                   help="kill serve processes mid-op (SIGKILL at failpoints and seeded moments) and check what the "
                        "next ops see (see below)")
    p.add_argument("--seed", type=int, metavar="N", help="with --faults or --crash: the seed of the fault schedules "
                                                         "or kill moments (a failure prints it; default: random)")
    p.add_argument("--json", metavar="PATH", dest="json_path",
                   help="also write the run as one JSON document to PATH (for CI dashboards): program, contract, "
                        "store, mode, outcome, exit, and each check's name, family, mode, outcome, duration_ms "
                        "and message")
    p.add_argument("--progress", type=float, default=EVERY, metavar="SECONDS",
                   help=f"seconds between progress lines on stderr (default {EVERY:g}; 0: after every check)")
    p.add_argument("--log-format", choices=jsonlog.FORMATS, default=None,
                   help="stderr as text lines, or one JSON object a line (default: LNK_LOG_FORMAT, else text)")
    bridge_transport.add_options(p)
    return p


def make_transports(args: argparse.Namespace, env: dict[str, str]) -> list[Transport] | None:
    """The transports the options ask for; None lets the runner build them from ``--mode``."""
    return bridge_transport.transports_for(args, env)


def print_line(text: str) -> None:
    print(text, flush=True)


def open_report(path: str | None, p: argparse.ArgumentParser) -> TextIO | None:
    """The ``--json`` file, opened before anything runs: a path that cannot be written is a usage error
    now, not a report lost after minutes of checks."""
    if path is None:
        return None
    try:
        return open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by main's finally)
    except OSError as exc:
        p.error(f"--json {path}: cannot be written: {exc.strerror or exc}")
    return None


class CurrentStderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is at each record: ``main()`` run twice in one process
    (a test capturing stderr each time) writes to the stream of the second run, not of the first."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass  # StreamHandler's constructor sets it: there is nothing to keep


def configure_logs(as_json: bool) -> None:
    """The suite's own lines (progress, the pre-flight's error) at INFO on stderr, in the project's log
    schema with JSON logs; other loggers (the in-process bridge's, Python's warnings) at WARNING."""
    jsonlog.configure("lnk-store-check", logging.WARNING, "lnk-store-check: %(levelname)s %(message)s", as_json,
                      capture_stderr=False)  # the handler below writes to sys.stderr itself
    handler = CurrentStderr()
    handler.setFormatter(jsonlog.JsonFormatter("lnk-store-check") if as_json
                         else logging.Formatter("lnk-store-check: %(message)s"))
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)


def progress_line(text: str, fields: dict[str, Any]) -> None:
    log.info("%s", text, extra=fields)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    env = env_pairs(args.env, "--env", p.error)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.progress < 0:
        p.error("--progress must be 0 seconds or more")
    special = args.faults or args.crash
    if args.seed is not None and not special:
        p.error("--seed goes with --faults or --crash")
    if args.faults and args.crash:
        p.error("--faults and --crash are runs of their own: one at a time")
    if special and (getattr(args, "via_bridge", False) or args.families or args.mode != "serve"):
        p.error("--faults and --crash run their own serve processes: they take no --via-bridge, --family or --mode")
    out = open_report(args.json_path, p)
    configure_logs(jsonlog.wants_json(args.log_format))
    try:
        return judge(args, env, out)
    finally:
        if out is not None:
            out.close()


def judge(args: argparse.Namespace, env: dict[str, str], out: TextIO | None) -> int:
    """Pre-flight, header, the run, what it left, the summary: the exit status."""
    special = args.faults or args.crash
    settings = header.shown_settings(env)
    mode = header.mode_words(mode=args.mode, via_bridge=getattr(args, "via_bridge", False), quick=args.quick,
                             faults=args.faults, crash=args.crash, rounds=args.rounds, families=args.families,
                             checks=args.checks)

    driver = Driver(args.program, env)
    argv = driver.argv  # as given until the pre-flight resolves it

    def finish(code: int, outcome: str, **more: Any) -> int:
        """The exit status, after writing the --json report of the run (or of why it did not run)."""
        if out is not None:
            json_report.write(out, json_report.document(argv=argv, settings=settings, mode=mode, code=code,
                                                        run_outcome=outcome, **more))
        return code

    try:
        ready = preflight(driver)
    except SetupError as exc:
        log.error("%s", exc)
        return finish(2, "setup error", error=str(exc))
    argv = ready.argv
    for line in header.lines(ready.argv, ready.contract, settings, mode, given=bool(env)):
        print_line(f"# {line}")
    before = leftovers.tally(env)
    transports = None if special else make_transports(args, env)
    with Progress(progress_line, args.progress) as progress:
        try:
            report = run(
                args.program, args.families, env, mode=args.mode, rounds=args.rounds, quick=args.quick,
                checks=args.checks, transports=transports, faults=args.faults, crash=args.crash, seed=args.seed,
                contract=ready.contract, progress=progress,
                on_result=lambda r: print_line(r.line()), on_note=lambda n: print_line(f"# {n}"),
            )
        except ValueError as exc:  # --faults with no HTTP endpoint among the settings
            if not special:
                raise
            log.error("%s", exc)
            return finish(2, "setup error", contract=ready.contract, error=str(exc))
        finally:
            for transport in transports or ():  # run() closes only the transports it built
                transport.close()
    growth = leftovers.grown(before, leftovers.tally(env))
    for line in leftovers.summary(report, growth):
        print_line(f"# {line}")
    left = leftovers.as_json(report, growth)
    if not report.results:
        why = f"no check matched {args.checks or args.families}"
        log.error("%s", why)
        print_line(report.summary())
        return finish(2, "usage error", report=report, contract=ready.contract, error=why, left=left)
    print_line(f"# {report.seconds:.1f} s")
    print_line(report.summary())
    return finish(*verdict(report), report=report, contract=ready.contract, left=left)


def verdict(report: Report) -> tuple[int, str]:
    return (0, "passed") if report.failed == 0 else (1, "failed")


if __name__ == "__main__":
    sys.exit(main())

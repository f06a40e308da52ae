"""``lnk-store-check [options] PROGRAM``: run the conformance suite against a driver program.

Prints one line per check (name, PASS/FAIL, time in ms, and for a failure
what was expected and what came back), notes as lines starting with ``#``,
then ``N passed, M failed`` (``, K not judged`` when a check was not run
because one it builds on failed) alone on the last line. Exits 0 when every check
passed, 1 when any failed, 2 on a usage error (bad options, or options that
select no check).

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
import sys
from collections.abc import Sequence

from ..protocol.client import env_pairs
from . import bridge_transport
from .harness import FAMILIES
from .runner import MODES, run
from .transport import Transport


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lnk-store-check",
        description="Check that a Link store driver program keeps the store contract (docs/protocol.md), "
        "driving it only through its commands: contract, call and serve.",
        epilog="Prints one line per check (name, PASS or FAIL, time; for a failure what was expected and what "
        "came back; NOT JUDGED for a check whose premise, another check, failed), then 'N passed, M failed'. "
        "Exit status: 0 when every check passed, 1 when any failed, "
        "2 on a usage error or when no check matched. "
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
    bridge_transport.add_options(p)
    return p


def make_transports(args: argparse.Namespace, env: dict[str, str]) -> list[Transport] | None:
    """The transports the options ask for; None lets the runner build them from ``--mode``."""
    return bridge_transport.transports_for(args, env)


def print_line(text: str) -> None:
    print(text, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    env = env_pairs(args.env, "--env", p.error)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    special = args.faults or args.crash
    if args.seed is not None and not special:
        p.error("--seed goes with --faults or --crash")
    if args.faults and args.crash:
        p.error("--faults and --crash are runs of their own: one at a time")
    transports = None if special else make_transports(args, env)
    if special and (getattr(args, "via_bridge", False) or args.families or args.mode != "serve"):
        p.error("--faults and --crash run their own serve processes: they take no --via-bridge, --family or --mode")
    try:
        report = run(
            args.program, args.families, env, mode=args.mode, rounds=args.rounds, quick=args.quick,
            checks=args.checks, transports=transports, faults=args.faults, crash=args.crash, seed=args.seed,
            on_result=lambda r: print_line(r.line()), on_note=lambda n: print_line(f"# {n}"),
        )
    except ValueError as exc:
        if not special:
            raise
        print(f"lnk-store-check: {exc}", file=sys.stderr)
        return 2
    finally:
        for transport in transports or ():  # run() closes only the transports it built
            transport.close()
    if not report.results:
        print(f"lnk-store-check: no check matched {args.checks or args.families}", file=sys.stderr)
        print_line(report.summary())
        return 2
    print_line(f"# {report.seconds:.1f} s")
    print_line(report.summary())
    return 0 if report.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

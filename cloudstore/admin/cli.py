"""``lnk-store-admin``: inspect, gc and migrate a store given by URL.

    lnk-store-admin inspect URL [--json] [--lapse-ms N]
    lnk-store-admin gc URL [--apply] [--min-age SECONDS] [--json]
    lnk-store-admin migrate SRC DST [--force] [--workers N] [--json]
    lnk-store-admin migrate --in-place URL [--workers N] [--json]
    lnk-store-admin format URL [--lower N] [--json]

URL is ``file:///ABSOLUTE/FOLDER``, ``s3://BUCKET[/PREFIX]`` or
``gs://BUCKET[/PREFIX]``; endpoints and credentials come from the same
environment variables the drivers read (``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``, the SDKs' usual credential
chains).  Output (tables, JSON, summaries) goes to stdout; logs and progress
to stderr.  Exit 0 on success, 1 when the command failed (a refused
destination, a migration that does not verify, the store failing), 2 on a
usage error.  ``--log-format json`` (or ``LNK_LOG_FORMAT=json``): every line on
stderr is one JSON object (logs, errors, progress: ``cloudstore.runtime.jsonlog``).
Progress of the long phases (gc's reads and deletes, migrate's copy and
verification, inspect's agents) comes every ``--progress-every`` seconds
(``LNK_PROGRESS_EVERY``, default 5: ``progress.py``), at INFO with the
command's other lines; warnings (a migration's conflicts and mismatches)
at WARNING, a migration that failed at ERROR.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ..generations import StoreError, StoreRefused
from ..runtime import jsonlog
from ..settings import SettingError
from . import progress

ENVIRONMENT = """settings read from the environment (as the drivers do):
  AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL    endpoint of an S3-compatible service
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_DEFAULT_REGION
  STORAGE_EMULATOR_HOST                     use fake-gcs-server instead of GCS
  GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_CLOUD_PROJECT
  LNK_STORE_LOG=debug                       log every bucket request on stderr
  LNK_LOG_FORMAT=json                       log one JSON object a line on stderr (as --log-format json)
  LNK_PROGRESS_EVERY=SECONDS                seconds between progress lines (as --progress-every; default 5)
"""


def parser() -> argparse.ArgumentParser:
    p = jsonlog.ArgumentParser(  # a usage error once logs are JSON: one ERROR record
        prog="lnk-store-admin", description="Inspect, garbage-collect and migrate a cloudstore store.",
        epilog=ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--log-format", choices=["text", "json"], default=None,
                   help="text lines on stderr, or one JSON object a line (default: LNK_LOG_FORMAT, else text)")
    p.add_argument("--progress-every", type=_seconds, default=None, metavar="SECONDS",
                   help="seconds between progress lines on stderr, 0 for one a unit of work "
                        "(default: LNK_PROGRESS_EVERY, else 5)")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("inspect", help="what the store holds, per agent and in total")
    i.add_argument("url")
    i.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    i.add_argument("--lapse-ms", type=int, default=30_000, help="lapse to judge leases by (default 30000)")
    g = sub.add_parser("gc", help="delete what is provably dead (dry run unless --apply)")
    g.add_argument("url")
    g.add_argument("--apply", action="store_true", help="delete (default: print what would be deleted)")
    g.add_argument("--min-age", type=float, default=None,
                   help="seconds a lease tombstone must stand unchanged (default 120)")
    g.add_argument("--json", action="store_true")
    m = sub.add_parser("migrate", help="copy a whole store to another, resumably, and verify it")
    m.add_argument("src")
    m.add_argument("dst", nargs="?", help="the destination (not with --in-place)")
    m.add_argument("--in-place", action="store_true",
                   help="move SRC's file keys of the layout before 0.5 to this layout's (relayout.py)")
    m.add_argument("--force", action="store_true", help="copy into a non-empty destination")
    m.add_argument("--workers", type=int, default=16, help="parallel requests (default 16)")
    m.add_argument("--json", action="store_true")
    f = sub.add_parser("format", help="the store's format record and the layouts it holds; lower it where safe")
    f.add_argument("url")
    f.add_argument("--lower", type=int, default=None, metavar="N",
                   help="set the record's reader and writer to N, where a walk proves nothing newer is stored")
    f.add_argument("--json", action="store_true")
    return p


log = logging.getLogger("cloudstore.admin")


def _seconds(value: str) -> float:
    """``--progress-every``'s value, or argparse's usage error (exit 2) saying the rule."""
    try:
        return progress.parse_every(value, "--progress-every")
    except SettingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _say(args: argparse.Namespace, message: str) -> None:
    """A failure, on stderr: an error record in JSON mode, the program's line otherwise."""
    if args.json_logs:
        log.error("%s", message)
    else:
        print(f"lnk-store-admin: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    level = logging.DEBUG if os.environ.get("LNK_STORE_LOG") == "debug" else logging.WARNING
    args.json_logs = jsonlog.wants_json(args.log_format)
    jsonlog.configure("lnk-store-admin", level, "%(asctime)s %(levelname)s %(message)s", args.json_logs)
    if level > logging.INFO:
        log.setLevel(logging.INFO)  # the tool's own lines (progress, what a migration found), not libraries'
    try:
        progress.choose(args.progress_every)
        progress.cadence()  # a malformed LNK_PROGRESS_EVERY stops the tool now, before any work (exit 2)
        return _run(args)
    except SettingError as exc:
        _say(args, str(exc))
        return 2
    except StoreRefused as exc:  # the format record or the server refuses this release: it says why
        _say(args, str(exc))
        return 1
    except StoreError as exc:
        _say(args, f"the store failed: {exc}")
        return 1
    except KeyboardInterrupt:
        _say(args, "interrupted")
        return 130
    except BrokenPipeError:
        # Its reader went away (``inspect ... | head``): no traceback.  Point stdout at /dev/null so
        # the interpreter's own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _run(args: argparse.Namespace) -> int:
    from .walk import OpError, open_url

    if args.command == "inspect":
        from . import inspect

        try:
            report = inspect.inspect(open_url(args.url), lapse_ms=args.lapse_ms, show_progress=True)
        except OpError as exc:
            _say(args, str(exc))
            return 1
        print(json.dumps(report, indent=2, sort_keys=False) if args.json else inspect.table(report))
        if not report["totals"]["agents"]:
            _say(args, "this store holds no agent: is the URL the one the drivers use?")
        return 0
    if args.command == "format":
        from . import formats

        opened = open_url(args.url)
        if args.lower is None:
            report = formats.show(opened)
            print(json.dumps(report, indent=2) if args.json else formats.text(report))
            return 0
        try:
            lowered = formats.lower(opened, args.lower)
        except formats.Unsafe as exc:
            _say(args, f"refused: {exc}")
            return 1
        print(json.dumps(lowered, indent=2) if args.json else
              f"record lowered: reader {lowered['record']['reader']}, writer {lowered['record']['writer']}")
        return 0
    if args.command == "gc":
        from . import gc

        policy = gc.Policy() if args.min_age is None else gc.Policy(min_age=args.min_age)
        plan, result, conditional = gc.run(open_url(args.url), args.apply, policy)
        passed = gc.report(plan, result, conditional)
        print(json.dumps(passed, indent=2) if args.json else gc.text(passed))
        return 0
    from . import migrate

    if args.in_place or args.dst is None:
        if not args.in_place or args.dst is not None:
            _say(args, "migrate takes SRC DST, or --in-place URL")
            return 2
        from . import relayout

        moved = relayout.relayout(args.src, workers=max(1, args.workers))
        print(json.dumps(moved.as_dict(), indent=2) if args.json else relayout.text(moved))
        return 0 if moved.ok else 1
    try:
        summary = migrate.migrate(args.src, args.dst, force=args.force, workers=max(1, args.workers))
    except migrate.Refused as exc:
        _say(args, f"refused: {exc}")
        return 1
    print(json.dumps(summary.as_dict(), indent=2) if args.json else migrate.text(summary))
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""``lnk-store-admin``: inspect, gc and migrate a store given by URL.

    lnk-store-admin inspect URL [--json] [--lapse-ms N]
    lnk-store-admin gc URL [--apply] [--min-age SECONDS] [--json]
    lnk-store-admin migrate SRC DST [--force] [--workers N] [--json]

URL is ``file:///ABSOLUTE/FOLDER``, ``s3://BUCKET[/PREFIX]`` or
``gs://BUCKET[/PREFIX]``; endpoints and credentials come from the same
environment variables the drivers read (``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``, the SDKs' usual credential
chains).  Output (tables, JSON, summaries) goes to stdout; logs and progress
to stderr.  Exit 0 on success, 1 when the command failed (a refused
destination, a migration that does not verify, the store failing), 2 on a
usage error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from ..generations import StoreError
from ..settings import SettingError

ENVIRONMENT = """settings read from the environment (as the drivers do):
  AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL    endpoint of an S3-compatible service
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_DEFAULT_REGION
  STORAGE_EMULATOR_HOST                     use fake-gcs-server instead of GCS
  GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_CLOUD_PROJECT
  LNK_STORE_LOG=debug                       log every bucket request on stderr
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lnk-store-admin", description="Inspect, garbage-collect and migrate a cloudstore store.",
        epilog=ENVIRONMENT, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    m.add_argument("dst")
    m.add_argument("--force", action="store_true", help="copy into a non-empty destination")
    m.add_argument("--workers", type=int, default=16, help="parallel requests (default 16)")
    m.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    level = logging.DEBUG if __import__("os").environ.get("LNK_STORE_LOG") == "debug" else logging.WARNING
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return _run(args)
    except SettingError as exc:
        print(f"lnk-store-admin: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"lnk-store-admin: the store failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lnk-store-admin: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    from .walk import OpError, open_url

    if args.command == "inspect":
        from . import inspect

        try:
            report = inspect.inspect(open_url(args.url), lapse_ms=args.lapse_ms)
        except OpError as exc:
            print(f"lnk-store-admin: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(report, indent=2, sort_keys=False) if args.json else inspect.table(report))
        return 0
    if args.command == "gc":
        from . import gc

        policy = gc.Policy() if args.min_age is None else gc.Policy(min_age=args.min_age)
        plan, result, conditional = gc.run(open_url(args.url), args.apply, policy)
        passed = gc.report(plan, result, conditional)
        print(json.dumps(passed, indent=2) if args.json else gc.text(passed))
        return 0
    from . import migrate

    try:
        summary = migrate.migrate(args.src, args.dst, force=args.force, workers=max(1, args.workers))
    except migrate.Refused as exc:
        print(f"lnk-store-admin: refused: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary.as_dict(), indent=2) if args.json else migrate.text(summary))
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())

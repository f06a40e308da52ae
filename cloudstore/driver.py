"""The drivers' main (the contract's ``drive``): lnk-gcs and lnk-bucket-store.

``--version``, ``--help`` and ``contract`` answer without any setting and
without importing a cloud SDK (they cost a bare Python start).  ``call``
answers one request, ``serve`` one request a line until stdin ends.

Stdout carries replies and nothing else: the real stdout is kept for replies
and ``sys.stdout`` is pointed at stderr, so a stray print anywhere (ours or a
library's) can never corrupt the reply stream.

This module is a program's main and nothing imports it: what turns a request
line into a reply (``Answerer``, ``encode_reply``) is the library's
(``cloudstore.protocol.answerer``), shared with the Python API.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from ._version import __version__
from .protocol.answerer import BUCKET_SETTING, GCS_SETTING, Answerer, StoreSetting, encode_reply

CONTRACT = {"version": 1, "serve": True, "jobs": True, "files": True}


@dataclass(frozen=True)
class DriverInfo:
    """What differs between the two drivers: name, the setting naming the store (and its URL schemes), help."""

    name: str
    store: StoreSetting  # what the Answerer opens (protocol/answerer.py)
    title: str
    own_settings: str  # the help lines of the settings only this driver reads

    @property
    def help(self) -> str:
        """``--help``: complete on its own (an installed driver has no docs folder beside it)."""
        return HELP.format(name=self.name, title=self.title, own_settings=self.own_settings)


HELP = """{name}: {title}

usage: {name} (--version | --help | contract | call | serve)

  contract   print the contract this driver keeps, as one JSON line, and exit
  call       read one request (JSON) on stdin, print one reply line, and exit
  serve      read requests one a line, print each reply as a line; exit 0 at the end of stdin
  --version  print the version and the store formats it reads and writes;  --help  print this

Requests and replies are JSON objects, one a line, on stdin and stdout; stdout
carries replies only, logs go to stderr. Every failure is a reply
{{"reply": "error", "error": "..."}}, never an exit: a missing or malformed
setting too (every request then answers an error naming the setting).
contract, --version and --help need no setting and no network.

settings (environment):
{own_settings}
  LNK_STORE_LOG           log level on stderr: DEBUG (each request's op, reply, bucket
                          requests and time; never a credential), INFO, WARNING (default),
                          ERROR
  LNK_OP_SECONDS          each request's whole time on the store, in seconds (default 20): its
                          requests, retries and waits share it, and once it is spent no more
                          is sent (the error says whether anything was changed); the store
                          bridge sets it inside its call limit
  LNK_WAKE_DIR            folder of this machine's scheduler runners' sockets, nudged
                          when a job enters waiting (default /tmp/lnk-wake)
  LNK_LOG_FORMAT          json: each log line on stderr is one JSON object (time, level,
                          logger, program, message and the line's own fields); default text
  LNK_METRICS_DIR         a folder: after each request, write this process's counters
                          (bucket requests, retries, outcome-unknown errors, lost
                          compare-and-set rounds, replies; by op) to a JSON file there, for
                          the bridge's or the scheduler's metrics export (they set it)
  LNK_SCHEDULER_OPS       1: also answer job_due, job_claims, job_claim and lease_take, which
                          name and move any agent's jobs and name lease holders; for the
                          scheduler's own driver only, never one an agent reaches

exit status: 0, or 2 for a usage error (an unknown command or extra arguments).
"""

GCS = DriverInfo(
    "lnk-gcs",
    GCS_SETTING,
    "Link store driver keeping an agent's things in Google Cloud Storage.",
    """\
  LNK_GCS_URL             gs://BUCKET[/PREFIX]  where everything is kept (required)
  STORAGE_EMULATOR_HOST   http://HOST:PORT of an emulator (fake-gcs-server) instead of GCS
                          (GOOGLE_CLOUD_PROJECT then defaults to "test")
  GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_CLOUD_PROJECT
                          credentials and project, found as the Google client finds them""",
)

BUCKET = DriverInfo(
    "lnk-bucket-store",
    BUCKET_SETTING,
    "Link store driver keeping an agent's things in an S3-compatible bucket or a local folder.",
    """\
  LNK_BUCKET_URL          s3://BUCKET[/PREFIX] or file:///ABSOLUTE/FOLDER (required; the
                          folder must exist: a typo is refused, never made a new store)
  AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL
                          endpoint of an S3-compatible service (MinIO, R2, moto...)
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_DEFAULT_REGION
                          credentials and region, found as boto3 finds them""",
)

log = logging.getLogger("cloudstore")


def configure_logging(name: str) -> None:
    """Log this project's own lines to stderr at ``LNK_STORE_LOG``'s level; libraries stay at WARNING.

    The level is set on the ``cloudstore`` logger only: at DEBUG, botocore's
    and google-auth's loggers would write request headers (a session token,
    an access key id, a signature) to stderr.  ``LNK_LOG_FORMAT=json``: one
    JSON object a line (``jsonlog``).
    """
    from .runtime import jsonlog

    jsonlog.configure(name, logging.WARNING, f"{name}: %(levelname)s %(message)s")
    level = os.environ.get("LNK_STORE_LOG", "WARNING").upper()
    log.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "WARNING")


def _usage(info: DriverInfo, why: str) -> int:
    sys.stderr.write(f"{info.name}: {why}\nusage: {info.name} (--version | --help | contract | call | serve)\n")
    return 2


def run(info: DriverInfo, argv: list[str], stdin: Any = None, stdout: TextIO | None = None) -> int:
    """The whole command line of a driver; its exit code."""
    if len(argv) != 1:
        return _usage(info, "expected exactly one command" if argv else "no command given")
    command = argv[0]
    out = stdout or sys.stdout
    if command == "--version":
        from .gate.store_format import supported  # no SDK: the record's rules only

        out.write(f"{info.name} {__version__} ({supported()})\n")
        return 0
    if command == "--help":
        out.write(info.help)
        return 0
    if command == "contract":
        out.write(json.dumps(CONTRACT) + "\n")
        return 0
    if command not in ("call", "serve"):
        return _usage(info, f"unknown command {command!r}")

    configure_logging(info.name)
    sys.stdout = sys.stderr  # nothing but replies reaches the real stdout
    source = stdin or sys.stdin.buffer
    if command == "serve" and stdin is None and not _is_terminal(source):
        # A program feeds us (the scheduler, the bridge) and ends us by closing stdin. A Ctrl-C in
        # the terminal reaches its whole process group, us too: the program finishes what is under
        # way through us first (a fire's finish, a call in flight), so the SIGINT is its alone.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    answerer = Answerer(info.store)
    snapshots = None
    if os.environ.get("LNK_METRICS_DIR"):  # metrics (and its import) only when an exporter asks
        from .runtime.metrics.snapshots import snapshot_writer

        snapshots = snapshot_writer(info.name)

    def write(reply: dict[str, Any]) -> None:
        out.write(encode_reply(reply) + "\n")
        out.flush()

    def done() -> None:
        answerer.after_reply()
        if snapshots is not None:
            snapshots.flush()  # after the reply is out: it never waits on this

    try:
        if command == "call":
            write(answerer.answer(source.read()))
            done()
            return 0
        for line in source:
            write(answerer.answer(line))
            done()
    except BrokenPipeError:
        # The caller went away: nobody is left to answer. Quietly, not a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        if snapshots is not None:
            snapshots.flush()
        return 0
    except KeyboardInterrupt:  # Ctrl-C on a driver a person runs: it ends, without a traceback
        if snapshots is not None:
            snapshots.flush()
        return 130
    return 0


def _is_terminal(source: Any) -> bool:
    try:
        return os.isatty(source.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def main_gcs() -> None:
    sys.exit(run(GCS, sys.argv[1:], stdout=sys.stdout))


def main_bucket() -> None:
    sys.exit(run(BUCKET, sys.argv[1:], stdout=sys.stdout))

"""Turn a driver's setting (``LNK_GCS_URL`` / ``LNK_BUCKET_URL``) into a store.

Parsing is separate from opening so that a malformed setting is an error
*reply* naming the setting, while ``contract`` and ``--help`` never look.
A reply names the setting and what is wrong with it, never its value: the
bucket, prefix or folder is the operator's to see, not the caller's.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .errors import SettingError
from .generations import FAILPOINT, Backend, RetryingStore, RetryPolicy

__all__ = ["Location", "SettingError", "open_backend", "open_store", "parse_location"]  # SettingError is errors.py's

# GCS and S3 bucket names: lowercase letters, digits, dots, dashes, underscores.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


@dataclass(frozen=True)
class Location:
    """Where a driver keeps things: a scheme, a bucket or folder, and a key prefix."""

    scheme: str  # "gs", "s3" or "file"
    bucket: str  # bucket name, or absolute folder for file
    prefix: str  # "" or "some/prefix/" (always ending in "/")


def parse_location(setting: str, value: str | None, schemes: tuple[str, ...]) -> Location:
    """Parse ``value`` of ``setting``; SettingError naming the setting when wrong."""
    allowed = " or ".join(f"{s}://" for s in schemes)
    if not value:
        raise SettingError(f"{setting} is not set: it must be a URL ({allowed}...)")
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise SettingError(f"{setting} is malformed: the URL must start {allowed}")
    if parts.query or parts.fragment:
        raise SettingError(f"{setting} is malformed: no query or fragment is allowed")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise SettingError(f"{setting} is malformed: use file:///ABSOLUTE/FOLDER")
        folder = unquote(parts.path)
        if not folder.startswith("/") or folder.rstrip("/") == "":
            raise SettingError(f"{setting} is malformed: the folder must be absolute and not /")
        return Location("file", os.path.normpath(folder), "")
    bucket = parts.netloc
    if not _BUCKET.match(bucket):
        raise SettingError(f"{setting} is malformed: the bucket name is not a valid one")
    prefix = parts.path.strip("/")
    if any(p in ("", ".", "..") for p in prefix.split("/")) and prefix:
        raise SettingError(f"{setting} is malformed: the prefix has an empty, '.' or '..' part")
    return Location(parts.scheme, bucket, prefix + "/" if prefix else "")


def open_backend(location: Location, create: bool = True, setting: str = "the file:// URL") -> Backend:
    """The backend for a location; SDKs are imported here, not before.

    ``create`` False: a ``file://`` folder that does not exist is refused
    (a SettingError naming ``setting``, not the folder) instead of made;
    buckets are never made.  A folder another user owns, or one others may
    write in without the sticky bit, is refused too, whatever ``create``
    says (a SettingError naming ``setting`` and the rule: local.py).
    """
    if location.scheme == "gs":
        from .gcs import GCSBackend

        return GCSBackend(location.bucket)
    if location.scheme == "s3":
        from .s3 import S3Backend

        return S3Backend(location.bucket)
    from .local import FolderMissing, FolderRefused, LocalBackend

    try:
        return LocalBackend(location.bucket, create=create, where=setting)
    except FolderMissing:
        raise SettingError(
            f"{setting} names a store that cannot be opened: its folder does not exist (it is not made: "
            "make it first, mkdir -p, or correct the URL)"
        ) from None
    except FolderRefused as exc:  # another user could change what it keeps (issue 43): the rule, no path
        raise SettingError(f"{setting} names a store that cannot be opened: {exc}") from None


#: The setting that bounds each op's whole time (seconds); the store bridge sets it inside its call limit.
OP_SECONDS = "LNK_OP_SECONDS"


def retry_policy(value: str | None) -> RetryPolicy:
    """The retry policy of a driver's store: ``LNK_OP_SECONDS`` (when set) is each op's whole budget.

    An op's requests, their retries and each try's timeout share that one
    window (``RetryingStore.op_window``), and the op sends no request once it
    is spent.  The bridge sets it to two thirds of its call limit, so an op
    stops, and says what it did, before the bridge would stop the driver.
    """
    if value is None or value == "":
        return RetryPolicy()
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (seconds > 0 and math.isfinite(seconds)):  # nan fails too
        raise SettingError(f"{OP_SECONDS} is malformed: it must be a number of seconds above 0")
    return RetryPolicy(deadline=seconds)


def open_store(location: Location, create: bool = True, setting: str = "the file:// URL",
               eager_probe: bool = True) -> RetryingStore:
    """The retrying, framing store every collection writes through, gated (``store_gate``).

    ``LNK_OP_SECONDS`` bounds each op's time (``retry_policy``).
    ``LNK_STORE_FAILPOINT=N`` (tests only) makes the process kill itself
    before its Nth store request, to prove every op whole after a crash.
    """
    from .gate.store_gate import guard

    die_at = os.environ.get(FAILPOINT, "")
    policy = retry_policy(os.environ.get(OP_SECONDS))
    store = RetryingStore(open_backend(location, create, setting), policy,
                          die_at=int(die_at) if die_at.isdigit() else None)
    # The format record and the server's preconditions, checked first; ``eager_probe`` False: the server
    # is probed only before a first write (a tool whose commands may only read: store_gate.py).
    return guard(store, location.prefix, eager_probe)

"""Opening a store from its URL as the drivers open their setting: the checks, the backend, its closing.

Every refusal here is said before anything is opened, naming the keyword or
the URL the caller passed (``url_of``: never a credential), as the drivers
name their setting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from ..errors import ArgumentError, LocationError, SettingError, StoreNotFoundError

if TYPE_CHECKING:
    from ..generations import Backend
    from ..settings import Location

#: How many calls of one store run at once by default (and so how many ``Service``s it keeps).
DEFAULT_CONCURRENCY = 8


def url_of(location: Location) -> str:
    """The store's URL as errors and ``repr`` show it: scheme, bucket (or folder) and prefix.

    Built from the parsed location, never echoed from the caller's string: a
    URL the parser accepts holds no user or password (a bucket name has no
    ``@``, a ``file://`` URL no host), so what is shown is what was opened
    and nothing secret.
    """
    if location.scheme == "file":
        return f"file://{location.bucket}"
    return f"{location.scheme}://{location.bucket}/{location.prefix}".rstrip("/")


def endpoint_of(backend: object) -> str | None:
    """Where the backend's SDK sends its requests, without any user or password; None for a folder.

    boto3 and aiobotocore say it in ``meta.endpoint_url``, google-cloud-storage
    in ``api_endpoint``: the setting the environment or ``endpoint_url=`` gave,
    or the cloud's own address.
    """
    client = getattr(backend, "client", None)
    found = getattr(getattr(client, "meta", None), "endpoint_url", None) or getattr(client, "api_endpoint", None)
    if not isinstance(found, str) or not found:
        return None
    parts = urlsplit(found)
    if "@" not in parts.netloc:
        return found
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def checked_concurrency(concurrency: object) -> None:
    """``concurrency`` is an ``int`` of at least 1; ``ArgumentError`` naming it otherwise."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise ArgumentError(f"concurrency must be an int (how many calls run at once, at least 1), "
                            f"not {type(concurrency).__name__}")
    if concurrency < 1:
        raise ArgumentError(f"concurrency must be at least 1, not {concurrency}")


def checked_keywords(create: object, endpoint_url: object, region_name: object, concurrency: object) -> None:
    """``open``'s keywords, each of its type and in its range; ``ArgumentError`` naming the keyword otherwise.

    Checked before anything is opened: a program's mistake (``concurrency="8"``
    read from a config file) is said at the call that made it, not met as a
    comparison of a ``str`` and an ``int`` deep inside the pool.
    """
    if not isinstance(create, bool):
        raise ArgumentError(f"create must be True or False, not {type(create).__name__}")
    for name, value in (("endpoint_url", endpoint_url), ("region_name", region_name)):
        if value is not None and not (isinstance(value, str) and value):
            raise ArgumentError(f"{name} must be a non-empty string or None, not {value!r}"
                                if isinstance(value, str) else
                                f"{name} must be a non-empty string or None, not {type(value).__name__}")
    checked_concurrency(concurrency)


def location_of(url: str) -> Location:
    """The parsed URL, as the drivers parse their setting; LocationError saying what is wrong."""
    from ..settings import SettingError, parse_location

    if not isinstance(url, str):
        raise LocationError(f"the store URL must be a string, not {type(url).__name__}")
    try:
        return parse_location("the store URL", url, ("file", "s3", "gs"))
    except SettingError as exc:
        raise LocationError(str(exc)) from exc


def s3_client_args(location: Location, endpoint_url: str | None, region_name: str | None) -> dict[str, str]:
    """The keyword overrides of an S3 client; refused for the schemes they do not apply to."""
    args = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region_name)) if v is not None}
    if args and location.scheme != "s3":
        raise LocationError(f"{' and '.join(args)} apply to s3:// stores only")
    return args


def check_create(location: Location, create: bool) -> None:
    """``create=True`` is for folders: refused for a bucket (``ArgumentError``), which no driver makes either."""
    if create and location.scheme != "file":
        raise ArgumentError(f"create=True applies to file:// stores only: buckets are never made ({url_of(location)})")


def resolved(url: str, create: bool, endpoint_url: str | None,
             region_name: str | None) -> tuple[Location, dict[str, str]]:
    """The URL parsed and checked against ``create`` and the S3 keywords: what both flavours' ``open`` do
    before they open anything (``LocationError`` / ``ArgumentError`` naming the URL or the keyword)."""
    location = location_of(url)
    check_create(location, create)
    return location, s3_client_args(location, endpoint_url, region_name)


def opening_failed(exc: Exception, location: Location) -> LocationError:
    """An SDK or folder failure while opening, said as the driver says it (its kind, not its detail), with the
    URL the caller passed (``url_of``: never a credential), which a program opening several stores needs."""
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
    return LocationError(f"the store URL {url_of(location)} names a store that cannot be opened: {why}")


def open_sync_backend(location: Location, client_args: Mapping[str, str], create: bool = False) -> Backend:
    """The drivers' own backend for ``location`` (settings.open_backend), the S3 client overridden if asked.

    A ``file://`` folder that does not exist is refused as the drivers refuse
    it (``StoreNotFoundError``), unless ``create``: then it is made, mode
    0700, with any folders above it.  ``create`` applies to folders only:
    buckets are never made.
    """
    from ..settings import open_backend

    url = url_of(location)
    if location.scheme == "file" and not create and not os.path.lexists(location.bucket):
        raise StoreNotFoundError(f"the store URL {url} names a folder that does not exist: it is not made (make "
                                 "it first, mkdir -p, or pass create=True; or correct the URL)")
    try:
        if location.scheme == "s3" and client_args:
            from ..s3 import S3Backend, make_client

            return S3Backend(location.bucket, client=make_client(client_args=client_args))
        return open_backend(location, create=create, setting=f"the store URL {url}")
    except SettingError as exc:  # a folder another user controls (local.py): its words name the rule
        raise LocationError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a folder that cannot be made, an SDK that finds no credentials
        raise opening_failed(exc, location) from exc


def close_backend(backend: Backend) -> None:
    """Close the SDK client's connections, where the SDK has a way to (boto3 and google-cloud-storage do)."""
    close = getattr(getattr(backend, "client", None), "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing is best effort; nothing is lost
            pass

"""The Google Cloud Storage backend: races settled by generation preconditions.

``Create`` is ``ifGenerationMatch=0``, ``Update(v)`` is ``ifGenerationMatch=v``
(the version token is the object's generation), a conditional delete is
``ifGenerationMatch`` on delete.  fake-gcs-server ignores the precondition on
delete (see the design notes), so the drivers never need it for correctness:
they use tombstones written with ``Update`` instead.

google-cloud-storage is imported when the backend is made, never at module
import, so ``lnk-gcs contract`` stays fast.
"""

from __future__ import annotations

import builtins
import datetime
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from .clock import StoreClock, probe_by_reading
from .generations import (
    AlreadyExists,
    Create,
    Listed,
    NotFound,
    PreconditionFailed,
    PutMode,
    StoreRefused,
    Throttled,
    Transient,
    Update,
    try_timeout,
)
from .http_status import BUCKET_GONE, http_retry_after, is_refusal, meaning, refused

# python-storage retries these statuses (google/cloud/storage/retry.py
# _RETRYABLE_STATUS_CODES: 408, 429, 500, 502, 503, 504); 409 is a conflict
# between overlapping writes, settled by retrying.  429 is a throttle
# (``rateLimitExceeded``: about one write a second to one object name), a
# refusal before anything was applied: ``Throttled``.
_TRANSIENT_CODES = {408, 409, 429, 500, 502, 503, 504}
_THROTTLE_CODE = 429

def _meaning(status: int, text: str) -> str:
    """What a GCS refusal means, naming the limit its message names where one is known."""
    lowered = text.lower()
    if "object length" in lowered or ("name" in lowered and ("too long" in lowered or "1024" in lowered)):
        return "a path part is longer than the store accepts (GCS: 1,024 bytes a whole object name)"
    if "bucket does not exist" in lowered:
        return BUCKET_GONE
    return meaning(status)


def refusal(status: int | None, text: str) -> StoreRefused | None:
    """A 4xx reply (or a 404 naming the bucket) the store gives whatever the retry, as ``StoreRefused``.

    The request was not applied: nothing was changed, and the reply says so.
    """
    if status is None:
        return None
    bucket_gone = status == 404 and "bucket does not exist" in text.lower()
    if bucket_gone or is_refusal(status):
        return refused(str(status), _meaning(status, text))
    return None


def _bucket_gone(mapped: Exception) -> Exception:
    """``mapped``, or the bucket's refusal when it is a 404 where only a missing bucket gives one.

    A listing, or a create (``ifGenerationMatch=0``), of a bucket that exists
    never answers 404: the 404 is the bucket's.  GCS says so in its message
    ("The specified bucket does not exist", ``refusal``); fake-gcs-server says
    only "Not Found", and its missing bucket came out as a store error naming
    the endpoint at the first write, and as an empty store at every listing.
    """
    if isinstance(mapped, NotFound):
        return refused("404", BUCKET_GONE)
    return mapped


def _retry_after(exc: Exception) -> float | None:
    """The ``Retry-After`` of the reply behind ``exc``, in seconds, when it sent one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return http_retry_after(headers.get("Retry-After")) if headers is not None else None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """python-storage's own retryable types (retry.py ``_RETRYABLE_TYPES``), the floor.

    Among them ``requests.exceptions.ChunkedEncodingError``: a reply body cut
    short (urllib3's ``ProtocolError`` as ``requests`` re-raises it while the
    body is read).  Its status types (429, 500, 502, 503, 504) are
    ``_TRANSIENT_CODES``.
    """
    import http.client

    import requests
    import requests.exceptions
    import urllib3.exceptions as u3

    return (
        ConnectionError, requests.ConnectionError, requests.exceptions.ChunkedEncodingError, requests.Timeout,
        http.client.BadStatusLine, http.client.IncompleteRead, http.client.ResponseNotReady,
        u3.PoolError, u3.ProtocolError, u3.SSLError, u3.TimeoutError,
        TimeoutError,
    )


def _classify(exc: Exception, creating: bool = False) -> Exception:
    """Map a google-api-core / google-auth / transport error onto the seam's vocabulary.

    At least what python-storage's ``_should_retry`` retries becomes ``Transient``;
    a 429 is ``Throttled`` (refused, not applied, retried until the deadline);
    a 4xx refusal (400, 403, 404 of the bucket, 405, 411, 413...) is
    ``StoreRefused``: nothing was changed, never ``outcome unknown``.
    """
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc
    from google.cloud.storage.exceptions import InvalidResponse

    if isinstance(exc, gexc.PreconditionFailed):
        return AlreadyExists(str(exc)) if creating else PreconditionFailed(str(exc))
    if isinstance(exc, (gexc.GoogleAPICallError, InvalidResponse)):
        status = exc.code if isinstance(exc, gexc.GoogleAPICallError) else getattr(exc.response, "status_code", None)
        if status == _THROTTLE_CODE:
            return Throttled(f"{status} {type(exc).__name__}", _retry_after(exc))
        refused = refusal(status, str(exc))
        if refused is not None:
            return refused
        if isinstance(exc, gexc.NotFound):
            return NotFound(str(exc))
        return Transient(f"{status} {type(exc).__name__}") if status in _TRANSIENT_CODES else exc
    # python-storage retries a google-auth TransportError when its cause is
    # retryable; a token that could not be fetched means the request was never
    # sent to the bucket, so every one is safe to retry (as is a timed-out or
    # retryable-marked auth failure).
    auth_failure = isinstance(exc, (aexc.TransportError, aexc.TimeoutError)) or (
        isinstance(exc, aexc.GoogleAuthError) and exc.retryable)
    if auth_failure or isinstance(exc, _transport_errors()):
        return Transient(type(exc).__name__)  # its text may hold the endpoint: logged, not replied
    return exc


#: The largest body google-cloud-storage sends in one request; above it the SDK starts a resumable upload.
_ONE_REQUEST_LIMIT = 5 * 1024**4  # GCS's own object size limit (5 TiB): every body in one request


def _single_request_uploads() -> None:
    """Make the SDK send every upload as ONE request (multipart), whatever its size.

    google-cloud-storage uploads a body over 8 MiB (``blob._MAX_MULTIPART_SIZE``)
    as a resumable upload: a session request, then the data.  That is a
    second request path, with faults of its own, and fake-gcs-server checks no
    ``ifGenerationMatch`` on it (two 9 MB creates of one event both won).  With
    one path, the server check (server_check.py) covers every write this
    backend makes; GCS accepts a single-request upload of any size.  The
    SDK reads the limit at each upload, so raising it here (this process's
    SDK, used by nothing else) takes effect at once; tests/test_large_bodies.py
    counts one request a write at the proxy, and fails if a later SDK stops
    honouring it.
    """
    from google.cloud.storage import blob as sdk_blob

    if getattr(sdk_blob, "_MAX_MULTIPART_SIZE", None) != _ONE_REQUEST_LIMIT:
        sdk_blob._MAX_MULTIPART_SIZE = _ONE_REQUEST_LIMIT


#: An object's ``updated`` as GCS writes it (RFC 3339, UTC, up to nanoseconds): google-cloud-storage's
#: ``_RFC3339_NANOS``, whose groups ``_updated`` reads.
_UPDATED = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z")


def _updated(blob: Any) -> float:
    """``blob.updated.timestamp()`` (0.0 when the listing gave none), without the SDK's ``strptime``.

    The SDK parses ``updated`` with ``datetime.strptime``, whose first call
    in a process imports ``_strptime`` and builds its locale's patterns:
    about 2 ms, paid by a fresh process's first listing that names a key (a
    read's, beside its blocks), and some 15 us a key after that.  The same
    value from the same fields (nanoseconds cut to microseconds, as the SDK
    does); any other text goes through the SDK's own property.
    """
    found = _UPDATED.match(getattr(blob, "_properties", {}).get("updated") or "")
    if found is None:
        updated = blob.updated
        return float(updated.timestamp()) if updated else 0.0
    year, month, day, hour, minute, second, nanos = found.groups()
    micros = 0 if nanos is None else int(nanos) * 10 ** (9 - len(nanos)) // 1000
    try:
        when = datetime.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micros,
                                 tzinfo=datetime.timezone.utc)
    except ValueError:  # a date no calendar has: the SDK's own error
        updated = blob.updated
        return float(updated.timestamp()) if updated else 0.0
    return when.timestamp()


class _EnvironmentOnce:
    """A session's ``merge_environment_settings``, the environment's part read once per host.

    ``requests`` reads the environment's proxy and CA-bundle settings again
    for every request (``trust_env``): every variable of the environment
    decoded, twice, about 90 us of a GCS request's 800 us of CPU on this
    project's machines.  The environment of a process that uses a store
    does not change under it, so the answer is kept per host and per the
    request's and session's own settings (the session's may change: they are
    part of the key), and a copy handed out each time (the caller may change
    it).  boto3 reads its proxies once as well, when its client is made; a
    process that changes its proxy settings must open its store again.
    """

    #: Distinct keys kept at most (a store talks to one host; past this, the oldest answers go).
    KEPT = 64

    def __init__(self, session: Any) -> None:
        self.session = session
        self.merge: Callable[..., dict[str, Any]] = session.merge_environment_settings
        self.kept: dict[tuple[Any, ...], dict[str, Any]] = {}

    def __call__(self, url: str, proxies: dict[str, str] | None, stream: Any, verify: Any,
                 cert: Any) -> dict[str, Any]:
        session = self.session
        try:
            parts = urlsplit(url)
            key = (parts.scheme, parts.netloc, session.trust_env, stream, verify, cert,
                   tuple(sorted((proxies or {}).items())), tuple(sorted((session.proxies or {}).items())),
                   session.stream, session.verify, session.cert)
            hash(key)
        except (TypeError, ValueError):  # a setting that is no plain value: asked every time
            return self.merge(url, proxies, stream, verify, cert)
        found = self.kept.get(key)
        if found is None:  # on a copy: the caller's dict is left as it was (requests reads it no more)
            found = self.merge(url, None if proxies is None else dict(proxies), stream, verify, cert)
            if len(self.kept) >= self.KEPT:
                self.kept.clear()
            self.kept[key] = found
        merged = found["proxies"]
        return {**found, "proxies": dict(merged) if isinstance(merged, dict) else merged}


class GCSBackend:
    """Objects in one GCS bucket; ``STORAGE_EMULATOR_HOST`` reaches an emulator."""

    label = "gcs"  # its kind, in metrics

    def __init__(self, bucket: str, timeout: float = 10.0) -> None:
        from google.cloud import storage

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            project = os.environ.get("GOOGLE_CLOUD_PROJECT", "test")
            self.client = storage.Client(project=project, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
        else:
            self.client = storage.Client()
        # The drivers read up to 16 objects at once; the default pool of 10
        # connections would be dropped and reopened (and warn on stderr).
        # max_retries=0 is urllib3's Retry(0, read=False): nothing re-sent below us.
        from requests.adapters import HTTPAdapter

        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
        self.client._http.mount("https://", adapter)
        self.client._http.mount("http://", adapter)
        self.client._http.merge_environment_settings = _EnvironmentOnce(self.client._http)
        # google-cloud-storage 3.x reads the bucket's metadata (project number,
        # location) in a background thread for its tracing, and checks that
        # the bucket exists after an object's 404: requests the driver never
        # asked for, each needing storage.buckets.get, which deploy/gcs's role
        # does not grant (it grants objects under one prefix, nothing more).
        # With no cache the library skips both (it tests the attribute first).
        if getattr(self.client, "_bucket_metadata_cache", None) is not None:
            self.client._bucket_metadata_cache = None
        self.bucket = self.client.bucket(bucket)
        self.bucket_name = bucket
        # Each request's own timeout, cut to what is left of the op's window (``try_timeout``): a try
        # begun near the op's end must not outlast it.  (S3 sets its read timeout per client: see s3.py.)
        self.timeout = timeout
        self.clock = StoreClock(probe=probe_by_reading(self.get))
        # Every reply's Date header tells the store's time (see clock.py).
        self.client._http.hooks["response"].append(self._received)
        # Retries are ours (RetryingStore), so that a retried conditional
        # write can recognise its own first attempt; the library's are off:
        # retry=None reaches the JSON API calls (google.cloud._http
        # api_request) and the media Download / MultipartUpload, whose
        # _request_helpers.wait_and_retry calls the request once when the
        # strategy is None.
        self._no_retry: Any = None
        _single_request_uploads()

    def _received(self, response: Any, *args: Any, **kwargs: Any) -> None:
        received = time.time()
        self.clock.observe_http_date(received - response.elapsed.total_seconds(), received,
                                     response.headers.get("Date"))

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        """(bytes, generation), or None when absent; with ``head``, only the first ``head`` bytes.

        The generation is the whole object's, also for a range.
        """
        blob = self.bucket.blob(key)
        span: dict[str, int] = {}
        if head is not None:
            if head < 1:
                raise ValueError(f"head must be at least 1, not {head}")
            span = {"start": 0, "end": head - 1}
        try:
            data = blob.download_as_bytes(
                timeout=try_timeout(self.timeout), retry=self._no_retry, checksum=None, **span)
        except Exception as exc:  # noqa: BLE001 - classified below
            if head is not None and getattr(exc, "code", None) == 416:
                whole = self.get(key)  # a zero-length object (or gone since): ask without a range
                return None if whole is None else (whole[0][:head], whole[1])
            mapped = _classify(exc)
            if isinstance(mapped, NotFound):
                return None
            raise mapped from exc
        return data, str(blob.generation)

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        blob = self.bucket.blob(key)
        match: int | None = None
        if isinstance(mode, Create):
            match = 0
        elif isinstance(mode, Update):
            match = int(mode.version)
        try:
            blob.upload_from_string(
                raw,
                content_type="application/octet-stream",
                if_generation_match=match,
                timeout=try_timeout(self.timeout),
                retry=self._no_retry,
                checksum=None,
            )
        except Exception as exc:  # noqa: BLE001
            mapped = _classify(exc, creating=isinstance(mode, Create))
            if isinstance(mapped, NotFound) and isinstance(mode, Update):
                raise PreconditionFailed(key) from exc
            raise (_bucket_gone(mapped) if isinstance(mode, Create) else mapped) from exc
        return str(blob.generation)

    def delete(self, key: str, version: str | None) -> None:
        blob = self.bucket.blob(key)
        try:
            blob.delete(
                if_generation_match=int(version) if version is not None else None,
                timeout=try_timeout(self.timeout),
                retry=self._no_retry,
            )
        except Exception as exc:  # noqa: BLE001
            raise _classify(exc) from exc

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        # startOffset is inclusive: ask from start_after and drop it if present.
        extra = 1 if start_after is not None and limit is not None else 0
        try:
            blobs = self.client.list_blobs(
                self.bucket_name,
                prefix=prefix,
                start_offset=start_after,
                max_results=(limit + extra) if limit is not None else None,
                timeout=try_timeout(self.timeout),
                retry=self._no_retry,
                fields="items(name,updated,generation,size),nextPageToken",
            )
            got = 0
            for blob in blobs:
                if start_after is not None and blob.name <= start_after:
                    continue
                if limit is not None and got >= limit:
                    return
                got += 1
                yield Listed(blob.name, _updated(blob),
                             str(blob.generation) if blob.generation else None,
                             int(blob.size) if blob.size is not None else None)
        except Exception as exc:  # noqa: BLE001
            raise _bucket_gone(_classify(exc)) from exc

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        try:
            it = self.client.list_blobs(
                self.bucket_name, prefix=prefix, delimiter="/", timeout=try_timeout(self.timeout), retry=self._no_retry,
                fields="items(name),prefixes,nextPageToken",
            )
            names = {b.name[len(prefix):] for b in it}
            dirs = {p[len(prefix):].rstrip("/") for p in it.prefixes}
        except Exception as exc:  # noqa: BLE001
            raise _bucket_gone(_classify(exc)) from exc
        return sorted(dirs | names)

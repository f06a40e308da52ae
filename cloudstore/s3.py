"""The S3-compatible backend: races settled by ``If-None-Match: *`` / ``If-Match``.

The version token is the ETag.  ETags of single-part PUTs are MD5s of the
body, so equal bodies would share one; the seam's framing puts a fresh nonce
in every body, which makes every write's ETag new (no ABA).

S3 may answer ``409 ConditionalRequestConflict`` when conditional writes to
one key overlap: that is treated as transient, and the retry then meets the
winner and answers AlreadyExists / PreconditionFailed (or, if the winner was
our own first attempt, success, by the nonce).

botocore's own retries are switched off so that every retry goes through
``RetryingStore``, which knows its own writes: ``total_max_attempts`` counts
*attempts* (1 = the request is sent once; botocore's ``max_attempts`` in a
``Config`` counts *retries*, so ``max_attempts: 1`` meant two sends, and a
conditional PUT whose reply was lost was re-sent by botocore, met its own
first attempt as 412, and was answered "already exists").  urllib3 does not
re-send either: botocore's ``URLLib3Session.send`` passes ``Retry(False)``.
What botocore's standard retry mode would have retried is ``Transient`` here
instead (``_classify``).  boto3 finds the endpoint in ``AWS_ENDPOINT_URL_S3``
/ ``AWS_ENDPOINT_URL`` and the credentials by its usual chain.
"""

from __future__ import annotations

import builtins
import datetime
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .clock import StoreClock, probe_by_reading
from .errors import SettingError
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
)
from .http_status import BUCKET_GONE, http_retry_after, is_refusal, meaning, refused

# Error codes retried: botocore's standard retry mode (botocore/retries/standard.py:
# TransientRetryableChecker._TRANSIENT_ERROR_CODES and ThrottledRetryableChecker.
# _THROTTLED_ERROR_CODES), plus S3's own transient answers.
_TRANSIENT_CODES = {
    # botocore: transient
    "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
    # botocore: throttled
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled", "SlowDown",
    "EC2ThrottledException",
    # S3: overlapping conditional writes, internal errors, and the like
    "ConditionalRequestConflict", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable",
    "OperationAborted", "500", "502", "503", "504",
}


# Codes that say the request was refused for its rate, before it was applied (botocore's
# ThrottledRetryableChecker._THROTTLED_ERROR_CODES and S3's SlowDown): nothing was written.
_THROTTLE_CODES = {
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled", "SlowDown",
    "EC2ThrottledException",
}

# What a refusal means, by S3 error code, naming the limit where one is known.  The store's
# own message is not repeated: it may name the bucket or key, which replies never show.
_REFUSALS = {
    "KeyTooLongError": "a path part is longer than the store accepts (S3: 1,024 bytes a whole key; "
                       "MinIO and SeaweedFS: 255 bytes a part)",
    "EntityTooLarge": "the object is larger than the store accepts (S3: 5 GiB in one PUT)",
    "MaxMessageLengthExceeded": "the request is larger than the store accepts",
    "MetadataTooLarge": "the object's metadata is larger than the store accepts (S3: 2 KiB)",
    "XMinioParentIsObject": "a path names a folder where the store keeps a file of the same name",
    "ObjectExistsAsPrefix": "a path names a file where the store keeps a folder of the same name",
    "XMinioObjectExistsAsDirectory": "a path names a file where the store keeps a folder of the same name",
    "NoSuchBucket": BUCKET_GONE,
    "AccessDenied": "the driver's credentials may not do this here",
    "AllAccessDisabled": "all access to the bucket is disabled",
    "InvalidAccessKeyId": "the driver's credentials are not known to the store",
    "SignatureDoesNotMatch": "the driver's credentials were not accepted",
    "ExpiredToken": "the driver's credentials have expired",
    "MethodNotAllowed": "the store does not allow this method here",
    "MissingContentLength": "the store wants the request's length first",
    "NotImplemented": "the store does not implement this request",
}


def refusal(status: int, code: str) -> StoreRefused | None:
    """A 4xx reply (or NoSuchBucket's 404) the store gives whatever the retry, as ``StoreRefused``; else None.

    The request was not applied: nothing was changed, and the reply says so.
    """
    if code in _REFUSALS or is_refusal(status):
        return refused(f"{status} {code or 'error'}", _REFUSALS.get(code) or meaning(status))
    return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Failures of the connection or of reading a reply: worth another try.

    botocore's standard mode retries ``ConnectionError`` and ``HTTPClientError``
    (``TransientRetryableChecker._TRANSIENT_EXCEPTION_CLS``), which cover
    connect / read timeouts, a connection closed before the reply, and
    ``ResponseStreamingError`` (urllib3's ``ProtocolError`` while a body is
    read).  A body cut short with no error from the socket is botocore's
    ``IncompleteReadError`` (``StreamingBody._verify_content_length``; botocore
    sends with ``enforce_content_length=False``), which no retry mode sees since
    the body is read after the call returned.  Raw urllib3 / http.client errors
    and the builtin connection errors are there in case one escapes botocore's
    wrapping.
    """
    import http.client

    import urllib3.exceptions as u3
    from botocore import exceptions as bexc

    return (
        bexc.ConnectionError, bexc.HTTPClientError, bexc.IncompleteReadError,
        u3.ProtocolError, u3.TimeoutError, u3.PoolError, u3.SSLError,
        http.client.IncompleteRead, http.client.BadStatusLine, http.client.ResponseNotReady,
        ConnectionError, TimeoutError,
    )


def _classify(exc: Exception, creating: bool = False, updating: bool = False) -> Exception:
    """Map a botocore error onto the seam's vocabulary.

    A throttle (503 ``SlowDown``, 429...) is ``Throttled``: refused, not
    applied, retried until the deadline.  A 4xx refusal (400, 403, 404 of
    the bucket, 405, 411, 413...) is ``StoreRefused``: nothing was changed,
    never ``outcome unknown``.
    """
    from botocore import exceptions as bexc

    if isinstance(exc, bexc.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "PreconditionFailed" or status == 412:
            return AlreadyExists(code) if creating else PreconditionFailed(code)
        if code in _THROTTLE_CODES or status == 429:
            headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
            return Throttled(f"{status} {code}", http_retry_after(headers.get("retry-after")))
        refused = refusal(status, code)
        if refused is not None and code not in _TRANSIENT_CODES:
            return refused
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return PreconditionFailed(code) if updating else NotFound(code)
        if code in _TRANSIENT_CODES or status == 409 or status >= 500:
            return Transient(f"{status} {code}")
        return exc  # type: ignore[no-any-return]  # botocore is untyped: narrowed to Any
    if isinstance(exc, _transport_errors()):
        return Transient(type(exc).__name__)  # its text may hold the endpoint: logged, not replied
    return exc


def _unsatisfiable_range(exc: Exception) -> bool:
    """S3's answer to any range on a zero-length object (416 ``InvalidRange``)."""
    from botocore import exceptions as bexc

    if not isinstance(exc, bexc.ClientError):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return bool(status == 416 or exc.response.get("Error", {}).get("Code") == "InvalidRange")


def config_options(timeout: float = 10.0) -> dict[str, Any]:
    """The botocore ``Config`` options of every S3 client of this project, boto3's and aiobotocore's.

    One place, so the asyncio flavour (``cloudstore.aio``) sends each request
    exactly as the drivers do: once (``total_max_attempts: 1``, see the module
    docstring), with the same timeouts and connection pool.

    Request checksums only where an operation requires one (botocore 1.36
    and later add a CRC32 to every PutObject by default), as the GCS backend
    sends none (``checksum=None``): the connection has its own integrity
    (TLS), and S3-compatible servers that predate the checksum headers
    refused them once botocore turned them on.  On moto sharing two cores
    with its client they cost 6% of a conditional create's client CPU and
    about a fifth of its wall time (measured here).  A botocore too old to
    know the setting sends none anyway.  Replies are still checked wherever
    the store sends a checksum.
    """
    from botocore.config import Config

    options: dict[str, Any] = {
        "retries": {"total_max_attempts": 1, "mode": "standard"},
        "connect_timeout": 5,
        "read_timeout": timeout,
        "max_pool_connections": 32,
    }
    if "request_checksum_calculation" in Config.OPTION_DEFAULTS:
        options["request_checksum_calculation"] = "when_required"
    return options


#: The two timestamps S3 sends: a listing's ``LastModified`` (ISO 8601, UTC, milliseconds) and a reply's
#: ``Last-Modified`` header (an HTTP date).  ``timestamp_parser`` reads these without dateutil.
_ISO_UTC = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z")
_HTTP_DATE = re.compile(r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d{2}) "
                        r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT")
_MONTHS = {name: number for number, name in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}


def timestamp_parser() -> Callable[[Any], datetime.datetime]:
    """botocore's ``parse_timestamp`` with a short way for the two forms S3 sends.

    botocore parses every timestamp of a reply with dateutil: the
    ``Last-Modified`` of each GET (which the drivers never read) and the
    ``LastModified`` of each listed key, some 40 us each, about 3% of a
    GET's client CPU on moto.  These two forms are read here by pattern, to
    the same instant, in UTC (dateutil's tzinfo says UTC, or the local zone
    where that is UTC: the drivers read only ``timestamp()``); anything
    else, a date no calendar has included, goes to botocore's own, and
    fails as it fails.
    """
    from botocore.utils import parse_timestamp

    utc = datetime.timezone.utc

    def parse(value: Any) -> datetime.datetime:
        if isinstance(value, str):
            iso = _ISO_UTC.fullmatch(value)
            http = None if iso else _HTTP_DATE.fullmatch(value)
            try:
                if iso is not None:
                    year, month, day, hour, minute, second, fraction = iso.groups()
                    return datetime.datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                                             int((fraction or "0").ljust(6, "0")), tzinfo=utc)
                if http is not None:
                    day, month, year, hour, minute, second = http.groups()
                    return datetime.datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute),
                                             int(second), tzinfo=utc)
            except ValueError:
                pass  # botocore's own error
        return parse_timestamp(value)  # type: ignore[no-any-return]  # botocore is untyped

    return parse


def make_client(timeout: float = 10.0, client_args: Mapping[str, Any] | None = None) -> Any:
    """A boto3 S3 client as the drivers make it; ``client_args`` (``endpoint_url``, ``region_name``)
    override what boto3 would find in the environment.  On a botocore session of its own, whose
    replies' timestamps ``timestamp_parser`` reads."""
    import boto3
    import botocore.session
    from botocore.config import Config

    core = botocore.session.get_session()
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=timestamp_parser())
    return boto3.session.Session(botocore_session=core).client("s3", config=Config(**config_options(timeout)),
                                                               **(client_args or {}))


NO_CREDENTIALS = (
    "LNK_BUCKET_URL names a store that cannot be opened: no AWS credentials found: set AWS_ACCESS_KEY_ID "
    "and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where a role provides them"
)


def _has_credentials(client: Any) -> bool:
    """Whether boto3 found credentials for ``client`` (resolved when it was made); True when it can't tell."""
    signer = getattr(client, "_request_signer", None)
    return getattr(signer, "_credentials", True) is not None


class S3Backend:
    """Objects in one S3 bucket.

    ``client`` is boto3's by default; ``cloudstore.aio`` passes a client of the
    same shape whose calls run on aiobotocore, so that every request is built,
    sent and its failure mapped by this one class.

    Unlike GCS, a try here is not cut to what is left of the op's window
    (``generations.try_timeout``): botocore takes its read timeout from the
    client's ``Config``, not per request, and a client per timeout would cost
    a client's making (and its connection pool) per try.  So a try begun near
    the window's end may wait its full ``timeout``; the window still stops the
    op's next request, and the bridge, past its call limit, answers ``outcome
    unknown``.
    """

    label = "s3"  # its kind, in metrics

    def __init__(self, bucket: str, timeout: float = 10.0, client: Any = None) -> None:
        self.client: Any = make_client(timeout) if client is None else client
        if client is None and not _has_credentials(self.client):
            # Else every request fails signing (botocore's NoCredentialsError): an "internal error"
            # and a traceback per request, for what is the operator's setting to fix.
            raise SettingError(NO_CREDENTIALS)
        self.bucket = bucket
        self.clock = StoreClock(probe=probe_by_reading(self.get))
        # Every reply's Date header tells the store's time (see clock.py).
        self.client.meta.events.register("before-call.s3", self._sent)
        self.client.meta.events.register("after-call.s3", self._received)

    @staticmethod
    def _sent(context: dict[str, Any], **_: Any) -> None:
        context["cloudstore_sent"] = time.time()

    def _received(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        sent = context.get("cloudstore_sent")
        if sent is not None and http_response is not None:
            self.clock.observe_http_date(sent, time.time(), http_response.headers.get("Date"))

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        """(bytes, ETag), or None when absent; with ``head``, only the first ``head`` bytes.

        The ETag is the whole object's, also for a range.  The body is read
        inside the classified block: a reply cut short is ``Transient``.
        """
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if head is not None:
            if head < 1:
                raise ValueError(f"head must be at least 1, not {head}")
            args["Range"] = f"bytes=0-{head - 1}"
        try:
            got = self.client.get_object(**args)
            return got["Body"].read(), str(got["ETag"])
        except Exception as exc:  # noqa: BLE001
            if head is not None and _unsatisfiable_range(exc):
                whole = self.get(key)  # a zero-length object (or gone since): ask without a range
                return None if whole is None else (whole[0][:head], whole[1])
            mapped = _classify(exc)
            if isinstance(mapped, NotFound):
                return None
            raise mapped from exc

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": raw}
        if isinstance(mode, Create):
            args["IfNoneMatch"] = "*"
        elif isinstance(mode, Update):
            args["IfMatch"] = mode.version
        try:
            return str(self.client.put_object(**args)["ETag"])
        except Exception as exc:  # noqa: BLE001
            raise _classify(exc, creating=isinstance(mode, Create), updating=isinstance(mode, Update)) from exc

    def delete(self, key: str, version: str | None) -> None:
        """Remove ``key`` (only at ``version`` when given); NotFound when absent.

        A conditional DELETE of a missing key is 404 on AWS S3 and moto but
        412 on SeaweedFS (and servers like it): a 412 is asked again by a HEAD,
        so that absent is NotFound on every server (the seam's retry counts a
        delete that finds its key gone as its own) and PreconditionFailed means
        another version is there.
        """
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if version is not None:
            args["IfMatch"] = version
        try:
            self.client.delete_object(**args)
        except Exception as exc:  # noqa: BLE001
            mapped = _classify(exc, updating=False)
            if isinstance(mapped, PreconditionFailed) and not self._exists(key):
                raise NotFound("412 on a conditional delete of a key that is not there") from exc
            raise mapped from exc

    def _exists(self, key: str) -> bool:
        """Whether ``key`` is there now (a HEAD; its failures mapped as every request's)."""
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
            return True
        except Exception as exc:  # noqa: BLE001
            mapped = _classify(exc)
            if isinstance(mapped, NotFound):
                return False
            raise mapped from exc

    def _pages(self, **args: Any) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            if token:
                args["ContinuationToken"] = token
            try:
                page = self.client.list_objects_v2(Bucket=self.bucket, **args)
            except Exception as exc:  # noqa: BLE001
                raise _classify(exc) from exc
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        args: dict[str, Any] = {"Prefix": prefix}
        if start_after is not None:
            args["StartAfter"] = start_after
        if limit is not None:
            args["MaxKeys"] = min(limit, 1000)
        got = 0
        for page in self._pages(**args):
            for item in page.get("Contents", []):
                got += 1
                yield Listed(item["Key"], item["LastModified"].timestamp(), item.get("ETag"), item.get("Size"))
                if limit is not None and got >= limit:
                    return  # before the paginator asks for a page nobody will read

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        parts: set[str] = set()
        for page in self._pages(Prefix=prefix, Delimiter="/"):
            parts.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
            parts.update(item["Key"][len(prefix):] for item in page.get("Contents", []))
        return sorted(parts)

"""The S3-compatible backend: races settled by ``If-None-Match: *`` / ``If-Match``.

The version token is the ETag.  ETags of single-part PUTs are MD5s of the
body, so equal bodies would share one; the seam's framing puts a fresh nonce
in every body, which makes every write's ETag new (no ABA).

S3 may answer ``409 ConditionalRequestConflict`` when conditional writes to
one key overlap: that is treated as transient, and the retry then meets the
winner and answers AlreadyExists / PreconditionFailed (or, if the winner was
our own first attempt, success, by the nonce).

botocore's own retries are switched off (one attempt) so that every retry
goes through ``RetryingStore``, which knows its own writes.  boto3 finds
the endpoint in ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` and the
credentials by its usual chain.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .generations import AlreadyExists, Create, Listed, NotFound, PreconditionFailed, PutMode, Transient, Update

_TRANSIENT_CODES = {
    "ConditionalRequestConflict", "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
    "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "OperationAborted", "503", "500", "502", "504",
}


def _classify(exc: Exception, creating: bool = False, updating: bool = False) -> Exception:
    """Map a botocore error onto the seam's vocabulary."""
    from botocore import exceptions as bexc

    if isinstance(exc, bexc.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "PreconditionFailed" or status == 412:
            return AlreadyExists(code) if creating else PreconditionFailed(code)
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return PreconditionFailed(code) if updating else NotFound(code)
        if code in _TRANSIENT_CODES or status == 409 or status == 429 or status >= 500:
            return Transient(f"{status} {code}")
        return exc
    if isinstance(exc, (bexc.EndpointConnectionError, bexc.ConnectionClosedError, bexc.ReadTimeoutError,
                        bexc.ConnectTimeoutError, bexc.ConnectionError, bexc.HTTPClientError)):
        return Transient(str(exc))
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return Transient(str(exc))
    return exc


class S3Backend:
    """Objects in one S3 bucket."""

    def __init__(self, bucket: str, timeout: float = 10.0) -> None:
        import boto3
        from botocore.config import Config

        config = Config(
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=timeout,
            max_pool_connections=32,
        )
        self.client: Any = boto3.session.Session().client("s3", config=config)
        self.bucket = bucket

    def get(self, key: str) -> Optional[tuple[bytes, str]]:
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=key)
            return got["Body"].read(), got["ETag"]
        except Exception as exc:  # noqa: BLE001
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

    def delete(self, key: str, version: Optional[str]) -> None:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if version is not None:
            args["IfMatch"] = version
        try:
            self.client.delete_object(**args)
        except Exception as exc:  # noqa: BLE001
            raise _classify(exc, updating=False) from exc

    def _pages(self, **args: Any) -> Iterator[dict]:
        token: Optional[str] = None
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

    def list(self, prefix: str, start_after: Optional[str], limit: Optional[int]) -> Iterator[Listed]:
        args: dict[str, Any] = {"Prefix": prefix}
        if start_after is not None:
            args["StartAfter"] = start_after
        if limit is not None:
            args["MaxKeys"] = min(limit, 1000)
        got = 0
        for page in self._pages(**args):
            for item in page.get("Contents", []):
                if limit is not None and got >= limit:
                    return
                got += 1
                yield Listed(item["Key"], item["LastModified"].timestamp(), item.get("ETag"))

    def list_dirs(self, prefix: str) -> list[str]:
        parts: set[str] = set()
        for page in self._pages(Prefix=prefix, Delimiter="/"):
            parts.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
            parts.update(item["Key"][len(prefix):] for item in page.get("Contents", []))
        return sorted(parts)

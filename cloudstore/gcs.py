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

import os
from typing import Any, Iterator, Optional

from .generations import AlreadyExists, Create, Listed, NotFound, PreconditionFailed, PutMode, Transient, Update

_TRANSIENT_CODES = {408, 409, 429, 500, 502, 503, 504}


def _classify(exc: Exception, creating: bool = False) -> Exception:
    """Map a google-api-core / transport error onto the seam's vocabulary."""
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.PreconditionFailed):
        return AlreadyExists(str(exc)) if creating else PreconditionFailed(str(exc))
    if isinstance(exc, gexc.NotFound):
        return NotFound(str(exc))
    code = getattr(exc, "code", None)
    if isinstance(exc, gexc.GoogleAPICallError) and code in _TRANSIENT_CODES:
        return Transient(f"{code}: {exc}")
    try:
        import requests

        if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
            return Transient(str(exc))
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return Transient(str(exc))
    return exc


class GCSBackend:
    """Objects in one GCS bucket; ``STORAGE_EMULATOR_HOST`` reaches an emulator."""

    def __init__(self, bucket: str, timeout: float = 10.0) -> None:
        from google.cloud import storage

        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            project = os.environ.get("GOOGLE_CLOUD_PROJECT", "test")
            self.client = storage.Client(project=project, credentials=AnonymousCredentials())
        else:
            self.client = storage.Client()
        # The drivers read up to 16 objects at once; the default pool of 10
        # connections would be dropped and reopened (and warn on stderr).
        from requests.adapters import HTTPAdapter

        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
        self.client._http.mount("https://", adapter)
        self.client._http.mount("http://", adapter)
        self.bucket = self.client.bucket(bucket)
        self.bucket_name = bucket
        self.timeout = timeout
        # Retries are ours (RetryingStore), so that a retried conditional
        # write can recognise its own first attempt; the library's are off.
        self._no_retry: Any = None

    def get(self, key: str) -> Optional[tuple[bytes, str]]:
        blob = self.bucket.blob(key)
        try:
            data = blob.download_as_bytes(timeout=self.timeout, retry=self._no_retry, checksum=None)
        except Exception as exc:  # noqa: BLE001 - classified below
            mapped = _classify(exc)
            if isinstance(mapped, NotFound):
                return None
            raise mapped from exc
        return data, str(blob.generation)

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        blob = self.bucket.blob(key)
        match: Optional[int] = None
        if isinstance(mode, Create):
            match = 0
        elif isinstance(mode, Update):
            match = int(mode.version)
        try:
            blob.upload_from_string(
                raw,
                content_type="application/octet-stream",
                if_generation_match=match,
                timeout=self.timeout,
                retry=self._no_retry,
                checksum=None,
            )
        except Exception as exc:  # noqa: BLE001
            mapped = _classify(exc, creating=isinstance(mode, Create))
            if isinstance(mapped, NotFound) and isinstance(mode, Update):
                raise PreconditionFailed(key) from exc
            raise mapped from exc
        return str(blob.generation)

    def delete(self, key: str, version: Optional[str]) -> None:
        blob = self.bucket.blob(key)
        try:
            blob.delete(
                if_generation_match=int(version) if version is not None else None,
                timeout=self.timeout,
                retry=self._no_retry,
            )
        except Exception as exc:  # noqa: BLE001
            raise _classify(exc) from exc

    def list(self, prefix: str, start_after: Optional[str], limit: Optional[int]) -> Iterator[Listed]:
        # startOffset is inclusive: ask from start_after and drop it if present.
        extra = 1 if start_after is not None and limit is not None else 0
        try:
            blobs = self.client.list_blobs(
                self.bucket_name,
                prefix=prefix,
                start_offset=start_after,
                max_results=(limit + extra) if limit is not None else None,
                timeout=self.timeout,
                retry=self._no_retry,
                fields="items(name,updated,generation),nextPageToken",
            )
            got = 0
            for blob in blobs:
                if start_after is not None and blob.name <= start_after:
                    continue
                if limit is not None and got >= limit:
                    return
                got += 1
                yield Listed(blob.name, blob.updated.timestamp() if blob.updated else 0.0,
                             str(blob.generation) if blob.generation else None)
        except Exception as exc:  # noqa: BLE001
            raise _classify(exc) from exc

    def list_dirs(self, prefix: str) -> list[str]:
        try:
            it = self.client.list_blobs(
                self.bucket_name, prefix=prefix, delimiter="/", timeout=self.timeout, retry=self._no_retry,
                fields="items(name),prefixes,nextPageToken",
            )
            names = {b.name[len(prefix):] for b in it}
            dirs = {p[len(prefix):].rstrip("/") for p in it.prefixes}
        except Exception as exc:  # noqa: BLE001
            raise _classify(exc) from exc
        return sorted(dirs | names)

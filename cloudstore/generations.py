"""The object-store seam: one small interface, one error vocabulary.

Every race the drivers settle is settled here, by the store's own
conditional writes, in the spirit of arrow-rs ``object_store``'s PutMode:

* ``Create()``            - write only if no object has the key
  (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``).
* ``Update(version)``     - write only if the object is still at ``version``
  (GCS ``ifGenerationMatch=N``, S3 ``If-Match: etag``).
* ``Overwrite()``         - write whatever is there.

Failures come back as exactly three exceptions a caller reasons about:
``AlreadyExists``, ``PreconditionFailed`` and ``NotFound``; everything else a
backend can throw is either retried (``Transient``) or surfaces as
``StoreUnavailable`` carrying whether a write may have landed.

Framing.  Every body a backend stores starts with a header line holding a
fresh random nonce.  That does two jobs no backend can do alone:

* S3 ETags are MD5 of the body, so two writes of equal bytes would share an
  ETag and ``If-Match`` could not tell them apart (ABA).  With a nonce every
  write is a new ETag.
* A conditional write retried after a lost reply fails against its own first
  attempt.  The nonce lets ``RetryingStore`` read the object back and see
  that the winner was itself (the SlateDB approach).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol, TypeVar, Union

# --------------------------------------------------------------------------
# The error vocabulary


class StoreError(Exception):
    """Base of every error the seam raises."""


class AlreadyExists(StoreError):
    """A ``Create()`` found an object already at the key."""


class PreconditionFailed(StoreError):
    """An ``Update(version)`` found the object at another version, or gone."""


class NotFound(StoreError):
    """The object does not exist."""


class Transient(StoreError):
    """A failure worth retrying: timeout, 429, 5xx, reset connection, 409 race.

    Backends raise it; ``RetryingStore`` retries it and never lets it out.
    """


class StoreUnavailable(StoreError):
    """The store kept failing past the retry budget.

    ``outcome_unknown`` is True when the failed operation was a write that may
    have landed anyway; callers must then never claim it certainly failed.
    """

    def __init__(self, message: str, outcome_unknown: bool) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


# --------------------------------------------------------------------------
# Put modes


@dataclass(frozen=True)
class Create:
    """Write only if nothing is at the key."""


@dataclass(frozen=True)
class Update:
    """Write only if the object is still at ``version``."""

    version: str


@dataclass(frozen=True)
class Overwrite:
    """Write unconditionally."""


PutMode = Union[Create, Update, Overwrite]


# --------------------------------------------------------------------------
# What comes back


@dataclass(frozen=True)
class Object:
    """An object read back: its payload (frame stripped), version and nonce."""

    data: bytes
    version: str
    nonce: str


@dataclass(frozen=True)
class Listed:
    """One key from a listing: when it was last written (seconds) and its version.

    The version (generation, ETag or nonce) lets a reader that already holds
    that version of the object skip fetching it again.
    """

    key: str
    modified: float
    version: Optional[str] = None


# --------------------------------------------------------------------------
# Framing

_MAGIC = b"cs1 "
_NONCE_LEN = 32


def new_nonce() -> str:
    """128 random bits as hex: unique for every write on every machine."""
    return os.urandom(16).hex()


def frame(nonce: str, payload: bytes) -> bytes:
    """The bytes a backend stores: a header with the nonce, then the payload."""
    return _MAGIC + nonce.encode("ascii") + b"\n" + payload


def unframe(raw: bytes) -> tuple[str, bytes]:
    """Split stored bytes into (nonce, payload); foreign bytes get nonce ''."""
    head = len(_MAGIC) + _NONCE_LEN
    if raw.startswith(_MAGIC) and len(raw) > head and raw[head : head + 1] == b"\n":
        return raw[len(_MAGIC) : head].decode("ascii"), raw[head + 1 :]
    return "", raw


# --------------------------------------------------------------------------
# The interface every backend implements


class Backend(Protocol):
    """The raw operations a backend module provides.

    Backends store and return *framed* bytes as given; they raise only the
    vocabulary above (``Transient`` for anything worth another try).
    ``version`` is an opaque token: GCS generation, S3 ETag, local nonce.
    """

    def get(self, key: str) -> Optional[tuple[bytes, str]]:
        """(raw bytes, version) or None when absent."""
        ...

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        """Write under ``mode``; the new version."""
        ...

    def delete(self, key: str, version: Optional[str]) -> None:
        """Remove (only at ``version`` when given); NotFound when absent."""
        ...

    def list(self, prefix: str, start_after: Optional[str], limit: Optional[int]) -> Iterator[Listed]:
        """Keys under ``prefix`` after ``start_after``, in byte order."""
        ...

    def list_dirs(self, prefix: str) -> list[str]:
        """The distinct next path parts under ``prefix`` (delimiter ``/``)."""
        ...


# --------------------------------------------------------------------------
# Retries that know their own writes

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying: well inside the bridge's 30 s call limit."""

    attempts: int = 6
    first_delay: float = 0.05
    max_delay: float = 2.0
    deadline: float = 20.0


class RetryingStore:
    """The store the drivers use: framing, retries and own-write detection.

    Retries use tenacity with exponential backoff and jitter, bounded by
    attempts and a deadline.  A conditional write whose first try may have
    landed (a ``Transient`` after the request was sent) and whose retry then
    fails with ``AlreadyExists`` / ``PreconditionFailed`` reads the object:
    if its nonce is ours, the write was ours and succeeded.
    """

    def __init__(self, backend: Backend, policy: RetryPolicy = RetryPolicy()) -> None:
        self.backend = backend
        self.policy = policy
        self.requests = 0  # every backend request made, for benchmarks and logs
        self._count_lock = threading.Lock()

    # -- plumbing

    def _retry(self, fn: Callable[[], T], is_write: bool, what: str) -> T:
        import tenacity  # lazily: keeps `contract` free of the import

        policy = self.policy

        def count_and_call() -> T:
            with self._count_lock:
                self.requests += 1
            return fn()

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Transient),
            stop=tenacity.stop_after_attempt(policy.attempts) | tenacity.stop_after_delay(policy.deadline),
            wait=tenacity.wait_random_exponential(multiplier=policy.first_delay, max=policy.max_delay),
            reraise=True,
        )
        try:
            return retrying(count_and_call)
        except Transient as exc:
            state = "outcome unknown" if is_write else "nothing was changed"
            raise StoreUnavailable(f"store unavailable after retries ({what}): {exc}; {state}", is_write) from exc

    # -- reads

    def get(self, key: str) -> Optional[Object]:
        """The object at ``key``, or None."""
        got = self._retry(lambda: self.backend.get(key), False, f"get {key}")
        if got is None:
            return None
        raw, version = got
        nonce, payload = unframe(raw)
        return Object(payload, version, nonce)

    def list(self, prefix: str, start_after: Optional[str] = None, limit: Optional[int] = None) -> list[Listed]:
        """Keys under ``prefix`` after ``start_after`` in byte order, at most ``limit``."""
        return self._retry(
            lambda: list(self.backend.list(prefix, start_after, limit)), False, f"list {prefix}"
        )

    def list_dirs(self, prefix: str) -> list[str]:
        """Distinct next path parts below ``prefix``, sorted."""
        return self._retry(lambda: self.backend.list_dirs(prefix), False, f"list {prefix}")

    # -- writes

    def put(self, key: str, payload: bytes, mode: PutMode) -> Object:
        """Write ``payload`` under ``mode``; the object as written.

        Raises AlreadyExists / PreconditionFailed only when another writer won.
        """
        nonce = new_nonce()
        raw = frame(nonce, payload)
        tried = [0]

        def attempt() -> str:
            tried[0] += 1
            try:
                return self.backend.put(key, raw, mode)
            except (AlreadyExists, PreconditionFailed):
                if tried[0] > 1:
                    mine = self.backend.get(key)
                    if mine is not None and unframe(mine[0])[0] == nonce:
                        return mine[1]
                raise

        version = self._retry(attempt, True, f"put {key}")
        return Object(payload, version, nonce)

    def delete(self, key: str, version: Optional[str] = None) -> bool:
        """Remove ``key`` (only at ``version`` when given); whether it was there.

        A retry that finds the object gone after a failed first try counts as
        ours: deletion is idempotent.
        """
        tried = [0]

        def attempt() -> bool:
            tried[0] += 1
            try:
                self.backend.delete(key, version)
                return True
            except NotFound:
                return tried[0] > 1

        return self._retry(attempt, True, f"delete {key}")


def backoff_sleep(attempt: int, base: float = 0.002, cap: float = 0.1) -> None:
    """Jittered sleep between rounds of a compare-and-set loop that lost a race."""
    time.sleep(random.uniform(0, min(cap, base * (2 ** min(attempt, 10)))))

"""The object-store seam: one small interface, one error vocabulary.

Every race the drivers settle is settled here, by the store's own
conditional writes, in the spirit of arrow-rs ``object_store``'s PutMode:

* ``Create()``            - write only if no object has the key
  (GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``).
* ``Update.of(obj)``      - write only if the object is still the one read
  (GCS ``ifGenerationMatch=N``, S3 ``If-Match: etag``).
* ``Overwrite()``         - write whatever is there.

Failures come back as exactly three exceptions a caller reasons about:
``AlreadyExists``, ``PreconditionFailed`` and ``NotFound``; everything else a
backend can throw is either retried (``Transient``, and its ``Throttled``: a
refusal for the rate, retried until the deadline) or surfaces as
``StoreUnavailable`` carrying whether a write may have landed
(``StoreRefused`` for a 4xx the store answers whatever the retry: nothing
was changed).

Framing.  Every body a backend stores starts with a header line holding a
fresh random nonce and the *lineage* of the object: the short tags of the
writes it replaced, newest first.  That does what no backend can do alone:

* S3 ETags are MD5 of the body, so two writes of equal bytes would share an
  ETag and ``If-Match`` could not tell them apart (ABA).  With a nonce every
  write is a new ETag.
* A conditional write whose reply was lost, retried, fails against its own
  first attempt; and by the time the retry looks, another machine may have
  written on top of it.  The lineage lets ``RetryingStore`` tell the three
  cases apart: the write landed (our tag is in the chain), another write
  took its place (the version we replaced is followed by another's), or
  nobody can tell (``outcome unknown``).  Never "lost" about a write of ours.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .clock import StoreClock
from .errors import CloudstoreError
from .runtime import metrics

log = logging.getLogger("cloudstore")

# --------------------------------------------------------------------------
# The error vocabulary


class StoreError(CloudstoreError):
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


class Throttled(Transient):
    """The store refused the request for its rate, before applying anything.

    GCS answers 429 ``rateLimitExceeded`` (about one write a second to one
    object name), S3 503 ``SlowDown`` (per key prefix).  Both are refusals:
    the request was not applied, so unlike any other ``Transient`` a write
    refused this way certainly did not land.  ``RetryingStore`` retries it
    until the deadline (not the attempts), waiting ``retry_after`` seconds
    when the store said how long (a ``Retry-After`` header).
    """

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreUnavailable(StoreError):
    """The store kept failing past the retry budget, or a write's fate cannot be known.

    ``outcome_unknown`` is True when the failed request was a write that may
    have landed anyway; callers must then never claim it certainly failed.
    (Whether a whole *operation* changed anything also depends on the writes
    it made before: see ``RetryingStore.writes``.)  It is read from
    ``changed`` (``CloudstoreError``): None when the write may have landed.
    """

    def __init__(self, message: str, outcome_unknown: bool) -> None:
        super().__init__(message)
        self.changed = None if outcome_unknown else False


class StoreRefused(StoreUnavailable):
    """The store refused the request with a 4xx no retry changes (400, 401, 403, 404 of a bucket, 405, 411, 413).

    A refused request was not applied: certainly nothing was changed by it
    (``outcome_unknown`` is False, and the seam does not count it among
    ``RetryingStore.writes``).  The message names the refusal and, where
    known, the limit that was met (a key part too long...).  A subclass of
    ``StoreUnavailable`` so that every caller handling a failing store
    handles it too.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, outcome_unknown=False)


# --------------------------------------------------------------------------
# Lineage: what each stored body remembers of the writes before it
#
# A body's header names its own nonce and the tags (first 16 hex digits of
# the nonces) of the writes it replaced, newest first, up to ``HISTORY`` of
# them, ending with ``CREATED`` when the chain reaches the write that created
# the object, or ``UNKNOWN`` when a write did not know what it replaced
# (``Overwrite``, bodies of the older format).  A chain cut at ``HISTORY``
# entries ends with neither: what came before is unknown.

HISTORY = 16
CREATED = "0"
UNKNOWN = "?"
_TAG_LEN = 16


def tag(nonce: str) -> str:
    """The short form of a nonce kept in later bodies' lineage (64 bits: no collisions in practice)."""
    return nonce[:_TAG_LEN]


# --------------------------------------------------------------------------
# What comes back


@dataclass(frozen=True)
class Object:
    """An object read back: its payload (frame stripped), version, nonce and lineage.

    ``version`` is None for a write of ours that landed but had already been
    replaced by another machine's by the time our retry learnt it landed.
    """

    data: bytes
    version: str | None
    nonce: str
    history: tuple[str, ...] = (UNKNOWN,)


@dataclass(frozen=True)
class Listed:
    """One key from a listing: when it was last written (seconds) and its version.

    The version (generation, ETag or nonce) lets a reader that already holds
    that version of the object skip fetching it again.
    """

    key: str
    modified: float
    version: str | None = None
    size: int | None = None  # of the stored bytes, frame included


# --------------------------------------------------------------------------
# Put modes


@dataclass(frozen=True)
class Create:
    """Write only if nothing is at the key."""

    @property
    def lineage(self) -> tuple[str, ...]:
        return (CREATED,)


@dataclass(frozen=True)
class Update:
    """Write only if the object is still at ``version``.

    ``lineage`` is the chain of the object being replaced, its own tag first.
    Build it with ``Update.of(obj)`` from the object read, so the new body
    carries the chain on and a retry can tell whether its write landed.
    """

    version: str
    lineage: tuple[str, ...] = (UNKNOWN,)

    @classmethod
    def of(cls, obj: Object) -> Update:
        if obj.version is None:
            raise ValueError("an object whose version is unknown cannot be updated conditionally")
        return cls(obj.version, (tag(obj.nonce),) + obj.history)


@dataclass(frozen=True)
class Overwrite:
    """Write unconditionally."""

    @property
    def lineage(self) -> tuple[str, ...]:
        return (UNKNOWN,)


PutMode = Create | Update | Overwrite


# --------------------------------------------------------------------------
# Framing

_MAGIC = b"cs2 "
_OLD_MAGIC = b"cs1 "
_NONCE_LEN = 32
#: Enough bytes of a body to hold its whole frame header, lineage included.
FRAME_MAX = len(_MAGIC) + _NONCE_LEN + 1 + HISTORY * (_TAG_LEN + 1) + 1


def entropy(size: int) -> bytes:
    """Random bytes for nonces and marks; the one source, so a simulation can seed it."""
    return os.urandom(size)


def new_nonce() -> str:
    """128 random bits as hex: unique for every write on every machine."""
    return entropy(16).hex()


def frame(nonce: str, payload: bytes, lineage: tuple[str, ...] = (UNKNOWN,)) -> bytes:
    """The bytes a backend stores: a header with the nonce and lineage, then the payload."""
    chain = ",".join(lineage[:HISTORY]).encode("ascii")
    return _MAGIC + nonce.encode("ascii") + b" " + chain + b"\n" + payload


def unframe(raw: bytes) -> tuple[str, tuple[str, ...], bytes]:
    """Split stored bytes into (nonce, lineage, payload); foreign bytes get nonce ''."""
    head = len(_MAGIC) + _NONCE_LEN
    if raw.startswith(_MAGIC) and raw[head : head + 1] == b" ":
        end = raw.find(b"\n", head)
        if end > 0:
            try:
                chain = raw[head + 1 : end].decode("ascii")
                nonce = raw[len(_MAGIC) : head].decode("ascii")
            except UnicodeDecodeError:  # a header holding bytes no frame of ours holds: foreign bytes
                return "", (UNKNOWN,), raw
            return nonce, tuple(chain.split(",")) if chain else (), raw[end + 1 :]
    if raw.startswith(_OLD_MAGIC) and raw[head : head + 1] == b"\n":
        try:
            return raw[len(_MAGIC) : head].decode("ascii"), (UNKNOWN,), raw[head + 1 :]
        except UnicodeDecodeError:
            return "", (UNKNOWN,), raw
    return "", (UNKNOWN,), raw


def frame_nonce(raw: bytes) -> str:
    """The nonce of stored bytes (the local backend's version token)."""
    return unframe(raw)[0]


def own_write_fate(nonce: str, mode: PutMode, current: bytes | None) -> bool | None:
    """After a write that may have landed failed its precondition on retry: was it ours?

    True when the object, or a write after it, carries our nonce in its
    lineage (it landed, and may have been replaced since); False when the
    lineage shows another write took the place ours wanted (the version we
    replaced is followed by another's, or the chain back to the object's
    creation holds no write of ours); None when nobody can tell (the object
    is gone, or too many writes came since): the caller says ``outcome unknown``.

    A key deleted and created again meanwhile starts a fresh chain; the
    drivers delete only keys whose writers cannot be in that position
    (events of a removed epoch, emptied job records: see the README).
    """
    if current is None:
        return None
    current_nonce, history, _ = unframe(current)
    chain = (tag(current_nonce),) + history
    if tag(nonce) in chain:
        return True
    if isinstance(mode, Update):
        replaced = mode.lineage[0]
        return False if replaced != UNKNOWN and replaced in chain[1:] else None
    if isinstance(mode, Create):
        return False if chain[-1] == CREATED else None
    return None


# --------------------------------------------------------------------------
# The interface every backend implements


class Backend(Protocol):
    """The raw operations a backend module provides.

    Backends store and return *framed* bytes as given; they raise only the
    vocabulary above (``Transient`` for anything worth another try).
    ``version`` is an opaque token: GCS generation, S3 ETag, local nonce.
    """

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        """(raw bytes, version) or None when absent; only the first ``head`` bytes when given."""
        ...

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        """Write under ``mode``; the new version."""
        ...

    def delete(self, key: str, version: str | None) -> None:
        """Remove (only at ``version`` when given); NotFound when absent."""
        ...

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        """Keys under ``prefix`` after ``start_after``, in byte order."""
        ...

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """The distinct next path parts under ``prefix`` (delimiter ``/``)."""
        ...


class WriteGate(Protocol):
    """What the seam asks before every write (``store_gate.StoreGate``): may this process write the store?

    It raises (a ``StoreRefused``: nothing was changed) when the store's format
    record refuses this release, or its server ignores preconditions; it is
    cheap once it has answered.
    """

    def require_write(self) -> None: ...


# --------------------------------------------------------------------------
# Retries that know their own writes

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying: well inside the bridge's 30 s call limit.

    ``attempts`` bounds the tries spent on failures whose end nobody knows
    (timeouts, 5xx, resets); a throttle (``Throttled``) does not spend
    them: it says when to come back, and is retried until ``deadline``,
    first after ``throttle_delay`` seconds, doubling up to ``max_delay``
    (half of each wait jittered), or after the ``Retry-After`` the store
    sent, never past the deadline.
    """

    attempts: int = 6
    first_delay: float = 0.05
    max_delay: float = 2.0
    deadline: float = 20.0
    throttle_delay: float = 0.25


#: The clock of op windows (time.monotonic); a test replaces it to spend an op's time without waiting.
_now: Callable[[], float] = time.monotonic

#: When the op being answered must be done by (time.monotonic()), or None outside any op window.
_op_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("lnk_op_deadline", default=None)


@contextlib.contextmanager
def op_deadline(seconds: float) -> Iterator[None]:
    """Every retry loop inside shares one deadline, ``seconds`` from now (an outer window holds).

    So the requests of one op, throttled one after another, together stay
    inside the op's time (the bridge stops a call at 30 s) instead of each
    taking a deadline of its own.
    """
    if _op_deadline.get() is not None:
        yield
        return
    token = _op_deadline.set(_now() + seconds)
    try:
        yield
    finally:
        _op_deadline.reset(token)


@contextlib.contextmanager
def op_overtime(seconds: float) -> Iterator[None]:
    """The requests inside may be sent until ``seconds`` from now, though the op's window be spent.

    Only for a write the op owes the store after a pause took its time (an
    index entry its record already names, jobs.py), which is harmless
    whenever it lands: left unsent, the op would answer ``outcome unknown``
    over a change it made whole, and leave it broken.  The window is never
    shortened: what is left of it, if more, still holds.
    """
    ends = _op_deadline.get()
    if ends is None:
        yield
        return
    token = _op_deadline.set(max(ends, _now() + seconds))
    try:
        yield
    finally:
        _op_deadline.reset(token)


def op_time_left() -> float | None:
    """Seconds left of the op's window (negative once spent), or None outside any op window."""
    ends = _op_deadline.get()
    return None if ends is None else ends - _now()


#: The least timeout a try is given: a try is sent whole or not at all, never with a timeout of nothing.
MIN_TRY_TIMEOUT = 0.05


def try_timeout(own: float) -> float:
    """A backend request's timeout: its own (``own``), cut to what is left of the op's window.

    Without it a try begun a moment before the window ends still waits its
    full read timeout (10 s), and the op's time runs past the bridge's call
    limit: the bridge stops the driver and nobody learns the op's fate from it.
    """
    left = op_time_left()
    return own if left is None else max(MIN_TRY_TIMEOUT, min(own, left))


class OpTimeUp(StoreError):
    """The op's window was spent before its next request: that request is not sent.

    Raised by ``RetryingStore._request``; its ``_retry`` turns it into a
    ``StoreUnavailable`` saying whether an earlier try of the same request may
    have landed, and ``Service.answer`` words the whole op's effect.
    """


class _NotWaited(Exception):
    """A throttle carried past the retry loop, for a caller that moves on instead of waiting."""

    def __init__(self, throttle: Throttled) -> None:
        super().__init__(str(throttle))
        self.throttle = throttle


class RetryingStore:
    """The store the drivers use: framing, retries and own-write detection.

    Retries use tenacity with exponential backoff and jitter, bounded by
    attempts and a deadline.  A conditional write that may have landed (a
    ``Transient`` after it was sent) and whose retry then fails its
    precondition reads the object and judges by its lineage
    (``own_write_fate``): ours, certainly another's, or ``outcome unknown``.
    A conditional write refused for its rate reads the object before it is
    sent again (``_still_possible``), and is not sent when it can only fail.

    ``requests`` counts every backend request; ``writes`` every write that
    landed or may have (all but those the store refused: precondition
    failed, already exists, not found, a 4xx refusal, a throttle), so that
    an operation that fails can tell whether it may have changed something:
    any write since it began.  Requests, retries and throttled replies are
    also counted in ``metrics`` (by ``label``, the backend's kind, and the
    wire op being answered), and each request's time observed there, by
    its kind (get, put, delete, list), for the exporters.
    """

    def __init__(self, backend: Backend, policy: RetryPolicy = RetryPolicy(), die_at: int | None = None) -> None:
        self.backend = backend
        self.policy = policy
        #: The store's time as this process knows it (backends without one: the local clock).
        self.clock: StoreClock = getattr(backend, "clock", None) or StoreClock()
        self.die_at = die_at  # tests only: the process kills itself before this request (see failpoint)
        self.requests = 0
        self.writes = 0
        self._count_lock = threading.Lock()
        #: The backend's kind in metrics: "gcs", "s3" or "file".
        self.label = backend_label(backend)
        #: Asked before every write (``store_gate.guard`` sets it); None: a store used raw (tests, the gate's own).
        self.gate: WriteGate | None = None

    def _may_write(self) -> None:
        if self.gate is not None:
            self.gate.require_write()

    def op_window(self) -> contextlib.AbstractContextManager[None]:
        """One deadline (the policy's) for every retry inside: the service opens one around each op."""
        return op_deadline(self.policy.deadline)

    # -- plumbing

    def _request(self, kind: metrics.RequestKind, fn: Callable[[], T], is_write: bool = False) -> T:
        """One backend request of ``kind`` (``metrics.REQUEST_KINDS``: get, put, delete, list), counted and
        timed; a write not refused by the store counts as a change."""
        left = op_time_left()
        if left is not None and left <= 0:  # the op's time is spent: send nothing more, a write least of all
            request = "write" if is_write else "request"
            raise OpTimeUp(f"the op's time (LNK_OP_SECONDS) ran out before its next {request}")
        with self._count_lock:
            self.requests += 1
            if self.requests == self.die_at:
                failpoint()
        op = metrics.current_op()
        metrics.REQUESTS.inc(self.label, op)
        sent = time.perf_counter()
        try:
            result = fn()
        except (AlreadyExists, PreconditionFailed, NotFound, StoreRefused):
            raise  # refused by the store: nothing changed
        except Throttled:
            metrics.THROTTLED.inc(self.label, metrics.current_op())
            raise  # refused for its rate: nothing changed
        except BaseException:
            self._changed(is_write)  # it may have landed
            raise
        finally:
            metrics.REQUEST_SECONDS.observe(time.perf_counter() - sent, self.label, op, kind)
        self._changed(is_write)
        return result

    def _retried(self) -> None:
        metrics.RETRIES.inc(self.label, metrics.current_op())

    def _changed(self, is_write: bool) -> None:
        if is_write:
            with self._count_lock:
                self.writes += 1

    def _retry(self, fn: Callable[[], T], is_write: bool, what: str) -> T:
        """``fn`` retried by the policy; when it gives up, StoreUnavailable saying whether a try may have landed.

        A write's fate is unknown only when one of its tries failed in a way
        that may follow the store applying it; a try refused for the rate
        (``Throttled``) was not applied.  So a write refused on every try
        says it certainly did not land.
        """
        maybe_landed = [False]

        def tried() -> T:
            try:
                return fn()
            except Throttled:
                raise
            except Transient:
                maybe_landed[0] = True
                raise

        try:
            return retry_transient(self.policy, tried, self._retried)
        except OpTimeUp as exc:  # an earlier try of this request may have landed: then say so
            unknown = is_write and maybe_landed[0]
            raise StoreUnavailable(f"{exc}{'; outcome unknown' if unknown else ''}", unknown) from exc
        except Transient as exc:
            log.debug("gave up on %s: %r", what, exc.__cause__ or exc)
            unknown = is_write and maybe_landed[0]
            state = "; outcome unknown" if unknown else ""
            if isinstance(exc, Throttled) and not maybe_landed[0]:
                raise StoreUnavailable(
                    f"the store kept refusing the request for its rate until the deadline ({what}: {exc})", False
                ) from exc
            left = op_time_left()
            until = " until the op's time (LNK_OP_SECONDS) ran out" if left is not None and left <= 0 else ""
            raise StoreUnavailable(f"the store kept failing{until} ({what}: {exc}){state}", unknown) from exc

    # -- reads

    def get(self, key: str, head: int | None = None) -> Object | None:
        """The object at ``key``, or None; only the first ``head`` bytes of its payload when given."""
        raw_head = None if head is None else head + FRAME_MAX
        def fetch() -> tuple[bytes, str] | None:
            return self.backend.get(key) if raw_head is None else self.backend.get(key, raw_head)

        got = self._retry(lambda: self._request("get", fetch), False, "get")
        if got is None:
            return None
        raw, version = got
        nonce, history, payload = unframe(raw)
        return Object(payload, version, nonce, history)

    def list(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[Listed]:
        """Keys under ``prefix`` after ``start_after`` in byte order, at most ``limit``."""
        return self._retry(
            lambda: self._request("list", lambda: list(self.backend.list(prefix, start_after, limit))), False, "list"
        )

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """Distinct next path parts below ``prefix``, sorted."""
        return self._retry(lambda: self._request("list", lambda: self.backend.list_dirs(prefix)), False, "list")

    # -- writes

    def put(self, key: str, payload: bytes, mode: PutMode) -> Object:
        """Write ``payload`` under ``mode``; the object as written.

        Raises AlreadyExists / PreconditionFailed only when another writer
        certainly won; StoreUnavailable (outcome unknown) when a write that
        may have landed cannot be told apart from another's.
        """
        self._may_write()
        nonce = new_nonce()
        history = mode.lineage[:HISTORY]
        raw = frame(nonce, payload, history)
        maybe_landed = [False]
        throttled = [False]

        def judged(refused: StoreError) -> str | None:
            """A refusal of our write: another's win, unless a try whose reply was lost was ours."""
            if not maybe_landed[0]:
                raise refused
            current = self._request("get", lambda: self.backend.get(key))
            fate = own_write_fate(nonce, mode, None if current is None else current[0])
            if fate is None:
                raise StoreUnavailable(
                    "a write whose reply was lost met another write: outcome unknown", True
                ) from refused
            if not fate:
                raise refused
            assert current is not None
            return current[1] if frame_nonce(current[0]) == nonce else None

        def attempt() -> str | None:
            if throttled[0]:  # a read, outside the write's try: its failure says nothing of the write
                try:
                    self._still_possible(key, mode)
                except (AlreadyExists, PreconditionFailed) as refused:
                    return judged(refused)
            try:
                return self._request("put", lambda: self.backend.put(key, raw, mode), is_write=True)
            except Throttled:
                throttled[0] = True
                raise  # refused before it was applied: not a write that may have landed
            except Transient:
                maybe_landed[0] = True
                raise
            except (AlreadyExists, PreconditionFailed) as refused:
                return judged(refused)

        version = self._retry(attempt, True, "put")
        return Object(payload, version, nonce, history)

    def _still_possible(self, key: str, mode: PutMode) -> None:
        """Before a conditional write refused for its rate is sent again: read where it stands.

        A throttle on one object means others write it now.  Where the
        precondition no longer holds (a create beside an object, an update of
        a version replaced) the retry can only be refused: raise that refusal
        here (``AlreadyExists`` / ``PreconditionFailed``, judged as the
        store's own would be, own writes included) and spend no write.  On GCS
        a refused write still counts against the object's second, so at three
        runners racing one lease each loser's doomed retries kept the limit
        spent for the winner's next write.  The object may change again after
        this read; the refusal stands for a moment inside the op, as the
        store's would.
        """
        if isinstance(mode, Overwrite):
            return
        current = self._request("get", lambda: self.backend.get(key, FRAME_MAX))
        if isinstance(mode, Create) and current is not None:
            raise AlreadyExists(f"{key}: written by another while this create waited out a throttle")
        if isinstance(mode, Update) and (current is None or current[1] != mode.version):
            raise PreconditionFailed(f"{key}: replaced while this update waited out a throttle")

    def put_fresh(self, key: str, make: Callable[[], bytes], wait_throttles: bool = True) -> Object:
        """Overwrite ``key`` with a payload ``make()`` makes anew for EVERY attempt.

        For a value whose only promise is that it changes and never comes back
        (``job_mark``): one request, no read, no lost compare-and-set round
        however many writers.  A plain retried write could come back: its
        first attempt, held in the network, landing after a newer value, with
        the very bytes a watcher already saw.  With fresh bytes an attempt
        that lands late shows a value nobody has seen: a change, as promised.

        Without ``wait_throttles`` a try refused for its rate is raised at
        once (``Throttled``), not waited out: a writer with other objects that
        serve as well (the mark's shards) moves on to one of them.
        """
        self._may_write()
        made: list[tuple[bytes, str]] = []

        def attempt() -> str | None:
            payload, nonce = make(), new_nonce()
            made.append((payload, nonce))
            try:
                return self._request("put", lambda: self.backend.put(key, frame(nonce, payload), Overwrite()),
                                     is_write=True)
            except Throttled as exc:
                if wait_throttles:
                    raise
                raise _NotWaited(exc) from exc

        try:
            version = self._retry(attempt, True, "put")
        except _NotWaited as refused:
            raise refused.throttle from None
        payload, nonce = made[-1]
        return Object(payload, version, nonce, Overwrite().lineage)

    def delete(self, key: str, version: str | None = None) -> bool:
        """Remove ``key`` (only at ``version`` when given); whether it was there.

        A retry that finds the object gone after a failed first try counts as
        ours: deletion is idempotent.
        """
        self._may_write()
        maybe_landed = [False]

        def attempt() -> bool:
            try:
                self._request("delete", lambda: self.backend.delete(key, version), is_write=True)
                return True
            except Throttled:
                raise  # refused before it was applied
            except Transient:
                maybe_landed[0] = True
                raise
            except NotFound:
                return maybe_landed[0]

        return self._retry(attempt, True, "delete")


def retry_transient(policy: RetryPolicy, fn: Callable[[], T], on_retry: Callable[[], None] | None = None) -> T:
    """``fn()`` again after each ``Transient`` within the policy's attempts and deadline (or what is
    left of the op's, inside ``op_deadline``); the last ``Transient`` is raised as it is.
    ``on_retry()`` is called before each wait that another try follows (the seam counts
    retries by it).

    Waits are jittered and exponential.  A ``Throttled`` try spends none of
    the attempts: a throttle lasts as long as the writer keeps the rate up
    (GCS: a second per write to one object; six quick tries end inside it),
    so throttles are retried until the deadline, after the store's
    ``Retry-After`` when it sent one, else after a wait of their own that
    starts at ``throttle_delay`` and doubles; no wait runs past the deadline.

    The one retry loop over a backend: the seam's and any tool that talks to a
    backend directly (``admin.migrate`` copies framed bytes) retry alike.
    """
    began = _now()
    try:  # the first try, made always: most requests need no other, nor tenacity's machinery
        return fn()
    except Transient as exc:
        first = exc
    import tenacity  # lazily: keeps `contract` free of the import

    deadline = policy.deadline
    op_ends = _op_deadline.get()
    if op_ends is not None:  # inside an op's window: what is left of it
        deadline = min(deadline, op_ends - began)
    # The loop below judges its stop and waits from its own start: the first try's time is spent.
    deadline = max(0.0, deadline - (_now() - began))
    replayed = [False]

    def tried() -> T:
        """The first try's failure once more (it is not sent again), then ``fn`` for real."""
        if not replayed[0]:
            replayed[0] = True
            raise first
        return fn()

    unsure = [0]  # failed tries that were not throttles: these spend the attempts
    throttles = [0]
    backoff = tenacity.wait_random_exponential(multiplier=policy.first_delay, max=policy.max_delay)

    def stop(state: tenacity.RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, Throttled):
            throttles[0] += 1
        else:
            unsure[0] += 1
        return unsure[0] >= policy.attempts or (state.seconds_since_start or 0.0) >= deadline

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        left = max(0.0, deadline - (state.seconds_since_start or 0.0))
        if isinstance(exc, Throttled):
            if exc.retry_after is not None:
                return min(exc.retry_after, left)
            step = min(policy.max_delay, policy.throttle_delay * 2.0 ** min(throttles[0] - 1, 16))
            return min(step / 2 + random.uniform(0, step / 2), left)
        return min(float(backoff(state)), left)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(Transient),
        stop=stop,
        wait=wait,
        reraise=True,
        before_sleep=None if on_retry is None else (lambda _state: on_retry()),
    )
    result: T = retrying(tried)
    return result


def backend_label(backend: object) -> str:
    """The backend's kind in metrics, as it names itself (``label``: gcs, s3, file); a class's name,
    lowercase, for a backend that doesn't (a test's own)."""
    label = getattr(backend, "label", None)
    return label if isinstance(label, str) else type(backend).__name__.lower()


#: The environment variable tests set to kill a driver before its Nth store request.
FAILPOINT = "LNK_STORE_FAILPOINT"


def failpoint() -> None:
    """Die at once, as a machine losing power would: no reply, no cleanup, no flush."""
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def backoff_sleep(attempt: int, base: float = 0.002, cap: float = 0.1) -> None:
    """Jittered sleep between rounds of a compare-and-set loop that lost a race."""
    time.sleep(random.uniform(0, min(cap, base * (2 ** min(attempt, 10)))))

"""The exceptions of the Python API (``cloudstore.open``, ``cloudstore.aio.open``).

A driver answers a failed request with ``{"reply": "error", "error": "<why>"}``
and says, in its words, what the failure means for the caller's data: a
request refused for breaking a rule changed nothing; a store that kept failing
either certainly changed nothing (``nothing was changed``) or may have
(``outcome unknown``).  The API turns each such reply into one exception, of
a class that carries that meaning, so a program can decide by ``except``
clause instead of by reading words.  It does not read them either: in
process the service knows which it is by the type of what failed, and hands
that kind (``ErrorKind``) beside the reply (``protocol.service.Answered``);
the API raises the kind's class (``error_of``).  ``from_reply`` reads the
words, for a caller that holds only a reply from another process:

* ``RefusedError``        the request broke a rule of docs/protocol.md (bad input); nothing changed.
* ``FailedError``         the store failed, refused the request (a 4xx, a throttle that outlasted
                          the deadline) or the op could not finish; certainly nothing changed.
* ``OutcomeUnknownError`` the store failed after a write of the op was sent; it may have landed.
* ``LocationError``       ``open`` got a URL or settings that name no store it can open.
* ``StoreNotFoundError``  the folder or bucket the URL names does not exist (a ``LocationError``).
* ``ArgumentError``       a keyword argument of ``open`` has the wrong type or value.
* ``ClosedError``         the store was closed before the call.

Each class says the mistake, as Python's own do: a refused request and a
wrong URL are the caller's input (``ValueError``s); a store that failed is
the I/O failing (``FailedError`` and ``OutcomeUnknownError`` are
``StoreFailure``s, so ``OSError``s, whose message names the store and the
endpoint it was reached at); a folder or bucket that does not exist is
what ``open("/typo")`` raises for a file (a ``FileNotFoundError``, and a
``LocationError``); a keyword of the wrong type is both a ``TypeError``
and a ``ValueError``, as code catching either expects.

``CloudstoreError`` is the one root: ``except CloudstoreError`` catches every
failure the API raises, and every exception class of this project's own
(the seam, the settings, the request rules, the bridge, the conformance
suite...).  A class that was also something else before keeps that base
where code catches by it (a ``ValueError`` stays one).  This module imports
nothing of the project (``typing`` only) so that any module can.

``message`` and ``op`` are set on every one of them (``op`` only where the
API knows it); ``changed`` says what the failure means for the store:
``False`` certainly nothing was changed, ``None`` nobody can tell
(``outcome_unknown``).  It is exact for the API's own classes and for
``StoreUnavailable``; the bridge's and the driver client's failures after a
request was sent say ``None``; the others keep the default ``False``, being
refusals or failures before anything was asked of a store.

The tree (module names below ``cloudstore``)::

    CloudstoreError
     ├── errors.RefusedError (ValueError)                a request broke a rule of docs/protocol.md
     ├── errors.StoreFailure (OSError)                   the store failed (its URL and endpoint named)
     │    ├── errors.FailedError                         the store failed; nothing was changed
     │    └── errors.OutcomeUnknownError                 the store failed; a write may have landed
     ├── errors.LocationError (ValueError)               open() named no store it can open
     │    └── errors.StoreNotFoundError (FileNotFoundError) its folder or bucket does not exist
     ├── errors.ArgumentError (TypeError, ValueError)    a keyword of open() has the wrong type or value
     ├── errors.ClosedError                              the store was closed before the call
     ├── store.model.RequestError                        a request breaks a rule (the driver's check;
     │                                                   re-exported by protocol.validate)
     ├── runtime.strict_json.StrictJSONError (ValueError) a line or file is not strict JSON
     ├── errors.SettingError                             a driver setting is missing or malformed
     ├── runtime.config_schema.ConfigFileError (ValueError) a config file cannot be used
     │    └── runtime.config_schema.SchemaError          a value breaks the schema
     ├── generations.StoreError                          the seam's errors
     │    ├── generations.AlreadyExists                  Create() found an object
     │    ├── generations.PreconditionFailed             Update(version) found another version
     │    ├── generations.NotFound                       no object at the key
     │    ├── generations.Transient                      worth retrying (never leaves RetryingStore)
     │    │    └── generations.Throttled                 refused for the rate (429, SlowDown): retried to the deadline
     │    └── generations.StoreUnavailable               retries spent, or a write's fate unknown
     │         └── generations.StoreRefused              a 4xx refusal (400, 403, 413...): nothing was changed
     ├── store.space.Contention                          a compare-and-set lost every round
     ├── protocol.client.DriverError                     a driver program did not answer one reply line
     ├── conformance.racing.RaceError                    racers failed to get ready or to call
     ├── bridge.proof.KeyFileError                       an agent's key file is unsafe or malformed
     ├── bridge.listener.SocketInUse                     something else holds the bridge's socket path
     ├── bridge.limits.Busy                              a limit of the bridge is reached
     ├── bridge.workers.PoolBusy                         no bridge thread can take the call
     ├── bridge.rules.Refused                            the call may not reach the driver
     ├── bridge.lines.LineTimeout                        no whole line before the deadline
     ├── bridge.lines.LineTooLong                        a line past its bound
     ├── bridge.lines.LineClosed                         the peer closed before a line
     ├── bridge.lines.LineOverBudget                     the line would take the bridge past its budget
     ├── bridge.drivers.DriverTimeout                    the driver took past the call's time
     ├── bridge.drivers.DriverFailed                     the driver died or answered no reply line
     ├── bridge.drivers.NoDriverFree                     every driver place stayed taken
     ├── bridge.client.BridgeError                       the bridge closed without a reply line
     └── conformance.expect.CheckFailed (AssertionError) a check saw what the contract forbids

Not yet under it (modules another change owns): the scheduler's
``StoreError`` and ``ConfigError`` (``scheduling.store_client`` and
``scheduling.config``, formerly ``scheduler_store`` and ``scheduler_config``),
``admin.walk.OpError`` and ``admin.migrate.Refused``.
"""

from __future__ import annotations

import errno
from typing import Literal

#: What an error reply means for the caller's data, known in process by the type of what failed
#: (``protocol.service.Answered``): ``refused`` the request broke a rule, nothing ran; ``failed`` the store
#: failed or refused, certainly nothing was changed; ``unknown`` a write of the op may have landed.
ErrorKind = Literal["refused", "failed", "unknown"]

#: The words a driver's error reply carries when a write of the op may have landed (service.py ``_outcome``).
OUTCOME_UNKNOWN_WORDS = "outcome unknown"
#: The words it carries when the store failed and certainly nothing was changed.
UNCHANGED_WORDS = "nothing was changed"


class CloudstoreError(Exception):
    """Root of every error the Python API raises, and of the project's other exception classes.

    ``message`` is the error's text: for an error reply, the driver's own
    text byte for byte as the wire reply carries it; ``op`` the request's op
    when there was one.
    ``changed`` says what the failure means for the store: ``False`` when
    certainly nothing was changed, ``None`` when nobody can tell.
    """

    changed: bool | None = False

    def __init__(self, message: str, op: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.op = op

    @property
    def outcome_unknown(self) -> bool:
        """Whether the op may have changed the store (the reply said ``outcome unknown``)."""
        return self.changed is None


class RefusedError(CloudstoreError, ValueError):
    """The request breaks a rule of the contract (a bad name, path, number, size...); nothing changed.

    Also a ``ValueError``: it is the caller's input that is wrong, and asking
    again with the same input gets the same answer.
    """


class StoreFailure(CloudstoreError, OSError):
    """The store failed to answer: an ``OSError``, as any I/O that failed, naming where it failed.

    ``message`` stays the driver's words byte for byte; ``store`` is the
    store's URL (bucket and prefix, or folder: never a credential) and
    ``endpoint`` the address its SDK reached it at (None for a folder, or
    when unknown), both in ``str(exc)``: the words alone do not say which of
    a program's stores, or which of its endpoints, failed.
    """

    def __init__(self, message: str, op: str | None = None, store: str | None = None,
                 endpoint: str | None = None) -> None:
        super().__init__(message, op)
        self.store = store
        self.endpoint = endpoint

    def __str__(self) -> str:
        where = [f"store {self.store}"] if self.store else []
        where += [f"endpoint {self.endpoint}"] if self.endpoint else []
        return f"{self.message} ({', '.join(where)})" if where else self.message


class FailedError(StoreFailure):
    """The store kept failing, or the op could not finish; certainly nothing was changed.

    Safe to ask again.
    """


class OutcomeUnknownError(StoreFailure):
    """The store failed after a write of the op was sent: the change may or may not have been made.

    Never retry blindly when that matters: read first (``last``, ``file_read``,
    ``job_get``...) to learn what the store holds.
    """

    changed: bool | None = None


class LocationError(CloudstoreError, ValueError):
    """``open`` was given a URL or settings that name no store it can open (the message says why)."""


class StoreNotFoundError(LocationError, FileNotFoundError):
    """The folder or bucket the URL names does not exist; the message names the URL (never a credential).

    Raised by ``open`` for a folder (none is made unless ``create=True``:
    a typo must not make an empty store that answers every read with
    nothing, the drivers' rule), and by the first call that meets a bucket
    the store says does not exist (buckets are never made).  A
    ``FileNotFoundError`` (``errno`` ENOENT) as the built-in ``open`` raises
    for a missing file, and a ``LocationError``: the URL is what to correct.
    """

    def __init__(self, message: str, op: str | None = None) -> None:
        super().__init__(message, op)
        self.errno = errno.ENOENT


class ArgumentError(CloudstoreError, TypeError, ValueError):
    """A keyword argument of ``open`` has the wrong type or value; the message names the keyword and the rule.

    Both a ``TypeError`` and a ``ValueError``: Python raises either for a bad
    argument, and code catching either should catch this one.
    """


class ClosedError(CloudstoreError):
    """The store was closed before this call was made; nothing was sent."""


class SettingError(CloudstoreError):
    """A driver's setting is missing or malformed; the message names it (never its value).

    Here, not in ``settings``, because a backend raises it too (``s3.S3Backend`` finding no
    credentials) and ``settings`` imports the backends: kept there it made a cycle."""


#: The API's exception class of each kind.
KIND_ERRORS: dict[ErrorKind, type[CloudstoreError]] = {
    "refused": RefusedError, "failed": FailedError, "unknown": OutcomeUnknownError,
}


def error_of(kind: ErrorKind, op: str | None, message: str, store: str | None = None,
             endpoint: str | None = None) -> CloudstoreError:
    """The exception for an error reply whose kind the service gave beside it: by type, never by its words.

    ``message`` is the reply's error text, byte for byte.  This is what the
    Python API raises (``api.Engine.answer``, for both flavours); a store
    failure names ``store`` and ``endpoint`` when given (``StoreFailure``).
    """
    cls = KIND_ERRORS[kind]
    if issubclass(cls, StoreFailure):
        return cls(message, op, store, endpoint)
    return cls(message, op)


def from_reply(op: str | None, message: str) -> CloudstoreError:
    """The exception for an error reply read off the wire, judged by the words the driver puts in it.

    Only for a caller that holds a reply and nothing else (one from a driver
    program, through the bridge); in process, use the kind the service gave
    (``error_of``).  service.py's ``Service.answer`` ends the message of
    every failure that is not a refusal with what it means for the store:
    ``outcome unknown`` (a write may have landed) or ``nothing was changed``.
    A message with neither is a refused request (``RequestError``): nothing
    ran.  Words are all a wire reply carries, so a refusal whose text ends
    with those words too (conversations.py's read of more than
    ``READ_SPAN_MAX`` events) is judged a failure here; ``error_of`` knows
    it for the refusal it is.
    """
    if OUTCOME_UNKNOWN_WORDS in message:
        return OutcomeUnknownError(message, op)
    if message.endswith(UNCHANGED_WORDS) and not message.startswith("the number "):
        # validate.py's one refusal ending with these words is "the number ... is too large
        # for a double; nothing was changed" (a request the API cannot send: floats go through
        # json.dumps, which writes no number past a double).
        return FailedError(message, op)
    return RefusedError(message, op)

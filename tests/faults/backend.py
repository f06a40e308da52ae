"""A backend wrapper that makes a cloud's failures happen on purpose, deterministically.

``FaultyBackend`` sits between a ``RetryingStore`` and a real backend (local
folder, moto, fake-gcs-server).  Before each request it asks a *plan* what to
do with it; the plan is a plain function of the request, so a test scripts
exactly which request fails and how, and a seeded plan replays from its seed.

What a plan can make happen (``Fault``):

* ``NONE``        - the request goes through.
* ``FAIL_BEFORE`` - a timeout / 503 / reset before the store saw it: raises
  ``Transient``, nothing applied.
* ``LOSE_REPLY``  - the store applies the request, then the reply is lost:
  raises ``Transient`` after applying (the write landed, the client can't know).
* ``THROTTLE``    - the store refuses the request for its rate (GCS 429
  ``rateLimitExceeded``, S3 503 ``SlowDown``): raises ``Throttled``, nothing
  applied.
* ``LAND_LATE``   - a write is held, the client gets ``Transient`` now, and the
  write lands later, when the test calls ``Limbo.land`` (after the client has
  retried, given up, or another machine has written).

Several machines share one real backend; each has its own ``FaultyBackend``
(with its own ``name``) and they share one ``Limbo`` of held writes.  A plan may
also run code of its own before a request (``Plan.before`` returning a fault
after doing something, e.g. another machine's whole op): that is how a test
orders two machines' requests step by step.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cloudstore.generations import Backend, Listed, Overwrite, PutMode, Throttled, Transient, backend_label


class Fault(enum.Enum):
    NONE = "none"
    FAIL_BEFORE = "fail_before"
    LOSE_REPLY = "lose_reply"
    LAND_LATE = "land_late"
    THROTTLE = "throttle"
    #: The write reaches the store without its precondition (a server or a proxy that ignores it, as the
    #: fault proxy's ``strip``): a conditional put is applied as an overwrite, a conditional delete as a delete.
    STRIP = "strip"


@dataclass(frozen=True)
class Call:
    """One request a machine is about to make."""

    machine: str
    op: str  # "get", "put", "delete", "list", "list_dirs"
    key: str  # the key, or the prefix of a listing
    mode: PutMode | None = None  # put only
    version: str | None = None  # delete only
    number: int = 0  # this machine's request count, from 1

    @property
    def is_write(self) -> bool:
        return self.op in ("put", "delete")


Plan = Callable[[Call], Fault]


def no_faults(call: Call) -> Fault:
    return Fault.NONE


@dataclass
class Held:
    """A write that has not landed yet."""

    call: Call
    apply: Callable[[], Any]
    outcome: str | None = None  # after landing: "landed" or the error's class name


@dataclass
class Limbo:
    """Writes held back by ``LAND_LATE``, shared by every machine on one store."""

    held: list[Held] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, held: Held) -> None:
        with self.lock:
            self.held.append(held)

    def land(self, index: int = 0) -> Held:
        """Apply the ``index``-th held write now (its precondition judged now)."""
        with self.lock:
            held = self.held.pop(index)
        try:
            held.apply()
            held.outcome = "landed"
        except Exception as exc:  # noqa: BLE001 - a late write may well fail its precondition
            held.outcome = type(exc).__name__
        return held

    def land_all(self) -> list[Held]:
        out = []
        while self.held:
            out.append(self.land(0))
        return out


class FaultyBackend:
    """One machine's view of a shared backend, with the plan's faults injected."""

    def __init__(self, inner: Backend, name: str = "m", plan: Plan = no_faults,
                 limbo: Limbo | None = None) -> None:
        self.inner = inner
        self.name = name
        self.plan = plan
        self.limbo = limbo if limbo is not None else Limbo()
        self.calls: list[Call] = []  # every request asked for, in order
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        """The kind of what it wraps, in metrics: faults don't change which backend is counted."""
        return backend_label(self.inner)

    def _call(self, op: str, key: str, run: Callable[[], Any], stripped: Callable[[], Any] | None = None,
              **extra: Any) -> Any:
        with self._lock:
            call = Call(self.name, op, key, number=len(self.calls) + 1, **extra)
            self.calls.append(call)
        fault = self.plan(call)
        if fault is Fault.NONE:
            return run()
        if fault is Fault.FAIL_BEFORE:
            raise Transient(f"injected: {op} {key} failed before the store saw it")
        if fault is Fault.THROTTLE:
            raise Throttled(f"injected: {op} {key} refused for the rate")
        if fault is Fault.LOSE_REPLY:
            try:
                run()
            except Exception:  # noqa: BLE001 - the reply, whatever it was, is lost
                pass
            raise Transient(f"injected: {op} {key} applied, reply lost")
        if fault is Fault.LAND_LATE:
            if not call.is_write:
                raise Transient(f"injected: {op} {key} timed out")
            self.limbo.add(Held(call, run))
            raise Transient(f"injected: {op} {key} timed out (the write will land later)")
        if fault is Fault.STRIP:
            return stripped() if stripped is not None and call.is_write else run()
        raise AssertionError(fault)

    @property
    def clock(self) -> Any:
        """The real backend's clock (the store's time is not something a fault changes)."""
        return getattr(self.inner, "clock", None)

    # -- the Backend interface

    def get(self, key: str, *args: Any, **kwargs: Any) -> tuple[bytes, str] | None:
        return self._call("get", key, lambda: self.inner.get(key, *args, **kwargs))

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        return self._call("put", key, lambda: self.inner.put(key, raw, mode),
                          lambda: self.inner.put(key, raw, Overwrite()), mode=mode)

    def delete(self, key: str, version: str | None) -> None:
        return self._call("delete", key, lambda: self.inner.delete(key, version),
                          lambda: self.inner.delete(key, None), version=version)

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        return iter(self._call("list", prefix, lambda: list(self.inner.list(prefix, start_after, limit))))

    def list_dirs(self, prefix: str) -> list[str]:
        return self._call("list_dirs", prefix, lambda: self.inner.list_dirs(prefix))


def scripted(*rules: tuple[Callable[[Call], bool], Fault | Callable[[Call], Fault]]) -> Plan:
    """A plan from rules ``(matches, fault)``, each firing once, in order of matching.

    ``fault`` may be a function of the call (to run another machine's op first,
    then answer a fault): that is how a test puts a second machine in between.
    """
    pending = list(rules)
    lock = threading.Lock()

    def plan(call: Call) -> Fault:
        with lock:
            hits = [i for i, (matches, _) in enumerate(pending) if matches(call)]  # every matcher counts
            if not hits:
                return Fault.NONE
            _, fault = pending.pop(hits[0])
        return fault(call) if callable(fault) else fault

    return plan


def when(op: str, key_has: str = "", nth: int = 1, mode: type | None = None) -> Callable[[Call], bool]:
    """A matcher: the ``nth`` request of kind ``op`` whose key contains ``key_has`` (and put mode)."""
    seen = [0]

    def matches(call: Call) -> bool:
        if call.op != op or key_has not in call.key:
            return False
        if mode is not None and not isinstance(call.mode, mode):
            return False
        seen[0] += 1
        return seen[0] == nth

    return matches

"""The counters of this process: what a driver, the seam and the exporters count, and nothing else.

This package's root is the one part of the metrics every process imports,
the drivers and the seam (``cloudstore/generations.py``) on every request,
so it stays small and cheap: a dict under a lock, the standard library only
(``lnk-gcs contract`` answers in about 0.1 s, importing no SDK), and never
``prometheus_client``, whose registry and multiprocess files are not what a
driver needs (``snapshots`` says why).

* **The registry** (``counter``, ``Counter.inc``): process-wide, thread-safe,
  keyed by metric name and label values.  ``inc`` is a dict update under a
  lock, cheap enough for every backend request.
* **The store counters** (``REQUESTS``, ``RETRIES``, ``THROTTLED``,
  ``OUTCOME_UNKNOWN``, ``CAS_LOST``, ``REPLIES``): what the drivers count,
  named and labelled once here.
* **The op being answered** is kept in a context variable (``op_scope``),
  so the seam counts requests by op without being told; a request made
  outside any op counts as op "".

Its other modules each do one job, and only the processes that need them
import them: ``snapshots`` carries a driver's counters to the exporter that
started it, ``exposition`` writes (and, for tests and tools, reads) the
Prometheus text format, and ``http`` serves it on ``GET /metrics`` with
bounded cost.

Every counter is a ``*_total`` counter: Prometheus handles the reset when the
exporter restarts (it starts a new folder).
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import threading
from collections.abc import Iterator

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs, in the family's label order
Samples = dict[Labels, float]


class Family:
    """One metric's name, help text and samples (what the exporter merges and renders)."""

    __slots__ = ("name", "help", "samples", "kind")

    def __init__(self, name: str, help: str, samples: Samples | None = None, kind: str = "counter") -> None:
        self.name = name
        self.help = help
        self.samples: Samples = samples if samples is not None else {}
        self.kind = kind  # "counter", or "gauge" for a state (the scheduler's store_unreachable)

    def add(self, labels: Labels, value: float) -> None:
        self.samples[labels] = self.samples.get(labels, 0) + value


class Registry:
    """The counters of one process.  ``generation`` grows with every change (snapshots skip when unchanged)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.generation = 0
        self.counters: dict[str, Counter] = {}

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        """The counter ``name``, made on first use; the same labels every time."""
        with self.lock:
            found = self.counters.get(name)
            if found is None:
                found = self.counters[name] = Counter(self, name, help, labels)
            elif found.labels != labels:
                raise ValueError(f"metric {name} has labels {found.labels}, not {labels}")
            return found

    def families(self) -> dict[str, Family]:
        """A copy of every counter, as families."""
        with self.lock:
            return {
                name: Family(name, c.help, {tuple(zip(c.labels, vals, strict=True)): n for vals, n in c.values.items()})
                for name, c in self.counters.items()
            }


class Counter:
    """A monotonic counter with fixed label names; ``inc(*label_values)``."""

    __slots__ = ("registry", "name", "help", "labels", "values")

    def __init__(self, registry: Registry, name: str, help: str, labels: tuple[str, ...]) -> None:
        if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
            raise ValueError(f"not a metric name: {name!r}")
        self.registry = registry
        self.name = name
        self.help = help
        self.labels = labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *label_values: str, by: float = 1) -> None:
        """Add ``by`` (at least 0) to the sample of these label values, in the order of ``labels``.

        Label values must come from a bounded set (op names checked against
        the table of ops, never a caller's raw string): each one is kept for
        the life of the process.
        """
        if len(label_values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}")
        registry = self.registry
        with registry.lock:
            self.values[label_values] = self.values.get(label_values, 0) + by
            registry.generation += 1

    def value(self, *label_values: str) -> float:
        """The current count (0 when never counted): for tests and logs."""
        with self.registry.lock:
            return self.values.get(label_values, 0)


REGISTRY = Registry()


def counter(name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
    """A counter of this process's registry."""
    return REGISTRY.counter(name, help, labels)


# --------------------------------------------------------------------------
# What the store drivers count (backend: gcs, s3 or file; op: the wire op being answered)

REQUESTS = counter(
    "lnk_store_requests_total",
    "Backend (bucket or folder) requests made, by the wire op being answered (op \"\" outside any op).",
    ("backend", "op"),
)
RETRIES = counter(
    "lnk_store_retries_total",
    "Backend requests tried again after a transient failure (timeout, 429, 5xx, reset).",
    ("backend", "op"),
)
THROTTLED = counter(
    "lnk_store_throttled_total",
    "Backend requests the store refused for its rate (GCS 429 rateLimitExceeded, S3 503 SlowDown), "
    "each retried until the op's deadline; nothing was applied.",
    ("backend", "op"),
)
OUTCOME_UNKNOWN = counter(
    "lnk_store_outcome_unknown_total",
    "Error replies saying outcome unknown: a write of the op may or may not have landed.",
    ("backend", "op"),
)
CAS_LOST = counter(
    "lnk_store_cas_lost_total",
    "Conditional writes of a compare-and-set loop that lost their round to another write (read again, retried).",
    ("backend", "op"),
)
REPLIES = counter(
    "lnk_store_replies_total",
    "Replies answered, by reply kind (error included); backend \"\" when no store could be opened.",
    ("backend", "op", "reply"),
)

_op: contextvars.ContextVar[str] = contextvars.ContextVar("lnk_metrics_op", default="")


def current_op() -> str:
    """The wire op this thread (or task) is answering, "" outside any."""
    return _op.get()


@contextlib.contextmanager
def op_scope(op: str) -> Iterator[None]:
    """Count what happens inside as done for ``op`` (a name from the table of ops, never raw input)."""
    token = _op.set(op)
    try:
        yield
    finally:
        _op.reset(token)

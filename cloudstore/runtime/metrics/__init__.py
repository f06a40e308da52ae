"""The counters and histograms of this process: what a driver, the seam and the exporters count, nothing else.

This package's root is the one part of the metrics every process imports,
the drivers and the seam (``cloudstore/generations.py``) on every request,
so it stays small and cheap: a dict under a lock, the standard library only
(``lnk-gcs contract`` answers in about 0.1 s, importing no SDK), and never
``prometheus_client``, whose registry and multiprocess files are not what a
driver needs (``snapshots`` says why).

* **The registry** (``counter``, ``Counter.inc``; ``histogram``,
  ``Histogram.observe``): process-wide, thread-safe, keyed by metric name
  and label values.  ``inc`` and ``observe`` are a dict update under a
  lock, cheap enough for every backend request.
* **The store counters** (``REQUESTS``, ``RETRIES``, ``THROTTLED``,
  ``OUTCOME_UNKNOWN``, ``CAS_LOST``, ``REPLIES``) and **latencies**
  (``REQUEST_SECONDS``, ``OP_SECONDS``): what the drivers count and time,
  named and labelled once here.
* **The op being answered** is kept in a context variable (``op_scope``),
  so the seam counts requests by op without being told; a request made
  outside any op counts as op "".  The service's scope, naming its
  backend, also times the op (``OP_SECONDS``).

Its other modules each do one job, and only the processes that need them
import them: ``snapshots`` carries a driver's counters to the exporter that
started it, ``exposition`` writes (and, for tests and tools, reads) the
Prometheus text format, ``http`` serves it on ``GET /metrics`` with
bounded cost, and ``process`` adds what an exporting process says of
itself (``process_*``, ``lnk_build_info``): the one module that imports
``prometheus_client``, in the bridge and the scheduler only.

Every counter is a ``*_total`` counter, and a histogram's buckets, sum and
count are counters too: Prometheus handles the reset when the exporter
restarts (it starts a new folder).  Times are taken with
``time.perf_counter``, never the wall clock.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Literal, get_args

Labels = tuple[tuple[str, str], ...]  # (name, value) pairs, in the family's label order
Samples = dict[Labels, float]

#: The latency histograms' bucket bounds, in seconds (+Inf after them): a folder store answers a
#: request in well under a millisecond, a bucket in tens to hundreds of milliseconds, a busy one
#: in seconds; the seam stops retrying an op's requests at 20 s (``RetryPolicy.deadline``).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


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


class Observed:
    """One label set's observations of a histogram: how many fell in each bucket, and their sum.

    ``counts[i]`` is the number of values at most ``bounds[i]`` and above the
    bound before (not cumulative); the last is those above every bound (+Inf).
    """

    __slots__ = ("counts", "sum")

    def __init__(self, counts: list[int], sum: float = 0.0) -> None:
        self.counts = counts
        self.sum = sum

    @property
    def count(self) -> int:
        return sum(self.counts)

    def copy(self) -> Observed:
        return Observed(list(self.counts), self.sum)


class HistogramFamily:
    """One histogram's name, help text, bucket bounds and series (what the exporter merges and renders)."""

    __slots__ = ("name", "help", "bounds", "series")
    kind = "histogram"

    def __init__(self, name: str, help: str, bounds: tuple[float, ...],
                 series: dict[Labels, Observed] | None = None) -> None:
        self.name = name
        self.help = help
        self.bounds = bounds  # the buckets' upper bounds, increasing; +Inf is implied after them
        self.series: dict[Labels, Observed] = series if series is not None else {}

    def add(self, labels: Labels, observed: Observed) -> None:
        """Add ``observed`` (of the same bounds) to the series of ``labels``."""
        mine = self.series.get(labels)
        if mine is None:
            self.series[labels] = observed.copy()
            return
        mine.counts = [a + b for a, b in zip(mine.counts, observed.counts, strict=True)]
        mine.sum += observed.sum


#: What a registry, a snapshot or an exporter's extra families hold: counters and gauges, or histograms.
AnyFamily = Family | HistogramFamily


class Registry:
    """The counters and histograms of one process.

    ``generation`` grows with every change (snapshots skip when unchanged).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.generation = 0
        self.counters: dict[str, Counter] = {}
        self.histograms: dict[str, Histogram] = {}

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        """The counter ``name``, made on first use; the same labels every time."""
        with self.lock:
            found = self.counters.get(name)
            if found is None:
                if name in self.histograms:
                    raise ValueError(f"metric {name} is a histogram")
                found = self.counters[name] = Counter(self, name, help, labels)
            elif found.labels != labels:
                raise ValueError(f"metric {name} has labels {found.labels}, not {labels}")
            return found

    def histogram(self, name: str, help: str, labels: tuple[str, ...] = (),
                  bounds: tuple[float, ...] = ()) -> Histogram:
        """The histogram ``name``, made on first use; the same labels and bounds every time."""
        with self.lock:
            found = self.histograms.get(name)
            if found is None:
                if name in self.counters:
                    raise ValueError(f"metric {name} is a counter")
                found = self.histograms[name] = Histogram(self, name, help, labels, bounds)
            elif (found.labels, found.bounds) != (labels, bounds):
                raise ValueError(f"metric {name} has labels {found.labels} and bounds {found.bounds}")
            return found

    def families(self) -> dict[str, AnyFamily]:
        """A copy of every counter and histogram, as families."""
        with self.lock:
            out: dict[str, AnyFamily] = {
                name: Family(name, c.help, {tuple(zip(c.labels, vals, strict=True)): n for vals, n in c.values.items()})
                for name, c in self.counters.items()
            }
            for name, h in self.histograms.items():
                out[name] = HistogramFamily(name, h.help, h.bounds, {
                    tuple(zip(h.labels, vals, strict=True)): seen.copy() for vals, seen in h.values.items()})
            return out


class Counter:
    """A monotonic counter with fixed label names; ``inc(*label_values)``."""

    __slots__ = ("registry", "name", "help", "labels", "values")

    def __init__(self, registry: Registry, name: str, help: str, labels: tuple[str, ...]) -> None:
        if not _METRIC_NAME.fullmatch(name):
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


class Histogram:
    """Observed values (seconds) in fixed buckets, with fixed label names; ``observe(value, *label_values)``.

    Rendered as Prometheus renders a histogram: a cumulative ``_bucket``
    sample per bound (``le``) and +Inf, ``_sum`` and ``_count``.
    """

    __slots__ = ("registry", "name", "help", "labels", "bounds", "values")

    def __init__(self, registry: Registry, name: str, help: str, labels: tuple[str, ...],
                 bounds: tuple[float, ...]) -> None:
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"not a metric name: {name!r}")
        if "le" in labels:
            raise ValueError("a histogram's label cannot be le (its buckets' own)")
        if not bounds or any(not math.isfinite(b) for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"a histogram's bounds must be finite and increasing, not {bounds}")
        self.registry = registry
        self.name = name
        self.help = help
        self.labels = labels
        self.bounds = bounds
        self.values: dict[tuple[str, ...], Observed] = {}

    def observe(self, value: float, *label_values: str) -> None:
        """Count ``value`` in its bucket (the first bound at least ``value``, else +Inf) and add it to the sum.

        Label values come from a bounded set, as ``Counter.inc``'s do.
        """
        if len(label_values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}")
        bucket = bisect_left(self.bounds, value)
        registry = self.registry
        with registry.lock:
            seen = self.values.get(label_values)
            if seen is None:
                seen = self.values[label_values] = Observed([0] * (len(self.bounds) + 1))
            seen.counts[bucket] += 1
            seen.sum += value
            registry.generation += 1

    @contextlib.contextmanager
    def time(self, *label_values: str) -> Iterator[None]:
        """Observe the seconds spent inside (``time.perf_counter``), whether it returns or raises."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - start, *label_values)

    def value(self, *label_values: str) -> Observed:
        """A copy of the observations so far (none when never observed): for tests and logs."""
        with self.registry.lock:
            seen = self.values.get(label_values)
            return seen.copy() if seen is not None else Observed([0] * (len(self.bounds) + 1))


REGISTRY = Registry()


def counter(name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
    """A counter of this process's registry."""
    return REGISTRY.counter(name, help, labels)


def histogram(name: str, help: str, labels: tuple[str, ...] = (),
              bounds: tuple[float, ...] = ()) -> Histogram:
    """A histogram of this process's registry (``bounds``: ``LATENCY_BUCKETS`` when not given)."""
    return REGISTRY.histogram(name, help, labels, bounds or LATENCY_BUCKETS)



# --------------------------------------------------------------------------
# What the store drivers count (backend: gcs, s3 or file; op: the wire op being answered)

#: The prefix of every family below: what each exporter sums of the drivers it starts, beside its own
#: (``snapshots.Collector.own``; the bridge's are ``lnk_bridge_``, the scheduler's ``lnk_scheduler_``).
STORE_FAMILIES = "lnk_store_"

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

#: The kinds of backend request (``REQUEST_SECONDS``'s ``request`` label): a bucket answers each at its own
#: pace (a listing of a page of keys takes longer than a get of one), so one histogram of them all would show
#: neither's time; a fixed set, which the type checker holds the seam to, so the label stays bounded.
RequestKind = Literal["get", "put", "delete", "list"]
REQUEST_KINDS: tuple[RequestKind, ...] = get_args(RequestKind)

REQUEST_SECONDS = histogram(
    "lnk_store_request_duration_seconds",
    "Seconds each backend (bucket or folder) request took, from sent to answered or failed, by the wire op "
    "being answered (op \"\" outside any op) and the request's kind (get, put, delete, list): one observation "
    "per request lnk_store_requests_total counts.",
    ("backend", "op", "request"),
)
OP_SECONDS = histogram(
    "lnk_store_op_duration_seconds",
    "Seconds each op took to answer, its retries included and the work a driver leaves for after its reply "
    "left out: one observation per reply lnk_store_replies_total counts with a backend.",
    ("backend", "op"),
)


_op: contextvars.ContextVar[str] = contextvars.ContextVar("lnk_metrics_op", default="")


def current_op() -> str:
    """The wire op this thread (or task) is answering, "" outside any."""
    return _op.get()


@contextlib.contextmanager
def op_scope(op: str, backend: str | None = None) -> Iterator[None]:
    """Count what happens inside as done for ``op`` (a name from the table of ops, never raw input).

    With ``backend`` (the label of the store answering), the time inside is
    also observed in ``OP_SECONDS`` under ``backend`` and ``op``:
    ``Service.answered`` opens one such scope for each op it answers, so every
    op is timed once, under the backend and op its reply is counted under
    (``REPLIES``).  Without it nothing is timed: the work a driver leaves for
    after its reply (packing) runs in its op's scope, so that its requests
    count for that op, but is no second op.
    """
    token = _op.set(op)
    try:
        with OP_SECONDS.time(backend, op) if backend is not None else contextlib.nullcontext():
            yield
    finally:
        _op.reset(token)

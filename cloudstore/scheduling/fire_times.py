"""The scheduler's latency histograms: how late each fire started, and how long its command ran.

The ``fired`` line of the log says both (``lateness_ms``, ``duration_ms``),
but a log is not what a dashboard or an alert reads: these histograms
export the same two figures (in seconds, as Prometheus names times), one
observation per ``fired`` line, so that "99 % of jobs start within 2 s of
their due" is a query, not a log search.

Their buckets (``BUCKETS``) reach further than the drivers' latencies: a
fire is late by a poll interval (2 s by default) when no wake-up came, by a
lapse (30 s) when a dead runner's job is recovered, by minutes in a
backlog; a command runs up to its ``fire_timeout`` (300 s by default, a
week at most).  Past an hour is +Inf.

Lateness is labelled by ``recovered`` ("true" or "false"): a recovered fire
is late by the lapse by design, and mixed with the others it would hide
how late the ordinary ones start.  Bounded: two series, each of fixed
buckets.
"""

from __future__ import annotations

from ..runtime.metrics import histogram

#: Seconds, 10 ms to an hour (+Inf after): see the module docstring.
BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

LATENESS = histogram(
    "lnk_scheduler_fire_lateness_seconds",
    "Seconds from a job's due to the start of its command, one observation per fired event (its lateness_ms), "
    "by whether it was recovered from a dead runner; a start before the due counts as 0.",
    ("recovered",), BUCKETS,
)
DURATION = histogram(
    "lnk_scheduler_fire_duration_seconds",
    "Seconds each fired command ran, from its start until it was reaped, one observation per fired event "
    "(its duration_ms).",
    (), BUCKETS,
)


def observe(lateness: float, duration: float, recovered: bool) -> None:
    """Count one fire: ``lateness`` and ``duration`` in seconds, as its ``fired`` line says them.

    A fire may start up to ``claiming.EARLY`` before its due, and the clocks
    may step: such a start counts as 0 late, so that the ``_sum`` of the
    lateness only ever grows, as a histogram's sum is expected to.
    """
    LATENESS.observe(max(0.0, lateness), "true" if recovered else "false")
    DURATION.observe(max(0.0, duration))

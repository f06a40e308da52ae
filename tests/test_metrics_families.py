"""Each program exports its own families, and every histogram is one a Prometheus user can trust (issue 46, item 4).

On c81d270 the scheduler exported ``lnk_bridge_calls_total`` (HELP and
TYPE, no sample: it imports the bridge's client, and with it the bridge's
counter), counted its ``started`` line as an event, exported neither the
lateness nor the duration of its fires (its log said both), and
``lnk_build_info`` did not say which program exports.

The exports are read by ``strict``, a parser written here to the text
format 0.0.4 as a scraper reads it, stricter than this package's own
``parse`` (which only reads the samples back): each family is declared
once, by ``# HELP`` then ``# TYPE``, its samples follow it and only it, no
series twice, label names and escapes as the format allows, and each
histogram series has increasing bounds ending in ``+Inf``, cumulative
counts, a ``_sum`` and a ``_count`` equal to its ``+Inf`` bucket.  The
histograms' counts are then checked against what was counted apart: the
replies and requests the drivers counted, the calls the test made, the
``fired`` lines of the scheduler's log.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_metrics import _bridge, _stop, scheduler_firing, short_dir  # noqa: F401  (short_dir: a fixture)

import cloudstore.bridge.server  # noqa: F401  (the bridge's families register on import, as in a scheduler)
from cloudstore.bridge import BridgeClient
from cloudstore.protocol.service import OPS
from cloudstore.runtime import metrics
from cloudstore.runtime.metrics.exposition import render
from cloudstore.runtime.metrics.snapshots import Collector, SnapshotWriter
from cloudstore.scheduling import log as scheduler_log

# --------------------------------------------------------------------------
# A strict reader of the text format 0.0.4

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_KINDS = ("counter", "gauge", "histogram", "summary", "untyped")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


@dataclass
class Fam:
    """One family as declared, and its samples: (sample name, labels) -> value."""

    name: str
    kind: str
    help: str
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """The one sample called ``name`` with exactly these labels."""
        return self.samples[(name, tuple(sorted(labels.items())))]

    def series(self) -> dict[tuple[tuple[str, str], ...], dict[str, Any]]:
        """A histogram's series, by their labels (``le`` apart): bounds, cumulative counts, sum and count."""
        out: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for (name, labels), value in self.samples.items():
            rest = tuple((k, v) for k, v in labels if k != "le")
            one = out.setdefault(rest, {"buckets": [], "sum": None, "count": None})
            if name.endswith("_bucket"):
                le = dict(labels)["le"]
                one["buckets"].append((math.inf if le == "+Inf" else float(le), value))
            else:
                one[name.rsplit("_", 1)[1]] = value
        return out


def _labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    """``a="x",b="y"`` read character by character: the escapes the format has (``\\\\``, ``\\"``, ``\\n``)."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        match = _LABEL_NAME.match(text, i)
        assert match and text[match.end():match.end() + 2] == '="', f"bad label at {i}: {line!r}"
        name, i, value = match.group(), match.end() + 2, []
        while text[i] != '"':
            if text[i] == "\\":
                escaped = {"\\": "\\", '"': '"', "n": "\n"}.get(text[i + 1])
                assert escaped is not None, f"bad escape: {line!r}"
                value.append(escaped)
                i += 2
            else:
                value.append(text[i])
                i += 1
        i += 1
        assert name not in dict(out), f"label {name} twice: {line!r}"
        out.append((name, "".join(value)))
        if i < len(text):
            assert text[i] == ",", f"bad label list: {line!r}"
            i += 1
    return tuple(sorted(out))


def strict(text: str) -> dict[str, Fam]:
    """Every family of an exposition text, or an AssertionError naming the first thing a scraper would refuse."""
    assert text.endswith("\n"), "the text must end with a newline"
    families: dict[str, Fam] = {}
    current: Fam | None = None
    lines = text.split("\n")[:-1]
    i = 0
    while i < len(lines):
        line = lines[i]
        assert line, "an empty line"
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert _NAME.fullmatch(name), line
            assert name not in families, f"{name} declared twice"
            assert i + 1 < len(lines), f"{name}: HELP with no TYPE"
            kind_line = lines[i + 1].split(" ")
            assert kind_line[:3] == ["#", "TYPE", name] and len(kind_line) == 4, f"{name}: TYPE must follow HELP"
            assert kind_line[3] in _KINDS, lines[i + 1]
            current = families[name] = Fam(name, kind_line[3], help_text)
            i += 2
            continue
        assert not line.startswith("#"), f"a comment that is no HELP/TYPE pair: {line!r}"
        assert current is not None, f"a sample before any family: {line!r}"
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, f"not a sample line: {line!r}"
        name, inner, raw = match.groups()
        allowed = [current.name + s for s in _SUFFIXES.get(current.kind, ("",))]
        assert name in allowed, f"{name} is not of the family above it ({current.name}, {current.kind})"
        value = float(raw)  # ValueError for anything but a float, +Inf, -Inf or NaN
        labels = _labels(inner or "", line)
        assert (name, labels) not in current.samples, f"a series twice: {line!r}"
        if current.kind == "counter" or name.endswith(("_bucket", "_count")):
            assert value >= 0, line
        current.samples[(name, labels)] = value
        i += 1
    for fam in families.values():
        if fam.kind == "histogram":
            check_histogram(fam)
    return families


def check_histogram(fam: Fam) -> None:
    """A histogram series as Prometheus's clients write one (and ``histogram_quantile`` needs)."""
    for labels, one in fam.series().items():
        buckets = one["buckets"]
        bounds = [b for b, _ in buckets]
        counts = [n for _, n in buckets]
        assert bounds and bounds[-1] == math.inf, (fam.name, labels, "no +Inf bucket")
        assert bounds == sorted(set(bounds)), (fam.name, labels, "bounds not increasing")
        assert counts == sorted(counts), (fam.name, labels, "buckets not cumulative")
        assert all(n == int(n) for n in counts), (fam.name, labels)
        assert one["count"] == counts[-1], (fam.name, labels, "_count is not the +Inf bucket")
        assert one["sum"] is not None and one["sum"] >= 0, (fam.name, labels, "no _sum")


def total(fam: Fam, name: str, **labels: str) -> float:
    """The sum of ``fam``'s samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in fam.samples.items() if n == name and want <= set(ls))


def test_the_strict_reader_refuses_what_a_scraper_would() -> None:
    good = render({"h": metrics.HistogramFamily("h", "x", (1.0,), {(("a", 'q"\n\\'),): metrics.Observed([1, 2], 3)})})
    assert strict(good)["h"].value("h_count", a='q"\n\\') == 3
    bad = {
        "no TYPE": "# HELP a x\na 1\n",
        "sample of another family": "# HELP a x\n# TYPE a counter\nb 1\n",
        "declared twice": "# HELP a x\n# TYPE a counter\n# HELP a x\n# TYPE a counter\n",
        "series twice": '# HELP a x\n# TYPE a counter\na{l="1"} 1\na{l="1"} 2\n',
        "no +Inf": '# HELP h x\n# TYPE h histogram\nh_bucket{le="1.0"} 1\nh_sum 1\nh_count 1\n',
        "not cumulative": '# HELP h x\n# TYPE h histogram\nh_bucket{le="1.0"} 2\nh_bucket{le="+Inf"} 1\n'
                          'h_sum 1\nh_count 1\n',
        "count not +Inf": '# HELP h x\n# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 1\n',
        "bad escape": '# HELP a x\n# TYPE a counter\na{l="\\t"} 1\n',
    }
    for why, text in bad.items():
        with pytest.raises(AssertionError):
            strict(text)
            pytest.fail(why)


# --------------------------------------------------------------------------
# In process: what a collector keeps of the registry, what the scheduler counts


def test_a_collector_exports_only_the_families_its_program_owns(tmp_path: Path) -> None:
    registry = metrics.Registry()
    registry.counter("lnk_bridge_calls_total", "a bridge's", ("op",)).inc("append")
    registry.counter("lnk_scheduler_events_total", "a scheduler's", ("event",)).inc("fired")
    registry.histogram("lnk_store_op_duration_seconds", "a driver's", ("op",), (1.0,)).observe(0.5, "append")
    driver = metrics.Registry()  # a driver's snapshot, with a family of another program in it
    driver.counter("lnk_store_requests_total", "requests", ("op",)).inc("append")
    driver.counter("lnk_bridge_stray_total", "not the scheduler's").inc()
    SnapshotWriter(str(tmp_path), "driver", driver).flush()

    scheduler = Collector(str(tmp_path), registry, own=("lnk_scheduler_", metrics.STORE_FAMILIES))
    assert set(strict(scheduler.render())) == {
        "lnk_scheduler_events_total", "lnk_store_op_duration_seconds", "lnk_store_requests_total"}
    bridge = Collector(str(tmp_path), registry, own=("lnk_bridge_", metrics.STORE_FAMILIES))
    assert set(strict(bridge.render())) == {
        "lnk_bridge_calls_total", "lnk_bridge_stray_total", "lnk_store_op_duration_seconds",
        "lnk_store_requests_total"}


def test_the_schedulers_lines_about_itself_are_not_counted_as_events(capsys: pytest.CaptureFixture[str]) -> None:
    before = {name: scheduler_log.EVENTS.value(name) for name in ("started", "stopped", "metrics", "fired")}
    for name in ("started", "metrics", "fired", "stopped"):
        scheduler_log.log(name, runner="r")
    assert capsys.readouterr().err.count('"event":') == 4, "each line is still written"
    after = {name: scheduler_log.EVENTS.value(name) for name in before}
    assert {name: after[name] - before[name] for name in before} == {
        "started": 0, "stopped": 0, "metrics": 0, "fired": 1}


def test_a_fire_is_observed_in_the_lateness_and_duration_histograms() -> None:
    from cloudstore.scheduling import fire_times

    late, ran = fire_times.LATENESS, fire_times.DURATION
    before = (late.value("false").copy(), late.value("true").copy(), ran.value().copy())
    fire_times.observe(1.5, 0.2, recovered=False)
    fire_times.observe(-0.0005, 40.0, recovered=False)  # started a moment before its due: 0 late
    fire_times.observe(31.0, 0.02, recovered=True)
    on_time, recovered, duration = late.value("false"), late.value("true"), ran.value()
    assert on_time.count - before[0].count == 2 and on_time.sum - before[0].sum == pytest.approx(1.5)
    assert recovered.count - before[1].count == 1 and recovered.sum - before[1].sum == pytest.approx(31.0)
    assert duration.count - before[2].count == 3 and duration.sum - before[2].sum == pytest.approx(40.22)
    bounds = fire_times.BUCKETS
    grew = [a - b for a, b in zip(on_time.counts, before[0].counts, strict=True)]
    assert grew[0] == 1 and grew[bounds.index(2.5)] == 1, grew  # 0 in the first bucket, 1.5 in (1, 2.5]


# --------------------------------------------------------------------------
# The programs, run: the bridge's file and the scheduler's


def _process_and_build(found: dict[str, Fam], program: str) -> None:
    build = found["lnk_build_info"]
    assert build.kind == "gauge" and len(build.samples) == 1
    ((_, labels), value), = build.samples.items()
    assert dict(labels)["program"] == program and value == 1, labels
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds"):
        assert name in found, f"{name} missing"
        assert found[name].value(name) >= 0


def test_the_bridge_exports_its_own_families_and_true_histograms(short_dir: Path) -> None:  # noqa: F811
    prom = short_dir / "bridge.prom"
    (short_dir / "bucket").mkdir()
    proc, sock, key = _bridge(short_dir, {"LNK_BUCKET_URL": f"file://{short_dir / 'bucket'}"},
                              "--metrics-file", str(prom))
    calls = {"append": 3, "last": 1, "read": 1, "threads": 1}
    try:
        client = BridgeClient(sock, "o", "a1", key)
        for seq in (1, 2, 3):
            assert client.op("append", thread="t", event={"seq": seq}) == {"reply": "done"}
        assert client.op("last", thread="t") == {"reply": "last", "last": 3}
        assert client.op("read", thread="t", first=1)["reply"] == "events"
        assert client.op("threads")["reply"] == "threads"
        assert client.op("made_up_op")["reply"] == "error"  # a caller's string: never a label
    finally:
        _stop(proc)
    found = strict(prom.read_text())  # written a last time after the drivers ended: their last snapshots are in

    _process_and_build(found, "lnk-store-bridge")
    assert not [name for name in found if name.startswith("lnk_scheduler_")]
    bridge_calls, bridge_seconds = found["lnk_bridge_calls_total"], found["lnk_bridge_call_duration_seconds"]
    assert bridge_seconds.kind == "histogram"
    ops, requests = found["lnk_store_op_duration_seconds"], found["lnk_store_request_duration_seconds"]
    replies, counted = found["lnk_store_replies_total"], found["lnk_store_requests_total"]
    # The bridge asks its store once before it listens (bridge/store_check.py: a driver's ``last``, no call of
    # an agent's): the drivers answered it, the bridge's call families do not count it.
    asked = {**calls, "last": calls["last"] + 1}
    for op, n in calls.items():
        assert total(bridge_calls, "lnk_bridge_calls_total", op=op, outcome="answered") == n, op
        assert total(bridge_seconds, "lnk_bridge_call_duration_seconds_count", op=op) == n, op
        assert total(replies, "lnk_store_replies_total", backend="file", op=op) == asked[op], op
        assert total(ops, "lnk_store_op_duration_seconds_count", backend="file", op=op) == asked[op], op
    for (_, labels), n in counted.samples.items():  # every request counted was timed, under the same op
        assert total(requests, "lnk_store_request_duration_seconds_count", **dict(labels)) == n > 0, labels
    # Bounded label sets: an op from the table (or "", "other"), a request of the four kinds.
    seen = {(k, v) for fam in found.values() if fam.name.startswith("lnk_") for _, ls in fam.samples for k, v in ls}
    assert {v for k, v in seen if k == "op"} <= set(OPS) | {"", "other"}, seen
    assert {v for k, v in seen if k == "request"} == {"get", "put", "list"}, "this walk deletes nothing"


def test_the_scheduler_exports_its_fires_and_no_bridge_family(tmp_path: Path) -> None:
    jobs = 3
    text, log = scheduler_firing(tmp_path, jobs)
    found = strict(text)

    _process_and_build(found, "lnk-cloud-scheduler")
    assert not [name for name in found if name.startswith("lnk_bridge_")], "the scheduler has no bridge"
    events = found["lnk_scheduler_events_total"]
    assert total(events, "lnk_scheduler_events_total", event="fired") == jobs
    for name in ("started", "stopped", "metrics"):
        assert total(events, "lnk_scheduler_events_total", event=name) == 0, name
    fired = scheduler_log.read_events(log, "fired")
    lateness, duration = found["lnk_scheduler_fire_lateness_seconds"], found["lnk_scheduler_fire_duration_seconds"]
    assert lateness.kind == duration.kind == "histogram"
    assert lateness.value("lnk_scheduler_fire_lateness_seconds_count", recovered="false") == jobs
    assert duration.value("lnk_scheduler_fire_duration_seconds_count") == jobs
    # The sums are the log's own figures (rounded there to the microsecond).
    assert lateness.value("lnk_scheduler_fire_lateness_seconds_sum", recovered="false") == pytest.approx(
        sum(max(0.0, e["lateness_ms"]) for e in fired) / 1000, abs=1e-5)
    assert duration.value("lnk_scheduler_fire_duration_seconds_sum") == pytest.approx(
        sum(e["duration_ms"] for e in fired) / 1000, abs=1e-5)
    assert "lnk_store_op_duration_seconds" in found and "lnk_store_request_duration_seconds" in found

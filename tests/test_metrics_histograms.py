"""The latency histograms (issue 42): one observation per op answered and per request the store saw.

Counted, never timed: each histogram's count is checked against something
counted apart from it, the requests that reached the store's backend
(``FaultyBackend.calls`` under ``faults.machines``, the local folder behind
it) and the replies a driver counted; the values only land in some bucket.
A dead driver's histograms are folded into the exporter's archive with its
counters, and come out the same.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from faults.backend import Fault
from faults.machines import GIVE_UP_FAST, Machines, a_write, in_order
from support import fresh_agent, make_store, wait_for

from cloudstore.protocol.client import ServeProcess
from cloudstore.runtime import metrics
from cloudstore.runtime.metrics.exposition import parse, render, total
from cloudstore.runtime.metrics.snapshots import ARCHIVE, METRICS_DIR, Collector, SnapshotWriter

OPS = "lnk_store_op_duration_seconds"
REQUESTS = "lnk_store_request_duration_seconds"
T = TypeVar("T")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@pytest.fixture
def machines(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Machines]:
    store = make_store("file", request, tmp_path_factory)
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    group = Machines(store)
    yield group
    group.close()


def timed_by_kind(op: str) -> dict[str, int]:
    """This process's requests timed for backend file and ``op``, by kind (get, put, delete, list)."""
    return {kind: metrics.REQUEST_SECONDS.value("file", op, kind).count for kind in metrics.REQUEST_KINDS}


def counts(op: str) -> tuple[int, int, float]:
    """This process's ops timed, requests timed and requests counted, for backend file and ``op``."""
    return (metrics.OP_SECONDS.value("file", op).count, sum(timed_by_kind(op).values()),
            metrics.REQUESTS.value("file", op))


# --------------------------------------------------------------------------
# In process, on the local folder: against the requests the backend saw


#: Ops of every kind of request, answered by one machine in turn (op, its arguments).
STEPS = [
    ("append", {"thread": "t", "event": {"seq": 1}}),
    ("append", {"thread": "t", "event": {"seq": 2}}),
    ("append", {"thread": "t", "event": {"seq": 2}}),  # taken: answered all the same
    ("last", {"thread": "t"}),
    ("read", {"thread": "t", "first": 1}),
    ("threads", {}),  # reads on the space's pool threads count for the op
    ("file_write", {"path": "skills/x", "data": b64(b"one"), "version": 0}),
    ("file_write", {"path": "../escape", "data": b64(b"x"), "version": 0}),  # refused: no request, one op
    ("file_read", {"path": "skills/x"}),
    ("nonsense", {}),  # no op of the table: counted as op ""
]


def each_step(a: Any, measure: Callable[[str], T]) -> Iterator[tuple[str, T, T, list[Any]]]:
    """Each of ``STEPS`` answered by machine ``a``: the op, ``measure`` of its name (as counted: "" for one
    not in the table) before and after it, and the requests the store saw for it."""
    for op, args in STEPS:
        name = op if op != "nonsense" else ""
        before, calls = measure(name), len(a.backend.calls)
        a(op, **args)
        yield op, before, measure(name), a.backend.calls[calls:]


def test_each_op_is_timed_once_and_each_request_the_store_saw(machines: Machines) -> None:
    for op, before, now, calls in each_step(machines("A"), counts):
        ops, timed, counted = (after - was for after, was in zip(now, before, strict=True))
        seen = len(calls)
        assert ops == 1, f"{op}: timed {ops} times"
        assert timed == counted == seen, f"{op}: {timed} requests timed, {counted} counted, {seen} at the store"
    assert metrics.REQUEST_SECONDS.value("file", "append", "put").count > 0


def test_each_request_is_timed_under_its_kind_as_the_store_saw_it(machines: Machines) -> None:
    """A listing and a get take their own times: each request is timed under the kind the backend was asked."""
    for op, before, now, calls in each_step(machines("A"), timed_by_kind):
        seen = Counter("list" if call.op == "list_dirs" else call.op for call in calls)
        timed = Counter({kind: n - before[kind] for kind, n in now.items()})
        assert +timed == seen, f"{op}: timed {dict(timed)}, the store saw {dict(seen)}"
    assert all(metrics.REQUEST_SECONDS.value("file", "threads", kind).count for kind in ("get", "list"))


def test_a_request_that_failed_and_its_retry_are_each_timed(machines: Machines) -> None:
    a = machines("A")
    before, calls = counts("file_write"), len(a.backend.calls)
    a.plan(in_order((a_write, Fault.FAIL_BEFORE)))
    assert a("file_write", path="skills/x", data=b64(b"one"), version=0)["reply"] == "wrote"
    ops, timed, counted = (after - was for after, was in zip(counts("file_write"), before, strict=True))
    assert ops == 1
    assert timed == counted == len(a.backend.calls) - calls
    assert metrics.RETRIES.value("file", "file_write") >= 1


def test_an_op_that_gives_up_is_timed_once(machines: Machines) -> None:
    a = machines("A", GIVE_UP_FAST)
    before, calls = counts("file_write"), len(a.backend.calls)
    a.plan(lambda call: Fault.FAIL_BEFORE)
    assert "nothing was changed" in a("file_write", path="skills/x", data=b64(b"x"), version=0)["error"]
    ops, timed, counted = (after - was for after, was in zip(counts("file_write"), before, strict=True))
    assert ops == 1
    assert timed == counted == len(a.backend.calls) - calls >= GIVE_UP_FAST.attempts


def test_work_left_for_after_the_reply_is_counted_for_its_op_but_timed_as_no_op(machines: Machines) -> None:
    """Packing runs after the reply, in the op's scope (its requests count for the op): no second op."""
    a = machines("A")
    a.space.deferred = []  # as a driver's: packing waits until the reply is out
    before, calls = counts("append"), len(a.backend.calls)
    after_reply = 0
    for seq in range(1, 33):  # the 32nd event completes the first block of 32: packed after its reply
        assert a("append", thread="t", event={"seq": seq}) == {"reply": "done"}
        made = len(a.backend.calls)
        a.answerer.after_reply()
        after_reply += len(a.backend.calls) - made
    assert after_reply > 0, "the block was packed after the reply"
    ops, timed, counted = (after - was for after, was in zip(counts("append"), before, strict=True))
    assert ops == 32
    assert timed == counted == len(a.backend.calls) - calls


def test_a_scope_naming_no_backend_is_not_timed_and_one_naming_it_is_timed_once() -> None:
    before = metrics.OP_SECONDS.value("file", "demo").count
    with metrics.op_scope("demo"):
        pass
    with metrics.op_scope("demo", "file"):
        pass
    assert metrics.OP_SECONDS.value("file", "demo").count == before + 1
    assert metrics.OP_SECONDS.value("s3", "demo").count == 0


# --------------------------------------------------------------------------
# The registry's histogram, its text, and its way through snapshots


def test_a_histogram_renders_as_prometheus_writes_one() -> None:
    registry = metrics.Registry()
    h = registry.histogram("demo_seconds", "Demo.", ("op",), (0.01, 1.0))
    for value in (0.01, 0.5, 7.0):
        h.observe(value, "a")
    registry.histogram("idle_seconds", "Never observed.", (), (1.0,))
    text = render(registry.families())
    assert text.splitlines()[:7] == [
        "# HELP demo_seconds Demo.",
        "# TYPE demo_seconds histogram",
        'demo_seconds_bucket{op="a",le="0.01"} 1',  # a bound holds the values equal to it (le)
        'demo_seconds_bucket{op="a",le="1.0"} 2',
        'demo_seconds_bucket{op="a",le="+Inf"} 3',
        'demo_seconds_sum{op="a"} 7.51',
        'demo_seconds_count{op="a"} 3',
    ]
    assert "# TYPE idle_seconds histogram" in text
    with pytest.raises(ValueError):
        h.observe(1.0)
    with pytest.raises(ValueError):
        registry.histogram("demo_seconds", "again", ("other",), (0.01, 1.0))
    with pytest.raises(ValueError):
        registry.counter("demo_seconds", "a counter now")
    with pytest.raises(ValueError):
        registry.histogram("bad_seconds", "bounds out of order", (), (1.0, 0.5))


def _snapshot_in(folder: Path, program: str, seconds: dict[str, list[float]]) -> Path:
    """A snapshot of request times observed by a child process that then exits (a driver that ended)."""
    code = f"""
from cloudstore.runtime.metrics import REQUEST_SECONDS
from cloudstore.runtime.metrics.snapshots import SnapshotWriter
for op, values in {seconds!r}.items():
    for value in values:
        REQUEST_SECONDS.observe(value, "file", op, "get")
w = SnapshotWriter({str(folder)!r}, {program!r})
w.flush()
print(w.path)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return Path(done.stdout.strip())


def folder_samples(folder: Path) -> dict[tuple[str, metrics.Labels], float]:
    return parse(Collector(str(folder), metrics.Registry()).render())


def bucket(samples: dict[tuple[str, metrics.Labels], float], op: str, le: str) -> float:
    return total(samples, f"{REQUESTS}_bucket", backend="file", op=op, le=le)


def test_a_dead_processs_histogram_is_folded_into_the_archive_as_its_counters_are(tmp_path: Path) -> None:
    one = _snapshot_in(tmp_path, "lnk-bucket-store", {"append": [0.0005, 0.3, 30.0], "read": [0.02]})
    two = _snapshot_in(tmp_path, "lnk-gcs", {"append": [0.3]})
    mine = metrics.Registry()
    mine.histogram(REQUESTS, "h", ("backend", "op"), metrics.LATENCY_BUCKETS).observe(0.003, "file", "append")
    live = SnapshotWriter(str(tmp_path), "live", mine)  # this process: alive, never folded
    live.flush()

    first = folder_samples(tmp_path)
    assert not one.exists() and not two.exists(), "the dead processes' snapshots are folded into the archive"
    assert Path(live.path).exists()
    assert total(first, f"{REQUESTS}_count", op="append") == 5
    assert total(first, f"{REQUESTS}_count", op="read") == 1
    assert bucket(first, "append", "0.001") == 1
    assert bucket(first, "append", "0.005") == 2
    assert bucket(first, "append", "0.5") == 4
    assert bucket(first, "append", "20.0") == 4
    assert bucket(first, "append", "+Inf") == 5
    assert total(first, f"{REQUESTS}_sum", op="append") == pytest.approx(30.6035)
    archive = json.loads((tmp_path / ARCHIVE).read_text())
    assert sorted(archive["folded"]) == sorted([one.name, two.name])
    folded = {tuple(sorted(labels.items())): (counts, s) for labels, counts, s in
              archive["histograms"][REQUESTS]["samples"]}
    append = (("backend", "file"), ("op", "append"), ("request", "get"))
    assert sum(folded[append][0]) == 4, "the dead ones' 3 + 1, not the live one's"
    assert archive["histograms"][REQUESTS]["bounds"] == list(metrics.LATENCY_BUCKETS)

    # A crash between writing the archive and removing a folded snapshot must not count it twice.
    (tmp_path / one.name).write_text(json.dumps(json.loads(Path(live.path).read_text())))
    assert folder_samples(tmp_path) == first
    assert not (tmp_path / one.name).exists()
    assert folder_samples(tmp_path) == first, "folding changes no sum"

    mine.histograms[REQUESTS].observe(0.003, "file", "append")
    live.flush()
    assert bucket(folder_samples(tmp_path), "append", "0.005") == 3


def test_a_snapshot_of_a_release_before_histograms_is_read(tmp_path: Path) -> None:
    """Snapshots without ``histograms`` (a driver of 0.6.0 beside a newer exporter) still count."""
    old = {"families": {"lnk_store_requests_total": {"help": "h", "samples": [[{"backend": "file", "op": "x"}, 2]]}}}
    (tmp_path / f"lnk-gcs-{os.getpid()}-0123abcd.json").write_text(json.dumps(old))
    assert total(folder_samples(tmp_path), "lnk_store_requests_total", op="x") == 2


# --------------------------------------------------------------------------
# A real serve driver: every reply timed once, packing after the reply included in no op's count


def test_a_serve_driver_times_each_reply_and_each_request_it_counted(tmp_path: Path) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    (tmp_path / "bucket").mkdir()
    env = {"LNK_BUCKET_URL": f"file://{tmp_path / 'bucket'}", METRICS_DIR: str(folder)}
    agent = fresh_agent()
    appends = 33  # past the first block of 32, packed after a reply
    with ServeProcess("lnk-bucket-store", env) as proc:
        for seq in range(1, appends + 1):
            assert proc.request({"op": "append", "agent": agent, "thread": "t", "event": {"seq": seq}}) \
                == {"reply": "done"}
        assert proc.request({"op": "last", "agent": agent, "thread": "t"}) == {"reply": "last", "last": appends}
        assert proc.request({"op": "nonsense", "agent": agent})["reply"] == "error"
        wait_for(lambda: total(folder_samples(folder), "lnk_store_replies_total") == appends + 2, 10, "the snapshot")
    samples = folder_samples(folder)
    for op, answered in (("append", appends), ("last", 1), ("", 1)):
        assert total(samples, f"{OPS}_count", backend="file", op=op) == answered \
            == total(samples, "lnk_store_replies_total", backend="file", op=op), op
        assert total(samples, f"{OPS}_bucket", backend="file", op=op, le="+Inf") == answered
        assert total(samples, f"{REQUESTS}_count", backend="file", op=op) \
            == total(samples, "lnk_store_requests_total", backend="file", op=op), op
    assert total(samples, f"{REQUESTS}_count", op="append") > appends, "the block's packing counted for append"
    assert os.listdir(folder) == [ARCHIVE], "the exited driver's snapshot was folded"


@pytest.mark.parametrize("bounds, total", [([0.1, float("inf")], 1.0), ([0.1, float("nan")], 1.0),
                                           ([0.1, 1.0], float("nan")), ([0.1, 1.0], float("inf"))])
def test_a_snapshot_histogram_with_a_bound_or_sum_no_number_holds_is_refused(bounds: list[float],
                                                                             total: float) -> None:
    """``json`` reads NaN and Infinity: a snapshot holding one is malformed, not a series to render."""
    from cloudstore.runtime.metrics.snapshots import _families_from_json

    text = json.dumps({"families": {}, "histograms": {"h_seconds": {
        "help": "", "bounds": bounds, "samples": [[{"op": "x"}, [1, 0, 0], total]]}}})
    with pytest.raises(ValueError, match="malformed"):
        _families_from_json(json.loads(text))

"""Metrics (issue 15): what is counted, and that the exports carry it.

Counts are checked against something counted outside the code under test:
the requests the test itself sent, the requests the HTTP fault proxy saw
reach moto (``tests/faults/http_proxy.py``), the faults a plan injected
(``tests/faults/machines.py``), the ``fired`` events in the scheduler's log.

The fast loop runs the exposition format, the snapshot folder, the counters
in-process on the local folder with injected faults, a real ``serve`` driver,
a real bridge (file export and an HTTP scrape) and a real scheduler (file
export); the runs through the proxy in front of moto are ``slow`` (the
emulator, see tests/conftest.py).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import metrics_modules as metrics
import pytest
from faults.backend import Fault
from faults.http_proxy import FaultProxy, Rule
from faults.machines import GIVE_UP_FAST, Machines, a_write, between, in_order
from faults.rounds import gate_kind
from support import StoreUnderTest, fresh_agent, make_store, race, wait_for

from cloudstore.bridge import SOCKET_NAME, BridgeClient
from cloudstore.bridge.proof import new_key_hex
from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling.log import read_events

STORE_METRICS = ("lnk_store_requests_total", "lnk_store_retries_total", "lnk_store_outcome_unknown_total",
                 "lnk_store_cas_lost_total", "lnk_store_replies_total")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def folder_samples(folder: Path) -> dict[tuple[str, metrics.Labels], float]:
    """What an exporter would serve for ``folder``'s snapshots alone (a registry of nothing)."""
    return metrics.parse(metrics.Collector(str(folder), metrics.Registry()).render())


# --------------------------------------------------------------------------
# The exposition format and the snapshot folder


def test_exposition_format_escapes_and_parses_back() -> None:
    registry = metrics.Registry()
    c = registry.counter("demo_total", "Help with a \\ backslash\nand a newline.", ("op", "reply"))
    c.inc("a\\b", 'say "hi"\nthere')
    c.inc("a\\b", 'say "hi"\nthere', by=2)
    c.inc("plain", "x")
    registry.counter("idle_total", "Never counted.")
    text = metrics.render(registry.families())

    assert text.splitlines()[:4] == [
        "# HELP demo_total Help with a \\\\ backslash\\nand a newline.",
        "# TYPE demo_total counter",
        'demo_total{op="a\\\\b",reply="say \\"hi\\"\\nthere"} 3',
        'demo_total{op="plain",reply="x"} 1',
    ]
    assert "# TYPE idle_total counter" in text
    parsed = metrics.parse(text)
    assert parsed[("demo_total", (("op", "a\\b"), ("reply", 'say "hi"\nthere')))] == 3
    assert metrics.total(parsed, "demo_total") == 4
    with pytest.raises(ValueError):
        c.inc("only one label")
    with pytest.raises(ValueError):
        registry.counter("demo_total", "again", ("other",))


def _snapshot_in(folder: Path, program: str, counts: dict[str, int]) -> Path:
    """A snapshot written by a child process that then exits (a driver that ended)."""
    code = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import metrics_modules as metrics
for op, n in {counts!r}.items():
    metrics.REQUESTS.inc("file", op, by=n)
w = metrics.SnapshotWriter({str(folder)!r}, {program!r})
w.flush()
print(w.path)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return Path(done.stdout.strip())


def test_collector_sums_snapshots_and_folds_those_of_dead_processes(tmp_path: Path) -> None:
    one = _snapshot_in(tmp_path, "lnk-bucket-store", {"append": 3, "read": 1})
    two = _snapshot_in(tmp_path, "lnk-gcs", {"append": 2})
    mine = metrics.Registry()
    mine.counter("lnk_store_requests_total", "h", ("backend", "op")).inc("file", "append", by=10)
    live = metrics.SnapshotWriter(str(tmp_path), "live", mine)  # this process: alive, never folded
    live.flush()
    assert {one.exists(), two.exists(), Path(live.path).exists()} == {True}

    first = folder_samples(tmp_path)
    assert metrics.total(first, "lnk_store_requests_total", op="append") == 15
    assert metrics.total(first, "lnk_store_requests_total", op="read") == 1
    assert not one.exists() and not two.exists(), "the dead processes' snapshots are folded into the archive"
    assert Path(live.path).exists()
    archive = json.loads((tmp_path / metrics.ARCHIVE).read_text())
    assert sorted(archive["folded"]) == sorted([one.name, two.name])

    # A crash between writing the archive and removing a folded snapshot must not count it twice:
    # the archive still names it, so the next collection removes it without adding it.
    (tmp_path / one.name).write_text(json.dumps(metrics.snapshot_json(mine)))
    assert folder_samples(tmp_path) == first
    assert not (tmp_path / one.name).exists()
    assert json.loads((tmp_path / metrics.ARCHIVE).read_text())["folded"] == [], "names forgotten once gone"
    assert folder_samples(tmp_path) == first, "folding changes no sum"

    mine.counters["lnk_store_requests_total"].inc("file", "append")
    live.flush()
    assert metrics.total(folder_samples(tmp_path), "lnk_store_requests_total", op="append") == 16


# --------------------------------------------------------------------------
# The counters, in-process, with faults injected on the local folder


@pytest.fixture
def machines(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Machines]:
    store = make_store("file", request, tmp_path_factory)
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    group = Machines(store)
    yield group
    group.close()


def counts(op: str) -> dict[str, float]:
    """This process's store counters for backend file and ``op``."""
    return {
        "requests": metrics.REQUESTS.value("file", op),
        "retries": metrics.RETRIES.value("file", op),
        "unknown": metrics.OUTCOME_UNKNOWN.value("file", op),
        "cas_lost": metrics.CAS_LOST.value("file", op),
        "errors": metrics.REPLIES.value("file", op, "error"),
    }


def delta(before: dict[str, float], op: str) -> dict[str, float]:
    after = counts(op)
    return {k: after[k] - before[k] for k in after}


def test_requests_are_counted_by_op_each_one_the_backend_saw(machines: Machines) -> None:
    a = machines("A")
    before = counts("file_write")
    assert a.ok("file_write", path="skills/x", data=b64(b"one"), version=0)["reply"] == "wrote"
    moved = delta(before, "file_write")
    assert moved["requests"] == len(a.backend.calls) > 0
    assert moved["retries"] == moved["unknown"] == moved["cas_lost"] == moved["errors"] == 0


def test_a_failed_request_retried_is_counted_as_a_retry(machines: Machines) -> None:
    a = machines("A")
    before = counts("file_write")
    a.plan(in_order((a_write, Fault.FAIL_BEFORE)))
    assert a("file_write", path="skills/x", data=b64(b"one"), version=0) == {"reply": "wrote", "version": 1}
    moved = delta(before, "file_write")
    assert moved["retries"] == 1
    assert moved["requests"] == len(a.backend.calls)
    assert moved["unknown"] == moved["errors"] == 0


def test_a_write_lost_then_an_outage_is_counted_outcome_unknown(machines: Machines) -> None:
    a = machines("A", GIVE_UP_FAST)
    a.ok("file_write", path="skills/x", data=b64(b"one"), version=0)
    before = counts("file_write")
    down = [False]

    def plan(call: Any) -> Fault:  # the write lands and its reply is lost; then every request fails
        if down[0]:
            return Fault.FAIL_BEFORE
        if call.is_write:
            down[0] = True
            return Fault.LOSE_REPLY
        return Fault.NONE

    a.plan(plan)
    reply = a("file_write", path="skills/x", data=b64(b"two"), version=1)
    assert reply["reply"] == "error" and "outcome unknown" in reply["error"], reply
    moved = delta(before, "file_write")
    assert moved["unknown"] == moved["errors"] == 1
    assert moved["retries"] == GIVE_UP_FAST.attempts - 1


def test_a_refused_request_or_a_failure_with_nothing_written_is_not_outcome_unknown(machines: Machines) -> None:
    a = machines("A", GIVE_UP_FAST)
    before = counts("file_write")
    assert a("file_write", path="../escape", data=b64(b"x"), version=0)["reply"] == "error"
    a.plan(lambda call: Fault.FAIL_BEFORE)
    reply = a("file_write", path="skills/x", data=b64(b"x"), version=0)
    assert "nothing was changed" in reply["error"], reply
    moved = delta(before, "file_write")
    assert moved["errors"] == 2 and moved["unknown"] == 0


def test_a_compare_and_set_round_lost_to_another_machine_is_counted(machines: Machines) -> None:
    a, b = machines("A"), machines("B")
    before = counts("file_append")
    b_appends: list[dict] = []
    b_appends_once = between(lambda: b_appends.append(b.ok("file_append", path="skills/log", data=b64(b"B"))))
    a.plan(in_order((a_write, b_appends_once)))
    assert a.ok("file_append", path="skills/log", data=b64(b"A")) == {"reply": "wrote", "version": 2}
    assert b_appends == [{"reply": "wrote", "version": 1}]
    moved = delta(before, "file_append")
    assert moved["cas_lost"] == 1, "A's first conditional write lost to B's and was tried again"
    assert moved["requests"] == len(a.backend.calls) + len(b.backend.calls)


def test_requests_on_the_space_pool_threads_count_for_the_op(machines: Machines) -> None:
    a = machines("A")
    for i in range(3):
        a.ok("append", thread=f"t{i}", event={"seq": 1})
    before, empty_before = counts("threads"), counts("")
    calls = len(a.backend.calls)
    assert len(a.ok("threads")["threads"]) == 3  # reads each thread's last in parallel (Space.pool)
    assert delta(before, "threads")["requests"] == len(a.backend.calls) - calls
    assert delta(empty_before, "")["requests"] == 0


# --------------------------------------------------------------------------
# A real serve driver writes its snapshot


def test_serve_driver_writes_its_counters_for_the_exporter(tmp_path: Path) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    (tmp_path / "bucket").mkdir(exist_ok=True)  # drivers refuse a folder that does not exist
    env = {"LNK_BUCKET_URL": f"file://{tmp_path / 'bucket'}", metrics.METRICS_DIR: str(folder)}
    agent = fresh_agent()
    with ServeProcess("lnk-bucket-store", env) as proc:
        for seq in (1, 2, 3):
            assert proc.request({"op": "append", "agent": agent, "thread": "t", "event": {"seq": seq}}) \
                == {"reply": "done"}
        assert proc.request({"op": "append", "agent": agent, "thread": "t", "event": {"seq": 2}})["reply"] == "taken"
        assert proc.request({"op": "nonsense", "agent": agent})["reply"] == "error"
        # Written after each reply: seen while the process still runs.
        live = wait_for(lambda: metrics.total(folder_samples(folder), "lnk_store_replies_total") == 5 and
                        folder_samples(folder), 10, "the snapshot")
    samples = folder_samples(folder)
    assert samples == live
    reply = "lnk_store_replies_total"
    assert metrics.total(samples, reply, backend="file", op="append", reply="done") == 3
    assert metrics.total(samples, reply, backend="file", op="append", reply="taken") == 1
    assert metrics.total(samples, reply, backend="file", op="", reply="error") == 1  # an unknown op: no label of its
    assert metrics.total(samples, "lnk_store_requests_total", backend="file", op="append") >= 4
    assert os.listdir(folder) == [metrics.ARCHIVE], "the exited driver's snapshot was folded"


# --------------------------------------------------------------------------
# The bridge's export: a file, and GET /metrics


def _key_file(path: Path) -> tuple[str, bytes]:
    hex_key = new_key_hex()
    path.write_text(hex_key + "\n")
    os.chmod(path, 0o600)
    return str(path), bytes.fromhex(hex_key)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(__import__("tempfile").mkdtemp(prefix="lnkm", dir="/tmp"))  # a socket path fits in 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _bridge(root: Path, store_env: dict[str, str], *extra: str) -> tuple[subprocess.Popen, str, bytes]:
    harness, folder = root / "h", root / "a1"
    for d in (harness, folder / "chats"):
        d.mkdir(parents=True)
    key_path, key = _key_file(root / "k1")
    argv = [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a1",
            "--agent-owner", "o", "--key-file", key_path, "--agent-folder", str(folder),
            "--driver", "lnk-bucket-store", *[f"--driver-env={k}={v}" for k, v in store_env.items()], *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sock = str(harness / SOCKET_NAME)
    wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, 30, "the bridge's socket")
    assert proc.poll() is None, proc.communicate()
    return proc, sock, key


def _stop(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out, err


def test_bridge_writes_its_calls_and_its_drivers_counters_to_a_file(short_dir: Path) -> None:
    prom = short_dir / "bridge.prom"
    (short_dir / "bucket").mkdir(exist_ok=True)  # drivers refuse a folder that does not exist
    env = {"LNK_BUCKET_URL": f"file://{short_dir / 'bucket'}"}
    proc, sock, key = _bridge(short_dir, env, "--metrics-file", str(prom))
    try:
        client = BridgeClient(sock, "o", "a1", key)
        for seq in (1, 2):
            assert client.op("append", thread="t", event={"seq": seq}) == {"reply": "done"}
        assert client.op("last", thread="t") == {"reply": "last", "last": 2}
        assert client.op("file_read", path="../x")["error"].startswith("refused:")
        assert BridgeClient(sock, "o", "a1", bytes(32)).op("last", thread="t")["error"].startswith("refused:")
        assert prom.exists(), "written at start"
    finally:
        out, _ = _stop(proc)
    assert out == b""
    samples = metrics.parse(prom.read_text())
    assert "# TYPE lnk_bridge_calls_total counter" in prom.read_text()
    calls = "lnk_bridge_calls_total"
    assert metrics.total(samples, calls, op="append", outcome="answered") == 2
    assert metrics.total(samples, calls, op="last", outcome="answered") == 1
    assert metrics.total(samples, calls, outcome="refused") == 2
    replies = "lnk_store_replies_total"
    assert metrics.total(samples, replies, backend="file", op="append", reply="done") == 2
    # The caller's last and the bridge's own start-up question (issue 46: it refuses a store it cannot open),
    # which is no call of the bridge's.
    assert metrics.total(samples, replies, backend="file", op="last", reply="last") == 2
    assert metrics.total(samples, replies) == 4, "refused calls never reached the driver"
    assert metrics.total(samples, "lnk_store_requests_total", backend="file", op="append") > 0


def test_bridge_serves_get_metrics(short_dir: Path) -> None:
    (short_dir / "bucket").mkdir(exist_ok=True)  # drivers refuse a folder that does not exist
    env = {"LNK_BUCKET_URL": f"file://{short_dir / 'bucket'}"}
    proc, sock, key = _bridge(short_dir, env, "--metrics-port", "0", "--log-format", "json", "--log-level", "INFO")
    try:
        client = BridgeClient(sock, "o", "a1", key)
        assert client.op("append", thread="t", event={"seq": 1}) == {"reply": "done"}
        assert proc.stderr is not None
        port = None
        while port is None:  # the first lines are the start's; the port is in one of them
            line = json.loads(proc.stderr.readline())
            port = line.get("metrics_port")

        def scraped() -> Any:
            """The samples once the driver's snapshot is in: a driver writes it after its reply, not before
            (the append's: the bridge's own start-up question is a reply of its too)."""
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
                assert got.headers["Content-Type"] == metrics.CONTENT_TYPE
                found = metrics.parse(got.read().decode("utf-8"))
            return found if metrics.total(found, "lnk_store_replies_total", op="append") else None

        samples = wait_for(scraped, what="the driver's counters at /metrics")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    finally:
        _stop(proc)
    assert metrics.total(samples, "lnk_bridge_calls_total", op="append", outcome="answered") == 1
    assert metrics.total(samples, "lnk_store_replies_total", op="append", reply="done") == 1


def test_metrics_flags_are_checked() -> None:
    done = subprocess.run([sys.executable, "-m", "cloudstore.bridge.cli", "--harness", "/tmp", "--driver", "x",
                           "--metrics-port", "nope"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--metrics-port" in done.stderr
    done = subprocess.run([sys.executable, "-m", "cloudstore.scheduler", "--agent", "a", "--driver", "lnk-bucket-store",
                           "--fire", "true", "--metrics-port", "70000"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--metrics-port" in done.stderr, done.stderr


# --------------------------------------------------------------------------
# The scheduler's export


def scheduler_firing(tmp_path: Path, jobs: int) -> tuple[str, Path]:
    """A runner exporting to a file, on a folder store, until ``jobs`` jobs put due now have fired, then
    stopped (SIGTERM): the text of its metrics file, written a last time after its drivers ended, and its log."""
    (tmp_path / "bucket").mkdir(exist_ok=True)  # drivers refuse a folder that does not exist
    env = {"LNK_BUCKET_URL": f"file://{tmp_path / 'bucket'}"}
    prom = tmp_path / "scheduler.prom"
    config = tmp_path / "scheduler.json"
    config.write_text(json.dumps({
        "agents": [{"owner": None, "id": "a"}], "driver": "lnk-bucket-store", "driver_env": env,
        "fire": [shutil.which("true") or "/bin/true"], "poll_interval": 0.5, "metrics_file": str(prom),
    }))
    log = tmp_path / "runner.log"
    with open(log, "wb") as err:
        runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    try:
        wait_for(lambda: read_events(log, "started"), 60, "the runner to start")
        with ServeProcess("lnk-bucket-store", env) as store:
            for i in range(jobs):
                reply = store.request({"op": "job_put", "agent": {"owner": None, "id": "a"}, "place": "waiting",
                                       "job": {"id": f"j{i}", "spec": i, "due": time.time()}})
                assert reply == {"reply": "done"}
        wait_for(lambda: len(read_events(log, "fired")) == jobs, 60, f"{jobs} jobs fired")
    finally:
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 0 and out == b""
    return prom.read_text(), log


def test_scheduler_file_counts_each_event_and_its_drivers_requests(tmp_path: Path) -> None:
    jobs = 5
    text, log = scheduler_firing(tmp_path, jobs)

    def events(name: str) -> list[dict[str, Any]]:
        return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == name]

    samples = metrics.parse(text)
    assert metrics.total(samples, "lnk_scheduler_events_total", event="fired") == jobs == len(events("fired"))
    # The lines about the runner itself are not events (issue 46): process_start_time_seconds dates its start.
    assert metrics.total(samples, "lnk_scheduler_events_total", event="started") == 0 < len(events("started"))
    assert metrics.total(samples, "lnk_scheduler_events_total", event="stopped") == 0 < len(events("stopped"))
    assert metrics.total(samples, "lnk_store_replies_total", backend="file", op="job_due") > 0
    assert metrics.total(samples, "lnk_store_replies_total", backend="file", op="job_claim", reply="claimed") >= jobs
    assert metrics.total(samples, "lnk_store_requests_total", backend="file") > 0
    # What the runner sent, counted on its side, is what its drivers answered, counted on theirs.
    for op in ("job_claim", "job_due"):
        sent = metrics.total(samples, "lnk_scheduler_requests_total", op=op)
        assert sent == metrics.total(samples, "lnk_store_replies_total", op=op) > 0, op
    lines = log.read_text().splitlines()
    assert all(isinstance(json.loads(line), dict) for line in lines), "runner and drivers: JSON lines only"


# --------------------------------------------------------------------------
# Through the HTTP fault proxy in front of moto: counts against requests seen at the wire (slow)


@pytest.fixture
def proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            moto_server: Any) -> Iterator[tuple[FaultProxy, StoreUnderTest]]:
    base = make_store("moto", request, tmp_path_factory)
    with FaultProxy(base.env["AWS_ENDPOINT_URL_S3"], flavor="s3") as proxy:
        yield proxy, replace(base, env=proxy.redirect(base.env))


def _serve(store: StoreUnderTest, folder: Path) -> ServeProcess:
    return ServeProcess(store.program, {**store.env, metrics.METRICS_DIR: str(folder)})


def seam_requests(proxy: FaultProxy, processes: int = 1) -> int:
    """The requests the proxy saw but the clock probes: one GET of ``_clock`` a process at most, made by
    the backend's clock outside the seam (documented as not counted)."""
    probes = proxy.count("GET", r"/_clock$")
    assert probes <= processes, proxy.requests("GET", r"/_clock$")
    return len(proxy.requests()) - probes


def test_requests_counted_are_the_requests_the_store_saw(proxied: tuple[FaultProxy, StoreUnderTest],
                                                        tmp_path: Path) -> None:
    proxy, store = proxied
    agent = fresh_agent()
    with _serve(store, tmp_path) as proc:
        for seq in range(1, 6):
            assert proc.request({"op": "append", "agent": agent, "thread": "t", "event": {"seq": seq}},
                                timeout=60)["reply"] == "done"
        proc.request({"op": "read", "agent": agent, "thread": "t", "first": 1}, timeout=60)
        proc.request({"op": "threads", "agent": agent}, timeout=60)
        proc.request({"op": "file_write", "agent": agent, "path": "skills/a", "data": b64(b"x"), "version": 0},
                     timeout=60)
        proc.request({"op": "job_put", "agent": agent, "place": "waiting",
                      "job": {"id": "j", "spec": None, "due": time.time() + 3600}}, timeout=60)
        proc.request({"op": "job_list", "agent": agent, "place": "waiting"}, timeout=60)
    samples = folder_samples(tmp_path)
    assert metrics.total(samples, "lnk_store_requests_total", backend="s3") == seam_requests(proxy) > 0
    assert metrics.total(samples, "lnk_store_retries_total") == 0


def test_a_503_shows_up_as_a_retry(proxied: tuple[FaultProxy, StoreUnderTest], tmp_path: Path) -> None:
    proxy, store = proxied
    agent = fresh_agent()
    with _serve(store, tmp_path) as proc:
        proc.request({"op": "last", "agent": agent, "thread": "warm"}, timeout=60)
        fail = proxy.add(Rule("fail", method="PUT", status=503))
        reply = proc.request({"op": "file_write", "agent": agent, "path": "skills/a", "data": b64(b"x"), "version": 0},
                             timeout=60)
    assert reply == {"reply": "wrote", "version": 1}
    assert fail.fired == 1
    samples = folder_samples(tmp_path)
    assert metrics.total(samples, "lnk_store_retries_total", backend="s3", op="file_write") == 1
    assert metrics.total(samples, "lnk_store_requests_total") == seam_requests(proxy)


def test_a_reply_lost_after_the_write_applied_shows_up_as_outcome_unknown(
        proxied: tuple[FaultProxy, StoreUnderTest], tmp_path: Path) -> None:
    proxy, store = proxied
    agent = fresh_agent()
    with _serve(store, tmp_path) as proc:
        proc.request({"op": "last", "agent": agent, "thread": "warm"}, timeout=60)
        lose = proxy.add(Rule("lose_reply", method="PUT"))
        proxy.add(Rule("fail", method="PUT", status=503, times=1000))  # then every retry fails: past the budget
        reply = proc.request({"op": "file_write", "agent": agent, "path": "skills/a", "data": b64(b"x"), "version": 0},
                             timeout=120)
    assert reply["reply"] == "error" and "outcome unknown" in reply["error"], reply
    assert lose.fired == 1
    samples = folder_samples(tmp_path)
    assert metrics.total(samples, "lnk_store_outcome_unknown_total", backend="s3", op="file_write") == 1
    assert metrics.total(samples, "lnk_store_replies_total", op="file_write", reply="error") == 1
    assert metrics.total(samples, "lnk_store_retries_total", op="file_write") >= 1
    assert metrics.total(samples, "lnk_store_requests_total") == seam_requests(proxy)


def test_two_racers_lost_rounds_are_the_conditional_writes_the_store_refused(
        proxied: tuple[FaultProxy, StoreUnderTest], tmp_path: Path) -> None:
    proxy, store = proxied
    agent = fresh_agent()
    procs = [_serve(store, tmp_path) for _ in range(2)]
    try:
        for p in procs:
            p.request({"op": "last", "agent": agent, "thread": "warm"}, timeout=60)
        proxy.add(Rule("delay", method="PUT", before=0.05, times=10_000))  # widen each round's window
        rounds = 8
        for _ in range(rounds):
            replies = race(procs, lambda i: {"op": "file_append", "agent": agent, "path": "skills/log",
                                             "data": b64(f"<{i}>".encode())})
            assert all(r["reply"] == "wrote" for r in replies), replies
    finally:
        for p in procs:
            p.close()
    samples = folder_samples(tmp_path)
    refused = [s for s in proxy.requests("PUT") if s.upstream == 412 and gate_kind(s) is None]  # not the probe's
    lost = metrics.total(samples, "lnk_store_cas_lost_total", backend="s3", op="file_append")
    assert lost == len(refused), f"{lost} lost rounds counted, {len(refused)} conditional PUTs answered 412"
    assert lost > 0, "two racers released together, each write held 50 ms: some round must be lost"
    assert metrics.total(samples, "lnk_store_replies_total", op="file_append", reply="wrote") == 2 * rounds
    assert metrics.total(samples, "lnk_store_requests_total") == seam_requests(proxy, 2)

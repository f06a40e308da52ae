"""What the exporters add of themselves (issue 42): ``process_*``, ``python_*`` and ``lnk_build_info``.

The bridge's ``GET /metrics`` and the scheduler's file are read with
``prometheus_client.parser.text_string_to_metric_families``, a real
Prometheus parser, not this package's own ``parse``: every family must come
out with its type, the histograms with their buckets.  And the registry a
driver imports must not bring ``prometheus_client`` with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import wait_for

from cloudstore._version import __version__
from cloudstore.bridge import SOCKET_NAME, BridgeClient
from cloudstore.bridge.proof import new_key_hex
from cloudstore.gate.store_format import FORMAT, READS_FROM
from cloudstore.runtime.metrics.exposition import CONTENT_TYPE

PROCESS = ("process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
           "process_open_fds", "process_max_fds", "process_start_time_seconds")


def families(text: str) -> dict[str, Any]:
    """Every family of an exposition text, by name, as a real Prometheus parser reads it."""
    found = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in found, f"{family.name} twice"
        found[family.name] = family
    return found


def sample(family: Any, name: str, **labels: str) -> float:
    """The one sample of ``family`` named ``name`` whose labels include ``labels``."""
    values = [s.value for s in family.samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(values) == 1, (name, labels, family.samples)
    return float(values[0])


def check_the_exporters_own(found: dict[str, Any], program: str) -> None:
    build = found["lnk_build_info"]
    assert build.type == "gauge"
    assert [(s.labels, s.value) for s in build.samples] == [
        ({"version": __version__, "program": program, "store_format": str(FORMAT), "reads_from": str(READS_FROM)},
         1)]
    assert found["python_info"].type == "gauge"
    assert found["python_gc_objects_collected"].type == "counter"
    if not os.path.isdir("/proc/self"):  # prometheus_client reads the process's metrics from /proc (Linux)
        return
    for name in PROCESS:
        assert name in found, f"{name} missing"
    assert found["process_cpu_seconds"].type == "counter"
    assert sample(found["process_cpu_seconds"], "process_cpu_seconds_total") >= 0
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds",
                 "process_start_time_seconds"):
        assert found[name].type == "gauge" and sample(found[name], name) > 0, name


# --------------------------------------------------------------------------
# The bridge: scraped on GET /metrics


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkx", dir="/tmp"))  # a socket path fits in 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_bridge_serves_its_process_build_and_latencies_to_a_prometheus_parser(short_dir: Path) -> None:
    harness, folder, bucket = short_dir / "h", short_dir / "a1", short_dir / "bucket"
    for made in (harness, folder / "chats", bucket):
        made.mkdir(parents=True)
    key_hex = new_key_hex()
    (short_dir / "k1").write_text(key_hex + "\n")
    os.chmod(short_dir / "k1", 0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a1",
         "--agent-owner", "o", "--key-file", str(short_dir / "k1"), "--agent-folder", str(folder),
         "--driver", "lnk-bucket-store", f"--driver-env=LNK_BUCKET_URL=file://{bucket}",
         "--metrics-port", "0", "--log-format", "json", "--log-level", "INFO"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        sock = str(harness / SOCKET_NAME)
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, 30, "the bridge's socket")
        assert proc.poll() is None, proc.communicate()
        client = BridgeClient(sock, "o", "a1", bytes.fromhex(key_hex))
        for seq in (1, 2):
            assert client.op("append", thread="t", event={"seq": seq}) == {"reply": "done"}
        assert proc.stderr is not None
        port = None
        while port is None:  # the first lines are the start's; the port is in one of them
            port = json.loads(proc.stderr.readline()).get("metrics_port")

        def scraped() -> dict[str, Any] | None:
            """The families once the driver's snapshot holds both appends' replies (written after each reply;
            the bridge's own start-up ``last`` is a reply too)."""
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as got:
                assert got.headers["Content-Type"] == CONTENT_TYPE
                found = families(got.read().decode("utf-8"))
            replies = found.get("lnk_store_replies")
            done = replies is not None and sum(s.value for s in replies.samples if s.labels.get("op") == "append") == 2
            return found if done else None

        found = wait_for(scraped, what="the driver's replies at /metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0

    check_the_exporters_own(found, "lnk-store-bridge")
    assert found["lnk_bridge_calls"].type == "counter"
    ops = found["lnk_store_op_duration_seconds"]
    assert ops.type == "histogram"
    assert sample(ops, "lnk_store_op_duration_seconds_count", backend="file", op="append") == 2
    assert sample(ops, "lnk_store_op_duration_seconds_bucket", backend="file", op="append", le="+Inf") == 2
    requests = found["lnk_store_request_duration_seconds"]
    assert requests.type == "histogram"
    timed = [s for s in requests.samples if s.name == "lnk_store_request_duration_seconds_count"
             and s.labels["op"] == "append"]  # one a kind of request (get, put, ...)
    assert {s.labels["request"] for s in timed} <= {"get", "put", "delete", "list"}
    assert sum(s.value for s in timed) \
        == sample(found["lnk_store_requests"], "lnk_store_requests_total", backend="file", op="append") > 0


# --------------------------------------------------------------------------
# The scheduler: its file


def test_the_schedulers_file_holds_its_process_and_build(tmp_path: Path) -> None:
    (tmp_path / "bucket").mkdir()
    prom, config, log = tmp_path / "scheduler.prom", tmp_path / "scheduler.json", tmp_path / "runner.log"
    config.write_text(json.dumps({
        "agents": [{"owner": None, "id": "a"}], "driver": "lnk-bucket-store",
        "driver_env": {"LNK_BUCKET_URL": f"file://{tmp_path / 'bucket'}"},
        "fire": [shutil.which("true") or "/bin/true"], "poll_interval": 0.5, "metrics_file": str(prom),
    }))
    with open(log, "wb") as err:
        runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    try:
        wait_for(lambda: any(json.loads(line).get("event") == "started" for line in log.read_text().splitlines()),
                 60, "the runner to start")
    finally:
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 0 and out == b""
    found = families(prom.read_text())
    check_the_exporters_own(found, "lnk-cloud-scheduler")
    # Its start is no event (issue 46), and it has no bridge: the bridge's client it imports brings no family.
    assert not [s for s in found["lnk_scheduler_events"].samples if s.labels["event"] == "started"]
    assert not [name for name in found if name.startswith("lnk_bridge_")]
    # The start-up check asked the runner's driver (job_mark) before "started"; the file is written a
    # last time after the drivers ended, so their last snapshots are in.
    assert found["lnk_store_op_duration_seconds"].type == "histogram"
    assert sample(found["lnk_store_op_duration_seconds"], "lnk_store_op_duration_seconds_count",
                  backend="file", op="job_mark") \
        == sum(s.value for s in found["lnk_store_replies"].samples if s.labels["op"] == "job_mark") > 0


# --------------------------------------------------------------------------
# What a driver imports


def test_a_driver_and_the_seam_import_no_prometheus_client() -> None:
    code = (
        "import io, sys\n"
        "import cloudstore.runtime.metrics, cloudstore.runtime.metrics.snapshots\n"
        "import cloudstore.runtime.metrics.exposition, cloudstore.runtime.metrics.http\n"
        "import cloudstore.generations, cloudstore.protocol.service\n"
        "from cloudstore import driver\n"
        "assert driver.run(driver.BUCKET, ['contract'], stdout=io.StringIO()) == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout

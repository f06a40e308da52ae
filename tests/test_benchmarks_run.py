"""The benchmarks still run: cloud_round_trips.py, gc_after_jobs.py, mark_shards.py, format_gate.py,
bridge_sharing.py, scheduler_pauses.py and agent_memory.py at tiny settings.

Figures are not checked (these machines are noisy), only that the run ends
well and prints a row for every figure on both backends.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "cloud_round_trips.py")


def load_benchmark():
    spec = importlib.util.spec_from_file_location("cloud_round_trips", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_quick_settings_skip_the_big_conversation():
    bench = load_benchmark()
    quick = bench.parse(["--quick"])
    assert quick.skip_big and quick.repeats == 3 and quick.rtt_ms == 20.0
    assert quick.backend_names == ["moto", "gcs"]
    full = bench.parse([])
    assert not full.skip_big and full.repeats == 5 and full.big_events == 10000 and full.agents == 200


@pytest.mark.slow  # both emulators
def test_cloud_round_trips_prints_every_figure():
    bench = load_benchmark()
    # Every figure, the big conversation included (70 events: past one 64-event segment), on both backends.
    argv = [sys.executable, SCRIPT, "--rtt-ms", "0", "--repeats", "1", "--appends", "2", "--events", "20",
            "--big-events", "70", "--agents", "3", "--files", "5", "--big-files", "12", "--backends", "moto,gcs"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "RTT 0 ms" in out.splitlines()[0]
    moto, gcs = out.find("S3 on moto's server ("), out.find("GCS on fake-gcs-server (memory) (")
    assert 0 < moto < gcs, out
    for label, table in (("moto", out[moto:gcs]), ("gcs", out[gcs:])):
        figures = [
            line[:18].rstrip() for line in table.splitlines() if line.count("|") == 2 and not line.startswith("figure ")
        ]
        assert figures == list(bench.FIGURES), f"{label}: rows {figures}\n{out}"


def test_gc_after_jobs_prints_every_figure_on_file():
    # benchmarks/gc_after_jobs.py at small settings on the local folder: 20 jobs, every step of the admin tool.
    script = os.path.join(ROOT, "benchmarks", "gc_after_jobs.py")
    argv = [sys.executable, script, "--backends", "file", "--jobs", "20", "--spread", "2", "--runners", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "== file (file://): 20 jobs fired" in out, out
    for label in ("inspect before", "gc dry run (default min-age)", "gc --apply (default min-age)",
                  "inspect after default gc", "gc dry run --min-age 0", "gc --apply --min-age 0", "inspect after"):
        assert f"  {label} " in out, f"no row for {label}\n{out}"
    assert "TOTAL" in out and "live state" in out and "failed" not in out, out


def test_mark_shards_prints_a_row_per_shard_count():
    # benchmarks/mark_shards.py is a seeded model (no emulator, no real time): a row per shard count asked,
    # the drivers' own count marked, and the same figures again from the same seeds.
    script = os.path.join(ROOT, "benchmarks", "mark_shards.py")
    argv = [sys.executable, script, "--shards", "4,128", "--seconds", "3", "--seeds", "2"]
    runs = [subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT) for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in runs[0].stdout.splitlines() if line.startswith("| 4 ") or line.startswith("| 128 ")]
    assert len(rows) == 2 and "(job_mark.SHARDS)" in rows[1], runs[0].stdout
    assert runs[0].stdout == runs[1].stdout, "a seed replays the same figures"


@pytest.mark.slow  # moto, and the previous release built from git history
def test_format_gate_prints_its_rows_beside_the_previous_release():
    # benchmarks/format_gate.py at its tiniest: one try of each row, moto only, no added latency.
    script = os.path.join(ROOT, "benchmarks", "format_gate.py")
    argv = [sys.executable, script, "--rtt-ms", "0", "--repeats", "1", "--backends", "moto"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split()[:4] for line in done.stdout.splitlines()[1:]]
    assert rows == [["moto", "0.5.0", "call", "last"], ["moto", "0.5.0", "call", "append"],
                    ["moto", "0.5.0", "serve", "first"], ["moto", "HEAD", "call", "last"],
                    ["moto", "HEAD", "call", "append"], ["moto", "HEAD", "serve", "first"]], done.stdout


@pytest.mark.parametrize("flags", [[], ["--shared-drivers"]], ids=["own-drivers", "shared-drivers"])
def test_bridge_sharing_prints_every_phase(flags):
    # benchmarks/bridge_sharing.py --tiny: a real bridge and lnk-bucket-store on a folder store, every phase.
    script = os.path.join(ROOT, "benchmarks", "bridge_sharing.py")
    done = subprocess.run([sys.executable, script, "--tiny", *flags], capture_output=True, text=True, timeout=240,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for start in ("code: ", "a. ", "   1 agent, 1 read: ", "   2 agents x 8 reads at once: ", "b. ",
                  "   another agent's `last` meanwhile: p50", "c. 12 appends from 3 agents", "   bridge: "):
        assert f"\n{start}" in f"\n{out}", f"no line starting {start!r}\n{out}"
    assert "events x16" in out and "error" not in out, out


@pytest.mark.slow  # moto and runner processes
def test_scheduler_pauses_prints_a_row_per_run():
    # benchmarks/scheduler_pauses.py at its tiniest: 4 jobs at lapse 3, a slow store and one runner stopped.
    script = os.path.join(ROOT, "benchmarks", "scheduler_pauses.py")
    argv = [sys.executable, script, "--tree", ROOT, "--jobs", "4", "--lapses", "3", "--modes", "slow,stopped",
            "--stops", "1", "--delay", "0.05", "--patience", "20"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"measuring {ROOT}/cloudstore " in done.stderr, done.stderr[-3000:]
    rows = [line.split(" | ")[:3] for line in done.stdout.splitlines() if line.startswith("| 3 s |")]
    assert rows == [["| 3 s", "0.05 s store", "4"], ["| 3 s", "no delay + 1 SIGSTOPs of lapse + 3 s", "5"]], done.stdout


def test_agent_memory_prints_a_row_per_step():
    # benchmarks/agent_memory.py at 300 agents on a folder store: a row at 0 and every 100 agents.
    script = os.path.join(ROOT, "benchmarks", "agent_memory.py")
    done = subprocess.run([sys.executable, script, "--agents", "300", "--every", "100"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert rows == ["0", "100", "200", "300"], done.stdout

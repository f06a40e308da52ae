"""Every metric the programs export is documented (issue 29, item 13).

On eafe802 ``lnk_scheduler_requests_total`` was exported but named in no
doc.  The names are collected from the code that makes them (the registry's
counters, the families built per scrape), so a new metric without a row in
the README's table fails here.  Also: the README's bridge demo and the
scheduler's example config do not share a metrics port (both said 9464), and
a port in use is named in the error.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def exported_names() -> set[str]:
    import cloudstore.bridge.server  # noqa: F401  (its counter registers on import)
    import cloudstore.scheduling.log  # noqa: F401
    from cloudstore.runtime import metrics
    from cloudstore.scheduler import requests_sent
    from cloudstore.scheduling.reach import Reach

    names = set(metrics.REGISTRY.families())
    names |= set(requests_sent([]))
    names |= set(Reach().families())
    return names


def test_the_exporters_names_are_all_found_by_this_test() -> None:
    names = exported_names()
    code_names = set()
    for path in (ROOT / "cloudstore").rglob("*.py"):
        code_names |= set(re.findall(r'"(lnk_[a-z_]+(?:_total|_unreachable|_seconds))"', path.read_text()))
    assert code_names <= names, code_names - names
    assert {"lnk_scheduler_requests_total", "lnk_scheduler_store_unreachable"} <= names


def test_every_exported_metric_has_a_row_in_the_readme_table() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `(lnk_[a-z_]+)` \|", readme, re.M))
    missing = exported_names() - rows
    assert not missing, f"README's metrics table lacks {sorted(missing)}"
    scheduler_doc = (ROOT / "docs" / "scheduler.md").read_text()
    for name in exported_names():
        if name.startswith("lnk_scheduler_"):
            assert name in scheduler_doc, name


def test_the_readme_demo_and_the_scheduler_example_use_different_ports() -> None:
    readme = (ROOT / "README.md").read_text()
    bridge_ports = set(re.findall(r"--metrics-port (\d+)", readme))
    example_ports = set(re.findall(r'"metrics_port": (\d+)', (ROOT / "docs" / "scheduler.md").read_text()))
    from cloudstore.scheduling.config import EPILOG

    example_ports |= set(re.findall(r'"metrics_port": (\d+)', EPILOG))
    assert bridge_ports and example_ports and not bridge_ports & example_ports, (bridge_ports, example_ports)


def test_a_metrics_port_in_use_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "cloudstore.scheduler", "--agent", "a", "--driver", "lnk-bucket-store",
             "--driver-env", "LNK_BUCKET_URL=file:///", "--fire", "true", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert f"metrics port 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_bridge_metrics_port_in_use_is_named_not_blamed_on_its_socket(tmp_path: Path) -> None:
    import secrets

    (tmp_path / "h").mkdir()
    (tmp_path / "a").mkdir()
    key = tmp_path / "a.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(tmp_path / "h"), "--agent-id", "a",
             "--no-owner", "--key-file", str(key), "--agent-folder", str(tmp_path / "a"), "--driver",
             "lnk-bucket-store", "--driver-env", f"LNK_BUCKET_URL=file://{tmp_path}", "--metrics-port", str(port)],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr
    assert f"metrics port 127.0.0.1:{port}" in done.stderr and "--harness" not in done.stderr, done.stderr

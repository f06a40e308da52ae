"""The bridge's start-up errors name what to fix (issue 29, item 1).

A bridge whose ``--harness`` folder is missing used to stop with only
``ERROR cannot start: [Errno 2] No such file or directory`` (the socket's
bind names no path).  Now it names the folder and the flag, and exits 1
before starting any driver.  A bridge whose driver lacks its setting warns
at start (item 8) instead of starting silently.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path


def run_bridge(tmp_path: Path, harness: Path, setting: bool = True) -> subprocess.CompletedProcess:
    key = tmp_path / "a.key"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    folder = tmp_path / "agent"
    folder.mkdir()
    argv = [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a",
            "--no-owner", "--key-file", str(key), "--agent-folder", str(folder), "--driver", "lnk-bucket-store"]
    if setting:
        argv += ["--driver-env", f"LNK_BUCKET_URL=file://{tmp_path / 'store'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("LNK_BUCKET_URL", "LNK_GCS_URL")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)


def test_a_missing_harness_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-harness"
    done = run_bridge(tmp_path, missing)
    assert done.returncode == 1, done.stderr
    assert str(missing) in done.stderr and "--harness" in done.stderr and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_harness_that_is_a_file_is_named(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "harness"
    not_a_folder.write_text("")
    done = run_bridge(tmp_path, not_a_folder)
    assert done.returncode == 1, done.stderr
    assert str(not_a_folder) in done.stderr and "not a folder" in done.stderr


def test_a_bridge_whose_driver_has_no_setting_warns(tmp_path: Path) -> None:
    """Issue 29, item 8: it started silently, and every call then answered an error."""
    done = run_bridge(tmp_path, tmp_path / "no-such-harness", setting=False)
    assert "WARNING" in done.stderr and "LNK_BUCKET_URL" in done.stderr and "--driver-env" in done.stderr

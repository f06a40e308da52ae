"""Fail fast, naming what to fix (issue 29, items 8, 10 and 11).

* A runner asks each agent's store once at start-up.  A permanent
  misconfiguration (its driver's setting missing, a folder that does not
  exist, a bridge socket that is not there, a wrong key, a bucket that does
  not exist) exits 2 naming the agent and what to fix.  On eafe802 the
  runner started and logged ``store_error`` once a second forever, and for
  the missing socket said ``[Errno 2] No such file or directory (outcome
  unknown)``: a connect that failed sent nothing, so its outcome is known.
* The drivers' replies: no AWS credentials, a bucket that does not exist and
  a ``file://`` folder that does not exist are error replies naming the
  setting, with no traceback on stderr (on eafe802: ``internal error
  (NoCredentialsError...)`` and a traceback; ``internal error (NotFound:
  NoSuchBucket)``; a new empty store made silently).
* ``lnk-store-admin inspect`` refuses a folder that does not exist (and makes
  nothing), and says plainly when a store holds no agent, leaving it as it was.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import clean_env

REQUEST = json.dumps({"op": "last", "agent": {"id": "a", "owner": None}, "thread": "t"})




def runner(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    """A runner that should stop at start-up; the hang guard kills one that runs on instead."""
    return subprocess.run([sys.executable, "-m", "cloudstore.scheduler", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def assert_stopped_naming(done: subprocess.CompletedProcess, *needed: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    for text in needed:
        assert text in done.stderr, (text, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and '"event":"started"' not in done.stderr.replace(" ", "")
    assert "outcome unknown" not in done.stderr
    assert done.stdout == ""


def key_file(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short folder (a Unix socket's path has at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="ff-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# -- the runner's start-up check -----------------------------------------------


def test_runner_whose_driver_lacks_its_setting_exits_2(tmp_path: Path) -> None:
    done = runner(["--agent", "o:a", "--driver", "lnk-bucket-store", "--fire", "true"], clean_env())
    assert_stopped_naming(done, "agent 'a'", "LNK_BUCKET_URL is not set", "driver_env")


def test_runner_on_a_folder_that_does_not_exist_exits_2_and_makes_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    done = runner(["--agent", "a", "--driver", "lnk-bucket-store", "--driver-env",
                   f"LNK_BUCKET_URL=file://{typo}", "--fire", "true"], clean_env())
    assert_stopped_naming(done, "agent 'a'", "LNK_BUCKET_URL", "does not exist")
    assert not typo.exists()


def test_bridged_agent_without_its_socket_exits_2_and_nothing_is_outcome_unknown(tmp_path: Path) -> None:
    config = tmp_path / "runner.json"
    socket_path = tmp_path / "no-harness" / ".link-store.sock"
    config.write_text(json.dumps({
        "agents": [{"owner": "o", "id": "b", "bridge": str(socket_path), "key_file": str(key_file(tmp_path, "b.key"))}],
        "fire": ["true"],
    }))
    done = runner(["--config", str(config)], clean_env())
    assert_stopped_naming(done, "agent 'b'", str(socket_path), "nothing was sent", "lnk-store-bridge")


def test_bridged_agent_with_a_wrong_key_exits_2(short_dir: Path) -> None:
    harness, folder, store = short_dir / "h", short_dir / "b", short_dir / "store"
    for made in (harness, folder, store):
        made.mkdir()
    bridge = subprocess.Popen(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "b",
         "--agent-owner", "o", "--key-file", str(key_file(short_dir, "right.key")), "--agent-folder", str(folder),
         "--driver", "lnk-bucket-store", "--driver-env", f"LNK_BUCKET_URL=file://{store}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_env())
    try:
        socket_path = harness / ".link-store.sock"
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            assert bridge.poll() is None and time.monotonic() < deadline, "the bridge did not start"
            time.sleep(0.05)
        config = short_dir / "runner.json"
        config.write_text(json.dumps({
            "agents": [{"owner": "o", "id": "b", "bridge": str(socket_path),
                        "key_file": str(key_file(short_dir, "wrong.key"))}],
            "fire": ["true"],
        }))
        done = runner(["--config", str(config)], clean_env())
        assert_stopped_naming(done, "agent 'b'", "refused", "key_file")
    finally:
        bridge.terminate()
        bridge.wait(30)
        assert bridge.stderr is not None
        bridge.stderr.close()


def test_runner_on_a_bucket_that_does_not_exist_exits_2(moto_server) -> None:
    env = clean_env(**moto_server.env)
    env["LNK_BUCKET_URL"] = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p"
    done = runner(["--agent", "a", "--driver", "lnk-bucket-store", "--fire", "true"], env)
    assert_stopped_naming(done, "agent 'a'", "the bucket does not exist", "LNK_BUCKET_URL")


# -- the drivers' replies ------------------------------------------------------------


def call(env: dict[str, str]) -> tuple[dict, str]:
    done = subprocess.run(["lnk-bucket-store", "call"], input=REQUEST, capture_output=True, text=True, env=env,
                          timeout=90)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0]), done.stderr


def test_a_folder_that_does_not_exist_is_refused_not_made(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    reply, err = call(clean_env(LNK_BUCKET_URL=f"file://{typo}"))
    assert reply["reply"] == "error" and "LNK_BUCKET_URL" in reply["error"] and "does not exist" in reply["error"]
    assert str(tmp_path) not in reply["error"], "a reply never names the folder"
    assert not typo.exists() and "Traceback" not in err


def test_the_readme_way_still_works(tmp_path: Path) -> None:
    """The README makes the folder first (``mkdir -p``): then the store answers."""
    folder = tmp_path / "lnk-bucket"
    folder.mkdir()
    reply, _ = call(clean_env(LNK_BUCKET_URL=f"file://{folder}"))
    assert reply == {"reply": "last", "last": 0}


def test_no_aws_credentials_is_an_error_naming_the_settings_without_a_traceback(moto_server, tmp_path: Path) -> None:
    secrets_dropped = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    env = clean_env(**{k: v for k, v in moto_server.env.items() if k not in secrets_dropped})
    env.update({"LNK_BUCKET_URL": f"s3://{moto_server.bucket}/{uuid.uuid4().hex[:8]}",
                "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "AWS_CONFIG_FILE": str(tmp_path / "none"), "HOME": str(tmp_path)})
    reply, err = call(env)
    assert reply["reply"] == "error", reply
    for needed in ("LNK_BUCKET_URL", "no AWS credentials", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert needed in reply["error"], reply
    assert "internal error" not in reply["error"]
    assert "Traceback" not in err and len(err.splitlines()) <= 2, err


@pytest.mark.parametrize("request_", [REQUEST, json.dumps({"op": "append", "agent": {"id": "a", "owner": None},
                                                             "thread": "t", "seq": 1, "event": {"n": 1}})],
                         ids=["last", "append"])
def test_a_gcs_bucket_that_does_not_exist_is_an_error_naming_the_setting(gcs_server, request_: str) -> None:
    """fake-gcs-server's 404 of a missing bucket says only "Not Found": ``last`` answered 0 (its listing read
    as an empty store) and the first write an internal error naming the endpoint.  A listing or a create that
    404s is the bucket's (gcs.py ``_bucket_gone``), as GCS's own words say."""
    env = clean_env(**gcs_server.env)
    env["LNK_GCS_URL"] = f"gs://no-such-bucket-{uuid.uuid4().hex[:8]}/p"
    done = subprocess.run(["lnk-gcs", "call"], input=request_, capture_output=True, text=True, env=env, timeout=90)
    reply = json.loads(done.stdout)
    assert reply["reply"] == "error" and "the bucket does not exist" in reply["error"], reply
    assert "LNK_GCS_URL" in reply["error"] and "internal error" not in reply["error"], reply
    assert "no-such-bucket" not in reply["error"] and "127.0.0.1" not in reply["error"], reply
    assert "Traceback" not in done.stderr


def test_a_bucket_that_does_not_exist_is_an_error_naming_the_setting(moto_server) -> None:
    env = clean_env(**moto_server.env)
    env["LNK_BUCKET_URL"] = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p"
    reply, err = call(env)
    assert reply["reply"] == "error" and "the bucket does not exist" in reply["error"], reply
    assert "LNK_BUCKET_URL" in reply["error"] and "internal error" not in reply["error"]
    assert "no-such-bucket" not in reply["error"], "a reply never names the bucket"
    assert "Traceback" not in err


# -- lnk-store-admin inspect ---------------------------------------------------------


def admin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["lnk-store-admin", *args], capture_output=True, text=True, env=clean_env(), timeout=90)


def test_inspect_refuses_a_folder_that_does_not_exist_and_makes_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    done = admin("inspect", f"file://{typo}")
    assert done.returncode == 2 and "does not exist" in done.stderr, (done.returncode, done.stderr)
    assert not typo.exists() and "Traceback" not in done.stderr


def test_inspect_says_plainly_that_a_store_holds_no_agent_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = admin("inspect", f"file://{empty}")
    assert done.returncode == 0, done.stderr
    assert "holds no agent" in done.stderr
    assert list(empty.iterdir()) == [], "inspect left something behind"

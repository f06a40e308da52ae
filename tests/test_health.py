"""Health that means something (issue 46, item 1).

Before: a bridge whose driver setting named a folder that did not exist
started, logged INFO only, answered ``GET /metrics`` 200 and then answered
every call with an error; the probes asked ``/metrics`` only (``/healthz``
was a 404), and the systemd units were ``Type=simple``.  Now:

* the bridge asks its store once before it listens: a store it cannot open
  stops it with exit 2 and one line naming the setting, as the scheduler does;
* the metrics port answers ``/healthz`` (the loop alive) and ``/readyz``
  (the store answered lately), 200 or 503 with a JSON body saying why, from
  state the program keeps (``runtime.health``), also under the idle flood
  of tests/test_metrics_bounds.py, within the probes' timeout;
* both programs speak systemd's notify protocol (``runtime.sd_notify``).

Waits are on states (a datagram received, an answer changed) with hang
guards; the one time compared is the probe's own timeout, which is what
the kubelet holds the answer to.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import support
from support import wait_for
from test_deploy_files import k8s_probe_timeout
from test_metrics_bounds import IDLE, IdleConnections, drain, low_fd_limit, port_from, stop

from cloudstore.bridge import AgentSpec, Limits, StoreBridge
from cloudstore.bridge.proof import new_key_hex
from cloudstore.bridge.server import STORE
from cloudstore.bridge.store_check import CHECK_THREAD, StoreWatch, check, first_check
from cloudstore.runtime import sd_notify
from cloudstore.runtime.health import LIVE_PATH, READY_PATH, Health, permanent_error
from cloudstore.runtime.metrics.http import Exporter
from cloudstore.runtime.metrics.snapshots import Collector
from cloudstore.scheduler import DRIVER_SOURCE
from cloudstore.scheduling.reach import Reach
from cloudstore.scheduling.store_client import StoreCallError


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def body(answer: tuple[bool, bytes]) -> dict:
    return json.loads(answer[1])


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket's path must fit in 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="lhc", dir="/tmp") as path:
        yield Path(path)


@pytest.fixture
def idle() -> Iterator[IdleConnections]:
    """The metrics port's flood (tests/test_metrics_bounds.py): connections that never send a request."""
    with contextlib.closing(IdleConnections()) as made:
        yield made


def probe(port: int, path: str, timeout: float = 30.0) -> tuple[int, dict]:
    """GET ``path``: the status and the JSON body (200 and 503 alike)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as got:
            assert got.headers["Content-Type"] == "application/json"
            return got.status, json.loads(got.read())
    except urllib.error.HTTPError as exc:
        assert exc.headers["Content-Type"] == "application/json", exc.headers
        return exc.code, json.loads(exc.read())


# -- runtime.health: what the probes are told ------------------------------------------------


def test_liveness_is_the_loops_heartbeat_and_says_why_not() -> None:
    clock = Clock()
    health = Health("p", fresh_for=10, live_within=60, clock=clock)
    assert body(health.live()) == {"ok": False, "program": "p", "why": "starting: the loop has not turned yet"}
    health.beat()
    clock.now += 60
    assert health.live()[0] is True
    clock.now += 1
    ok, said = health.live()
    assert ok is False and "has not turned for 61 s" in body((ok, said))["why"]
    health.beat()
    assert health.live()[0] is True
    health.alive_by(lambda: "the gate failed")  # a loop the program cannot beat from: its own check
    assert body(health.live())["why"] == "the gate failed"


def test_readiness_is_every_source_answered_lately_and_a_store_outage_is_not_a_liveness_failure() -> None:
    clock = Clock()
    health = Health("p", fresh_for=10, live_within=60, clock=clock)
    assert body(health.ready())["why"] == "starting: no store checked yet"
    health.expect("driver")
    health.expect("bridge /h/s")
    said = body(health.ready())
    assert said["ok"] is False and said["checks"]["driver"] == {"ok": False, "age_s": None, "why": "not reached yet"}
    health.note("driver", True)
    health.note("bridge /h/s", True)
    assert health.ready()[0] is True
    health.beat()
    health.note("driver", False, "the store kept failing (put: EndpointConnectionError); outcome unknown")
    said = body(health.ready())
    assert said["ok"] is False and "driver: the store kept failing" in said["why"]
    assert said["checks"]["bridge /h/s"]["ok"] is True
    assert health.live()[0] is True, "restarting would not bring the store back"
    health.note("driver", True)
    clock.now += 10.5
    health.beat()
    said = body(health.ready())
    assert said["ok"] is False and "not reached for 10.5 s" in said["checks"]["driver"]["why"]
    health.note("driver", True)
    health.note("bridge /h/s", True)
    assert health.ready()[0] is True
    health.stopping()
    assert body(health.ready())["why"] == "stopping" and health.live()[0] is True
    health.note("x", False, "y" * 10_000)
    assert len(body(health.ready())["why"]) <= 200, "an error reply's length is not the probe's"


def test_a_setting_or_a_refusal_is_permanent_anything_else_is_waited_out() -> None:
    assert permanent_error("LNK_BUCKET_URL is not set: it must be a URL") == "fix the setting"
    assert permanent_error("the store refused the request (NoSuchBucket)") == "check the credentials and the bucket"
    assert permanent_error("the store kept failing (put: EndpointConnectionError); outcome unknown") is None


def test_the_schedulers_reach_notes_each_client_in_its_readiness() -> None:
    class Client:
        def __init__(self) -> None:
            self.fail: str | None = None

        def request(self, request: dict) -> dict:
            if self.fail == "raise":
                raise StoreCallError("the driver died")
            if self.fail:
                return {"reply": "error", "error": self.fail}
            return {"reply": "mark", "mark": None}

        def close(self) -> None:
            pass

    health = Health("lnk-cloud-scheduler", fresh_for=10)
    reach = Reach(health)
    inner = Client()
    watched = reach.watch(inner, "driver")
    assert body(health.ready())["checks"]["driver"]["why"] == "not reached yet"
    agent = {"owner": None, "id": "a"}
    watched.request({"op": "job_mark", "agent": agent})
    assert health.ready()[0] is True
    inner.fail = "the store kept failing (list: timeout); outcome unknown"
    watched.request({"op": "job_mark", "agent": agent})
    assert "driver: the store kept failing" in body(health.ready())["why"]
    inner.fail = "raise"
    with pytest.raises(StoreCallError):
        watched.request({"op": "job_mark", "agent": agent})
    assert "driver: the driver died" in body(health.ready())["why"]
    inner.fail = None
    watched.request({"op": "job_mark", "agent": agent})
    assert health.ready()[0] is True


# -- the exporter's routes -----------------------------------------------------------------------


def test_the_metrics_port_answers_the_probes_200_or_503_with_a_reason() -> None:
    health = Health("p", fresh_for=60)
    health.expect(STORE)
    exporter = Exporter(Collector(None), ("127.0.0.1", 0), health=health).start()
    try:
        assert exporter.address is not None
        port = exporter.address[1]
        assert probe(port, LIVE_PATH) == (503, {"ok": False, "program": "p",
                                                "why": "starting: the loop has not turned yet"})
        status, said = probe(port, READY_PATH)
        assert status == 503 and said["checks"]["store"]["why"] == "not reached yet"
        health.beat()
        health.note(STORE, True)
        assert probe(port, LIVE_PATH)[0] == 200
        assert probe(port, READY_PATH + "?verbose=1")[0] == 200
        health.note(STORE, False, "LNK_BUCKET_URL is not set")
        assert probe(port, READY_PATH) == (503, {"ok": False, "program": "p", "why": "store: LNK_BUCKET_URL is not set",
                                                 "checks": {"store": {"ok": False, "age_s": 0.0,
                                                                      "why": "LNK_BUCKET_URL is not set"}}})
        head = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        head.request("HEAD", LIVE_PATH)
        got = head.getresponse()
        assert got.status == 200 and got.read() == b"" and got.headers["Content-Type"] == "application/json"
        head.close()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30)
        assert err.value.code == 404 and b"/healthz and /readyz" in err.value.read()
    finally:
        exporter.stop()


def test_probes_are_answered_within_the_k8s_timeout_under_an_idle_flood(idle) -> None:
    """The metrics port's flood (tests/test_metrics_bounds.py), then each probe, held to the kubelet's timeout."""
    timeout = k8s_probe_timeout()
    health = Health("p", fresh_for=60)
    health.beat()
    health.note(STORE, True)
    exporter = Exporter(Collector(None), ("127.0.0.1", 0), health=health).start()
    try:
        assert exporter.address is not None
        port = exporter.address[1]
        idle.open(port, IDLE)
        assert probe(port, LIVE_PATH, timeout)[0] == 200
        assert probe(port, READY_PATH, timeout)[0] == 200
        assert exporter.held() <= exporter.max_connections
    finally:
        exporter.stop()


# -- the bridge ---------------------------------------------------------------------------------

# A driver whose store the test breaks and mends: a file FAIL holding the error it answers.
SCRIPTED_DRIVER = textwrap.dedent('''
    import json, os, sys
    if sys.argv[1:] == ["contract"]:
        print(json.dumps({"version": 1, "serve": True}))
        sys.exit(0)
    fail = os.environ["FAIL_FILE"]
    for line in sys.stdin:
        request = json.loads(line)
        with open(os.environ["ASKED_FILE"], "a") as f:
            f.write(json.dumps(request) + "\\n")
        if os.path.exists(fail):
            with open(fail) as f:
                print(json.dumps({"reply": "error", "error": f.read()}), flush=True)
        else:
            print(json.dumps({"reply": "last", "last": 0}), flush=True)
''')


class ScriptedBridge:
    def __init__(self, root: Path) -> None:
        self.fail = root / "fail"
        self.asked = root / "asked"
        driver = root / "driver.py"
        driver.write_text(SCRIPTED_DRIVER)
        folder = root / "agent"
        (folder / "chats").mkdir(parents=True)
        (root / "h").mkdir()
        spec = AgentSpec(owner="o", id="a", key=bytes.fromhex(new_key_hex()), folder=str(folder))
        env = {"FAIL_FILE": str(self.fail), "ASKED_FILE": str(self.asked)}
        self.bridge = StoreBridge(root / "h", [spec], [sys.executable, str(driver)], env, Limits(call_timeout=60))
        self.health = Health("lnk-store-bridge", fresh_for=60)
        self.health.expect(STORE)
        self.bridge.health = self.health

    def asked_count(self) -> int:
        return len(self.asked.read_text().splitlines()) if self.asked.exists() else 0


def test_the_bridges_own_question_is_a_read_of_a_thread_no_agent_writes(short_dir: Path) -> None:
    rig = ScriptedBridge(short_dir)
    rig.bridge.open_drivers()
    try:
        assert check(rig.bridge) is None
        asked = json.loads(rig.asked.read_text().splitlines()[0])
        assert asked == {"op": "last", "agent": {"owner": "o", "id": "a"}, "thread": CHECK_THREAD}
        rig.fail.write_text("LNK_BUCKET_URL is not set: it must be a URL (s3:// or file://...)")
        found = check(rig.bridge)
        assert found is not None and found.fix is not None and "LNK_BUCKET_URL is not set" in found.problem
        assert "--driver-env" in found.fix
        rig.fail.write_text("the store kept failing (put: EndpointConnectionError); outcome unknown")
        found = first_check(rig.bridge, rig.health)
        assert found is None, "a store failing for now does not stop the bridge"
        assert "the store kept failing" in body(rig.health.ready())["why"]
    finally:
        rig.bridge.stop()


def test_an_idle_bridges_readiness_follows_its_store_through_its_own_check(short_dir: Path) -> None:
    rig = ScriptedBridge(short_dir)
    rig.bridge.open_drivers()
    assert first_check(rig.bridge, rig.health) is None
    rig.bridge.start()
    watch = StoreWatch(rig.bridge, rig.health, every=0.05).start()
    try:
        assert rig.health.ready()[0] is True
        rig.fail.write_text("the store kept failing (get: ReadTimeoutError); outcome unknown")
        wait_for(lambda: not rig.health.ready()[0], 60, "the check to find the store failing")
        assert "store: the driver answered: the store kept failing" in body(rig.health.ready())["why"]
        rig.fail.unlink()
        wait_for(lambda: rig.health.ready()[0], 60, "the check to find the store answering again")
    finally:
        watch.stop()
        rig.bridge.stop()


def test_a_proved_calls_usable_reply_makes_the_bridge_ready(short_dir: Path) -> None:
    from cloudstore.bridge import BridgeClient

    rig = ScriptedBridge(short_dir)
    rig.bridge.start()
    try:
        rig.health.note(STORE, False, "the store kept failing")
        spec = next(iter(rig.bridge.agents.values()))
        client = BridgeClient(rig.bridge.socket_path, spec.owner, spec.id, spec.key, timeout=60)
        rig.fail.write_text("not found: no such thread")
        assert client.op("last", thread="t")["reply"] == "error"
        assert rig.health.ready()[0] is False, "an error reply says nothing of the store's health"
        rig.fail.unlink()
        assert client.op("last", thread="t") == {"reply": "last", "last": 0}
        assert rig.health.ready()[0] is True
    finally:
        rig.bridge.stop()


def bridge_argv(root: Path, store_url: str | None, *extra: str) -> list[str]:
    key = root / "k"
    key.write_text(secrets.token_hex(32) + "\n")
    key.chmod(0o600)
    (root / "a").mkdir(exist_ok=True)
    (root / "h").mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(root / "h"), "--agent-id", "a",
            "--no-owner", "--key-file", str(key), "--agent-folder", str(root / "a"), "--driver", "lnk-bucket-store",
            *extra]
    return argv + ([f"--driver-env=LNK_BUCKET_URL={store_url}"] if store_url is not None else [])


def clean_env(**more: str) -> dict[str, str]:
    """No store setting or credentials (``support.clean_env``), no log format and no systemd, plus ``more``."""
    env = support.clean_env()
    for name in ("LNK_LOG_FORMAT", sd_notify.NOTIFY_SOCKET, sd_notify.WATCHDOG_USEC, sd_notify.WATCHDOG_PID):
        env.pop(name, None)
    return {**env, **more}


def refused_at_start(root: Path, url: str | None, env: dict[str, str]) -> str:
    """The bridge on ``url`` (None: no setting) stops before listening with exit 2: its one error line."""
    done = subprocess.run(bridge_argv(root, url, "--metrics-port", "0"), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert done.returncode == 2, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("lnk-store-bridge: ERROR")]
    assert len(ours) == 1, done.stderr
    assert "cannot start" in ours[0] and "LNK_BUCKET_URL" in ours[0] and "--driver-env" in ours[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (root / "h" / ".link-store.sock").exists(), "it never listened"
    return ours[0]


def test_a_bridge_refuses_a_bucket_that_does_not_exist_at_start_with_exit_2(short_dir: Path, moto_server) -> None:
    env = clean_env(**moto_server.env)
    line = refused_at_start(short_dir, f"s3://no-such-bucket-{secrets.token_hex(4)}/p", env)
    assert "the bucket does not exist" in line and "no-such-bucket" not in line, line


@pytest.mark.parametrize("store", ["missing folder", "no setting"])
def test_a_bridge_refuses_a_store_it_cannot_open_at_start_with_exit_2(short_dir: Path, store: str) -> None:
    """Before: it started, answered /metrics 200, and every call then answered the error."""
    url = f"file://{short_dir / 'no-such-store'}" if store == "missing folder" else None
    line = refused_at_start(short_dir, url, clean_env())
    if store == "missing folder":  # deploy/README.md, "Health", shows this very line
        readme = (Path(__file__).parent.parent / "deploy" / "README.md").read_text()
        assert f"\n    {line}\n" in readme, line
    assert not (short_dir / "no-such-store").exists(), "nothing made"


def test_a_bridge_whose_driver_program_is_not_there_exits_2(short_dir: Path) -> None:
    """A typo in --driver is a config error no restart mends: exit 2 (not restarted under systemd,
    ``RestartPreventExitStatus=2``), where it was exit 1 and five restarts; nothing listens."""
    argv = [a if a != "lnk-bucket-store" else "lnk-bucket-stor" for a in bridge_argv(short_dir, None)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env=clean_env())
    assert done.returncode == 2, done.stderr
    assert "cannot start" in done.stderr and "lnk-bucket-stor" in done.stderr and "Traceback" not in done.stderr
    assert not (short_dir / "h" / ".link-store.sock").exists(), "it never listened"


class NotifySocket:
    """systemd's side of NOTIFY_SOCKET: a Unix datagram socket the test reads."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(120)

    def next(self) -> str:
        return self.sock.recv(4096).decode("utf-8")

    def until(self, line: str) -> list[str]:
        """Every datagram up to one holding ``line`` (it included)."""
        got = []
        while True:
            got.append(self.next())
            if line in got[-1].split("\n"):
                return got

    def close(self) -> None:
        self.sock.close()


def serves_probes_and_stops(proc: subprocess.Popen, notify: NotifySocket, port: int, idle: IdleConnections,
                            program: str, source: str) -> None:
    """A started program (READY=1 received) pings the watchdog, answers both probes, also under the metrics
    port's idle flood (tests/test_metrics_bounds.py) within the k8s probes' timeout; SIGTERM: STOPPING=1."""
    assert notify.until("WATCHDOG=1")
    assert probe(port, LIVE_PATH) == (200, {"ok": True, "program": program, "why": "alive"})
    status, said = probe(port, READY_PATH)
    assert status == 200 and said["checks"][source]["ok"] is True
    timeout = k8s_probe_timeout()
    idle.open(port, IDLE)
    assert probe(port, LIVE_PATH, timeout)[0] == 200
    assert probe(port, READY_PATH, timeout)[0] == 200
    proc.send_signal(signal.SIGTERM)
    assert notify.until("STOPPING=1")
    proc.wait(timeout=60)  # a second SIGTERM would kill the scheduler at once (its second-signal rule)


def test_a_bridge_is_ready_and_live_on_its_metrics_port_and_tells_systemd(short_dir: Path, idle) -> None:
    """READY=1 once its socket is served; WATCHDOG=1 pings; the probes under the metrics port's idle flood
    (same fd limit and connection count as tests/test_metrics_bounds.py) within the k8s probes' timeout."""
    (short_dir / "store").mkdir()
    notify = NotifySocket(short_dir / "notify")
    proc = subprocess.Popen(
        bridge_argv(short_dir, f"file://{short_dir / 'store'}", "--metrics-port", "0", "--log-format", "json"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=low_fd_limit,
        env=clean_env(NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="200000"))
    try:
        assert proc.stderr is not None
        port = port_from(proc.stderr, "metrics_port")
        drain(proc.stderr)
        ready = notify.until("READY=1")
        assert (short_dir / "h" / ".link-store.sock").exists(), "READY=1 before the socket was served"
        assert any(line.startswith("STATUS=serving 1 agent(s)") for line in ready[-1].split("\n"))
        serves_probes_and_stops(proc, notify, port, idle, "lnk-store-bridge", STORE)
    finally:
        stop(proc)
        notify.close()
    assert proc.returncode == 0


def test_an_unusable_notify_socket_is_ignored_with_a_warning_naming_it(short_dir: Path) -> None:
    (short_dir / "store").mkdir()
    proc = subprocess.Popen(
        bridge_argv(short_dir, f"file://{short_dir / 'store'}", "--metrics-port", "0", "--log-format", "json"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env=clean_env(NOTIFY_SOCKET="relative/notify"))
    try:
        assert proc.stderr is not None
        warning = None
        while warning is None:
            line = proc.stderr.readline()
            assert line, "the bridge ended"
            record = json.loads(line)
            if "NOTIFY_SOCKET" in record["message"]:
                warning = record
        assert warning["level"] == "WARNING" and "'relative/notify'" in warning["message"]
        assert "absolute path or @name" in warning["message"]
        port = port_from(proc.stderr, "metrics_port")
        drain(proc.stderr)
        wait_for(lambda: probe(port, READY_PATH)[0] == 200, 60, "the bridge to be ready all the same")
    finally:
        stop(proc)
    assert proc.returncode == 0


# -- the scheduler ------------------------------------------------------------------------------


def test_a_scheduler_is_ready_and_live_on_its_metrics_port_and_tells_systemd(short_dir: Path, idle) -> None:
    (short_dir / "bucket").mkdir()
    config = short_dir / "scheduler.json"
    config.write_text(json.dumps({
        "agents": [{"owner": None, "id": "a"}], "driver": "lnk-bucket-store",
        "driver_env": {"LNK_BUCKET_URL": f"file://{short_dir / 'bucket'}"}, "fire": ["/bin/true"],
        "poll_interval": 0.5, "metrics_port": 0,
    }))
    notify = NotifySocket(short_dir / "notify")
    runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              preexec_fn=low_fd_limit,
                              env=clean_env(NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="200000"))
    try:
        assert runner.stderr is not None
        port = port_from(runner.stderr, "port")
        drain(runner.stderr)
        assert notify.until("READY=1")
        serves_probes_and_stops(runner, notify, port, idle, "lnk-cloud-scheduler", DRIVER_SOURCE)
    finally:
        stop(runner)
        notify.close()
    assert runner.returncode == 0


def test_the_runner_beats_while_it_waits_for_a_worker() -> None:
    """A runner whose workers all run long fires is alive: it claims as soon as one ends."""
    from cloudstore.scheduling.runner import Runner, Timing

    clock = Clock()
    health = Health("lnk-cloud-scheduler", fresh_for=10, live_within=Timing().live_within, clock=clock)
    runner = Runner.__new__(Runner)  # only the stop flag and the health: no store, no listener
    runner.health = health
    runner._stop = __import__("threading").Event()
    assert runner._stopping() is False
    assert health.live()[0] is True
    clock.now += Timing().live_within + 1
    assert health.live()[0] is False
    runner._stopping()
    assert health.live()[0] is True


# -- runtime.sd_notify ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, rule", [
    ("", "is empty"),
    ("relative/path", "absolute path or @name"),
    ("vsock:2:1234", "absolute path or @name"),
    ("/" + "x" * 200, "longer than a Unix socket address"),
    ("/a\0b", "NUL"),
    ("@", "names no abstract socket"),
])
def test_notify_socket_values_that_cannot_be_used_are_refused_by_rule(value: str, rule: str, caplog) -> None:
    env = {sd_notify.NOTIFY_SOCKET: value}
    with caplog.at_level(logging.WARNING, logger="cloudstore.runtime.sd_notify"):
        assert sd_notify.Notifier.from_env(env) is None
    assert any("NOTIFY_SOCKET" in r.getMessage() and rule in r.getMessage() for r in caplog.records), caplog.text
    assert env == {}, "read once, then unset: the drivers and fire commands do not speak for the unit"


def test_notify_sends_datagrams_to_a_path_or_an_abstract_socket(short_dir: Path) -> None:
    listening = NotifySocket(short_dir / "n")
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"lnk-test-{secrets.token_hex(6)}"
    abstract.bind("\0" + name)
    abstract.settimeout(60)
    try:
        env = {sd_notify.NOTIFY_SOCKET: listening.path, sd_notify.WATCHDOG_USEC: "5000000"}
        notifier = sd_notify.Notifier.from_env(env)
        assert notifier is not None and notifier.watchdog == 5.0 and env == {}
        assert notifier.ready("serving")
        assert listening.next() == "READY=1\nSTATUS=serving"
        other = sd_notify.Notifier.from_env({sd_notify.NOTIFY_SOCKET: "@" + name})
        assert other is not None and other.stopping()
        assert abstract.recv(100) == b"STOPPING=1"
    finally:
        listening.close()
        abstract.close()


def test_watchdog_settings_not_ours_or_malformed_send_no_pings(caplog) -> None:
    assert sd_notify.watchdog_seconds({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0
    assert sd_notify.watchdog_seconds({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None
    with caplog.at_level(logging.WARNING, logger="cloudstore.runtime.sd_notify"):
        assert sd_notify.watchdog_seconds({"WATCHDOG_USEC": "-5"}) is None
        assert sd_notify.watchdog_seconds({"WATCHDOG_USEC": "0"}) is None
    assert sum("WATCHDOG_USEC" in r.getMessage() for r in caplog.records) == 2


def test_a_gone_notify_socket_is_warned_once_never_raised(short_dir: Path, caplog) -> None:
    notifier = sd_notify.Notifier(str(short_dir / "nobody-listens"))
    with caplog.at_level(logging.WARNING, logger="cloudstore.runtime.sd_notify"):
        assert notifier.send("WATCHDOG=1") is False
        assert notifier.send("WATCHDOG=1") is False
    assert sum("cannot notify systemd" in r.getMessage() for r in caplog.records) == 1


def test_a_notify_socket_that_reads_nothing_does_not_hang_the_sender(short_dir: Path, monkeypatch, caplog) -> None:
    """A receiver whose queue is full (it never reads) blocked a datagram's send for ever: the start's
    ``READY=1`` in the main thread would hang the program.  The send gives up after ``SEND_TIMEOUT`` s,
    warned, never raised."""
    path = str(short_dir / "full")
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(path)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    try:
        with pytest.raises(BlockingIOError):  # the receiver's queue, filled until it takes no more
            for _ in range(100_000):
                filler.sendto(b"WATCHDOG=1", path)
        monkeypatch.setattr(sd_notify, "SEND_TIMEOUT", 0.2)
        with caplog.at_level(logging.WARNING, logger="cloudstore.runtime.sd_notify"):
            assert sd_notify.Notifier(path).ready("serving") is False
        assert any("cannot notify systemd" in r.getMessage() for r in caplog.records)
    finally:
        filler.close()
        deaf.close()


def test_the_watchdog_pings_only_while_the_loop_is_alive(short_dir: Path) -> None:
    listening = NotifySocket(short_dir / "n")
    asked: list[bool] = []
    alive = [False]

    def is_alive() -> bool:
        asked.append(alive[0])
        return alive[0]

    watchdog = sd_notify.Watchdog(sd_notify.Notifier(listening.path, watchdog=0.02), is_alive).start()
    try:
        wait_for(lambda: len(asked) >= 3, 60, "three turns of the watchdog")
        listening.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            listening.sock.recv(100)  # dead: no ping sent in those turns
        listening.sock.setblocking(True)
        alive[0] = True
        assert listening.next() == "WATCHDOG=1"
    finally:
        watchdog.stop()
        listening.close()

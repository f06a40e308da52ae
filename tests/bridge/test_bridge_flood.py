"""Callers who prove nothing cannot starve the bridge (issue 12, "Bridge").

Each test waits on states (connections held by the gate, bytes held in the
budget), never on how fast the bridge is; time appears only as hang guards,
and once as an upper bound on how often a failing ``accept`` is retried,
which a busy machine can only make smaller.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_helpers import FAKE_DRIVER, error_word, wait_for

from cloudstore.bridge import SOCKET_NAME, AgentSpec, BridgeClient, Limits, exchange
from cloudstore.bridge.limits import MiB
from cloudstore.bridge.proof import new_key_hex

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "lnk-store-bridge.service"


def connect(path: str, send: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(path)
    if send:
        sock.sendall(send)
    return sock


class Idle:
    """Connections that never prove anything, closed at the end of the test."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []

    def open(self, path: str, count: int, send: bytes = b"") -> list[socket.socket]:
        made = [connect(path, send) for _ in range(count)]
        self.socks += made
        return made

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


@pytest.fixture
def idle() -> Iterator[Idle]:
    made = Idle()
    yield made
    made.close()


def read_all(sock: socket.socket) -> bytes:
    """Everything the bridge sends until it closes (a reset counts as closed)."""
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


# -- a flood of unproved connections ----------------------------------------------


def test_many_idle_unproved_connections_do_not_make_a_proved_call_busy(rig, idle):
    """Before: 64 idle connections filled ``max_pending`` and every proved call was busy."""
    r = rig()
    idle.open(r.socket_path, 100, b'{"agent": ')  # a slow caller: part of a line, then nothing
    wait_for(lambda: r.bridge.gate.held() == 100, what="the gate to hold 100 connections")
    for _ in range(5):
        assert r.client().op("last", thread="t")["reply"] == "done"
    assert r.bridge.gate.evicted == 0


def test_past_the_most_held_the_oldest_are_evicted_and_a_proved_call_is_answered(rig, idle):
    r = rig(limits=Limits(max_pending=8))
    oldest = idle.open(r.socket_path, 1, b"{")[0]
    wait_for(lambda: r.bridge.gate.held() == 1, what="the first connection to be held")
    idle.open(r.socket_path, 30, b"{")
    wait_for(lambda: r.bridge.gate.accepted >= 31, what="31 connections accepted")
    assert r.bridge.gate.held() <= 8
    assert r.bridge.gate.evicted >= 23
    said = read_all(oldest)  # the oldest was dropped, told why
    assert error_word(json.loads(said.split(b"\n")[0])) == "busy", said
    assert r.client().op("last", thread="t")["reply"] == "done"  # the newest connection, proved at once


def test_many_connections_make_no_threads_and_calls_use_a_bounded_pool(rig, idle):
    """Before: a thread per connection, 2,653 of them under a flood."""
    r = rig(agents=[("o", "a1"), ("o", "a2")], limits=Limits(max_calls=4, max_calls_per_agent=4))
    assert r.client().op("last", thread="t")["reply"] == "done"
    before = threading.active_count()
    idle.open(r.socket_path, 300)
    wait_for(lambda: r.bridge.gate.held() == 300, what="the gate to hold 300 connections")
    assert threading.active_count() <= before
    # Many proved calls at once: each waits at the gate in the fake driver; at most 4 threads run them.
    results: list[dict] = []
    callers = [threading.Thread(target=lambda i=i: results.append(r.client(i % 2).op("last", thread="gate")))
               for i in range(12)]
    for t in callers:
        t.start()
    wait_for(lambda: len(results) >= 8, what="the calls past the four slots to be answered busy")
    assert r.bridge.workers.threads() <= 4
    r.open_gate()
    for t in callers:
        t.join(60)
    assert sorted(x["reply"] for x in results) == ["done"] * 4 + ["error"] * 8
    assert r.bridge.workers.threads() <= 4


def test_a_thread_that_cannot_start_costs_one_busy_call_and_the_gate_goes_on(rig, monkeypatch):
    """Before: RuntimeError("can't start new thread") left the accept loop for good."""
    r = rig()
    failures = []

    def no_thread(thread: threading.Thread) -> None:
        failures.append(thread)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(r.bridge.workers, "_start_thread", no_thread)
    reply = r.client().op("last", thread="t")
    assert error_word(reply) == "busy" and "thread" in reply["error"], reply
    assert failures and r.bridge.slots.under_way() == 0
    monkeypatch.undo()
    assert r.client().op("last", thread="t")["reply"] == "done"
    assert r.bridge._accepter.is_alive()


def test_accept_at_the_fd_limit_evicts_then_pauses_never_spins(rig, idle, monkeypatch, caplog):
    """Before: EMFILE on accept was retried at once, forever (220,066 warnings in seconds)."""
    caplog.set_level(logging.WARNING, logger="cloudstore.bridge")
    r = rig()
    gate = r.bridge.gate
    idle.open(r.socket_path, 20, b"{")
    wait_for(lambda: gate.held() == 20, what="20 connections held")
    calls = []
    real_accept = gate._accept

    def emfile() -> tuple[socket.socket, object]:
        calls.append(time.monotonic())
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(gate, "_accept", emfile)
    waiting = idle.open(r.socket_path, 1)[0]  # stays in the backlog: the listener stays readable
    wait_for(lambda: gate.held() == 0, what="the oldest connections to be evicted to free descriptors")
    time.sleep(1.0)
    assert 1 <= len(calls) < 100, len(calls)  # paused between tries: a spin makes ~10^5 in a second
    accept_lines = [rec for rec in caplog.records if "accept failed" in rec.getMessage()]
    assert 1 <= len(accept_lines) <= 2  # one line per 10 s, whatever the count
    monkeypatch.setattr(gate, "_accept", real_accept)
    wait_for(lambda: gate.held() >= 1, what="the waiting connection to be accepted after the pause")
    assert r.client().op("last", thread="t")["reply"] == "done"
    waiting.close()
    assert r.bridge._accepter.is_alive()


def test_low_fd_limit_is_logged_and_a_flood_past_it_does_not_lock_out_a_proved_call(short_dir, idle):
    """A real bridge process with RLIMIT_NOFILE 128, flooded with 300 connections."""
    harness, folder = short_dir / "h", short_dir / "a"
    harness.mkdir()
    (folder / "chats").mkdir(parents=True)
    key_hex = new_key_hex()
    key_file = short_dir / "k"
    key_file.write_text(key_hex + "\n")
    key_file.chmod(0o600)

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudstore.bridge.cli", "--harness", str(harness), "--agent-id", "a",
         "--no-owner", "--key-file", str(key_file), "--agent-folder", str(folder),
         "--driver", shlex.join(FAKE_DRIVER), "--request-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=low_limit,
    )
    try:
        sock = str(harness / SOCKET_NAME)
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, what="the bridge's socket")
        idle.open(sock, 300, b"{")
        client = BridgeClient(sock, None, "a", bytes.fromhex(key_hex), timeout=60)
        for _ in range(3):
            assert client.op("last", thread="t")["reply"] == "done"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    held = re.search(rb"file descriptors: limit 128 \(hard 128\), \d+ open; holding at most (\d+)", err)
    assert held, err
    assert 8 <= int(held.group(1)) < 128


def test_the_systemd_unit_raises_the_fd_limit():
    text = UNIT.read_text()
    (value,) = re.findall(r"^LimitNOFILE=(\d+)$", text, re.M)
    assert int(value) >= Limits().max_pending + 512


# -- proof lines ----------------------------------------------------------------


def test_proof_line_over_its_bound_is_refused_at_once_not_read_to_the_end(rig):
    """Before: a proof line could be 1 MiB, read to its end or to the 5 s deadline."""
    r = rig(limits=Limits(request_timeout=120.0))
    bound = r.bridge.proof_bound
    assert bound == 4096
    with connect(r.socket_path, b"x" * (bound + 1)) as sock:  # no newline, and the caller waits
        said = read_all(sock)
    reply = json.loads(said.split(b"\n")[0])
    assert error_word(reply) == "refused" and f"over {bound} bytes" in reply["error"], reply


def test_a_proof_line_of_a_few_hundred_bytes_fits_and_a_long_served_name_raises_the_bound(rig):
    r = rig()
    assert len(r.client().proof) < 400
    long_id = "\x01" * 3000  # sent as \u0001: 18,000 bytes of proof line
    key = bytes.fromhex(new_key_hex())
    r.bridge.add_agent(AgentSpec("o", long_id, key, r.agents[0].folder))
    client = BridgeClient(r.socket_path, "o", long_id, key, timeout=60)
    assert len(client.proof) > 18000
    assert r.bridge.proof_bound >= len(client.proof)
    assert client.op("last", thread="t")["reply"] == "done"


# -- the request budget -----------------------------------------------------------


def request_with(event_body: bytes) -> bytes:
    return b'{"op": "append", "agent": {"id": "a1", "owner": "o1"}, "thread": "t", "event": {"seq": 1, "x": ' \
        + event_body + b"}}"


def test_a_request_too_costly_to_parse_is_refused_before_it_is_parsed(rig):
    """Before: a 16 MiB line of tiny JSON values cost ~400 MiB to parse, four at once 1.7 GiB."""
    r = rig()
    c = r.client()
    line = request_with(b"[" + b"{}," * (16 * MiB // 3 - 40) + b"{}]")
    assert len(line) < 16 * MiB
    reply = json.loads(exchange(r.socket_path, [c.proof, line], timeout=120))
    assert error_word(reply) == "refused" and "MiB to check" in reply["error"], reply
    # A large request of few values (a big string) is answered.
    big = request_with(b'"' + b"x" * (12 * MiB) + b'"')
    assert json.loads(exchange(r.socket_path, [c.proof, big], timeout=120))["reply"] == "done"
    assert [x["thread"] for x in r.records()] == ["t"]
    wait_for(lambda: r.bridge.budget.used == 0, what="the budget to be given back")


def test_requests_past_the_budget_at_once_are_busy_and_answered_once_it_frees(rig):
    r = rig(limits=Limits(request_budget_bytes=4 * MiB, request_timeout=120.0))
    c = r.client()
    hog = connect(r.socket_path, c.proof + b"\n" + b'{"pad": "' + b"y" * (3 * MiB // 2))  # no end yet
    wait_for(lambda: r.bridge.budget.used >= 3 * MiB, what="the first request's bytes to be held")
    line = request_with(b'"' + b"x" * MiB + b'"')
    reply = json.loads(exchange(r.socket_path, [c.proof, line], timeout=120))
    assert error_word(reply) == "busy" and "budget" in reply["error"], reply
    hog.close()  # its line ends at EOF, is refused, and its bytes are given back
    wait_for(lambda: r.bridge.budget.used == 0, what="the budget to be given back")
    assert json.loads(exchange(r.socket_path, [c.proof, line], timeout=120))["reply"] == "done"


def test_fd_limit_is_logged_at_start(rig, caplog):
    caplog.set_level(logging.INFO, logger="cloudstore.bridge")
    r = rig()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    (line,) = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("file descriptors")]
    assert f"limit {soft} " in line or soft == resource.RLIM_INFINITY
    assert f"at most {r.bridge.gate.most} connections" in line

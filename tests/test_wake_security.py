"""The wake folder is not a broadcast to every local user (issue 25, items 5 and 6).

"Another local user" is a child process that drops to an unused uid/gid
(``STRANGER``) before doing anything; the tests need root to make one (CI
runs as root) and skip, saying so, otherwise.

* A job's name goes only to sockets owned by the sender's own user or root,
  in a folder the sender can trust: a socket the stranger bound in a shared
  sticky folder, or reaches through a symbolic link there, gets an empty
  datagram or nothing, never the name; nor does any socket in a folder the
  stranger owns.
* A runner uses a wake folder only when it is owned by root or its own user
  (and sticky when others may write in it): a folder the stranger owns, or
  one anyone may write in without the sticky bit, is refused (no socket, a
  ``wake_refused`` event once, ``nudges: false`` when it starts).  A folder a
  runner makes is not world-writable.
* A stranger's nudges at most bring a runner's next poll forward once a
  ``poll_interval``: seconds of a flood of empty datagrams cost a real
  runner (a file:// store, its own driver) about one extra ``job_due`` a
  poll interval, counted at its driver's client, not tens of them; our own
  user's nudge still wakes it at once, name and all, even while the
  stranger keeps the queue of the socket anyone may write to full, and that
  full queue cannot keep ``stop`` from waking it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudstore.runtime.wake import WakeListener, encode_name, notify
from cloudstore.scheduler import OWN_DRIVER_ENV
from cloudstore.scheduling.runner import Runner, Timing
from cloudstore.scheduling.store_client import Agent, AgentStore, Counted, ServeClient
from cloudstore.scheduling.watch import IndexSource

STRANGER = 54321  # a uid and gid no account on the test machine has
NAME = encode_name({"owner": "acme", "id": "victim-agent"}, "payroll-2026-12", 1800000000)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user (CI runs as root)")


def as_stranger(work: Callable[[], Any]) -> Callable[[], None]:
    """``work`` to run in a child after it dropped to ``STRANGER``."""
    def child() -> None:
        os.setgroups([])
        os.setgid(STRANGER)
        os.setuid(STRANGER)
        work()
    return child


def fork(body: Callable[[], None]) -> int:
    """Run ``body`` in a child process (exit 0 if it returned, 1 if it raised); its pid."""
    pid = os.fork()
    if pid == 0:  # the child: the body, then out without running any of pytest's cleanup
        code = 1
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def reap(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may reach (pytest's tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="lnk-wake-security-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def stranger_receives(bind_at: Path, make_link: Path | None, send: Callable[[], object]) -> list[bytes]:
    """What a socket the stranger binds at ``bind_at`` receives while ``send`` runs (and ``make_link``,
    when given, is a symbolic link the stranger made to it first).  The parent ends the stranger's
    reading with an ``END`` datagram sent after ``send``: no waiting on time."""
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()

    def listen() -> None:
        os.close(ready_r)
        os.close(got_r)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(bind_at))
            os.chmod(bind_at, 0o666)  # anyone may send to it, as a runner's socket allows
            if make_link is not None:
                os.symlink(bind_at, make_link)
            sock.settimeout(30.0)
            os.write(ready_w, b"r")
            received = []
            while True:
                data = sock.recv(65536)
                if data == b"END":
                    break
                received.append(data.hex())
        os.write(got_w, json.dumps(received).encode())
        os.close(got_w)

    pid = fork(as_stranger(listen))
    os.close(ready_w)
    os.close(got_w)
    try:
        assert os.read(ready_r, 1) == b"r", "the stranger's socket did not start"
        send()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"END", str(bind_at))
        text = b""
        while chunk := os.read(got_r, 65536):
            text += chunk
    finally:
        os.close(ready_r)
        os.close(got_r)
        assert reap(pid) == 0, "the stranger's socket failed"
    return [bytes.fromhex(h) for h in json.loads(text)]


# -- 5: names reach only sockets of the sender's user or root -----------------------------------


def test_a_socket_another_user_binds_in_a_shared_folder_gets_no_name(shared: Path) -> None:
    """A shared sticky folder (root's, 1777, as /tmp): the stranger may bind there, and the runner's
    nudges reach it, but as an empty datagram; our own runner's socket still gets the name."""
    folder = shared / "wake"
    folder.mkdir()
    folder.chmod(0o1777)
    runner = WakeListener(str(folder))
    assert runner.listening, runner.refused
    try:
        got = stranger_receives(folder / "stranger.sock", None, lambda: notify(str(folder), NAME))
        assert NAME not in got and b"payroll" not in b"".join(got), f"the stranger read a job's name: {got}"
        assert got == [b""], "another user's runner is still nudged, with nothing in it"
        assert runner.wait(5.0)
        named, _ = runner.take_names()
        assert [n.job for n in named] == ["payroll-2026-12"], "our own runner lost the name"
    finally:
        runner.close()


def test_a_link_in_the_folder_is_never_followed(shared: Path) -> None:
    """The stranger links its own socket, bound elsewhere, into the shared folder: nothing is sent
    through the link (a link is not a runner's socket), least of all the name."""
    folder = shared / "wake"
    folder.mkdir()
    folder.chmod(0o1777)
    elsewhere = shared / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, STRANGER, STRANGER)
    got = stranger_receives(elsewhere / "stranger.sock", folder / "linked.sock", lambda: notify(str(folder), NAME))
    assert got == [], f"a nudge went through a symbolic link: {got}"


def test_no_name_is_sent_into_a_folder_another_user_owns(shared: Path) -> None:
    """A folder the stranger owns (it may rename, replace or link anything in it): even a socket of
    root's there is sent no name."""
    folder = shared / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, STRANGER, STRANGER)
    path = folder / "root.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ours:
        ours.bind(str(path))
        ours.settimeout(5.0)
        assert notify(str(folder), NAME) == 1, "the socket is still nudged"
        assert ours.recv(65536) == b"", "a name went into another user's folder"


def test_a_wake_folder_another_user_owns_is_refused(shared: Path) -> None:
    folder = shared / "wake"
    folder.mkdir(mode=0o755)
    os.chown(folder, STRANGER, STRANGER)
    listener = WakeListener(str(folder))
    try:
        assert not listener.listening, "a runner bound its socket in another user's folder"
        assert listener.refused is not None and str(STRANGER) in listener.refused
        assert os.listdir(folder) == [], "something was made in it"
    finally:
        listener.close()


def test_a_wake_folder_anyone_may_write_in_is_refused_unless_sticky(shared: Path) -> None:
    """0777 without the sticky bit: anyone could rename a runner's socket away and put theirs in its place."""
    folder = shared / "wake"
    folder.mkdir()
    folder.chmod(0o777)
    listener = WakeListener(str(folder))
    try:
        assert not listener.listening and listener.refused is not None and "sticky" in listener.refused
    finally:
        listener.close()
    folder.chmod(0o1777)
    listener = WakeListener(str(folder))
    try:
        assert listener.listening, f"a sticky folder of root's is fine: {listener.refused}"
    finally:
        listener.close()


def test_a_wake_folder_a_runner_makes_is_not_world_writable(shared: Path) -> None:
    """Only runners bind there, and other users' drivers need only to list it and send: 0755."""
    folder = shared / "made"
    listener = WakeListener(str(folder))
    try:
        assert listener.listening, listener.refused
        mode = stat.S_IMODE(os.lstat(folder).st_mode)
        assert mode == 0o755, f"mode {mode:04o}"
    finally:
        listener.close()


def test_a_runner_with_a_refused_folder_says_so_once_and_starts_without_nudges(
        shared: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = shared / "wake"
    folder.mkdir(mode=0o755)
    os.chown(folder, STRANGER, STRANGER)
    client = CountingClient(shared)
    r = real_runner(client, WakeListener(str(folder)), Timing(poll_interval=0.2))
    thread = threading.Thread(target=r.run, daemon=True)
    thread.start()
    try:
        until(lambda: client.polls() >= 3, "the runner's polls")
    finally:
        r.stop()
        thread.join(30.0)
        client.close()
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    refused = [e for e in events if e.get("event") == "wake_refused"]
    started = [e for e in events if e.get("event") == "started"]
    assert len(refused) == 1 and str(STRANGER) in refused[0]["reason"], events
    assert len(started) == 1 and started[0]["nudges"] is False, events


# -- 6: a stranger's nudges at most bring the next poll forward -------------------------------


def test_a_strangers_nudge_wakes_a_listener_once_a_gap_and_ours_at_once(shared: Path) -> None:
    listener = WakeListener(str(shared / "wake"))
    assert listener.listening and listener.path is not None
    path = listener.path
    try:
        stranger_sends(path, 1)
        assert listener.wait(5.0, untrusted_every=1000.0), "a stranger's first nudge brings a poll forward"
        assert listener.take_names() == ([], True)
        stranger_sends(path, 1)
        assert not listener.wait(0.5, untrusted_every=1000.0), "a second one within the gap woke it"
        assert listener.take_names() == ([], False)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ours:
            ours.sendto(NAME, path)
        assert listener.wait(5.0, untrusted_every=1000.0), "our own user's nudge no longer wakes it"
        assert [n.job for n in listener.take_names()[0]] == ["payroll-2026-12"]
    finally:
        listener.close()


def test_a_strangers_full_queue_does_not_crowd_out_our_own_users_name(shared: Path) -> None:
    """The stranger fills the queue of the socket anyone may write to; our own user's driver still
    reaches the runner, name and all (through the socket only our user and root may write to)."""
    listener = WakeListener(str(shared / "wake"))
    assert listener.listening and listener.path is not None
    try:
        stranger_sends(listener.path, 0)  # until the queue is full
        assert notify(listener.folder, NAME) == 1, "our own user's nudge was not taken"
        assert listener.wait(5.0)
        assert [n.job for n in listener.take_names()[0]] == ["payroll-2026-12"], "the name was crowded out"
    finally:
        listener.close()


def test_a_strangers_full_queue_cannot_keep_stop_from_waking_the_runner(shared: Path) -> None:
    """The stranger fills the runner socket's queue; ``interrupt`` (what SIGTERM's handler calls, on
    the very thread that would drain it) neither blocks nor is lost."""
    listener = WakeListener(str(shared / "wake"))
    assert listener.listening and listener.path is not None
    try:
        stranger_sends(listener.path, 0)  # until the queue is full
        assert listener.wait(5.0)  # a stranger's first: drained
        stranger_sends(listener.path, 0)
        done = threading.Event()

        def stop() -> None:
            listener.interrupt()
            done.set()

        threading.Thread(target=stop, daemon=True).start()
        assert done.wait(10.0), "interrupt blocked on a queue a stranger filled"
        assert listener.wait(5.0, untrusted_every=1000.0), "the interrupt was lost"
    finally:
        listener.close()


def stranger_sends(path: str, count: int) -> None:
    """The stranger sends ``count`` empty datagrams to ``path`` (0: until its queue is full)."""
    def send() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sent = 0
            while count == 0 or sent < count:
                try:
                    sock.sendto(b"", path)
                except BlockingIOError:
                    if count == 0:
                        return
                    raise
                sent += 1

    assert reap(fork(as_stranger(send))) == 0, "the stranger's sends failed"


def flood(path: str, seconds: float) -> int:
    """The stranger sends empty datagrams to ``path`` for ``seconds``, one a millisecond (a full queue
    is skipped); its pid."""
    def send() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    sock.sendto(b"", path)
                except BlockingIOError:
                    pass
                time.sleep(0.001)

    return fork(as_stranger(send))


class CountingClient:
    """A real driver (``lnk-bucket-store serve`` on a file:// store, with the scheduler's ops), and
    the requests the runner sent it, counted here, outside the runner."""

    def __init__(self, top: Path) -> None:
        bucket = top / "bucket"
        bucket.mkdir()
        env = {"LNK_BUCKET_URL": f"file://{bucket}", "LNK_WAKE_DIR": str(top / "puts-nudge-no-one"),
               **OWN_DRIVER_ENV}
        self.counted = Counted(ServeClient("lnk-bucket-store", env))

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.counted.request(request)

    def polls(self) -> int:
        return self.counted.by_op["job_due"]

    def close(self) -> None:
        self.counted.close()


def real_runner(client: CountingClient, listener: WakeListener, timing: Timing) -> Runner:
    store = AgentStore(Agent(owner="acme", id="runner-agent"), client, own_driver=True)
    return Runner([store], [IndexSource([store])], fire=None, holder="wake-security",  # type: ignore[arg-type]
                  timing=timing, listener=listener)


def until(ready: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not ready():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_a_strangers_flood_costs_at_most_one_extra_poll_a_poll_interval(shared: Path) -> None:
    """Seconds of another user's empty datagrams (1,000 a second) at a real runner's socket: its
    driver sees at most about twice its idle ``job_due`` requests, not one every ``MIN_GAP``."""
    interval, seconds = 1.0, 4.0
    client = CountingClient(shared)
    listener = WakeListener(str(shared / "wake"))
    assert listener.listening and listener.path is not None
    r = real_runner(client, listener, Timing(lapse=300.0, poll_interval=interval))
    thread = threading.Thread(target=r.run, daemon=True)
    thread.start()
    try:
        until(lambda: client.polls() >= 2, "the runner's first polls")  # started: its driver answers
        before = client.polls()
        requests_before = sum(client.counted.by_op.values())
        pid = flood(listener.path, seconds)
        assert reap(pid) == 0, "the flood failed"
        polls = client.polls() - before
        requests = sum(client.counted.by_op.values()) - requests_before
    finally:
        r.stop()
        thread.join(30.0)
        client.close()
    assert not thread.is_alive(), "the runner did not stop"
    # Idle, one poll a second (and a page of the sweep now and then): about 4. A poll brought forward
    # once a second at most doubles that; the old runner polled at every MIN_GAP (about 60-80).
    bound = 2 * (seconds / interval) + 4
    assert polls <= bound, f"{polls} job_due requests in {seconds} s of a flood (bound {bound:g}): {requests} in all"

"""A fire never outlives its runner, nor itself (issue 29, item 7).

A fire is its command's process group.  These tests start real runners on
each backend and fire commands that leave work behind the way real ones do:

* ``test_shell_line_dies_with_its_killed_runner``: the README's quick form, a
  shell line; Debian's ``/bin/sh`` forks its commands, and this one also
  starts a grandchild in the background.  SIGKILL of the runner (which no
  handler sees) leaves no process of the fire: not the shell, not what it
  forked.  On eafe802 the parent-death signal killed the shell only, and its
  children ran on with PPID 1 while another runner could fire the job again.
* ``test_command_ignoring_sigterm_dies_with_its_killed_runner``: the same for
  an argv command that ignores SIGTERM and starts a child that inherits that.
* ``test_what_a_fire_leaves_running_is_killed_when_it_exits``: a command that
  exits at once leaving a background process: the process is killed, so an
  ended fire leaves nothing that a later runner death would orphan.
* ``test_timeout_kills_the_whole_group``: past ``fire_timeout`` the whole
  group goes, the command that ignores SIGTERM and its child included.

"Gone" is polled (up to 10 s), never timed: the watcher kills within
milliseconds, but a loaded machine may take longer to say so.  A process
that is a zombie (dead, not yet reaped by init) counts as gone.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from scheduler_rig import AGENTS, Rig, wait_for

GONE_WITHIN = 10.0  # the poll's hang guard, not a speed asserted

# Ignores SIGTERM (as does its child, which inherits SIG_IGN), writes its pid and its child's, then sleeps.
STUBBORN = (
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "child = subprocess.Popen(['sleep', '60'])\n"
    "with open(sys.argv[1], 'a') as f:\n"
    "    f.write(f'{os.getpid()}\\n{child.pid}\\n')\n"
    "time.sleep(60)\n"
)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a live process, None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    state, pgrp = fields[0], int(fields[2])
    return None if state in ("Z", "X") else (state, pgrp)


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running, and every process still in the group the first one leads."""
    found = [p for p in pids if _stat(p) is not None]
    leader = pids[0]
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in found:
            st = _stat(int(entry))
            if st is not None and st[1] == leader:
                found.append(int(entry))
    return found


def read_pids(path: Path, count: int) -> list[int]:
    wait_for(lambda: path.exists() and len(path.read_text().split()) >= count, 60, f"{count} pids in {path.name}")
    return [int(p) for p in path.read_text().split()[:count]]


def cleanup(pids: list[int]) -> None:
    """Kill what a failed test left, so that it does not outlive the test either."""
    for pid in alive(pids) if pids else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def assert_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive(pids)
    assert left == [], f"{what}: processes of the fire still run: {left}"


def kill_runner_mid_fire(rig: Rig, fire: str | list[str], pids_file: Path) -> None:
    runner = rig.start_runner(fire=fire, lapse=3.0)
    rig.wait_started()
    rig.put(AGENTS[0], "orphan", time.time())
    pids = read_pids(pids_file, 2)
    try:
        assert alive(pids)[:2] == pids, "the fire should be running"
        runner.proc.send_signal(signal.SIGKILL)
        runner.proc.wait()
        assert_gone(pids, "after SIGKILL of the runner")
    finally:
        cleanup(pids)


def test_shell_line_dies_with_its_killed_runner(rig: Rig, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    # $$ is the shell (the group's leader); $! the background grandchild; the last sleep is forked too.
    line = f"echo $$ >> {pids_file}; sleep 60 & echo $! >> {pids_file}; sleep 60"
    kill_runner_mid_fire(rig, line, pids_file)


def test_command_ignoring_sigterm_dies_with_its_killed_runner(rig: Rig, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    kill_runner_mid_fire(rig, [sys.executable, "-c", STUBBORN, str(pids_file)], pids_file)


def test_what_a_fire_leaves_running_is_killed_when_it_exits(rig: Rig, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    runner = rig.start_runner(fire=f"echo $$ >> {pids_file}; sleep 60 & echo $! >> {pids_file}")
    rig.wait_started()
    rig.put(AGENTS[0], "leaver", time.time())
    wait_for(lambda: runner.events("fired"), 60, "the fire to end")
    pids = read_pids(pids_file, 2)
    try:
        assert runner.events("fired")[0]["exit"] == 0
        assert_gone(pids, "after the command exited")
    finally:
        cleanup(pids)


def test_timeout_kills_the_whole_group(rig: Rig, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    runner = rig.start_runner(fire=[sys.executable, "-c", STUBBORN, str(pids_file)], fire_timeout=1.0)
    rig.wait_started()
    rig.put(AGENTS[0], "slow", time.time())
    pids = read_pids(pids_file, 2)
    try:
        wait_for(lambda: runner.events("fired"), 60, "the fire to be killed")
        fired = runner.events("fired")[0]
        assert fired["killed"] == "timeout" and fired["exit"] == -signal.SIGKILL, fired
        assert_gone(pids, "after the timeout")
    finally:
        cleanup(pids)

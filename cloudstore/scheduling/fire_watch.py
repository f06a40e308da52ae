"""The fire watcher: kills every fire's process group when its runner dies, however it dies.

A runner starts ONE of these (``fire.FireWatcher``), in a session of its own,
with a pipe on its stdin whose only writer is the runner.  The runner writes
``+PGID`` when a fire command's group is started and ``-PGID`` once it has
been reaped.  When the pipe reaches end of file (the runner exited: by
SIGKILL, a crash or on purpose; the kernel closes the pipe in every case),
the watcher sends SIGKILL to every group still registered and exits.  So
even a shell line that forks (Debian's ``/bin/sh`` does), a command that
ignores SIGTERM, or what such a command started in its group, does not run
on after its runner: another runner that takes the job over once its lease
has lapsed never fires it while the first firing still runs.

Run as ``python -I -S fire_watch.py``: standard library only, imported by
nothing, so it starts in a few milliseconds and reads no environment.
It ignores SIGINT, SIGTERM and SIGHUP: what ends it is its runner's end.
"""

from __future__ import annotations

import os
import signal
import sys


def _kill(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def main() -> int:
    """Track the groups the runner names; kill those left when its pipe closes."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    stream = sys.stdin.buffer
    for line in stream:
        text = line.strip().decode("ascii", "replace")
        if len(text) < 2 or not text[1:].isdigit():
            continue
        pgid = int(text[1:])
        if pgid <= 1:
            continue  # never the whole system, whatever the pipe says
        if text[0] == "+":
            groups.add(pgid)
        elif text[0] == "-":
            groups.discard(pgid)
    for pgid in groups:
        _kill(pgid)
    return 0


if __name__ == "__main__":
    sys.exit(main())

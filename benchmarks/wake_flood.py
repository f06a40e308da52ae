"""A runner's polls per minute, idle and under another local user's flood of its wake socket.

One real ``lnk-cloud-scheduler`` process (one agent, a file:// store,
``poll_interval`` 2 s by default) with its wake folder in a temporary folder
every user may reach.  Its driver is this script in ``--relay`` mode: it
starts the real ``lnk-bucket-store serve`` and passes every line through,
writing the op of each request and when it was seen to a log, so the polls
(``job_due``) are counted outside the runner.

1. Idle: ``job_due`` requests over ``--seconds`` once the runner started.
2. Flood: a child process of another user (uid/gid ``--uid``, 54321 by
   default: needs root) sends empty datagrams to the runner's socket for
   ``--seconds``, ``--rate`` a second (a full queue is skipped, not waited
   on); ``job_due`` requests over the same seconds.
3. Own puts: ``--puts`` jobs put due now through a driver of the runner's own
   user on this machine (it nudges the runner), idle and during a flood:
   the put's reply -> the fire command's start, median and worst.

The code measured is whatever ``import cloudstore`` finds: run it from
outside the work tree (the current folder comes first on ``sys.path``) with
``PYTHONPATH`` naming another copy to measure that instead, e.g. the code
before the wake folder's bounds::

    mkdir -p /tmp/old && cp -r cloudstore /tmp/old/ \\
      && git show eafe802:cloudstore/runtime/wake.py > /tmp/old/cloudstore/runtime/wake.py \\
      && git show 6b48f09~1:cloudstore/scheduling/runner.py > /tmp/old/cloudstore/scheduling/runner.py
    cd /tmp && PYTHONPATH=/tmp/old python3 /work/main/benchmarks/wake_flood.py
    cd /tmp && python3 /work/main/benchmarks/wake_flood.py

Figures, not assertions: a table on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cloudstore.scheduling.log import read_events

AGENT = {"owner": "bench", "id": "wake-flood"}
FIRE = (
    "import os,sys,time\n"
    "t=time.time()\n"
    "fd=os.open(sys.argv[1],os.O_WRONLY|os.O_APPEND|os.O_CREAT,0o644)\n"
    "os.write(fd,(os.environ['LNK_JOB_ID']+' '+repr(t)+'\\n').encode())\n"
)


def progress(text: str) -> None:
    print(f"# {text}", file=sys.stderr, flush=True)


def relay(log: str, program: list[str]) -> int:
    """Be the runner's driver: pass each request line to ``program`` and each reply back, logging
    ``<time> <op>`` for each request (one line per request, appended whole)."""
    proc = subprocess.Popen(program, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    out = proc.stdout

    def replies() -> None:
        for line in out:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()

    threading.Thread(target=replies, daemon=True).start()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for line in sys.stdin.buffer:
        try:
            op = str(json.loads(line).get("op"))
        except (ValueError, AttributeError):
            op = "?"
        os.write(fd, f"{time.time():.6f} {op}\n".encode())
        proc.stdin.write(line)
        proc.stdin.flush()
    proc.stdin.close()
    return proc.wait()


def polls(log: Path, start: float, end: float) -> int:
    if not log.exists():
        return 0
    n = 0
    for line in log.read_text().splitlines():
        t, _, op = line.partition(" ")
        if op == "job_due" and start <= float(t) < end:
            n += 1
    return n


def flood(path: str, uid: int, seconds: float, rate: float) -> int:
    """A child of another user sending empty datagrams to ``path``; its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                end = time.monotonic() + seconds
                gap = 1.0 / rate
                while time.monotonic() < end:
                    try:
                        sock.sendto(b"", path)
                    except BlockingIOError:
                        pass
                    time.sleep(gap)
            code = 0
        finally:
            os._exit(code)
    return pid


def wait_until(ready: Any, limit: float, what: str) -> None:
    end = time.monotonic() + limit
    while not ready():
        if time.monotonic() > end:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)




def fired(record: Path, job: str) -> float | None:
    """When the fire command of ``job`` started (wall clock), or None before it did."""
    if record.exists():
        for line in record.read_text().splitlines():
            name, _, t = line.partition(" ")
            if name == job:
                return float(t)
    return None


def lateness(store: Any, record: Path, tag: str, puts: int) -> list[float]:
    """Put ``puts`` jobs due now through ``store`` (a driver nudging the runner), one at a time: each
    put's reply -> its fire's start, in ms."""
    late = []
    for i in range(puts):
        job = f"{tag}-{i}"
        reply = store.request({"op": "job_put", "agent": AGENT, "place": "waiting",
                               "job": {"id": job, "spec": None, "due": time.time()}}, timeout=60)
        answered = time.time()
        assert reply == {"reply": "done"}, reply

        wait_until(lambda job=job: fired(record, job) is not None, 60, f"job {job} to fire")
        late.append(((fired(record, job) or 0.0) - answered) * 1000)
        time.sleep(0.3)
    return late


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--relay", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=60.0, help="length of the idle and of the flood count")
    p.add_argument("--poll-interval", type=float, default=2.0)
    p.add_argument("--rate", type=float, default=1000.0, help="the flood's datagrams a second")
    p.add_argument("--uid", type=int, default=54321, help="the other local user (and group) flooding")
    p.add_argument("--puts", type=int, default=5, help="own-user puts timed idle and during a flood (0: none)")
    args, rest = p.parse_known_args()
    if args.relay:
        return relay(args.relay, [a for a in rest if a != "--"])
    if os.geteuid() != 0:
        raise SystemExit("needs root: the flood is sent as another user (--uid)")
    import cloudstore
    from cloudstore.protocol.client import ServeProcess

    code = os.path.dirname(cloudstore.__file__)
    top = Path(tempfile.mkdtemp(prefix="lnk-wake-flood-"))
    top.chmod(0o755)
    proc: subprocess.Popen[bytes] | None = None
    store: ServeProcess | None = None
    try:
        bucket, requests, record, log = top / "bucket", top / "requests.log", top / "fired", top / "runner.log"
        bucket.mkdir()
        env = {"LNK_BUCKET_URL": bucket.as_uri()}
        config = top / "runner.json"
        config.write_text(json.dumps({
            "agents": [AGENT],
            "driver": [sys.executable, os.path.abspath(__file__), "--relay", str(requests), "--", "lnk-bucket-store"],
            "driver_env": env,
            "fire": [sys.executable, "-S", "-c", FIRE, str(record)],
            "poll_interval": args.poll_interval,
        }))
        wake = top / "wake"
        run_env = {**os.environ, "LNK_WAKE_DIR": str(wake)}
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=run_env)
        wait_until(lambda: read_events(log, "started"), 60, "the runner to start")
        started = read_events(log, "started")[0]
        sockets = [s for s in wake.glob("*.sock") if not s.name.endswith(".own.sock")]  # the one anyone may write to
        if not started.get("nudges") or not sockets:
            raise SystemExit(f"the runner listens for no nudge: {read_events(log, 'wake_refused')}")
        target = str(sockets[0])
        time.sleep(2 * args.poll_interval)  # past start-up's first polls and recovery
        progress(f"code measured: {code}; idle for {args.seconds:g} s")
        t0 = time.time()
        time.sleep(args.seconds)
        t1 = time.time()
        idle = polls(requests, t0, t1)
        progress(f"another user's flood ({args.rate:g} datagrams a second) for {args.seconds:g} s")
        t2 = time.time()
        pid = flood(target, args.uid, args.seconds, args.rate)
        _, status = os.waitpid(pid, 0)
        t3 = time.time()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("the flood failed")
        flooded = polls(requests, t2, t3)
        late_idle: list[float] = []
        late_flood: list[float] = []
        if args.puts:
            store = ServeProcess("lnk-bucket-store", {**env, "LNK_WAKE_DIR": str(wake)}, stderr=subprocess.DEVNULL)
            progress(f"{args.puts} puts of our own user due now, idle")
            late_idle = lateness(store, record, "idle", args.puts)
            progress(f"{args.puts} puts of our own user due now, during a flood")
            pid = flood(target, args.uid, 3600.0, args.rate)
            try:
                time.sleep(1.0)
                late_flood = lateness(store, record, "flood", args.puts)
            finally:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        per_minute = 60.0 / args.seconds
        print(f"code: {code}")
        print(f"poll_interval {args.poll_interval:g} s, {args.seconds:g} s counted each, job_due at the driver's relay")
        print(f"{'':34}{'job_due':>8}{'per minute':>12}")
        print(f"{'idle':34}{idle:>8}{idle * per_minute:>12.1f}")
        print(f"{'another user flood ' + format(args.rate, 'g') + '/s':34}{flooded:>8}{flooded * per_minute:>12.1f}")
        for label, late in (("own put -> fire, idle", late_idle), ("own put -> fire, flooded", late_flood)):
            if late:
                median, worst = statistics.median(late), max(late)
                print(f"{label:34}median {median:8.0f} ms  worst {worst:8.0f} ms  ({len(late)} puts)")
    finally:
        if store is not None:
            store.close()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(top, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 44: "once" and "never at once" through the runners' own processes, pauses and slow stores made
to happen on purpose.  On the folder and on moto (its runs are slow, and marked so by the root conftest);
fake-gcs-server adds nothing here the claim's op tests do not check (tests/test_lease_fence.py).

* ``test_a_slow_store_and_a_starved_machine_fire_each_job_once``: every request held 0.3 s at a proxy,
  lapse 6, the machine starved by busy loops: no job fired twice, no completed fire fired again (the
  renewer kept lapse/6 of slack, and a claim judged stale after its command ended was dropped).
* ``test_a_pause_between_claim_and_start_starts_nothing``: the runner stops itself (SIGSTOP, a
  test-only hook) between the claim's reply and the command's start, for the lapse + 2 s while
  another runner takes the job over: its command is never started.
* ``test_a_runner_paused_past_the_lapse``: a runner stopped for the lapse + 3 s while it fires two
  jobs: the other runner fires them again (allowed: the first is paused), each with a larger
  ``LNK_JOB_FENCE``; the paused runner's command still running is killed when it wakes, and the finish
  of its command that ended in the pause removes nothing the other fires (no ``lost_job`` there).
* ``test_a_superseded_finish_in_flight_never_removes_the_recovered_job`` (moto): the paused runner's
  finish held at the proxy until the other runner has taken the job over: it must fail.

``LNK_CODE_UNDER_TEST`` runs another tree's runners (run pytest from outside any tree) to see these
fail on the code before issue 44.  ``LNK_FUZZ_SEED`` seeds the job order of the first (printed).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from faults.http_proxy import FaultProxy, Rule
from scheduler_rig import AGENTS, Backend, Rig, RunnerProc, starved, wait_for
from support import make_store

from cloudstore.protocol.client import ServeProcess
from cloudstore.scheduling.fire import TEST_STOP_ENV

LAPSE = 3.0
AGENT = AGENTS[0]


@pytest.fixture(params=("file", "moto"))
def paused_rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Rig, FaultProxy | None]]:
    """A rig whose runners reach the store through a fault proxy (moto), or a folder; the rig's own driver
    (the puts, the checks) goes to the store directly."""
    other = os.environ.get("LNK_CODE_UNDER_TEST")
    if other:
        monkeypatch.setenv("PYTHONPATH", other)
    base = make_store(request.param, request, tmp_path_factory, own_bucket=request.param != "file")
    proxy = None
    env = base.env
    if request.param == "moto":
        proxy = FaultProxy(base.env["AWS_ENDPOINT_URL_S3"], flavor="s3").start()
        env = proxy.redirect(base.env)
    putter = ServeProcess(base.program, base.env, stderr=subprocess.DEVNULL)
    rig = Rig(Backend(request.param, base.program, env, 1.0), tmp_path, putter)
    try:
        yield rig, proxy
    finally:
        for r in rig.runners:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)
        rig.stop_all(hurry=True)
        for r in rig.runners:
            assert r.proc.stdout is not None
            r.proc.stdout.close()
        putter.close()
        if proxy is not None:
            proxy.stop()


def logs(rig: Rig) -> str:
    return " | ".join(f"runner{i} pid {r.proc.pid}: " + r.log.read_text(errors="replace")[-3000:]
                      for i, r in enumerate(rig.runners))


def by_pid(rig: Rig, pid: int) -> RunnerProc:
    return next(r for r in rig.runners if r.proc.pid == pid)


@pytest.mark.slow
@pytest.mark.parametrize(("lapse", "busy"), [(6.0, 2)], ids=["lapse6-starved"])
def test_a_slow_store_and_a_starved_machine_fire_each_job_once(tmp_path_factory: pytest.TempPathFactory,
                                                                request: pytest.FixtureRequest, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, lapse: float,
                                                                busy: int) -> None:
    """0.3 s a request and a busy loop per core, at lapse 6.  (At lapse 3 a renewal's round trip here,
    0.65-1.3 s even unstarved (``renew_slow``: the renewals' own driver process reads the head its claim's
    process wrote, then writes it), eats the fence's whole lapse/3 of slack now and then: a live fire is
    killed and fired again, 1 of 16 jobs unstarved, 2 to 5 starved.  The docs recommend a lapse of 30 s.)"""
    seed = int(os.environ.get("LNK_FUZZ_SEED", "44"))
    rng = random.Random(seed)
    other = os.environ.get("LNK_CODE_UNDER_TEST")
    if other:
        monkeypatch.setenv("PYTHONPATH", other)
    base = make_store("moto", request, tmp_path_factory, own_bucket=True)
    jobs = 16
    with FaultProxy(base.env["AWS_ENDPOINT_URL_S3"], flavor="s3", latency=0.3) as proxy:
        env = proxy.redirect(base.env)
        putter = ServeProcess(base.program, base.env, stderr=subprocess.DEVNULL)
        rig = Rig(Backend("moto", base.program, env, 1.0), tmp_path, putter)
        try:
            for _ in range(2):
                rig.start_runner(lapse=lapse, workers=4)
            rig.wait_started(60)
            with starved(busy):  # a busy loop per core, for as long as the jobs take
                start = time.time() + 1.0
                names = [f"j{i}" for i in range(jobs)]
                rng.shuffle(names)
                for i, name in enumerate(names):  # fires of 0.5-2 s, due over 4 s
                    rig.put(AGENTS[i % 2], name, start + 4.0 * i / jobs, {"sleep": rng.choice([0.5, 1.0, 2.0])})
                wait_for(lambda: len({r["job"] for r in rig.records("end")}) >= jobs and rig.empty(), 180,
                         f"seed {seed}: every job fired and finished")
                time.sleep(lapse + 2)  # a completed fire fired again shows up by now
        finally:
            rig.stop_all()
            for r in rig.runners:
                assert r.proc.stdout is not None
                r.proc.stdout.close()
            putter.close()
        records = rig.records()
        fired = Counter(r["job"] for r in records if r["ev"] == "start")  # job ids are unique here
        twice = sorted(job for job, n in fired.items() if n > 1)
        paused = [e for r in rig.runners for e in r.events("paused")]
        slow = [e["seconds"] for r in rig.runners for e in r.events("renew_slow")]
        print(f"\n[moto, 0.3 s a request, lapse {lapse}, {busy} busy loops, seed {seed}] {len(fired)} jobs, "
              f"fired twice: {twice}; pauses the runners saw: {[e['seconds'] for e in paused]}; "
              f"slowest renewal: {max(slow, default=0)} s")
        assert len(fired) == jobs
        assert twice == [], f"seed {seed}: fired twice with no runner dead: {twice}; {logs(rig)}"


def test_a_pause_between_claim_and_start_starts_nothing(paused_rig: tuple[Rig, FaultProxy | None]) -> None:
    rig, _ = paused_rig
    first = rig.start_runner(env={TEST_STOP_ENV: "j"}, lapse=LAPSE)
    rig.wait_started(60)
    rig.put(AGENT, "j", time.time(), {"sleep": 0.2})
    wait_for(lambda: first.events("test_stopping"), 60, "the runner to stop itself between claim and start")
    stopped_at = time.time()
    second = rig.start_runner(lapse=LAPSE)
    wait_for(lambda: any(r["ppid"] == second.proc.pid for r in rig.records("end")), 60,
             f"the other runner to fire the job again; {logs(rig)}")
    time.sleep(max(0.0, stopped_at + LAPSE + 2 - time.time()))
    first.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: first.events("not_started") and rig.empty(), 30, f"the woken runner to judge; {logs(rig)}")
    starts = rig.records("start")
    assert [r["ppid"] for r in starts] == [second.proc.pid], "the paused runner started its command after all"
    assert starts[0]["recovered"] is True
    assert [e["why"] for e in first.events("not_started")] == ["lost"], "the store said the claim is another's"
    assert not first.events("fired")


def test_a_runner_paused_past_the_lapse_is_superseded_by_a_larger_fence(
        paused_rig: tuple[Rig, FaultProxy | None]) -> None:
    rig, _ = paused_rig
    first = rig.start_runner(lapse=LAPSE)
    rig.wait_started(60)
    now = time.time()
    rig.put(AGENT, "long", now, {"sleep": 30})  # still running when its runner wakes: killed then
    rig.put(AGENT, "short", now, {"sleep": 0.3, "sleep_recovered": 8})  # ends in the pause; its finish waits
    wait_for(lambda: {r["job"] for r in rig.records("start")} == {"long", "short"}, 60, "both fires to start")
    first.proc.send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    second = rig.start_runner(lapse=LAPSE)
    wait_for(lambda: {r["job"] for r in rig.records("start") if r["ppid"] == second.proc.pid} == {"long", "short"},
             60, f"the other runner to fire both again; {logs(rig)}")
    time.sleep(max(0.0, stopped_at + LAPSE + 3 - time.time()))
    first.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: len(first.events("fired")) == 2, 30, f"the woken runner to see both fires end; {logs(rig)}")
    wait_for(lambda: any(r["job"] == "short" and r["ppid"] == second.proc.pid for r in rig.records("end")), 30,
             "the other runner's short fire to end")
    time.sleep(2.0)  # its paced finish
    starts = rig.records("start")
    for job in ("long", "short"):
        mine = [r["fence"] for r in starts if r["job"] == job and r["ppid"] == first.proc.pid]
        theirs = [r["fence"] for r in starts if r["job"] == job and r["ppid"] == second.proc.pid]
        assert len(mine) == len(theirs) == 1 and all(type(f) is int for f in mine + theirs), (job, starts)
        assert theirs[0] > mine[0], f"{job}: the superseding fire's fence is not greater"
    fired = {e["job"]: e for e in first.events("fired")}
    assert fired["long"]["killed"] in ("fenced", "lost"), "the paused runner's command ran on after it woke"
    assert fired["short"]["killed"] is None
    assert not second.events("lost_job"), f"the paused runner's finish removed the job the other fires; {logs(rig)}"
    assert not second.events("finish_not_ours")
    assert rig.count(AGENT, "firing") == 1, "short is finished by its current holder only; long still fires"
    assert [j["id"] for j in rig.listing(AGENT, "firing")] == ["long"]


def record_puts(job_id: str) -> str:
    """A regex of the path of a PUT of one job's record on moto (``j/_<id>``)."""
    return re.escape(quote("j/_" + job_id, safe="/~")) + r"(\?|$)"


@pytest.mark.parametrize("paused_rig", ["moto"], indirect=True)  # a request held at the proxy: no folder form
def test_a_superseded_finish_in_flight_never_removes_the_recovered_job(
        paused_rig: tuple[Rig, FaultProxy | None]) -> None:
    rig, proxy = paused_rig
    assert proxy is not None

    release = threading.Event()
    held = proxy.add(Rule("delay", method="PUT", path=record_puts("j"), nth=2, hold=release))  # claim, then finish
    first = rig.start_runner(lapse=LAPSE)
    rig.wait_started(60)
    rig.put(AGENT, "j", time.time(), {"sleep": 0.1, "sleep_recovered": 6})
    try:
        wait_for(lambda: held.fired == 1, 60, "the runner's finish to reach the proxy")
        first.proc.send_signal(signal.SIGSTOP)  # its renewals stop; its finish's write waits at the proxy
        second = rig.start_runner(lapse=LAPSE)
        wait_for(lambda: any(r["ppid"] == second.proc.pid for r in rig.records("start")), 60,
                 f"the other runner to take the job over and fire it; {logs(rig)}")
    finally:
        release.set()
    first.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: any(r["ppid"] == second.proc.pid for r in rig.records("end")), 30, "the recovered fire to end")
    wait_for(lambda: rig.empty(), 15, f"the job finished; {logs(rig)}")
    assert not second.events("lost_job"), f"the superseded finish removed the recovered job; {logs(rig)}"
    assert [e["holder"] for e in first.events("finish_not_ours")] == [second.events("started")[0]["runner"]]

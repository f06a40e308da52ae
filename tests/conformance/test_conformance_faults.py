"""``lnk-store-check --faults`` on moto: this project's S3 driver passes, and each zoo driver fails its check.

The zoo (``tests/broken_drivers/zoo_s3.py``) is lnk-bucket-store with one
defect that only a cloud's faults show: each, put through every check of the
family, must fail exactly the check named for it, whatever the seed (the
checks that catch them go through every write of their ops in turn, or
through seeded turns; the seed picks the transient faults). A check that
builds on the failed one is reported not judged, not failed again.
This project's drivers pass in quick mode (as CI runs it) on moto,
fake-gcs-server and SeaweedFS; the zoo, an S3 driver, runs on moto.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support import SEAWEEDFS, ZOO_PROGRAM, make_store

from cloudstore.conformance import fault_checks, run
from cloudstore.conformance.cli import main

pytestmark = pytest.mark.timeout(600)
SEED = 20261202

#: Each zoo driver's defect, and the check named for it.
CAUGHT_BY = {
    "sdk_retries": "faults.lost_reply",
    "stale_last": "faults.racers_linearizable",
    "still_current": "faults.own_write_replaced",
    "late_delete": "faults.late_landing",
    "local_clock": "faults.store_time",
    "trusts_server": "faults.server_ignores_preconditions",
}


def moto_env(moto_server) -> dict[str, str]:
    return {**moto_server.env, "LNK_BUCKET_URL": f"s3://{moto_server.bucket}/faults-{uuid.uuid4().hex[:10]}"}


def fired(report) -> str:
    return next(n for n in report.notes if n.startswith("faults: ") and "fired by kind" in n)


@pytest.mark.parametrize("backend", ["moto", "gcs", SEAWEEDFS])
def test_the_drivers_pass_faults_quick(backend: str, request: pytest.FixtureRequest,
                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    """lnk-bucket-store on moto and SeaweedFS, lnk-gcs on fake-gcs-server: every check passes, every
    kind of fault fired."""
    store = make_store(backend, request, tmp_path_factory)
    report = run(store.program, env=store.env, faults=True, quick=True, seed=SEED)
    assert report.ok, report.failures() + "\n" + "\n".join(report.notes)
    assert report.names() == {c.name for c in fault_checks.checks.checks}
    kinds = fired(report)
    for kind in ("lose_reply", "late", "hold", "truncate", "date"):
        assert f"{kind} " in kinds, kinds  # every kind of fault was made to happen, not only armed


@pytest.mark.parametrize("defect", sorted(CAUGHT_BY))
def test_zoo_driver_fails_exactly_the_check_named_for_it(moto_server, defect: str) -> None:
    check = CAUGHT_BY[defect]
    report = run(ZOO_PROGRAM, env={**moto_env(moto_server), "ZOO_BREAK": defect}, faults=True, quick=True,
                 seed=SEED)
    assert report.names() == {c.name for c in fault_checks.checks.checks}
    assert report.failed_names() == {check}, report.failures()
    built_on_it = {c.name for c in fault_checks.checks.checks if c.builds_on == check}
    assert report.unjudged_names() == built_on_it, report.failures()
    notes = "\n".join(report.notes)
    assert f"{check} failed with seed {SEED} (replay: --seed {SEED} --check {check})" in notes
    assert "fault schedule: " in notes and "history that broke:" in notes


def test_a_failure_replays_with_its_seed(moto_server, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints the seed of a failure; run again with --seed it fails the same way."""
    env = [f"--env={k}={v}" for k, v in {**moto_env(moto_server), "ZOO_BREAK": "local_clock"}.items()]
    argv = ["--faults", "--quick", "--check", "faults.store_time", *env, " ".join(ZOO_PROGRAM)]
    assert main(argv) == 1
    first = capsys.readouterr().out
    seed = int(first.split("faults: seed ", 1)[1].split(" ", 1)[0])
    assert main([*argv[:-1], "--seed", str(seed), argv[-1]]) == 1
    again = capsys.readouterr().out
    line = next(x for x in first.splitlines() if x.startswith("faults.store_time"))
    replayed = next(x for x in again.splitlines() if x.startswith("faults.store_time"))
    assert line.split("  ")[1] == replayed.split("  ")[1] == "FAIL"
    assert f"replay: --seed {seed} --check faults.store_time" in again


def test_faults_needs_an_http_endpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--faults", "--env", f"LNK_BUCKET_URL=file://{tmp_path}", "lnk-bucket-store"]) == 2
    assert "--faults needs the driver's store endpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["--seed", "3", "lnk-bucket-store"])
    assert exited.value.code == 2


def test_the_racers_model_refuses_an_impossible_history() -> None:
    """A retry told `taken` about its own append: each reply plausible, no order explains them all."""
    from cloudstore.conformance.fault_checks import RacedOp, append_model
    from cloudstore.conformance.linear import linearizable

    def op(who: str, name: str, reply: dict, start: int, end: int, seq: int | None = None) -> RacedOp:
        request = {"op": name, "agent": {}, "thread": "t", **({"event": {"seq": seq}} if seq else {})}
        return RacedOp(who, request, reply, start, end)

    fine = [op("A", "last", {"reply": "last", "last": 0}, 0, 1),
            op("A", "append", {"reply": "done"}, 2, 5, 1),
            op("B", "append", {"reply": "taken", "last": 1}, 3, 6, 1),
            op("B", "last", {"reply": "last", "last": 1}, 7, 8)]
    assert linearizable(fine, 0, append_model).ok
    own_taken = [op("A", "append", {"reply": "taken", "last": 1}, 0, 3, 1),
                 op("B", "last", {"reply": "last", "last": 1}, 4, 5)]
    assert not linearizable(own_taken, 0, append_model).ok


def test_the_checks_built_on_lost_reply_judge_it_when_run_without_it(moto_server) -> None:
    """Not judged above only because lost_reply had shown the defect: alone, each catches it too."""
    built = {c.name for c in fault_checks.checks.checks if c.builds_on == "faults.lost_reply"}
    assert built == {"faults.own_write_replaced", "faults.racers_linearizable"}
    report = run(ZOO_PROGRAM, env={**moto_env(moto_server), "ZOO_BREAK": "sdk_retries"}, faults=True, quick=True,
                 seed=SEED, checks=sorted(built))
    assert report.failed_names() == built, report.failures()
    assert not report.unjudged_names()

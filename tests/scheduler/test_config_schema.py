"""The scheduler's config is read strictly, and its fire command gets a minimal environment.

* ``test_fire_sees_only_its_environment`` / ``test_runner_keeps_credentials_from_fire``:
  with AWS_SECRET_ACCESS_KEY and GOOGLE_APPLICATION_CREDENTIALS in the
  runner's environment, the fire command sees neither (nor any other of the
  runner's variables), and sees the base set, what ``fire_pass_env`` names
  and what ``fire_env`` sets, through the config as a runner reads it and in
  a real runner process firing a real job;
* ``test_bad_config_exits_2``: each value that used to crash with a
  traceback, be coerced (``"false"`` read as true, ``true`` as 1 worker) or
  be found only when jobs fired (a fire program that doesn't exist) exits 2
  at start-up with the key path on stderr, no traceback, nothing on stdout;
* ``test_bad_flags_exit_2``: a flag's value is held to the same rule;
* ``test_good_configs_still_load``: a config with every key, and shell lines
  whose first word the shell decides, still load, with their values typed;
* ``test_schema_paths``: the schema module names nested paths and refuses
  bool-for-int, non-finite numbers and null where not allowed;
* ``test_driver_does_not_import_the_schema``: a driver call's start-up cost
  does not grow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scheduler_rig import wait_for

from cloudstore import scheduler
from cloudstore.runtime.config_schema import Bool, Field, Int, ListOf, Nullable, Number, Obj, SchemaError, Str
from cloudstore.scheduling.config import ConfigError, load
from cloudstore.scheduling.store_client import Agent

SECRETS = {"AWS_SECRET_ACCESS_KEY": "aws-secret", "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcs.json",
           "AWS_ACCESS_KEY_ID": "aws-id", "LNK_BUCKET_URL": "file:///nowhere", "UNNAMED": "x"}
# Writes its whole environment, as JSON, to the file named by its argument.
DUMP_ENV = [sys.executable, "-S", "-c",
            "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))"]
GOOD = {"agents": [{"owner": None, "id": "a"}], "driver": "lnk-bucket-store", "fire": "true"}


def write(tmp_path: Path, config: Any, name: str = "c.json") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


def test_fire_sees_only_its_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {**SECRETS, "HTTPS_PROXY": "http://proxy:3128", "LC_TIME": "C", "TZ": "UTC"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    out = tmp_path / "env.json"
    config = {**GOOD, "fire": DUMP_ENV + [str(out)], "fire_env": {"JOB_API": "https://jobs", "TZ": "Europe/Paris"},
              "fire_pass_env": ["HTTPS_PROXY", "NOT_SET_ANYWHERE"]}
    settings = load(["--config", write(tmp_path, config), "--fire-env", "EXTRA=1"])
    fire = scheduler.fire_command(settings)  # what the runner fires with
    result = fire.run(Agent(owner="o", id="a"), {"id": "j", "spec": None, "due": 5}, False, stop=lambda: None)
    assert result.exit == 0, result
    env = json.loads(out.read_text())
    assert not set(SECRETS) & set(env), env
    assert env["PATH"] == os.environ["PATH"] and env["LC_TIME"] == "C" and env["HTTPS_PROXY"] == "http://proxy:3128"
    assert env["JOB_API"] == "https://jobs" and env["EXTRA"] == "1" and env["TZ"] == "Europe/Paris"
    assert "NOT_SET_ANYWHERE" not in env
    assert env["LNK_OWNER"] == "o" and env["LNK_AGENT_ID"] == "a" and env["LNK_JOB_ID"] == "j"
    allowed = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "HTTPS_PROXY", "JOB_API",
               "EXTRA", "LNK_OWNER", "LNK_AGENT_ID", "LNK_JOB_ID", "LNK_JOB_DUE"}
    # What the OS adds itself to a new process (glibc/CPython set none of these on Linux; macOS may).
    assert {k for k in env if not k.startswith("LC_")} - allowed <= {"__CF_USER_TEXT_ENCODING", "PWD"}


def test_runner_keeps_credentials_from_fire(tmp_path: Path) -> None:
    """A real runner process, a real file:// store, a job due now: its command sees no credential."""
    from cloudstore.protocol.client import ServeProcess

    store = tmp_path / "store"
    store.mkdir()
    out = tmp_path / "env.json"
    config = {"agents": [{"owner": None, "id": "a"}], "driver": "lnk-bucket-store",
              "driver_env": {"LNK_BUCKET_URL": store.as_uri()}, "fire": DUMP_ENV + [str(out)],
              "fire_env": {"JOB_API": "https://jobs"}, "fire_pass_env": ["HTTPS_PROXY"], "mark_interval": 0.05}
    env = {**os.environ, **SECRETS, "HTTPS_PROXY": "http://proxy:3128"}
    direct = ServeProcess("lnk-bucket-store", {"LNK_BUCKET_URL": store.as_uri()})
    runner = subprocess.Popen([sys.executable, "-m", "cloudstore.scheduler", "--config", write(tmp_path, config)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        reply = direct.request({"op": "job_put", "agent": {"owner": None, "id": "a"}, "place": "waiting",
                                "job": {"id": "j", "spec": None, "due": time.time()}})
        assert reply == {"reply": "done"}
        wait_for(lambda: out.exists() and out.stat().st_size > 0 or runner.poll() is not None, 30, "the job fired")
    finally:
        runner.terminate()
        stdout, stderr = runner.communicate(timeout=20)
        direct.close()
    assert stdout == b"", stdout
    seen = json.loads(out.read_text())
    assert not set(SECRETS) & set(seen), stderr.decode()
    assert seen["JOB_API"] == "https://jobs" and seen["HTTPS_PROXY"] == "http://proxy:3128"
    assert seen["LNK_AGENT_ID"] == "a" and "LNK_OWNER" not in seen


BAD_CONFIGS = [
    ({"lapse": None}, "lapse: must be a number"),
    ({"workers": None}, "workers: must be an integer"),
    ({"driver": 5}, "driver: must be a non-empty string or a non-empty list of strings, not 5"),
    ({"keep_ending": "false"}, 'keep_ending: must be true or false, not "false"'),
    ({"workers": True}, "workers: must be an integer from 1 to 1024, not true"),
    ({"workers": 2.0}, "workers: must be an integer"),
    ({"agents": [{"id": "a"}, {"id": "b"}, {"owner": 5, "id": "c"}]}, "agents[2].owner: must be a string or null"),
    ({"agents": [{"id": "a", "bridg": "/s"}]}, "agents[0].bridg: unknown key"),
    ({"agents": [{"owner": "o"}]}, "agents[0].id: is required"),
    ({"agents": [{"id": ""}]}, "agents[0].id: must be a non-empty string"),
    ({"agents": ["a"]}, "agents[0]: must be an object"),
    ({"agents": {"id": "a"}}, "agents: must be a list"),
    ({"lapse": -1}, "lapse: must be a number > 0"),
    ({"mark_interval": 0.001}, "mark_interval: must be a number >= 0.01"),
    ({"max_sleep": 10**400}, "max_sleep: must be a number"),
    ({"fire_timeout": "300"}, 'fire_timeout: must be a number > 0 and <= 604800, not "300"'),
    ({"runner": 7}, "runner: must be a non-empty string"),
    ({"driver": ["lnk-bucket-store", 1]}, "driver[1]: must be a string, not 1"),
    ({"driver": "  "}, "driver: names no program"),
    ({"driver": "a 'b"}, "driver: is not a command line"),
    ({"driver_env": {"K": 1}}, "driver_env.K: must be a string, not 1"),
    ({"driver_env": {"A=B": "1"}}, 'driver_env["A=B"]: must not hold \'=\''),
    ({"fire": []}, "fire: must be a non-empty list of strings, not []"),
    ({"fire": ["", "x"]}, "fire: must start with the program"),
    ({"fire": " "}, "fire: is a blank shell line"),
    ({"fire": None}, "fire: must be"),
    ({"fire_env": {"LNK_JOB_ID": "x"}}, "fire_env.LNK_JOB_ID: is set by the runner"),
    ({"fire_pass_env": "HOME"}, "fire_pass_env: must be a list"),
    ({"fire_pass_env": ["LNK_OWNER"]}, "fire_pass_env[0]: is set by the runner"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"fire": ["no-such-fire-program-x"]}, "fire: 'no-such-fire-program-x' is not an executable file"),
    ({"fire": "no-such-fire-program-y --flag; true"}, "fire: 'no-such-fire-program-y' is not an executable file"),
    ({"fire": "FOO=1 exec ./not-here"}, "fire: './not-here' is not an executable file"),
    ({"fire": [__file__]}, f"fire: {__file__!r} is not an executable file"),  # no x bit
    ({"log_file": ""}, "log_file: must be a non-empty string"),
    ({"log_file": 5}, "log_file: must be a non-empty string, not 5"),
    ({"log_file": "/l", "log_max_bytes": "64M"}, 'log_max_bytes: must be an integer from 4096 to 1099511627776, '
                                                 'not "64M"'),
    ({"log_file": "/l", "log_max_bytes": 100}, "log_max_bytes: must be an integer from 4096 to 1099511627776, not 100"),
    ({"log_file": "/l", "log_max_bytes": 1e6}, "log_max_bytes: must be an integer"),
    ({"log_file": "/l", "log_backups": 0}, "log_backups: must be an integer from 1 to 1000, not 0"),
    ({"log_file": "/l", "log_backups": True}, "log_backups: must be an integer from 1 to 1000, not true"),
]


def refusal(stderr: str) -> str:
    """The reason of the runner's one start-up refusal: one ERROR line of its log schema (issue 46), no
    traceback, no other line."""
    [line] = [json.loads(text) for text in stderr.splitlines()]
    assert (line["level"], line["event"], line["program"]) == ("ERROR", "refused", "lnk-cloud-scheduler"), line
    return str(line["message"])


@pytest.mark.parametrize("change, why", BAD_CONFIGS, ids=[w.split(":")[0] for _, w in BAD_CONFIGS])
def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, why: str) -> None:
    path = write(tmp_path, {**GOOD, **change})
    with pytest.raises(ConfigError) as err:
        load(["--config", path])
    assert why in str(err.value)
    assert scheduler.main(["--config", path]) == 2
    out, err_text = capsys.readouterr()
    reason = refusal(err_text)
    assert out == "" and why in reason
    assert reason.startswith(f"{path}: ") or reason.startswith("fire:")


@pytest.mark.parametrize("text, why", [
    ('{"lapse": NaN}', "NaN is not a JSON number"),
    ('{"lapse": 1e999}', "lapse: must be a number > 0 and <= 86400, not Infinity"),
    ('{"lapse": 1, "lapse": 2}', 'the key "lapse" appears twice'),
    ('[{"agents": []}]', "must be an object, not ["),
    ('{"agents": [', "not valid JSON"),
    ('{"agents": [{"id": "\\ud800"}]}', "agents[0].id: is not valid Unicode text"),
])
def test_bad_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, why: str) -> None:
    assert scheduler.main(["--config", write(tmp_path, text)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and why in refusal(err)


def test_fire_checked_in_a_real_start(tmp_path: Path) -> None:
    """As a program: a missing fire program stops it at start-up (exit 2), before any driver or job."""
    path = write(tmp_path, {**GOOD, "fire": ["no-such-fire-program-z"]})
    done = subprocess.run([sys.executable, "-m", "cloudstore.scheduler", "--config", path],
                          capture_output=True, timeout=30)
    assert done.returncode == 2 and done.stdout == b""
    assert b"no-such-fire-program-z" in done.stderr and b"Traceback" not in done.stderr


@pytest.mark.parametrize("flags, why", [
    (["--lapse", "nan"], "--lapse: must be a number"),
    (["--max-sleep", "inf"], "--max-sleep: must be a number"),
    (["--workers", "0"], "--workers: must be an integer from 1"),
    (["--runner-id", ""], "--runner-id: must be a non-empty string"),
    (["--fire", "   "], "--fire: is a blank shell line"),
    (["--fire-env", "LNK_JOB_ID=1"], "--fire-env LNK_JOB_ID: is set by the runner"),
    (["--fire-pass-env", "A=B"], "--fire-pass-env: must not hold '='"),
    (["--agent", "o:"], "--agent (its id): must be a non-empty string"),
    (["--log-file", "/l", "--log-max-bytes", "10"], "--log-max-bytes: must be an integer from 4096"),
    (["--log-file", "/l", "--log-backups", "1001"], "--log-backups: must be an integer from 1 to 1000"),
    (["--log-file", ""], "--log-file: must be a non-empty string"),
    (["--log-max-bytes", "8192"], "log_max_bytes (--log-max-bytes) shape the log file: give log_file"),
])
def test_bad_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], why: str) -> None:
    assert scheduler.main(["--config", write(tmp_path, GOOD), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and why in refusal(err)


def test_log_settings_alone_or_an_unwritable_log_file_exit_2(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``log_max_bytes``/``log_backups`` without ``log_file`` say nothing: refused; a log file that cannot be
    opened stops the runner at start-up, naming the setting and why, before any driver starts."""
    for change, why in [
        ({"log_backups": 2}, "log_backups (--log-backups) shape the log file: give log_file (--log-file) too"),
        ({"log_file": str(tmp_path)}, f"log_file {str(tmp_path)!r} cannot be written: Is a directory"),
        ({"log_file": str(tmp_path / "no" / "s.log")}, "cannot be written: No such file or directory"),
    ]:
        assert scheduler.main(["--config", write(tmp_path, {**GOOD, **change})]) == 2
        out, err = capsys.readouterr()
        assert out == "" and why in err and "Traceback" not in err, err


def test_good_configs_still_load(tmp_path: Path) -> None:
    full = {
        "agents": [{"owner": None, "id": "a"}, {"id": "b"}, {"owner": "", "id": "c", "bridge": None, "key_file": None},
                   {"owner": "o", "id": "d", "bridge": "/h/.link-store.sock", "key_file": "/h/d.key"}],
        "driver": ["lnk-bucket-store"], "driver_env": {"LNK_BUCKET_URL": "file:///srv/s", "EMPTY": ""},
        "fire": ["true", ""], "fire_env": {"JOB_API": "x"}, "fire_pass_env": ["HTTPS_PROXY", "HTTPS_PROXY"],
        "fire_timeout": 60, "lapse": 9, "mark_interval": 0.01, "max_sleep": 86400, "workers": 2,
        "keep_ending": True, "runner": "host-a",
    }
    s = load(["--config", write(tmp_path, full)])
    assert [a.agent for a in s.agents] == [
        Agent(owner=None, id="a"),
        Agent(owner=None, id="b"),
        Agent(owner="", id="c"),
        Agent(owner="o", id="d"),
    ]
    assert s.agents[3].bridge == "/h/.link-store.sock" and s.agents[2].bridge is None
    assert s.keep_ending is True and s.workers == 2 and type(s.workers) is int
    assert s.timing.lapse == 9.0 and s.timing.max_sleep == 86400.0 and s.fire_timeout == 60.0
    assert s.timing.poll_interval == 0.01  # mark_interval: the old name of poll_interval, still taken
    s = load(["--config", write(tmp_path, {**full, "poll_interval": 3})])
    assert s.timing.poll_interval == 3.0  # the new name wins
    assert s.fire_env == {"JOB_API": "x"} and s.fire_pass_env == ["HTTPS_PROXY"] and s.runner == "host-a"
    for line in ("true", "cd / && true", "exec true", "FOO=1 true --x", "$HOME/whatever", "if true; then :; fi",
                 "'/bin/sh' -c true"):
        assert load(["--config", write(tmp_path, {**GOOD, "fire": line})]).fire == line
    s = load(["--config", write(tmp_path, {**GOOD, "keep_ending": False, "lapse": 0.5})])
    assert s.keep_ending is False and s.timing.lapse == 0.5
    assert (s.log_file, s.log_max_bytes, s.log_backups) == (None, 64 * 1024 * 1024, 4)  # stderr; the defaults
    s = load(["--config", write(tmp_path, {**GOOD, "log_file": "/var/log/s.log", "log_max_bytes": 4096}),
              "--log-backups", "9"])
    assert (s.log_file, s.log_max_bytes, s.log_backups) == ("/var/log/s.log", 4096, 9)


def test_schema_paths() -> None:
    spec = Obj({"xs": Field(ListOf(Obj({"n": Field(Int(1, 9)), "b": Field(Bool()), "s": Field(Nullable(Str())),
                                        "f": Field(Number(0, 1, low_included=True))})), required=True)})
    assert spec.check({"xs": [{"n": 1, "b": False, "s": None, "f": 0}]}, "") == {
        "xs": [{"n": 1, "b": False, "s": None, "f": 0.0}]}
    for value, path in [
        ({"xs": [{}, {"n": True}]}, "xs[1].n"),
        ({"xs": [{"n": 10}]}, "xs[0].n"),
        ({"xs": [{"b": 0}]}, "xs[0].b"),
        ({"xs": [{"s": ""}]}, "xs[0].s"),
        ({"xs": [{"f": float("nan")}]}, "xs[0].f"),
        ({"xs": [{"f": True}]}, "xs[0].f"),
        ({"xs": [{"f": None}]}, "xs[0].f"),
        ({"xs": [{"weird key": 1}]}, 'xs[0]["weird key"]'),
        ({}, "xs"),
    ]:
        with pytest.raises(SchemaError) as err:
            spec.check(value, "")
        assert err.value.path == path and str(err.value).startswith(path + ": ")


def test_driver_does_not_import_the_schema(tmp_path: Path) -> None:
    """``lnk-bucket-store call`` start-up: nothing of the config readers is imported."""
    code = (
        "import io, json, sys; from cloudstore import driver;"
        "req = io.BytesIO(b'{\"op\": \"job_mark\", \"agent\": {\"id\": \"a\", \"owner\": null}}');"
        "out = io.StringIO(); driver.run(driver.BUCKET, ['call'], stdin=req, stdout=out);"
        "ours = sorted(m for m in sys.modules if m.startswith('cloudstore'));"
        "sys.__stdout__.write(json.dumps([out.getvalue(), ours]))"
    )
    env = {**os.environ, "LNK_BUCKET_URL": tmp_path.as_uri()}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    reply, modules = json.loads(done.stdout)
    assert json.loads(reply)["reply"] == "mark", reply
    assert "cloudstore.driver" in modules
    assert not [m for m in modules if "config_schema" in m or "scheduler" in m or "bridge" in m], modules

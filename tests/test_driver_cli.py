"""The drivers' commands: what each prints, exit codes, settings, and stdout discipline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cloudstore.protocol.client import call_once

DRIVERS = [("lnk-gcs", "LNK_GCS_URL"), ("lnk-bucket-store", "LNK_BUCKET_URL")]
NO_SETTINGS = {"LNK_GCS_URL": "", "LNK_BUCKET_URL": ""}


def run(argv: list[str], stdin: bytes = b"", env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(argv, input=stdin, capture_output=True, env=full, timeout=60)


@pytest.mark.parametrize("program,setting", DRIVERS)
def test_contract_version_help_without_settings(program, setting):
    done = run([program, "contract"], env=NO_SETTINGS)
    assert done.returncode == 0
    assert done.stdout.decode().splitlines() == ['{"version": 1, "serve": true, "jobs": true, "files": true}']
    version = run([program, "--version"], env=NO_SETTINGS)
    assert version.returncode == 0 and len(version.stdout.decode().splitlines()) == 1
    helped = run([program, "--help"], env=NO_SETTINGS)
    assert helped.returncode == 0 and setting in helped.stdout.decode()


@pytest.mark.parametrize("program,setting", DRIVERS)
def test_contract_imports_no_cloud_sdk(program, setting):
    """contract/--help must not pay for google-cloud-storage or boto3 (lazy imports)."""
    code = (
        "import sys, io; from cloudstore import driver; out = io.StringIO();"
        f"driver.run(driver.{'GCS' if program == 'lnk-gcs' else 'BUCKET'}, ['contract'], stdout=out);"
        "heavy = [m for m in ('google.cloud.storage', 'boto3', 'botocore', 'tenacity') if m in sys.modules];"
        "print(heavy)"
    )
    done = run([sys.executable, "-c", code])
    assert done.stdout.decode().strip() == "[]", done.stderr.decode()


@pytest.mark.parametrize("program,setting", DRIVERS)
@pytest.mark.parametrize("argv", [[], ["call", "x"], ["bogus"], ["serve", "extra"], ["contract", "call"]])
def test_usage_errors_exit_2_with_empty_stdout(program, setting, argv):
    done = run([program, *argv])
    assert done.returncode == 2
    assert done.stdout == b""
    assert program in done.stderr.decode()


@pytest.mark.parametrize("program,setting", DRIVERS)
@pytest.mark.parametrize("value", ["", "http://x/y", "gs://", "s3://Bad_Bucket!", "file://relative/path", "file:///"])
def test_missing_or_malformed_setting_is_an_error_reply_naming_it(program, setting, value):
    request = {"op": "last", "agent": {"id": "a", "owner": None}, "thread": "t"}
    lines, _, code = call_once(program, request, env={setting: value})
    assert code == 0 and len(lines) == 1
    reply = json.loads(lines[0])
    assert reply["reply"] == "error" and setting in reply["error"]
    told = value.split("://", 1)[-1]
    assert len(told) < 2 or told not in reply["error"], (
        "the reply names the setting, never its value (a bucket, a folder)"
    )


def test_call_reads_one_request_and_prints_one_line(store):
    request = {"op": "append", "agent": {"id": "a", "owner": None}, "thread": "t", "event": {"seq": 1}}
    lines, _, code = call_once(store.program, request, env=store.env)
    assert code == 0 and lines == ['{"reply": "done"}']
    lines, _, code = call_once(
        store.program, b'{"op": "last", "agent": {"id": "a"}, "thread": "t"}\n{"op": "x"}', env=store.env
    )
    assert code == 0 and len(lines) == 1 and json.loads(lines[0])["reply"] == "error"


def test_serve_answers_each_line_and_goes_on_after_errors(store):
    agent = '{"id": "a", "owner": "o"}'
    lines = [
        b"not json",
        b"[1, 2]",
        b'{"op": "nope", "agent": ' + agent.encode() + b"}",
        b'{"op": "append", "agent": ' + agent.encode() + b', "thread": "t", "event": {"seq": 1.0}}',
        b'{"op": "append", "agent": ' + agent.encode() + b', "thread": "t", "event": {"seq": 1}}',
        b'{"op": "last", "agent": ' + agent.encode() + b', "thread": "t"}',
        b'{"op": "append", "agent": {"id": ""}, "thread": "t", "event": {"seq": 2}}',
        b'{"op": "last", "agent": ' + agent.encode() + b', "thread": "t"}',
        b'{"op": "read", "agent": ' + agent.encode() + b', "thread": "t", "first": NaN}',
    ]
    done = run([store.program, "serve"], stdin=b"\n".join(lines) + b"\n", env=store.env)
    assert done.returncode == 0
    replies = [json.loads(x) for x in done.stdout.decode().splitlines()]
    assert [r["reply"] for r in replies] == [
        "error",
        "error",
        "error",
        "error",
        "done",
        "last",
        "error",
        "last",
        "error",
    ]
    assert replies[5]["last"] == 1 and replies[7]["last"] == 1
    assert all(isinstance(r.get("error", ""), str) for r in replies)

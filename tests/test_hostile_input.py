"""Input that breaks a rule gets a clear error reply; nothing stored changes; the driver keeps serving.

Issue 12 found numbers no double holds (``1e999`` parsed as infinity and
stored, after which ``read``, ``job_get`` and ``job_list`` crashed the driver,
and a waiting due of ``-1e999`` crashed ``job_next`` for every agent of the
store), and lone surrogates in names answered as internal errors.
"""

from __future__ import annotations

import json

import pytest
from support import Session

NOT_A_DOUBLE = ["1e999", "-1e999", "1E400", "-2.5e308"]


def line(request: str) -> bytes:
    return request.encode("utf-8")


def error_of(session: Session, raw: str) -> str:
    reply = json.loads(session.proc.request_line(line(raw), timeout=60))
    assert reply.get("reply") == "error" and set(reply) == {"reply", "error"}, reply
    return reply["error"]


@pytest.mark.parametrize("number", NOT_A_DOUBLE)
def test_numbers_no_double_holds_are_refused_and_nothing_is_stored(session: Session, number: str) -> None:
    agent = json.dumps(session.agent)
    why = error_of(
        session, f'{{"op": "append", "agent": {agent}, "thread": "t", "event": {{"seq": 1, "x": {number}}}}}'
    )
    assert "double" in why
    assert session("last", thread="t") == {"reply": "last", "last": 0}
    why = error_of(session, f'{{"op": "job_put", "agent": {agent}, "place": "waiting", '
                            f'"job": {{"id": "j", "spec": {number}, "due": 5}}}}')
    assert "double" in why
    why = error_of(session, f'{{"op": "job_put", "agent": {agent}, "place": "waiting", '
                            f'"job": {{"id": "j", "spec": null, "due": {number}}}}}')
    assert "double" in why
    assert session("job_get", place="waiting", id="j") == {"reply": "job", "job": None}
    assert session("job_list", place="waiting") == {"reply": "jobs", "jobs": []}
    # and the driver still answers, with the largest doubles and integers kept exactly
    assert session("append", thread="t", event={"seq": 1, "big": 1.7976931348623157e308, "int": 10**400}) == {
        "reply": "done"}
    assert session("read", thread="t")["events"] == [{"seq": 1, "big": 1.7976931348623157e308, "int": 10**400}]


@pytest.mark.parametrize("field", ["id", "owner", "thread", "holder", "tools"])
def test_a_lone_surrogate_in_a_name_is_a_malformed_request(session: Session, field: str) -> None:
    lone = '"a\\ud800b"'
    agent = {"id": session.agent["id"], "owner": session.agent["owner"]}
    raw_agent = json.dumps(agent)
    if field in ("id", "owner"):
        raw_agent = raw_agent.replace(json.dumps(agent[field]), lone)
    thread = lone if field == "thread" else '"t"'
    holder = lone if field == "holder" else '"h"'
    if field == "tools":
        raw = f'{{"op": "tools_narrow", "agent": {raw_agent}, "thread": "t", "tools": [{lone}]}}'
    else:
        raw = f'{{"op": "take", "agent": {raw_agent}, "thread": {thread}, "holder": {holder}, "lapse_ms": 1000}}'
    why = error_of(session, raw)
    assert "surrogate" in why and "internal" not in why
    assert session("leases", lapse_ms=1000) == {"reply": "leases", "leases": []}
    assert session("tools_read", thread="t") == {"reply": "tools", "tools": None}


DUPLICATED = [
    # (a key given twice: top level, in the agent, in an event, in a job's spec), each value of it legal alone
    '{{"op": "append", "agent": {agent}, "thread": "t", "thread": "u", "event": {{"seq": 1}}}}',
    '{{"op": "append", "agent": {{"id": {id}, "id": "other", "owner": {owner}}}, "thread": "t", '
    '"event": {{"seq": 1}}}}',
    '{{"op": "append", "agent": {agent}, "thread": "t", "event": {{"seq": 1, "x": 1, "x": 2}}}}',
    '{{"op": "job_put", "agent": {agent}, "place": "waiting", '
    '"job": {{"id": "j", "spec": {{"a": 1, "a": 1}}, "due": 5}}}}',
]


@pytest.mark.parametrize("raw", DUPLICATED)
def test_a_key_given_twice_is_refused_by_the_driver_as_by_the_bridge(session: Session, raw: str) -> None:
    """wire.md is silent on duplicate keys; a request holding one is ambiguous, so the driver refuses it
    (as the bridge does, with the same parser) and nothing changes."""
    from cloudstore.bridge.rules import Refused, parse_line

    request = raw.format(agent=json.dumps(session.agent), id=json.dumps(session.agent["id"]),
                         owner=json.dumps(session.agent["owner"]))
    why = error_of(session, request)
    assert "appears twice" in why and "internal" not in why, why
    with pytest.raises(Refused) as refused:
        parse_line(line(request), "request")
    assert str(refused.value) == why
    for thread in ("t", "u"):
        assert session("last", thread=thread) == {"reply": "last", "last": 0}
    assert session("job_list", place="waiting") == {"reply": "jobs", "jobs": []}
    # and the driver still answers
    assert session("append", thread="t", event={"seq": 1, "x": 2}) == {"reply": "done"}


def test_local_folder_objects_are_private_and_links_are_never_followed(tmp_path) -> None:
    """The folder store: 0700 folders, 0600 files; a link planted in it is refused, never served."""
    import base64
    import os

    from cloudstore.protocol.service import Service
    from cloudstore.settings import open_store, parse_location
    from cloudstore.store.space import Space

    loc = parse_location("LNK_BUCKET_URL", f"file://{tmp_path}/store", ("file",))
    service = Service(Space(open_store(loc), loc.prefix))
    agent = {"id": "a", "owner": None}
    data = base64.b64encode(b"secret").decode()
    assert service.answer({"op": "file_write", "agent": agent, "path": "skills/s/SKILL.md", "data": data,
                           "version": 0}) == {"reply": "wrote", "version": 1}
    assert service.answer({"op": "append", "agent": agent, "thread": "t", "event": {"seq": 1}}) == {"reply": "done"}
    for folder, dirs, files in os.walk(tmp_path / "store"):
        for name in dirs:
            assert os.stat(os.path.join(folder, name)).st_mode & 0o777 == 0o700, name
        for name in files:
            assert os.stat(os.path.join(folder, name)).st_mode & 0o777 == 0o600, name
    # a link put where the file's object is: file_read refuses it, never serves the host file
    # the key is f/skills/s/SKILL.md% (keys.FILE_END); the folder store adds "=" to an object's name
    (obj,) = [os.path.join(f, n) for f, _, ns in os.walk(tmp_path / "store") for n in ns if n == "SKILL.md%="]
    os.replace(obj, obj + ".moved")
    os.symlink("/etc/hostname", obj)
    reply = service.answer({"op": "file_read", "agent": agent, "path": "skills/s/SKILL.md"})
    assert reply["reply"] == "error" and "link" in reply["error"], reply
    assert service.answer({"op": "file_list", "agent": agent, "folder": "skills"}) == {"reply": "files", "files": []}


def test_long_path_parts_ending_in_dots_are_their_own_files(store_env) -> None:
    """``skills/`` + 200 x ``a`` + ``../x`` once was ``skills/x`` on a folder, and set its version back."""
    import base64

    from support import service_of

    service = service_of(store_env)
    agent = {"id": "a", "owner": "o"}

    def write(path: str, text: bytes, version: int) -> dict:
        return service.answer({"op": "file_write", "agent": agent, "path": path,
                               "data": base64.b64encode(text).decode(), "version": version})

    assert write("skills/x", b"one", 0) == {"reply": "wrote", "version": 1}
    assert write("skills/x", b"two", 1) == {"reply": "wrote", "version": 2}
    for tail in ("..", "."):
        alias = "skills/" + "a" * 200 + tail + "/x"
        assert write(alias, b"alias", 0) == {"reply": "wrote", "version": 1}
        got = service.answer({"op": "file_read", "agent": agent, "path": alias})
        assert got == {"reply": "file", "file": {"data": base64.b64encode(b"alias").decode(), "version": 1}}
    assert service.answer({"op": "file_read", "agent": agent, "path": "skills/x"}) == {
        "reply": "file", "file": {"data": base64.b64encode(b"two").decode(), "version": 2}}
    listed = service.answer({"op": "file_list", "agent": agent, "folder": "skills"})["files"]
    assert sorted(listed) == sorted(["skills/x", "skills/" + "a" * 200 + "../x", "skills/" + "a" * 200 + "./x"])


def test_debug_logs_carry_the_projects_lines_and_never_a_credential(store, tmp_path) -> None:
    """LNK_STORE_LOG=debug once set the root logger to DEBUG: botocore logged the session token,
    the access key id and the signature of every request."""
    from support import fresh_agent

    from cloudstore.protocol.client import ServeProcess

    secret = {"AWS_ACCESS_KEY_ID": "AKIDMARKER0000000000", "AWS_SECRET_ACCESS_KEY": "secretmarker",
              "AWS_SESSION_TOKEN": "tokenmarker0000"}
    env = {**store.env, "LNK_STORE_LOG": "debug", **(secret if store.backend == "moto" else {})}
    log_path = tmp_path / "stderr.log"
    with open(log_path, "wb") as log_file:
        proc = ServeProcess(store.program, env=env, stderr=log_file)
        try:
            agent = fresh_agent()
            assert proc.request({"op": "append", "agent": agent, "thread": "t", "event": {"seq": 1}},
                                timeout=60) == {"reply": "done"}
            assert proc.request({"op": "read", "agent": agent, "thread": "t"}, timeout=60)["reply"] == "events"
        finally:
            proc.close()
    text = log_path.read_text(errors="replace")
    assert "op=append" in text and "op=read" in text, text[-2000:]
    for word in ("x-amz-security-token", "Signature=", "Authorization", *secret.values()):
        assert word not in text, f"{word!r} in the driver's log"


@pytest.mark.parametrize("program,setting", [("lnk-bucket-store", "LNK_BUCKET_URL"), ("lnk-gcs", "LNK_GCS_URL")])
def test_a_store_that_cannot_be_opened_is_an_error_reply_that_names_no_place(program, setting, tmp_path) -> None:
    """A folder that cannot be made once crashed ``call`` with a traceback and no reply line;
    the reply names the setting and what failed, never the folder, bucket or endpoint."""
    import os
    import subprocess

    blocker = tmp_path / "a-file-not-a-folder"
    blocker.write_text("")
    url = f"file://{blocker}/store" if setting == "LNK_BUCKET_URL" else "gs://hidden-bucket/prefix"
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "LNK_GCS_URL", "LNK_BUCKET_URL")}
    env.update({setting: url, "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
                "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "True"})
    done = subprocess.run([program, "call"], input=line('{"op": "last", "agent": {"id": "a"}, "thread": "t"}'),
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    replies = done.stdout.decode().splitlines()
    assert len(replies) == 1, done.stdout
    reply = json.loads(replies[0])
    assert reply["reply"] == "error" and reply["error"].startswith(f"{setting} names a store that cannot be opened")
    for place in (str(tmp_path), "hidden-bucket", "a-file-not-a-folder"):
        assert place not in reply["error"]


def test_a_huge_unknown_op_is_not_echoed_whole(tmp_path) -> None:
    """An unknown op of 900 KB was echoed whole into the error reply and the debug log line."""
    import subprocess

    request = json.dumps({"op": "x" * 900_000, "agent": {"id": "a"}})
    done = subprocess.run(["lnk-bucket-store", "call"], input=line(request), capture_output=True, timeout=120,
                          env={**__import__("os").environ, "LNK_BUCKET_URL": f"file://{tmp_path}",
                               "LNK_STORE_LOG": "debug"})
    reply = json.loads(done.stdout)
    assert reply["reply"] == "error" and reply["error"].startswith("unknown op 'xxx")
    assert len(done.stdout) < 500 and len(done.stderr) < 1000, (len(done.stdout), len(done.stderr))

"""One call at a time through a real bridge and real driver processes:
who is answered, what is refused before any driver runs, and how driver
failures are worded."""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import threading

import pytest
from bridge_helpers import FAKE_DRIVER, error_word, process_gone, wait_for

from cloudstore.bridge import Limits, exchange, proof_line
from cloudstore.bridge.proof import new_key_hex


def last(client, thread: str = "t1") -> dict:
    return client.op("last", thread=thread)


# -- who is answered -----------------------------------------------------------


def test_right_key_is_answered_with_the_agents_chats_as_store_dir(rig):
    r = rig()
    reply = last(r.client())
    assert reply["reply"] == "done"
    assert reply["store_dir"] == os.path.join(r.agents[0].folder, "chats")
    (rec,) = r.records()
    assert rec["agent"] == {"id": "a1", "owner": "o1"} and rec["op"] == "last"


def test_wrong_key_is_refused_and_no_driver_runs(rig):
    r = rig()
    reply = last(r.client(key=bytes.fromhex(new_key_hex())))
    assert error_word(reply) == "refused"
    assert r.records() == []


def test_request_naming_another_served_agent_is_refused(rig):
    r = rig(agents=[("o1", "a1"), ("o1", "a2")])
    a1 = r.client(0)
    reply = a1.request({"op": "last", "agent": {"id": "a2", "owner": "o1"}, "thread": "t"})
    assert error_word(reply) == "refused"
    assert "another agent" in reply["error"]
    assert r.records() == []
    assert last(r.client(1))["reply"] == "done"  # a2 itself is answered


def test_proof_for_an_agent_not_served_is_refused_even_with_its_own_key(rig):
    r = rig()
    key = bytes.fromhex(new_key_hex())
    stranger = r.client(owner="o1", agent_id="stranger", key=key)
    assert error_word(last(stranger)) == "refused"
    assert r.records() == []


def test_owner_null_and_empty_owner_are_different_agents(rig):
    r = rig(agents=[(None, "a")])
    spec = r.agents[0]
    # Same key, same id, owner "" instead of null: a different agent, refused.
    assert error_word(last(r.client(owner=""))) == "refused"
    # Proved as owner null, a request naming owner "" is another agent's.
    reply = r.client().request({"op": "last", "agent": {"id": "a", "owner": ""}, "thread": "t"})
    assert error_word(reply) == "refused"
    assert r.records() == []
    # Owner left out of the request is null: the proved agent.
    reply = r.client().request({"op": "last", "agent": {"id": "a"}, "thread": "t"})
    assert reply["reply"] == "done"
    assert r.records()[0]["agent"] == {"id": "a"}
    assert spec.owner is None


def test_malformed_lines_are_refused(rig):
    r = rig()
    c = r.client()
    good_proof = proof_line(r.agents[0].key, "o1", "a1")
    request = json.dumps({"op": "last", "agent": c.agent, "thread": "t"}).encode()
    cases = [
        [b"not json", request],
        [json.dumps({"agent": c.agent, "proof": "AB" * 32}).encode(), request],  # upper-case hex
        [json.dumps({"agent": c.agent}).encode(), request],
        [good_proof, b"not json"],
        [good_proof, b"[1, 2]"],
        # Two "agent" keys: which one a driver would act on is the parser's guess.
        [
            good_proof,
            b'{"op": "last", "agent": {"id": "zz", "owner": "o1"}, '
            b'"agent": {"id": "a1", "owner": "o1"}, "thread": "t"}',
        ],
        [good_proof, b'{"op": "last", "agent": {"id": "a1", "owner": "o1"}, "thread": NaN}'],
    ]
    for lines in cases:
        reply = json.loads(exchange(r.socket_path, lines, timeout=30))
        assert error_word(reply) == "refused", (lines, reply)
    assert r.records() == []


# -- running drivers -------------------------------------------------------------


def test_serve_driver_is_kept_running_between_calls(rig):
    r = rig()
    c = r.client()
    first, second = last(c), last(c)
    assert first["pid"] == second["pid"]
    assert second["n"] == first["n"] + 1
    assert {rec["mode"] for rec in r.records()} == {"serve"}


def test_driver_without_serve_is_run_once_per_call(rig):
    r = rig(contract={"version": 1})
    c = r.client()
    pids = {last(c)["pid"] for _ in range(3)}
    assert len(pids) == 3
    assert [rec["mode"] for rec in r.records()] == ["call"] * 3


def test_serve_processes_are_kept_per_agent(rig):
    """LNK_STORE_DIR is set when a process starts, so no process serves two agents."""
    r = rig(agents=[("o", "a1"), ("o", "a2")])
    one, two = last(r.client(0)), last(r.client(1))
    assert one["pid"] != two["pid"]
    assert one["store_dir"] != two["store_dir"]
    assert last(r.client(0))["pid"] == one["pid"]


def test_drivers_own_error_is_passed_on_as_it_is(rig):
    r = rig()
    assert last(r.client(), "error") == {"reply": "error", "error": "fake driver error"}


@pytest.mark.parametrize("contract", [None, {"version": 1}], ids=["serve", "call"])
@pytest.mark.parametrize("thread", ["junk", "die"])
def test_failed_driver_is_a_driver_error_and_the_next_call_works(rig, contract, thread):
    r = rig(contract=contract)
    c = r.client()
    reply = last(c, thread)
    assert error_word(reply) == "driver", reply
    after = last(c)
    assert after["reply"] == "done"
    failed_pid = r.records()[0]["pid"]
    assert after["pid"] != failed_pid


def test_killed_serve_process_is_replaced(rig):
    r = rig()
    c = r.client()
    pid = last(c)["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_gone(pid), what=f"driver {pid} to die")
    after = last(c)
    assert after["reply"] == "done" and after["pid"] != pid


@pytest.mark.parametrize("contract", [None, {"version": 1}], ids=["serve", "call"])
def test_hanging_driver_times_out_while_other_calls_are_answered(rig, contract):
    r = rig(agents=[("o", "a1"), ("o", "a2")], contract=contract, limits=Limits(call_timeout=3.0))
    box: list[dict] = []
    hung = threading.Thread(target=lambda: box.append(last(r.client(0), "hang")))
    hung.start()
    rec = wait_for(
        lambda: [x for x in r.records() if x["thread"] == "hang"], what="the hanging call to reach its driver"
    )
    assert last(r.client(1))["reply"] == "done"  # answered while the other hangs
    hung.join(60)
    (reply,) = box
    assert error_word(reply) == "timeout", reply
    wait_for(lambda: process_gone(rec[0]["pid"]), what="the hung driver to be stopped")
    assert last(r.client(0))["reply"] == "done"


# -- what is refused before a driver runs ----------------------------------------


def test_symlinked_agent_folder_is_refused(rig, short_dir):
    r = rig()
    folder = r.agents[0].folder
    os.rename(folder, folder + ".real")
    os.symlink(folder + ".real", folder)
    reply = last(r.client())
    assert error_word(reply) == "refused" and "symbolic link" in reply["error"]
    assert folder not in reply["error"] and str(short_dir) not in reply["error"]  # no host path to the agent
    assert r.records() == []


def test_symlinked_chats_folder_is_refused(rig, short_dir):
    r = rig()
    chats = os.path.join(r.agents[0].folder, "chats")
    os.rmdir(chats)
    os.mkdir(str(short_dir / "elsewhere"))
    os.symlink(str(short_dir / "elsewhere"), chats)
    reply = last(r.client())
    assert error_word(reply) == "refused" and "chats/" in reply["error"]
    assert str(short_dir) not in reply["error"], reply  # the role, not the host path (issue 25, case 7)
    assert r.records() == []
    os.unlink(chats)  # judged afresh each call: fixed, answered again
    os.mkdir(chats)
    assert last(r.client())["reply"] == "done"


def test_job_and_file_ops_refused_when_the_contract_lacks_them(rig):
    r = rig()  # serve only: no jobs, no files
    c = r.client()
    reply = c.op("job_count", place="waiting")
    assert error_word(reply) == "refused" and "jobs" in reply["error"]
    reply = c.op("file_read", path="skills/a/SKILL.md")
    assert error_word(reply) == "refused" and "files" in reply["error"]
    assert r.records() == []


def test_job_and_file_ops_reach_a_driver_that_keeps_them(rig):
    r = rig(contract={"version": 1, "serve": True, "jobs": True, "files": True})
    c = r.client()
    assert c.op("job_count", place="waiting")["reply"] == "done"
    assert c.op("file_read", path="skills/a/SKILL.md")["reply"] == "done"
    assert [x["op"] for x in r.records()] == ["job_count", "file_read"]


FOUR_MIB = 4 * 1024 * 1024
GOOD = base64.b64encode(b"hello").decode()

BAD_FILE_OPS = {
    "absolute": {"op": "file_read", "path": "/skills/a.md"},
    "dotdot": {"op": "file_read", "path": "skills/../instructions/x"},
    "dot": {"op": "file_read", "path": "skills/./x"},
    "empty part": {"op": "file_read", "path": "skills//x"},
    "other root": {"op": "file_read", "path": "notes/x"},
    "nul": {"op": "file_read", "path": "skills/a\x00b"},
    "too long": {"op": "file_read", "path": "skills/" + "x" * 1020},
    "not a string": {"op": "file_read", "path": 7},
    "missing": {"op": "file_remove", "version": 1},
    "list two slashes": {"op": "file_list", "folder": "skills//"},
    "list other root": {"op": "file_list", "folder": "tmp/"},
    "no padding": {"op": "file_write", "path": "skills/a", "data": "aGVsbG8", "version": 0},
    "urlsafe": {"op": "file_append", "path": "skills/a", "data": "-_-_"},
    "whitespace": {"op": "file_append", "path": "skills/a", "data": "aGVs bG8="},
    "non-canonical": {"op": "file_append", "path": "skills/a", "data": "aGVsbG9="},
    "over 4 MiB": {"op": "file_write", "path": "skills/a", "version": 0,
                   "data": base64.b64encode(b"\0" * (FOUR_MIB + 1)).decode()},
    "257 tools": {"op": "tools_narrow", "thread": "t", "tools": [f"t{i}" for i in range(257)]},
}


@pytest.mark.parametrize("name", list(BAD_FILE_OPS))
def test_bad_file_and_tools_arguments_are_refused_before_the_driver_runs(rig, name):
    r = rig(contract={"version": 1, "serve": True, "files": True})
    c = r.client()
    reply = c.request({**BAD_FILE_OPS[name], "agent": c.agent})
    assert error_word(reply) == "refused", reply
    assert r.records() == []


def test_good_file_and_tools_arguments_reach_the_driver(rig):
    r = rig(contract={"version": 1, "serve": True, "files": True})
    c = r.client()
    ok = [
        {"op": "file_write", "path": "instructions/instruction.md", "data": GOOD, "version": 0},
        {"op": "file_append", "path": "skills/greet/SKILL.md",
         "data": base64.b64encode(b"\0" * FOUR_MIB).decode()},  # exactly 4 MiB
        {"op": "file_list", "folder": "skills/"},
        {"op": "file_list", "folder": "skills"},
        {"op": "tools_narrow", "thread": "t", "tools": [f"t{i}" for i in range(256)]},
    ]
    for request in ok:
        assert c.op(**request)["reply"] == "done", request["op"]
    assert len(r.records()) == len(ok)


# -- the socket ------------------------------------------------------------------


def test_stop_ends_every_driver_process(rig):
    r = rig(agents=[("o", "a1"), ("o", "a2")])
    pids = {last(r.client(0))["pid"], last(r.client(1))["pid"]}
    r.bridge.stop()
    for pid in pids:
        wait_for(lambda pid=pid: process_gone(pid), what=f"driver {pid} to end")
    assert r.agents[0].key.hex() not in repr(r.agents[0])  # a key never reaches a log line


def test_socket_is_0600_and_removed_at_stop(rig):
    r = rig()
    info = os.lstat(r.socket_path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    r.bridge.stop()
    assert not os.path.exists(r.socket_path)


def test_stale_socket_is_replaced_but_a_file_or_a_live_bridge_is_not(rig, short_dir):
    import socket as socketlib

    from cloudstore.bridge import SOCKET_NAME, StoreBridge
    from cloudstore.bridge.listener import SocketInUse

    stale_dir = short_dir / "stale"
    stale_dir.mkdir()
    leftover = socketlib.socket(socketlib.AF_UNIX)
    leftover.bind(str(stale_dir / SOCKET_NAME))  # bound, never listening, left behind
    leftover.close()
    spec = rig().agents[0]
    with StoreBridge(stale_dir, [spec], FAKE_DRIVER) as bridge:
        assert stat.S_IMODE(os.lstat(bridge.socket_path).st_mode) == 0o600
        with pytest.raises(SocketInUse, match="another bridge"):
            StoreBridge(stale_dir, [spec], FAKE_DRIVER).start()
    file_dir = short_dir / "file"
    file_dir.mkdir()
    (file_dir / SOCKET_NAME).write_text("not a socket")
    with pytest.raises(SocketInUse, match="not a socket"):
        StoreBridge(file_dir, [spec], FAKE_DRIVER).start()
    assert (file_dir / SOCKET_NAME).read_text() == "not a socket"

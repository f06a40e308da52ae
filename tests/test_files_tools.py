"""Files and tool narrowing through the real drivers, on every backend."""

from __future__ import annotations

import base64

import pytest
from support import Session, fresh_agent, race, service_of, serving


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


#: Run on the folder only (conftest): the conformance suite's ``list_limit`` check makes the same
#: 4,097 writes and listing through each driver on moto and fake-gcs-server (2-3 CI minutes there).
FOLDER_ONLY = frozenset({"test_a_folder_of_more_than_4096_files_is_refused_never_cut"})


def test_write_read_list_remove(session):
    s = session
    assert s("file_read", path="skills/greet/SKILL.md") == {"reply": "file", "file": None}
    assert s("file_write", path="skills/greet/SKILL.md", data=b64(b"hi"), version=0) == {"reply": "wrote", "version": 1}
    assert s("file_write", path="skills/greet/SKILL.md", data=b64(b"x"), version=0) == {"reply": "stale", "version": 1}
    assert s("file_write", path="skills/greet/SKILL.md", data=b64(b"hello"), version=1) == {
        "reply": "wrote",
        "version": 2,
    }
    assert s("file_read", path="skills/greet/SKILL.md") == {
        "reply": "file",
        "file": {"data": b64(b"hello"), "version": 2},
    }
    s("file_write", path="instructions/instruction.md", data=b64(b""), version=0)
    s("file_write", path="skills/a/b/c.txt", data=b64(b"deep"), version=0)
    s("file_write", path="skills/greeting", data=b64(b"not under greet/"), version=0)
    assert s("file_list", folder="skills")["files"] == ["skills/a/b/c.txt", "skills/greet/SKILL.md", "skills/greeting"]
    assert s("file_list", folder="skills/")["files"] == s("file_list", folder="skills")["files"]
    assert s("file_list", folder="skills/greet/")["files"] == ["skills/greet/SKILL.md"]
    assert s("file_list", folder="instructions")["files"] == ["instructions/instruction.md"]
    assert s("file_read", path="instructions/instruction.md")["file"] == {"data": "", "version": 1}
    assert s("file_remove", path="skills/greet/SKILL.md", version=1) == {"reply": "found", "found": False}
    assert s("file_remove", path="skills/greet/SKILL.md", version=2) == {"reply": "found", "found": True}
    assert s("file_remove", path="skills/greet/SKILL.md", version=2) == {"reply": "found", "found": False}
    assert s("file_read", path="skills/greet/SKILL.md")["file"] is None
    assert s("file_list", folder="skills/greet")["files"] == []


def test_versions_never_come_back(session):
    s = session
    path = "skills/v/SKILL.md"
    given = []
    for _ in range(3):
        wrote = s("file_write", path=path, data=b64(b"same bytes"), version=0)
        assert wrote["reply"] == "wrote"
        given.append(wrote["version"])
        again = s("file_write", path=path, data=b64(b"same bytes"), version=wrote["version"])
        given.append(again["version"])
        assert s("file_remove", path=path, version=again["version"])["found"] is True
    appended = s("file_append", path=path, data=b64(b"x"))
    given.append(appended["version"])
    assert len(set(given)) == len(given), given
    for old in given[:-1]:
        assert s("file_write", path=path, data=b64(b"late writer"), version=old) == {
            "reply": "stale",
            "version": given[-1],
        }
    assert s("file_read", path=path)["file"]["data"] == b64(b"x")


def test_eight_writers_of_one_version(store):
    agent = fresh_agent()
    with serving(store, 8) as procs:
        s = Session(procs[0], agent)
        for round_ in range(4):
            path = f"skills/race{round_}/SKILL.md"
            base = s("file_write", path=path, data=b64(b"base"), version=0)["version"] if round_ % 2 else 0
            replies = race(procs, lambda i, path=path, base=base: {"op": "file_write", "agent": agent, "path": path,
                                              "data": b64(f"writer {i}".encode()), "version": base})
            wrote = [i for i, r in enumerate(replies) if r["reply"] == "wrote"]
            assert len(wrote) == 1, replies
            now = replies[wrote[0]]["version"]
            assert all(r == {"reply": "stale", "version": now} for i, r in enumerate(replies) if i != wrote[0]), replies
            assert s("file_read", path=path)["file"] == {"data": b64(f"writer {wrote[0]}".encode()), "version": now}


def test_eight_appends_at_once_are_all_kept_whole(store):
    agent = fresh_agent()
    with serving(store, 8) as procs:
        s = Session(procs[0], agent)
        for round_ in range(3):
            path = f"skills/log{round_}.txt"
            pieces = [f"<piece {i} {'x' * (50 + i)}>".encode() for i in range(8)]
            replies = race(
                procs,
                lambda i, path=path, pieces=pieces: {
                    "op": "file_append",
                    "agent": agent,
                    "path": path,
                    "data": b64(pieces[i]),
                },
            )
            assert all(r["reply"] == "wrote" for r in replies), replies
            versions = sorted(r["version"] for r in replies)
            assert len(set(versions)) == 8
            got = s("file_read", path=path)["file"]
            data = base64.b64decode(got["data"])
            assert got["version"] == versions[-1]
            assert len(data) == sum(map(len, pieces))
            for piece in pieces:
                assert data.count(piece) == 1


def test_size_limits_leave_the_file_unchanged(session):
    s = session
    limit = 4 * 1024 * 1024
    assert s("file_write", path="skills/big.bin", data=b64(b"a" * limit), version=0)["reply"] == "wrote"
    assert s("file_append", path="skills/big.bin", data=b64(b"b"))["reply"] == "error"
    assert s("file_read", path="skills/big.bin")["file"]["version"] == 1
    assert s("file_write", path="skills/big.bin", data=b64(b"a" * (limit + 1)), version=1)["reply"] == "error"
    assert s("file_read", path="skills/big.bin")["file"] == {"data": b64(b"a" * limit), "version": 1}
    s("file_write", path="skills/small", data=b64(b"1234"), version=0)
    assert s("file_append", path="skills/small", data=b64(b"z" * (limit - 3)))["reply"] == "error"
    assert s("file_read", path="skills/small")["file"] == {"data": b64(b"1234"), "version": 1}


BAD_PATHS = ["", "skills", "skills/", "/skills/a", "other/a", "skills//a", "skills/./a", "skills/../a", "skills/a/",
             "skills/a\x00", "skills/" + "x" * 1018, 5, None]
BAD_DATA = ["aGk", "aGk=\n", "a===", "aG k=", "aGk_", "****", 5, None, "aGl="]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_bad_paths_are_refused(session, path):
    for op, args in (("file_write", {"data": "", "version": 0}), ("file_read", {}), ("file_append", {"data": ""}),
                     ("file_remove", {"version": 1})):
        assert session(op, path=path, **args)["reply"] == "error", (op, path)
    assert session("file_list", folder="skills")["files"] == []


@pytest.mark.parametrize("data", BAD_DATA)
def test_bad_base64_is_refused(session, data):
    assert session("file_write", path="skills/a", data=data, version=0)["reply"] == "error"
    assert session("file_append", path="skills/a", data=data)["reply"] == "error"
    assert session("file_read", path="skills/a")["file"] is None


@pytest.mark.parametrize("version", [-1, 1.0, "1", True, 2**53])
def test_bad_versions_are_refused(session, version):
    assert session("file_write", path="skills/a", data="", version=version)["reply"] == "error"
    assert session("file_read", path="skills/a")["file"] is None


def test_hostile_and_long_paths_are_kept_apart(session):
    paths = ["skills/%2F", "skills/%", "skills/a b", "skills/ü", "skills/u\u0308", "skills/~", "skills/_x",
             "skills/a=b", "skills/a+b", "skills/" + "é" * 500, "skills/" + "x" * 1017, "instructions/" + "日" * 300]
    for _i, path in enumerate(paths):
        assert session("file_write", path=path, data=b64(path.encode()), version=0)["reply"] == "wrote", path
    listed = session("file_list", folder="skills")["files"]
    assert listed == sorted((p for p in paths if p.startswith("skills/")), key=lambda p: p.encode())
    for path in paths:
        assert base64.b64decode(session("file_read", path=path)["file"]["data"]) == path.encode()


def test_another_agents_files_are_its_own(store):
    with serving(store) as procs:
        a = Session(procs[0], {"id": "f", "owner": None})
        b = Session(procs[0], {"id": "f", "owner": ""})
        a("file_write", path="skills/x", data=b64(b"a"), version=0)
        assert b("file_read", path="skills/x")["file"] is None
        assert b("file_list", folder="skills")["files"] == []
        assert b("file_write", path="skills/x", data=b64(b"b"), version=0)["version"] == 1


def test_tools_narrow_only_ever_narrows(session):
    s = session
    assert s("tools_read", thread="t") == {"reply": "tools", "tools": None}
    assert s("tools_list") == {"reply": "narrowed", "narrowed": {}}
    assert s("tools_narrow", thread="t", tools=["c", "a", "b", "a"]) == {"reply": "tools", "tools": ["c", "a", "b"]}
    assert s("tools_narrow", thread="t", tools=["b", "d", "c"]) == {"reply": "tools", "tools": ["b", "c"]}
    assert s("tools_read", thread="t")["tools"] == ["b", "c"]
    assert s("tools_narrow", thread="t", tools=[]) == {"reply": "tools", "tools": []}
    assert s("tools_narrow", thread="t", tools=["b"]) == {"reply": "tools", "tools": []}
    s("tools_narrow", thread="before-first-event", tools=["x"])
    s("append", thread="u", event={"seq": 1})
    s("tools_narrow", thread="u", tools=["y"])
    s("remove", thread="u")
    assert s("tools_list")["narrowed"] == {"t": [], "before-first-event": ["x"], "u": ["y"]}
    assert s("threads")["threads"] == []


@pytest.mark.parametrize("tools", [None, "a", [1], [""], ["a", None], ["t"] * 257])
def test_bad_tool_lists_are_refused(session, tools):
    session("tools_narrow", thread="t", tools=["a", "t"])
    assert session("tools_narrow", thread="t", tools=tools)["reply"] == "error"
    assert session("tools_read", thread="t")["tools"] == ["a", "t"]


def test_eight_narrowings_at_once_each_narrow_what_others_left(store):
    agent = fresh_agent()
    universe = [f"t{i}" for i in range(10)]
    with serving(store, 8) as procs:
        s = Session(procs[0], agent)
        for round_ in range(4):
            thread = f"narrow-{round_}"
            lists = [[t for j, t in enumerate(universe) if j != i] for i in range(8)]  # each drops one tool
            replies = race(procs, lambda i, thread=thread, lists=lists: {"op": "tools_narrow", "agent": agent,
                                                                 "thread": thread, "tools": lists[i]})
            assert all(r["reply"] == "tools" for r in replies)
            assert s("tools_read", thread=thread)["tools"] == ["t8", "t9"]
            for i, r in enumerate(replies):
                assert set(r["tools"]) <= set(lists[i])


def test_long_thread_names_listed_in_tools_and_leases(session):
    thread = "long/" + "ж" * 400
    session("tools_narrow", thread=thread, tools=["a"])
    session("take", thread=thread, holder="h", lapse_ms=1000)
    session("append", thread=thread, event={"seq": 1})
    assert session("tools_list")["narrowed"] == {thread: ["a"]}
    assert [x["thread"] for x in session("leases", lapse_ms=1000)["leases"]] == [thread]
    assert session("threads")["threads"] == [{"thread": thread, "last": 1}]


def test_a_folder_of_more_than_4096_files_is_refused_never_cut(store_env):
    """4,096 files list; one more makes file_list an error (the files written in parallel, in-process)."""
    from cloudstore.protocol.validate import Agent, RequestError

    service = service_of(store_env)
    agent = Agent(id="many", owner=None)
    paths = [f"skills/many/{i:05d}" for i in range(4096)]
    list(service.space.pool.map(lambda p: service.files.write(agent, p, b"", 0), paths))
    request = {"op": "file_list", "agent": {"id": "many", "owner": None}, "folder": "skills/many"}
    assert service.handle(request)["files"] == paths
    service.files.write(agent, "skills/many/extra", b"", 0)
    with pytest.raises(RequestError, match="4096"):
        service.handle(request)
    assert service.handle({**request, "folder": "skills/other"})["files"] == []

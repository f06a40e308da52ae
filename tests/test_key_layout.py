"""Every key the drivers write is one a path-based S3 server keeps (issue 28), and an old store carries over.

Path-based servers (MinIO, SeaweedFS: keys are filer paths) refuse an
object ``K`` beside objects ``K/...``, a key part over 255 bytes, and empty,
``.`` or ``..`` parts.  A seeded random workload of every op family, with
hostile names (long parts, ``~``, ``%``, ``.``, ``-``, unicode, a file beside
a folder of its name, removed files), runs on the folder store (and on
SeaweedFS where it is installed); then every key of the store is checked
against those rules, and ``file_list`` against a model of the files.

The carry-over: a store written by eafe802's drivers (run from a git
worktree of that commit) is read by these drivers as it is, then moved by
``lnk-store-admin migrate --in-place``, twice; every file, event, job,
lease, narrowing and day is the same through all of it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from key_layout_state import AGENTS, b64, ok, state

from cloudstore.admin.walk import Opened, open_url
from cloudstore.store.files import is_stub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD = "eafe802"
#: The longest key part path-based servers keep (keys.PART_MAX; written out: eafe802 has no such name).
PART_MAX = 255

PARTS = ["a", "a-b", "a.b", "a b", "a!", "~", "%", "%25", "-", ".x", "x.", "é", "日本", "a%20b", "_a",
         "p" * 254, "q" * 256, "r" * 300, "é" * 130, "s" * 90]
THREADS = ["t", "t y", "t-y", "t.y", "t%", "~", "é", "w" * 300, "t!"]


def random_path(rng: random.Random, known: list[str]) -> str:
    """A path: often a known file's parent or child (a file beside a folder of its name), else a new one."""
    if known and rng.random() < 0.5:
        base = rng.choice(known)
        if rng.random() < 0.5 and base.count("/") >= 2:
            return base.rsplit("/", 1)[0]  # the folder of a file, as a file
        return base + "/" + rng.choice(PARTS)  # a file below a file's name
    parts = [rng.choice(["skills", "instructions"])] + [rng.choice(PARTS) for _ in range(rng.randint(1, 3))]
    path = "/".join(parts)
    while len(path.encode("utf-8")) > 1024:
        parts.pop()
        path = "/".join(parts)
    return path


def check_keys(keys: list[str]) -> None:
    """The rules of issue 28 over every key of a store (below its root)."""
    present = set(keys)
    for key in keys:
        assert not key.startswith("/") and not key.endswith("/"), key
        parts = key.split("/")
        for part in parts:
            assert part not in ("", ".", ".."), key
            assert len(part.encode("utf-8")) <= PART_MAX, (len(part.encode("utf-8")), key)
        for i in range(1, len(parts)):
            if i >= 5 and parts[3] == "f" and not parts[i - 1].endswith("%"):
                continue  # a moved stub at 0.4's key of a path (files.py): SeaweedFS keeps it beside the folder of
                # its name when it came first, refuses it (as it refuses 0.4) when it came second
            assert "/".join(parts[:i]) not in present, f"{'/'.join(parts[:i])!r} is a folder of {key!r}"


def store_keys(opened: Opened) -> list[str]:
    return [item.key[len(opened.root):] for item in opened.store.list(opened.root)]


def workload(opened: Opened, seed: int, ops: int) -> None:
    """``ops`` random ops of every family on three agents, files checked against a model as they go."""
    rng = random.Random(seed)
    model: dict[tuple[int, str], tuple[int, bytes | None]] = {}  # (agent, path) -> (version, data or None)
    seqs: dict[tuple[int, str], int] = {}
    for _ in range(ops):
        n = rng.randrange(len(AGENTS))
        agent = AGENTS[n]

        def ask(op: str, _agent: dict = agent, **args: Any) -> dict[str, Any]:
            return ok(opened.service.answer({"op": op, "agent": _agent, **args}))

        known = [p for (a, p), (_, d) in model.items() if a == n and d is not None]
        family = rng.choice(["write", "write", "append", "remove", "read", "list", "event", "lease", "tools", "job"])
        if family in ("write", "append", "remove", "read"):
            path = random_path(rng, known) if family in ("write", "append") else (
                rng.choice(known) if known else random_path(rng, known))
            version, data = model.get((n, path), (0, None))
            if family == "write":
                new = os.urandom(rng.randint(0, 40))
                reply = ask("file_write", path=path, data=b64(new), version=version if data is not None else 0)
                assert reply == {"reply": "wrote", "version": version + 1}, (path, reply)
                model[(n, path)] = (version + 1, new)
            elif family == "append":
                more = os.urandom(rng.randint(1, 10))
                reply = ask("file_append", path=path, data=b64(more))
                assert reply == {"reply": "wrote", "version": version + 1}, (path, reply)
                model[(n, path)] = (version + 1, (data or b"") + more)
            elif family == "remove":
                reply = ask("file_remove", path=path, version=version)
                assert reply["found"] == (data is not None), (path, reply)
                if data is not None:
                    model[(n, path)] = (version, None)
            else:
                reply = ask("file_read", path=path)
                want = None if data is None else {"data": b64(data), "version": version}
                assert reply["file"] == want, path
        elif family == "list":
            folder = rng.choice(["skills", "instructions", "skills/a", "skills/~/", "skills/" + "q" * 256])
            under = folder.rstrip("/") + "/"
            want = sorted((p for (a, p), (_, d) in model.items() if a == n and d is not None and p.startswith(under)),
                          key=lambda p: p.encode("utf-8"))
            assert ask("file_list", folder=folder)["files"] == want
        elif family == "event":
            thread = rng.choice(THREADS)
            if rng.random() < 0.1:
                ask("remove", thread=thread)
                seqs[(n, thread)] = 0
            else:
                seq = seqs.get((n, thread), 0) + 1
                assert ask("append", thread=thread, event={"seq": seq, "x": "é"})["reply"] == "done"
                seqs[(n, thread)] = seq
                assert ask("last", thread=thread)["last"] == seq
        elif family == "lease":
            thread = rng.choice(THREADS)
            ask("take", thread=thread, holder=rng.choice(["h", "h-2"]), lapse_ms=60_000)
            if rng.random() < 0.3:
                ask("end", thread=thread, holder="h")
        elif family == "tools":
            ask("tools_narrow", thread=rng.choice(THREADS), tools=rng.sample(["x", "y", "z", "x y"], 2))
        else:
            job = rng.choice(["j", "j-1", "j.1", "j 1", "~", "%", "é", "k" * 200])
            place = rng.choice(["waiting", "firing", "ending"])
            action = rng.random()
            if action < 0.5:
                ask("job_put", place=place, job={"id": job, "spec": {"n": seed}, "due": rng.choice([1, 1.5, 2e9])})
            elif action < 0.7:
                ask("job_shift", id=job, **{"from": place, "to": rng.choice(["waiting", "firing"])})
            elif action < 0.85:
                ask("job_remove", place=place, id=job)
            else:
                ask("job_next")
                ask("job_set_day", day=rng.randint(0, 9), sent=rng.randint(0, 9))
    for n, agent in enumerate(AGENTS):  # every file, as the model has it, at the end
        for (a, path), (version, data) in model.items():
            if a == n:
                got = ok(opened.service.answer({"op": "file_read", "agent": agent, "path": path}))["file"]
                assert got == (None if data is None else {"data": b64(data), "version": version}), path


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_key_a_workload_writes_is_one_a_path_server_keeps(seed: int, tmp_path: Any) -> None:
    os.makedirs(f"{tmp_path}/store")
    opened = open_url(f"file://{tmp_path}/store")
    workload(opened, seed, 250)
    keys = store_keys(opened)
    assert any(k.split("/")[3:4] == ["f"] for k in keys)
    assert "_format" in keys  # the store's format record, written before the first write (store_gate.py)
    check_keys(keys)


def test_the_workload_on_seaweedfs(seaweed_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on SeaweedFS, whose keys are filer paths: every op answers, and the keys keep the rules."""
    for key, value in seaweed_server.env.items():
        monkeypatch.setenv(key, value)
    opened = open_url(f"s3://{seaweed_server.bucket}/{uuid.uuid4().hex[:12]}")
    workload(opened, 7, 150)
    check_keys(store_keys(opened))


def opened_at(where: str, tmp_path: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Opened:
    """A fresh store on the folder or on SeaweedFS (the session's server, a prefix of its own)."""
    if where == "file":
        os.makedirs(f"{tmp_path}/store")
        return open_url(f"file://{tmp_path}/store")
    em = request.getfixturevalue("seaweed_server")
    for key, value in em.env.items():
        monkeypatch.setenv(key, value)
    return open_url(f"s3://{em.bucket}/{uuid.uuid4().hex[:12]}")


@pytest.mark.parametrize("where", ["file", "seaweedfs"])
def test_a_file_beside_a_folder_of_its_name_in_both_orders(where: str, tmp_path: Any, request: pytest.FixtureRequest,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28's cases 1 and 2: on SeaweedFS eafe802 gave up after 200 lost rounds on the first, and was
    refused (``KeyTooLongError``) on the second."""
    opened = opened_at(where, tmp_path, request, monkeypatch)
    agent = AGENTS[0]

    def ask(op: str, **args: Any) -> dict[str, Any]:
        return ok(opened.service.answer({"op": op, "agent": agent, **args}))

    assert ask("file_write", path="skills/dual/inner.md", data=b64(b"i"), version=0)["version"] == 1
    assert ask("file_write", path="skills/dual", data=b64(b"d"), version=0)["version"] == 1
    assert ask("file_remove", path="skills/dual", version=1)["found"]
    assert ask("file_remove", path="skills/dual/inner.md", version=1)["found"]
    assert ask("file_write", path="skills/other", data=b64(b"o"), version=0)["version"] == 1
    assert ask("file_write", path="skills/other/x", data=b64(b"x"), version=0)["version"] == 1
    assert ask("file_write", path="skills/dual", data=b64(b"d2"), version=0)["version"] == 2
    assert ask("file_write", path="skills/dual/inner.md", data=b64(b"i2"), version=0)["version"] == 2
    long = "skills/" + "/".join(c * n for c, n in (("a", 256), ("b", 300), ("c", 280))) + "/" + "d" * 178
    assert len(long.encode()) == 1024
    assert ask("file_write", path=long, data=b64(b"L"), version=0)["version"] == 1
    assert ask("file_read", path=long)["file"] == {"data": b64(b"L"), "version": 1}
    part = "skills/" + "e" * 300 + "/x"  # inline in eafe802's layout (under 400 bytes), one part over 255
    assert ask("file_write", path=part, data=b64(b"P"), version=0)["version"] == 1
    assert ask("file_read", path=part)["file"] == {"data": b64(b"P"), "version": 1}
    assert ask("file_list", folder="skills")["files"] == sorted(
        ["skills/dual", "skills/dual/inner.md", "skills/other", "skills/other/x", long, part],
        key=lambda p: p.encode())
    assert ask("file_list", folder="skills/dual")["files"] == ["skills/dual/inner.md"]
    check_keys(store_keys(opened))


# -- the carry-over from eafe802's layout

WRITER = r"""
import base64, json, sys
from cloudstore.settings import open_store, parse_location
from cloudstore.space import Space
from cloudstore.service import Service
loc = parse_location("LNK_BUCKET_URL", sys.argv[1], ("file", "s3"))
service = Service(Space(open_store(loc), loc.prefix))
for line in sys.stdin:
    reply = service.answer(json.loads(line))
    assert reply.get("reply") != "error", (line, reply)
    print(json.dumps(reply))
"""

LONG_PART = "skills/" + "l" * 300 + "/SKILL.md"  # inline in eafe802's layout (400 bytes), over 255 a part
HASHED = "skills/" + "/".join(["h" * 200] * 3)  # hashed in both layouts


def write_old(old_tree: str, url: str, asks: list[dict[str, Any]]) -> None:
    """Send ``asks`` to the old layout's driver (the tree at ``old_tree``) on ``url``; it must answer them all."""
    lines = "".join(json.dumps(r) + "\n" for r in asks)
    run = subprocess.run([sys.executable, "-c", WRITER, url], input=lines, env=dict(os.environ, PYTHONPATH=old_tree),
                         capture_output=True, text=True, cwd=old_tree, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def old_requests() -> list[dict[str, Any]]:
    """A store's worth of everything, in eafe802's hands: files of every kind, events, jobs, a lease, tools."""
    out: list[dict[str, Any]] = []
    for agent in AGENTS[:2]:
        def put(op: str, _agent: dict = agent, **args: Any) -> None:
            out.append({"op": op, "agent": _agent, **args})

        for path in ["skills/a", "skills/a/inner.md", "skills/~", "skills/%", "skills/a b", "instructions/é",
                     LONG_PART, HASHED, "skills/gone", "skills/twice"]:
            put("file_write", path=path, data=b64(path.encode()), version=0)
        put("file_remove", path="skills/gone", version=1)
        put("file_write", path="skills/twice", data=b64(b"2"), version=1)
        for seq in (1, 2, 3):
            put("append", thread="t y", event={"seq": seq, "n": 10**30})
        put("append", thread="t", event={"seq": 1})
        put("take", thread="t", holder="h", lapse_ms=60_000)
        put("tools_narrow", thread="t y", tools=["x", "y"])
        put("job_put", place="waiting", job={"id": "j 1", "spec": {"s": 1}, "due": 1.5})
        put("job_put", place="firing", job={"id": "j-2", "spec": None, "due": 2})
        put("job_set_day", day=3, sent=4)
    return out


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A git worktree of eafe802 (its drivers write the old store), removed afterwards."""
    known = subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{OLD}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {OLD} is not in this clone (a shallow one?): no old drivers to write an old store")
    where = str(tmp_path_factory.mktemp("old") / "tree")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "-f", "--detach", where, OLD], check=True,
                   capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", where], capture_output=True)


@pytest.mark.parametrize("where", ["file", "seaweedfs"])
def test_a_store_of_eafe802_is_read_as_it_is_then_moved_in_place(where: str, old_tree: str, tmp_path: Any,
                                                                  request: pytest.FixtureRequest,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """On the folder, and on SeaweedFS with what eafe802's layout could write there (no file beside a folder of
    its name, no part over 255 bytes: those it could not write)."""
    from cloudstore.admin import relayout

    asks = old_requests()
    if where == "file":
        url = f"file://{tmp_path}/store"
        os.makedirs(f"{tmp_path}/store")
    else:
        em = request.getfixturevalue("seaweed_server")
        for key, value in em.env.items():
            monkeypatch.setenv(key, value)
        url = f"s3://{em.bucket}/{uuid.uuid4().hex[:12]}"
        asks = [r for r in asks if r.get("path") not in ("skills/a/inner.md", LONG_PART)]
    write_old(old_tree, url, asks)
    env = dict(os.environ, PYTHONPATH=old_tree)
    old_state = subprocess.run([sys.executable, "-c", STATE_DUMP, url], env=env, capture_output=True, text=True,
                               cwd=old_tree, timeout=300)
    assert old_state.returncode == 0, old_state.stderr[-3000:]
    before = json.loads(old_state.stdout)

    opened = open_url(url)
    old_keys = relayout.old_file_keys(list_keys(opened))
    assert old_keys  # eafe802 wrote keys of its layout: there is something to carry over
    assert state(opened) == before  # read as it is, before any move

    monkeypatch.setenv("LNK_PROGRESS_EVERY", "0")  # a progress line for each file moved (issue 46, item 3)
    with caplog.at_level(logging.INFO, logger="cloudstore.admin"):
        moved = relayout.relayout(url)
    assert moved.ok and moved.moved == len(old_keys), moved.as_dict()
    for phase in ("relayout move", "relayout guard"):
        shown = [(r.done, r.total, r.finished) for r in caplog.records  # type: ignore[attr-defined]
                 if getattr(r, "event", None) == "progress" and getattr(r, "phase", None) == phase]
        total = shown[-1][1]
        assert shown == [(n, total, n == total) for n in range(1, total + 1)], (phase, shown)
        assert total >= (len(old_keys) if phase == "relayout move" else 1), (phase, shown)
    stubbed = relayout.old_file_keys(list_keys(opened))  # every old key a moved stub (files.py), but those with
    # a part over 255 bytes (LONG_PART's), deleted as before
    assert len(stubbed) == len([k for k in old_keys if all(len(p.encode()) <= PART_MAX for p in k.parts)])
    assert all(is_stub(json.loads(opened.store.get(k.key).data.partition(b"\n")[0]))  # type: ignore[union-attr]
               for k in stubbed)
    again = relayout.relayout(url)  # a rerun refuses nothing and has nothing to do
    assert again.ok and again.moved == 0 and again.stubs == len(stubbed) and again.left == [], again.as_dict()
    fresh = open_url(url)  # a fresh process: nothing remembered
    assert state(fresh) == before
    check_keys(store_keys(fresh))


def test_a_move_cut_short_is_finished_by_a_rerun(old_tree: str, tmp_path: Any) -> None:
    """Half moved (written at the new key, the old not yet deleted), a rerun verifies and deletes."""
    from cloudstore.admin import relayout

    url = f"file://{tmp_path}/store"
    os.makedirs(f"{tmp_path}/store")
    write_old(old_tree, url, old_requests()[:12])
    opened = open_url(url)
    todo = relayout.old_file_keys(list_keys(opened))
    before = state(opened)
    first = todo[0]
    raw = opened.store.get(first.key)
    assert raw is not None
    header, data = json.loads(raw.data.partition(b"\n")[0]), raw.data.partition(b"\n")[2]
    from cloudstore.generations import Create
    from cloudstore.store.files import body

    opened.store.put(relayout.new_key_of(first, header["path"]), body(header, data, Create().lineage), Create())
    moved = relayout.relayout(url)
    assert moved.ok and moved.resumed == 1 and moved.moved == len(todo) - 1, moved.as_dict()
    assert state(open_url(url)) == before

    from cloudstore.admin.cli import main

    assert main(["migrate", "--in-place", url, "--json"]) == 0  # the command, rerun: nothing to do, all fine
    assert main(["migrate", url]) == 2  # neither a destination nor --in-place


def list_keys(opened: Opened) -> list[Any]:
    from cloudstore.admin.walk import list_all

    return list_all(opened)


STATE_DUMP = f"""
import json, sys
sys.path.insert(0, {os.path.join(REPO, "tests")!r})
""" + r"""
from key_layout_state import state
from cloudstore.admin.walk import open_url
print(json.dumps(state(open_url(sys.argv[1]))))
"""


def test_what_reading_both_layouts_costs(old_tree: str, tmp_path: Any) -> None:
    """The GETs a file op sends: the old key is read only where the new key has no object.

    An existing file: 1 GET (read) and 1 GET + 1 PUT (write), as before.  A
    missing file's read, and a path's first write: 1 GET more (its old key).
    A file of the old layout: 2 GETs to read (new, then old); its first write
    moves it (2 GETs, 1 PUT), and from then on it costs what any file does.
    """
    url = f"file://{tmp_path}/store"
    os.makedirs(f"{tmp_path}/store")
    agent = AGENTS[0]
    write_old(old_tree, url, [{"op": "file_write", "agent": agent, "path": "skills/old", "data": b64(b"o"),
                               "version": 0}])
    opened = open_url(url)
    opened.space.reads_write_back = True  # a driver's costs: its first listing makes the ledger (an admin tool's not)
    store = opened.store
    counts = {"get": 0, "put": 0}
    real_get, real_put = store.get, store.put

    def get(*args: Any, **kw: Any) -> Any:
        counts["get"] += 1
        return real_get(*args, **kw)

    def put(*args: Any, **kw: Any) -> Any:
        counts["put"] += 1
        return real_put(*args, **kw)

    store.get, store.put = get, put  # type: ignore[method-assign]

    def cost(op: str, **args: Any) -> tuple[int, int]:
        counts.update(get=0, put=0)
        ok(opened.service.answer({"op": op, "agent": agent, **args}))  # the agent and store of the moment
        return counts["get"], counts["put"]

    assert ok(opened.service.answer({"op": "file_list", "agent": agent, "folder": "skills"}))["files"] == [
        "skills/old"]  # the agent's ledger is known from here on
    assert cost("file_read", path="skills/old") == (2, 0)
    assert cost("file_read", path="skills/missing") == (2, 0)
    assert cost("file_write", path="skills/new", data=b64(b"n"), version=0) == (2, 2)  # + its old key's stub
    assert cost("file_read", path="skills/new") == (1, 0)
    assert cost("file_write", path="skills/new", data=b64(b"m"), version=1) == (1, 1)
    assert cost("file_write", path="skills/old", data=b64(b"p"), version=1) == (2, 2)  # the stub, then the file
    assert cost("file_read", path="skills/old") == (1, 0)
    assert cost("file_write", path="skills/old", data=b64(b"q"), version=2) == (1, 1)

    clean = AGENTS[1]  # an agent with no old key: once its ledger is known, nothing more is asked
    assert ok(opened.service.answer({"op": "file_list", "agent": clean, "folder": "skills"}))["files"] == []
    agent = clean
    assert cost("file_read", path="skills/missing") == (1, 0)
    assert cost("file_write", path="skills/new", data=b64(b"n"), version=0) == (1, 2)  # the stub beside it

    from cloudstore.admin import relayout

    assert relayout.relayout(url).ledgers == 1  # the old agent's ledger now says no old key is left
    opened = open_url(url)  # a fresh process
    store = opened.store
    real_get, real_put = store.get, store.put
    store.get, store.put = get, put  # type: ignore[method-assign]
    agent = AGENTS[0]
    assert ok(opened.service.answer({"op": "file_list", "agent": agent, "folder": "skills"}))["files"] == [
        "skills/new", "skills/old"]
    assert cost("file_read", path="skills/missing") == (1, 0)
    assert cost("file_read", path="skills/old") == (1, 0)
    print("GETs per op: existing file read 1, write 1 (+1 PUT). With a key of 0.4's layout possibly left: missing"
          " file read 2, first write of a path 2 (+1 PUT), an old file's read 2. An agent whose ledger says none is"
          " left (a new agent; one migrate --in-place moved): missing file read 1, first write 1 (+1 PUT)")


@pytest.mark.parametrize("where", ["file", "seaweedfs"])
def test_a_bare_due_floor_lists_that_due_s_entries(where: str, tmp_path: Any, request: pytest.FixtureRequest,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``job_due`` after a bare due (the runner's fast-scan floor) answers that due's entries: on SeaweedFS a
    ``StartAfter`` equal to a folder's own name skipped its children."""
    from cloudstore.store.due_index import sortable

    if where == "file":
        os.makedirs(f"{tmp_path}/store")
        opened = open_url(f"file://{tmp_path}/store")
    else:
        em = request.getfixturevalue("seaweed_server")
        for key, value in em.env.items():
            monkeypatch.setenv(key, value)
        opened = open_url(f"s3://{em.bucket}/{uuid.uuid4().hex[:12]}")
    for n, agent in enumerate(AGENTS):
        for due in (100, 200, 300):
            ok(opened.service.answer({"op": "job_put", "agent": agent, "place": "waiting",
                                      "job": {"id": f"j{n}-{due}", "spec": None, "due": due}}))
    entries, _ = opened.service.jobs.due(100, sortable(200))
    assert sorted(e.due for e in entries) == [200] * len(AGENTS) + [300] * len(AGENTS)


def test_old_files_changed_by_these_drivers_then_moved(old_tree: str, tmp_path: Any) -> None:
    """A file of the old layout written, appended and removed by these drivers (each seeds its new key from
    the old one's version), then moved: the move keeps what the drivers made, versions never come back."""
    from cloudstore.admin import relayout

    url = f"file://{tmp_path}/store"
    os.makedirs(f"{tmp_path}/store")
    write_old(old_tree, url, old_requests()[:12])
    opened = open_url(url)
    agent = AGENTS[0]

    def ask(op: str, **args: Any) -> dict[str, Any]:
        return ok(opened.service.answer({"op": op, "agent": agent, **args}))

    assert ask("file_remove", path="skills/a", version=1)["found"]
    assert ask("file_write", path="skills/a/inner.md", data=b64(b"n"), version=1) == {"reply": "wrote", "version": 2}
    assert ask("file_append", path="skills/~", data=b64(b"+")) == {"reply": "wrote", "version": 2}
    assert ask("file_write", path="skills/gone", data=b64(b"back"), version=0) == {"reply": "wrote", "version": 2}
    before = state(opened)
    moved = relayout.relayout(url)
    assert moved.ok and moved.stubs == 4, moved.as_dict()  # each path these drivers wrote: stubbed by its write
    fresh = open_url(url)
    assert state(fresh) == before
    assert ok(fresh.service.answer({"op": "file_read", "agent": agent, "path": "skills/a"}))["file"] is None
    assert ok(fresh.service.answer({"op": "file_write", "agent": agent, "path": "skills/a", "data": b64(b"x"),
                                    "version": 0})) == {"reply": "wrote", "version": 2}
    check_keys(store_keys(fresh))

"""Issue 41, finding 1: a rollback to 0.4 after ``migrate --in-place`` and the new release's writes.

0.4 (eafe802, and 0.4.1 = 83cc396) knows no store format and reads a file
at its old key only (``f/<path>``, no ``%``).  At c81d270 the move deleted
those keys, so a rolled-back 0.4 read files that exist as null, listed paths
that do not exist (``skills/a.md%``) and gave versions again, and rolled
forward the new release lost every write 0.4 acknowledged meanwhile.  Now
each old key holds a moved stub (files.py): every file op of 0.4 on a path
the new layout holds answers an error or the truth, and nothing it
acknowledges is lost or repeated.

The scenario runs 0.4's drivers and the new release's driver and admin as
processes on one store (folder, moto), with HEAD as the new release and,
to show it failed there, with c81d270 (``0.5.0``, ``xfail(strict=True)``).
Roll forward is as docs/admin.md says: stop 0.4, run the new release's
``migrate --in-place`` (it carries what 0.4 wrote meanwhile), start it.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from releases import HEAD, Driver, admin
from support import StoreUnderTest

NEW = [HEAD, pytest.param("0.5.0", marks=pytest.mark.xfail(strict=True, reason="issue 41 finding 1 at c81d270"))]
OLD = ["0.4.0", "0.4.1"]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def wrote(version: int) -> dict[str, Any]:
    return {"reply": "wrote", "version": version}


def file(text: str, version: int) -> dict[str, Any]:
    return {"reply": "file", "file": {"data": b64(text), "version": version}}


def migrate_in_place(release: str, store: StoreUnderTest) -> None:
    done = admin(release, store, "migrate", "--in-place", store.url)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


class Truth:
    """What the files are, as the drivers acknowledged them: every reply during the rollback is judged by it."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[int, str | None]] = {}  # path -> (version, text or None once removed)

    def judge(self, op: str, args: dict[str, Any], reply: Any) -> None:
        """``reply`` is an error or the truth; an acknowledged change becomes the truth."""
        if reply.get("reply") == "error":
            return
        path: str = args.get("path", "")
        version, text = self.files.get(path, (0, None))
        live = text is not None
        if op == "file_read":
            assert reply == {"reply": "file", "file": None if not live else {"data": b64(text or ""),
                                                                              "version": version}}, (op, args, reply)
        elif op == "file_list":
            under = args["folder"].rstrip("/") + "/"
            want = sorted(p for p, (_, t) in self.files.items() if t is not None and p.startswith(under))
            assert reply == {"reply": "files", "files": want}, (op, args, reply)
        elif op == "file_write":
            if args["version"] == (version if live else 0):
                assert reply == wrote(version + 1), (op, args, reply)
                self.files[path] = (version + 1, base64.b64decode(args["data"]).decode())
            else:
                assert reply == {"reply": "stale", "version": version if live else 0}, (op, args, reply)
        elif op == "file_remove":
            found = live and args["version"] == version
            assert reply == {"reply": "found", "found": found}, (op, args, reply)
            if found:
                self.files[path] = (version, None)
        elif op == "file_append":
            assert reply == wrote(version + 1), (op, args, reply)
            self.files[path] = (version + 1, (text or "") + base64.b64decode(args["data"]).decode())
        else:
            raise AssertionError(op)

    def ask(self, driver: Driver, op: str, **args: Any) -> Any:
        reply = driver(op, **args)
        self.judge(op, args, reply)
        return reply


@pytest.mark.parametrize("old_release", OLD)
@pytest.mark.parametrize("new_release", NEW)
def test_a_rollback_after_the_move_answers_errors_or_the_truth(new_release: str, old_release: str, fleet: Any,
                                                               store: StoreUnderTest) -> None:
    truth = Truth()
    old = fleet(old_release)
    for op, args in [("file_write", {"path": "skills/a.md", "data": b64("a1"), "version": 0}),
                     ("file_write", {"path": "skills/a.md", "data": b64("a2"), "version": 1}),
                     ("file_write", {"path": "instructions/main.md", "data": b64("m1"), "version": 0}),
                     ("file_remove", {"path": "instructions/main.md", "version": 1})]:
        truth.ask(old, op, **args)
        assert truth.files  # every one acknowledged: 0.4 on its own store
    old.close()

    migrate_in_place(new_release, store)  # as docs/admin.md says, with 0.4's drivers stopped
    new = fleet(new_release)
    assert truth.ask(new, "file_write", path="skills/a.md", data=b64("a3"), version=2) == wrote(3)
    assert truth.ask(new, "file_write", path="skills/new.md", data=b64("n1"), version=0) == wrote(1)
    new.close()  # its drivers stop (what it left for after its replies is done first)

    back = fleet(old_release)  # the rollback: every reply an error or the truth, never a wrong answer
    errors = 0
    during: list[tuple[str, dict[str, Any]]] = [
        ("file_read", {"path": "skills/a.md"}),
        ("file_list", {"folder": "skills"}),
        ("file_list", {"folder": "instructions"}),
        ("file_read", {"path": "skills/new.md"}),
        ("file_read", {"path": "instructions/main.md"}),
        ("file_write", {"path": "skills/a.md", "data": b64("r0"), "version": 0}),
        ("file_write", {"path": "skills/a.md", "data": b64("r3"), "version": 3}),
        ("file_write", {"path": "instructions/main.md", "data": b64("r0"), "version": 0}),
        ("file_write", {"path": "skills/new.md", "data": b64("r0"), "version": 0}),
        ("file_append", {"path": "skills/new.md", "data": b64("+")}),
        ("file_remove", {"path": "skills/a.md", "version": 3}),
        ("file_write", {"path": "skills/fresh.md", "data": b64("f1"), "version": 0}),
    ]
    for op, args in during:
        reply = truth.ask(back, op, **args)
        errors += reply.get("reply") == "error"
    assert errors  # loud: 0.4 is refused the paths the new layout holds
    back.close()

    migrate_in_place(new_release, store)  # roll forward: 0.4's own writes (skills/fresh.md) carried over
    forward = fleet(new_release)
    for path in sorted(truth.files) + ["skills/nothing.md"]:
        truth.ask(forward, "file_read", path=path)
    truth.ask(forward, "file_list", folder="skills")
    truth.ask(forward, "file_list", folder="instructions")
    for path, (version, text) in sorted(truth.files.items()):  # versions go on from the truth, never back
        truth.ask(forward, "file_write", path=path, data=b64("next"), version=version if text is not None else 0)
    assert truth.files["skills/a.md"][0] >= 4
    assert truth.files["instructions/main.md"][0] >= 2


def copy_url(store: StoreUnderTest, tmp_path: Any) -> str:
    """A second, empty location beside the test's store: a folder, or another prefix of its bucket."""
    return f"file://{tmp_path}/copy" if store.backend == "file" else store.url.rstrip("/") + "-copy"


def agent_files(report: dict[str, Any], agent: dict[str, Any]) -> dict[str, int]:
    """``inspect --json``'s file count and bytes of one agent (found by its id part)."""
    mine = [a for a in report["agents"] if a.get("id_part") == "_" + agent["id"]]
    assert len(mine) == 1 and "errors" not in mine[0], mine
    files: dict[str, int] = mine[0]["files"]
    return files


@pytest.mark.parametrize("admin_release", [HEAD, "0.5.0"])
def test_stubs_are_nothing_to_0_5_0_and_to_either_admin(admin_release: str, fleet: Any, store: StoreUnderTest,
                                                        agent: dict[str, Any], tmp_path: Any) -> None:
    """0.5.0 keeps working beside HEAD on a store of stubs: every file op reads a stub as nothing and the
    new key as the truth, and inspect, gc and migrate between stores (its verify included) of HEAD and of
    0.5.0 see the files, not the stubs.  0.5.0's migrate --in-place names the stubs it cannot move and
    changes nothing (exit 1); HEAD's counts them and is done (exit 0)."""
    truth = Truth()
    old = fleet("0.4.0")
    for op, args in [("file_write", {"path": "skills/a.md", "data": b64("a1"), "version": 0}),
                     ("file_write", {"path": "skills/a.md", "data": b64("a2"), "version": 1}),
                     ("file_write", {"path": "instructions/main.md", "data": b64("m1"), "version": 0}),
                     ("file_remove", {"path": "instructions/main.md", "version": 1})]:
        truth.ask(old, op, **args)
    old.close()
    migrate_in_place(HEAD, store)
    head = fleet(HEAD)
    truth.ask(head, "file_write", path="skills/new.md", data=b64("n1"), version=0)
    head.close()

    prev = fleet("0.5.0")
    beside: list[tuple[str, dict[str, Any]]] = [
        ("file_read", {"path": "skills/a.md"}), ("file_read", {"path": "instructions/main.md"}),
        ("file_read", {"path": "skills/new.md"}), ("file_list", {"folder": "skills"}),
        ("file_list", {"folder": "instructions"}),
        ("file_write", {"path": "skills/a.md", "data": b64("a3"), "version": 2}),
        ("file_write", {"path": "instructions/main.md", "data": b64("m2"), "version": 0}),
        ("file_append", {"path": "skills/new.md", "data": b64("+")}),
        ("file_remove", {"path": "skills/new.md", "version": 2}),
        ("file_write", {"path": "skills/new.md", "data": b64("n3"), "version": 0}),
        ("file_write", {"path": "skills/b.md", "data": b64("b1"), "version": 0}),
        ("file_list", {"folder": "skills"}),
    ]
    for op, args in beside:
        reply = truth.ask(prev, op, **args)
        assert reply.get("reply") != "error", (op, args, reply)
    prev.close()
    live = {p: t for p, (_, t) in truth.files.items() if t is not None}

    seen = admin(admin_release, store, "inspect", store.url, "--json")
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert agent_files(json.loads(seen.stdout), agent) == {"count": len(live),
                                                          "bytes": sum(len(t) for t in live.values())}
    swept = admin(admin_release, store, "gc", store.url, "--apply", "--min-age", "0")
    assert swept.returncode == 0, swept.stderr[-3000:]
    dst = copy_url(store, tmp_path)
    copied = admin(admin_release, store, "migrate", store.url, dst)
    assert copied.returncode == 0, copied.stdout + copied.stderr[-3000:]
    moved = admin(admin_release, store, "migrate", "--in-place", store.url)
    assert moved.returncode == (0 if admin_release == HEAD else 1), moved.stdout + moved.stderr[-3000:]
    for where in (store.url, dst):  # a fresh HEAD on each: everything 0.5.0 and the others acknowledged
        at = StoreUnderTest(store.backend, store.program, {**store.env, "LNK_BUCKET_URL": where}, where)
        with Driver(HEAD, at, agent) as fresh:
            for path in sorted(truth.files):
                truth.ask(fresh, "file_read", path=path)
            truth.ask(fresh, "file_list", folder="skills")
            truth.ask(fresh, "file_list", folder="instructions")
    back = fleet("0.4.0")  # and a rollback still finds every path 0.5.0 made guarded (HEAD's migrate did it)
    if admin_release == HEAD:
        assert back("file_read", path="skills/b.md")["reply"] == "error"


def test_an_orphan_stub_is_nothing_to_head_and_migrate_deletes_it(fleet: Any, store: StoreUnderTest,
                                                                  agent: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A stub whose path's new key holds nothing (a driver's stub create landed, its new key's did not):
    HEAD reads it as nothing; 0.5.0 fails on it (loud, documented); HEAD's migrate --in-place deletes it,
    after which 0.5.0 answers again."""
    from cloudstore.admin.walk import open_url
    from cloudstore.generations import Create
    from cloudstore.store.files import stub_body
    from cloudstore.store.keys import AgentKeys

    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    opened = open_url(store.url)
    keys = AgentKeys(opened.root, agent["owner"], agent["id"])
    head = fleet(HEAD)
    assert head("file_write", path="skills/a.md", data=b64("a"), version=0) == wrote(1)  # a ledger: the agent
    head.close()  # had a file of this layout before
    old_key = keys.old_file("skills/orphan.md")
    assert old_key is not None
    opened.store.put(old_key, stub_body(Create().lineage), Create())
    head = fleet(HEAD)
    assert head("file_read", path="skills/orphan.md") == {"reply": "file", "file": None}
    assert head("file_list", folder="skills") == {"reply": "files", "files": ["skills/a.md"]}
    head.close()
    prev = fleet("0.5.0")
    assert prev("file_read", path="skills/orphan.md")["reply"] == "error"
    prev.close()
    done = admin(HEAD, store, "migrate", "--in-place", store.url, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["orphans"] == 1, done.stdout + done.stderr[-2000:]
    prev = fleet("0.5.0")
    assert prev("file_read", path="skills/orphan.md") == {"reply": "file", "file": None}
    assert prev("file_list", folder="skills") == {"reply": "files", "files": ["skills/a.md"]}
    assert prev("file_write", path="skills/orphan.md", data=b64("o"), version=0) == wrote(1)

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
        path = args.get("path")
        version, text = self.files.get(path, (0, None)) if path else (0, None)
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
    for op, args in [("file_read", {"path": "skills/a.md"}),
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
                     ("file_write", {"path": "skills/fresh.md", "data": b64("f1"), "version": 0})]:
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

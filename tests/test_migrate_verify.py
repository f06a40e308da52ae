"""Issue 27 case 5: migrate's verification sees every kind of object, so a writer not stopped fails it.

On eafe802 verification compared what the ops show (``file_read`` and the
like) and nothing else: a file written and removed during the copy left a
tombstone in the source and nothing in the destination, both read as
``null``, and migrate said the stores were equal (exit 0); ``file_write`` at
version 0 of such a path in the destination then answered ``version: 1``
again.  Job-record tombstones, removal records and fences, and leases were
as invisible.  Now the source is listed again after the copy and every
object of every kind is compared, key and bytes (``verify.objects``), and
``lnk-store-admin migrate`` exits 1 naming the first differences per kind.

The first test is deterministic: the writer's ops run exactly between
migrate's listing of the source and its copy (a hook on that listing), one
of every kind.  The second is the issue's rig: 2,500 files, and a writer
process's worth of writes and removes of new files while
``lnk-store-admin migrate`` runs as a process (the writer covers the whole
run, a second at least, so the copy always meets it).
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cloudstore.admin import cli
from cloudstore.admin import migrate as migrate_module
from cloudstore.admin.walk import Opened, open_url

AGENT = {"id": "mover", "owner": "o"}
FILES = 2_500


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def op(o: Opened, name: str, **args: Any) -> dict:
    reply = o.service.answer({"op": name, "agent": AGENT, **args})
    assert reply.get("reply") != "error", (name, args, reply)
    return reply


def folder_store(tmp_path: Path, name: str) -> tuple[str, Opened]:
    folder = tmp_path / name
    folder.mkdir()
    url = f"file://{folder}"
    return url, open_url(url)


def build(o: Opened, files: int) -> None:
    """A store with something of every kind: files (and a tombstone), a job, a conversation, a lease."""
    def write(i: int) -> None:
        op(o, "file_write", path=f"skills/s{i % 50:02d}/f{i:05d}.md", data=b64(b"x" * (40 + i % 90)), version=0)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(files)))
    op(o, "file_write", path="instructions/gone.md", data=b64(b"gone"), version=0)
    op(o, "file_remove", path="instructions/gone.md", version=1)
    op(o, "job_put", place="waiting", job={"id": "kept", "spec": {"n": 1}, "due": 4_000_000_000})
    for seq in (1, 2, 3):
        op(o, "append", thread="kept", event={"seq": seq})
    op(o, "take", thread="kept", holder="runner", lapse_ms=60_000)


def write_one_of_every_kind(o: Opened) -> None:
    """What a writer not stopped leaves behind that no op shows: tombstones, a removal record, a lease's head."""
    op(o, "file_write", path="instructions/new.md", data=b64(b"new"), version=0)
    op(o, "file_remove", path="instructions/new.md", version=1)  # a file tombstone
    op(o, "job_put", place="waiting", job={"id": "brief", "spec": None, "due": 4_000_000_000})
    op(o, "job_remove", place="waiting", id="brief")  # a job-record tombstone
    op(o, "append", thread="brief", event={"seq": 1})
    op(o, "remove", thread="brief")  # a removal record and its fence
    op(o, "take", thread="idle", holder="other", lapse_ms=60_000)
    op(o, "end", thread="idle", holder="other")  # a lease's head, ended: no op shows it


def test_migrate_names_every_kind_of_object_a_writer_left_during_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    src_url, src = folder_store(tmp_path, "src")
    dst_url, _ = folder_store(tmp_path, "dst")
    build(src, 40)
    listings: list[str] = []
    real_list_all: Callable[[Opened], Any] = migrate_module.list_all

    def listing_then_writer(opened: Opened) -> Any:
        """migrate's first listing is of the source: the writer's ops come right after it, before the copy."""
        keys = real_list_all(opened)
        listings.append(opened.url)
        if len(listings) == 1:
            write_one_of_every_kind(src)
        return keys

    monkeypatch.setattr(migrate_module, "list_all", listing_then_writer)
    code = cli.main(["migrate", src_url, dst_url])
    err = caplog.text  # its mismatch lines are log records (WARNING): in process, pytest's logging holds them
    assert listings[0] == src_url
    assert code == 1, f"migrate said the stores were equal:\n{err[-3000:]}"
    for kind in ("file object", "job record", "conversation head"):
        assert f"objects: {kind}" in err, f"no {kind} named:\n{err[-3000:]}"
    # What it guards against: the destination lacks the tombstone, so a version would repeat.
    dst = open_url(dst_url)
    again = dst.service.answer({"op": "file_write", "agent": AGENT, "path": "instructions/new.md",
                                "data": b64(b"again"), "version": 0})
    assert again == {"reply": "wrote", "version": 1}, again  # the store migrate refused to call equal


def test_migrate_of_2500_files_exits_1_when_a_writer_writes_and_removes_files_meanwhile(tmp_path: Path) -> None:
    src_url, src = folder_store(tmp_path, "src")
    dst_url, _ = folder_store(tmp_path, "dst")
    build(src, FILES)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LNK_")}
    proc = subprocess.Popen([sys.executable, "-m", "cloudstore.admin.cli", "migrate", src_url, dst_url],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    written: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        """New files written and removed, for the migrate's whole run and a second at least."""
        began = time.monotonic()
        n = 0
        while not stop.is_set() or time.monotonic() - began < 1.0:
            path = f"instructions/live/w{n:05d}.md"
            op(src, "file_write", path=path, data=b64(b"live"), version=0)
            op(src, "file_remove", path=path, version=1)
            written.append(path)
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert written, "the writer wrote nothing"
    assert proc.returncode == 1, (f"migrate exited {proc.returncode} with a writer at work "
                                  f"({len(written)} files written and removed):\n{out}\n{err[-3000:]}")
    assert "objects: file object" in err, err[-3000:]
    print(f"\n{len(written)} files written and removed during the migrate; it exited 1 naming "
          f"{err.count('objects: file object')} file objects")

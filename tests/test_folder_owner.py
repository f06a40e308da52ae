"""A store folder nobody else controls (issue 43, item 3).

"Another local user" is a child process that drops to an unused uid/gid
(``STRANGER``), as in test_wake_security.py; the tests that need one need
root (CI runs as root) and skip, saying so, otherwise.  ``shared`` stands
for ``/tmp``: a sticky folder anyone may write in.

On c81d270 (and up to this change) a folder the stranger made, mode 0777,
was taken as the store whoever owned it (``mkdir -p`` is silent about it),
a link ``=locks`` the stranger put in it made root create a lock file in a
folder outside the store, and the stranger's own lock files were used (the
stranger holding ``flock`` on them holds every write).  Now:

* the store's folder, and its lock folder, are refused when another user
  owns them (root's are fine) or others may write in them without the
  sticky bit (the lock folder: at all), by the driver (an error reply
  naming ``LNK_BUCKET_URL`` and the rule), by ``open_store`` and by
  ``cloudstore.open``; nothing outside the store is made or changed;
* a lock file that is not the driver user's, or not a regular file, is
  refused;
* a link anywhere below the root (an agent's folder, an object file, the
  lock folder) is never followed: a write through one is refused, or
  replaces the link inside the store, never writes outside it;
* a seeded run plants links and other users' folders between two ops
  (tests/faults/planted.py) and checks that nothing outside changes.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudstore.errors import LocationError, SettingError
from cloudstore.generations import Create, Overwrite, StoreRefused
from cloudstore.local import LocalBackend

STRANGER = 54321  # a uid and gid no account on the test machine has
APPEND = json.dumps({"op": "append", "agent": {"owner": None, "id": "a"}, "thread": "t", "event": {"seq": 1}})
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another local user (CI runs as root)")


def as_stranger(work: Callable[[], Any]) -> None:
    """Run ``work`` in a child dropped to ``STRANGER``; fails the test when it raised."""
    pid = os.fork()
    if pid == 0:  # the child: the work, then out without running any of pytest's cleanup
        code = 1
        try:
            os.setgroups([])
            os.setgid(STRANGER)
            os.setuid(STRANGER)
            work()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the stranger's work failed"


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky folder anyone may write in, as ``/tmp`` is (pytest's tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="lnk-folder-owner-"))
    top.chmod(0o1777)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def everything(folder: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """What is in ``folder``, recursively: name -> (uid, mode, bytes or link target); to see nothing changed."""
    seen: dict[str, tuple[int, int, bytes | str]] = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            body: bytes | str = os.readlink(path) if os.path.islink(path) else (
                Path(path).read_bytes() if os.path.isfile(path) else b"")
            seen[os.path.relpath(path, folder)] = (info.st_uid, info.st_mode, body)
    return seen


def append_through_driver(url: str) -> dict[str, Any]:
    """One ``append`` through ``lnk-bucket-store call``, as the issue's root did after README's ``mkdir -p``."""
    done = subprocess.run(["lnk-bucket-store", "call"], input=APPEND, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LNK_BUCKET_URL": url})
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def stranger_plants_a_store(shared: Path, outside: Path, lock_files: bool) -> Path:
    """The issue's hostile folder: ``lnk-bucket`` (0777, the stranger's), with ``=locks`` a link to ``outside``
    (or, ``lock_files``, a lock folder of the stranger's holding the 64 lock files)."""
    store = shared / "lnk-bucket"

    def plant() -> None:
        store.mkdir()
        store.chmod(0o777)
        outside.mkdir()
        outside.chmod(0o777)
        if lock_files:
            (store / "=locks").mkdir(mode=0o777)
            (store / "=locks").chmod(0o777)
            for stripe in range(64):
                (store / "=locks" / str(stripe)).touch(mode=0o666)
        else:
            os.symlink(outside, store / "=locks")

    as_stranger(plant)
    os.makedirs(store, exist_ok=True)  # README's `mkdir -p`: silent on a folder that is there
    return store


# -- (a) a folder another user made, and its link, do not control the driver ----------------------


@as_root
def test_a_store_folder_another_user_made_is_refused_and_its_link_never_followed(shared: Path) -> None:
    outside = shared / "outside"
    store = stranger_plants_a_store(shared, outside, lock_files=False)
    before = everything(store)
    reply = append_through_driver(f"file://{store}")
    assert os.listdir(outside) == [], f"root made something outside the store ({reply})"
    assert reply.get("reply") == "error", f"an append into another user's folder was answered: {reply}"
    assert "LNK_BUCKET_URL" in reply["error"] and f"owned by uid {STRANGER}" in reply["error"], reply
    assert "owned by this user or root, and not writable by others unless sticky" in reply["error"], reply
    assert str(store) not in reply["error"], "a reply names the folder"
    assert everything(store) == before, "the refused store was changed"


@as_root
def test_another_users_folder_is_refused_by_every_opener(shared: Path) -> None:
    """``open_store`` (the drivers', the admin tool's) and the Python API refuse it too, naming the rule."""
    from cloudstore import open as open_api
    from cloudstore.settings import open_store, parse_location

    store = stranger_plants_a_store(shared, shared / "outside", lock_files=False)
    location = parse_location("LNK_BUCKET_URL", f"file://{store}", ("file",))
    with pytest.raises(SettingError, match=rf"LNK_BUCKET_URL .*owned by uid {STRANGER}.*owned by this user or root"):
        open_store(location, create=False, setting="LNK_BUCKET_URL")
    with pytest.raises(LocationError, match=rf"the store URL .*owned by uid {STRANGER}.*owned by this user or root"):
        open_api(f"file://{store}")
    assert os.listdir(shared / "outside") == []


def test_a_folder_others_may_write_in_is_refused_unless_sticky(tmp_path: Path) -> None:
    """0777 without the sticky bit: anyone could put a link or a lock file of theirs in it; 1777 is /tmp's rule."""
    from cloudstore.settings import open_backend, parse_location

    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o777)
    location = parse_location("LNK_BUCKET_URL", f"file://{store}", ("file",))
    with pytest.raises(SettingError, match=r"LNK_BUCKET_URL .*others may write in it \(mode 0777\) and not sticky"):
        open_backend(location, setting="LNK_BUCKET_URL")
    store.chmod(0o770)
    with pytest.raises(SettingError, match=r"mode 0770"):
        open_backend(location, setting="LNK_BUCKET_URL")
    store.chmod(0o1777)
    open_backend(location, setting="LNK_BUCKET_URL").put("k", b"x", Create())
    assert store.stat().st_mode & 0o7777 == 0o1777, "the opener changed the folder's mode"


@as_root
def test_a_link_another_user_made_for_the_store_folder_is_not_followed(shared: Path, tmp_path: Path) -> None:
    """``/tmp/lnk-bucket`` a link of the stranger's to a folder of root's: not followed; root's own link is."""
    roots = tmp_path / "roots"
    roots.mkdir()
    as_stranger(lambda: os.symlink(roots, shared / "lnk-bucket"))
    with pytest.raises(StoreRefused, match=rf"symbolic link of uid {STRANGER}"):
        LocalBackend(str(shared / "lnk-bucket"))
    os.symlink(roots, shared / "mine")
    LocalBackend(str(shared / "mine")).put("k", b"x", Create())
    assert sorted(os.listdir(roots)) == ["=locks", "k="]


# -- (b) lock files are the driver's own ----------------------------------------------------------


@as_root
def test_another_users_lock_files_are_never_used(shared: Path) -> None:
    """The stranger's 64 lock files (holding ``flock`` on them would hold every write): refused, untouched."""
    store = stranger_plants_a_store(shared, shared / "outside", lock_files=True)
    before = everything(store)
    reply = append_through_driver(f"file://{store}")
    assert reply.get("reply") == "error", f"a write locked with another user's lock files: {reply}"
    assert "LNK_BUCKET_URL" in reply["error"] and f"owned by uid {STRANGER}" in reply["error"], reply
    assert everything(store) == before


def lock_name(key: str) -> str:
    import zlib

    return str(zlib.crc32(key.encode()) % 64)


@as_root
def test_a_lock_file_not_ours_or_not_a_file_is_refused(tmp_path: Path) -> None:
    """In a lock folder of our own, a lock file found there another user's, a link or a folder: refused."""
    store = tmp_path / "store"
    backend = LocalBackend(str(store))
    backend.put("warm", b"x", Create())  # makes the lock folder
    locks = store / "=locks"
    stripe = locks / lock_name("k")
    stripe.touch()
    os.chown(stripe, STRANGER, STRANGER)
    with pytest.raises(StoreRefused, match=rf"a lock file is refused: it is owned by uid {STRANGER}.*regular file"):
        backend.put("k", b"x", Create())
    stripe.unlink()
    outside = tmp_path / "outside"
    outside.write_bytes(b"host")
    stripe.symlink_to(outside)
    with pytest.raises(StoreRefused, match="a lock file is refused: it is a symbolic link"):
        backend.put("k", b"x", Create())
    stripe.unlink()
    stripe.mkdir()
    with pytest.raises(StoreRefused, match="a lock file is refused: it is a folder"):
        backend.put("k", b"x", Create())
    assert outside.read_bytes() == b"host"
    assert backend.get("k") is None, "a refused write stored something"
    stripe.rmdir()
    backend.put("k", b"x", Create())
    assert stripe.stat().st_uid == os.geteuid() and stripe.stat().st_mode & 0o777 == 0o600


def test_a_lock_folder_others_may_write_in_is_refused_even_sticky(tmp_path: Path) -> None:
    store = tmp_path / "store"
    backend = LocalBackend(str(store))
    (store / "=locks").mkdir(mode=0o700)
    (store / "=locks").chmod(0o1777)
    with pytest.raises(StoreRefused, match=r"the lock folder is refused: others may write in it \(mode 1777\)"):
        backend.put("k", b"x", Create())
    assert os.listdir(store / "=locks") == []


# -- links below the root are never followed ------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path) -> tuple[LocalBackend, Path, Path]:
    """A store holding ``agents/o/a/t`` and an ``outside`` folder holding one file, ``host``."""
    store, outside = tmp_path / "store", tmp_path / "outside"
    backend = LocalBackend(str(store))
    backend.put("agents/o/a/t", b"mine", Create())
    outside.mkdir()
    (outside / "host").write_bytes(b"host")
    return backend, store, outside


def test_a_link_for_an_agents_folder_is_never_followed(planted: tuple[LocalBackend, Path, Path]) -> None:
    backend, store, outside = planted
    before = everything(outside)
    agent = store / "agents" / "o" / "a"
    shutil.rmtree(agent)
    agent.symlink_to(outside)
    with pytest.raises(StoreRefused, match="a folder of the store is refused: it is a symbolic link"):
        backend.put("agents/o/a/t", b"new", Overwrite())
    with pytest.raises(StoreRefused, match="symbolic link"):
        backend.get("agents/o/a/host")
    assert [item.key for item in backend.list("agents/", None, None)] == [], "a listing went through the link"
    assert everything(outside) == before


def test_a_link_for_an_object_file_is_replaced_inside_never_written_through(
        planted: tuple[LocalBackend, Path, Path]) -> None:
    backend, store, outside = planted
    obj = store / "agents" / "o" / "a" / "t="
    obj.unlink()
    obj.symlink_to(outside / "host")
    with pytest.raises(StoreRefused, match="an object of the store is refused: it is a symbolic link"):
        backend.get("agents/o/a/t")
    with pytest.raises(StoreRefused, match="symbolic link"):
        backend.put("agents/o/a/t", b"new", Create())  # a create reads first: refused, nothing stored
    backend.put("agents/o/a/t", b"new", Overwrite())  # no read: the link itself is replaced
    assert not obj.is_symlink() and obj.read_bytes() == b"new"
    assert (outside / "host").read_bytes() == b"host"


def test_a_link_for_the_lock_folder_is_never_followed(planted: tuple[LocalBackend, Path, Path]) -> None:
    _, store, outside = planted
    shutil.rmtree(store / "=locks")
    (store / "=locks").symlink_to(outside)
    fresh = LocalBackend(str(store))  # a new driver: the lock folder is opened again
    with pytest.raises(StoreRefused, match="the lock folder is refused: it is a symbolic link"):
        fresh.put("agents/o/a/u", b"x", Create())
    assert os.listdir(outside) == ["host"], "a lock file was made outside the store"
    assert fresh.get("agents/o/a/u") is None


@as_root
def test_a_folder_below_the_root_another_user_owns_is_refused(planted: tuple[LocalBackend, Path, Path]) -> None:
    """Below a sticky root another user may make an agent's folder: it is not the store's, never written."""
    backend, store, _ = planted
    os.chown(store / "agents" / "o", STRANGER, STRANGER)
    with pytest.raises(StoreRefused, match=rf"a folder of the store is refused: it is owned by uid {STRANGER}"):
        backend.put("agents/o/a/t", b"new", Overwrite())
    assert (store / "agents" / "o" / "a" / "t=").read_bytes() == b"mine"


# -- a seeded run: links and other users' folders planted between two ops -------------------------

SEED_VARIABLE = "LNK_PLANTED_SEED"


class Workload:
    """Seeded ops of three agents: appends (each the next number), reads and file writes (the version known)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.last: dict[tuple[str, str], int] = {}
        self.version: dict[str, int] = {}

    def next(self) -> dict[str, Any]:
        agent = self.rng.choice(["a", "b", "c"])
        thread = self.rng.choice(["t", "u"])
        kind = self.rng.choice(["append", "append", "read", "file_write"])
        who = {"owner": "o", "id": agent}
        if kind == "append":
            seq = self.last.get((agent, thread), 0) + 1
            return {"op": "append", "agent": who, "thread": thread, "event": {"seq": seq}}
        if kind == "read":
            return {"op": "read", "agent": who, "thread": thread}
        data = base64.b64encode(self.rng.randbytes(8)).decode()
        return {"op": "file_write", "agent": who, "path": "skills/s/SKILL.md", "data": data,
                "version": self.version.get(agent, 0)}

    def answered(self, request: dict[str, Any], reply: dict[str, Any]) -> None:
        agent = request["agent"]["id"]
        if request["op"] == "append" and reply.get("reply") in ("done", "taken"):
            seq = request["event"]["seq"] if reply["reply"] == "done" else reply["last"]
            self.last[(agent, request["thread"])] = seq
        if request["op"] == "file_write" and reply.get("reply") in ("wrote", "stale"):
            self.version[agent] = reply["version"]


@pytest.mark.parametrize("seed", [int(os.environ[SEED_VARIABLE])] if SEED_VARIABLE in os.environ else [1, 2, 3, 4])
def test_links_and_foreign_folders_planted_between_ops_never_reach_outside(tmp_path: Path, seed: int) -> None:
    """Each op of a seeded run may follow a planted fault (tests/faults/planted.py); outside never changes.

    A fresh driver (``Service``) is opened now and then, as drivers start
    and stop, so the faults meet a root and a lock folder opened anew too.
    Every error reply a fault causes says what is refused.
    """
    from faults.planted import plant

    from cloudstore.protocol.service import Service
    from cloudstore.settings import open_store, parse_location
    from cloudstore.store.space import Space

    rng = random.Random(seed)
    workload = Workload(rng)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host").write_bytes(b"host")
    before = everything(outside)
    location = parse_location("LNK_BUCKET_URL", f"file://{tmp_path}/store", ("file",))
    stranger = STRANGER if os.geteuid() == 0 else None
    done: list[str] = []
    refusals = 0
    service = Service(Space(open_store(location), location.prefix))
    replay = f"{SEED_VARIABLE}={seed} python3 -m pytest {__file__} -k planted_between_ops"
    for step in range(60):
        if step % 10 == 9:
            service = Service(Space(open_store(location), location.prefix))  # a driver started anew
        if step > 5 and rng.random() < 0.3:
            done.append(plant(tmp_path / "store", outside, rng, stranger))
        request = workload.next()
        reply = service.answer(request)
        workload.answered(request, reply)
        done.append(f"{request['op']} -> {reply.get('reply')} {reply.get('error', '')}".rstrip())
        assert everything(outside) == before, f"seed {seed}: outside changed after {done}; replay: {replay}"
        if reply.get("reply") == "error" and "is refused" in reply["error"]:
            refusals += 1
            assert "internal error" not in reply["error"], f"seed {seed}: {reply}; replay: {replay}"
    assert refusals > 0, f"seed {seed}: no planted fault was met ({done})"

"""The local-folder backend (``file:///FOLDER``): the embedded default.

Each object is one file; conditional writes are settled under an exclusive
``flock`` on one of a fixed set of lock files (striped by key), so they are
correct between threads and between processes on one machine.  Readers need
no lock: a write lands with ``os.replace``, which is atomic.

Key parts become folders.  A stored object's file name ends with ``=``, a
character key parts never hold, so an object ``a`` and a folder ``a/`` (for
``a/b``) never collide.  A part longer than a file name may be is cut into
chunks, each but the last ending with ``+`` (also never in a part).
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import os
import re
import stat
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

from .clock import StoreClock
from .generations import (
    FRAME_MAX,
    AlreadyExists,
    Create,
    Listed,
    NotFound,
    PreconditionFailed,
    PutMode,
    StoreRefused,
    Update,
    frame_nonce,
)

_PART = re.compile(r"^[A-Za-z0-9_.~%-]+$")
_CHUNK = 200
_STRIPES = 64
_OBJ = "="
# File timestamps come from the kernel's coarse clock: a tick (up to 10 ms) behind.
_MTIME_RESOLUTION = 0.01


def _check_part(part: str) -> None:
    if not _PART.match(part) or part in (".", ".."):
        raise ValueError(f"key part not storable in a folder: {part!r}")


def _part_to_names(part: str) -> list[str]:
    _check_part(part)
    chunks = [part[i : i + _CHUNK] for i in range(0, len(part), _CHUNK)]
    # A last chunk of "." or ".." would name this folder or its parent: written as
    # "%2E" ("%" stands in key parts only as "%25" and "%XX" escapes, never before
    # "2E", since percent-encoding leaves "." as it is), so no two keys meet.
    last = chunks[-1].replace(".", "%2E") if chunks[-1] in (".", "..") else chunks[-1]
    return [c + "+" for c in chunks[:-1]] + [last]


def _unescape_chunk(name: str) -> str:
    return name.replace("%2E", ".") if name in ("%2E", "%2E%2E") else name


_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# A folder below the root is opened by name in its parent's descriptor, never through a link.
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
# The rules, as a refusal says them (issue 43): another user must not be able to change what the store keeps.
FOLDER_RULE = ("a store's folders must be folders, not links, owned by this user or root, and not writable by "
               "others unless sticky")
LOCKS_RULE = "the lock folder must be a folder, not a link, owned by this user or root, that nobody else may write in"
LOCK_FILE_RULE = "a lock file must be a regular file, not a link, of this user's"
OBJECT_RULE = "an object of the store must be a regular file, not a link, owned by this user or root"


class FolderMissing(FileNotFoundError):
    """The store's folder does not exist (and was not to be made); ``filename`` is the folder."""

    def __init__(self, folder: str) -> None:
        super().__init__(2, "the folder does not exist: make it first (mkdir -p), or correct the URL", folder)


class FolderRefused(StoreRefused):
    """Something in the store another user controls, or a link: refused, and nothing was changed.

    A ``StoreRefused`` so that an op meeting it mid-way answers an error
    saying nothing changed (never retried); opening a store turns it into a
    ``SettingError`` naming the setting (settings.py).  ``rule`` is the rule
    broken, ``why`` what was found (a uid, a mode: never a path, which is the
    operator's to see).
    """

    def __init__(self, what: str, why: str, rule: str, where: str | None = None) -> None:
        named = f"in the store {where} names, " if where else ""
        super().__init__(f"{named}{what} is refused: {why} ({rule})")
        self.what, self.why, self.rule, self.where = what, why, rule, where


def _me() -> int:
    return os.geteuid()


def folder_refusal(info: os.stat_result, sticky_ok: bool = True) -> str | None:
    """Why a folder (its ``fstat``) is one another user may change, or None when only we (or root) may.

    Owned by root or this user; group or others may write in it only when it
    is sticky (``sticky_ok``; as ``/tmp``: nobody removes or renames what
    another made there).  Root's folders are fine for any user: root can do
    anything anyway.
    """
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a folder"
    if info.st_uid not in (0, _me()):
        return f"it is owned by uid {info.st_uid}, neither root nor this user ({_me()})"
    if info.st_mode & 0o022 and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        sticky = " and not sticky" if sticky_ok else ""
        return f"others may write in it (mode {stat.S_IMODE(info.st_mode):04o}){sticky}"
    return None


def _open_root(root: str) -> int:
    """The store's folder, opened and checked; a link there is followed only when root or this user made it.

    The path above the folder is the operator's; the folder itself may be a
    link another user planted in a shared folder (``/tmp/lnk-bucket`` -> a
    folder of root's), so a link is followed only when its owner is root or
    this user (the kernel's ``protected_symlinks`` rule), then the folder
    reached is checked as any other.
    """
    try:
        fd = os.open(root, _FOLDER)
    except FileNotFoundError:
        raise FolderMissing(root) from None
    except NotADirectoryError:
        info = os.lstat(root)
        if not stat.S_ISLNK(info.st_mode):
            raise FolderRefused("the store's folder", "it is not a folder", FOLDER_RULE) from None
        if info.st_uid not in (0, _me()):
            raise FolderRefused("the store's folder", f"it is a symbolic link of uid {info.st_uid}, neither "
                                f"root nor this user ({_me()})", FOLDER_RULE) from None
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    why = folder_refusal(os.fstat(fd))
    if why is not None:
        os.close(fd)
        raise FolderRefused("the store's folder", why, FOLDER_RULE)
    return fd


def _open_folder(parent: int, name: str, make: bool, what: str = "a folder of the store",
                 sticky_ok: bool = True, rule: str = FOLDER_RULE) -> int | None:
    """Folder ``name`` in ``parent``, opened without following a link and checked; None when missing.

    Made (0700) when missing and ``make``.  A link, a file where a folder
    belongs, or a folder another user may change is refused: nothing is
    ever made or written through one.
    """
    while True:
        try:
            fd = os.open(name, _FOLDER, dir_fd=parent)
        except FileNotFoundError:
            if not make:
                return None
            with suppress(FileExistsError):  # another writer made it first: open it, as it is
                os.mkdir(name, 0o700, dir_fd=parent)
            continue
        except (NotADirectoryError, OSError) as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
                raise FolderRefused(what, "it is a symbolic link; links are never followed", rule) from None
            if not make:
                return None  # a file where a folder would be: nothing below it is stored
            raise FolderRefused(what, "it is not a folder", rule) from None
        why = folder_refusal(os.fstat(fd), sticky_ok)
        if why is not None:
            os.close(fd)
            raise FolderRefused(what, why, rule)
        return fd


class LocalBackend:
    """Objects as files below ``root``; see the module docstring.

    Every path operation below the root is made on a folder's descriptor,
    by one name, without following a link (``dir_fd``, ``O_NOFOLLOW``):
    nothing is checked by path and used after, so nothing planted between
    two ops is followed.  The root's descriptor is kept open while the
    backend lives (``close`` closes it), as is the lock folder's once made;
    the folders of a key are opened from the root for each op and closed
    after it (a descriptor cached past its op could be closed by one thread
    while another uses its number, and a folder removed and made again
    would be missed): a handful of ``openat`` calls, bounded by a key's depth.
    """

    label = "file"  # its kind, in metrics

    def __init__(self, root: str, create: bool = True, where: str | None = None) -> None:
        """A store in folder ``root``; with ``create`` False, a folder that does not exist is refused.

        The drivers and the admin tool's readers pass False: a typo in
        ``file:///...`` must not silently make (and leave behind) a new empty
        store that answers every read with nothing.  ``where`` names the
        setting in the refusals of an op (``LNK_BUCKET_URL``).  A folder another user
        controls is refused (``FolderRefused``), however it came to be:
        ``mkdir -p`` is silent about a folder that was there already.
        """
        if create and not os.path.lexists(root):
            os.makedirs(root, mode=0o700, exist_ok=True)
        self._root_fd = _open_root(root)
        self.root = os.path.realpath(root)
        self.locks = os.path.join(self.root, _OBJ + "locks")
        self._locks_fd: int | None = None  # made on the first write or lock: a store only read is left as it was
        self._locks_guard = threading.Lock()
        self.where = where
        self.clock = StoreClock(probe=self._probe_clock)

    def close(self) -> None:
        """Close the root's and the lock folder's descriptors (the backend is not used after)."""
        for fd in (self._locks_fd, self._root_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self._locks_fd, self._root_fd = None, -1

    def __del__(self) -> None:
        with suppress(Exception):
            self.close()

    @contextmanager
    def _naming(self) -> Iterator[None]:
        """A refusal met inside, said with the setting that names the store (``where``)."""
        try:
            yield
        except FolderRefused as exc:
            if exc.where is not None or self.where is None:
                raise
            raise FolderRefused(exc.what, exc.why, exc.rule, self.where) from None

    @contextmanager
    def _folder(self, names: Sequence[str], make: bool) -> Iterator[int | None]:
        """The descriptor of the folder ``names`` below the root (None when missing and not ``make``)."""
        current: int | None = None  # the descriptor this op opened, closed when done
        missing = False
        try:
            for name in names:
                child = _open_folder(self._root_fd if current is None else current, name, make)
                if current is not None:
                    os.close(current)
                    current = None
                if child is None:
                    missing = True
                    break
                current = child
            yield None if missing else (self._root_fd if current is None else current)
        finally:
            if current is not None:
                os.close(current)

    def _write_file(self, folder: int, name: str, raw: bytes) -> None:
        """Write ``raw`` to a new file ``name`` in ``folder`` (0600, never through a link), durably.

        Its kernel timestamp tells the store's time.
        """
        sent = time.time()
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=folder)
        with open(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
            written = os.fstat(f.fileno()).st_mtime_ns / 1e9
        self.clock.observe(sent, time.time(), written, _MTIME_RESOLUTION)

    def _lock_folder(self) -> int:
        """The lock folder's descriptor, made (0700) on first need; one another user may write in is refused."""
        with self._locks_guard:
            if self._locks_fd is None:
                self._locks_fd = _open_folder(self._root_fd, _OBJ + "locks", True, "the lock folder",
                                              sticky_ok=False, rule=LOCKS_RULE)
            assert self._locks_fd is not None
            return self._locks_fd

    def _probe_clock(self) -> None:
        # In the root, named as no object is (listings skip it): a store only read gets no lock folder.
        probe = f"{_OBJ}clock.{os.getpid()}.{time.monotonic_ns()}"
        self._write_file(self._root_fd, probe, b"")
        os.unlink(probe, dir_fd=self._root_fd)

    # -- paths

    def _names(self, key: str) -> tuple[list[str], str]:
        """The folders of ``key`` below the root, and its object file's name in the last."""
        names: list[str] = []
        for part in key.split("/"):
            names.extend(_part_to_names(part))
        return names[:-1], names[-1] + _OBJ

    def _lock_file(self, stripe: int) -> int:
        """Lock file ``stripe``, opened: made exclusively (0600) when missing; one not ours is refused."""
        folder = self._lock_folder()
        name = str(stripe)
        while True:
            try:
                fd = os.open(name, os.O_RDWR | _NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            except FileNotFoundError:
                try:
                    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=folder)
                except FileExistsError:
                    continue  # another writer made it first: open it, and check it, as any found
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise FolderRefused("a lock file", "it is a symbolic link", LOCK_FILE_RULE) from None
                if exc.errno == errno.EISDIR:
                    raise FolderRefused("a lock file", "it is a folder", LOCK_FILE_RULE) from None
                raise
            info = os.fstat(fd)
            why = None if stat.S_ISREG(info.st_mode) else "it is not a regular file"
            if why is None and info.st_uid != _me():
                why = f"it is owned by uid {info.st_uid}, not this user ({_me()})"
            if why is not None:
                os.close(fd)
                raise FolderRefused("a lock file", why, LOCK_FILE_RULE)
            return fd

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        fd = self._lock_file(zlib.crc32(key.encode()) % _STRIPES)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, folder: int | None, name: str, head: int | None = None) -> bytes | None:
        """Object file ``name`` in ``folder``; None when it (or its folder) is missing; a link is refused."""
        if folder is None:
            return None
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FolderRefused("an object of the store", "it is a symbolic link; links are never followed",
                                    OBJECT_RULE) from exc
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                return None
            raise
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise FolderRefused("an object of the store", "it is not a regular file", OBJECT_RULE)
            if info.st_uid not in (0, _me()):
                raise FolderRefused("an object of the store", f"it is owned by uid {info.st_uid}, neither root "
                                    f"nor this user ({_me()})", OBJECT_RULE)
            return f.read() if head is None else f.read(head)

    # -- the Backend interface

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        folders, name = self._names(key)
        with self._naming(), self._folder(folders, make=False) as folder:
            raw = self._read(folder, name, head)
        if raw is None:
            return None
        return raw, frame_nonce(raw)

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        folders, name = self._names(key)
        nonce = frame_nonce(raw)
        with self._naming(), self._locked(key), self._folder(folders, make=True) as folder:
            assert folder is not None
            if isinstance(mode, (Create, Update)):
                current = self._read(folder, name)
                if isinstance(mode, Create) and current is not None:
                    raise AlreadyExists(key)
                if isinstance(mode, Update) and (current is None or frame_nonce(current) != mode.version):
                    raise PreconditionFailed(key)
            tmp = f"{name}.{nonce}.tmp"
            self._write_file(folder, tmp, raw)
            # A rename replaces the name itself: a link planted there is replaced, never written through.
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        return nonce

    def delete(self, key: str, version: str | None) -> None:
        folders, name = self._names(key)
        with self._naming(), self._locked(key), self._folder(folders, make=False) as folder:
            current = self._read(folder, name)
            if current is None:
                raise NotFound(key)
            if version is not None and frame_nonce(current) != version:
                raise PreconditionFailed(key)
            os.unlink(name, dir_fd=folder)

    def _walk(self, folder: int, names: tuple[str, ...], key_prefix: str) -> Iterator[tuple[str, tuple[str, ...]]]:
        """(key, folder names + object file name) of every object below ``folder`` (``names`` below the root).

        Each folder is listed on a descriptor of its own (``scandir`` of a
        descriptor moves that descriptor's offset) and entered by name,
        never through a link.
        """
        own = os.open(".", _FOLDER, dir_fd=folder)
        try:
            with os.scandir(own) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        finally:
            os.close(own)
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                if name.startswith(_OBJ):
                    continue
                try:
                    child = _open_folder(folder, name, make=False)
                except FolderRefused:
                    continue  # a link, or another user's: not the store's, nothing below it is listed
                if child is None:
                    continue
                try:
                    joiner = "" if name.endswith("+") else "/"
                    yield from self._walk(child, (*names, name),
                                          key_prefix + _unescape_chunk(name.rstrip("+")) + joiner)
                finally:
                    os.close(child)
            elif name.endswith(_OBJ) and entry.is_file(follow_symlinks=False):
                yield key_prefix + _unescape_chunk(name[: -len(_OBJ)]), (*names, name)

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        whole_parts = prefix.split("/")[:-1]
        names: list[str] = []
        for part in whole_parts:
            names.extend(_part_to_names(part))
        base = "".join(p + "/" for p in whole_parts)
        with self._naming(), self._folder(names, make=False) as folder:
            found = [] if folder is None else [
                (k, p)
                for k, p in self._walk(folder, tuple(names), base)
                if k.startswith(prefix) and (start_after is None or k > start_after)
            ]
        found.sort()
        if limit is not None:
            found = found[:limit]
        for key, path in found:
            try:
                with self._folder(path[:-1], make=False) as at:
                    if at is None:
                        continue
                    fd = os.open(path[-1], os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=at)
                with open(fd, "rb") as f:
                    info = os.fstat(f.fileno())
                    if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, _me()):
                        continue  # not an object of the store's (OBJECT_RULE): a read of it is refused
                    head = f.read(FRAME_MAX)
            except (FolderRefused, OSError):
                continue  # gone, or made a link since it was listed
            yield Listed(key, info.st_mtime, frame_nonce(head) or None, info.st_size)

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        parts = {item.key[len(prefix) :].split("/", 1)[0] for item in self.list(prefix, None, None)}
        return sorted(parts)

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
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from .clock import StoreClock
from .generations import (
    FRAME_MAX,
    AlreadyExists,
    Create,
    Listed,
    NotFound,
    PreconditionFailed,
    PutMode,
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


class FolderMissing(FileNotFoundError):
    """The store's folder does not exist (and was not to be made); ``filename`` is the folder."""

    def __init__(self, folder: str) -> None:
        super().__init__(2, "the folder does not exist: make it first (mkdir -p), or correct the URL", folder)


class LocalBackend:
    """Objects as files below ``root``; see the module docstring."""

    label = "file"  # its kind, in metrics

    def __init__(self, root: str, create: bool = True) -> None:
        """A store in folder ``root``; with ``create`` False, a folder that does not exist is refused.

        The drivers and the admin tool's readers pass False: a typo in
        ``file:///...`` must not silently make (and leave behind) a new empty
        store that answers every read with nothing.
        """
        if not create and not os.path.isdir(root):
            raise FolderMissing(root)
        os.makedirs(root, mode=0o700, exist_ok=True)
        self.root = os.path.realpath(root)
        self.locks = os.path.join(self.root, _OBJ + "locks")
        self._locks_made = False  # made on the first write or lock: a store only read is left as it was
        self.clock = StoreClock(probe=self._probe_clock)

    def _makedirs(self, folder: str) -> None:
        """Make ``folder`` and any missing parent below the root, each 0700: only its owner reads a store."""
        if os.path.isdir(folder):
            return
        self._makedirs(os.path.dirname(folder))
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass

    def _inside(self, path: str) -> str:
        """``path`` itself, refused if any folder on the way from the root is a link: links are never followed."""
        folder = os.path.dirname(path)
        if os.path.realpath(folder) != folder:
            raise ValueError("a folder of the store is a symbolic link; it is not followed")
        return path

    def _write_file(self, path: str, raw: bytes) -> None:
        """Write ``raw`` to a new file (0600, never through a link), durably.

        Its kernel timestamp tells the store's time.
        """
        sent = time.time()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
            written = os.fstat(f.fileno()).st_mtime_ns / 1e9
        self.clock.observe(sent, time.time(), written, _MTIME_RESOLUTION)

    def _lock_folder(self) -> str:
        """The folder of the lock files, made on first need."""
        if not self._locks_made:
            self._makedirs(self.locks)
            self._locks_made = True
        return self.locks

    def _probe_clock(self) -> None:
        # In the root, named as no object is (listings skip it): a store only read gets no lock folder.
        probe = os.path.join(self.root, f"{_OBJ}clock.{os.getpid()}.{time.monotonic_ns()}")
        self._write_file(probe, b"")
        os.remove(probe)

    # -- paths

    def _path(self, key: str) -> str:
        names: list[str] = []
        for part in key.split("/"):
            names.extend(_part_to_names(part))
        names[-1] += _OBJ
        return os.path.join(self.root, *names)

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        stripe = zlib.crc32(key.encode()) % _STRIPES
        fd = os.open(os.path.join(self._lock_folder(), str(stripe)), os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, path: str, head: int | None = None) -> bytes | None:
        try:
            with open(os.open(self._inside(path), os.O_RDONLY | _NOFOLLOW), "rb") as f:
                return f.read() if head is None else f.read(head)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError("an object of the store is a symbolic link; it is not followed") from exc
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                return None
            raise

    # -- the Backend interface

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        raw = self._read(self._path(key), head)
        if raw is None:
            return None
        return raw, frame_nonce(raw)

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        path = self._path(key)
        nonce = frame_nonce(raw)
        with self._locked(key):
            if isinstance(mode, (Create, Update)):
                current = self._read(path)
                if isinstance(mode, Create) and current is not None:
                    raise AlreadyExists(key)
                if isinstance(mode, Update) and (current is None or frame_nonce(current) != mode.version):
                    raise PreconditionFailed(key)
            self._makedirs(os.path.dirname(path))
            self._inside(path)
            tmp = f"{path}.{nonce}.tmp"
            self._write_file(tmp, raw)
            os.replace(tmp, path)
        return nonce

    def delete(self, key: str, version: str | None) -> None:
        path = self._path(key)
        with self._locked(key):
            current = self._read(path)
            if current is None:
                raise NotFound(key)
            if version is not None and frame_nonce(current) != version:
                raise PreconditionFailed(key)
            os.remove(path)

    def _walk(self, folder: str, key_prefix: str) -> Iterator[tuple[str, str]]:
        """(key, path) of every object below ``folder`` whose key starts ``key_prefix``-wise."""
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                if name.startswith(_OBJ):
                    continue
                joiner = "" if name.endswith("+") else "/"
                yield from self._walk(entry.path, key_prefix + _unescape_chunk(name.rstrip("+")) + joiner)
            elif name.endswith(_OBJ) and entry.is_file(follow_symlinks=False):
                yield key_prefix + _unescape_chunk(name[: -len(_OBJ)]), entry.path

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        whole_parts = prefix.split("/")[:-1]
        names: list[str] = []
        for part in whole_parts:
            names.extend(_part_to_names(part))
        folder = os.path.join(self.root, *names)
        base = "".join(p + "/" for p in whole_parts)
        found: list[tuple[str, str]] = [
            (k, p)
            for k, p in self._walk(folder, base)
            if k.startswith(prefix) and (start_after is None or k > start_after)
        ]
        found.sort()
        if limit is not None:
            found = found[:limit]
        for key, path in found:
            try:
                with open(os.open(path, os.O_RDONLY | _NOFOLLOW), "rb") as f:
                    stat = os.fstat(f.fileno())
                    head = f.read(FRAME_MAX)
            except (FileNotFoundError, OSError):
                continue
            yield Listed(key, stat.st_mtime, frame_nonce(head) or None, stat.st_size)

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        parts = {item.key[len(prefix) :].split("/", 1)[0] for item in self.list(prefix, None, None)}
        return sorted(parts)

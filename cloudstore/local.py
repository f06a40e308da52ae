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

import fcntl
import os
import re
import zlib
from contextlib import contextmanager
from typing import Iterator, Optional

from .generations import AlreadyExists, Listed, NotFound, PreconditionFailed, PutMode, Create, Update, unframe

_PART = re.compile(r"^[A-Za-z0-9_.~%-]+$")
_CHUNK = 200
_STRIPES = 64
_OBJ = "="
_HEAD = 4 + 32 + 1  # the frame's magic, nonce and newline: enough to know the version


def _check_part(part: str) -> None:
    if not _PART.match(part) or part in (".", ".."):
        raise ValueError(f"key part not storable in a folder: {part!r}")


def _part_to_names(part: str) -> list[str]:
    _check_part(part)
    chunks = [part[i : i + _CHUNK] for i in range(0, len(part), _CHUNK)]
    return [c + "+" for c in chunks[:-1]] + [chunks[-1]]


class LocalBackend:
    """Objects as files below ``root``; see the module docstring."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.locks = os.path.join(self.root, _OBJ + "locks")
        os.makedirs(self.locks, exist_ok=True)

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
        fd = os.open(os.path.join(self.locks, str(stripe)), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @staticmethod
    def _read(path: str) -> Optional[bytes]:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None

    # -- the Backend interface

    def get(self, key: str) -> Optional[tuple[bytes, str]]:
        raw = self._read(self._path(key))
        if raw is None:
            return None
        return raw, unframe(raw)[0]

    def put(self, key: str, raw: bytes, mode: PutMode) -> str:
        path = self._path(key)
        nonce = unframe(raw)[0]
        with self._locked(key):
            if isinstance(mode, (Create, Update)):
                current = self._read(path)
                if isinstance(mode, Create) and current is not None:
                    raise AlreadyExists(key)
                if isinstance(mode, Update) and (current is None or unframe(current)[0] != mode.version):
                    raise PreconditionFailed(key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{nonce}.tmp"
            with open(tmp, "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        return nonce

    def delete(self, key: str, version: Optional[str]) -> None:
        path = self._path(key)
        with self._locked(key):
            current = self._read(path)
            if current is None:
                raise NotFound(key)
            if version is not None and unframe(current)[0] != version:
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
                yield from self._walk(entry.path, key_prefix + name.rstrip("+") + joiner)
            elif name.endswith(_OBJ):
                yield key_prefix + name[: -len(_OBJ)], entry.path

    def list(self, prefix: str, start_after: Optional[str], limit: Optional[int]) -> Iterator[Listed]:
        whole_parts = prefix.split("/")[:-1]
        names: list[str] = []
        for part in whole_parts:
            names.extend(_part_to_names(part))
        folder = os.path.join(self.root, *names)
        base = "".join(p + "/" for p in whole_parts)
        found: list[tuple[str, str]] = [
            (k, p) for k, p in self._walk(folder, base) if k.startswith(prefix) and (start_after is None or k > start_after)
        ]
        found.sort()
        if limit is not None:
            found = found[:limit]
        for key, path in found:
            try:
                with open(path, "rb") as f:
                    modified = os.fstat(f.fileno()).st_mtime
                    head = f.read(_HEAD)
            except FileNotFoundError:
                continue
            yield Listed(key, modified, unframe(head)[0] or None)

    def list_dirs(self, prefix: str) -> list[str]:
        parts = {item.key[len(prefix) :].split("/", 1)[0] for item in self.list(prefix, None, None)}
        return sorted(parts)

"""Files: an agent's instructions and skills, by path, with versions that never come back.

A path is ONE object, for its whole life: a JSON header line
``{"v": N, "path": ...}`` and the file's bytes while it exists, or the header
``{"v": N, "path": ..., "gone": true}`` alone once it is removed (a
tombstone).  Every change is one conditional write on that object, so one
write settles each race:

* Of several writers of one version, the store lets exactly one win.
* Removal replaces the file with a tombstone that keeps its version, never
  deletes it; a file made again updates the tombstone and takes its version
  + 1.  So a version never comes back, without a second object whose read
  could race with the write (the floor object of the earlier design), and
  nothing here needs a conditional delete (which fake-gcs-server ignores).

The version is a counter this driver keeps, not the backend's token, so it
is the same integer on S3 (which has nothing like generations), GCS and a
folder.  Tombstones are permanent by design: a bucket lifecycle rule must
never expire them (see deploy/README.md).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

from .generations import Listed, Object
from .space import KEEP, Space
from .validate import FILE_MAX, FILES_MAX, Agent, RequestError, compact

T = TypeVar("T")

#: Bytes of a file object's payload that always hold its whole header line.
HEADER_MAX = 8192


def _split(payload: bytes) -> tuple[dict[str, Any], bytes]:
    head, _, data = payload.partition(b"\n")
    return json.loads(head), data


def _join(header: dict[str, Any], data: bytes = b"") -> bytes:
    return compact(header).encode("ascii") + b"\n" + data


def _live(header: dict[str, Any] | None) -> TypeGuard[dict[str, Any]]:
    return header is not None and not header.get("gone", False)


def _summary(obj: Object) -> tuple[bool, str]:
    """What a listing needs of a file object: whether it is live, and its path."""
    header = json.loads(obj.data.partition(b"\n")[0])
    return _live(header), header["path"]


class Files:
    """file_read, file_list, file_write, file_remove, file_append."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.store = space.store

    @staticmethod
    def _next_version(header: dict[str, Any] | None) -> int:
        """The version a write gives: one past the object's (live or tombstone), 1 where none ever was."""
        return 1 if header is None else int(header["v"]) + 1

    def _change(self, agent: Agent, path: str, change: Callable[[dict[str, Any] | None, bytes], tuple[Any, T]]) -> T:
        """One compare-and-set on the path's object; ``change(header, data)`` as in ``Space.update``."""
        keys = self.space.keys(agent)

        def on_raw(raw: bytes | None) -> tuple[Any, T]:
            header, data = (None, b"") if raw is None else _split(raw)
            return change(header, data)

        def written(obj: Object, payload: bytes) -> None:  # a listing then knows it without a read
            self.space.remember_seen(key, obj.version, 0, _summary(obj))  # type: ignore[arg-type]

        key = keys.file(path)
        return self.space.update(key, on_raw, raw=True, on_written=written)

    def read(self, agent: Agent, path: str) -> dict[str, Any] | None:
        obj = self.store.get(self.space.keys(agent).file(path))
        if obj is None:
            return None
        header, data = _split(obj.data)
        if not _live(header):
            return None
        return {"data": base64.b64encode(data).decode("ascii"), "version": int(header["v"])}

    def write(self, agent: Agent, path: str, data: bytes, version: int) -> dict[str, Any]:
        def change(header: dict[str, Any] | None, _: bytes) -> tuple[Any, dict[str, Any]]:
            now = int(header["v"]) if _live(header) else 0
            if now != version:
                return KEEP, {"reply": "stale", "version": now}
            new = self._next_version(header)
            return _join({"v": new, "path": path}, data), {"reply": "wrote", "version": new}

        return self._change(agent, path, change)

    def remove(self, agent: Agent, path: str, version: int) -> bool:
        def change(header: dict[str, Any] | None, _: bytes) -> tuple[Any, bool]:
            if not _live(header) or int(header["v"]) != version:
                return KEEP, False
            return _join({"v": version, "path": path, "gone": True}), True

        return self._change(agent, path, change)

    def append(self, agent: Agent, path: str, data: bytes) -> int:
        def change(header: dict[str, Any] | None, old: bytes) -> tuple[bytes, int]:
            kept = old if _live(header) else b""
            if len(kept) + len(data) > FILE_MAX:
                raise RequestError(f"the append would grow the file past {FILE_MAX} bytes; the file is unchanged")
            new = self._next_version(header)
            return _join({"v": new, "path": path}, kept + data), new

        return self._change(agent, path, change)

    def listing(self, agent: Agent, folder: str) -> list[str]:
        """Live files under ``folder``: a listing, then each object's header (remembered by version)."""
        keys = self.space.keys(agent)
        under = folder.rstrip("/") + "/"
        inline = self.store.list(keys.folder(folder))
        hashed = self.store.list(keys.hashed_files())
        paths: list[str] = []
        for i, (item, summary) in enumerate(zip(inline + hashed, self._summaries(inline + hashed), strict=False)):
            if summary is None or not summary[0]:
                continue
            path = summary[1] if i >= len(inline) else keys.path_of(item.key)
            if path.startswith(under):
                paths.append(path)
        if len(paths) > FILES_MAX:
            raise RequestError(f"the folder holds more than {FILES_MAX} files; a list is never cut short")
        return sorted(paths, key=lambda p: p.encode("utf-8"))

    def _summaries(self, listed: list[Listed]) -> list[tuple[bool, str] | None]:
        """(live, path) of each listed file object, reading only the head of those not known by version."""
        return self.space.listed_values(listed, _summary, head=HEADER_MAX)

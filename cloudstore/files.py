"""Files: an agent's instructions and skills, by path, with versions that never come back.

A file is one object: a JSON header line ``{"v": N, "path": ...}`` and its
bytes.  Its version is a counter this driver keeps, not the backend's token,
so it is the same integer on S3 (which has nothing like generations), GCS
and a folder.  Of several writers of one version, the conditional write on
the object lets exactly one win.

Versions never come back.  A removal first raises the path's *floor* (an
object ``fv/...`` holding the highest version ever removed, only ever
raised), then deletes the file on the condition that it is unchanged.  A file
made where none is starts at floor + 1.  Since the floor is raised before the
file disappears, whoever sees no file sees a floor at least as high as any
version given before.

The floor objects are permanent by design: a bucket lifecycle rule must
never expire them (see deploy/README.md).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Optional

from .generations import AlreadyExists, Create, NotFound, Object, PreconditionFailed, Update
from .keys import AgentKeys, decode_path, folder_part, path_part
from .space import KEEP, Space
from .validate import FILE_MAX, FILES_MAX, Agent, RequestError, compact


def _split(obj: Object) -> tuple[dict, bytes]:
    head, _, data = obj.data.partition(b"\n")
    return json.loads(head), data


def _join(header: dict, data: bytes) -> bytes:
    return compact(header).encode("ascii") + b"\n" + data


def _floor_key(keys: AgentKeys, path: str) -> str:
    return keys.base + "fv/" + path_part(path)


class Files:
    """file_read, file_list, file_write, file_remove, file_append."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.store = space.store

    def _current(self, keys: AgentKeys, path: str) -> tuple[Optional[Object], int, bytes]:
        obj = self.store.get(keys.file(path))
        if obj is None:
            return None, 0, b""
        header, data = _split(obj)
        return obj, int(header["v"]), data

    def _floor(self, keys: AgentKeys, path: str) -> int:
        """The highest version this path ever had removed (0 for none)."""
        _, floor = self.space.get_json(_floor_key(keys, path))
        return 0 if floor is None else int(floor["v"])

    def _remember(self, keys: AgentKeys, path: str) -> None:
        part = path_part(path)
        if part.startswith("~/"):
            self.space.remember_name(keys, part, path)

    def read(self, agent: Agent, path: str) -> Optional[dict]:
        obj, version, data = self._current(self.space.keys(agent), path)
        if obj is None:
            return None
        return {"data": base64.b64encode(data).decode("ascii"), "version": version}

    def write(self, agent: Agent, path: str, data: bytes, version: int) -> dict:
        keys = self.space.keys(agent)
        obj, now, _ = self._current(keys, path)
        if now != version:
            return {"reply": "stale", "version": now}
        new = now + 1 if obj is not None else self._floor(keys, path) + 1
        self._remember(keys, path)
        mode = Create() if obj is None else Update(obj.version)
        try:
            self.store.put(keys.file(path), _join({"v": new, "path": path}, data), mode)
        except (AlreadyExists, PreconditionFailed):
            return {"reply": "stale", "version": self._current(keys, path)[1]}
        return {"reply": "wrote", "version": new}

    def remove(self, agent: Agent, path: str, version: int) -> bool:
        keys = self.space.keys(agent)
        obj, now, _ = self._current(keys, path)
        if obj is None or now != version:
            return False

        def raise_floor(floor: Optional[dict]) -> tuple[Any, None]:
            if floor is not None and int(floor["v"]) >= now:
                return KEEP, None
            return {"v": now}, None

        self.space.update(_floor_key(keys, path), raise_floor)
        try:
            self.store.delete(keys.file(path), obj.version)
        except (PreconditionFailed, NotFound):
            return False
        return True

    def append(self, agent: Agent, path: str, data: bytes) -> int:
        keys = self.space.keys(agent)
        self._remember(keys, path)

        def change(raw: Optional[bytes]) -> tuple[bytes, int]:
            if raw is None:
                header, old = None, b""
            else:
                head, _, old = raw.partition(b"\n")
                header = json.loads(head)
            if len(old) + len(data) > FILE_MAX:
                raise RequestError(f"the append would grow {path!r} past {FILE_MAX} bytes; the file is unchanged")
            new = int(header["v"]) + 1 if header is not None else self._floor(keys, path) + 1
            return _join({"v": new, "path": path}, old + data), new

        return self.space.update(keys.file(path), change, raw=True)

    def listing(self, agent: Agent, folder: str) -> list[str]:
        keys = self.space.keys(agent)
        under = folder.rstrip("/") + "/"
        listed = self.store.list(keys.files() + folder_part(folder), limit=FILES_MAX + 1)
        paths = [decode_path(item.key[len(keys.files()):]) for item in listed]
        hashed = self.store.list(keys.hashed_files())
        if hashed:
            parts = [item.key[len(keys.files()):] for item in hashed]
            names = self.space.names_of(keys, parts)
            paths.extend(n for n in names if n is not None and n.startswith(under))
        if len(paths) > FILES_MAX:
            raise RequestError(f"{folder!r} holds more than {FILES_MAX} files; a list is never cut short")
        return sorted(paths, key=lambda p: p.encode("utf-8"))

"""What a store's agents' ops tell, for test_key_layout.py: imports only what eafe802's drivers have too,
so the same function reads a store through either commit's code."""

from __future__ import annotations

import base64
import json
from typing import Any

AGENTS = [{"id": "a", "owner": "o"}, {"id": "a-b", "owner": None}, {"id": "é" * 100, "owner": "o" * 200}]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply.get("reply") != "error", reply
    return reply


def state(opened: Any) -> dict[str, Any]:
    """Everything an agent's ops tell, for every agent the old store has."""
    out: dict[str, Any] = {}
    for n, agent in enumerate(AGENTS[:2]):
        def ask(op: str, _agent: dict = agent, **args: Any) -> Any:
            return ok(opened.service.answer({"op": op, "agent": _agent, **args}))

        files = ask("file_list", folder="skills")["files"] + ask("file_list", folder="instructions")["files"]
        out[str(n)] = {
            "files": files,
            "reads": {p: ask("file_read", path=p)["file"] for p in files + ["skills/gone"]},
            "events": {t: ask("read", thread=t)["events"] for t in ("t", "t y")},
            "threads": ask("threads")["threads"],
            "leases": ask("leases", lapse_ms=10**9)["leases"],
            "tools": ask("tools_list")["narrowed"],
            "jobs": {p: sorted(json.dumps(j, sort_keys=True) for j in ask("job_list", place=p)["jobs"])
                     for p in ("waiting", "firing", "ending")},
            "day": ask("job_day"),
            "next": ask("job_next"),
            "twice": ask("file_write", path="skills/twice", data=b64(b"3"), version=1),  # stale: it is at 2
        }
    return out

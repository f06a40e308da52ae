"""Tool narrowing: which tools a conversation may use, only ever fewer.

One object per conversation, changed by read-modify-conditional-write: each
narrowing intersects with what is there when its write wins, so of several
at once each narrows what the others left.  It lives apart from the
conversation's events, so ``remove`` leaves it in place: a conversation made
again never comes back with more tools.
"""

from __future__ import annotations

from typing import Any

from .space import Space
from .validate import Agent


class Tools:
    """tools_read, tools_list, tools_narrow."""

    def __init__(self, space: Space) -> None:
        self.space = space

    def read(self, agent: Agent, thread: str) -> list[str] | None:
        _, value = self.space.get_json(self.space.keys(agent).tools(thread))
        return None if value is None else list(value["tools"])

    def narrow(self, agent: Agent, thread: str, tools: list[str]) -> list[str]:
        def change(value: dict[str, Any] | None) -> tuple[Any, list[str]]:
            allowed = None if value is None else set(value["tools"])
            now = [t for t in tools if allowed is None or t in allowed]
            return {"thread": thread, "tools": now}, now

        return self.space.update(self.space.keys(agent).tools(thread), change)

    def listing(self, agent: Agent) -> dict[str, list[str]]:
        keys = self.space.keys(agent)
        values = self.space.listed_json(self.space.store.list(keys.tools_all()))
        return {v["thread"]: list(v["tools"]) for v in values if v is not None}

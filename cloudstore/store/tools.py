"""Tool narrowing: which tools a conversation may use, only ever fewer.

One object per conversation, changed by read-modify-conditional-write: each
narrowing intersects with what is there when its write wins, so of several
at once each narrows what the others left.  It lives apart from the
conversation's events, so ``remove`` leaves it in place: a conversation made
again never comes back with more tools.
"""

from __future__ import annotations

from typing import Any

from . import stored
from .model import Agent
from .space import Space

TOOLS = "tools narrowing"


def checked(thread: str | None, value: Any) -> list[str] | None:
    """A stored narrowing's tools, of ``thread`` (None: any); ``stored.Malformed`` unless as written."""
    if value is None:
        return None
    stored.obj(value, TOOLS)
    stored.expect(set(value) == {"thread", "tools"}, TOOLS, "it is not {thread, tools}")
    stored.text(value["thread"], TOOLS, "its thread")
    stored.expect(thread is None or value["thread"] == thread, TOOLS, "it is of another conversation")
    tools = value["tools"]
    stored.expect(isinstance(tools, list), TOOLS, "its tools are not a list")
    for tool in tools:
        stored.text(tool, TOOLS, "a tool")
    return list(tools)


class Tools:
    """tools_read, tools_list, tools_narrow."""

    def __init__(self, space: Space) -> None:
        self.space = space

    def read(self, agent: Agent, thread: str) -> list[str] | None:
        with stored.parsing(TOOLS):
            _, value = self.space.get_json(self.space.keys(agent).tools(thread))
        return checked(thread, value)

    def narrow(self, agent: Agent, thread: str, tools: list[str]) -> list[str]:
        def change(value: dict[str, Any] | None) -> tuple[Any, list[str]]:
            held = checked(thread, value)
            allowed = None if held is None else set(held)
            now = [t for t in tools if allowed is None or t in allowed]
            return {"thread": thread, "tools": now}, now

        with stored.parsing(TOOLS):
            return self.space.update(self.space.keys(agent).tools(thread), change)

    def listing(self, agent: Agent) -> dict[str, list[str]]:
        keys = self.space.keys(agent)
        below = keys.tools_all()
        listed = [item for item in self.space.store.list(below) if "/" not in item.key[len(below):]]
        with stored.parsing(TOOLS):
            values = self.space.listed_json(listed)
        out: dict[str, list[str]] = {}
        for item, value in zip(listed, values, strict=True):
            tools = checked(None, value)
            if tools is not None:
                stored.expect(keys.tools(value["thread"]) == item.key, TOOLS, "it is of another conversation")
                out[value["thread"]] = tools
        return out

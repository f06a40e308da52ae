"""How ``--faults`` judges a reply given under a fault, and the history a failure prints.

Under a fault a driver may give up: an error reply saying ``outcome unknown``
(the write may have landed) is always allowed, and an error reply without it
promises that nothing was changed, which the read-back then holds it to.
What it may never do is tell a caller that someone else won (``taken``,
``stale``, ``held``, ``lost``, ``found: false``) about a write that was in
fact its own, or lose or double a write it acknowledged.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .expect import CheckFailed, Json, is_error

#: What a reply says about the fate of the write that was asked for.
DONE, UNKNOWN, NOT_DONE, OTHER = "done", "unknown", "not done", "other"


def fate(reply: dict[str, Json], good: bool) -> str:
    """DONE when the reply is the own write's success (``good``), UNKNOWN / NOT_DONE for an error
    reply that says the outcome is unknown / says nothing was changed, OTHER for any other reply."""
    if good:
        return DONE
    if is_error(reply):
        return UNKNOWN if "outcome unknown" in str(reply.get("error", "")) else NOT_DONE
    return OTHER


def compact(value: Json, limit: int = 240) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class History:
    """Every request a fault check sent (who, what, what came back, the faults armed) in order."""

    seed: int
    lines: list[str] = field(default_factory=list)
    schedule: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    ops: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    def scenario(self, title: str) -> None:
        self.lines.append(f"-- {title}")

    def record(self, who: str, request: dict[str, Json], reply: dict[str, Json] | str, armed: str) -> None:
        self.ops += 1
        at = time.monotonic() - self.started
        shown = {k: v for k, v in request.items() if k != "agent"}
        got = reply if isinstance(reply, str) else compact(reply)
        self.lines.append(f"{at:8.3f}s {who}: {compact(shown)} -> {got}{'   [' + armed + ']' if armed else ''}")

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def tail(self, count: int = 40) -> list[str]:
        """The scenario that broke: the lines since its title, at most ``count``."""
        start = max((i for i, line in enumerate(self.lines) if line.startswith("-- ")), default=0)
        return self.lines[start:][-count:]


class FaultFailed(CheckFailed):
    """A check failed under faults; the history that broke it goes with it."""

    def __init__(self, what: str, expected: Json, got: Json, history: History) -> None:
        super().__init__(what, expected, got)
        self.history = history


def fail(history: History, what: str, expected: Json, got: Json) -> None:
    raise FaultFailed(what, expected, got, history)


def judge_own(history: History, op: str, reply: dict[str, Json], good: bool) -> str:
    """The reply's fate; FaultFailed when it tells of another's win about the own write."""
    told = fate(reply, good)
    if told == OTHER:
        fail(history, f"a wrong reply to {op} about its own write (under the fault)",
             "<its success, or an error saying outcome unknown>", reply)
    return told

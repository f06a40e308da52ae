"""What a simulated run leaves behind: every op with its reply and steps, and every backend request.

Time is the scheduler's *step*: a counter raised each time the scheduler lets
one thing happen (a machine starts an op, one backend request goes through
with its fault, a late write lands, the world's time jumps).  Exactly one
thread runs per step, so an op ``a`` certainly came before ``b`` when
``a.end < b.start``.

A *jump* (a long pause of a machine, a stall of the store: ``simtime``) moves
the store's time on by more than the workload's half-hour lapse, at a step
of its own (``History.jumps``).  An op's ``epochs`` are how many jumps came
before its start and before its end: a lease last renewed at epoch e may be
found lapsed (a half-hour lapse) only by a taker whose judgment came at a
later epoch.

An op's reply says how sure we are of its effect (``outcome``):

* ``ok``       - a reply other than an error: the effect happened within [start, end].
* ``unknown``  - an error with the words ``outcome unknown``: it may have taken
  effect, at any step from its start on (a late write can land much later).
* ``nothing``  - any other error: by wire.md it changed nothing.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

INF = float("inf")

UNKNOWN_WORDS = "outcome unknown"
#: Words by which an error claims that nothing was changed.
NOTHING_WORDS = re.compile(r"nothing (was|has been) (changed|written|made)|certainly not|unchanged|no change")


@dataclass
class Op:
    """One request a machine sent, its reply and the steps it began and ended at."""

    index: int
    machine: str
    request: dict
    reply: dict
    start: int
    end: int
    epochs: tuple[int, int] = (0, 0)  # jumps of the world's time before its start, and before its end

    @property
    def name(self) -> str:
        return self.request["op"]

    @property
    def agent(self) -> str:
        return self.request["agent"]["id"]

    @property
    def error(self) -> str | None:
        return self.reply.get("error") if self.reply.get("reply") == "error" else None

    @property
    def outcome(self) -> str:
        error = self.error
        if error is None:
            return "ok"
        return "unknown" if UNKNOWN_WORDS in error else "nothing"

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def effect_end(self) -> float:
        """The last step its effect may land at: its end when answered, never when it changed nothing."""
        outcome = self.outcome
        return self.end if outcome == "ok" else INF if outcome == "unknown" else -INF

    def may_fall_between(self, after: float, before: float) -> bool:
        """Whether its effect may have happened after step ``after`` and before step ``before``."""
        return self.outcome != "nothing" and self.start < before and self.effect_end > after

    def arg(self, name: str, default: Any = None) -> Any:
        return self.request.get(name, default)

    def brief(self) -> str:
        args = {k: v for k, v in self.request.items() if k not in ("op", "agent")}
        text = json.dumps(args, separators=(",", ":"), sort_keys=True)
        reply = json.dumps(self.reply, separators=(",", ":"), sort_keys=True)
        if len(reply) > 240:
            reply = reply[:240] + "..."
        where = f"[{self.start:>4}-{self.end:<4}] {self.machine:<5} #{self.index:<3}"
        return f"{where} {self.agent} {self.name} {text} -> {reply}"


@dataclass
class Event:
    """One thing the scheduler let happen, for excerpts: a backend request, or a held write landing or lost."""

    step: int
    machine: str
    kind: str  # "call", "land", "drop"
    text: str
    key: str = ""
    reached: bool = False  # a write request that reached the store (now, or later as a held write)


@dataclass
class History:
    """Everything one seeded run did."""

    seed: int
    backend: str
    ops: list[Op] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    jumps: list[int] = field(default_factory=list)  # the steps at which the world's time jumped

    def add(self, machine: str, request: dict, reply: dict, start: int, end: int) -> Op:
        op = Op(len(self.ops), machine, request, reply, start, end, (self.epoch(start), self.epoch(end)))
        self.ops.append(op)
        return op

    def epoch(self, step: int) -> int:
        """How many jumps came before ``step``."""
        return bisect.bisect_left(self.jumps, step)

    def of(self, *names: str) -> list[Op]:
        return [op for op in self.ops if op.name in names]

    def reached(self, op: Op) -> bool:
        """Whether any write request of ``op`` reached the store (an op none of whose writes did changed nothing)."""
        return any(ev.reached and ev.machine == op.machine and op.start <= ev.step <= op.end for ev in self.events)

    def excerpt(self, ops: Iterable[Op], key_words: Iterable[str] = (), limit: int = 60,
                mark: Op | None = None) -> str:
        """The ops given (``mark`` flagged) and, in their span, the backend requests whose key holds every one of
        ``key_words``, in step order."""
        ops = sorted({o.index: o for o in ops}.values(), key=lambda o: (o.start, o.index))
        if not ops:
            return ""
        first = min(o.start for o in ops)
        last = max(o.end for o in ops)
        words = [w for w in key_words if w]
        def flag(o):
            return (">> op " if mark is not None and o.index == mark.index else "   op ")
        lines: list[tuple[int, int, str]] = [(o.start, 0, flag(o) + o.brief()) for o in ops]
        for ev in self.events:
            if first <= ev.step <= last and words and all(w in ev.key for w in words):
                lines.append((ev.step, 1, f"   {ev.kind:<4} [{ev.step:>4}] {ev.machine:<5} {ev.text}"))
        lines.sort(key=lambda item: (item[0], item[1]))
        text = [line for _, _, line in lines]
        if len(text) > limit:
            cut = len(text) - limit
            text = text[: limit // 2] + [f"  ... {cut} lines left out ..."] + text[-(limit - limit // 2):]
        return "\n".join(text)

"""Is there one order of the ops on one object that a sequential model accepts?

(Moved here from ``tests/sim/linear.py``, which re-exports it, so that
``lnk-store-check`` checks its racers' histories with the simulation's search.
An op is anything with ``start`` and ``end`` steps and ``ok``: whether it got
a reply that is not an error.)

Wing & Gong's search, with memo on (ops placed, model state) as in Lowe's
and Porcupine's checkers.  Each op must be placed at one point between its
start and end step; an op whose reply was an error may be placed at any point
after its start, or nowhere.  (The caller leaves out the ops whose error says
nothing was changed: if one changed something, no order explains what readers
saw.)

``step(state, op)`` lists the states the model may be in after ``op`` gave its
reply from ``state`` (empty: impossible), and for an op of unknown outcome
the states after it took effect (not taking effect is tried anyway).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

Op = Any
INF = float("inf")

Step = Callable[[Hashable, Op], Iterable[Hashable]]


@dataclass
class Verdict:
    ok: bool
    undecided: bool = False  # the search ran out of budget
    placed: tuple[Op, ...] = ()  # the longest order found, when not ok
    state: Any = None  # the model's state after it
    stuck: tuple[Op, ...] = ()  # the ops none of which could come next there


def linearizable(ops: list[Op], init: Hashable, step: Step, budget: int = 200_000) -> Verdict:
    """Search an order of ``ops`` that ``step`` accepts from ``init``; ops without a reply are optional."""
    ops = sorted(ops, key=lambda o: o.start)
    n = len(ops)
    starts = [o.start for o in ops]
    ends = [o.end if o.ok else INF for o in ops]
    required = 0
    for i, op in enumerate(ops):
        if op.ok:
            required |= 1 << i
    seen: set[tuple[int, Hashable]] = set()
    best: list[Any] = [-1, (), None, ()]  # count placed, order, state, stuck
    nodes = [0]

    def candidates(mask: int) -> list[int]:
        free = [i for i in range(n) if not mask >> i & 1]
        bound = min((ends[i] for i in free), default=INF)
        return [i for i in free if starts[i] <= bound]

    def search(mask: int, state: Hashable, order: tuple[int, ...]) -> bool | None:
        if mask & required == required:
            return True
        if (mask, state) in seen:
            return False
        seen.add((mask, state))
        nodes[0] += 1
        if nodes[0] > budget:
            return None
        tried = candidates(mask)
        if bin(mask & required).count("1") > best[0]:
            best[:] = [bin(mask & required).count("1"), order, state, tuple(tried)]
        for i in tried:
            for after in step(state, ops[i]):
                found = search(mask | 1 << i, after, order + (i,))
                if found is None or found:
                    return found
        return False

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 200))
    try:
        found = search(0, init, ())
    finally:
        sys.setrecursionlimit(limit)
    if found:
        return Verdict(True)
    if found is None:
        return Verdict(True, undecided=True)
    return Verdict(False, placed=tuple(ops[i] for i in best[1]), state=best[2], stuck=tuple(ops[i] for i in best[3]))

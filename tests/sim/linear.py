"""Is there one order of the ops on one object that a sequential model accepts?

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

# The search lives in the package now (lnk-store-check checks its racers with it); same objects here.
from cloudstore.conformance.linear import Step, Verdict, linearizable  # noqa: F401

from .history import INF, Op  # noqa: F401

"""The linearizability checker of the simulation: ``cloudstore/conformance/linear.py``, described there.

This module keeps the names the simulation imports.
"""

from __future__ import annotations

# The search lives in the package now (lnk-store-check checks its racers with it); same objects here.
from cloudstore.conformance.linear import Step, Verdict, linearizable  # noqa: F401

from .history import INF, Op  # noqa: F401

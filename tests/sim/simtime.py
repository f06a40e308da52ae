"""The time of a simulated history: the real clock, moved on by every long pause and store stall so far.

A history lasts seconds of real time, so nothing the drivers judge by time
(a lease's lapse, the purge of a removed epoch, an orphan due entry, a
tombstone, an op's time window, how long a memory is trusted) would ever
come due in one.  A *jump* (``scheduler``'s long pause of a machine, or a
stall of the store) moves the whole world's time on at once, while every
machine is stopped: the store's ``Date`` replies and the times objects were
written at (``modified`` in listings), and each machine's wall clock and
monotonic clock, which ``seeded`` points the drivers' modules at
(``patch_clocks``).  So a process that was stopped for half an hour finds
its op's window spent and its memories stale, as a real one would, and
agrees with the store on what time it is.

The shared real backend knows nothing of jumps: every write a machine makes
(or a held write that lands late) is stamped with the offset in force when
it is applied (``stamp``), and a listing's ``modified`` is moved by it
(``modified``), so an object written before a jump looks as old as the jump
made it, and one written after does not, whatever the backend's timestamp
resolution (moto's whole seconds).
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable
from typing import Any

_REAL_TIME = time.time
_REAL_MONOTONIC = time.monotonic


class SimTime:
    """The offset every clock of a history runs ahead of the real one by."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.jumps: list[float] = []  # seconds of each jump, in order
        self._written: dict[str, float] = {}  # key -> offset when its last write was applied

    def time(self) -> float:
        return _REAL_TIME() + self.offset

    def monotonic(self) -> float:
        return _REAL_MONOTONIC() + self.offset

    def jump(self, seconds: float) -> None:
        """Everybody's time moves on by ``seconds`` (only ever while every machine is stopped)."""
        self.offset += seconds
        self.jumps.append(seconds)

    def stamp(self, key: str) -> None:
        """A write of ``key`` is being applied now."""
        self._written[key] = self.offset

    def modified(self, key: str, modified: float) -> float:
        """A listing's ``modified`` of ``key``, in the history's time."""
        return modified + self._written.get(key, 0.0)

    def clocks(self) -> types.SimpleNamespace:
        """A stand-in for the ``time`` module whose ``time`` and ``monotonic`` are this history's."""
        names = {name: getattr(time, name) for name in dir(time) if not name.startswith("__")}
        return types.SimpleNamespace(**{**names, "time": self.time, "monotonic": self.monotonic})


def patch_clocks(sim: SimTime, patch: Callable[[Any, str, Any], None]) -> None:
    """Point every cloudstore module's clocks at ``sim``: a module's ``time``, and each name bound to
    ``time.time`` or ``time.monotonic`` themselves (``generations._now``, ``heads.monotonic``)."""
    clocks = sim.clocks()
    own = {id(_REAL_TIME): sim.time, id(_REAL_MONOTONIC): sim.monotonic}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("cloudstore") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is time:
                patch(module, attr, clocks)
            elif id(value) in own and callable(value):
                patch(module, attr, own[id(value)])

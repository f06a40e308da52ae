"""How much a bridge takes on at once, and the counters that hold it to that.

Calls over a limit are answered ``busy`` at once rather than queued: a caller
that is told to come back later can decide what to do, one left waiting in a
queue behind a stuck driver cannot.

Two kinds of limit live here. The contract's (store-interface.txt, "Its
limits"): 16 proved calls, 8 of one agent, 4 drivers, 5 s for a request.
And the bridge's own, which keep callers who have proved nothing from
costing more than a bounded amount (``max_pending``, ``max_proof_bytes``) and
keep proved callers' request lines within a memory budget
(``request_budget_bytes``), so that the bridge's memory has a bound whatever
it is sent (see ``StoreBridge``'s docstring for the figure).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass

from ..errors import CloudstoreError

KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """The contract's limits (store-interface.txt, "Its limits") and the bridge's own, settable for tests."""

    max_calls: int = 16  # proved calls at once, every agent together; also the most worker threads
    max_calls_per_agent: int = 8
    max_drivers: int = 4  # driver processes at once, kept or run once
    request_timeout: float = 5.0  # from connecting to the proof, and from the proof to the request line
    call_timeout: float = 30.0  # one driver call; also the longest wait for a free driver
    # Each op's whole time in the driver (LNK_OP_SECONDS, which the bridge sets): None is two thirds of
    # call_timeout (20 s of 30), leaving the rest for a driver's start and its reply, so an op stops
    # and says what it did before the bridge would stop it.  Settable for tests (above call_timeout,
    # the bridge stops calls first).
    op_seconds: float | None = None
    # Connections not yet proved, held at once (also cut to fit the fd limit at start). One more
    # evicts the oldest of them: a flood can never lock out a prompt caller, it only churns itself.
    max_pending: int = 1024
    # The least bound of a proof line. A proof line is a few hundred bytes; the bound is raised,
    # per bridge, to fit the longest agent it serves with every character escaped (proof.proof_line_bound).
    max_proof_bytes: int = 4 * KiB
    max_request_bytes: int = 16 * MiB  # a 4 MiB file as base64 in JSON fits with room
    # The longest reply line the bridge passes on: read from the driver in bounded parts, never
    # more; a longer one is refused whole (the driver stopped, its surplus with it). Room for an
    # event as large as a request allows, read back alone (``read`` with ``first``).
    max_reply_bytes: int = 17 * MiB
    # Bytes that proved calls' request lines may cost at once: buffered while read, the cost of
    # parsing them (cost.parse_cost), and the copies passed to a driver. Over it: busy; a single
    # request that alone would cost more is refused.
    request_budget_bytes: int = 160 * MiB
    # Descriptors something else in the process may hold at once (the metrics exporter's listener
    # and connections, ``metrics.Exporter.descriptors``): kept free, beside the bridge's own reserve,
    # when the fd limit cuts ``max_pending``.
    reserved_fds: int = 0
    # Driver processes shared by agents (``--shared-drivers``): the operator's word that the driver
    # keeps nothing in LNK_STORE_DIR (this project's lnk-gcs and lnk-bucket-store keep nothing on the
    # machine), so drivers run without it and one process serves any agent's calls; places are still
    # shared fairly by agent. Off: each process is started with, and serves, one agent's folder.
    shared_drivers: bool = False

    @property
    def op_budget(self) -> float:
        """The seconds the driver gives each op (``LNK_OP_SECONDS``): inside ``call_timeout``."""
        return self.op_seconds if self.op_seconds is not None else self.call_timeout * 2 / 3


class Busy(CloudstoreError):
    """A limit is reached; the message says which."""


class CallSlots:
    """Proved calls under way, counted in total and per agent."""

    def __init__(self, total: int, per_agent: int) -> None:
        self.total = total
        self.per_agent = per_agent
        self._lock = threading.Lock()
        self._count = 0
        self._by_agent: dict[Hashable, int] = {}

    def take(self, agent: Hashable) -> None:
        """Hold one slot for ``agent``, or raise Busy without holding any."""
        with self._lock:
            mine = self._by_agent.get(agent, 0)
            if mine >= self.per_agent:
                raise Busy(f"this agent already has {mine} calls under way, the most it may")
            if self._count >= self.total:
                raise Busy(f"the bridge already has {self._count} calls under way, the most it takes")
            self._count += 1
            self._by_agent[agent] = mine + 1

    def give_back(self, agent: Hashable) -> None:
        with self._lock:
            self._count -= 1
            left = self._by_agent[agent] - 1
            if left:
                self._by_agent[agent] = left
            else:
                del self._by_agent[agent]

    def under_way(self, agent: Hashable | None = None) -> int:
        """Calls holding a slot: all of them, or one agent's."""
        with self._lock:
            return self._count if agent is None else self._by_agent.get(agent, 0)


class ByteBudget:
    """A bounded number of bytes, held by calls in ``Hold``s that grow and shrink.

    Growing past what is left fails at once (the caller answers ``busy``)
    instead of waiting: memory is the one thing a bridge cannot get back by
    waiting for a stuck caller.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._used = 0

    @property
    def used(self) -> int:
        with self._lock:
            return self._used

    def hold(self) -> Hold:
        """A hold of zero bytes, to be grown with ``Hold.resize`` and ended with ``Hold.release``."""
        return Hold(self)

    def _change(self, delta: int) -> bool:
        with self._lock:
            if delta > 0 and self._used + delta > self.total:
                return False
            self._used += delta
            return True


class Hold:
    """One call's share of a ``ByteBudget``."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.size = 0

    def resize(self, size: int) -> bool:
        """Hold exactly ``size`` bytes; False (holding what it held) when growing does not fit."""
        if not self.budget._change(size - self.size):
            return False
        self.size = size
        return True

    def release(self) -> None:
        self.resize(0)

"""The runner's loop: poll what is due, claim it, fire it, finish it; sleep until the next poll.

One pass of the loop (see ``scheduler`` for what it promises):

1. Recovery, a step at a time: the ``firing`` of one agent is listed (all of
   them at start-up); a job there that this runner isn't firing, whose lease
   ``take`` gives us (nobody renewed it for a lapse: its runner died), is
   fired again.  Steps are at least three polls apart, so each agent is
   looked at every ``max(lapse/3, agents x 3 x poll_interval)``: with many agents
   recovery slows rather than the idle cost growing.  Of the runners sharing
   an agent, one scans it (the holder of its ``scheduler:recovery`` lease).
2. A poll (``scheduling.watch``): ONE ``job_due`` request through the runner's
   own driver names every agent's waiting jobs soonest first, and the runner
   keeps those of its own agents (agents reached through a bridge: one
   listing of their waiting each).
3. Every job of ours due now is claimed, soonest first, while a worker is
   free (``scheduling.claiming``: lease, shift, read back, fire, finish).  A
   claim refused as ``held`` (another runner's lease) is tried again after
   ``backoff``; one refused as gone is not tried again for that index entry.
4. Nothing claimed: sleep until the soonest due we know, the next poll, or a
   nudge (``wake``: a driver on this machine put a job in waiting), whichever
   comes first.  Idle, a runner thus sends one request a ``poll_interval``
   plus one recovery listing at most as often, whatever the number of agents.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..wake import WakeListener
from .claim_leases import Claims
from .claiming import Claimer, due_of
from .fire import FireCommand
from .log import log
from .store_client import Agent, AgentStore, StoreCallError
from .watch import Due, Poll, Source

WORKERS = 4  # jobs a runner fires at once by default: one long fire doesn't hold up the others
SPREAD_WINDOW = 1.0  # due jobs within one such window of seconds are claimed in a runner's own order
STALE_POLL = 0.25  # seconds after which what a poll showed is polled afresh before claiming on
GONE_FOR = 180.0  # an index entry refused as gone is left alone this long (the index drops it within GRACE)
STEP_POLLS = 3  # recovery steps are at least this many poll intervals apart
RECOVERY_THREAD = "scheduler:recovery"  # the lease naming the one runner that scans an agent's firing


@dataclass(frozen=True)
class Timing:
    """How often the runner looks, and how long a claim lives."""

    lapse: float = 30.0
    poll_interval: float = 2.0
    max_sleep: float = 30.0

    @property
    def backoff(self) -> float:
        """How soon to look again at a due job another runner's lease holds."""
        return min(self.max_sleep, 1.0)

    @property
    def scan_interval(self) -> float:
        """Recovery cadence per agent at the least: an orphan can't be taken before its lease lapses."""
        return self.lapse / 3

    @property
    def look_interval(self) -> float:
        """The longest sleep between polls."""
        return min(self.poll_interval, self.max_sleep)


class Runner:
    """Fires the due jobs of ``stores`` (one per agent bound to this machine), found through ``sources``."""

    def __init__(
        self,
        stores: Sequence[AgentStore],
        sources: Sequence[Source],
        fire: FireCommand,
        holder: str,
        timing: Timing = Timing(),
        workers: int = WORKERS,
        keep_ending: bool = False,
        renew_via: Callable[[AgentStore], AgentStore] | None = None,
        listener: WakeListener | None = None,
    ) -> None:
        self.stores = list(stores)
        self.sources = list(sources)
        self.holder = holder
        self.timing = timing
        self.claims = Claims(holder, timing.lapse, renew_via)
        self.claimer = Claimer(self.claims, fire, workers, keep_ending)
        self.listener = listener or WakeListener()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the two maps below: workers tell refusals
        # A due job whose claim was refused as held isn't tried again before this.
        self._retry_at: dict[tuple[Agent, str], float] = {}
        # Index entries refused as gone (the job left waiting a moment ago, or a crash's leftover).
        self._gone: dict[str, float] = {}
        self._scanning: set[Agent] = set()  # the agents whose recovery lease this runner holds
        self._scan_next = 0  # the agent whose firing the next recovery step lists
        self._scan_at = 0.0  # monotonic time of the next recovery step

    # -- the loop ------------------------------------------------------------

    def stop(self) -> None:
        """Claim nothing more; ``run`` returns once the fires under way are finished."""
        self._stop.set()
        self.listener.interrupt()

    def run(self) -> None:
        started = False
        try:
            while not self._stop.is_set():
                try:
                    if not started:
                        self.recover(self.stores)  # all at once first: orphans of a runner that died before us
                        self._scan_at = time.monotonic() + self._scan_gap()
                        started = True
                        log("started", runner=self.holder, agents=[s.agent.wire() for s in self.stores],
                            nudges=self.listener.listening)
                    elif time.monotonic() >= self._scan_at:
                        self._recovery_step()
                    wake_at = self._look()
                    if wake_at is not None:
                        self._sleep(wake_at)
                except (StoreCallError, KeyError, TypeError, ValueError) as exc:  # the last three: a malformed reply
                    log("store_error", runner=self.holder, error=str(exc) or repr(exc))
                    self._stop.wait(self.timing.backoff)
        finally:
            self.claimer.shutdown()
            self.claims.close()
            self.listener.close()

    def _look(self) -> float | None:
        """Poll, claim what's due; the wall-clock time to sleep until, or None to look again at once."""
        now = time.time()
        polls = [source.poll(now) for source in self.sources]
        handed, later = self.claim_due(polls, time.time())
        if handed is None:
            return None  # stopped short of what the poll showed: poll afresh now
        wake_at = now + self.timing.look_interval
        for when in [later] + [p.horizon for p in polls]:
            if when is not None and when > now:
                wake_at = min(wake_at, when)
        return wake_at

    def _sleep(self, wake_at: float) -> None:
        """Until ``wake_at`` (wall clock), the next recovery step, a nudge or ``stop``."""
        until = min(time.monotonic() + max(0.0, wake_at - time.time()), self._scan_at)
        left = until - time.monotonic()
        if left > 0 and not self._stop.is_set():
            self.listener.wait(left)

    # -- claiming ------------------------------------------------------------

    def claim_due(self, polls: Sequence[Poll], now: float) -> tuple[int | None, float | None]:
        """Hand each polled job due by ``now`` to a worker (older seconds first, then in this runner's own
        order): (how many were handed, or None when the poll went stale before all were; when the next
        is ready).  Having handed them all, the runner sleeps until the next due without polling
        again: the workers' claims are the judges of what they were handed."""
        with self._lock:
            self._retry_at = {k: t for k, t in self._retry_at.items() if t > now}
            mono = time.monotonic()
            self._gone = {k: t for k, t in self._gone.items() if t > mono}
            retry_at, gone = dict(self._retry_at), set(self._gone)
        seen: set[tuple[Agent, str]] = set()
        due: list[tuple[float, Due]] = []
        later: float | None = None
        for found in sorted((d for p in polls for d in p.found), key=lambda d: d.due):
            if (found.agent, found.job) in seen or (found.key is not None and found.key in gone):
                continue
            seen.add((found.agent, found.job))
            ready = max(found.due, retry_at.get((found.agent, found.job), 0.0))
            if ready <= now:
                due.append((ready, found))
            elif later is None or ready < later:
                later = ready
        claimed = 0
        polled = time.monotonic()
        for _, found in sorted(due, key=lambda entry: self._order(entry[0], entry[1])):
            if claimed and time.monotonic() - polled > STALE_POLL:
                return None, later  # others have claimed meanwhile: a fresh poll costs less than claims of the gone
            if self.claimer.busy(found.agent, found.job):
                continue
            if not self.claimer.acquire_slot(self._stop.is_set):
                return None, later
            if self.claimer.dispatch(found.store, found.job, self._on_refused(found)):
                claimed += 1
            else:
                self.claimer.release_slot()
        return claimed, later

    def _on_refused(self, found: Due) -> Callable[[str], None]:
        """What a worker tells when it could not claim ``found``: when (or whether) to try it again."""
        def refused(outcome: str) -> None:
            with self._lock:
                if outcome == "gone" and found.key is not None:
                    self._gone[found.key] = time.monotonic() + GONE_FOR  # a stale entry: the index drops it soon
                else:  # held by another runner's lease, or the store failed: try again soon
                    self._retry_at[(found.agent, found.job)] = time.time() + self.timing.backoff

        return refused

    def _order(self, ready: float, found: Due) -> tuple[float, int]:
        """Older seconds first; within one second, an order of this runner's own.

        Runners that all wake for the same due jobs would otherwise all go
        for the soonest, one wins and the others pay a refused ``take`` each,
        job after job: spread, each starts on a different one.
        """
        spread = zlib.crc32(f"{self.holder}\0{found.agent.label()}\0{found.job}".encode())
        return (math.floor(ready / SPREAD_WINDOW), spread)

    # -- recovery ------------------------------------------------------------

    def _scan_gap(self) -> float:
        """Between recovery steps: each agent every lapse/3, but steps at least three polls apart.

        A step costs the scanner two requests (its lease renewed, the listing;
        three the first time: the lease taken), a poll one: so idle, a runner
        sends at most about one request a ``poll_interval`` (half a request a
        second at the default), whatever the number of agents; with many
        agents each is looked at less often instead.
        """
        return max(self.timing.scan_interval / max(1, len(self.stores)), STEP_POLLS * self.timing.look_interval)

    def _recovery_step(self) -> None:
        store = self.stores[self._scan_next % len(self.stores)]
        self._scan_next += 1
        self._scan_at = time.monotonic() + self._scan_gap()
        if self._scans(store):
            self.recover([store])

    def _scans(self, store: AgentStore) -> bool:
        """Whether this runner is the one that looks at ``store``'s firing: the holder of its
        ``RECOVERY_THREAD`` lease.

        Every runner listing every agent's firing would read each job record
        that changed once per runner; one scanner per agent reads it once.
        The scanner renews at each of its steps (one cached write); the others
        pay one read to see it held.  A scanner that dies stops renewing, and
        three of its cadences later the next runner's step takes over.
        """
        if store.agent in self._scanning:
            if store.renew(RECOVERY_THREAD, self.holder):
                return True
            self._scanning.discard(store.agent)
        lapse_ms = max(1, int(3 * self._scan_gap() * len(self.stores) * 1000))
        if store.take(RECOVERY_THREAD, self.holder, lapse_ms) in ("took", "lapsed"):
            self._scanning.add(store.agent)
            return True
        return False

    def recover(self, stores: Sequence[AgentStore]) -> None:
        """Fire again each job left in firing by a runner that died (its lease lapsed)."""
        for store in stores:
            for job in sorted(store.list("firing"), key=due_of):
                if self._stop.is_set() or self.claimer.busy(store.agent, job["id"]):
                    continue
                if not self.claimer.acquire_slot(self._stop.is_set):
                    return
                if self.claimer.reclaim(store, job["id"]) != "claimed":
                    self.claimer.release_slot()

"""The runner's loop: poll what is due, claim it, fire it, finish it; sleep until the next poll.

One pass of the loop (see ``scheduler`` for what it promises):

1. Recovery (``scheduling.recovery``): ONE ``job_claims`` listing through the
   runner's own driver names every agent's jobs in firing (the store's
   shared claim index), at least every lapse/3; a job of ours there that
   this runner isn't firing is tried once a lapse has gone by since it
   entered firing, and then every poll while its lease is held: one whose
   lease ``take`` gives us (nobody renewed it for a lapse: its runner died)
   is fired again, at most a poll after the lapse, however many agents and
   whichever runner died.  Beside it, a slow sweep a step at a time: the
   ``firing`` of one agent is listed, for the jobs the index does not name
   (put in firing by a driver older than it; agents reached through a
   bridge, which answers no op naming other agents).  Sweep steps are at
   least ``SWEEP_POLLS`` polls apart; of the runners sharing an agent, one
   sweeps it (the holder of its ``scheduler:recovery`` lease).  Start-up
   costs the index's pages, not a listing per agent.
2. A poll (``scheduling.watch``): ONE ``job_due`` request through the runner's
   own driver names every agent's waiting jobs soonest first, and the runner
   keeps those of its own agents (agents reached through a bridge: one
   listing of their waiting each).  A poll is good for ``poll_interval``:
   jobs it showed due later are claimed when their due comes, without
   polling again (the claim is the judge of whether they are still waiting);
   a nudge, a poll gone stale or a due past what it could see polls afresh.
3. Every job of ours due now is claimed, soonest first, while a worker is
   free (``scheduling.claiming``: lease and shift, fire, finish).  A
   job whose owner (``scheduling.peers``: of the runners known to share its
   agent, a rendezvous hash picks one) is another runner waits a grace
   first, and is claimed only if still waiting then.  A claim refused as
   ``held`` (another runner's lease) is tried again after ``backoff``; one
   refused as gone is tried once more after ``backoff`` (a put writes its
   index entry before its record, so a poll between the two saw a job not
   there yet), and refused as gone twice, not again for that index entry
   (``GONE_FOR``: the index drops a stale entry within its grace).  A job that a
   nudge's poll shows for the first time was put on this machine: it is
   claimed at once unless its owner listens on this machine too (the nudge
   reached it as well), since its owner elsewhere polls later.  Runners on
   one machine say who they are and whose jobs they fire (``wake.Presence``:
   at start, every ``PRESENCE_EVERY`` and when they stop), so they know
   each other without first racing for leases.
4. Nothing claimed: sleep until the soonest due we know, the next poll, or a
   nudge (``wake``: a driver on this machine put a job in waiting), whichever
   comes first.  A nudge naming a job of ours due now (not owned by another
   runner on this machine, which got that nudge too) has it claimed at once,
   before any poll (the claim is the judge), so a job put due now on this
   machine waits for one claim's three round trips; any other nudge of our own
   user (or root) polls, and one only other users sent brings the next poll
   forward at most once a ``poll_interval`` (anyone may send them).
   Idle, a runner thus sends one request a ``poll_interval``, one claim
   listing a lapse/3 and a sweep step's two at most every ``SWEEP_POLLS``
   polls, whatever the number of agents;
   busy, still one poll a ``poll_interval``, however many jobs fall due.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..runtime.health import Health, permanent_error
from ..runtime.wake import PRESENCE_EVERY, WakeListener, encode_presences
from .claim_leases import Claims
from .claiming import Claimer, due_of
from .fire import FireCommand
from .log import log
from .peers import Peers
from .recovery import ClaimWatch
from .store_client import REQUEST_TIMEOUT, Agent, AgentStore, NotSent, StoreCallError
from .watch import Due, Poll, Source

WORKERS = 4  # jobs a runner fires at once by default: one long fire doesn't hold up the others
SPREAD_WINDOW = 1.0  # due jobs within one such window of seconds are claimed in a runner's own order
STALE_POLL = 0.25  # seconds after which what a poll showed is polled afresh before claiming on
#: A job this many seconds past its due when handed out is read before it is claimed (as one
#: deferred to its owner is): late, it has most likely been claimed and finished meanwhile
#: (a backlog, or a poll a while old), and a claim takes the lease first: two writes of one
#: object, the lease's take and release, for a job long gone.
LATE_LOOK = 1.0
#: A runner that said it is on this machine is believed here this long after (it says so every
#: PRESENCE_EVERY): a runner killed without a word stops being one a few presences later.
NEARBY_FOR = 2.5 * PRESENCE_EVERY
#: The most runners remembered as nearby: presences come over a local socket any local user may
#: reach (their senders are checked, but a runner of our user may be restarted without end), so
#: what they leave is bounded by count as well as by ``NEARBY_FOR``; the oldest heard goes first.
NEARBY_MAX = 1024
GONE_FOR = 180.0  # an index entry refused as gone is left alone this long (the index drops it within GRACE)
SWEEP_POLLS = 5  # sweep steps (one agent's firing listed) are at least this many poll intervals apart
RETRY_MAX = 16.0  # seconds: the longest wait before the runner asks a failing store again (an outage)
RECOVERY_THREAD = "scheduler:recovery"  # the lease naming the one runner that scans an agent's firing
#: Store requests one turn of the loop may wait on at their time limit (a poll, a recovery step's) before it beats.
LIVE_REQUESTS = 3


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
        """The longest sleep between polls, and how long a poll is trusted."""
        return min(self.poll_interval, self.max_sleep)

    @property
    def live_within(self) -> float:
        """The longest a live runner's loop goes without turning (its liveness, ``Runner.health``): its
        longest sleep (a poll's wait, or a failing store's backoff) and a few requests at their time limit."""
        return max(self.look_interval, RETRY_MAX) + LIVE_REQUESTS * REQUEST_TIMEOUT

    @property
    def fresh_for(self) -> float:
        """How long a usable reply keeps the runner ready: an idle runner asks its store every
        ``look_interval``; a few polls missed, or one at its time limit, are not an outage yet."""
        return 3 * self.look_interval + REQUEST_TIMEOUT

    @property
    def grace(self) -> float:
        """How long a due job another runner owns waits before this one claims it: its owner's
        poll (up to ``look_interval`` after ours) and claim come first."""
        return self.look_interval + self.backoff


# -- the start-up check: one request to each agent's store ------------------

@dataclass(frozen=True)
class StartupProblem:
    """Why an agent's store did not answer the start-up request; ``permanent`` when no retry helps."""

    agent: Agent
    problem: str
    fix: str
    permanent: bool

    def line(self) -> str:
        return f"agent {self.agent.id!r} (owner {self.agent.owner!r}): {self.problem}; {self.fix}"


def startup_problem(store: AgentStore, via: str | None = None) -> StartupProblem | None:
    """Ask ``store`` once (``job_mark``, one read); None when it answered, else what is wrong.

    ``via`` is the agent's bridge socket, when it has one.  A runner that
    only logged ``store_error`` once a second forever, for a setting that
    is missing or a key that is wrong, left the operator to find out why
    nothing fired: a permanent problem stops it at start-up instead (exit 2),
    naming the agent and what to fix.  Anything else (a timeout, an
    unreachable store, a bridge restarting) is only reported: the runner
    retries it with backoff.  An error reply is judged permanent by
    ``health.permanent_error`` (the driver's setting, the store's refusal),
    a bridge's own ``refused:`` (a wrong key, an agent it does not serve) by
    ``bridge.client.bridge_error_word``.
    """
    from ..bridge.client import bridge_error_word

    agent = store.agent
    where = f"its bridge {via}" if via else "the runner's driver"
    try:
        reply = store.client.request({"op": "job_mark", "agent": agent.wire()})
    except NotSent as exc:
        fix = ("is lnk-store-bridge running with that --harness, as a user this runner may reach? "
               "check the agent's \"bridge\" in the config")
        return StartupProblem(agent, str(exc), fix, exc.permanent)
    except StoreCallError as exc:
        permanent = "could not start" in str(exc)
        return StartupProblem(agent, str(exc), f"check {where}", permanent)
    if reply.get("reply") != "error":
        return None
    error = str(reply.get("error"))
    if via and bridge_error_word(reply) == "refused":
        fix = "check its key_file: the bridge holds another key for this agent, or does not serve it"
        return StartupProblem(agent, f"{where} answered: {error}", fix, True)
    what = permanent_error(error)
    if what is not None:
        fix = f"{what} of {where}" + ("" if via else " (driver_env, or the runner's environment)")
        return StartupProblem(agent, f"{where} answered: {error}", fix, True)
    return StartupProblem(agent, f"{where} answered: {error}", "retried with backoff", False)


def identity(found: Due) -> tuple[Agent, str, str | float]:
    """One put of one job: its index entry's key, or (listed through a bridge) its due."""
    return (found.agent, found.job, found.key if found.key is not None else found.due)


#: The least lapse docs/scheduler.md recommends: "never at once" rests on this runner's pauses staying
#: under lapse/3 (10 s here), or on the fired system checking ``LNK_JOB_FENCE``.  Below it, a warning.
LAPSE_RECOMMENDED = 30.0


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
        self.peers = Peers(holder)
        self.claims = Claims(holder, timing.lapse, renew_via, held_by=self.peers.saw)
        self.claimer = Claimer(self.claims, fire, workers, keep_ending)
        self.listener = listener or WakeListener()
        # The agents a named nudge may be claimed for at once: those of our own driver (job_claim).
        self._named_stores = {(s.agent.owner, s.agent.id): s for s in self.stores if s.own_driver}
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the three maps below: workers tell refusals
        # A due job whose claim was refused as held isn't tried again before this.
        self._retry_at: dict[tuple[Agent, str], float] = {}
        # Index entries refused as gone twice (the job left waiting a moment ago, or a crash's leftover).
        self._gone: dict[str, float] = {}
        # Index entries refused as gone once: maybe a put under way (``_on_told``), tried once more.
        self._gone_once: dict[str, float] = {}
        self.claim_watch = ClaimWatch(self.stores, timing.lapse, timing.look_interval)
        self._scanning: set[Agent] = set()  # the agents whose recovery lease this runner holds
        self._scan_next = 0  # the agent whose firing the next recovery step lists
        self._scan_at = 0.0  # monotonic time of the next recovery step
        # The last poll, trusted for look_interval: when (monotonic), what it showed, and which of
        # its entries were handed to a worker since (not handed again from it).  Like _first_seen and
        # _put_here, the main loop's alone: the lock guards only what workers tell.
        self._polls: list[Poll] = []
        self._polled_at = -math.inf
        self._handed: set[tuple[Agent, str, str | float]] = set()
        self._first_seen: dict[tuple[Agent, str, str | float], float] = {}  # wall clock, per entry
        # Entries that appeared in a poll a nudge asked for: put on this machine a moment ago. They
        # are claimed at once unless their owner listens here too: elsewhere, it polls later.
        self._put_here: set[tuple[Agent, str, str | float]] = set()
        # The runners that said they are on this machine (``wake.Presence``): when last heard (monotonic).
        self._nearby: dict[str, float] = {}
        self._present_at = -math.inf  # when this runner next says it is here (monotonic)
        self._agents = {(s.agent.owner, s.agent.id): s.agent for s in self.stores}
        #: Beaten at each turn of the loop and while it waits for a worker: the runner's liveness.
        self.health: Health | None = None

    # -- the loop ------------------------------------------------------------

    def stop(self) -> None:
        """Claim nothing more; ``run`` returns once the fires under way are finished."""
        self._stop.set()
        if self.health is not None:
            self.health.stopping()
        self.listener.interrupt()

    def _stopping(self) -> bool:
        """Whether stopping; asked every 0.2 s while the loop waits for a free worker, so a loop waiting
        on long fires still beats (it is alive: it claims as soon as one ends)."""
        if self.health is not None:
            self.health.beat()
        return self._stop.is_set()

    def run(self) -> None:
        started = False
        nudged = True  # the first look polls
        failures = 0  # store errors in a row: the retry waits double, up to RETRY_MAX (an outage, not a typo)
        try:
            while not self._stopping():
                try:
                    if not started:
                        self._recover_claims()  # the claim index at once: orphans of a runner that died before us
                        self._scan_at = time.monotonic() + self._scan_gap()
                        started = True
                        refused = getattr(self.listener, "refused", None)
                        if refused:  # once: the runner polls on without nudges
                            log("wake_refused", runner=self.holder, reason=refused)
                        log("started", runner=self.holder, agents=[s.agent.wire() for s in self.stores],
                            nudges=self.listener.listening)
                        if self.timing.lapse < LAPSE_RECOMMENDED:
                            log("lapse_below_recommended", runner=self.holder, lapse=self.timing.lapse,
                                recommended=LAPSE_RECOMMENDED, tolerated_pause=round(self.timing.lapse / 3, 3),
                                why="a pause of this runner (a VM stall, swap, SIGSTOP) past lapse/3 lets another "
                                    "runner fire its job while its own command still runs; only LNK_JOB_FENCE "
                                    "tells the two apart (docs/scheduler.md, 'What is promised')")
                        self._say_here(ask=True)
                    else:
                        if time.monotonic() >= self.claim_watch.next_at():
                            self._recover_claims()
                        if time.monotonic() >= self._scan_at:
                            self._recovery_step()
                        if time.monotonic() >= self._present_at:
                            self._say_here()
                    wake_at = self._look(nudged)
                    nudged = False
                    failures = 0
                    if wake_at is not None and self._sleep(wake_at):
                        nudged = self._claim_named()
                except (StoreCallError, KeyError, TypeError, ValueError) as exc:  # the last three: a malformed reply
                    failures += 1
                    retry_in = min(self.timing.backoff * 2 ** min(failures - 1, 8), max(self.timing.backoff, RETRY_MAX))
                    log("store_error", runner=self.holder, error=str(exc) or repr(exc), retry_in=retry_in)
                    self._stop.wait(retry_in)
        finally:
            self.claimer.shutdown()
            self._leave_recovery()
            self.claims.close()
            if started:
                self._say_here(gone=True)
            self.listener.close()

    def _look(self, fresh: bool) -> float | None:
        """Poll (when ``fresh`` or the last poll can't be trusted), claim what's due; the wall-clock
        time to sleep until, or None to look again at once (polling afresh)."""
        now = time.time()
        if fresh or not self._trusted(now):
            self._poll(now, nudged=fresh)
        handed, later = self.claim_due(self._polls, time.time())
        if handed is None:
            self._polled_at = -math.inf
            return None  # stopped short of what the poll showed: poll afresh now
        wake_at = time.time() + max(0.0, self.timing.look_interval - (time.monotonic() - self._polled_at))
        for when in [later] + [p.horizon for p in self._polls]:
            if when is not None and when > now:
                wake_at = min(wake_at, when)
        return wake_at

    def _trusted(self, now: float) -> bool:
        """Whether the last poll still names what's due: young enough, and ``now`` within its sight."""
        young = time.monotonic() - self._polled_at < self.timing.look_interval
        return young and all(now < p.horizon for p in self._polls)

    def _poll(self, now: float, nudged: bool = False) -> None:
        self._polls = [source.poll(now) for source in self.sources]
        self._polled_at = time.monotonic()
        self._handed.clear()  # a fresh poll is judged afresh (retry_at, gone and busy still hold)
        shown = {identity(found) for p in self._polls for found in p.found}
        new = shown - set(self._first_seen)
        self._first_seen = {k: t for k, t in self._first_seen.items() if k in shown}
        for key in shown:
            self._first_seen.setdefault(key, now)
        self._put_here = (self._put_here & shown) | (new if nudged else set())

    def _sleep(self, wake_at: float) -> bool:
        """Until ``wake_at`` (wall clock), the next recovery step, a nudge or ``stop``: whether nudged."""
        until = min(time.monotonic() + max(0.0, wake_at - time.time()), self._scan_at,
                    self.claim_watch.next_at())
        left = until - time.monotonic()
        if left > 0 and not self._stop.is_set():
            # Another user's nudge may bring the next poll forward once a poll interval, no more:
            # anyone on the machine can send them, and each poll is a listing billed to us.
            return self.listener.wait(left, untrusted_every=self.timing.look_interval)
        return False

    # -- claiming ------------------------------------------------------------

    def _claim_named(self) -> bool:
        """Hand to workers at once the jobs due now that nudges named (put on this machine a moment
        ago, so ours whoever owns them: see ``_put_here``); whether a poll is still needed (a nudge
        named nothing, or a job not ours or not yet due)."""
        self._hear_nearby()
        named, poll = self.listener.take_names()
        now = time.time()
        for name in named:
            store = self._named_stores.get((name.owner, name.agent))
            if store is None or name.due > now:
                poll = True
                continue
            if self.claimer.busy(store.agent, name.job):
                continue
            if self._owned_nearby(store.agent, name.job):
                continue  # nudged as we were, its owner claims it now; our polls see it a grace later if not
            if not self.claimer.acquire_slot(self._stopping):
                return poll
            found = Due(store, name.job, name.due)
            if not self.claimer.dispatch(store, name.job, self._on_told(found, self.holder)):
                self.claimer.release_slot()
        return poll

    # -- the runners on this machine ---------------------------------------------

    def _say_here(self, ask: bool = False, gone: bool = False) -> None:
        """Tell the other runners here who we are and whose jobs we fire (``ask``: and to answer)."""
        self._present_at = time.monotonic() + PRESENCE_EVERY
        announce = getattr(self.listener, "announce", None)  # a test's listener may say nothing
        if announce is not None:
            announce(encode_presences(self.holder, [a.wire() for a in self._agents.values()], ask, gone))

    def _hear_nearby(self) -> None:
        """Take the presences heard: each runner is on this machine, and a peer for the agents it
        named that are ours too; one that asked is answered, one that left is forgotten."""
        take = getattr(self.listener, "take_presences", None)
        answer = False
        for presence in take() if take is not None else []:
            if presence.holder == self.holder:
                continue
            if presence.gone:
                self._nearby.pop(presence.holder, None)
            else:
                if presence.holder not in self._nearby:  # once a runner here (not each presence)
                    log("heard_nearby", runner=self.holder, other=presence.holder)
                self._nearby[presence.holder] = time.monotonic()
            for owner, agent_id in presence.agents:
                agent = self._agents.get((owner, agent_id))
                if agent is None:
                    continue
                if presence.gone:
                    self.peers.drop(agent, presence.holder)
                else:
                    self.peers.saw(agent, presence.holder)
            answer = answer or presence.ask
        self._forget_far()
        if answer:
            self._say_here()

    def _forget_far(self) -> None:
        """Drop runners not heard of for ``NEARBY_FOR`` (killed without a word: no longer counted on
        anyway), and the oldest heard past ``NEARBY_MAX``: nothing here grows with uptime."""
        now = time.monotonic()
        for holder in [h for h, heard in self._nearby.items() if now - heard >= NEARBY_FOR]:
            del self._nearby[holder]
        if len(self._nearby) > NEARBY_MAX:
            for holder, _ in sorted(self._nearby.items(), key=lambda item: item[1])[:len(self._nearby) - NEARBY_MAX]:
                del self._nearby[holder]

    def _owned_nearby(self, agent: Agent, job: str, owner: str | None = None) -> bool:
        """Whether ``job``'s owner is another runner on this machine (it said so within
        ``NEARBY_FOR``): a nudge of our user reached it as it reached us, so it claims the job at
        once and the rest of us need not race it for the lease (on GCS, writes of one object past
        one a second are refused)."""
        owner = self.peers.owner(agent, job) if owner is None else owner
        if owner == self.holder:
            return False
        heard = self._nearby.get(owner)
        return heard is not None and time.monotonic() - heard < NEARBY_FOR

    def claim_due(self, polls: Sequence[Poll], now: float) -> tuple[int | None, float | None]:
        """Hand each polled job ready by ``now`` to a worker (older seconds first, then in this runner's
        own order): (how many were handed, or None when the poll went stale before all were; when the
        next is ready).  A job is ready at its due, or a grace later when another runner owns it
        (``peers``).  Having handed them all, the runner sleeps until the next is ready without
        polling again: the workers' claims are the judges of what they were handed."""
        with self._lock:
            self._retry_at = {k: t for k, t in self._retry_at.items() if t > now}
            mono = time.monotonic()
            self._gone = {k: t for k, t in self._gone.items() if t > mono}
            self._gone_once = {k: t for k, t in self._gone_once.items() if t > mono}
            retry_at, gone = dict(self._retry_at), set(self._gone)
        seen: set[tuple[Agent, str]] = set()
        due: list[tuple[float, Due, str]] = []
        later: float | None = None
        for found in sorted((d for p in polls for d in p.found), key=lambda d: d.due):
            if (found.agent, found.job) in seen or (found.key is not None and found.key in gone):
                continue
            seen.add((found.agent, found.job))
            entry = identity(found)
            if entry in self._handed:
                continue
            ready = max(found.due, retry_at.get((found.agent, found.job), 0.0))
            owner = self.peers.owner(found.agent, found.job)
            if entry in self._put_here and not self._owned_nearby(found.agent, found.job, owner):
                owner = self.holder  # put on this machine a moment ago, its owner elsewhere: ours at once
            if owner != self.holder:  # its owner claims it first; ours if still waiting after a grace
                shown = max(found.due, self._first_seen.get(entry, now))
                ready = max(ready, shown + self.timing.grace)
            if ready <= now:
                due.append((ready, found, owner))
            elif later is None or ready < later:
                later = ready
        claimed = 0
        polled = time.monotonic()
        for _, found, owner in sorted(due, key=lambda entry: self._order(entry[0], entry[1])):
            if claimed and time.monotonic() - polled > STALE_POLL:
                return None, later  # others have claimed meanwhile: a fresh poll costs less than claims of the gone
            if self.claimer.busy(found.agent, found.job):
                continue
            if not self.claimer.acquire_slot(self._stopping):
                return None, later
            # Waited a grace for its owner, or late: most likely claimed and gone by now.
            look = owner != self.holder or now - found.due > LATE_LOOK
            if self.claimer.dispatch(found.store, found.job, self._on_told(found, owner), look_first=look):
                self._handed.add(identity(found))
                claimed += 1
            else:
                self.claimer.release_slot()
        return claimed, later

    def _on_told(self, found: Due, owner: str) -> Callable[[str], None]:
        """What a worker tells of its claim of ``found``: whether its owner failed it, when (or
        whether) to try it again."""
        def told(outcome: str) -> None:
            if outcome == "claimed":
                if owner != self.holder:  # still waiting a grace after its due: its owner didn't claim it
                    self.peers.drop(found.agent, owner)
                return
            with self._lock:
                if outcome == "gone" and found.key is not None:
                    mono = time.monotonic()
                    if self._gone_once.get(found.key, 0.0) > mono:
                        self._gone[found.key] = mono + GONE_FOR  # gone twice: a stale entry, dropped soon
                        return
                    # A put writes the index entry before the record: a poll between the two sees an entry
                    # whose record is not there yet.  Left alone for GONE_FOR, that job fired three minutes
                    # late; it is tried once more after a backoff, and only a second "gone" is a stale entry.
                    self._gone_once[found.key] = mono + GONE_FOR
                # held by another runner's lease, the store failed, or gone once: try again soon
                self._retry_at[(found.agent, found.job)] = time.time() + self.timing.backoff

        return told

    def _order(self, ready: float, found: Due) -> tuple[float, int]:
        """Older seconds first; within one second, an order of this runner's own.

        Runners that all wake for the same due jobs would otherwise all go
        for the soonest, one wins and the others pay a refused ``take`` each,
        job after job: spread, each starts on a different one.
        """
        spread = zlib.crc32(f"{self.holder}\0{found.agent.label()}\0{found.job}".encode())
        return (math.floor(ready / SPREAD_WINDOW), spread)

    # -- recovery ------------------------------------------------------------

    def _recover_claims(self) -> None:
        """A step of the claim index's watch: its listing when due, then the leases of the jobs that
        may have been orphaned (``scheduling.recovery``), each fired again once its ``take`` is ours."""
        for candidate in self.claim_watch.step(self.claimer.busy):
            if self._stop.is_set() or not self.claimer.acquire_slot(self._stopping):
                return
            try:
                outcome = self.claimer.reclaim(candidate.store, candidate.job)
            except StoreCallError as exc:
                self.claimer.release_slot()
                self.claim_watch.tried(candidate, "error")
                log("store_error", runner=self.holder, error=str(exc))
                continue
            if outcome != "claimed":
                self.claimer.release_slot()
            self.claim_watch.tried(candidate, outcome)

    def _scan_gap(self) -> float:
        """Between sweep steps: each agent every lapse/3, but steps at least ``SWEEP_POLLS`` polls apart.

        A step costs the sweeper two requests (its lease renewed, the listing;
        three the first time: the lease taken), a poll one and the claim
        index one a lapse/3: so idle, a runner sends well under two requests
        a ``poll_interval``, whatever the number of agents; with many agents
        each is swept less often instead (the claim index covers every job
        but an old driver's and a bridged agent's).
        """
        return max(self.timing.scan_interval / max(1, len(self.stores)), SWEEP_POLLS * self.timing.look_interval)

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

    def _leave_recovery(self) -> None:
        """End the recovery leases this runner holds, so a runner stopped on purpose is replaced as
        scanner at the next step of another, not a lapse later; a failure only leaves them to lapse."""
        for store in self.stores:
            if store.agent in self._scanning:
                try:
                    store.end(RECOVERY_THREAD, self.holder)
                except StoreCallError as exc:
                    log("lease_end_failed", runner=self.holder, agent=store.agent.label(), error=str(exc))
        self._scanning.clear()

    def recover(self, stores: Sequence[AgentStore]) -> None:
        """Fire again each job left in firing by a runner that died (its lease lapsed)."""
        for store in stores:
            for job in sorted(store.list("firing"), key=due_of):
                if self._stop.is_set() or self.claimer.busy(store.agent, job["id"]):
                    continue
                if not self.claimer.acquire_slot(self._stopping):
                    return
                if self.claimer.reclaim(store, job["id"], look_first=True) != "claimed":
                    self.claimer.release_slot()

"""lnk-cloud-scheduler: fire the due jobs of the agents bound to this machine.

Run one on each machine the agents are bound to (more are fine), all pointed
at the same store.  Each runner polls the store's due index (``job_due``,
one request naming every agent's waiting jobs by due), sleeps until its
agents' soonest due, the next poll or a nudge from a driver on this machine
(``wake``), and fires each due job by running the operator's command with
the job's spec on stdin, up to ``workers`` (4) at once.  How it loops is in
``scheduling.runner``, where it learns what is due in ``scheduling.watch``, claiming
and finishing in ``scheduling.claiming``, the claim leases in
``scheduling.claim_leases``, running the command in ``scheduling.fire``, the store
seam in ``scheduling.store_client``, the config in ``scheduling.config``;
docs/scheduler.md says the same for operators.

Claiming a job
    take the lease on the thread ``job:<id>`` of the job's agent (holder:
    this runner's unique id, lapse ``lapse``), THEN shift the job waiting ->
    firing.  Of several runners on any machines exactly one gets the lease
    and the shift; the others see ``held`` or ``found: false`` and move on.
    The job is read back from firing and that is what is fired.  After the
    command: remove it from firing (``keep_ending`` shifts it to ending
    instead, a record for the operator), end the lease.

What is promised
    * A due job is fired ONCE when no runner dies and the store stays
      reachable: the lease and the shift let one runner claim it, and it
      leaves firing only after its command ran, under its claim in the
      store (``job_finish``), never dropped on a local judgement.
    * AT LEAST ONCE when a runner dies mid-fire: its lease is no longer
      renewed, so once ``lapse`` has passed, another runner's recovery (one
      runner per agent lists its firing every
      ``max(lapse/3, agents x 3 x poll_interval)`` and tries ``take`` on each
      job there) gets
      ``lapsed``, reads the job from firing and fires it again, with
      ``LNK_JOB_RECOVERED=1``.  A runner that dies after the command ended
      but before the job left firing also has it fired again: the second
      firing is the price of never losing one.  The same holds when a
      runner can't finish a job because the store failed.
    * NEVER BY TWO MACHINES AT THE SAME TIME: a live runner renews the lease
      of every job it fires at least every lapse/3, so nobody can take it
      however long the command runs (up to ``fire_timeout``).  If its
      renewals fail (the store unreachable, or the lease taken: ``renew``
      says ``lost``), the runner kills the command once the claim is
      unconfirmed for 2/3 of the lapse, before any other runner can judge it
      lapsed, and judges the claim again right before a command starts.
      This assumes the runner is not paused (a VM stall, swap, SIGSTOP) for
      lapse/3 or more, that the machines' clocks agree to well within
      lapse/3 (the store judges a lapse by the clock of the driver that
      takes) and that the command starts nothing outside its process group
      (what it leaves in the group when it exits is killed).  Past such a
      pause two fires may overlap; each gets ``LNK_JOB_FENCE``, larger for
      the later one, so a system they write to can refuse the superseded
      fire.  A runner
      process that dies takes its command's whole process group with it
      (its fire watcher kills it, even after a SIGKILL), as a machine that
      dies would.
    * A command that fails or times out counts as fired: it is not retried.
    * Lateness: a job whose due a runner already knows is claimed at its due
      with three requests (take, shift, read back); a job put due now while
      every runner sleeps is fired after at most one ``poll_interval`` (put
      from another machine) or at once (put on this machine: its driver
      nudges the runners, ``wake``), plus those requests.

What it costs
    While idle: one ``job_due`` (a listing of the store's due index) every
    ``poll_interval``, and a recovery step every three polls at most (the
    scanner: its ``scheduler:recovery`` lease renewed and one agent's firing
    listed; any other runner: one read seeing that lease held); each agent
    is stepped on every lapse/3, or every agents x 3 x poll_interval when
    that is longer: at most one request a poll_interval on average, whatever
    the number of agents (agents reached through a bridge: one listing of
    waiting each, a poll, on top).  Per job: take, claim (waiting -> firing,
    answering the job), remove from firing, end (4 ops, about 9 bucket
    requests), plus the takes of the runners that lost the race (``held``).
    Leases of fired jobs are ended, not removed: each job id fired leaves
    one small lease tombstone (the ops offer no conditional removal, and an
    unconditional one could drop a lease another runner has just taken),
    reused when that id is fired again, and deleted by ``lnk-store-admin gc``
    (conditionally on the version it judged dead); the ``job:`` threads
    share the agent's lease namespace with its conversations.

Requests go through a ``StoreClient`` (``request(dict) -> dict``): one
``<driver> serve`` process per runner for every agent without a bridge, or,
for an agent configured with ``bridge`` and ``key_file``, its store bridge.

Logs: one JSON object a line on stderr (or, with ``log_file``, in that file,
rotated by size: ``scheduling.log``), a ``fired`` event per firing
({"event", "owner", "agent", "job", "due", "started", "lateness_ms", "exit",
"duration_ms", "runner", "recovered", "killed"}), ``started`` and, on
SIGTERM/SIGINT (which stop claiming and wait for the fires under way; a
second signal kills), ``stopped`` with the requests sent by op.  Nothing is
written on stdout; the command's stdout goes to stderr.  The runner's own
drivers log JSON lines too (``LNK_LOG_FORMAT=json``) unless the runner's
environment or ``driver_env`` says otherwise.

Metrics (``metrics_port`` / ``metrics_file``, or the flags): one counter per
event of the log (``lnk_scheduler_events_total{event}``: fired, claim_failed,
lease_lost, recovering, store_error, ...), the runner's own drivers'
counters (bucket requests, retries, outcome-unknown errors, lost
compare-and-set rounds, replies, by op: ``cloudstore.runtime.metrics``) and
latencies (each request, each op), and the runner's own ``process_*`` and
``lnk_build_info`` (``cloudstore.runtime.metrics.process``), in the
Prometheus text format.  Agents reached through a bridge are counted by
that bridge's export.  The same port answers the probes (``runtime.health``):
``GET /healthz``, the loop turning (within ``Timing.live_within``), and
``GET /readyz``, the runner's driver and each bridge answered its last request
usably within ``Timing.fresh_for``; 200 or 503 with a JSON body saying why.
Under systemd (``NOTIFY_SOCKET``) it sends ``READY=1`` once the start-up check
passed, ``WATCHDOG=1`` while the loop turns, and ``STOPPING=1``
(``runtime.sd_notify``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

from .gate.store_format import FORMAT, READS_FROM
from .protocol.client import program_argv
from .runtime import jsonlog, metrics, sd_notify
from .runtime.health import Health
from .runtime.metrics.http import Exporter, export
from .runtime.metrics.process import ProcessMetrics
from .scheduling.config import ConfigError, Settings, load
from .scheduling.fire import FireCommand
from .scheduling.log import Lines, log, refuse, to_file
from .scheduling.reach import Reach
from .scheduling.runner import Runner, startup_problem
from .scheduling.store_client import (
    Agent,
    AgentStore,
    BridgeStoreClient,
    Counted,
    PooledServeClient,
    ServeClient,
    StoreCallError,
)
from .scheduling.watch import IndexSource, ListSource, Source

#: The runner's own driver, as its readiness names it (a bridge is named ``bridge <socket>``).
DRIVER_SOURCE = "driver"
#: Set for the runner's own driver processes: they alone answer job_due (it names every agent's jobs).
OWN_DRIVER_ENV = {"LNK_SCHEDULER_OPS": "1"}
#: Driver processes for the workers at most (each holds an SDK and its connections: about 50 MB).
#: One per worker up to this: a process answers one request at a time, and with two, one runner
#: at 10 jobs a second on moto fired its jobs 1.0-2.1 s late (median), its claims queued; with four, 0.5 s.
POOL_MAX = 4


def own_driver_env(settings: Settings, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the runner's own drivers: ``driver_env``, ``extra`` (metrics), ``OWN_DRIVER_ENV``.

    Their logs share the runner's stderr, which is JSON lines: they log JSON
    too unless the operator chose a format (here or in ``driver_env``).
    """
    env = {**settings.driver_env, **(extra or {}), **OWN_DRIVER_ENV}
    if "LNK_LOG_FORMAT" not in os.environ:
        env.setdefault("LNK_LOG_FORMAT", "json")
    return env


def build(settings: Settings, extra_env: Mapping[str, str] | None = None,
          reach: Reach | None = None) -> tuple[Runner, list[Counted]]:
    """The runner and the clients it sends through (counted, for the ``stopped`` log).

    ``extra_env`` is laid over ``driver_env`` for the runner's own drivers (``LNK_METRICS_DIR``);
    ``reach``, when given, notes each agent's last outcome (``lnk_scheduler_store_unreachable``).
    """
    reach = reach if reach is not None else Reach()
    for cfg in settings.agents:
        reach.known(cfg.agent.wire())
    clients: list[Counted] = []
    shared: Counted | None = None
    renewals: Counted | None = None  # the claims' renewals: a second process of the shared driver
    renew_stores: dict[Agent, AgentStore] = {}
    warm_pool: PooledServeClient | None = None
    stores: list[AgentStore] = []
    sources: list[Source] = []
    indexed: list[AgentStore] = []  # the agents reached through our own driver: one job_due polls them all
    for cfg in settings.agents:
        if cfg.bridge is not None:
            from .bridge.proof import read_key_file

            try:
                key = read_key_file(cfg.key_file or "")
            except Exception as exc:  # KeyFileError, OSError
                raise ConfigError(f"key_file of {cfg.agent.label()}: {exc}") from exc
            client = Counted(reach.watch(BridgeStoreClient(cfg.bridge, cfg.agent.owner, cfg.agent.id, key),
                                         f"bridge {cfg.bridge}"))
            clients.append(client)
            store = AgentStore(cfg.agent, client)
            sources.append(ListSource(store))  # a bridge names no other agent's jobs: its waiting is listed
        else:
            if shared is None:
                assert settings.driver is not None
                program = program_argv(settings.driver)[0]
                if shutil.which(program, path=settings.driver_env.get("PATH")) is None:
                    raise ConfigError(f"driver {program!r} is not a program found on PATH")
                env = own_driver_env(settings, extra_env)
                # A driver process per worker, and one more for the polls: workers claim and finish
                # in parallel instead of queueing behind one process's one request at a time.
                pool = PooledServeClient(settings.driver, env, min(settings.workers, POOL_MAX) + 1)
                warm_pool = pool
                shared = Counted(reach.watch(pool, DRIVER_SOURCE))
                renewals = Counted(reach.watch(ServeClient(settings.driver, env), DRIVER_SOURCE))
                clients += [shared, renewals]
            store = AgentStore(cfg.agent, shared, own_driver=True)
            indexed.append(store)
            assert renewals is not None
            renew_stores[cfg.agent] = AgentStore(cfg.agent, renewals, own_driver=True)
        stores.append(store)
    if indexed:
        sources.append(IndexSource(indexed))
    # The renewals' process is used once it has answered: starting a driver (its SDK's imports)
    # can take longer than a lapse/3, and a first renewal waiting on it would fence its fire.
    ready = threading.Event()
    if renew_stores:
        first = next(iter(renew_stores.values()))
        threading.Thread(target=_warm, args=(first, ready), name="renewals-warm", daemon=True).start()
    if warm_pool is not None:
        warm_pool.warm({"op": "job_mark", "agent": indexed[0].agent.wire()})
    runner = Runner(
        stores,
        sources,
        fire_command(settings),
        settings.runner,
        settings.timing,
        settings.workers,
        settings.keep_ending,
        renew_via=lambda store: renew_stores.get(store.agent, store) if ready.is_set() else store,
    )
    return runner, clients


def requests_sent(clients: Sequence[Counted]) -> dict[str, metrics.Family]:
    """``lnk_scheduler_requests_total{op}``: the requests the runner sent (to its drivers and bridges), by op."""
    family = metrics.Family("lnk_scheduler_requests_total",
                            "Requests the runner sent to its drivers and bridges, by op.")
    for client in clients:
        for _ in range(10):  # a Counter copied while a worker adds a new op may raise: copy again
            try:
                by_op = dict(client.by_op)
                break
            except RuntimeError:
                continue
        else:
            by_op = {}
        for op, n in by_op.items():
            family.add((("op", op),), n)
    return {family.name: family}


def _warm(store: AgentStore, ready: threading.Event) -> None:
    """Start the renewals' driver process with one cheap request; ``ready`` once it answered."""
    try:
        store.mark()
    except StoreCallError:
        return  # renewals keep going through the runner's own process
    ready.set()


def fire_command(settings: Settings) -> FireCommand:
    """The fire command with its own environment (never the runner's whole one: it holds the store's credentials)."""
    assert settings.fire is not None
    return FireCommand(settings.fire, settings.fire_timeout, settings.fire_pass_env, settings.fire_env)


def startup_check(settings: Settings, runner: Runner) -> list[str]:
    """Ask each bridge once, and the runner's own driver once for all the agents it serves; the lines
    naming each permanent misconfiguration (none: start).

    A store that is only unreachable is logged (``store_unreachable``) and
    left to the runner, which retries it with backoff.
    """
    lines = []
    asked_driver = False
    for cfg, store in zip(settings.agents, runner.stores, strict=True):
        if store.own_driver:
            # Every agent reached through our own driver shares its one process, settings and store:
            # what is wrong for one is wrong for all, so one request asks for them all (start-up
            # costs no request per agent, however many the runner serves).
            if asked_driver:
                continue
            asked_driver = True
        found = startup_problem(store, cfg.bridge)
        if found is None:
            continue
        if found.permanent:
            lines.append(found.line())
        else:
            log("store_unreachable", runner=settings.runner, agent=cfg.agent.label(), owner=cfg.agent.owner,
                error=found.problem)
    return lines


def log_to_file(settings: Settings) -> None:
    """With ``log_file``: the runner's log lines, and its Python logging's, to that file, rotated by size."""
    if settings.log_file is None:
        return
    try:
        to_file(settings.log_file, settings.log_max_bytes, settings.log_backups)
    except OSError as exc:
        raise ConfigError(f"log_file {settings.log_file!r} cannot be written: {exc.strerror or exc}") from None
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(Lines())


def main(argv: Sequence[str] | None = None) -> int:
    # Lines of Python's logging (a module's warning) as JSON too, beside the events ``log`` writes itself.
    jsonlog.configure("lnk-cloud-scheduler", logging.WARNING, "%(message)s", json_format=True, capture_stderr=False)
    exporter: Exporter | None = None
    clients: list[Counted] = []
    notifier = sd_notify.Notifier.from_env()  # read (and unset) before any driver inherits the environment
    try:
        settings = load(argv)
        log_to_file(settings)
        exporter = export(settings.metrics_port, settings.metrics_file, own=("lnk_scheduler_", metrics.STORE_FAMILIES),
                          process=ProcessMetrics("lnk-cloud-scheduler", FORMAT, READS_FROM))
        health = Health("lnk-cloud-scheduler", settings.timing.fresh_for, settings.timing.live_within)
        reach = Reach(health)
        runner, clients = build(settings, exporter.driver_env if exporter is not None else None, reach)
        runner.health = health
        if exporter is not None:
            exporter.collector.extra = lambda: {**requests_sent(clients), **reach.families()}
            exporter.health = health  # /healthz and /readyz beside /metrics
            exporter.start()
    except (ConfigError, OSError, ValueError) as exc:
        for client in clients:  # the drivers already started (a metrics port in use is found after them)
            client.close()
        if exporter is not None:
            exporter.stop()
        refuse(str(exc))
        return 2
    if exporter is not None:
        log("metrics", port=exporter.address[1] if exporter.address else None,
            host=exporter.address[0] if exporter.address else None, file=settings.metrics_file)
    problems = startup_check(settings, runner)
    if problems:
        for line in problems:
            refuse(line)
        for client in clients:
            client.close()
        runner.listener.close()
        runner.claimer.shutdown()
        if exporter is not None:
            exporter.stop()
        return 2

    watchdog = sd_notify.announce_ready(notifier, lambda: health.live()[0],
                                        f"firing the jobs of {len(settings.agents)} agent(s)")

    def on_signal(signum: int, _frame: object) -> None:
        # First signal: finish what's under way. Second: die now (fires die with us).
        signal.signal(signum, signal.SIG_DFL)
        runner.stop()
        sd_notify.announce_stopping(notifier, watchdog)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runner.run()
    finally:
        by_op: dict[str, int] = {}
        for client in clients:
            for op, n in client.by_op.items():
                by_op[op] = by_op.get(op, 0) + n
            client.close()
        log("stopped", runner=settings.runner, fired=runner.claimer.fired, requests=sum(by_op.values()), by_op=by_op)
        if exporter is not None:
            exporter.stop()  # after the drivers ended and the last event: the file's final counts
    return 0


if __name__ == "__main__":
    sys.exit(main())

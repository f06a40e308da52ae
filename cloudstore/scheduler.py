"""lnk-cloud-scheduler: fire the due jobs of the agents bound to this machine.

Run one on each machine the agents are bound to (more are fine), all pointed
at the same store.  Each runner asks its store when the soonest job is due
(``job_next``, one request for every agent in the bucket), sleeps until then
while watching its agents' ``job_mark`` (woken within ``mark_interval`` by
any job put in, shifted or removed from waiting), and fires each due job by
running the operator's command with the job's spec on stdin, up to
``workers`` (4) at once.  How it loops is in ``scheduler_runner``, claiming
and finishing in ``scheduler_claimer``, the claim leases in
``scheduler_claims``, running the command in ``scheduler_fire``, the store
seam in ``scheduler_store``, the config in ``scheduler_config``;
docs/scheduler.md says the same for operators.

Claiming a job
    take the lease on the thread ``job:<id>`` of the job's agent (holder:
    this runner's unique id, lapse ``lapse``), THEN shift the job waiting ->
    firing.  Of several runners on any machines exactly one gets the lease
    and the shift; the others see ``held`` or ``found: false`` and move on.
    The job is read back from firing and that is what is fired.  After the
    command: shift firing -> ending, remove it from ending (``keep_ending``
    leaves it there for the operator), end the lease.  A runner that dies
    between the shift to ending and the removal leaves the job in ending: a
    record that it was fired, for the operator to remove.

What is promised
    * A due job is fired ONCE when no runner dies and the store stays
      reachable: the lease and the shift let one runner claim it, and it
      leaves firing only after its command ran.
    * AT LEAST ONCE when a runner dies mid-fire: its lease is no longer
      renewed, so ``lapse`` seconds later another runner's recovery (every
      lapse/3 it lists firing and tries ``take`` on each job there) gets
      ``lapsed``, reads the job from firing and fires it again, with
      ``LNK_JOB_RECOVERED=1``.  A runner that dies after the command ended
      but before the job left firing also has it fired again: the second
      firing is the price of never losing one.  The same holds when a
      runner can't finish a job because the store failed.
    * NEVER BY TWO MACHINES AT THE SAME TIME: a live runner renews the lease
      of every job it fires every lapse/3, so nobody can take it however
      long the command runs (up to ``fire_timeout``).  If its renewals fail
      (the store unreachable, or the lease taken: ``renew`` says ``lost``),
      the runner kills the command once the claim is unconfirmed for 2/3 of
      the lapse, before any other runner can judge it lapsed.  This assumes
      the machines' clocks agree to well within lapse/3 (the store judges a
      lapse by the clock of the driver that takes) and that the command
      leaves nothing running in the background when it exits.  A runner
      process that dies takes its command with it (``setpriv --pdeathsig``,
      where present), as a machine that dies would.
    * A command that fails or times out counts as fired: it is not retried.
    * Lateness: a job whose due a runner already knows is claimed at its due
      with three requests (take, shift, read back); a job put due now while
      every runner sleeps is fired after about one ``mark_interval`` plus a
      few requests.

What it costs
    While idle: one ``job_mark`` per agent every ``mark_interval`` (8
    requests/s for 2 agents at 0.25 s), one ``job_next`` per ``max_sleep``,
    and one ``job_list`` of firing per agent every lapse/3.  Per job: take,
    shift, read back, shift, remove, end (6), plus the takes of the runners
    that lost the race (``held``, one each), plus a ``job_next`` and listing
    when a mark moved.  Leases of fired jobs are ended, not removed: each job
    id fired leaves one small lease tombstone (the ops offer no conditional
    removal, and an unconditional one could drop a lease another runner has
    just taken), reused when that id is fired again; the ``job:`` threads
    share the agent's lease namespace with its conversations.

Requests go through a ``StoreClient`` (``request(dict) -> dict``): one
``<driver> serve`` process per runner for every agent without a bridge, or,
for an agent configured with ``bridge`` and ``key_file``, its store bridge.

Logs: one JSON object a line on stderr, a ``fired`` event per firing
({"event", "owner", "agent", "job", "due", "started", "lateness_ms", "exit",
"duration_ms", "runner", "recovered", "killed"}), ``started`` and, on
SIGTERM/SIGINT (which stop claiming and wait for the fires under way; a
second signal kills), ``stopped`` with the requests sent by op.  Nothing is
written on stdout; the command's stdout goes to stderr.
"""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from typing import Optional, Sequence

from .client import program_argv
from .scheduler_config import ConfigError, Settings, load
from .scheduler_fire import FireCommand
from .scheduler_log import log
from .scheduler_runner import Runner
from .scheduler_store import Agent, AgentStore, BridgeStoreClient, Counted, ServeClient, StoreError


def build(settings: Settings) -> tuple[Runner, list[Counted]]:
    """The runner and the clients it sends through (counted, for the ``stopped`` log)."""
    clients: list[Counted] = []
    shared: Optional[Counted] = None
    renewals: Optional[Counted] = None  # the claims' renewals: a second process of the shared driver
    renew_stores: dict[Agent, AgentStore] = {}
    stores: list[AgentStore] = []
    next_stores: list[AgentStore] = []
    for cfg in settings.agents:
        if cfg.bridge is not None:
            from .bridge.proof import read_key_file

            try:
                key = read_key_file(cfg.key_file or "")
            except Exception as exc:  # KeyFileError, OSError
                raise ConfigError(f"key_file of {cfg.agent.label()}: {exc}") from exc
            client = Counted(BridgeStoreClient(cfg.bridge, cfg.agent.owner, cfg.agent.id, key))
            clients.append(client)
            store = AgentStore(cfg.agent, client)
            next_stores.append(store)  # each bridge may reach a store of its own
        else:
            if shared is None:
                assert settings.driver is not None
                program = program_argv(settings.driver)[0]
                if shutil.which(program, path=settings.driver_env.get("PATH")) is None:
                    raise ConfigError(f"driver {program!r} is not a program found on PATH")
                shared = Counted(ServeClient(settings.driver, settings.driver_env))
                renewals = Counted(ServeClient(settings.driver, settings.driver_env))
                clients += [shared, renewals]
                next_stores.append(AgentStore(cfg.agent, shared))  # one job_next answers for the whole store
            store = AgentStore(cfg.agent, shared)
            assert renewals is not None
            renew_stores[cfg.agent] = AgentStore(cfg.agent, renewals)
        stores.append(store)
    # The renewals' process is used once it has answered: starting a driver (its SDK's imports)
    # can take longer than a lapse/3, and a first renewal waiting on it would fence its fire.
    ready = threading.Event()
    if renew_stores:
        first = next(iter(renew_stores.values()))
        threading.Thread(target=_warm, args=(first, ready), name="renewals-warm", daemon=True).start()
    runner = Runner(
        stores,
        next_stores,
        fire_command(settings),
        settings.runner,
        settings.timing,
        settings.workers,
        settings.keep_ending,
        renew_via=lambda store: renew_stores.get(store.agent, store) if ready.is_set() else store,
    )
    return runner, clients


def _warm(store: AgentStore, ready: threading.Event) -> None:
    """Start the renewals' driver process with one cheap request; ``ready`` once it answered."""
    try:
        store.mark()
    except StoreError:
        return  # renewals keep going through the runner's own process
    ready.set()


def fire_command(settings: Settings) -> FireCommand:
    """The fire command with its own environment (never the runner's whole one: it holds the store's credentials)."""
    assert settings.fire is not None
    return FireCommand(settings.fire, settings.fire_timeout, settings.fire_pass_env, settings.fire_env)


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        settings = load(argv)
        runner, clients = build(settings)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"lnk-cloud-scheduler: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: object) -> None:
        # First signal: finish what's under way. Second: die now (fires die with us).
        signal.signal(signum, signal.SIG_DFL)
        runner.stop()

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
    return 0


if __name__ == "__main__":
    sys.exit(main())

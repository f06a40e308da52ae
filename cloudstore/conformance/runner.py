"""Choose the checks a driver's contract calls for, run them, and report.

The families run are ``check`` always; ``check_jobs`` / ``check_files`` when the
contract says jobs / files, else one check that their ops are refused;
``check_narrowing`` unless ``tools_read`` is refused, in which case the family
is reported as not kept (not failed) and only the consistency of that refusal
is checked.

With ``faults`` the run is the ``faults`` family instead (``fault_checks``):
the driver's store endpoint is put behind the suite's own proxy
(``faults.open_world``) and the promises are judged under seeded faults.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from ..protocol.client import DriverError
from . import commands, conversations, crash_checks, fault_checks, files, jobs, narrowing
from .expect import is_error
from .faults import open_world
from .harness import FAMILIES, Check, Ctx, Report, Result, run_check
from .judge import History
from .preflight import preflight
from .program import Driver
from .progress import Progress
from .transport import CallTransport, ServeTransport, Transport

MODES = ("serve", "call", "both")


def build_transports(driver: Driver, mode: str, contract: Mapping[str, object], notes: list[str]) -> list[Transport]:
    """The transports ``mode`` asks for; call mode alone for a driver whose contract does not say serve."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode in ("serve", "both") and not contract.get("serve"):
        notes.append("the contract does not say serve: requests go through `call`, one process each")
        return [CallTransport(driver)]
    chosen: dict[str, list[Transport]] = {
        "serve": [ServeTransport(driver)], "call": [CallTransport(driver)],
        "both": [ServeTransport(driver), CallTransport(driver)],
    }
    return chosen[mode]


def probe_tools(ctx: Ctx) -> str | None:
    """Why the driver keeps no tools (its error reply to tools_read), or None when it answers."""
    try:
        reply = ctx.ask(ctx.agent(), "tools_read", thread="lnk-store-check probe")
    except DriverError:
        return None  # a driver that answers nothing keeps nothing, but that is for the checks to fail
    return f"tools_read answered an error: {reply.get('error')!r}" if is_error(reply) else None


def plan(families: Sequence[str], contract: Mapping[str, object], tools_refused: str | None,
         report: Report) -> list[Check]:
    """Every check the contract calls for, in family order."""
    chosen: list[Check] = []
    for family in families:
        if family == "check":
            chosen += commands.checks.checks + conversations.checks.checks
        elif family == "check_jobs":
            chosen += (jobs.checks if contract.get("jobs") else jobs.not_kept).checks
        elif family == "check_files":
            chosen += (files.checks if contract.get("files") else files.not_kept).checks
        elif family == "check_narrowing":
            if tools_refused:
                report.not_kept["check_narrowing"] = tools_refused
            chosen += (narrowing.not_kept if tools_refused else narrowing.checks).checks
        else:
            raise ValueError(f"no family {family!r}; the families are {', '.join(FAMILIES)}")
    return chosen


def selected(
    check: Check, contract: Mapping[str, object], quick: bool, substrings: Sequence[str], has_program: bool
) -> bool:
    if quick and check.slow:
        return False
    if check.program and not has_program:
        return False
    if check.serve_only and not contract.get("serve"):
        return False
    return not substrings or any(s in check.name for s in substrings)


def run(
    program: str | Sequence[str] | None = None,
    families: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    mode: str = "serve",
    rounds: int = 3,
    quick: bool = False,
    checks: Sequence[str] = (),
    transports: Sequence[Transport] | None = None,
    contract: Mapping[str, object] | None = None,
    on_result: Callable[[Result], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    faults: bool = False,
    crash: bool = False,
    seed: int | None = None,
    progress: Progress | None = None,
) -> Report:
    """Run the conformance suite against one driver; the report of every check.

    ``program`` is the driver program (a name on PATH, a path, a shell-quoted
    command line or an argv list) and ``env`` the settings laid over this
    process's environment for it. ``checks`` keeps only checks whose name holds
    one of the substrings; ``quick`` leaves out the slow ones (the 4,097-file
    list). A caller reaching the driver another way (the store bridge) passes
    its own ``transports`` and ``contract``, and may leave ``program`` out: the
    checks of the program's commands are then not run.

    ``faults`` runs the ``faults`` family instead, behind the suite's proxy
    (see :func:`run_faults`), with fault schedules drawn from ``seed``;
    ``crash`` the ``crash`` family (:func:`run_crash`), its kill moments drawn from ``seed``.

    Without a ``contract`` the driver is first put through the pre-flight
    (:func:`~cloudstore.conformance.preflight.preflight`): a program that cannot
    be run, a failing ``contract`` or a first read answering a setting error
    raises :class:`~cloudstore.conformance.preflight.SetupError` before any
    check. ``progress`` is told the checks planned, started and ended.
    """
    started = time.monotonic()
    report = Report()
    say = on_note or (lambda note: None)
    tally = progress or Progress()
    driver = Driver(program if isinstance(program, str) else tuple(program), dict(env or {})) if program else None
    if contract is None:
        if driver is None:
            raise ValueError("run() needs a program or a contract")
        contract = preflight(driver).contract
    report.contract = dict(contract)
    if faults:
        if driver is None:
            raise ValueError("--faults needs the driver program (it starts its own processes)")
        run_faults(driver, contract, report, quick=quick, checks=checks, seed=seed, on_result=on_result, say=say,
                   progress=tally)
        report.seconds = time.monotonic() - started
        return report
    if crash:
        if driver is None:
            raise ValueError("--crash needs the driver program (it starts and kills its own processes)")
        probe = ServeTransport(driver)
        try:
            tools_refused = probe_tools(context(report, probe, driver, contract, rounds))
        finally:
            probe.close()
        run_crash(driver, contract, report, quick=quick, checks=checks, seed=seed, keeps_tools=tools_refused is None,
                  on_result=on_result, say=say, progress=tally)
        report.seconds = time.monotonic() - started
        return report
    # An empty contract (a caller's own) says nothing of which families the driver keeps: only `check`.
    families = list(families or FAMILIES) if contract else ["check"]
    own = transports is None
    if transports is None:
        assert driver is not None
        first_note = len(report.notes)
        transports = build_transports(driver, mode, contract, report.notes)
        for note in report.notes[first_note:]:
            say(note)
    ways = list(transports)
    try:
        tools_refused = (
            probe_tools(context(report, ways[0], driver, contract, rounds))
            if "check_narrowing" in families else None
        )
        chosen = [c for c in plan(families, contract, tools_refused, report)
                  if selected(c, contract, quick, checks, driver is not None)]
        for family, why in report.not_kept.items():
            say(f"{family}: NOT KEPT ({why})")
        tally.planned(sum(1 if c.program else len(ways) for c in chosen))
        for check in chosen:
            for way in ([None] if check.program else ways):
                ctx = context(report, way, driver, contract, rounds, keeps_tools=tools_refused is None)
                label = f"{check.name} [{way.mode}]" if len(ways) > 1 and way is not None else ""
                tally.starting(label or check.name)
                result = run_check(check, ctx, "program" if way is None else way.mode)
                result.label = label
                report.results.append(result)
                tally.finished(result)
                if on_result:
                    on_result(result)
    finally:
        if own:
            for way in ways:
                way.close()
    report.seconds = time.monotonic() - started
    return report


def context(report: Report, transport: Transport | None, driver: Driver | None, contract: Mapping[str, object],
            rounds: int, keeps_tools: bool = True) -> Ctx:
    """A check's context, its agents named under the run's id and counted in ``report.agents``."""
    return Ctx(transport, driver, dict(contract), rounds, keeps_tools=keeps_tools, run_id=report.run_id,
               made=report.agents)


def chosen_by_name(family: Sequence[Check], checks: Sequence[str]) -> list[Check]:
    """The checks of a seeded family whose name holds one of ``checks`` (all without any)."""
    return [c for c in family if not checks or any(s in c.name for s in checks)]


def run_faults(
    driver: Driver, contract: Mapping[str, object], report: Report, *, quick: bool, checks: Sequence[str],
    seed: int | None, on_result: Callable[[Result], None] | None, say: Callable[[str], None], progress: Progress,
) -> None:
    """The ``faults`` family, each check with a history of its own; a failure's seed, schedule and history as notes.

    Raises ValueError when the driver's settings name no HTTP endpoint to put the proxy in front of.
    """
    seed = random.randrange(1, 1 << 31) if seed is None else seed
    world = open_world(driver.env, seed, quick)
    say(f"faults: seed {seed} (replay: --seed {seed}); proxy in front of {world.setting}={world.proxy.upstream}")
    report.notes.append(f"seed {seed}")
    ops, kinds = 0, Counter[str]()
    try:
        proxied = Driver(driver.program, world.env)
        chosen = chosen_by_name(fault_checks.checks.checks, checks)
        progress.planned(len(chosen))
        for check in chosen:
            history = History(seed)
            ctx = fault_checks.FaultCtx(None, proxied, dict(contract), keeps_tools=False, run_id=report.run_id,
                                        made=report.agents, world=world, history=history)
            _run_seeded(check, ctx, "faults", seed, history, report, on_result, say, progress)
            ops += history.ops
            kinds.update(history.faults)
    finally:
        world.close()
    figures = f"faults: {ops} ops; faults fired by kind: " + (
        ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none")
    report.notes.append(figures)
    say(figures)


def _run_seeded(check: Check, ctx: Ctx, mode: str, seed: int, history: History, report: Report,
                on_result: Callable[[Result], None] | None, say: Callable[[str], None], progress: Progress) -> None:
    """One check of a seeded family (``faults``, ``crash``): its result kept, and a failure's replay line,
    the fault schedule (under ``faults``: what was armed last) and the history that broke as notes.

    A check that builds on one that failed in this run is not run (the same defect, already shown)."""
    if check.builds_on in report.failed_names():
        result = Result(check.name, check.family, mode, False, 0.0,
                        unjudged=f"(builds on {check.builds_on}, which failed: fix that first)")
        report.results.append(result)
        progress.finished(result)
        if on_result:
            on_result(result)
        return
    progress.starting(check.name)
    result = run_check(check, ctx, mode)
    report.results.append(result)
    progress.finished(result)
    if on_result:
        on_result(result)
    if not result.passed:
        armed = " | ".join(history.schedule[-3:]) or "(none armed)"
        schedule = [f"fault schedule: {armed}"] if mode == "faults" else []
        lines = [f"{check.name} failed with seed {seed} (replay: --seed {seed} --check {check.name})",
                 *schedule, "history that broke:", *history.tail()]
        for line in lines:
            report.notes.append(line)
            say(line)


def run_crash(
    driver: Driver, contract: Mapping[str, object], report: Report, *, quick: bool, checks: Sequence[str],
    seed: int | None, keeps_tools: bool, on_result: Callable[[Result], None] | None, say: Callable[[str], None],
    progress: Progress,
) -> None:
    """The ``crash`` family; a failure's seed and the history that broke as notes, and the kills by kind."""
    seed = random.randrange(1, 1 << 31) if seed is None else seed
    say(f"crash: seed {seed} (replay: --seed {seed})")
    report.notes.append(f"seed {seed}")
    ops, kills = 0, Counter[str]()
    chosen = chosen_by_name(crash_checks.checks.checks, checks)
    progress.planned(len(chosen))
    for check in chosen:
        history = History(seed)
        ctx = crash_checks.CrashCtx(None, driver, dict(contract), keeps_tools=keeps_tools, run_id=report.run_id,
                                    made=report.agents, seed=seed, quick=quick, history=history,
                                    rng=random.Random(f"{seed}:{check.name}"))
        _run_seeded(check, ctx, "crash", seed, history, report, on_result, say, progress)
        ops += history.ops
        kills.update(ctx.kills)
    figures = f"crash: {ops} requests; processes killed: " + (
        ", ".join(f"{n} by {k}" for k, n in sorted(kills.items())) or "none")
    report.notes.append(figures)
    say(figures)

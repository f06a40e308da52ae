"""Named checks, what they are given, and what a run of them reports.

A check is a plain function of a :class:`Ctx` that raises
:class:`~cloudstore.conformance.expect.CheckFailed` (or anything else) when the
driver is wrong. Families register theirs on a :class:`CheckSet`; the runner
decides which to run and how requests travel (``ctx.transport``).
"""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol.client import DriverError
from .expect import CheckFailed, Json, short
from .program import Driver
from .transport import Transport

#: ``ctx.agent()``'s default: a fresh owner as well as a fresh id.
FRESH = object()

FAMILIES = ("check", "check_jobs", "check_files", "check_narrowing")


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]


@dataclass
class Ctx:
    """What a check may use: the way in, the program, its contract, how hard to race."""

    transport: Transport | None
    driver: Driver | None
    contract: dict[str, Json]
    rounds: int = 3
    keeps_tools: bool = True
    run_id: str = field(default_factory=new_run_id)
    #: Every agent id this context made (the run's list, shared by its contexts: what it leaves in the store).
    made: list[str] = field(default_factory=list)

    def agent(self, owner: Any = FRESH, id: str | None = None) -> dict[str, Json]:
        """A new agent no earlier run has used; ``owner`` None or a string picks the owner."""
        fresh = uuid.uuid4().hex[:12]
        agent: dict[str, Json] = {
            "id": id if id is not None else f"lsc-{self.run_id}-{fresh}",
            "owner": f"lsc-owner-{fresh}" if owner is FRESH else owner,
        }
        self.made.append(agent["id"])  # list.append: one step, safe from racers' threads
        return agent

    def ask(self, agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
        """One request of ``op`` for ``agent`` (fields named ``from`` go in as ``**{"from": ...}``)."""
        assert self.transport is not None, "a transport check was run without a transport"
        return self.transport.request({"op": op, "agent": agent, **fields})

    def send(self, request: Json | bytes) -> dict[str, Json]:
        """One request exactly as given (raw bytes included)."""
        assert self.transport is not None
        return self.transport.request(request)


@dataclass(frozen=True)
class Check:
    """One named check. ``program`` checks run the program's commands themselves,
    once per run, and need a :class:`Driver`; the others go through a transport,
    once per mode. ``slow`` ones are left out by ``quick``; ``serve_only`` ones
    when the contract does not say serve. A check that ``builds_on`` another
    puts the other's scenario inside its own (a lost reply, and then more):
    when that one failed earlier in the run, this one is not judged, so one
    defect is reported once, by the check that shows it plainest."""

    name: str
    family: str
    fn: Callable[[Ctx], None]
    program: bool = False
    slow: bool = False
    serve_only: bool = False  # a program check of `serve`: only for a contract that says serve
    builds_on: str = ""  # the name of a check of the same family whose failure leaves this one unjudged


class CheckSet:
    """A family's checks, registered with ``@checks.check`` in the order written."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.checks: list[Check] = []

    def check(
        self, fn: Callable[[Ctx], None] | None = None, *, program: bool = False, slow: bool = False,
        serve_only: bool = False, builds_on: str = "",
    ) -> Any:
        """Register ``fn`` as ``<family>.<fn name>``, bare (``@checks.check``) or with options."""

        def register(f: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
            self.add(Check(f"{self.family}.{f.__name__}", self.family, f, program, slow, serve_only, builds_on))
            return f

        return register(fn) if fn is not None else register

    def add(self, check: Check) -> None:
        if any(c.name == check.name for c in self.checks):
            raise ValueError(f"two checks named {check.name}")
        if check.builds_on and not any(c.name == check.builds_on for c in self.checks):
            raise ValueError(f"{check.name} builds on {check.builds_on}, which is not registered before it")
        self.checks.append(check)


@dataclass
class Result:
    """How one check went."""

    name: str
    family: str
    mode: str  # "serve", "call", "program" or a transport's own name
    passed: bool
    ms: float
    expected: str = ""
    got: str = ""
    what: str = ""
    label: str = ""  # the name as printed (with the mode when a run has several)
    unjudged: str = ""  # why it was not run: the check it builds on failed (neither passed nor failed)

    def line(self) -> str:
        """The result line: name, PASS/FAIL, time; for a failure what was expected and what came back."""
        if self.unjudged:
            return f"{self.label or self.name}  NOT JUDGED  {self.unjudged}"
        head = f"{self.label or self.name}  {'PASS' if self.passed else 'FAIL'}  {self.ms:.0f} ms"
        if self.passed:
            return head
        return f"{head}  {self.what}: expected {self.expected}; got {self.got}"


@dataclass
class Report:
    """Everything a run found: results in order, families not kept, notes."""

    contract: dict[str, Json] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    not_kept: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The id every agent of this run is named under (``lsc-<run_id>-...``) and the agents made.
    run_id: str = field(default_factory=new_run_id)
    agents: list[str] = field(default_factory=list)

    @property
    def agent_prefix(self) -> str:
        return f"lsc-{self.run_id}-"

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.passed and not r.unjudged for r in self.results)

    @property
    def unjudged(self) -> int:
        return sum(bool(r.unjudged) for r in self.results)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and bool(self.results)

    def failed_names(self) -> set[str]:
        return {r.name for r in self.results if not r.passed and not r.unjudged}

    def unjudged_names(self) -> set[str]:
        return {r.name for r in self.results if r.unjudged}

    def passed_names(self) -> set[str]:
        return {r.name for r in self.results if r.passed}

    def names(self) -> set[str]:
        return {r.name for r in self.results}

    def summary(self) -> str:
        unjudged = f", {self.unjudged} not judged" if self.unjudged else ""
        return f"{self.passed} passed, {self.failed} failed{unjudged}"

    def failures(self) -> str:
        """Every failing (or unjudged) line, for an assertion message."""
        return "\n".join(r.line() for r in self.results if not r.passed)


def run_check(check: Check, ctx: Ctx, mode: str) -> Result:
    """Run one check, timing it; any exception is its failure, never the run's."""
    start = time.monotonic()
    result = Result(check.name, check.family, mode, True, 0.0)
    try:
        check.fn(ctx)
    except CheckFailed as failed:
        result.passed, result.what, result.expected, result.got = False, failed.what, failed.expected, failed.got
    except DriverError as exc:
        result.passed, result.what = False, "the driver did not answer one reply line"
        result.expected, result.got = "<one JSON reply line>", short(f"<{exc}>")
    except Exception as exc:  # a reply of the wrong shape makes a check trip over it
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.passed, result.what = False, f"unexpected {type(exc).__name__} at {where.name}:{where.lineno}"
        result.expected, result.got = "<replies of the documented shape>", short(f"<{exc}>")
    result.ms = (time.monotonic() - start) * 1000
    return result

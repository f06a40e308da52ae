"""What every family checks the same way: refusals that change nothing, and stdout discipline.

docs/protocol.md: a request that is not valid JSON, not an object, has an unknown op or
breaks any rule gets ``{"reply": "error", "error": ...}`` and changes nothing;
stdout carries exactly one reply line per request. Each family hands this
module its own requests and its own way of reading its state; the judging is
written once, here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..protocol.client import DriverError, ServeProcess, call_once, dumps
from .expect import CheckFailed, Json, expect, expect_error, expect_that, is_error, short
from .harness import Check, CheckSet, Ctx
from .program import CALL_SECONDS
from .transport import parse_reply

Case = tuple[str, "Json | bytes"]


def malformed_cases(mutation: dict[str, Json]) -> list[Case]:
    """Requests that are no request at all, and ``mutation`` (a valid request that
    changes something) spoiled in ways a lenient parser would let through, so a
    driver that accepts them is caught changing state."""
    agent = mutation["agent"]
    rest = {k: v for k, v in mutation.items() if k != "agent"}
    line = dumps(mutation)
    return [
        ("invalid JSON (cut short)", line[:-1].encode()),
        ("not JSON", b"hello"),
        ("trailing garbage after the object", (line + " x").encode()),
        ("two objects on one line", (line + line).encode()),
        ("invalid UTF-8", dumps({**mutation, "x": "@@"}).encode().replace(b"@@", b"\xff\xfe")),
        ("NaN, which JSON does not have", (line[:-1] + ',"x":NaN}').encode()),
        ("an array", b"[" + line.encode() + b"]"),
        ("a string", dumps(mutation["op"]).encode()),
        ("a number", b"1"),
        ("null", b"null"),
        ("no op", {k: v for k, v in mutation.items() if k != "op"}),
        ("op in another case", {**mutation, "op": str(mutation["op"]).upper()}),
        ("op a number", {**mutation, "op": 5}),
        ("unknown op", {**mutation, "op": "frobnicate"}),
        ("no agent", rest),
        ("agent a string", {**rest, "agent": agent["id"]}),
        ("agent without id", {**rest, "agent": {"owner": agent.get("owner")}}),
        ("agent id empty", {**rest, "agent": {**agent, "id": ""}}),
        ("agent id a number", {**rest, "agent": {**agent, "id": 5}}),
        ("agent id null", {**rest, "agent": {**agent, "id": None}}),
        ("agent owner a number", {**rest, "agent": {**agent, "owner": 5}}),
        ("agent owner a list", {**rest, "agent": {**agent, "owner": [agent.get("owner")]}}),
    ]


def expect_refused(ctx: Ctx, cases: Sequence[Case], snapshot: Callable[[], Json]) -> None:
    """Each case must get an error reply, and ``snapshot()`` must read the same after it as before all."""
    before = snapshot()
    for label, request in cases:
        shown = short(request if not isinstance(request, bytes) else f"<{request[:150]!r}>")[:160]
        expect_error(ctx.send(request), f"reply to a request with {label}: {shown}")
        expect(snapshot(), before, f"state after the refused request with {label}")


@dataclass(frozen=True)
class Sample:
    """A request for the stdout checks and whether its right reply is an error.

    Samples are sent in order in serve mode and a few at once in call mode, so
    whether a sample's reply is an error must not depend on the others.
    """

    label: str
    request: Json | bytes
    error: bool
    in_serve: bool = True  # False for what only means something as a whole stdin (empty input)

    def line(self) -> bytes:
        return self.request if isinstance(self.request, bytes) else dumps(self.request).encode()


def _judge(sample: Sample, reply_line: str, where: str) -> None:
    try:
        reply = parse_reply([reply_line])
    except DriverError as exc:
        raise CheckFailed(
            f"{where}: reply to {sample.label}", "<one JSON object with a string reply>", f"<{exc}>"
        ) from exc
    expect_that(
        is_error(reply) == sample.error, f"{where}: reply to {sample.label}",
        "<an error reply>" if sample.error else "<a reply that is not an error>", reply,
    )


def discipline_checks(checks: CheckSet, samples: Callable[[Ctx], list[Sample]]) -> None:
    """Register ``<family>.call_stdout_discipline`` and ``<family>.serve_stdout_discipline``."""

    def call_stdout_discipline(ctx: Ctx) -> None:
        """In `call` mode every request, good or bad, is answered by exactly one stdout line and exit 0."""
        driver = ctx.driver
        assert driver is not None
        chosen = samples(ctx)  # whether each is an error does not hang on order: run a few at once
        with ThreadPoolExecutor(max_workers=4) as pool:
            ran = list(pool.map(lambda s: call_once(driver.argv, s.line(), driver.env, timeout=CALL_SECONDS), chosen))
        for sample, (lines, err, code) in zip(chosen, ran, strict=False):
            expect_that(code == 0, f"exit code of `call` for {sample.label}", 0, f"<{code}; stderr {err[-200:]!r}>")
            expect_that(len(lines) == 1, f"stdout of `call` for {sample.label}", "<exactly one reply line>", lines[:4])
            _judge(sample, lines[0], "call")

    def serve_stdout_discipline(ctx: Ctx) -> None:
        """`serve` answers N request lines with exactly N reply lines, in order, then exits 0 at end of stdin."""
        assert ctx.driver is not None
        chosen = [s for s in samples(ctx) if s.in_serve]
        proc = ServeProcess(ctx.driver.argv, ctx.driver.env, stderr=subprocess.DEVNULL)
        try:
            out, _ = proc.proc.communicate(b"".join(s.line() + b"\n" for s in chosen), timeout=CALL_SECONDS * 2)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise CheckFailed("serve with its stdin ended", "<exit within 60 s>", "<still running>") from None
        expect_that(proc.proc.returncode == 0, "exit code of serve at the end of stdin", 0, proc.proc.returncode)
        try:
            text = out.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckFailed("serve's stdout", "<UTF-8>", f"<{exc}>") from exc
        expect_that(text.endswith("\n"), "serve's stdout", "<reply lines, each ended by a newline>", text[-200:])
        lines = text[:-1].split("\n")
        if len(lines) != len(chosen):
            strays = [line for line in lines if not line.startswith('{"reply"') and not line.startswith('{ "reply"')]
            raise CheckFailed(f"reply lines from serve for {len(chosen)} request lines", f"<{len(chosen)} lines>",
                              f"<{len(lines)} lines; first: {lines[0][:80]!r}; last: {lines[-1][:80]!r}; "
                              f"not starting like a reply: {[x[:80] for x in strays[:3]]!r}>")
        for sample, reply_line in zip(chosen, lines, strict=False):
            _judge(sample, reply_line, "serve")

    for fn, serve_only in ((call_stdout_discipline, False), (serve_stdout_discipline, True)):
        checks.add(Check(f"{checks.family}.{fn.__name__}", checks.family, fn, program=True, serve_only=serve_only))

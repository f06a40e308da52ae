"""Family ``check_narrowing``: the tools a conversation was narrowed to.

A narrowing only ever narrows: the tools a conversation may use are the
intersection of every list it was narrowed to, in the order of the latest,
without duplicates, kept after ``remove``. A driver that keeps no tools
answers every tools op with an error; the runner asks ``tools_read`` first and
reports the family as not kept then, running only :data:`not_kept`.
"""

from __future__ import annotations

import random

from .expect import Json, expect, expect_error, expect_that
from .harness import CheckSet, Ctx
from .race import race
from .rules import Sample, discipline_checks, expect_refused, malformed_cases
from .values import HOSTILE_NAMES

checks = CheckSet("check_narrowing")
not_kept = CheckSet("check_narrowing")

TOOLS_MAX = 256
NEVER = {"reply": "tools", "tools": None}


def request(agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
    return {"op": op, "agent": agent, **fields}


def tools(names: list[str]) -> dict[str, Json]:
    return {"reply": "tools", "tools": names}


def narrowed(by_thread: dict[str, Json]) -> dict[str, Json]:
    return {"reply": "narrowed", "narrowed": by_thread}


def narrow(ctx: Ctx, a: dict[str, Json], thread: str, names: list[str], want: list[str], what: str) -> None:
    expect(ctx.ask(a, "tools_narrow", thread=thread, tools=names), tools(want), what)
    expect(ctx.ask(a, "tools_read", thread=thread), tools(want), f"tools_read after {what}")


def snapshot(ctx: Ctx, a: dict[str, Json], threads: list[str]) -> Json:
    return {"list": ctx.ask(a, "tools_list"), "read": [ctx.ask(a, "tools_read", thread=t) for t in threads]}


@checks.check
def never_narrowed(ctx: Ctx) -> None:
    """tools_read is null (every tool) for a conversation never narrowed, events or not; tools_list is empty."""
    a = ctx.agent()
    expect(ctx.ask(a, "tools_read", thread="t"), NEVER, "tools_read of a conversation never narrowed")
    expect(ctx.ask(a, "append", thread="t", event={"seq": 1}), {"reply": "done"}, "append")
    expect(ctx.ask(a, "tools_read", thread="t"), NEVER, "tools_read of a conversation with events, never narrowed")
    expect(ctx.ask(a, "tools_list"), narrowed({}), "tools_list of an agent that narrowed nothing")


@checks.check
def order_and_duplicates(ctx: Ctx) -> None:
    """tools_narrow answers the tools in the order given, without duplicates; an empty list narrows to none."""
    a = ctx.agent()
    narrow(ctx, a, "t", ["c", "a", "b", "a", "c"], ["c", "a", "b"], "a first narrowing with duplicates")
    narrow(ctx, a, "t", ["b", "c", "a", "b"], ["b", "c", "a"], "the same tools in another order")
    narrow(ctx, a, "empty", [], [], "a narrowing to no tools")


@checks.check
def only_narrows(ctx: Ctx) -> None:
    """Narrowing is intersection: a tool not allowed before stays out, and a list never widens it back."""
    a = ctx.agent()
    narrow(ctx, a, "t", ["read", "write", "search", "shell"], ["read", "write", "search", "shell"], "narrow to 4")
    narrow(
        ctx, a, "t", ["shell", "web", "read", "search"], ["shell", "read", "search"], "narrow with a tool not allowed"
    )
    narrow(ctx, a, "t", ["web", "write"], [], "narrow to tools none of which is allowed")
    narrow(ctx, a, "t", ["read", "shell"], [], "narrow after reaching none (never widens)")
    narrow(ctx, a, "u", ["x"], ["x"], "another thread")
    narrow(ctx, a, "u", ["x", "y"], ["x"], "a wider list")


@checks.check
def list_and_remove(ctx: Ctx) -> None:
    """tools_list shows every narrowed conversation, removed or without events; remove keeps the narrowing."""
    a = ctx.agent()
    narrow(ctx, a, "no events", ["a", "b"], ["a", "b"], "narrow a thread before its first event")
    expect(ctx.ask(a, "append", thread="removed", event={"seq": 1}), {"reply": "done"}, "append")
    narrow(ctx, a, "removed", ["c"], ["c"], "narrow a thread with events")
    expect(
        ctx.ask(a, "append", thread="plain", event={"seq": 1}), {"reply": "done"}, "append to a thread never narrowed"
    )
    expect(ctx.ask(a, "remove", thread="removed"), {"reply": "done"}, "remove the narrowed thread")
    expect(ctx.ask(a, "tools_read", thread="removed"), tools(["c"]), "tools_read after remove")
    expect(ctx.ask(a, "tools_list"), narrowed({"no events": ["a", "b"], "removed": ["c"]}), "tools_list")
    expect(ctx.ask(a, "threads"), {"reply": "threads", "threads": [{"thread": "plain", "last": 1}]},
           "threads (narrowed-only and removed ones are not listed)")
    expect(ctx.ask(a, "append", thread="removed", event={"seq": 1}), {"reply": "done"}, "append to the removed thread")
    narrow(ctx, a, "removed", ["c", "d"], ["c"], "narrow the conversation made again with more tools")


@checks.check
def hostile_names(ctx: Ctx) -> None:
    """Threads and tool names of any characters are kept apart and exactly."""
    a = ctx.agent()
    want: dict[str, list[str]] = {}
    for i, name in enumerate(HOSTILE_NAMES):
        names = [name or "empty", f"tool {i}", "ß/\u0000x"]
        narrow(ctx, a, name, names, names, f"narrow thread {name[:20]!r}")
        want[name] = names
    expect(ctx.ask(a, "tools_list"), narrowed(want), "tools_list")


@checks.check
def limit(ctx: Ctx) -> None:
    """256 tools' names are accepted in one narrowing."""
    a = ctx.agent()
    names = [f"tool-{i:03d}" for i in range(TOOLS_MAX)]
    random.shuffle(names)
    narrow(ctx, a, "t", names, names, "narrow to 256 tools")


@checks.check
def agents_apart(ctx: Ctx) -> None:
    """Owner null, "" and "x" are three agents: one thread's narrowing is each agent's own."""
    base = ctx.agent()["id"]
    agents = [{"id": base, "owner": None}, {"id": base, "owner": ""}, {"id": base, "owner": "x"}, ctx.agent()]
    for i, agent in enumerate(agents[:3]):
        narrow(ctx, agent, "t", [f"tool-{i}", "shared"], [f"tool-{i}", "shared"], f"agent {i}: narrow")
    for i, agent in enumerate(agents):
        want = NEVER if i == 3 else tools([f"tool-{i}", "shared"])
        expect(ctx.ask(agent, "tools_read", thread="t"), want, f"agent {i} ({agent}): tools_read")
        expect(ctx.ask(agent, "tools_list"), narrowed({} if i == 3 else {"t": want["tools"]}), f"agent {i}: tools_list")
    expect(ctx.ask({"id": base}, "tools_read", thread="t"), tools(["tool-0", "shared"]),
           "tools_read by the agent with owner left out (= null)")


@checks.check
def race_narrow(ctx: Ctx) -> None:
    """8 narrowings at once each narrow what the others left: the end is the intersection of all of them."""
    a = ctx.agent()
    base = [f"t{i:02d}" for i in range(16)]
    for round_ in range(ctx.rounds):
        t = f"race-{round_}"
        narrow(ctx, a, t, base, base, f"round {round_}: narrow to 16 tools")
        lists = []
        for i in range(8):
            names = [n for n in base if n != base[i]] + ["extra"]
            random.shuffle(names)
            lists.append(names)
        replies = race(ctx, [request(a, "tools_narrow", thread=t, tools=names) for names in lists])
        for i, reply in enumerate(replies):
            ok = (reply.get("reply") == "tools" and isinstance(reply.get("tools"), list)
                  and reply["tools"] == [n for n in lists[i] if n in reply["tools"]]
                  and set(reply["tools"]) <= set(base) - {base[i]})
            expect_that(ok, f"round {round_}: narrowing {i}'s reply", f"<tools from its list in its order, "
                        f"without {base[i]!r} or 'extra'>", reply)
        final = ctx.ask(a, "tools_read", thread=t)
        left = set(base[8:])
        expect_that(final.get("reply") == "tools" and isinstance(final.get("tools"), list)
                    and sorted(final["tools"]) == sorted(left), f"round {round_}: tools_read after 8 narrowings",
                    f"<the 8 tools no narrowing left out: {sorted(left)}>", final)


@checks.check
def refuse_malformed(ctx: Ctx) -> None:
    """Invalid JSON, non-objects, unknown ops and bad agents get an error reply and change nothing."""
    a = ctx.agent()
    narrow(ctx, a, "t", ["a", "b"], ["a", "b"], "narrow")
    expect_refused(ctx, malformed_cases(request(a, "tools_narrow", thread="t", tools=["a"])),
                   lambda: snapshot(ctx, a, ["t"]))


@checks.check
def refuse_bad_args(ctx: Ctx) -> None:
    """tools not a list, holding "" or a non-string, past 256 names, or a missing thread is refused, nothing changed."""
    a = ctx.agent()
    narrow(ctx, a, "t", ["a", "b"], ["a", "b"], "narrow")
    over = [f"tool-{i:03d}" for i in range(TOOLS_MAX + 1)]
    r = lambda op, **f: request(a, op, **f)  # noqa: E731
    cases = [
        ("tools a string", r("tools_narrow", thread="t", tools="a")),
        ("tools null", r("tools_narrow", thread="t", tools=None)),
        ("no tools", r("tools_narrow", thread="t")),
        ("an empty name", r("tools_narrow", thread="t", tools=["a", ""])),
        ("a name that is a number", r("tools_narrow", thread="t", tools=["a", 5])),
        ("a name that is null", r("tools_narrow", thread="t", tools=[None])),
        ("a name that is a list", r("tools_narrow", thread="t", tools=[["a"]])),
        ("257 names", r("tools_narrow", thread="t", tools=over)),
        ("257 names on a new thread", r("tools_narrow", thread="new", tools=over)),
        ("no thread", r("tools_narrow", tools=["a"])),
        ("thread a number", r("tools_narrow", thread=5, tools=[])),
        ("tools_read without a thread", r("tools_read")),
        ("tools_read of thread null", r("tools_read", thread=None)),
    ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a, ["t", "new", "5"]))


def _samples(ctx: Ctx) -> list[Sample]:
    a = ctx.agent()
    return [
        Sample("tools_read", request(a, "tools_read", thread="t"), False),
        Sample("tools_narrow", request(a, "tools_narrow", thread="t", tools=["a", "b"]), False),
        Sample("tools_list", request(a, "tools_list"), False),
        Sample("an empty tool name", request(a, "tools_narrow", thread="t", tools=[""]), True),
        Sample("tools a string", request(a, "tools_narrow", thread="t", tools="a"), True),
        Sample("invalid JSON", b'{"op": "tools_list", ', True),
    ]


discipline_checks(checks, _samples)


@not_kept.check
def refused_when_not_kept(ctx: Ctx) -> None:
    """A driver that keeps no tools refuses all three tools ops, not just tools_read."""
    a = ctx.agent()
    for label, req in (
        ("tools_read", request(a, "tools_read", thread="t")),
        ("tools_list", request(a, "tools_list")),
        ("tools_narrow", request(a, "tools_narrow", thread="t", tools=["a"])),
    ):
        expect_error(ctx.send(req), f"{label} to a driver that keeps no tools")

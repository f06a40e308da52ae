"""Family ``check``: conversations and their leases, through requests only.

Every check works on agents of its own (fresh ids), so what an earlier run
left in the store cannot change the outcome. Timing checks size their waits
by the transport's ``race_window_ms``, so a ``call``-mode run (a process per
request) judges the same rules without false failures.
"""

from __future__ import annotations

import random
import time

from .expect import Json, expect, expect_that, is_number
from .harness import CheckSet, Ctx
from .race import race
from .rules import Sample, discipline_checks, expect_refused, malformed_cases
from .values import HOSTILE_NAMES, KEY_NAMES, json_values, utf8_sorted

checks = CheckSet("check")

#: A lapse_ms no check ever waits out: a lease judged by it is never lapsed.
LONG = 600_000
DONE = {"reply": "done"}


def taken(last: int) -> dict[str, Json]:
    return {"reply": "taken", "last": last}


def took(how: str) -> dict[str, Json]:
    return {"reply": "took", "took": how}


def events(evs: list[Json]) -> dict[str, Json]:
    return {"reply": "events", "events": evs}


def request(agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
    return {"op": op, "agent": agent, **fields}


def append(ctx: Ctx, agent: dict[str, Json], thread: str, seq: Json, **fields: Json) -> dict[str, Json]:
    return ctx.ask(agent, "append", thread=thread, event={"seq": seq, **fields})


def fill(ctx: Ctx, agent: dict[str, Json], thread: str, count: int, **fields: Json) -> list[Json]:
    """Append events 1..count to a new thread, checking each is ``done``; the events."""
    evs = [{"seq": n, **fields} for n in range(1, count + 1)]
    for ev in evs:
        expect(ctx.ask(agent, "append", thread=thread, event=ev), DONE, f"append seq {ev['seq']} to {thread!r}")
    return evs


def lease_rows(ctx: Ctx, agent: dict[str, Json], lapse_ms: int = LONG) -> list[Json]:
    """The agent's leases, in a fixed order (the reply's order is free)."""
    reply = ctx.ask(agent, "leases", lapse_ms=lapse_ms)
    expect_that(reply.get("reply") == "leases" and isinstance(reply.get("leases"), list), "reply to leases",
                '<{"reply":"leases","leases":[...]}>', reply)
    return sorted(reply["leases"], key=lambda row: (str(row.get("thread")), str(row.get("holder"))))


def holders(ctx: Ctx, agent: dict[str, Json]) -> dict[str, str]:
    """thread -> holder of every lease the agent has."""
    return {row["thread"]: row["holder"] for row in lease_rows(ctx, agent)}


def snapshot(ctx: Ctx, agent: dict[str, Json], threads: list[str]) -> Json:
    """Everything of the agent's conversations a refused request could have changed."""
    return {
        "threads": ctx.ask(agent, "threads"),
        "reads": [ctx.ask(agent, "read", thread=t) for t in threads],
        "leases": lease_rows(ctx, agent),
    }


# -- appending and reading


@checks.check
def append_read_last(ctx: Ctx) -> None:
    """Events appended 1, 2, 3 are read back in order from any first; last counts them; nothing kept is empty."""
    a, t = ctx.agent(), "t"
    expect(ctx.ask(a, "last", thread=t), {"reply": "last", "last": 0}, "last of a conversation never written")
    expect(ctx.ask(a, "read", thread=t), events([]), "read of a conversation never written")
    evs = fill(ctx, a, t, 3, text="hello")
    expect(ctx.ask(a, "read", thread=t), events(evs), "read without first")
    for first in (1, 2, 3, 4, 100):
        expect(ctx.ask(a, "read", thread=t, first=first), events(evs[first - 1:]), f"read from first {first}")
    expect(ctx.ask(a, "last", thread=t), {"reply": "last", "last": 3}, "last after 3 appends")
    expect(ctx.ask(a, "read", thread="other"), events([]), "read of another, unwritten conversation")


@checks.check
def append_gaps(ctx: Ctx) -> None:
    """Only seq last+1 is written: gaps and numbers already written are `taken` with the right last."""
    a, t = ctx.agent(), "t"
    expect(append(ctx, a, t, 2, n="gap"), taken(0), "append seq 2 to an empty conversation")
    expect(append(ctx, a, t, 1, n="first"), DONE, "append seq 1")
    expect(append(ctx, a, t, 1, n="again"), taken(1), "append seq 1 a second time")
    expect(append(ctx, a, t, 3, n="gap"), taken(1), "append seq 3 after 1")
    expect(append(ctx, a, t, 7, n="gap"), taken(1), "append seq 7 after 1")
    expect(append(ctx, a, t, 2, n="second"), DONE, "append seq 2 after 1")
    expect(append(ctx, a, t, 2, n="overwrite"), taken(2), "append seq 2 a second time")
    expect(ctx.ask(a, "read", thread=t), events([{"seq": 1, "n": "first"}, {"seq": 2, "n": "second"}]),
           "events after refused appends (none of them written, none changed)")


#: The event a stale appender writes in ``taken_at_a_block_end``: where drivers that pack events in
#: blocks of a power of two (this project's: 32, 64, ...) write a block once it is appended.
BLOCK_END = 32


@checks.check
def taken_at_a_block_end(ctx: Ctx) -> None:
    """An appender told `taken` changed nothing, even at an event that ends a packed block.

    Channel 0 appends events 1 to 31 (so it remembers 31 as the last),
    channel 1 appends 32, then channel 0 appends its own 32: `taken`.  A
    third channel, which never read the conversation, must read channel 1's
    event: a driver that packs from what it sent, not from what was stored,
    rewrites history here without any fault.
    """
    a, t = ctx.agent(), "block"
    assert ctx.transport is not None
    first, second, reader = ctx.transport.sessions(3)
    evs = [{"seq": n} for n in range(1, BLOCK_END)]
    for ev in evs:
        expect(first.request(request(a, "append", thread=t, event=ev)), DONE, f"append seq {ev['seq']}")
    stored = {"seq": BLOCK_END, "by": "the second appender"}
    expect(second.request(request(a, "append", thread=t, event=stored)), DONE, f"another's append of {BLOCK_END}")
    # Its next request is answered once the work its append left behind the reply is done (packing).
    expect(second.request(request(a, "last", thread=t)), {"reply": "last", "last": BLOCK_END}, "last, after it")
    stale = {"seq": BLOCK_END, "by": "the first appender, told taken"}
    expect(first.request(request(a, "append", thread=t, event=stale)), taken(BLOCK_END),
           f"the first appender's append of {BLOCK_END}, after another's")
    expect(reader.request(request(a, "read", thread=t)), events([*evs, stored]),
           "the events read by a third process: the stored one, not the one told taken")


@checks.check
def event_values(ctx: Ctx) -> None:
    """Events come back equal as JSON: big integers exactly, doubles, unicode, NUL, key names, nesting."""
    a, t = ctx.agent(), "values"
    evs: list[Json] = [{"seq": i, "v": v} for i, v in enumerate(json_values(), 1)]
    evs.append({"seq": len(evs) + 1, **KEY_NAMES})
    evs.append({"seq": len(evs) + 1, "op": "remove", "thread": "other", "agent": {"id": "x"}, "reply": "error",
                "events": [], "first": 5, "last": 0})
    for ev in evs:
        expect(ctx.ask(a, "append", thread=t, event=ev), DONE, f"append {ev}")
    got = ctx.ask(a, "read", thread=t)
    expect_that(got.get("reply") == "events" and isinstance(got.get("events"), list) and len(got["events"]) == len(evs),
                "read of the values", f"<{len(evs)} events>", got)
    for sent, back in zip(evs, got["events"], strict=False):
        expect(back, sent, "an event read back")
    middle = len(evs) // 2
    expect(ctx.ask(a, "read", thread=t, first=middle), events(evs[middle - 1:]), f"read from first {middle}")


@checks.check
def threads_sorted(ctx: Ctx) -> None:
    """threads lists conversations with events only, sorted by UTF-8 bytes, each with its last."""
    a = ctx.agent()
    names = ["b", "a", "B", "é", "\uff5e", "\U0001F600", "a b", "a-b", "a/b", "a.b", "ab", "Z", "0"]
    random.shuffle(names)
    lasts = {}
    for i, name in enumerate(names):
        fill(ctx, a, name, i % 3 + 1)
        lasts[name] = i % 3 + 1
    expect(
        ctx.ask(a, "take", thread="lease only", holder="h", lapse_ms=LONG), took("took"), "take a lease on a new thread"
    )
    fill(ctx, a, "removed", 2)
    expect(ctx.ask(a, "remove", thread="removed"), DONE, "remove a conversation")
    if ctx.keeps_tools:
        ctx.ask(a, "tools_narrow", thread="narrowed only", tools=["x"])
    want = [{"thread": n, "last": lasts[n]} for n in utf8_sorted(names)]
    expect(ctx.ask(a, "threads"), {"reply": "threads", "threads": want},
           "threads (not the lease-only, removed or narrowed-only ones)")


@checks.check
def remove(ctx: Ctx) -> None:
    """remove forgets the events and the lease, touches no other thread, and the conversation can start again."""
    a, t = ctx.agent(), "doomed"
    fill(ctx, a, t, 3)
    kept = fill(ctx, a, "kept", 2)
    expect(ctx.ask(a, "take", thread=t, holder="h1", lapse_ms=LONG), took("took"), "take the lease")
    expect(ctx.ask(a, "take", thread="kept", holder="h1", lapse_ms=LONG), took("took"), "take another thread's lease")
    expect(ctx.ask(a, "remove", thread=t), DONE, "remove")
    expect(ctx.ask(a, "read", thread=t), events([]), "read after remove")
    expect(ctx.ask(a, "last", thread=t), {"reply": "last", "last": 0}, "last after remove")
    expect(
        ctx.ask(a, "threads"), {"reply": "threads", "threads": [{"thread": "kept", "last": 2}]}, "threads after remove"
    )
    expect(holders(ctx, a), {"kept": "h1"}, "leases after remove (its lease forgotten, the other kept)")
    expect(ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=LONG), took("took"), "take after remove (no lease left)")
    expect(append(ctx, a, t, 2), taken(0), "append seq 2 after remove")
    expect(append(ctx, a, t, 1, again=True), DONE, "append seq 1 after remove")
    expect(ctx.ask(a, "read", thread=t), events([{"seq": 1, "again": True}]), "read of the conversation made again")
    expect(ctx.ask(a, "read", thread="kept"), events(kept), "read of the thread not removed")
    expect(ctx.ask(a, "remove", thread="never written"), DONE, "remove of a conversation never written")


# -- leases


@checks.check
def lease_take_renew_end(ctx: Ctx) -> None:
    """take/renew/end: took, held for another, renewed by its holder, lost once gone, end only by its holder."""
    a, t = ctx.agent(), "t"
    expect(ctx.ask(a, "renew", thread=t, holder="h1"), {"reply": "lost"}, "renew of a lease never taken")
    expect(ctx.ask(a, "end", thread=t, holder="h1"), DONE, "end of a lease never taken")
    expect(ctx.ask(a, "take", thread=t, holder="h1", lapse_ms=LONG), took("took"), "take a free lease")
    expect(ctx.ask(a, "take", thread=t, holder="h1", lapse_ms=LONG), took("took"), "take again by its holder")
    expect(ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=LONG), took("held"), "take by another holder")
    expect(ctx.ask(a, "renew", thread=t, holder="h1"), DONE, "renew by its holder")
    expect(ctx.ask(a, "renew", thread=t, holder="h2"), {"reply": "lost"}, "renew by another holder")
    expect(ctx.ask(a, "end", thread=t, holder="h2"), DONE, "end by another holder (does nothing)")
    expect(ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=LONG), took("held"), "take after another's end")
    expect(holders(ctx, a), {t: "h1"}, "leases while h1 holds it")
    expect(ctx.ask(a, "end", thread=t, holder="h1"), DONE, "end by its holder")
    expect(lease_rows(ctx, a), [], "leases after end")
    expect(ctx.ask(a, "renew", thread=t, holder="h1"), {"reply": "lost"}, "renew after end")
    expect(ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=LONG), took("took"), "take after end")
    expect(ctx.ask(a, "renew", thread=t, holder="h1"), {"reply": "lost"}, "renew by the holder before")
    expect(holders(ctx, a), {t: "h2"}, "leases after h2 took it")


@checks.check
def lease_lapse_ms(ctx: Ctx) -> None:
    """Lapse is judged to the millisecond: 400 ms old is lapsed at lapse_ms 300; renew and take reset it;
    0 lapses at once."""
    assert ctx.transport is not None
    a, t = ctx.agent(), "t"
    short_ms = max(300, ctx.transport.race_window_ms * 3 // 10)  # longer than two requests take one after another
    expect(ctx.ask(a, "take", thread=t, holder="h1", lapse_ms=LONG), took("took"), "take")
    time.sleep(0.4)
    expect(
        ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=LONG),
        took("held"),
        f"take with lapse_ms {LONG} after 400 ms",
    )
    expect(
        ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=300), took("lapsed"), "take with lapse_ms 300 after 400 ms"
    )
    expect(ctx.ask(a, "renew", thread=t, holder="h1"), {"reply": "lost"}, "renew by the holder it lapsed from")
    expect(ctx.ask(a, "renew", thread=t, holder="h2"), DONE, "renew by the holder that took it")
    time.sleep(short_ms / 1000 + 0.2)
    expect(ctx.ask(a, "renew", thread=t, holder="h2"), DONE, "renew")
    expect(ctx.ask(a, "take", thread=t, holder="h3", lapse_ms=short_ms), took("held"),
           f"take with lapse_ms {short_ms} just after a renew (renew resets the lapse)")
    time.sleep(short_ms / 1000 + 0.2)
    expect(ctx.ask(a, "take", thread=t, holder="h2", lapse_ms=LONG), took("took"), "take by its holder")
    expect(ctx.ask(a, "take", thread=t, holder="h3", lapse_ms=short_ms), took("held"),
           f"take with lapse_ms {short_ms} just after its holder took it again (that renews it)")
    expect(ctx.ask(a, "take", thread=t, holder="h3", lapse_ms=0), took("lapsed"), "take by another with lapse_ms 0")
    expect(holders(ctx, a), {t: "h3"}, "leases after h3 took it")


@checks.check
def leases_fields(ctx: Ctx) -> None:
    """leases: exactly thread, holder, started, renewed (seconds, millisecond precision), lapsed (bool, by lapse_ms)."""
    a = ctx.agent()
    before = time.time()
    expect(ctx.ask(a, "take", thread="t1", holder="h1", lapse_ms=LONG), took("took"), "take t1")
    expect(ctx.ask(a, "take", thread="t2", holder="h\u00002", lapse_ms=LONG), took("took"), "take t2")
    old_taken = time.time()
    time.sleep(0.4)
    renew_sent = time.time()
    expect(ctx.ask(a, "renew", thread="t1", holder="h1"), DONE, "renew t1")
    rows = lease_rows(ctx, a)
    after = time.time()
    expect_that([(r.get("thread"), r.get("holder")) for r in rows] == [("t1", "h1"), ("t2", "h\u00002")],
                "the leases' threads and holders", [["t1", "h1"], ["t2", "h\u00002"]], rows)
    stamps: list[float] = []
    for row in rows:
        expect_that(set(row) == {"thread", "holder", "started", "renewed", "lapsed"}, "a lease's fields",
                    ["holder", "lapsed", "renewed", "started", "thread"], sorted(row))
        for key in ("started", "renewed"):
            expect_that(is_number(row[key]) and before - 60 <= row[key] <= after + 60, f"{key} of {row['thread']}",
                        f"<seconds since 1970, near {after:.3f}>", row[key])
            stamps.append(row[key])
        expect_that(row["renewed"] >= row["started"], f"renewed of {row['thread']}", "<not before started>", row)
        expect(row["lapsed"], False, f"lapsed of {row['thread']} at lapse_ms {LONG}")
    gap = rows[0]["renewed"] - rows[0]["started"]
    expect_that(0.3 <= gap <= 30, "renewed - started of t1, renewed 400 ms after it was taken",
                "<about 0.4 s: millisecond precision>", gap)
    expect_that(any(float(s) != int(s) for s in stamps), "started and renewed", "<millisecond precision>", stamps)
    sent = time.time()
    judged = lease_rows(ctx, a, lapse_ms=250)
    expect_that(len(judged) == 2, "leases at lapse_ms 250", "<the same 2 leases>", judged)
    expect(judged[1]["lapsed"], True, "lapsed of t2 at lapse_ms 250, taken 400 ms before")
    if time.time() - renew_sent < 0.25 and sent - old_taken >= 0.25:  # only when this run's timing makes it certain
        expect(judged[0]["lapsed"], False, "lapsed of t1 at lapse_ms 250, renewed just before")


# -- races


@checks.check
def race_append(ctx: Ctx) -> None:
    """8 writers of one seq at once: exactly one `done`, 7 `taken` with last = that seq, the winner's event kept."""
    a = ctx.agent()
    for round_ in range(ctx.rounds):
        t = f"race-{round_}"
        fill(ctx, a, t, round_)
        seq = round_ + 1
        replies = race(ctx, [request(a, "append", thread=t, event={"seq": seq, "writer": w}) for w in range(8)])
        winners = [w for w, r in enumerate(replies) if r == DONE]
        expect_that(
            len(winners) == 1, f"round {round_}: replies of 8 appenders of seq {seq}", "<exactly one done>", replies
        )
        for reply in replies:
            if reply != DONE:
                expect(reply, taken(seq), f"round {round_}: a losing appender's reply")
        got = ctx.ask(a, "read", thread=t, first=seq)
        expect(got, events([{"seq": seq, "writer": winners[0]}]), f"round {round_}: the event written")
        expect(ctx.ask(a, "last", thread=t), {"reply": "last", "last": seq}, f"round {round_}: last")


def _race_takers(ctx: Ctx, a: dict[str, Json], t: str, lapse_ms: int, winner_says: str, round_: int) -> None:
    """Release 4 takers of ``t``; exactly one gets ``winner_says``, the rest ``held``, and the lease is the winner's."""
    replies = race(ctx, [request(a, "take", thread=t, holder=f"taker-{i}", lapse_ms=lapse_ms) for i in range(4)])
    winners = [i for i, r in enumerate(replies) if r == took(winner_says)]
    expect_that(
        len(winners) == 1,
        f"round {round_}: replies of 4 takers",
        f"<exactly one {winner_says!r}, the rest held>",
        replies,
    )
    for reply in replies:
        if reply != took(winner_says):
            expect(reply, took("held"), f"round {round_}: a losing taker's reply")
    expect(holders(ctx, a).get(t), f"taker-{winners[0]}", f"round {round_}: the lease's holder")
    expect(ctx.ask(a, "renew", thread=t, holder=f"taker-{winners[0]}"), DONE, f"round {round_}: renew by the winner")
    loser = (winners[0] + 1) % 4
    expect(
        ctx.ask(a, "renew", thread=t, holder=f"taker-{loser}"), {"reply": "lost"}, f"round {round_}: renew by a loser"
    )


@checks.check
def race_take_free(ctx: Ctx) -> None:
    """4 takers of one free lease at once: exactly one `took`, 3 `held`."""
    a = ctx.agent()
    for round_ in range(ctx.rounds):
        _race_takers(ctx, a, f"free-{round_}", LONG, "took", round_)


@checks.check
def race_take_lapsed(ctx: Ctx) -> None:
    """4 takers of one lapsed lease at once: exactly one `lapsed`, 3 `held`; the old holder has lost it."""
    assert ctx.transport is not None
    a = ctx.agent()
    window = ctx.transport.race_window_ms  # the takers reach the driver within this of each other
    for round_ in range(ctx.rounds):
        expect(ctx.ask(a, "take", thread=f"lapsed-{round_}", holder="old", lapse_ms=LONG), took("took"), "take by old")
    time.sleep(window / 1000 + 0.1)  # every round's old lease is lapsed from here on
    for round_ in range(ctx.rounds):
        t = f"lapsed-{round_}"
        _race_takers(ctx, a, t, window, "lapsed", round_)
        expect(
            ctx.ask(a, "renew", thread=t, holder="old"), {"reply": "lost"}, f"round {round_}: renew by the old holder"
        )


# -- names and agents


@checks.check
def agents_apart(ctx: Ctx) -> None:
    """Owner null, "" and "x" are three agents; joined names never collide; nothing of one is seen by another."""
    base, o = ctx.agent()["id"], ctx.agent()["owner"]
    agents = [
        {"id": base, "owner": None}, {"id": base, "owner": ""}, {"id": base, "owner": "x"},
        {"id": base, "owner": o}, {"id": o, "owner": base},  # id and owner swapped
        {"id": "a/b", "owner": o + "/x"}, {"id": "x/a/b", "owner": o},  # equal once joined with "/"
        {"id": f"../{base}", "owner": "/"}, {"id": base + "%2F..", "owner": "%"},
    ]
    t = "shared"
    for i, agent in enumerate(agents):
        fill(ctx, agent, t, i + 1, who=i)
        expect(ctx.ask(agent, "take", thread=t, holder=f"h{i}", lapse_ms=LONG), took("took"), f"agent {i}: take")

    def each_sees_its_own(skip: int = -1) -> None:
        for i, agent in enumerate(agents):
            if i == skip:
                continue
            expect(ctx.ask(agent, "read", thread=t), events([{"seq": n, "who": i} for n in range(1, i + 2)]),
                   f"agent {i} ({agent}): read")
            expect(ctx.ask(agent, "threads"), {"reply": "threads", "threads": [{"thread": t, "last": i + 1}]},
                   f"agent {i}: threads")
            expect(holders(ctx, agent), {t: f"h{i}"}, f"agent {i}: leases")

    each_sees_its_own()
    no_owner = {"id": base}
    expect(
        ctx.ask(no_owner, "last", thread=t),
        {"reply": "last", "last": 1},
        "last of an agent with owner left out (= null)",
    )
    expect(ctx.ask(agents[1], "remove", thread=t), DONE, 'agent with owner "": remove')
    expect(ctx.ask(agents[1], "read", thread=t), events([]), 'agent with owner "": read after its remove')
    each_sees_its_own(skip=1)
    stranger = ctx.agent(owner=o)
    expect(
        ctx.ask(stranger, "threads"), {"reply": "threads", "threads": []}, "threads of another agent of the same owner"
    )


@checks.check
def hostile_names(ctx: Ctx) -> None:
    """Threads and holders named `/`, `..`, `%`, unicode, spaces, newline, NUL, "" are kept apart, exactly."""
    a = ctx.agent()
    for i, name in enumerate(HOSTILE_NAMES):
        fill(ctx, a, name, i % 2 + 1, name=name)
        expect(ctx.ask(a, "take", thread=name, holder=name, lapse_ms=LONG), took("took"), f"take {name!r} as {name!r}")
    want = [{"thread": n, "last": HOSTILE_NAMES.index(n) % 2 + 1} for n in utf8_sorted(HOSTILE_NAMES)]
    expect(ctx.ask(a, "threads"), {"reply": "threads", "threads": want}, "threads")
    for i, name in enumerate(HOSTILE_NAMES):
        expect(ctx.ask(a, "read", thread=name), events([{"seq": n, "name": name} for n in range(1, i % 2 + 2)]),
               f"read {name!r}")
    expect(holders(ctx, a), {n: n for n in HOSTILE_NAMES}, "leases")


# -- refusals


@checks.check
def refuse_malformed(ctx: Ctx) -> None:
    """Invalid JSON, non-objects, unknown ops and bad agents get an error reply and change nothing."""
    a, t = ctx.agent(), "t"
    fill(ctx, a, t, 1)
    expect_refused(ctx, malformed_cases(request(a, "append", thread=t, event={"seq": 2})),
                   lambda: snapshot(ctx, a, [t]))


@checks.check
def refuse_bad_append(ctx: Ctx) -> None:
    """append with seq 0, 1.0, true, "2", null, no seq, or a non-object event or thread is refused, nothing written."""
    a, t, empty = ctx.agent(), "t", "empty"
    fill(ctx, a, t, 1)

    def bad(label: str, thread: Json, event: Json, **extra: Json) -> tuple[str, Json]:
        return label, request(a, "append", thread=thread, event=event, **extra)

    cases = [
        bad("seq 0", empty, {"seq": 0}), bad("seq -1", t, {"seq": -1}),
        bad("seq 2.0 where 2 is next", t, {"seq": 2.0}), bad("seq 1.0 on an empty thread", empty, {"seq": 1.0}),
        bad("seq true on an empty thread", empty, {"seq": True}), bad('seq "2"', t, {"seq": "2"}),
        bad("seq null", empty, {"seq": None}), bad("no seq", empty, {"x": 1}), bad("seq [2]", t, {"seq": [2]}),
        bad("event an array", empty, [{"seq": 1}]), bad("event a string", empty, '{"seq": 1}'),
        bad("event null", empty, None), ("no event", request(a, "append", thread=empty)),
        bad("thread a number", 5, {"seq": 1}), bad("thread null", None, {"seq": 1}),
        ("no thread", request(a, "append", event={"seq": 1})),
    ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a, [t, empty, "5"]))


@checks.check
def refuse_bad_args(ctx: Ctx) -> None:
    """read/last/take/renew/end/leases/remove with missing or mistyped fields (1.0, true, "1", <0) change nothing."""
    a, t = ctx.agent(), "t"
    fill(ctx, a, t, 2)
    expect(ctx.ask(a, "take", thread=t, holder="h1", lapse_ms=LONG), took("took"), "take")
    r = lambda op, **f: request(a, op, **f)  # noqa: E731
    cases = [
        ("read: first 0", r("read", thread=t, first=0)),
        ("read: first -1", r("read", thread=t, first=-1)),
        ("read: first 1.0", r("read", thread=t, first=1.0)),
        ('read: first "1"', r("read", thread=t, first="1")),
        ("read: first true", r("read", thread=t, first=True)),
        ("read: no thread", r("read")),
        ("read: thread a number", r("read", thread=5)),
        ("last: no thread", r("last")),
        ("last: thread null", r("last", thread=None)),
        ("take: no holder", r("take", thread=t, lapse_ms=LONG)),
        ("take: holder a number", r("take", thread=t, holder=1, lapse_ms=LONG)),
        ("take: no lapse_ms", r("take", thread=t, holder="h1")),
        ("take: lapse_ms -1", r("take", thread=t, holder="h1", lapse_ms=-1)),
        ("take: lapse_ms 1.0", r("take", thread=t, holder="h1", lapse_ms=1.0)),
        ('take: lapse_ms "100"', r("take", thread=t, holder="h1", lapse_ms="100")),
        ("take: lapse_ms true", r("take", thread=t, holder="h1", lapse_ms=True)),
        ("take: lapse_ms null", r("take", thread=t, holder="h1", lapse_ms=None)),
        ("take: no thread", r("take", holder="h1", lapse_ms=LONG)),
        ("take by another: lapse_ms 0.0", r("take", thread=t, holder="h2", lapse_ms=0.0)),
        ("renew: no holder", r("renew", thread=t)),
        ("renew: no thread", r("renew", holder="h1")),
        ("end: no holder", r("end", thread=t)),
        ("end: holder a number", r("end", thread=t, holder=1)),
        ("end: holder a list", r("end", thread=t, holder=["h1"])),
        ("end: no thread", r("end", holder="h1")),
        ("leases: lapse_ms -1", r("leases", lapse_ms=-1)),
        ('leases: lapse_ms "1"', r("leases", lapse_ms="1")),
        ("leases: lapse_ms 1.5", r("leases", lapse_ms=1.5)),
        ("leases: lapse_ms true", r("leases", lapse_ms=True)),
        ("remove: no thread", r("remove")),
        ("remove: thread a number", r("remove", thread=5)),
        ("remove: thread a list", r("remove", thread=[t])),
    ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a, [t, "5"]))


def _samples(ctx: Ctx) -> list[Sample]:
    a, t = ctx.agent(), "t"
    return [
        Sample("append seq 1", request(a, "append", thread=t, event={"seq": 1}), False),
        Sample("append seq 1 again", request(a, "append", thread=t, event={"seq": 1}), False),
        Sample("read", request(a, "read", thread=t), False),
        Sample("last", request(a, "last", thread=t), False),
        Sample("threads", request(a, "threads"), False),
        Sample("take", request(a, "take", thread=t, holder="h", lapse_ms=LONG), False),
        Sample("leases", request(a, "leases", lapse_ms=LONG), False),
        Sample("invalid JSON", b'{"op": "last", ', True),
        Sample("an array", b"[]", True),
        Sample("an unknown op", request(a, "frobnicate"), True),
        Sample("seq 0", request(a, "append", thread=t, event={"seq": 0}), True),
        Sample("seq 2.0", request(a, "append", thread=t, event={"seq": 2.0}), True),
        Sample("an empty stdin", b"", True, in_serve=False),
    ]


discipline_checks(checks, _samples)

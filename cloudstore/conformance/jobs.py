"""Family ``check_jobs``: an agent's scheduled jobs, their places, marks and day counts.

``job_next`` answers for every agent in the store (docs/protocol.md), so a run cannot
know what else is waiting there: the check puts dues far in the past that are
certainly the soonest, judges job_next against those, and removes them again.
Every other job this family leaves waiting is due far in the future
(:data:`FUTURE`) so it never becomes anyone's soonest.
"""

from __future__ import annotations

import random

from .expect import CheckFailed, Json, expect, expect_error, expect_that, is_int, is_number
from .harness import CheckSet, Ctx
from .race import race
from .rules import Sample, discipline_checks, expect_refused, malformed_cases
from .values import KEY_NAMES, json_values

checks = CheckSet("check_jobs")
not_kept = CheckSet("check_jobs")

PLACES = ("waiting", "firing", "ending")
#: 2100-01-01: dues of waiting jobs that must never be the store's soonest.
FUTURE = 4_102_444_800
SPEC_MAX = 1024 * 1024
DONE = {"reply": "done"}


_FOR_ID = object()


def job(id: str, spec: Json = _FOR_ID, due: Json = FUTURE) -> dict[str, Json]:
    """A job; its spec names it unless one is given (None is a spec too: null)."""
    return {"id": id, "spec": {"for": id} if spec is _FOR_ID else spec, "due": due}


def request(agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
    return {"op": op, "agent": agent, **fields}


def put(ctx: Ctx, agent: dict[str, Json], place: str, j: dict[str, Json]) -> None:
    expect(ctx.ask(agent, "job_put", place=place, job=j), DONE, f"job_put {j['id']!r} in {place}")


def got(j: Json) -> dict[str, Json]:
    return {"reply": "job", "job": j}


def found(yes: bool) -> dict[str, Json]:
    return {"reply": "found", "found": yes}


def shift(ctx: Ctx, agent: dict[str, Json], id: str, src: str, dst: str) -> dict[str, Json]:
    return ctx.ask(agent, "job_shift", id=id, **{"from": src, "to": dst})


def listed(ctx: Ctx, agent: dict[str, Json], place: str) -> list[Json]:
    """The jobs in ``place``, sorted by id (the reply's order is free)."""
    reply = ctx.ask(agent, "job_list", place=place)
    expect_that(
        reply.get("reply") == "jobs" and isinstance(reply.get("jobs"), list) and set(reply) == {"reply", "jobs"},
        f"job_list {place}",
        '<{"reply":"jobs","jobs":[...]}>',
        reply,
    )
    return sorted(reply["jobs"], key=lambda j: str(j.get("id")) if isinstance(j, dict) else "")


def count(n: int) -> dict[str, Json]:
    return {"reply": "count", "count": n}


def snapshot(ctx: Ctx, agent: dict[str, Json]) -> Json:
    """Every job of the agent in every place, the counts and the day (the mark may change at any time)."""
    return {
        "lists": {p: listed(ctx, agent, p) for p in PLACES},
        "counts": {p: ctx.ask(agent, "job_count", place=p) for p in PLACES},
        "day": ctx.ask(agent, "job_day"),
    }


def job_next(ctx: Ctx, agent: dict[str, Json]) -> Json:
    reply = ctx.ask(agent, "job_next")
    expect_that(set(reply) == {"reply", "next"} and reply["reply"] == "next"
                and (reply["next"] is None or is_number(reply["next"])),
                "reply to job_next", '<{"reply":"next","next":<number or null>}>', reply)
    return reply["next"]


def mark(ctx: Ctx, agent: dict[str, Json]) -> int:
    reply = ctx.ask(agent, "job_mark")
    expect_that(set(reply) == {"reply", "mark"} and reply["reply"] == "mark" and is_int(reply["mark"]),
                "reply to job_mark", '<{"reply":"mark","mark":<integer>}>', reply)
    return reply["mark"]


# -- the operations


@checks.check
def put_get_remove(ctx: Ctx) -> None:
    """job_put keeps a job (replacing one of its id), job_get answers it or null, job_remove says whether it was
    there."""
    a = ctx.agent()
    expect(ctx.ask(a, "job_get", place="waiting", id="j1"), got(None), "job_get of a job never put")
    first, second = job("j1", {"n": 1}, FUTURE + 0.5), job("j1", {"n": 2}, FUTURE + 7)
    put(ctx, a, "waiting", first)
    expect(ctx.ask(a, "job_get", place="waiting", id="j1"), got(first), "job_get after job_put")
    put(ctx, a, "waiting", second)
    expect(ctx.ask(a, "job_get", place="waiting", id="j1"), got(second), "job_get after a second job_put of the id")
    expect(ctx.ask(a, "job_count", place="waiting"), count(1), "job_count after replacing")
    expect(ctx.ask(a, "job_remove", place="waiting", id="j1"), found(True), "job_remove of a job there")
    expect(ctx.ask(a, "job_remove", place="waiting", id="j1"), found(False), "job_remove again")
    expect(ctx.ask(a, "job_get", place="waiting", id="j1"), got(None), "job_get after job_remove")
    expect(ctx.ask(a, "job_remove", place="firing", id="never"), found(False), "job_remove of a job never put")


@checks.check
def places_apart(ctx: Ctx) -> None:
    """One id in waiting, firing and ending is three jobs: each place answers its own."""
    a = ctx.agent()
    by_place = {p: job("same", {"place": p}, FUTURE + i) for i, p in enumerate(PLACES)}
    for p, j in by_place.items():
        put(ctx, a, p, j)
    for p, j in by_place.items():
        expect(ctx.ask(a, "job_get", place=p, id="same"), got(j), f"job_get in {p}")
    expect(ctx.ask(a, "job_remove", place="firing", id="same"), found(True), "job_remove from firing")
    expect(ctx.ask(a, "job_get", place="firing", id="same"), got(None), "job_get in firing after its removal")
    for p in ("waiting", "ending"):
        expect(ctx.ask(a, "job_get", place=p, id="same"), got(by_place[p]), f"job_get in {p} after firing's removal")


@checks.check
def list_count(ctx: Ctx) -> None:
    """job_list answers every job of a place, job_count how many; an empty place answers [] and 0."""
    a = ctx.agent()
    waiting = [job(i, {"i": i}, FUTURE + n) for n, i in enumerate(["w0", "w1", "日本", "a b", "w/4"])]
    firing = [job("f0"), job("f1", [1, 2])]
    for j in waiting:
        put(ctx, a, "waiting", j)
    for j in firing:
        put(ctx, a, "firing", j)
    key = lambda j: j["id"]  # noqa: E731
    expect(listed(ctx, a, "waiting"), sorted(waiting, key=key), "job_list waiting")
    expect(listed(ctx, a, "firing"), sorted(firing, key=key), "job_list firing")
    expect(listed(ctx, a, "ending"), [], "job_list of an empty place")
    for p, n in (("waiting", 5), ("firing", 2), ("ending", 0)):
        expect(ctx.ask(a, "job_count", place=p), count(n), f"job_count {p}")


@checks.check
def values_exact(ctx: Ctx) -> None:
    """A job's spec and due come back equal as JSON: big integers, doubles, null/false/0/"" specs, key names."""
    a = ctx.agent()
    jobs = [
        job("all values", json_values(), FUTURE + 0.123), job("null spec", None, FUTURE), job("false", False),
        job("zero", 0), job("empty", ""), job("keys", KEY_NAMES), job("big due", 1, 2**70),
        job("float due", 1, 15_000_000_000.25), job("int due", 1, FUTURE + 1),
    ]
    for j in jobs:
        put(ctx, a, "ending", j)
    for j in jobs:
        expect(ctx.ask(a, "job_get", place="ending", id=j["id"]), got(j), f"job_get {j['id']!r}")
    expect(listed(ctx, a, "ending"), sorted(jobs, key=lambda j: j["id"]), "job_list ending")


@checks.check
def ids_within_limits(ctx: Ctx) -> None:
    """Job ids up to 256 UTF-8 bytes of any non-control characters (`/`, `..`, `%`, emoji) are kept apart, exactly."""
    a = ctx.agent()
    ids = [
        "a" * 256,
        "é" * 128,
        "🎉" * 64,
        "\u00a0nbsp",
        "a/b/../c",
        "%2F",
        "..",
        "/",
        " ",
        "日本",
        "x",
        "X",
        "e\u0301",
        "\u00e9",
    ]
    for n, i in enumerate(ids):
        put(ctx, a, "ending", job(i, {"n": n}))
    for n, i in enumerate(ids):
        expect(ctx.ask(a, "job_get", place="ending", id=i), got(job(i, {"n": n})), f"job_get {i[:20]!r}")
    expect(ctx.ask(a, "job_count", place="ending"), count(len(ids)), "job_count")


@checks.check
def spec_limit(ctx: Ctx) -> None:
    """A spec of exactly 1 MiB as compact UTF-8 JSON is kept; one byte more is refused, nothing changed."""
    a = ctx.agent()
    ascii_max = job("ascii", "x" * (SPEC_MAX - 2))  # the quotes are the other 2 bytes
    utf8_max = job("utf8", "é" * ((SPEC_MAX - 2) // 2))  # 2 bytes a character in UTF-8
    for j in (ascii_max, utf8_max):
        put(ctx, a, "ending", j)
        expect(ctx.ask(a, "job_get", place="ending", id=j["id"]), got(j), f"job_get of the 1 MiB spec {j['id']!r}")
    over = [
        ("a spec of 1 MiB + 1 byte", job("ascii", "x" * (SPEC_MAX - 1))),
        ("a spec of 1 MiB + 2 bytes in 2-byte characters", job("utf8", "é" * ((SPEC_MAX - 2) // 2 + 1))),
        ("a new job with a spec past 1 MiB", job("new", ["y" * (SPEC_MAX // 2)] * 2)),
    ]
    expect_refused(ctx, [(label, request(a, "job_put", place="ending", job=j)) for label, j in over],
                   lambda: snapshot(ctx, a))


# -- shifting and the races


@checks.check
def shift_moves(ctx: Ctx) -> None:
    """job_shift moves the whole job, replacing one of its id where it goes; found false for none, nothing moved."""
    a = ctx.agent()
    j = job("j", {"n": 1}, FUTURE + 0.25)
    put(ctx, a, "waiting", j)
    expect(shift(ctx, a, "j", "waiting", "firing"), found(True), "job_shift waiting to firing")
    expect(ctx.ask(a, "job_get", place="waiting", id="j"), got(None), "job_get in waiting after the shift")
    expect(ctx.ask(a, "job_get", place="firing", id="j"), got(j), "job_get in firing after the shift")
    expect(shift(ctx, a, "j", "waiting", "firing"), found(False), "job_shift of a job not in from")
    put(ctx, a, "ending", job("j", {"old": True}))
    expect(shift(ctx, a, "j", "firing", "ending"), found(True), "job_shift onto a job of the same id")
    expect(ctx.ask(a, "job_get", place="ending", id="j"), got(j), "job_get in ending (replaced by the shifted job)")
    expect(ctx.ask(a, "job_get", place="firing", id="j"), got(None), "job_get in firing after shifting out")
    before = snapshot(ctx, a)
    expect(shift(ctx, a, "missing", "waiting", "ending"), found(False), "job_shift of an id never put")
    expect(snapshot(ctx, a), before, "jobs after a job_shift that found nothing")


@checks.check
def race_shift(ctx: Ctx) -> None:
    """8 shifters of one job at once: exactly one found true; the job ends whole in exactly one place."""
    a = ctx.agent()
    for round_ in range(ctx.rounds):
        j = job(f"race-{round_}", {"round": round_, "payload": list(range(50))}, FUTURE + round_)
        put(ctx, a, "waiting", j)
        targets = ["firing" if i % 2 == 0 else "ending" for i in range(8)]
        replies = race(ctx, [request(a, "job_shift", id=j["id"], **{"from": "waiting", "to": to}) for to in targets])
        winners = [i for i, r in enumerate(replies) if r == found(True)]
        expect_that(len(winners) == 1, f"round {round_}: replies of 8 shifters", "<exactly one found true>", replies)
        for reply in replies:
            if reply != found(True):
                expect(reply, found(False), f"round {round_}: a losing shifter's reply")
        where = {p: ctx.ask(a, "job_get", place=p, id=j["id"]) for p in PLACES}
        want = {p: got(j if p == targets[winners[0]] else None) for p in PLACES}
        expect(where, want, f"round {round_}: the job in each place afterwards")


@checks.check
def next_across_agents(ctx: Ctx) -> None:
    """job_next is the soonest due waiting for ANY agent of the store, never one firing or ending."""
    a, b = ctx.agent(), ctx.agent()
    mine: list[tuple[dict[str, Json], str, str]] = []  # what to remove again, whatever happens

    def place(agent: dict[str, Json], where: str, j: dict[str, Json]) -> None:
        mine.append((agent, where, j["id"]))
        put(ctx, agent, where, j)

    try:
        due = None
        for low, high in ((200_000, 1_000_000), (20_000, 200_000), (2_000, 20_000), (200, 2_000)):
            due = random.randrange(low, high) / 1000  # far in the past: the store's soonest, unless another run's is
            place(a, "waiting", job("a-soonest", {"n": 1}, due))
            answer = job_next(ctx, a)
            if answer == due:
                break
            expect_that(is_number(answer) and answer < due, "job_next with a due far in the past waiting",
                        due, answer)
            ctx.ask(a, "job_remove", place="waiting", id="a-soonest")  # another's is sooner: go lower
        else:
            raise CheckFailed("job_next", "<a due this check put, the soonest in the store>",
                              "<other waiting jobs in this store due sooner than 0.2 s after 1970>")
        earlier, fired, ended = round(due / 2, 3), round(due / 4, 3), round(due / 8, 3)
        place(b, "waiting", job("b-sooner", {"n": 2}, earlier))
        expect(job_next(ctx, a), earlier, "job_next asked by agent A, agent B (another owner) having a sooner job")
        expect(job_next(ctx, b), earlier, "job_next asked by agent B")
        place(a, "firing", job("a-firing", {}, fired))
        place(a, "ending", job("a-ending", {}, ended))
        expect(job_next(ctx, a), earlier, "job_next with sooner jobs firing and ending (not waiting)")
        expect(shift(ctx, b, "b-sooner", "waiting", "firing"), found(True), "job_shift B's job to firing")
        expect(job_next(ctx, a), due, "job_next after B's job left waiting")
        expect(ctx.ask(a, "job_remove", place="waiting", id="a-soonest"), found(True), "job_remove A's job")
        answer = job_next(ctx, a)
        expect_that(answer not in (due, earlier, fired, ended), "job_next after every job of this check left waiting",
                    "<null or another agent's due>", answer)
    finally:
        for agent, where, id in mine:
            try:
                ctx.ask(agent, "job_remove", place=where, id=id)
            except Exception:  # noqa: BLE001 - cleaning up after a failure already reported
                pass


@checks.check
def mark_changes(ctx: Ctx) -> None:
    """job_mark is an integer that changes, never to a value seen before, on every put, shift or remove in waiting."""
    a = ctx.agent()
    seen = [mark(ctx, a)]

    def then(label: str, reply: Json, want: Json) -> None:
        expect(reply, want, label)
        now = mark(ctx, a)
        expect_that(now not in seen, f"job_mark after {label}", f"<an integer other than {seen}>", now)
        seen.append(now)

    then("job_put in waiting", ctx.ask(a, "job_put", place="waiting", job=job("m1")), DONE)
    then("job_put replacing in waiting", ctx.ask(a, "job_put", place="waiting", job=job("m1", {"v": 2})), DONE)
    then("another job_put in waiting", ctx.ask(a, "job_put", place="waiting", job=job("m2")), DONE)
    then("job_shift out of waiting", shift(ctx, a, "m1", "waiting", "firing"), found(True))
    then("job_shift into waiting", shift(ctx, a, "m1", "firing", "waiting"), found(True))
    then("job_remove from waiting", ctx.ask(a, "job_remove", place="waiting", id="m2"), found(True))
    then("job_shift from waiting to ending", shift(ctx, a, "m1", "waiting", "ending"), found(True))


@checks.check
def day(ctx: Ctx) -> None:
    """job_day answers 0 and 0 until job_set_day; then the day and sent last set, each agent its own."""
    a, b = ctx.agent(), ctx.agent()
    expect(ctx.ask(a, "job_day"), {"reply": "day", "day": 0, "sent": 0}, "job_day never set")
    for d, s in ((19_000, 5), (19_001, 0), (2**40, 2**40)):
        expect(ctx.ask(a, "job_set_day", day=d, sent=s), DONE, f"job_set_day {d} {s}")
        expect(ctx.ask(a, "job_day"), {"reply": "day", "day": d, "sent": s}, f"job_day after setting {d} {s}")
    expect(ctx.ask(b, "job_day"), {"reply": "day", "day": 0, "sent": 0}, "job_day of another agent")


@checks.check
def agents_apart(ctx: Ctx) -> None:
    """Owner null, "" and "x" are three agents: one id's jobs, days and removals stay each agent's own."""
    base = ctx.agent()["id"]
    agents = [{"id": base, "owner": None}, {"id": base, "owner": ""}, {"id": base, "owner": "x"}, ctx.agent()]
    mine = [job("same", {"agent": i}, FUTURE + i) for i in range(len(agents))]
    for i, agent in enumerate(agents):
        put(ctx, agent, "waiting", mine[i])
        expect(ctx.ask(agent, "job_set_day", day=100 + i, sent=i), DONE, f"agent {i}: job_set_day")
    expect(ctx.ask(agents[1], "job_remove", place="waiting", id="same"), found(True), 'owner "": job_remove')
    expect(shift(ctx, agents[2], "same", "waiting", "firing"), found(True), 'owner "x": job_shift to firing')
    for i, agent in enumerate(agents):
        want_waiting = [] if i in (1, 2) else [mine[i]]
        expect(listed(ctx, agent, "waiting"), want_waiting, f"agent {i} ({agent}): job_list waiting")
        expect(listed(ctx, agent, "firing"), [mine[i]] if i == 2 else [], f"agent {i}: job_list firing")
        expect(ctx.ask(agent, "job_day"), {"reply": "day", "day": 100 + i, "sent": i}, f"agent {i}: job_day")
    expect(ctx.ask({"id": base}, "job_get", place="waiting", id="same"), got(mine[0]),
           "job_get by the agent with owner left out (= null)")


# -- refusals


@checks.check
def refuse_malformed(ctx: Ctx) -> None:
    """Invalid JSON, non-objects, unknown ops and bad agents get an error reply and change nothing."""
    a = ctx.agent()
    put(ctx, a, "waiting", job("kept"))
    expect_refused(
        ctx, malformed_cases(request(a, "job_put", place="waiting", job=job("new"))), lambda: snapshot(ctx, a)
    )


@checks.check
def refuse_bad_place(ctx: Ctx) -> None:
    """A place other than waiting/firing/ending (case, spaces, "", null, 5, missing) is refused by every op."""
    a = ctx.agent()
    put(ctx, a, "waiting", job("j"))
    cases: list[tuple[str, Json]] = []
    missing = object()
    for bad in ("Waiting", "", "nowhere", "waiting ", None, 5, ["waiting"], missing):
        shown = "no place" if bad is missing else f"place {bad!r}"
        given = {} if bad is missing else {"place": bad}
        cases += [
            (f"job_put, {shown}", request(a, "job_put", job=job("new"), **given)),
            (f"job_get, {shown}", request(a, "job_get", id="j", **given)),
            (f"job_remove, {shown}", request(a, "job_remove", id="j", **given)),
            (f"job_list, {shown}", request(a, "job_list", **given)),
            (f"job_count, {shown}", request(a, "job_count", **given)),
            (f"job_shift, from {shown}", request(a, "job_shift", id="j", to="firing",
                                                   **({} if bad is missing else {"from": bad}))),
            (f"job_shift, to {shown}", request(a, "job_shift", id="j", **{"from": "waiting"},
                                                 **({} if bad is missing else {"to": bad}))),
        ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a))


BAD_IDS: list[tuple[str, Json]] = [
    ("empty", ""), ("a newline", "a\nb"), ("NUL", "nul\u0000"), ("DEL (U+007F)", "a\u007f"),
    ("U+0085", "a\u0085"), ("U+009F", "\u009f"), ("U+001F", "\u001f"), ("257 bytes", "a" * 257),
    ("258 bytes in 2-byte characters", "é" * 129), ("257 bytes with emoji", "🎉" * 64 + "a"),
    ("a number", 5), ("null", None), ("a list", ["j"]),
]


@checks.check
def refuse_bad_id(ctx: Ctx) -> None:
    """An id that is empty, has a control character, passes 256 bytes or is not a string is refused by every op."""
    a = ctx.agent()
    put(ctx, a, "waiting", job("j"))
    cases: list[tuple[str, Json]] = []
    for label, bad in BAD_IDS:
        cases += [
            (f"job_put, id {label}", request(a, "job_put", place="waiting", job=job(bad))),
            (f"job_get, id {label}", request(a, "job_get", place="waiting", id=bad)),
            (f"job_remove, id {label}", request(a, "job_remove", place="waiting", id=bad)),
            (f"job_shift, id {label}", request(a, "job_shift", id=bad, **{"from": "waiting", "to": "firing"})),
        ]
    cases += [
        ("job_get, no id", request(a, "job_get", place="waiting")),
        ("job_remove, no id", request(a, "job_remove", place="waiting")),
        ("job_shift, no id", request(a, "job_shift", **{"from": "waiting", "to": "firing"})),
    ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a))


@checks.check
def refuse_bad_job(ctx: Ctx) -> None:
    """job_put of a job that is not an object, lacks id/spec/due, or has a due that is not a number is refused."""
    a = ctx.agent()
    put(ctx, a, "waiting", job("j"))
    whole = job("new")
    without = lambda key: {k: v for k, v in whole.items() if k != key}  # noqa: E731
    bad_jobs: list[tuple[str, Json]] = [
        ("a string", "new"), ("a list", [whole]), ("null", None), ("without id", without("id")),
        ("without spec", without("spec")), ("without due", without("due")), ('due "5"', {**whole, "due": "5"}),
        ("due true", {**whole, "due": True}), ("due null", {**whole, "due": None}), ("due [5]", {**whole, "due": [5]}),
        ("due an object", {**whole, "due": {"s": 5}}),
    ]
    cases = [(f"job_put of a job {label}", request(a, "job_put", place="waiting", job=j)) for label, j in bad_jobs]
    cases.append(("job_put without a job", request(a, "job_put", place="waiting")))
    expect_refused(ctx, cases, lambda: snapshot(ctx, a))


@checks.check
def refuse_bad_day(ctx: Ctx) -> None:
    """job_set_day with a day or sent that is negative, 1.0, true, "1", null or missing is refused."""
    a = ctx.agent()
    expect(ctx.ask(a, "job_set_day", day=7, sent=3), DONE, "job_set_day 7 3")
    cases: list[tuple[str, Json]] = []
    for field, other in (("day", "sent"), ("sent", "day")):
        for label, bad in (("-1", -1), ("1.0", 1.0), ("true", True), ('"1"', "1"), ("null", None)):
            cases.append((f"{field} {label}", request(a, "job_set_day", **{field: bad, other: 1})))
        cases.append((f"no {field}", request(a, "job_set_day", **{other: 1})))
    expect_refused(ctx, cases, lambda: snapshot(ctx, a))


def _samples(ctx: Ctx) -> list[Sample]:
    a = ctx.agent()
    return [
        Sample("job_put", request(a, "job_put", place="waiting", job=job("j")), False),
        Sample("job_get", request(a, "job_get", place="waiting", id="j"), False),
        Sample("job_list", request(a, "job_list", place="waiting"), False),
        Sample("job_count", request(a, "job_count", place="firing"), False),
        Sample("job_shift", request(a, "job_shift", id="j", **{"from": "waiting", "to": "ending"}), False),
        Sample("job_next", request(a, "job_next"), False),
        Sample("job_mark", request(a, "job_mark"), False),
        Sample("job_day", request(a, "job_day"), False),
        Sample("a bad place", request(a, "job_count", place="nowhere"), True),
        Sample("an empty id", request(a, "job_get", place="waiting", id=""), True),
        Sample("invalid JSON", b'{"op": "job_next"', True),
    ]


discipline_checks(checks, _samples)


# -- a driver whose contract does not say jobs


@not_kept.check
def refused_when_not_kept(ctx: Ctx) -> None:
    """A driver whose contract does not say jobs answers every job_* op with an error reply."""
    a = ctx.agent()
    for label, req in (
        ("job_put", request(a, "job_put", place="waiting", job=job("j"))),
        ("job_get", request(a, "job_get", place="waiting", id="j")),
        ("job_remove", request(a, "job_remove", place="waiting", id="j")),
        ("job_list", request(a, "job_list", place="waiting")),
        ("job_count", request(a, "job_count", place="waiting")),
        ("job_shift", request(a, "job_shift", id="j", **{"from": "waiting", "to": "firing"})),
        ("job_next", request(a, "job_next")), ("job_day", request(a, "job_day")),
        ("job_set_day", request(a, "job_set_day", day=1, sent=1)), ("job_mark", request(a, "job_mark")),
    ):
        expect_error(ctx.send(req), f"{label} to a driver whose contract does not say jobs")

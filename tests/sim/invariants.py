"""The checker: wire.md's promises as invariants over one history.

Named invariants, each a promise a caller relies on, judged from replies
alone (never from how the drivers lay out objects).  Time is the scheduler's
step (``history``): ``a.end < b.start`` means a was over before b began; an
op of unknown outcome may take effect at any step after its start; an error
without those words promises it changed nothing.

conversations
  conv.owns-seq         an appender told ``done`` owns its seq: every read that
                        began after it (no ``remove`` possibly in between) shows
                        its event at that seq.
  conv.one-done-per-seq no two ``done`` for one (thread, seq) unless a remove may
                        have come between them.
  conv.read-shape       a read is seqs first..N with no gap, no event twice, each
                        event exactly as some append sent it, sent before the
                        read ended.
  conv.taken-own-write  no append told ``taken`` has its event stored.
files
  file.version-order    versions never go back and never repeat: a ``wrote`` after
                        another op was told (or read) version v is above v.
  file.version-content  a version, once seen with some bytes, is never seen with
                        other bytes.
  file.content-shape    the bytes are whole writes and appends one after another,
                        each at most once, each sent before the read ended.
  file.stale-own-write  a ``file_write`` told ``stale`` never has its bytes stored.
  file.append-kept      an acknowledged append is in every later read, once,
                        unless a write or remove may have come after it.
  file.remove-once      of the removers of one version, at most one ``found: true``.
jobs
  jobs.one-place        a job (one put) is never in two places at once.
  jobs.shift-own-move   a ``job_shift`` told ``found: false`` never moved the job: it is
                        not seen where only that shift could have moved it.
  jobs.next-not-late    at quiescence, job_next is not later than the soonest due of
                        any waiting job, and null only when none waits.
  jobs.waiting-indexed  at quiescence, every waiting job is named in job_due (the
                        runner's view of the due index) with a due not later than
                        its own.
                        Both leave out a job whose put, or a shift into waiting,
                        had a write held in the network land after a jump of the
                        store's time: past any grace, so after its entry may
                        have been judged a leftover.
  jobs.mark-moves       job_mark differs across every acknowledged change of
                        waiting that came between two reads of it.
  jobs.mark-no-return   a mark value, once replaced, is never read again.
leases
  lease.one-holder      no two holders are ever both told they hold one lease: a
                        take told ``took`` or ``lapsed`` (lapse above 0), or a
                        renew told ``done``, by one holder, after another was
                        told it took or renewed it, comes only once that one's
                        lease may have ended: its end, a remove, a take at
                        lapse 0, or (a take at the half-hour lapse) a jump of
                        the store's time between them (a long pause, a stall).
tools
  tools.never-widen     what one reply shows is within what any earlier reply showed.
  tools.intersection    at quiescence, the narrowing is the intersection of every
                        acknowledged narrowing (and of some of the unknown ones).
errors
  error.both            no error both says ``outcome unknown`` and that nothing changed.
  error.internal        no valid request ends in an internal error.
  error.nothing-but-visible  what an op whose error said nothing changed wrote is
                        never seen.
models (linearizability, ``models`` and ``linear``)
  model.<collection>    the replies on each object have one order, within the
                        ops' steps, that wire.md's sequential rules accept.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from .history import NOTHING_WORDS, UNKNOWN_WORDS, History, Op
from .linear import linearizable
from .models import MODELS, unb64
from .workload import HALF_HOUR_LAPSE_MS

TOKEN = re.compile(rb"\(([^()]*)\)")
Words = tuple[str, ...]


@dataclass
class Violation:
    invariant: str
    op: Op  # the op whose reply breaks the promise
    message: str
    related: list[Op] = field(default_factory=list)
    words: Words = ()  # what the keys of the backend requests worth showing hold

    def render(self, history: History) -> str:
        """The promise broken, by which machine's op (flagged ``>>``), and the history around it."""
        return (f"{self.invariant}: machine {self.op.machine}, op #{self.op.index} ({self.op.name}): {self.message}\n"
                + history.excerpt([self.op, *self.related], self.words, mark=self.op))


def silent_change(op: Op, what: str, related: list[Op], words: Words) -> Violation:
    """An op whose error said nothing was changed, though ``what`` shows it changed something."""
    return Violation("error.nothing-but-visible", op, f"its error says nothing was changed, yet {what}", related, words)


def group(ops: Iterable[Any], key: Callable[[Any], Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    for op in ops:
        out[key(op)].append(op)
    return out


def before(a: Op, b: Op) -> bool:
    """Whether ``a`` was over before ``b`` began."""
    return a.end < b.start


def words_of(agent: str, name: str) -> Words:
    """What the keys of an agent's object named ``name`` (thread, job ID, path) hold."""
    return (f"_{agent}/", name.rsplit("/", 1)[-1])


# --------------------------------------------------------------------------
# Conversations


def check_conversations(h: History) -> list[Violation]:
    out: list[Violation] = []
    appends = {op.arg("event")["tag"]: op for op in h.of("append")}
    ops = [op for op in h.ops if op.name in ("append", "read", "remove")]
    for (agent, thread), on in group(ops, lambda o: (o.agent, o.arg("thread"))).items():
        words = words_of(agent, thread)
        removes = [o for o in on if o.name == "remove"]

        def judged(v: Violation, after: float, upto: float) -> Violation:
            """``v`` holds unless a remove may have come between ``after`` and ``upto``; blamed on one whose error
            said nothing was changed when only it could have."""
            silent = [r for r in removes if r.outcome  # noqa: B023 (judged is used in this iteration only) == "nothing" and r.start < upto and r.end > after
                      and h.reached(r)]
            if not silent:
                return v
            return silent_change(silent[0], f"{v.op.machine} #{v.op.index} is explained only if this remove took "
                                 f"effect ({v.invariant}: {v.message})", [v.op, *v.related], words)  # noqa: B023

        def removed_between(after: float, upto: float) -> bool:
            return any(r.may_fall_between(after, upto) for r in removes)  # noqa: B023 (used in this iteration only)

        reads = [o for o in on if o.name == "read" and o.ok]
        done = [o for o in on if o.name == "append" and o.ok and o.reply["reply"] == "done"]
        for r in reads:
            out.extend(_read_shape(r, appends, (agent, thread), words))
        for a in done:
            seq, tag = a.arg("event")["seq"], a.arg("event")["tag"]
            for r in reads:
                first = r.arg("first", 1)
                if not before(a, r) or first > seq or removed_between(a.start, r.end):
                    continue
                events = r.reply["events"]
                at = events[seq - first] if seq - first < len(events) else None
                if at is None or at.get("tag") != tag:
                    shown = "nothing" if at is None else f"{at.get('tag')}'s event"
                    out.append(judged(Violation(
                        "conv.owns-seq", a, f"told done for seq {seq} ({tag}), but a later read shows {shown} at "
                        f"seq {seq}, with no remove of {thread!r} possibly in between", [r, *removes], words),
                        a.start, r.end))
                    break
        for x, y in combinations(done, 2):
            after, upto = min(x.start, y.start), max(x.end, y.end)
            if x.arg("event")["seq"] == y.arg("event")["seq"] and not removed_between(after, upto):
                out.append(judged(Violation(
                    "conv.one-done-per-seq", y, f"two appends told done for seq {x.arg('event')['seq']} with no "
                    "remove possibly between them", [x, *removes], words), after, upto))
    return out


def _read_shape(r: Op, appends: dict[str, Op], key: tuple[str, str], words: Words) -> Iterator[Violation]:
    first = r.arg("first", 1)
    events = r.reply["events"]
    seqs = [e.get("seq") for e in events]
    if seqs != list(range(first, first + len(events))):
        yield Violation("conv.read-shape", r, f"seqs {seqs} are not {first}..{first + len(events) - 1} "
                        "(a gap, or an event twice)", [], words)
    tags = [e.get("tag") for e in events]
    twice = sorted({t for t in tags if tags.count(t) > 1})
    if twice:
        yield Violation("conv.read-shape", r, f"events {twice} come back twice", [], words)
    for e in events:
        a = appends.get(e.get("tag"))
        if a is None or (a.agent, a.arg("thread")) != key or a.arg("event") != e:
            yield Violation("conv.read-shape", r, f"event {e} is not exactly what any append to this thread sent",
                            [] if a is None else [a], words)
        elif a.start > r.end:
            yield Violation("conv.read-shape", r, f"event {e['tag']} read before its append began", [a], words)
        elif a.ok and a.reply["reply"] == "taken":
            yield Violation("conv.taken-own-write", a, f"told taken, yet its event is stored at seq {e['seq']}",
                            [r], words)
        elif a.outcome == "nothing":
            yield silent_change(a, f"its event is stored at seq {e['seq']}", [r], words)


# --------------------------------------------------------------------------
# Files


def file_tokens(data: bytes) -> list[str] | None:
    """The tags of the writes and appends whose bytes ``data`` is made of, in order; None when it is not."""
    found = TOKEN.findall(data)
    return [t.decode("ascii") for t in found] if b"".join(b"(" + t + b")" for t in found) == data else None


def check_files(h: History) -> list[Violation]:
    out: list[Violation] = []
    ops = [op for op in h.ops if op.name.startswith("file_")]
    for (agent, path), on in group(ops, lambda o: (o.agent, o.arg("path"))).items():
        words = words_of(agent, path)
        reads = [o for o in on if o.name == "file_read" and o.ok and o.reply["file"] is not None]
        told = [o for o in on if o.ok and o.reply.get("reply") == "wrote"]
        out.extend(_versions(told, reads, words))
        senders = {file_tokens(unb64(o.arg("data")))[0]: o for o in on if o.name in ("file_write", "file_append")}
        replacers = [o for o in on if (o.name == "file_write" and o.reply.get("reply") != "stale")
                     or (o.name == "file_remove" and o.reply.get("found") is not False)]
        for r in reads:
            out.extend(_file_read(r, senders, replacers, words))
        found = [o for o in on if o.name == "file_remove" and o.ok and o.reply["found"]]
        for version, removers in group(found, lambda o: o.arg("version")).items():
            if len(removers) > 1:
                out.append(Violation("file.remove-once", removers[1], f"version {version} removed with found: true "
                                     f"{len(removers)} times", removers[:1], words))
    return out


def _versions(told: list[Op], reads: list[Op], words: Words) -> Iterator[Violation]:
    """Versions never go back nor repeat, and one version always holds the same bytes."""
    seen = [(o, o.reply["version"]) for o in told] + [(o, o.reply["file"]["version"]) for o in reads]
    for (x, vx), (y, vy) in ((a, b) for a in seen for b in seen if before(a[0], b[0])):
        if vy < vx or (vy == vx and y.name != "file_read"):
            how = "shown" if x.name == "file_read" else "told"
            yield Violation("file.version-order", y, f"given version {vy} after {x.machine} #{x.index} was {how} "
                            f"version {vx}", [x], words)
    for x, y in combinations(told, 2):
        if x.reply["version"] == y.reply["version"]:
            yield Violation("file.version-order", y, f"version {y.reply['version']} given twice", [x], words)
    shown = [(o, o.reply["version"], unb64(o.arg("data"))) for o in told if o.name == "file_write"]
    shown += [(o, o.reply["file"]["version"], unb64(o.reply["file"]["data"])) for o in reads]
    contents: dict[int, tuple[bytes, Op]] = {}
    for o, version, data in sorted(shown, key=lambda item: item[0].end):
        first = contents.setdefault(version, (data, o))
        if first[0] != data:
            yield Violation("file.version-content", o, f"version {version} holds {data!r}, but was seen holding "
                            f"{first[0]!r}", [first[1]], words)


def _file_read(r: Op, senders: dict[str, Op], replacers: list[Op], words: Words) -> Iterator[Violation]:
    data = unb64(r.reply["file"]["data"])
    tags = file_tokens(data)
    if tags is None:
        yield Violation("file.content-shape", r, f"{data!r} is not whole writes and appends one after another",
                        [], words)
        return
    for tag in sorted(set(tags)):
        sender = senders.get(tag)
        if tags.count(tag) > 1:
            yield Violation("file.content-shape", r, f"the bytes of {tag} are there {tags.count(tag)} times",
                            [] if sender is None else [sender], words)
        if sender is None or sender.start > r.end:
            yield Violation("file.content-shape", r, f"holds the bytes of {tag}, which no op sent before", [], words)
        elif sender.name == "file_write" and sender.ok and sender.reply["reply"] == "stale":
            yield Violation("file.stale-own-write", sender, f"told stale (version {sender.reply['version']}), yet "
                            "its bytes are stored", [r], words)
        elif sender.outcome == "nothing":
            yield silent_change(sender, "its bytes are stored", [r], words)
    for tag, sender in senders.items():
        if (sender.name == "file_append" and sender.ok and before(sender, r) and tags.count(tag) != 1
                and not any(o.may_fall_between(sender.start, r.end) for o in replacers)):
            yield Violation("file.append-kept", sender, f"told wrote (version {sender.reply['version']}), but a "
                            f"later read holds its bytes {tags.count(tag)} times, with no write or remove possibly "
                            "in between", [r], words)


# --------------------------------------------------------------------------
# Jobs


def waiting_changes(op: Op) -> bool:
    """Whether an acknowledged op changed the agent's waiting jobs (so its job_mark must move)."""
    if not op.ok:
        return False
    if op.name == "job_put":
        return op.arg("place") == "waiting"
    if op.name == "job_remove":
        return op.arg("place") == "waiting" and op.reply["found"]
    if op.name == "job_shift":
        return op.reply["found"] and op.arg("from") != op.arg("to") and "waiting" in (op.arg("from"), op.arg("to"))
    return False


def jobs_seen(h: History, final: bool = False) -> list[tuple[Op, dict]]:
    """Every (reader, job) a job_get or job_list answered (only the final reader's, with ``final``)."""
    return [(op, job) for op in h.of("job_get", "job_list") if op.ok and (not final or op.machine == "final")
            for job in ([op.reply["job"]] if op.name == "job_get" else op.reply["jobs"]) if job]


def check_jobs(h: History) -> list[Violation]:
    out: list[Violation] = []
    puts = {op.arg("job")["spec"]["tag"]: op for op in h.of("job_put")}
    for reader, job in jobs_seen(h):
        put = puts.get(job["spec"]["tag"])
        if put is not None and put.outcome == "nothing":
            out.append(silent_change(put, "the job it put is there", [reader], words_of(reader.agent, job["id"])))
    for (agent, tag), where in group(jobs_seen(h, final=True), lambda rj: (rj[0].agent, rj[1]["spec"]["tag"])).items():
        if len(where) > 1:
            out.append(Violation("jobs.one-place", puts.get(tag, where[0][0]), f"the job put by {tag} is in "
                                 f"{[o.arg('place') for o, _ in where]} at once", [o for o, _ in where],
                                 words_of(agent, where[0][1]["id"])))
    out.extend(_shift_own_move(h, puts))
    out.extend(_job_next(h))
    out.extend(_waiting_indexed(h))
    for agent, on in group([op for op in h.ops if op.name.startswith("job_")], lambda o: o.agent).items():
        out.extend(_marks(on, agent))
    return out


def _shift_own_move(h: History, puts: dict[str, Op]) -> Iterator[Violation]:
    """A job_shift told found: false, yet the job (one put) is seen in ``to``, where only it could have moved it."""
    shifts = [op for op in h.of("job_shift") if op.arg("from") != op.arg("to") and op.outcome != "nothing"]
    seen = jobs_seen(h)
    for s in shifts:
        if not (s.ok and s.reply["found"] is False):
            continue
        where = (s.agent, s.arg("id"), s.arg("to"))
        others = [o for o in shifts if o is not s and (o.agent, o.arg("id"), o.arg("to")) == where
                  and (not o.ok or o.reply["found"])]
        for reader, job in seen:
            put = puts.get(job["spec"]["tag"])
            if put is None or (reader.agent, job["id"], reader.arg("place")) != where or put.arg("place") == where[2]:
                continue
            if s.start < reader.end and not any(o.may_fall_between(put.start, reader.end) for o in others):
                yield Violation("jobs.shift-own-move", s, f"told found: false, yet the job {put.machine} "
                                f"#{put.index} put in {put.arg('place')} is in {where[2]}, and no other shift could "
                                "have moved it there", [put, reader], words_of(s.agent, s.arg("id")))
                break


def _final_waiting(h: History) -> tuple[list[Op], list[tuple[Op, dict, Op]]]:
    """The final reader's listings of waiting, and each job they show with the put that made it (the job's
    spec carries that op's tag; the lister when none did), but a job a late write may have left unindexed:
    one whose put, or a shift of its id into waiting, had a write land past a jump (``_landed_past_a_jump``)."""
    lists = [op for op in h.ops if op.machine == "final" and op.name == "job_list" and op.ok
             and op.arg("place") == "waiting"]
    late = {(op.agent, op.arg("id")) for op in h.of("job_shift")
            if op.arg("to") == "waiting" and _landed_past_a_jump(h, op)}
    jobs = []
    for lister in lists:
        for job in lister.reply["jobs"]:
            put = next((p for p in h.of("job_put") if p.arg("job")["spec"] == job["spec"]), lister)
            if not (put is not lister and _landed_past_a_jump(h, put) or (lister.agent, job["id"]) in late):
                jobs.append((lister, job, put))
    return lists, jobs


def _landed_past_a_jump(h: History, op: Op) -> bool:
    """Whether a write of ``op`` held in the network (``land_late``) landed after a jump of the store's time
    that came after ``op`` began: later than any grace an index gives a write in flight (due_index.GRACE), so
    its entry may have been judged a leftover first, and no op can keep it then (an op that is told how its
    writes went keeps it, jobs.py)."""
    jumped = [step for step in h.jumps if step >= op.start]
    held = {ev.key for ev in h.events if ev.kind == "call" and ev.machine == op.machine
            and op.start <= ev.step <= op.end and ev.text.endswith("-> land_late")}
    return bool(jumped) and any(ev.kind == "land" and ev.key in held and ev.step > jumped[0]
                                and ev.text.startswith(f"late write of {op.machine}:")
                                and ev.text.endswith("-> landed") for ev in h.events)


def _job_next(h: History) -> Iterator[Violation]:
    lists, jobs = _final_waiting(h)
    waiting = [job for _, job, _ in jobs]
    soonest = min((job["due"] for job in waiting), default=None)
    for op in h.ops:
        if op.machine == "final" and op.name == "job_next" and op.ok and soonest is not None:
            got = op.reply["next"]
            if got is None or got > soonest:
                ids = [j["id"] for j in waiting if j["due"] == soonest]
                yield Violation("jobs.next-not-late", op, f"job_next is {got}, but a job waits with due {soonest} "
                                f"({ids})", lists, ("_due/",))


def _waiting_indexed(h: History) -> Iterator[Violation]:
    """Every job the final reader lists in waiting (``_final_waiting``) is in the final ``job_due``: an entry of
    its id, of an agent whose token ends with its agent's id (as keys spell it), due no later than it."""
    dues = [op for op in h.ops if op.machine == "final" and op.name == "job_due" and op.ok]
    named = [(e["agent"], e["job"], e["due"]) for op in dues for e in op.reply["due"]]
    for lister, job, put in _final_waiting(h)[1] if dues else []:
        if not any(agent.endswith(lister.agent) and name == job["id"] and due <= job["due"]
                   for agent, name, due in named):
            yield Violation("jobs.waiting-indexed", put, f"the job {job['id']} waits with due {job['due']}, but the "
                            f"due index does not name it: job_next and the runners never see it", [lister, *dues],
                            ("_due/", *words_of(lister.agent, job["id"])))


def _marks(on: list[Op], agent: str) -> Iterator[Violation]:
    words = (f"_{agent}/", "mark")
    marks = sorted((o for o in on if o.name == "job_mark" and o.ok), key=lambda o: o.start)
    changes = [o for o in on if waiting_changes(o)]
    for x, y in combinations(marks, 2):
        if not before(x, y) or x.reply["mark"] != y.reply["mark"]:
            continue
        moved = [w for w in changes if before(x, w) and before(w, y)]
        other = [m for m in marks if before(x, m) and before(m, y) and m.reply["mark"] != x.reply["mark"]]
        if moved:
            yield Violation("jobs.mark-moves", y, f"job_mark is {y.reply['mark']} again after a change of waiting "
                            "acknowledged in between", [x, moved[0]], words)
        elif other:
            yield Violation("jobs.mark-no-return", y, f"job_mark is back at {y.reply['mark']}, after it was "
                            f"{other[0].reply['mark']}", [x, other[0]], words)


# --------------------------------------------------------------------------
# Leases


def acquires(op: Op) -> bool:
    """Whether ``op`` told its holder it holds the lease (a take told took or lapsed, a renew told done)."""
    return op.ok and (op.name == "take" and op.reply["took"] in ("took", "lapsed")
                      or op.name == "renew" and op.reply["reply"] == "done")


def may_end(o: Op, a: Op) -> bool:
    """Whether ``o`` may end the lease ``a`` told its holder it holds (if it fell after ``a``)."""
    holder = a.arg("holder")
    if o.outcome == "nothing" or o.name == "renew":
        return False
    if o.name in ("remove", "end"):
        return o.name == "remove" or o.arg("holder") == holder
    lapse = o.arg("lapse_ms")  # a take by another holder: a steal, or across a jump since ``a``
    return o.arg("holder") != holder and (lapse == 0 or lapse == HALF_HOUR_LAPSE_MS and o.epochs[1] > a.epochs[0])


def check_leases(h: History) -> list[Violation]:
    out: list[Violation] = []
    ops = [op for op in h.ops if op.name in ("take", "renew", "end", "remove")]
    for (agent, thread), on in group(ops, lambda o: (o.agent, o.arg("thread"))).items():
        words = words_of(agent, thread)
        told = [o for o in on if acquires(o)]
        for b in told:
            if b.name == "take" and b.arg("lapse_ms") == 0:
                continue  # a take at lapse 0 takes any lease, by design
            for a in told:
                if a.arg("holder") == b.arg("holder") or not before(a, b):
                    continue
                if b.name == "take" and b.arg("lapse_ms") == HALF_HOUR_LAPSE_MS and b.epochs[1] > a.epochs[0]:
                    continue  # the store's time jumped past the lapse since ``a``
                mine_again = [o for o in on if o.name == "take" and o.arg("holder") == b.arg("holder")
                              and o is not b and o.may_fall_between(a.start, b.end)]
                if b.name == "renew" and mine_again:
                    continue  # b's holder may have taken it back meanwhile
                if any(may_end(o, a) and o.may_fall_between(a.start, b.end) for o in on if o is not a and o is not b):
                    continue
                what = f"took ({b.reply['took']})" if b.name == "take" else "renewed"
                out.append(Violation("lease.one-holder", b, f"{b.arg('holder')} told it {what} the lease while "
                                     f"{a.machine} #{a.index} had told {a.arg('holder')} it holds it, and nothing "
                                     "that could end that lease may have come between", [a], words))
                break
    return out


# --------------------------------------------------------------------------
# Tools


def _allowed(tools: list[str] | None) -> frozenset[str] | None:
    return None if tools is None else frozenset(tools)


def _within(inner: frozenset[str] | None, outer: frozenset[str] | None) -> bool:
    return outer is None or (inner is not None and inner <= outer)


def check_tools(h: History) -> list[Violation]:
    out: list[Violation] = []
    ops = [op for op in h.ops if op.name in ("tools_narrow", "tools_read")]
    for (agent, thread), on in group(ops, lambda o: (o.agent, o.arg("thread"))).items():
        words = words_of(agent, thread)
        shown = [o for o in on if o.ok]
        for x, y in ((x, y) for x in shown for y in shown if before(x, y)):
            if not _within(_allowed(y.reply["tools"]), _allowed(x.reply["tools"])):
                out.append(Violation("tools.never-widen", y, f"shows {y.reply['tools']} after {x.machine} "
                                     f"#{x.index} was shown {x.reply['tools']}", [x], words))
        narrows = [o for o in on if o.name == "tools_narrow"]
        acked = [frozenset(o.arg("tools")) for o in narrows if o.ok]
        unknown = [frozenset(o.arg("tools")) for o in narrows if o.outcome == "unknown"]
        for f in (o for o in shown if o.machine == "final"):
            if not _some_intersection(_allowed(f.reply["tools"]), acked, unknown):
                out.append(Violation("tools.intersection", f, f"the narrowing is {f.reply['tools']}, not the "
                                     f"intersection of the {len(acked)} acknowledged narrowings (and of some of the "
                                     f"{len(unknown)} of unknown outcome)", narrows, words))
    return out


def _some_intersection(got: frozenset[str] | None, acked: list[frozenset[str]],
                       unknown: list[frozenset[str]]) -> bool:
    if len(unknown) > 12:
        return True  # too many to try: the model check still judges it
    for size in range(len(unknown) + 1):
        for chosen in combinations(unknown, size):
            sets = [*acked, *chosen]
            if (frozenset.intersection(*sets) if sets else None) == got:
                return True
    return False


# --------------------------------------------------------------------------
# Errors and models


def check_errors(h: History) -> list[Violation]:
    out: list[Violation] = []
    for op in h.ops:
        error = op.error
        if error is not None and UNKNOWN_WORDS in error and NOTHING_WORDS.search(error):
            out.append(Violation("error.both", op, "the error says both that the outcome is unknown and that "
                                 f"nothing was changed: {error!r}"))
        if error is not None and error.startswith("internal error"):
            out.append(Violation("error.internal", op, f"a valid request ended in {error!r}"))
    return out


def check_models(h: History, budget: int = 50_000) -> tuple[list[Violation], int]:
    """Each object's replies against wire.md's sequential rules; the violations and how many were undecided.

    When no order explains an object's replies, but one does once the ops whose
    error said nothing was changed, though a write of theirs reached the store,
    may have taken effect, those errors are to blame (``error.nothing-but-visible``).
    """
    out: list[Violation] = []
    undecided = 0
    for model in MODELS:
        with_silent = model.ops_by_key(h.ops, silent=True)
        for key, on in sorted(model.ops_by_key(h.ops).items()):
            words = words_of(*key)
            step = lambda s, o, key=key, model=model: model.explain(s, o, key)  # noqa: E731
            verdict = linearizable(on, model.init, step, budget)
            undecided += verdict.undecided
            if verdict.ok:
                continue
            silent = [o for o in with_silent[key] if o.outcome == "nothing" and h.reached(o)]
            maybe = [o for o in with_silent[key] if o.outcome != "nothing" or o in silent]
            if silent and linearizable(maybe, model.init, step, budget).ok:
                names = [f"{o.machine} #{o.index}" for o in silent]
                out.append(silent_change(silent[0], f"the replies on {key} are explained only if it (or another of "
                                         f"{names}) took effect", on, words))
                continue
            stuck = sorted(verdict.stuck, key=lambda o: (o.outcome != "ok", o.end))
            out.append(Violation(f"model.{model.name}", stuck[0] if stuck else on[-1],
                                 f"no order of the {len(on)} ops on {key} explains their replies: after "
                                 f"{len(verdict.placed)} of them (state {verdict.state!r}), none of "
                                 f"{[f'{o.machine} #{o.index}' for o in stuck]} can come next",
                                 [*verdict.placed[-6:], *stuck], words))
    return out, undecided


CHECKS = (check_errors, check_conversations, check_files, check_jobs, check_leases, check_tools)


def check(h: History) -> tuple[list[Violation], int]:
    """Every invariant on one history: the violations, named ones first, and how many model checks ran out of budget."""
    named = [v for check_one in CHECKS for v in check_one(h)]
    modelled, undecided = check_models(h)
    unique: dict[tuple[str, int, str], Violation] = {}
    for v in named + modelled:
        unique.setdefault((v.invariant, v.op.index, v.message), v)  # one op breaking one promise, said once
    return list(unique.values()), undecided

"""Hostile content in the bucket hurts no other agent and stops no process (issue 25).

Many agents share one bucket and prefix; any object under one agent's keys
may hold any bytes (an old version's, a bug's, a machine's with the bucket's
credentials).  This fuzz plants at least ``OBJECTS`` hostile objects at every
kind of key of one agent ("hostile"): conversation heads, single events and
packed blocks (lying about their range, in both layouts), stray keys below a
conversation, leases, tools narrowings, job records (entries naming other
agents' keys), marks and days, files and tombstones, name records, due-index
entries naming its records; each with wrong shapes, wrong types, huge
strings, non-finite or huge numbers (``10**400``, ``1e400``, ``NaN``),
nesting past the parser, frames with lineages of any length, and keys of two
other agents ("victims") inside them.  Then every op of every agent runs
through one ``serve`` process (the scheduler's own: ``job_due`` and
``job_claim`` answered), and ``lnk-store-admin inspect``, ``gc --apply`` and
``migrate`` run over the store.

Asserted: every key under the victims' prefixes (and their due entries) is
byte for byte what it was; every reply is strict JSON of the contract's
shape for its op (the hostile agent's may be errors, never an internal
error, never naming a host path); the victims' reads answer what they
wrote; the serving process and the admin tool keep answering.  Two
exceptions, each another change's to fix, are reported rather than failed:
internal errors of the file ops (files.py, issue 31) are printed, and a
crash of ``inspect`` or ``gc`` inside their own modules (``OTHERS_TO_FIX``)
makes the test an expected failure at its very end, once everything else
has been checked.  The scheduler's poll and claim are driven at the ops
the runner sends (``job_due`` paged with ``after``, ``job_claim`` with its
lease), not through a runner object.

Seeded: a failure prints the seed; ``LNK_FUZZ_SEED=N`` replays it
(``LNK_FUZZ_OBJECTS`` changes how many objects are planted).

Left out on purpose, being another change's (issue 25's first two items):
due-index entries whose due is out of the documented range or whose key
does not parse.  Entries planted here are well formed, of the hostile agent.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from support import location_of

from cloudstore.generations import Overwrite, frame
from cloudstore.protocol.client import ServeProcess
from cloudstore.settings import open_store
from cloudstore.store.due_index import sortable
from cloudstore.store.keys import AgentKeys, due_entry, inverted, name_part

OBJECTS = int(os.environ.get("LNK_FUZZ_OBJECTS", "500"))
HOSTILE = {"id": "hostile", "owner": "mallory"}
VICTIMS = [{"id": "victim-1", "owner": "acme"}, {"id": "victim-2", "owner": None}]
THREADS = [f"t{i}" for i in range(8)] + ["x" * 300]  # the last one's key part is hashed (a name record)
JOBS = [f"j{i}" for i in range(16)]
PATHS = [f"skills/p{i}.md" for i in range(6)] + ["instructions/" + "y" * 500]  # the last one hashed
PLACES = ("waiting", "firing", "ending")
HUGE = "1" + "0" * 400  # 10**400 as JSON text
NOT_JSON_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400")


def strict(text: str) -> Any:
    """A reply line as strict JSON (NaN or Infinity is no JSON)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in a reply")
    return json.loads(text, parse_constant=refuse)


# --------------------------------------------------------------------------
# what a contract reply looks like, op by op


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float))


def _job_ok(job: Any) -> bool:
    return isinstance(job, dict) and set(job) == {"id", "spec", "due"} and isinstance(job["id"], str) \
        and _is_num(job["due"])


SHAPES: dict[str, Callable[[dict], bool]] = {
    "append": lambda r: r == {"reply": "done"} or (r.get("reply") == "taken" and _is_int(r.get("last"))),
    "read": lambda r: r.get("reply") == "events" and isinstance(r.get("events"), list),
    "last": lambda r: r.get("reply") == "last" and _is_int(r.get("last")) and r["last"] >= 0,
    "threads": lambda r: r.get("reply") == "threads" and all(
        isinstance(t, dict) and isinstance(t.get("thread"), str) and _is_int(t.get("last")) for t in r["threads"]),
    "remove": lambda r: r == {"reply": "done"},
    "take": lambda r: r.get("reply") == "took" and r.get("took") in ("took", "lapsed", "held"),
    "lease_take": lambda r: r.get("reply") == "took" and r.get("took") in ("took", "lapsed", "held")
    and (r.get("holder") is None or isinstance(r["holder"], str)),
    "renew": lambda r: r in ({"reply": "done"}, {"reply": "lost"}),
    "end": lambda r: r == {"reply": "done"},
    "leases": lambda r: r.get("reply") == "leases" and all(
        isinstance(x, dict) and set(x) == {"thread", "holder", "started", "renewed", "lapsed"}
        and isinstance(x["thread"], str) and isinstance(x["holder"], str) and _is_num(x["started"])
        and _is_num(x["renewed"]) and isinstance(x["lapsed"], bool) for x in r["leases"]),
    "job_put": lambda r: r == {"reply": "done"},
    "job_get": lambda r: r.get("reply") == "job" and (r.get("job") is None or _job_ok(r["job"])),
    "job_remove": lambda r: r.get("reply") == "found" and isinstance(r.get("found"), bool),
    "job_list": lambda r: r.get("reply") == "jobs" and all(_job_ok(j) for j in r["jobs"]),
    "job_count": lambda r: r.get("reply") == "count" and _is_int(r.get("count")),
    "job_shift": lambda r: r.get("reply") == "found" and isinstance(r.get("found"), bool),
    "job_next": lambda r: r.get("reply") == "next" and (r.get("next") is None or _is_num(r["next"])),
    "job_due": lambda r: r.get("reply") == "due" and isinstance(r.get("more"), bool) and all(
        isinstance(e, dict) and isinstance(e.get("key"), str) and _is_num(e.get("due")) for e in r["due"]),
    "job_claim": lambda r: r.get("reply") == "claimed" and (r.get("job") is None or _job_ok(r["job"])),
    "job_day": lambda r: r.get("reply") == "day" and _is_int(r.get("day")) and _is_int(r.get("sent")),
    "job_set_day": lambda r: r == {"reply": "done"},
    "job_mark": lambda r: r.get("reply") == "mark" and _is_int(r.get("mark")),
    "file_read": lambda r: r.get("reply") == "file" and (r.get("file") is None or (
        isinstance(r["file"], dict) and isinstance(r["file"].get("data"), str) and _is_int(r["file"].get("version")))),
    "file_list": lambda r: r.get("reply") == "files" and all(isinstance(p, str) for p in r["files"]),
    "file_write": lambda r: r.get("reply") in ("wrote", "stale") and _is_int(r.get("version")),
    "file_remove": lambda r: r.get("reply") == "found" and isinstance(r.get("found"), bool),
    "file_append": lambda r: r.get("reply") == "wrote" and _is_int(r.get("version")),
    "tools_read": lambda r: r.get("reply") == "tools" and (r.get("tools") is None or isinstance(r["tools"], list)),
    "tools_list": lambda r: r.get("reply") == "narrowed" and isinstance(r.get("narrowed"), dict),
    "tools_narrow": lambda r: r.get("reply") == "tools" and isinstance(r.get("tools"), list),
}


# --------------------------------------------------------------------------
# hostile bytes


class Hostile:
    """Seeded hostile payloads and keys, naming the victims' keys where a key is wanted."""

    def __init__(self, rng: random.Random, victim_keys: list[str], root: str) -> None:
        self.rng = rng
        self.victim_keys = victim_keys
        self.root = root

    def key(self) -> str:
        r = self.rng.random()
        if r < 0.6 and self.victim_keys:
            return self.rng.choice(self.victim_keys)
        if r < 0.8:
            return self.rng.choice(["../" * 5 + "etc/passwd", "/", "", self.root, self.root + "a/", "_due/"])
        return self.root + "a/" + self.rng.choice(["acme", "-"]) + "/_victim-1/" + self.text(30)

    def text(self, n: int = 12) -> str:
        alphabet = "abc/%._-~\\\"\u00e9\u2028\U0001f600 .."
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(0, n)))

    def number(self) -> str:
        """JSON text of a number (or of something that is no JSON number)."""
        return self.rng.choice([HUGE, "-" + HUGE, *NOT_JSON_NUMBERS, "-1", "0", "1", "2.5", "9007199254740993",
                                "1e308", "-0", str(2**64), str(self.rng.randint(-10**6, 10**12))])

    def value(self, depth: int = 0) -> str:
        """JSON text (mostly) of some hostile value."""
        r = self.rng.random()
        if r < 0.2 or depth > 3:
            return self.number()
        if r < 0.35:
            return json.dumps(self.key())
        if r < 0.45:
            return self.rng.choice(["true", "false", "null", '""', json.dumps(self.text())])
        if r < 0.5:
            return json.dumps("z" * self.rng.choice([1000, 70_000]))
        if r < 0.53:
            return "[" * 3000 + "]" * 3000  # nested past the parser
        if r < 0.75:
            return "[" + ",".join(self.value(depth + 1) for _ in range(self.rng.randint(0, 4))) + "]"
        fields = self.rng.sample(["thread", "epoch", "holder", "started", "renewed", "removed", "packed", "seq",
                                  "places", "waiting", "firing", "job", "entry", "id", "due", "spec", "v", "path",
                                  "gone", "tools", "name", "mark", "day", "sent", "emptied", "fence", "at",
                                  "known", "last", "newest"], self.rng.randint(0, 6))
        return "{" + ",".join(f"{json.dumps(f)}:{self.value(depth + 1)}" for f in fields) + "}"

    def payload(self, typical: Callable[[], str]) -> bytes:
        """Hostile bytes: something near what the key holds (``typical``), or anything at all."""
        r = self.rng.random()
        if r < 0.55:
            text = typical()
        elif r < 0.85:
            text = self.value()
        elif r < 0.9:
            text = "{" + json.dumps("places") + ":"  # cut short
        elif r < 0.95:
            return bytes(self.rng.randrange(256) for _ in range(self.rng.randint(0, 64)))
        else:
            text = json.dumps({"x": "\ud800"})  # a lone surrogate, escaped
        return text.encode("utf-8", "surrogatepass")

    def framed(self, payload: bytes) -> bytes:
        """The payload as a backend stores it: mostly a proper frame, sometimes a frame that lies."""
        r = self.rng.random()
        nonce = f"{self.rng.getrandbits(128):032x}"
        if r < 0.7:
            return frame(nonce, payload)
        if r < 0.8:  # a lineage of any length, some of it no tag at all
            lineage = ",".join(self.rng.choice(["0", "?", f"{self.rng.getrandbits(64):016x}", "\u00e9", ""])
                               for _ in range(self.rng.choice([0, 1, 17, 5000])))
            return b"cs2 " + nonce.encode() + b" " + lineage.encode("utf-8") + b"\n" + payload
        if r < 0.85:
            return b"cs2 " + nonce.encode() + b" " + b"x" * 100  # no newline: the frame never ends
        if r < 0.9:
            return b"cs1 " + nonce.encode() + b"\n" + payload
        return payload  # no frame at all


# --------------------------------------------------------------------------
# planting


def hostile_objects(h: Hostile, keys: AgentKeys, root: str, count: int) -> list[tuple[str, bytes]]:
    """``count`` (key, stored bytes) of the hostile agent, over every kind of key it has."""
    rng = h.rng

    def epoch() -> int:
        return rng.choice([0, 0, 1, 2, 10**10 - 2, 10**10 - 1])

    def seq() -> int:
        return rng.choice([1, 2, 7, 8, 9, 16, 64, 4096, 10**6, 10**12, 10**20 - 1])

    def head(thread: str) -> str:
        fields = {"thread": json.dumps(rng.choice([thread, thread, "other", h.key()])),
                  "epoch": rng.choice(["0", "1", "3", h.number(), json.dumps(h.key())])}
        if rng.random() < 0.5:
            fields.update(holder=rng.choice(['"r"', h.value()]), started=h.number(), renewed=h.number())
        if rng.random() < 0.4:
            records = [f'{{"epoch":{rng.choice(["0", "1", "2", h.number()])},"at":{h.number()},'
                       f'"fence":{rng.choice(["null", "1", h.number()])},"known":{rng.choice(["0", h.number()])}}}'
                       for _ in range(rng.choice([0, 1, 2, 3, 2000]))]
            fields["removed"] = "[" + ",".join(records) + "]"
        if rng.random() < 0.4:
            fields["packed"] = (f'{{"epoch":{rng.choice(["0", h.number()])},"last":{h.number()},'
                                f'"newest":{rng.choice(["true", "false", "1"])}}}')
        return "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"

    def event(n: int) -> str:
        return rng.choice([f'{{"seq":{n}}}', f'{{"seq":{n + 1}}}', f'{{"seq":{h.number()}}}', '{"fence":true}',
                           f'{{"seq":{n},"x":{h.value()}}}'])

    def block(end: int, size: int) -> str:
        first = end - size + 1
        events = [event(first + i) for i in range(min(size, 16))]
        if rng.random() < 0.5:
            events = [f'{{"seq":{first + i}}}' for i in range(size if size <= 512 else 3)]
        return "[" + ",".join(events) + "]"

    def record(job_id: str) -> str:
        place = rng.choice(PLACES + ("elsewhere",))
        job = rng.choice([f'{{"id":{json.dumps(job_id)},"spec":null,"due":{h.number()}}}',
                          f'{{"id":{json.dumps(rng.choice(JOBS))},"spec":{h.value()},"due":5}}', h.value()])
        entry = rng.choice([json.dumps(h.key()), json.dumps(h.key()), h.value(),
                            json.dumps(due_entry(root, sortable(5), keys, job_id, f"{rng.getrandbits(128):032x}"))])
        body = f'{{"job":{job},"entry":{entry}}}' if rng.random() < 0.8 else h.value()
        extra = rng.choice(["", f',"emptied":{h.number()}', f',"zzz":{h.value()}'])
        return f'{{"places":{{"{place}":{body}}}{extra}}}'

    def file_object(path: str) -> bytes:
        header = rng.choice([f'{{"v":{h.number()},"path":{json.dumps(path)}}}',
                             f'{{"v":1,"path":{json.dumps(h.key())},"gone":{rng.choice(["true", "1", h.value()])}}}',
                             f'{{"v":{h.number()},"path":{json.dumps(path)},"gone":true}}', h.value()])
        big = rng.random() < 0.03  # past the 4 MiB a file may hold
        return header.encode() + (b"\n" + b"d" * 4_194_400 if big else rng.choice([b"\n", b"\ndata", b""]))

    kinds: list[tuple[str, Callable[[], tuple[str, bytes]]]] = []

    def thread() -> str:
        return rng.choice(THREADS)

    def add(kind: str, make: Callable[[], tuple[str, bytes]]) -> None:
        kinds.append((kind, make))

    # hostile heads for half the threads only: behind a head that parses, events and blocks are read
    add("head", lambda: (keys.lease(t := rng.choice(THREADS[:4])), h.payload(lambda: head(t))))
    add("event", lambda: (keys.event(thread(), epoch(), n := seq()), h.payload(lambda: event(n))))
    add("event_v03", lambda: (keys.event(thread(), epoch(), n := seq(), newest_first=False),
                              h.payload(lambda: event(n))))
    add("block", lambda: (keys.segment(thread(), epoch(), end := rng.choice([8, 16, 32, 4096, 10**12]),
                                       size := rng.choice([8, 16, 4096, 3, 0])), h.payload(lambda: block(end, size))))
    add("block_v03", lambda: (keys.segment(thread(), epoch(), end := rng.choice([8, 16]), size := 8, False),
                              h.payload(lambda: block(end, size))))
    add("stray", lambda: (keys.thread(thread()) + rng.choice(["a", "d", "p1/x", "d0000000000/x", "e1/ev/x",
                                                               "d" + inverted(1, 10) + "/-0000000000000000001",
                                                               "zz/" + str(rng.getrandbits(32))]), h.payload(h.value)))
    add("tools", lambda: (keys.tools(t := thread()),
                          h.payload(lambda: f'{{"thread":{json.dumps(rng.choice([t, "x"]))},"tools":{h.value()}}}')))
    add("job", lambda: (keys.job(j := rng.choice(JOBS)), h.payload(lambda: record(j))))
    add("mark", lambda: (keys.mark(), h.payload(lambda: f'{{"mark":{h.number()}}}')))
    add("day", lambda: (keys.day(), h.payload(lambda: f'{{"day":{h.number()},"sent":{h.number()}}}')))
    add("file", lambda: (keys.file(p := rng.choice(PATHS)), file_object(p)))
    add("name", lambda: (keys.name_record(name_part(rng.choice(THREADS))),
                         h.payload(lambda: f'{{"name":{json.dumps(rng.choice([*THREADS, h.key()]))}}}')))
    add("due", lambda: (due_entry(root, sortable(rng.choice([0, 5, 1.5, 10**9])), keys, rng.choice(JOBS),
                                  f"{rng.getrandbits(128):032x}"), b""))
    planted: dict[str, bytes] = {}
    while len(planted) < count:  # distinct keys: a key planted twice holds only its last bytes
        kind, make = rng.choice(kinds)
        key, data = make()
        planted[key] = data if kind == "due" else h.framed(data)
    return list(planted.items())


# --------------------------------------------------------------------------
# the run


class Driver:
    """One serve process of the scheduler's own driver; every reply checked strictly."""

    def __init__(self, program: str, env: dict[str, str], forbidden: list[str], seed: int) -> None:
        self.proc = ServeProcess(program, env={**env, "LNK_SCHEDULER_OPS": "1"})
        self.forbidden = [f for f in forbidden if f]
        self.seed = seed
        self.internal: list[str] = []
        self.errors: dict[str, int] = {}  # what the hostile agent was answered, for a failure's report
        self.files_internal: list[str] = []  # files.py is issue 31's: reported there, printed here

    def __call__(self, agent: dict, op: str, **args: Any) -> dict:
        request = {"op": op, "agent": agent, **args}
        line = self.proc.request_line(json.dumps(request).encode("utf-8"), timeout=120)
        reply = strict(line)
        where = f"seed {self.seed}: {op} of {agent['id']} answered {line[:400]}"
        assert isinstance(reply, dict), where
        for place in self.forbidden:
            assert place not in line, f"{where}: names a host path"
        if reply.get("reply") == "error":
            assert set(reply) == {"reply", "error"} and isinstance(reply["error"], str), where
            assert agent is HOSTILE, f"{where}: an error for a victim"
            self.errors[f"{op}: {reply['error'][:90]}"] = self.errors.get(f"{op}: {reply['error'][:90]}", 0) + 1
            if "internal error" in reply["error"]:
                (self.files_internal if op.startswith("file_") else self.internal).append(where)
        else:
            assert SHAPES[op](reply), f"{where}: not the contract's shape"
        return reply

    def close(self) -> None:
        self.proc.close()


def every_op(ask: Callable[..., dict], agent: dict, rng: random.Random) -> None:
    """Every op of the contract (and the scheduler's) on the agent's threads, jobs and paths."""
    for thread in THREADS:
        last = ask(agent, "last", thread=thread)
        ask(agent, "read", thread=thread, first=1)
        ask(agent, "read", thread=thread, first=rng.choice([2, 9, 17, 4097]))
        ask(agent, "tools_read", thread=thread)
        seq = last.get("last", 0) + 1 if last.get("reply") == "last" else 1
        ask(agent, "append", thread=thread, event={"seq": seq, "say": "hi"})
        ask(agent, "append", thread=thread, event={"seq": 1})
        ask(agent, "take", thread=thread, holder="h", lapse_ms=rng.choice([0, 60_000]))
        ask(agent, "lease_take", thread=thread, holder="h2", lapse_ms=0)
        ask(agent, "renew", thread=thread, holder="h2")
        ask(agent, "end", thread=thread, holder="h2")
        ask(agent, "tools_narrow", thread=thread, tools=["a", "b"])
    ask(agent, "threads")
    ask(agent, "leases", lapse_ms=1000)
    ask(agent, "tools_list")
    for place in PLACES:
        ask(agent, "job_list", place=place)
        ask(agent, "job_count", place=place)
    for job_id in JOBS:
        for place in PLACES:
            ask(agent, "job_get", place=place, id=job_id)
        r = rng.random()
        if r < 0.25:
            ask(agent, "job_remove", place=rng.choice(PLACES), id=job_id)
        elif r < 0.5:
            source, target = rng.sample(PLACES, 2)
            ask(agent, "job_shift", id=job_id, **{"from": source, "to": target})
        elif r < 0.75:
            ask(agent, "job_claim", id=job_id, thread="job:" + job_id, holder="runner", lapse_ms=60_000,
                not_after=2e9)
        else:
            ask(agent, "job_claim", id=job_id)
        ask(agent, "job_put", place=rng.choice(PLACES), job={"id": job_id, "spec": None, "due": 7})
        ask(agent, "job_shift", id=job_id, **{"from": "waiting", "to": "firing"})
    ask(agent, "job_mark")
    ask(agent, "job_day")
    ask(agent, "job_set_day", day=3, sent=1)
    for folder in ("skills", "instructions"):
        ask(agent, "file_list", folder=folder)
    for path in PATHS:
        got = ask(agent, "file_read", path=path)
        version = got["file"]["version"] if got.get("reply") == "file" and got["file"] else 0
        ask(agent, "file_write", path=path, data="eA==", version=version)
        ask(agent, "file_append", path=path, data="eQ==")
        ask(agent, "file_remove", path=path, version=version + 2)
    for thread in THREADS[:3]:
        ask(agent, "remove", thread=thread)
        ask(agent, "read", thread=thread)


def snapshot(backend: Any, root: str, tokens: list[str]) -> dict[str, bytes]:
    """Every key of the victims (their folders and their due entries) and its stored bytes."""
    out: dict[str, bytes] = {}
    for item in backend.list(root, None, None):
        rel = item.key[len(root):]
        parts = rel.split("/")
        mine = (parts[0] == "a" and "/".join(parts[1:3]) in tokens) or (
            parts[0] == "_due" and len(parts) > 3 and "/".join(parts[2:4]) in tokens)
        if mine:
            got = backend.get(item.key)
            assert got is not None, item.key
            out[item.key] = got[0]
    return out


def victims_setup(ask: Callable[..., dict], victim: dict) -> dict[str, Any]:
    """Each victim's things (every kind of key), and what its reads answer now."""
    for thread in ("t0", THREADS[-1]):
        for seq in range(1, 18):
            assert ask(victim, "append", thread=thread, event={"seq": seq, "n": seq}) == {"reply": "done"}
    ask(victim, "take", thread="t0", holder="me", lapse_ms=60_000)
    ask(victim, "tools_narrow", thread="t0", tools=["read"])
    ask(victim, "job_put", place="waiting", job={"id": "j0", "spec": {"v": 1}, "due": 5})
    ask(victim, "job_put", place="waiting", job={"id": "j1", "spec": None, "due": time.time() + 3600})
    ask(victim, "job_put", place="firing", job={"id": "j2", "spec": None, "due": 1})
    ask(victim, "job_set_day", day=20000, sent=2)
    assert ask(victim, "file_write", path="skills/p0.md", data="dg==", version=0) == {"reply": "wrote", "version": 1}
    assert ask(victim, "file_write", path=PATHS[-1], data="dg==", version=0) == {"reply": "wrote", "version": 1}
    assert ask(victim, "file_write", path="skills/p1.md", data="dg==", version=0)["reply"] == "wrote"
    assert ask(victim, "file_remove", path="skills/p1.md", version=1) == {"reply": "found", "found": True}
    return victim_reads(ask, victim)


def victim_reads(ask: Callable[..., dict], victim: dict) -> dict[str, Any]:
    reads: dict[str, Any] = {}
    for thread in ("t0", THREADS[-1], "t1"):
        reads[f"read {thread}"] = ask(victim, "read", thread=thread)
        reads[f"tools {thread}"] = ask(victim, "tools_read", thread=thread)
    reads["threads"] = ask(victim, "threads")
    leases = ask(victim, "leases", lapse_ms=60_000)["leases"]
    reads["leases"] = [{k: v for k, v in x.items() if k != "lapsed"} for x in leases]
    reads["tools_list"] = ask(victim, "tools_list")
    for place in PLACES:
        reads[f"jobs {place}"] = ask(victim, "job_list", place=place)
    reads["mark"] = ask(victim, "job_mark")
    reads["day"] = ask(victim, "job_day")
    for path in ("skills/p0.md", "skills/p1.md", PATHS[-1]):
        reads[f"file {path}"] = ask(victim, "file_read", path=path)
    reads["files"] = ask(victim, "file_list", folder="skills")
    return reads


#: Modules whose crash on hostile content is another change's to fix: such a crash is reported as an
#: expected failure at the very end, once everything else is checked.  Empty: gc and inspect now judge
#: heads by the drivers' own check and report a malformed agent instead of stopping.
OTHERS_TO_FIX: tuple[str, ...] = ()


def admin(args: list[str], env: dict[str, str], seed: int, crashes: list[str]) -> dict:
    """``lnk-store-admin`` as an operator runs it: it answers (0, or 1 for what it found), never a traceback.

    A traceback whose innermost frame is in ``OTHERS_TO_FIX`` goes to ``crashes``; any other fails here."""
    done = subprocess.run(["lnk-store-admin", *args, "--json"], capture_output=True, env={**os.environ, **env},
                          timeout=600)
    said = done.stderr.decode(errors="replace")
    try:  # with --json the tool's last word is one JSON document: without it, it did not finish
        answer = strict(done.stdout.decode())
    except ValueError:
        answer = None
    if answer is None and "Traceback" in said:  # (a traceback alone may be a request's error, logged)
        frames = [line for line in said.splitlines() if line.strip().startswith('File "') and "/cloudstore/" in line]
        innermost = frames[-1] if frames else ""
        assert any(module in innermost for module in OTHERS_TO_FIX), f"seed {seed}: {args[0]}: {said[-3000:]}"
        crashes.append(f"seed {seed}: {args[0]} crashed at {innermost.strip()}: {said.splitlines()[-1][:300]}")
        return {}
    last = said.strip().splitlines()[-1] if said.strip() else ""
    stopped = done.returncode == 1 and answer is None and last.startswith("lnk-store-admin: ")
    assert done.returncode in (0, 1) and (isinstance(answer, dict) or stopped), \
        f"seed {seed}: {args[0]}: exit {done.returncode}: {said[-3000:]}"
    if stopped:  # it stopped with one line naming what it met (an agent's op answered an error): no crash
        print(f"seed {seed}: {args[0]} stopped: {last[:300]}")
        return {}
    return answer  # type: ignore[no-any-return]


def test_hostile_objects_hurt_no_other_agent(store_env: Any, tmp_path: Any) -> None:
    store = store_env
    seed = int(os.environ.get("LNK_FUZZ_SEED", str(int.from_bytes(os.urandom(4), "big"))))
    print(f"hostile fuzz seed {seed} on {store.backend} (replay: LNK_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    loc = location_of(store)
    root = loc.prefix
    raw = open_store(loc)
    folder = store.url[len("file://"):] if store.backend == "file" else ""
    ask = Driver(store.program, store.env, [folder, str(tmp_path)], seed)
    try:
        expected = [victims_setup(ask, v) for v in VICTIMS]
        tokens = [AgentKeys(root, v["owner"], v["id"]).due_token() for v in VICTIMS]
        before = snapshot(raw.backend, root, tokens)
        assert before, "the victims hold nothing"

        hkeys = AgentKeys(root, HOSTILE["owner"], HOSTILE["id"])
        planted = hostile_objects(Hostile(rng, sorted(before), root), hkeys, root, OBJECTS)
        for key, data in planted:
            raw.backend.put(key, data, Overwrite())
        assert len(planted) >= OBJECTS and len({k for k, _ in planted}) > OBJECTS // 10

        every_op(ask, HOSTILE, rng)
        for victim in VICTIMS:
            ask(victim, "job_next")
            due = ask(victim, "job_due", limit=1000)
            while due["more"] and due["due"]:
                due = ask(victim, "job_due", limit=rng.choice([1, 7, 100]), after=due["due"][-1]["key"])
        every_op(ask, HOSTILE, rng)  # again, over what the first round left

        crashes: list[str] = []
        admin(["inspect", store.url], store.env, seed, crashes)
        admin(["gc", store.url, "--apply", "--min-age", "0"], store.env, seed, crashes)
        moved = admin(["migrate", store.url, f"file://{tmp_path}/copy"], store.env, seed, [])
        assert moved and not moved["ok"], f"seed {seed}: migrate copied the hostile records without a word"

        after = snapshot(raw.backend, root, tokens)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        assert not changed, f"seed {seed}: the victims' objects changed: {changed[:10]}"
        for victim, reads in zip(VICTIMS, expected, strict=True):
            assert victim_reads(ask, victim) == reads, f"seed {seed}: {victim['id']} reads otherwise"
            # and every op of theirs still works
            assert ask(victim, "append", thread="t0", event={"seq": 18}) == {"reply": "done"}
            assert ask(victim, "file_write", path="skills/p0.md", data="dg==", version=0) == {
                "reply": "stale", "version": 1}
        assert not ask.internal, f"seed {seed}: internal errors:\n" + "\n".join(ask.internal[:20])
        for what, times in sorted(ask.errors.items()):
            print(f"{times:4d} x {what}")
        for where in sorted(set(ask.files_internal))[:20]:
            print(f"file op answered an internal error (files.py, issue 31): {where}")
        assert ask.proc.alive()
        if crashes:
            pytest.xfail("crashed on hostile content, in another change's module:\n" + "\n".join(crashes))
    finally:
        ask.close()


def test_the_hostile_objects_are_of_one_agent_only(tmp_path: Any) -> None:
    """The fuzz's own promise: every key it plants is below the hostile agent's folder or its due entries."""
    root = "pre/"
    hkeys = AgentKeys(root, HOSTILE["owner"], HOSTILE["id"])
    planted = hostile_objects(Hostile(random.Random(1), [root + "a/x/y"], root), hkeys, root, 600)
    for key, _ in planted:
        assert key.startswith(hkeys.base) or key.startswith(root + "_due/") and f"/{hkeys.due_token()}/" in key
    assert any(key.startswith(hkeys.hashed_files()) for key, _ in planted)  # a hashed path's key is in play

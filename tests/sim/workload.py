"""The seeded workload: what each machine asks, as a client that believes what it was told.

A small key space (2 agents, 2 threads, 3 job ids, 2 paths) so machines
collide all the time.  Every op that writes carries a unique *tag* (machine
and op number) in what it writes: an event's ``tag``, a job's spec, a file's
bytes ``(m1.17)``, so the checker can trace any stored value to the one op
that sent it.  Each machine keeps what a client would believe: the last
``seq`` of a conversation and the version of a file it was last told, and
asks with those (stale beliefs make ``taken`` / ``stale`` races), and which
leases it believes it holds (``holds``).  The scheduler may put requests of
its own first (``queued``): when a long pause or a stall moves the store's
time past a half-hour lapse, another machine's take of a lease this one
believes it holds, and this one's renew and end of it once it resumes.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from typing import Any

AGENTS = ({"id": "a0", "owner": "o"}, {"id": "a1", "owner": None})
THREADS = ("t0", "t1")
JOB_IDS = ("j0", "j1", "j2")
PATHS = ("instructions/main.md", "skills/greet/SKILL.md")
PLACES = ("waiting", "firing", "ending")
HOLDERS = ("h0", "h1")
TOOLS = ("read", "write", "shell", "web", "mail", "calc", "draw", "mind")
LONG_LAPSE_MS = 1_000_000_000  # wall time never decides a lease (11.6 days: more than a history's jumps)
#: Lapses within a history only across a jump of the store's time (a long pause, a stall: ``simtime``,
#: more than half an hour each); without one a history lasts seconds, and a reply dated an hour ahead,
#: believed, would make it lapse: so a clock fault that brings a takeover forward is a violation.
HALF_HOUR_LAPSE_MS = 1_800_000
DUE_BASE = 1_900_000_000


def token(tag: str) -> bytes:
    """The bytes a file write or append of op ``tag`` carries."""
    return f"({tag})".encode("ascii")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


HOT = 0.6  # how often a machine picks the history's hot agent, thread, job ID or path


class Workload:
    """One machine's client: the next request, and what it learns from each reply.

    Each history has one hot agent, thread, job ID and path (the same for
    every machine, drawn from the seed) that machines pick more often than the
    others, so that two of them meet on one object between a lost reply and
    its retry.
    """

    def __init__(self, seed: int, machine: str) -> None:
        self.rng = random.Random(f"workload:{seed}:{machine}")
        hot = random.Random(f"hot:{seed}")
        self.hot = [hot.randrange(len(names)) for names in (AGENTS, THREADS, JOB_IDS, PATHS)]
        self.machine = machine
        self.count = 0
        self.last_seq: dict[tuple[str, str], int] = {}
        self.file_version: dict[tuple[str, str], int] = {}
        #: (agent id, thread) -> (agent, holder): the leases this client was last told it holds
        self.holds: dict[tuple[str, str], tuple[dict, str]] = {}
        self.queued: list[dict] = []  # requests to send before any of its own (the scheduler's)
        ops: list[tuple[int, Callable[[dict], dict]]] = [
            (14, self.append), (4, self.read), (2, self.last), (1, self.remove),
            (3, self.take), (2, self.renew), (2, self.end),
            (5, self.job_put), (5, self.job_shift), (2, self.job_remove), (2, self.job_get), (1, self.job_list),
            (1, self.job_next), (5, self.job_mark),
            (5, self.file_write), (4, self.file_append), (3, self.file_remove), (3, self.file_read),
            (3, self.tools_narrow), (1, self.tools_read),
        ]
        self.makers = [make for _, make in ops]
        self.weights = [weight for weight, _ in ops]

    def next_request(self) -> dict:
        self.count += 1
        if self.queued:
            return self.queued.pop(0)
        agent = self.pick(AGENTS)
        make = self.rng.choices(self.makers, self.weights)[0]
        return {"agent": dict(agent), **make(agent)}

    def pick(self, names: tuple) -> Any:
        hot = self.hot[(AGENTS, THREADS, JOB_IDS, PATHS).index(names)]
        return names[hot] if self.rng.random() < HOT else self.rng.choice(names)

    @property
    def tag(self) -> str:
        return f"{self.machine}.{self.count}"

    def _named(self, agent: dict, names: tuple) -> tuple[tuple[str, str], str]:
        """One of ``names`` (a thread or a path), and the (agent, name) key the client's beliefs are kept by."""
        name = self.pick(names)
        return (agent["id"], name), name

    def _thread(self, agent: dict) -> tuple[tuple[str, str], str]:
        return self._named(agent, THREADS)

    def _path(self, agent: dict) -> tuple[tuple[str, str], str]:
        return self._named(agent, PATHS)

    # -- conversations

    def append(self, agent: dict) -> dict:
        key, thread = self._thread(agent)
        seq = self.last_seq.get(key, 0) + 1
        return {"op": "append", "thread": thread, "event": {"seq": seq, "tag": self.tag, "n": 2**60 + seq}}

    def read(self, agent: dict) -> dict:
        key, thread = self._thread(agent)
        first = 1 if self.rng.random() < 0.7 else self.rng.randint(1, max(1, self.last_seq.get(key, 0)))
        return {"op": "read", "thread": thread, "first": first}

    def last(self, agent: dict) -> dict:
        return {"op": "last", "thread": self._thread(agent)[1]}

    def remove(self, agent: dict) -> dict:
        return {"op": "remove", "thread": self._thread(agent)[1]}

    # -- leases

    def _lease(self, op: str, agent: dict) -> dict:
        return {"op": op, "thread": self._thread(agent)[1], "holder": self.rng.choice(HOLDERS)}

    def take(self, agent: dict) -> dict:
        return {**self._lease("take", agent), "lapse_ms": self.rng.choice((0, LONG_LAPSE_MS, HALF_HOUR_LAPSE_MS))}

    def renew(self, agent: dict) -> dict:
        return self._lease("renew", agent)

    def end(self, agent: dict) -> dict:
        return self._lease("end", agent)

    # -- jobs

    def job_put(self, agent: dict) -> dict:
        place = "waiting" if self.rng.random() < 0.8 else self.rng.choice(PLACES)
        due: Any = DUE_BASE + self.rng.randint(0, 500)
        if self.rng.random() < 0.3:
            due += 0.25
        job = {"id": self.pick(JOB_IDS), "spec": {"tag": self.tag, "big": 2**60 + 1}, "due": due}
        return {"op": "job_put", "place": place, "job": job}

    def job_shift(self, agent: dict) -> dict:
        source = self.rng.choice(PLACES)
        target = source if self.rng.random() < 0.05 else self.rng.choice([p for p in PLACES if p != source])
        return {"op": "job_shift", "id": self.pick(JOB_IDS), "from": source, "to": target}

    def job_remove(self, agent: dict) -> dict:
        return {"op": "job_remove", "place": self.rng.choice(PLACES), "id": self.pick(JOB_IDS)}

    def job_get(self, agent: dict) -> dict:
        return {"op": "job_get", "place": self.rng.choice(PLACES), "id": self.pick(JOB_IDS)}

    def job_list(self, agent: dict) -> dict:
        return {"op": "job_list", "place": self.rng.choice(PLACES)}

    def job_next(self, agent: dict) -> dict:
        return {"op": "job_next"}

    def job_mark(self, agent: dict) -> dict:
        return {"op": "job_mark"}

    # -- files

    def file_write(self, agent: dict) -> dict:
        key, path = self._path(agent)
        version = self.file_version.get(key, 0)
        return {"op": "file_write", "path": path, "data": b64(token(self.tag)), "version": version}

    def file_append(self, agent: dict) -> dict:
        return {"op": "file_append", "path": self._path(agent)[1], "data": b64(token(self.tag))}

    def file_remove(self, agent: dict) -> dict:
        key, path = self._path(agent)
        return {"op": "file_remove", "path": path, "version": self.file_version.get(key, 0)}

    def file_read(self, agent: dict) -> dict:
        return {"op": "file_read", "path": self._path(agent)[1]}

    # -- tools

    def tools_narrow(self, agent: dict) -> dict:
        names = self.rng.sample(TOOLS, self.rng.randint(5, len(TOOLS)))
        return {"op": "tools_narrow", "thread": self._thread(agent)[1], "tools": names}

    def tools_read(self, agent: dict) -> dict:
        return {"op": "tools_read", "thread": self._thread(agent)[1]}

    # -- what the client learns

    def _believe(self, op: str, key: tuple[str, str], request: dict, reply: dict) -> None:
        """Which lease of ``key`` this client holds, as the replies told it (an error tells nothing)."""
        kind = reply.get("reply")
        if kind is None or kind == "error":
            return
        acquired = op == "take" and reply.get("took") in ("took", "lapsed") or op == "renew" and kind == "done"
        if acquired:
            self.holds[key] = (request["agent"], request["holder"])
        elif op == "remove" or op in ("take", "renew", "end") and self.holds.get(key, ({}, ""))[1] == request["holder"]:
            self.holds.pop(key, None)  # told held, lost or ended: no longer ours; removed: nobody's

    def contend(self, agent: dict, thread: str, holder: str) -> None:
        """Send first a take of the lease ``holder`` holds, by the other holder, at the half-hour lapse."""
        other = next(h for h in HOLDERS if h != holder)
        self.queued.append({"op": "take", "agent": dict(agent), "thread": thread, "holder": other,
                            "lapse_ms": HALF_HOUR_LAPSE_MS})

    def look(self) -> None:
        """Send first a ``job_next``: it deletes, first in line, an entry older than the index's grace whose
        record does not name it (a crash's leftover, or the entry of a put stopped before its record)."""
        self.queued.append({"op": "job_next", "agent": dict(AGENTS[0])})

    def resume(self, agent: dict, thread: str, holder: str) -> None:
        """Send first the renew of a lease believed held, then its end: what a holder does on waking."""
        for op in ("renew", "end"):
            self.queued.append({"op": op, "agent": dict(agent), "thread": thread, "holder": holder})

    def observe(self, request: dict, reply: dict) -> None:
        op, kind = request["op"], reply.get("reply")
        agent = request["agent"]["id"]
        if "thread" in request:
            key = (agent, request["thread"])
            seen: int | None = None
            if op == "append":
                seen = request["event"]["seq"] if kind == "done" else reply.get("last")
            elif op == "read" and kind == "events":
                seen = request["first"] - 1 + len(reply["events"]) if reply["events"] or request["first"] == 1 else None
            elif op == "last" and kind == "last":
                seen = reply["last"]
            elif op == "remove" and kind == "done":
                seen = 0
            if seen is not None:
                self.last_seq[key] = seen
            self._believe(op, key, request, reply)
        if "path" in request:
            key = (agent, request["path"])
            version: int | None = None
            if kind in ("wrote", "stale"):
                version = reply["version"]
            elif op == "file_read" and kind == "file":
                version = 0 if reply["file"] is None else reply["file"]["version"]
            elif op == "file_remove" and reply.get("found"):
                version = 0
            if version is not None:
                self.file_version[key] = version

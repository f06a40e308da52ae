"""Sequential models of wire.md, one object at a time, for the linearizability check.

Each model says, for one object (a conversation, a lease, a tools narrowing,
a file, a job ID), which ops touch it, its first state, and which states can
follow an op given its reply.  States are small hashable values:

* conversation: the tags of its events, in order (``remove`` empties it);
* lease: the holder, or None;
* tools: None (never narrowed) or the names left, in the order last given;
* file: None, or (version, bytes), version None while only an op of unknown
  outcome explains the bytes (the next reply that shows it fixes it);
* job ID: one canonical JSON job, or None, per place.

Versions of files are only checked here for "the one the writer named";
that versions never come back is ``invariants``' business.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from .history import Op
from .workload import HALF_HOUR_LAPSE_MS, JOB_IDS, PLACES, THREADS

Key = tuple[str, str]
States = list[Hashable]
SPLIT = "sim_part"  # marks the two halves of a split op (never sent to a driver)


@dataclass(frozen=True)
class Model:
    name: str
    readers: frozenset[str]  # ops that change nothing: left out when they failed
    writers: frozenset[str]  # ops that may change the object: left out when they certainly changed nothing
    keys: Callable[[Op], list[Key]]
    init: Hashable
    step: Callable[[Hashable, Op, Key], States]
    split: frozenset[str] = frozenset()  # ops whose effect and reply may fall at two points of their span

    def ops_by_key(self, ops: Iterable[Op], silent: bool = False) -> dict[Key, list[Op]]:
        """The ops on each object: readers answered, writers unless their error says nothing changed
        (with ``silent``, those too, as if their outcome were unknown)."""
        out: dict[Key, list[Op]] = {}
        for op in ops:
            if op.name in self.readers and op.ok or op.name in self.writers and (silent or op.outcome != "nothing"):
                for part in self.parts(op):
                    for key in self.keys(op):
                        out.setdefault(key, []).append(part)
        return out

    def parts(self, op: Op) -> list[Op]:
        """An op as the model sees it: one op, or (``split``) its effect and its reply apart."""
        if op.name not in self.split:
            return [op]
        effect = replace(op, request={**op.request, SPLIT: "effect"})
        return [effect, replace(op, request={**op.request, SPLIT: "reply"})] if op.ok else [effect]

    def explain(self, state: Hashable, op: Op, key: Key) -> States:
        """The states after ``op`` on the object ``key`` (a malformed reply explains nothing)."""
        try:
            return self.step(state, op, key)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return []


def by_thread(op: Op) -> list[Key]:
    return [(op.agent, op.arg("thread"))]


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


# --------------------------------------------------------------------------
# Conversations


def conversation_step(state: tuple, op: Op, key: Key) -> States:
    if op.name == "remove":
        return [()]
    if op.name == "append":
        event = op.arg("event")
        fits = len(state) == event["seq"] - 1
        if not op.ok or op.reply["reply"] == "done":
            return [state + (event["tag"],)] if fits else []
        return [state] if op.reply["reply"] == "taken" and not fits else []
    if op.name == "read":
        first = op.arg("first", 1)
        got = tuple((e["seq"], e["tag"]) for e in op.reply["events"])
        want = tuple((first + i, tag) for i, tag in enumerate(state[first - 1:]))
        return [state] if got == want else []
    if op.name == "last":
        return [state] if op.reply["last"] == len(state) else []
    return []


CONVERSATIONS = Model("conversations", frozenset({"read", "last"}), frozenset({"append", "remove"}),
                      by_thread, (), conversation_step)


# --------------------------------------------------------------------------
# Leases.  lapse_ms is 0 (always lapsed), half an hour (lapsed only across a jump of the store's time:
# history.py), or so long that it never is within a history.  A state is (holder, epoch) or None: the epoch
# is the op's first, the earliest its renewal can be dated (so a later taker may find it lapsed at the most
# moments its replies allow); a taker judges at its op's last epoch, the latest its judgment can fall.


def lease_step(state: tuple[str, int] | None, op: Op, key: Key) -> States:
    holder_now = None if state is None else state[0]
    if op.name == "remove":
        return [None]
    if op.name == "leases":
        holders = [lease["holder"] for lease in op.reply["leases"] if lease["thread"] == key[1]]
        return [state] if holders == ([] if holder_now is None else [holder_now]) else []
    holder = op.arg("holder")
    free = holder_now is None or holder_now == holder
    mine = (holder, op.epochs[0])
    if op.name == "take":
        lapse = op.arg("lapse_ms")
        may_lapse = lapse == 0 or lapse == HALF_HOUR_LAPSE_MS and state is not None and op.epochs[1] > state[1]
        if not op.ok:
            return [mine] if free or may_lapse else []
        took = op.reply["took"]
        if took == "took":
            return [mine] if free else []
        if took == "lapsed":
            return [mine] if not free and may_lapse else []
        # held: another holder has it (with lapse 0, a taker that lost the race to it); a lapsed lease may be
        # found held too: a clock set aside as wrong delays a takeover, never brings one forward
        return [state] if took == "held" and not free else []
    if op.name == "renew":
        if not op.ok:
            return []
        return [mine if holder_now == holder else state] if (op.reply["reply"] == "done") == (holder_now == holder) \
            else []
    if op.name == "end":
        if holder_now == holder:
            return [None]
        return [] if not op.ok else [state]
    return []


def lease_keys(op: Op) -> list[Key]:
    if op.name == "leases":
        return [(op.agent, thread) for thread in THREADS]
    return by_thread(op)


LEASES = Model("leases", frozenset({"leases"}), frozenset({"take", "renew", "end", "remove"}),
               lease_keys, None, lease_step)


# --------------------------------------------------------------------------
# Tools


def tools_step(state: tuple | None, op: Op, key: Key) -> States:
    if op.name == "tools_read":
        got = op.reply["tools"]
        return [state] if (None if got is None else tuple(got)) == state else []
    left = tuple(t for t in op.arg("tools") if state is None or t in state)
    if op.arg(SPLIT) == "effect":
        return [left]
    return [state] if tuple(op.reply["tools"]) == left else []


# A narrowing is idempotent: a compare-and-set loop that applies it again after
# a lost reply changes nothing more, and its reply (what the conversation may
# use now) may then show narrowings that came after its first landing.
TOOLS = Model("tools", frozenset({"tools_read"}), frozenset({"tools_narrow"}), by_thread, None, tools_step,
              split=frozenset({"tools_narrow"}))


# --------------------------------------------------------------------------
# Files


def file_step(state: tuple | None, op: Op, key: Key) -> States:
    version: int | None = None if state is None else state[0]
    present = state is not None
    if op.name == "file_read":
        got = op.reply["file"]
        if got is None:
            return [state] if not present else []
        data = unb64(got["data"])
        if not present or state[1] != data or version not in (None, got["version"]):
            return []
        return [(got["version"], data)]
    if op.name == "file_append":
        data = (state[1] if present else b"") + unb64(op.arg("data"))
        return [(None if not op.ok else op.reply["version"], data)]
    named = op.arg("version")
    at_named = present and version in (None, named)  # None: a version nobody was told yet
    if op.name == "file_write":
        fits = at_named if named else not present
        if not op.ok or op.reply["reply"] == "wrote":
            return [(None if not op.ok else op.reply["version"], unb64(op.arg("data")))] if fits else []
        now = op.reply["version"]  # stale: the version now, 0 for none
        if not present:
            return [state] if now == 0 and named != 0 else []
        return [(now, state[1])] if now >= 1 and now != named and version in (None, now) else []
    if op.name == "file_remove":
        if not op.ok or op.reply["found"]:
            return [None] if at_named else []
        return [state] if not present or version != named else []
    return []


FILES = Model("files", frozenset({"file_read"}), frozenset({"file_write", "file_append", "file_remove"}),
              lambda op: [(op.agent, op.arg("path"))], None, file_step)


# --------------------------------------------------------------------------
# Jobs: one ID, its job in each place


def _at(state: tuple, place: str, job: str | None) -> tuple:
    places = list(state)
    places[PLACES.index(place)] = job
    return tuple(places)


def job_step(state: tuple, op: Op, key: Key) -> States:
    unknown = not op.ok
    if op.name == "job_put":
        return [_at(state, op.arg("place"), canonical(op.arg("job")))]
    if op.name in ("job_get", "job_list"):
        jobs = [op.reply["job"]] if op.name == "job_get" else [j for j in op.reply["jobs"] if j["id"] == key[1]]
        got = jobs[0] if jobs else None
        return [state] if (None if got is None else canonical(got)) == state[PLACES.index(op.arg("place"))] else []
    if op.name == "job_remove":
        there = state[PLACES.index(op.arg("place"))] is not None
        if unknown or op.reply["found"]:
            return [_at(state, op.arg("place"), None)] if there else []
        return [state] if not there else []
    if op.name == "job_shift":
        source, target = op.arg("from"), op.arg("to")
        job = state[PLACES.index(source)]
        if unknown or op.reply["found"]:
            if job is None:
                return []
            return [state] if source == target else [_at(_at(state, source, None), target, job)]
        return [state] if job is None else []
    return []


def job_keys(op: Op) -> list[Key]:
    if op.name == "job_list":  # a look at every ID's record, each at its own moment
        return [(op.agent, job_id) for job_id in JOB_IDS]
    return [(op.agent, op.arg("job")["id"] if op.name == "job_put" else op.arg("id"))]


JOBS = Model("jobs", frozenset({"job_get", "job_list"}), frozenset({"job_put", "job_remove", "job_shift"}),
             job_keys, (None,) * len(PLACES), job_step)

MODELS = (CONVERSATIONS, LEASES, TOOLS, FILES, JOBS)

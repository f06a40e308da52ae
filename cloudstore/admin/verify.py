"""Comparing two stores through the drivers' own ops: what agents would see on each side.

Every agent found on either side is asked, on both: ``threads`` and a
``read`` of every conversation (all events), ``leases``, ``job_list`` of every
place, ``job_day``, ``job_mark``, ``tools_list``, and ``file_read`` of every
file path either side holds (paths from ``file_list``, or from keys where a
folder holds more than ``file_list`` may answer).  The due index, which no
per-agent op shows whole, is checked for consistency: every waiting job's
record names an entry that exists on its side.  Agents whose names are
hashed (no op can name them) are compared key by key instead, by payload.

First every object, of every kind (``objects``): the source is listed again,
after the copy (and before the ops, whose reads may roll a removal forward
on one side: a head rewritten with the same meaning), and each of its keys
must be in the destination holding the bytes a copy writes (job records'
entries translated), and each key the source held when the copy began must
still be in the source.  The ops cannot see everything a driver relies on: a
file's tombstone reads as no file (``null``), as does a job record's
tombstone, a removal record or fence is no event, a lease lapsed long ago is
no lease; yet a destination without them repeats versions and marks.  So a
writer that was not stopped (a file written and removed during the copy) is
caught here, by kind, the first differences of each kind named.

Each part says how far it is (``progress.Progress``, phase ``verify``):
the objects, the agents, the job records (a verification took 46 s on moto
in issue 46's trial, with nothing on stderr between its start and end).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..store.keys import decode_path
from .copying import Raw, refusal, translator
from .inspect import PLACES
from .progress import parallel_shown
from .walk import STORE_KINDS, Key, ListedAgent, Opened, OpError, agents_of, list_all, parallel

#: Differences named per kind of object; past that, a count.
NAMED_PER_KIND = 10
#: What a kind of key is, in a difference's words (walk.KINDS).
KIND_WORDS = {"event": "event block", "segment": "packed segment", "head": "conversation head (lease, removal "
              "record, fence)", "tools": "tools", "job": "job record (or its tombstone)", "mark": "job mark",
              "day": "job day", "file": "file object (or its tombstone)", "name": "agent name", "due": "due entry",
              "other": "object"}


def _op_or_error(opened: Opened, agent: dict, op: str, **args: Any) -> Any:
    try:
        return opened.op(agent, op, **args)
    except OpError as exc:
        return {"error": str(exc)}


def _sorted_jobs(reply: dict) -> Any:
    if "jobs" not in reply:
        return reply
    return sorted(reply["jobs"], key=lambda j: j["id"])


def _paths(opened: Opened, agent: dict, keys: list[Key]) -> set[str]:
    """Every live file path of ``agent``: ``file_list`` per folder, or decoded keys past its limit."""
    paths: set[str] = set()
    for folder in ("instructions", "skills"):
        reply = _op_or_error(opened, agent, "file_list", folder=folder)
        if "files" in reply:
            paths.update(reply["files"])
            continue
        base = f"{opened.root}a/"  # past 4,096 files: names from keys (hashed ones from their headers)
        for k in keys:
            if k.kind != "file" or not k.key.startswith(base):
                continue
            part = "/".join(k.parts[4:])
            if part.startswith("~/"):
                obj = opened.store.get(k.key, 8192)
                try:
                    header = None if obj is None else json.loads(obj.data.partition(b"\n")[0])
                except (ValueError, RecursionError):
                    header = None  # no file object a driver wrote: file_read answers it (as an error)
                if isinstance(header, dict) and isinstance(header.get("path"), str):
                    paths.add(header["path"])
            else:
                try:
                    paths.add(decode_path(part))
                except UnicodeDecodeError:
                    continue  # a key no driver writes
    return paths


def compare_agent(src: Opened, dst: Opened, agent: dict, src_keys: list[Key], dst_keys: list[Key]) -> list[str]:
    """The differences one agent would see between the two stores (empty when equal)."""
    out: list[str] = []
    label = f"agent {agent!r}"

    def same(what: str, get: Callable[[Opened], Any]) -> Any:
        a, b = get(src), get(dst)
        if a != b:
            out.append(f"{label}: {what} differs: source {_short(a)}, destination {_short(b)}")
        return a

    def ask(op: str, **args: Any) -> Callable[[Opened], Any]:
        return lambda o: _op_or_error(o, agent, op, **args)

    threads = same("threads", ask("threads"))
    names = sorted({t["thread"] for t in threads.get("threads", [])}) if isinstance(threads, dict) else []
    for thread in names:
        same(f"events of {thread!r}", ask("read", thread=thread))
    same("leases", lambda o: [{k: v for k, v in lease.items() if k != "lapsed"}
                              for lease in _op_or_error(o, agent, "leases", lapse_ms=0).get("leases", [])])
    for place in PLACES:
        same(f"jobs in {place}", _then(ask("job_list", place=place), _sorted_jobs))
    same("job_day", ask("job_day"))
    # The mark is a hash of its shards' versions, which are the backend's own: a copy answers another
    # number (one spurious change, as the contract allows).  Whether there is any mark is compared.
    same("whether job_mark is set", _then(ask("job_mark"), _mark_set))
    same("tools", ask("tools_list"))
    paths = sorted(_paths(src, agent, src_keys) | _paths(dst, agent, dst_keys))
    reads = parallel(lambda p: (p, _op_or_error(src, agent, "file_read", path=p),
                                _op_or_error(dst, agent, "file_read", path=p)), paths)
    for path, a, b in reads:
        if a != b:
            out.append(f"{label}: file {path!r} differs: source {_short(a)}, destination {_short(b)}")
    return out


def _mark_set(reply: Any) -> Any:
    """Of a ``job_mark`` reply, whether a mark is set (an error as it is)."""
    return reply["mark"] != 0 if isinstance(reply, dict) and "mark" in reply else reply


def _then(first: Callable[[Opened], Any], then: Callable[[Any], Any]) -> Callable[[Opened], Any]:
    return lambda o: then(first(o))


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def due_consistency(opened: Opened, keys: list[Key]) -> list[str]:
    """Every waiting job's record names a due-index entry that exists: else ``job_next`` would miss it."""
    present = {k.key for k in keys if k.kind == "due"}
    jobs = [k for k in keys if k.kind == "job"]
    out = []
    read = parallel_shown(lambda k: opened.store.get(k.key), jobs, "job records", "verify")
    for k, obj in zip(jobs, read, strict=True):
        if obj is None:
            continue
        try:
            record = json.loads(obj.data)
        except (ValueError, RecursionError):  # a record no driver wrote: the drivers answer it as malformed
            out.append(f"{opened.url}: the job record {k.rel} is not JSON")
            continue
        places = record.get("places") if isinstance(record, dict) else None
        waiting = places.get("waiting") if isinstance(places, dict) else None
        entry = waiting.get("entry") if isinstance(waiting, dict) else None
        if waiting is not None and entry not in present:
            out.append(f"{opened.url}: waiting job {k.rel} names the due entry {entry!r}, which is not there")
    return out


def compare(src: Opened, dst: Opened, src_keys: list[Key], dst_keys: list[Key],
            expected: Callable[[Key], bytes | None], copied: bool = False) -> tuple[list[str], int]:
    """Every difference between the two stores as agents see them; and how many agents were compared.

    ``copied``: ``dst`` was just copied from ``src`` (migrate), whose keys were ``src_keys`` when the copy
    began: then every object is compared too, key by key (``objects``).  Two stores read independently
    since differ there in ways no op shows (a head a reader rolled forward on one side, new nonce and all).
    """
    def by_agent(keys: list[Key]) -> dict[tuple[str, str], list[Key]]:
        out: dict[tuple[str, str], list[Key]] = {}
        for k in keys:
            if k.agent is not None:
                out.setdefault(k.agent, []).append(k)
        return out

    src_by, dst_by = by_agent(src_keys), by_agent(dst_keys)
    only_dst = [a for a in agents_of(dst_keys) if (a.owner_part, a.id_part) not in src_by]
    agents: list[ListedAgent] = agents_of(src_keys) + only_dst
    problems: list[str] = []

    def one(agent: ListedAgent) -> list[str]:
        parts = (agent.owner_part, agent.id_part)
        name = agent.name
        if name is not None:
            return compare_agent(src, dst, name, src_by.get(parts, []), dst_by.get(parts, []))
        return _compare_keys(dst, src_by.get(parts, []), dst_by.get(parts, []), expected, agent.label)

    # Objects first: the ops below may roll a removal forward on either side (a reader's duty), which
    # rewrites a head there alone, new nonce and all, with the same meaning.
    if copied:
        problems += objects(src, dst, src_keys, dst_keys)
    for found in parallel_shown(one, agents, "agents", "verify", workers=4):
        problems.extend(found)
    problems += due_consistency(dst, dst_keys)
    return problems, len(agents)


def objects(src: Opened, dst: Opened, began: list[Key], dst_keys: list[Key]) -> list[str]:
    """Every object of every kind, the source listed again now: each source key in the destination
    (``dst_keys``, listed after the copy) with the bytes a copy writes, and every key of ``began`` (the
    source when the copy began) still in the source.

    Keys only in the destination that the source never held are another matter (``--force`` into a store
    holding other things): counted by migrate, not differences.  Keys migrate refuses to copy are named by
    migrate.
    """

    now = {k.rel: k for k in list_all(src) if k.kind not in STORE_KINDS}
    there = {k.rel: k for k in dst_keys if k.kind not in STORE_KINDS}
    found: dict[str, list[str]] = {}

    def differ(key: Key, what: str) -> None:
        found.setdefault(key.kind, []).append(f"{KIND_WORDS.get(key.kind, key.kind)} {key.rel} {what}")

    for rel in sorted(set(k.rel for k in began) - set(now)):
        if rel in there:
            differ(there[rel], "is no longer in the source (deleted during the copy), still in the destination")
    raw_src, raw_dst, translate = Raw(src), Raw(dst), translator(src.root, dst.root)

    def judge(key: Key) -> str | None:
        raw = raw_src.get(key.key)
        if raw is None:
            return None  # deleted since this listing: a writer was at work (the source's keys are judged again)
        if refusal(src.root, key, raw) is not None:
            return None
        if key.rel not in there:
            return "is in the source only (written during the copy, or after it)"
        got = raw_dst.get(there[key.rel].key)
        if got is None:
            return "is in the source only (gone from the destination)"
        if got != translate(key, raw):
            return "holds other bytes in the destination than the source's (changed during the copy?)"
        return None

    keys = sorted(now.values(), key=lambda k: k.rel)
    for key, what in zip(keys, parallel_shown(judge, keys, "objects", "verify"), strict=True):
        if what is not None:
            differ(key, what)
    out: list[str] = []
    for kind in sorted(found):
        lines = found[kind]
        out.extend(f"objects: {line}" for line in lines[:NAMED_PER_KIND])
        if len(lines) > NAMED_PER_KIND:
            out.append(f"objects: {len(lines) - NAMED_PER_KIND} more {KIND_WORDS.get(kind, kind)}s differ")
    return out


def _compare_keys(dst: Opened, src_keys: list[Key], dst_keys: list[Key],
                  expected: Callable[[Key], bytes | None], label: str) -> list[str]:
    """A hashed agent, key by key: the destination holds exactly the (translated) source objects."""
    out = []
    src_rel = {k.rel: k for k in src_keys}
    dst_rel = {k.rel: k for k in dst_keys}
    for rel in sorted(set(src_rel) ^ set(dst_rel)):
        out.append(f"{label}: key {rel} is on one side only")
    for rel in sorted(set(src_rel) & set(dst_rel)):
        want = expected(src_rel[rel])
        got = dst.store.backend.get(dst_rel[rel].key)
        if want is None or got is None or got[0] != want:
            out.append(f"{label}: key {rel} differs")
    return out

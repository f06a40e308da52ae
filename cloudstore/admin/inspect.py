"""``inspect``: what a store holds, per agent and in total, read through the drivers' own ops.

Whatever an op tells (conversations and their lengths, live leases, jobs per
place, files, tools narrowings) is asked of ``Service`` exactly as a driver
would answer it, so the report shows what agents see.  Only what no op
tells comes from key listings: which agents exist, ended-lease heads, the
shared due index, object counts and bytes.

Reading through ops is not side-effect free, by the drivers' own design:
``threads``/``last`` roll forward a removal a crash left half-done, and
``job_list`` sweeps job-record tombstones older than an hour.  Both are what
any reader of the store does; neither changes what an op answers.
``job_next`` is never called (it deletes stale index entries): the index
is read from its listing instead.
"""

from __future__ import annotations

import base64
import json
import math
from collections import defaultdict
from typing import Any

from ..store.claim_index import GRACE as CLAIM_GRACE
from ..store.claim_index import parse_entry as parse_claim
from ..store.due_index import GRACE, DueEntry, parse_entry
from ..store.heads import has_lease
from ..store.keys import claim_record, claim_root, due_record, due_root
from .progress import Progress
from .walk import KINDS, Key, ListedAgent, Opened, OpError, agents_of, list_all, parallel, readable

PLACES = ("waiting", "firing", "ending")
AGENT_WORKERS = 16  # agents reported at once (each runs its own requests in parallel too)

#: The kinds ``inspect`` counts, in the order it shows them: walk.KINDS, and the file ledger beside the files.
SHOWN_KINDS = tuple(k for kind in KINDS for k in ((kind, "ledger") if kind == "file" else (kind,)))


def shown_kind(key: Key) -> str:
    """The kind ``inspect`` counts ``key`` under: walk's, but an agent's file ledger is its own kind.

    walk.classify has no kind for ``a/<owner>/<id>/ledger`` (files.py keeps
    there which file objects are older than sizes that say their state), so
    it was counted as ``other``, the kind that means "not recognised": an
    operator reading the totals took the drivers' own object for garbage.
    Here only: gc, migrate and format judge keys by walk's kinds, and none of
    them treats ``other`` as deletable.
    """
    if key.kind == "other" and key.agent is not None and key.parts[3:] == ["ledger"]:
        return "ledger"
    return key.kind


def tombstone_head(head: Any) -> bool:
    """A head that says no more than an absent head would: no lease, epoch 0, nothing pending.

    Such a head is what an ended lease leaves on a conversation that was never
    removed (the scheduler leaves one per job id it fires).  Deleting it
    changes no answer of any op: an absent head reads as ``{"thread", "epoch": 0}``.
    Its ended lease's fence (``started``, since store format 5) goes with it: a
    take after the delete writes store time now, past a fence of a lease ended
    long before (gc deletes only heads unchanged for long).
    Any other field (a packing hint, a removal record, an unknown field) keeps it.
    """
    return (isinstance(head, dict) and not has_lease(head) and set(head) <= {"thread", "epoch", "started"}
            and head.get("epoch", 0) == 0)


def _agent_report(opened: Opened, agent: ListedAgent, keys: list[Key], lapse_ms: int, now_ms: int) -> dict:
    out: dict[str, Any] = {
        "owner_part": agent.owner_part, "id_part": agent.id_part,
        "objects": len(keys), "bytes": sum(k.size for k in keys),
    }
    name = agent.name
    heads = [k for k in keys if k.kind == "head"]
    head_values = parallel(lambda k: _json_or_none(opened, k), heads)
    out["heads"] = len(heads)
    out["lease_tombstones"] = sum(1 for h in head_values if tombstone_head(h))
    out["removals_pending"] = sum(len(h.get("removed", [])) for h in head_values if isinstance(h, dict))
    if name is None:  # a hashed agent: no op can name it; counts from keys only
        out.update({"owner": None, "id": None, "hashed": True})
        counts = {kind: sum(1 for k in keys if shown_kind(k) == kind) for kind in SHOWN_KINDS}
        out["kinds"] = {kind: n for kind, n in counts.items() if n}
        return out
    out.update({"owner": name["owner"], "id": name["id"], "hashed": False})
    out["conversations"] = opened.op(name, "threads")["threads"]
    out["events"] = sum(t["last"] for t in out["conversations"])
    leases = opened.op(name, "leases", lapse_ms=lapse_ms)["leases"]
    for lease in leases:
        renewed_ms = round(lease["renewed"] * 1000)
        lease["left_ms"] = max(0, lapse_ms - (now_ms - renewed_ms))
    out["leases"] = leases
    out["ended_leases"] = len(heads) - len(leases)
    jobs: dict[str, Any] = {}
    for place in PLACES:
        listed = opened.op(name, "job_list", place=place)["jobs"]
        dues = [j["due"] for j in listed if _finite_number(j.get("due"))]
        jobs[place] = {"count": len(listed), "soonest": min(dues) if dues else None}
    out["jobs"] = jobs
    paths: list[str] = []
    for folder in ("instructions", "skills"):
        try:
            paths += opened.op(name, "file_list", folder=folder)["files"]
        except OpError as exc:  # over 4,096 files: the op refuses rather than cut the list
            out.setdefault("errors", []).append(str(exc))
    files = parallel(lambda p: opened.op(name, "file_read", path=p)["file"], paths)
    out["files"] = {
        "count": sum(1 for f in files if f is not None),
        "bytes": sum(len(base64.b64decode(f["data"])) for f in files if f is not None),
    }
    out["tools"] = opened.op(name, "tools_list")["narrowed"]
    return out


def _json_or_none(opened: Opened, key: Key) -> Any:
    obj = opened.store.get(key.key)
    if obj is None:
        return None
    try:
        return json.loads(obj.data)
    except (ValueError, RecursionError):
        return None


def due_report(opened: Opened, keys: list[Key], now: float) -> dict:
    """The shared index from its listing: entries, the soonest due, and entries no job record names."""
    root = due_root(opened.root)
    listed = [k for k in keys if k.kind == "due"]
    parsed = {k.key: parse_entry(k.key[len(root):]) for k in listed}
    entries = [k for k in listed if parsed[k.key] is not None]  # foreign garbage is shown, never judged
    records: dict[str, list[Key]] = defaultdict(list)
    for k in entries:
        records[record_key(opened.root, k.key)].append(k)
    names = dict(zip(records, parallel(lambda rk: named_entry(opened, rk), list(records)), strict=True))
    unnamed = [k for k in entries if names[record_key(opened.root, k.key)] != k.key]
    return {
        "entries": len(entries),
        "soonest": _soonest(parsed[entries[0].key]) if entries else None,
        "foreign": len(listed) - len(entries),
        "unnamed": len(unnamed),
        "unnamed_past_grace": sum(1 for k in unnamed if now - k.modified >= GRACE),
    }


def claim_report(opened: Opened, keys: list[Key], now: float) -> dict:
    """The shared claim index (claim_index.py) from its listing: entries, and those whose job record
    holds no job in firing (a crash's leftovers; past the grace, ``gc`` deletes them)."""
    root = claim_root(opened.root)
    listed = [k for k in keys if k.kind == "claim"]
    parsed = {k.key: parse_claim(k.key[len(root):]) for k in listed}
    entries = [k for k in listed if parsed[k.key] is not None]  # foreign garbage is shown, never judged
    records = sorted({claimed_record(opened.root, k.key) for k in entries})
    firing = dict(zip(records, parallel(lambda rk: holds_firing(opened, rk), records), strict=True))
    unfiring = [k for k in entries if not firing[claimed_record(opened.root, k.key)]]
    return {
        "entries": len(entries),
        "oldest_s": round(max((now - k.modified for k in entries), default=0.0), 3) if entries else None,
        "foreign": len(listed) - len(entries),
        "not_firing": len(unfiring),
        "not_firing_past_grace": sum(1 for k in unfiring if now - k.modified >= CLAIM_GRACE),
    }


def claimed_record(root: str, entry: str) -> str:
    """The job record a claim-index entry (a whole key, parsable) belongs to."""
    parsed = parse_claim(entry[len(claim_root(root)):])
    assert parsed is not None, entry
    token, job_part, _ = parsed
    return claim_record(root, token, job_part)


def holds_firing(opened: Opened, record: str) -> bool:
    """Whether a job record holds a job in firing (what keeps its claim-index entry)."""
    obj = opened.store.get(record)
    if obj is None:
        return False
    try:
        places = json.loads(obj.data).get("places", {})
    except (ValueError, AttributeError, TypeError, RecursionError):
        return False
    return isinstance(places, dict) and isinstance(places.get("firing"), dict)


def _finite_number(value: Any) -> bool:
    """Whether a due read back can be shown as JSON (a hostile record may hold anything)."""
    return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value)


def _soonest(entry: DueEntry | None) -> float | int | None:
    return entry.due if entry is not None else None


def record_key(root: str, entry: str) -> str:
    """The job record a due-index entry belongs to (``keys.due_record``: keys are built there only)."""
    return due_record(root, entry)


def named_entry(opened: Opened, record: str) -> str | None:
    """The due-index entry a job record names for its waiting place, or None."""
    obj = opened.store.get(record)
    if obj is None:
        return None
    try:
        waiting = json.loads(obj.data).get("places", {}).get("waiting")
    except (ValueError, AttributeError, TypeError, RecursionError):
        return None
    return waiting.get("entry") if isinstance(waiting, dict) else None


def inspect(opened: Opened, lapse_ms: int = 30_000, show_progress: bool = False) -> dict:
    """The whole report as one JSON-able document (progress over the agents on stderr if asked)."""
    record = readable(opened)
    keys = list_all(opened)
    now = opened.store.clock.now()
    by_agent: dict[tuple[str, str], list[Key]] = defaultdict(list)
    for k in keys:
        if k.agent is not None:
            by_agent[k.agent].append(k)
    agents = agents_of(keys)
    progress = Progress(len(agents), what="agents", sized=False, phase="inspect") if show_progress else None

    def report(agent: ListedAgent) -> dict:
        """One agent's report; an agent whose objects make an op fail is shown with the error, and
        the others are still inspected (one hostile or broken agent stops no one's report)."""
        try:
            return _agent_report(opened, agent, by_agent[(agent.owner_part, agent.id_part)], lapse_ms,
                                 int(now * 1000))
        except (OpError, ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
            why = str(exc) if isinstance(exc, OpError) else f"its objects are malformed ({type(exc).__name__})"
            return {"owner_part": agent.owner_part, "id_part": agent.id_part, "errors": [why]}
        finally:
            if progress is not None:
                progress.add()

    # Agents side by side: each report is ~30 requests one after another, so 1,000 agents at a
    # cloud's 20 ms would take 10 minutes in a row; AGENT_WORKERS at once bring that to seconds.
    try:
        reports = parallel(report, agents, workers=AGENT_WORKERS)
    finally:
        if progress is not None:
            progress.close()
    kinds: dict[str, dict[str, int]] = {}
    for k in keys:
        slot = kinds.setdefault(shown_kind(k), {"objects": 0, "bytes": 0})
        slot["objects"] += 1
        slot["bytes"] += k.size
    return {
        "store": opened.url,
        "format": record,
        "lapse_ms": lapse_ms,
        "agents": reports,
        "due_index": due_report(opened, keys, now),
        "claim_index": claim_report(opened, keys, now),
        "totals": {
            "agents": len(agents),
            "objects": len(keys),
            "bytes": sum(k.size for k in keys),
            "kinds": {kind: kinds[kind] for kind in SHOWN_KINDS if kind in kinds},
        },
    }


def _due(value: Any) -> str:
    if value is None:
        return "-"
    import datetime

    try:
        return f"{value} ({datetime.datetime.fromtimestamp(float(value), datetime.timezone.utc):%Y-%m-%d %H:%M:%S}Z)"
    except (OverflowError, ValueError, OSError):
        return str(value)


def table(report: dict) -> str:
    """The report for people: one block per agent, then the index and the totals."""
    record = report.get("format")
    lines = [f"store {report['store']}  (lapse judged at {report['lapse_ms']} ms)",
             "format record: none (a legacy store)" if record is None else
             f"format record: reader {record['reader']}, writer {record['writer']}, features "
             f"{record['features'] or 'none'}, written by {record['by'] or 'unknown'}", ""]
    for a in report["agents"]:
        if "hashed" not in a:  # its report failed: an op on its objects answered an error
            lines.append(f"agent {a['owner_part']}/{a['id_part']}: not inspected: {'; '.join(a['errors'])}")
            lines.append("")
            continue
        if a["hashed"]:
            lines.append(f"agent (hashed name) {a['owner_part']}/{a['id_part']}: {a['objects']} objects, "
                         f"{a['bytes']} bytes; no op can name it: {a['kinds']}")
            lines.append("")
            continue
        owner = "(no owner)" if a["owner"] is None else repr(a["owner"])
        lines.append(f"agent {a['id']!r} owner {owner}: {a['objects']} objects, {a['bytes']} bytes")
        lines.append(f"  conversations {len(a['conversations'])}, events {a['events']}")
        for t in a["conversations"]:
            lines.append(f"    {t['thread']!r:40} {t['last']:>8} events")
        lines.append(f"  leases {len(a['leases'])} live, {a['ended_leases']} heads without one "
                     f"({a['lease_tombstones']} tombstones gc may delete), {a['removals_pending']} removals pending")
        for lease in a["leases"]:
            state = "lapsed" if lease["lapsed"] else f"{lease['left_ms'] / 1000:.1f}s left"
            lines.append(f"    {lease['thread']!r:40} held by {lease['holder']!r} ({state})")
        counts = ", ".join(f"{p} {a['jobs'][p]['count']}" for p in PLACES)
        lines.append(f"  jobs {counts}; soonest waiting {_due(a['jobs']['waiting']['soonest'])}")
        for p in ("firing", "ending"):
            if a["jobs"][p]["count"]:
                lines.append(f"    soonest {p}: {_due(a['jobs'][p]['soonest'])}")
        lines.append(f"  files {a['files']['count']}, {a['files']['bytes']} bytes")
        lines.append(f"  tools narrowed in {len(a['tools'])} conversations")
        for thread, tools in sorted(a["tools"].items()):
            lines.append(f"    {thread!r:40} {', '.join(tools) or '(none)'}")
        for err in a.get("errors", []):
            lines.append(f"  ! {err}")
        lines.append("")
    d = report["due_index"]
    lines.append(f"due index: {d['entries']} entries, soonest {_due(d['soonest'])}, "
                 f"{d['unnamed']} no job names ({d['unnamed_past_grace']} past the {GRACE:.0f} s grace)")
    if d.get("foreign"):
        lines.append(f"  {d['foreign']} foreign objects in the index (not entries this layout writes, or a due "
                     "out of range): skipped by every reader; `gc --apply` deletes them")
    c = report.get("claim_index")
    if c is not None:
        lines.append(f"claim index: {c['entries']} jobs in firing, {c['not_firing']} no longer firing "
                     f"({c['not_firing_past_grace']} past the {CLAIM_GRACE:.0f} s grace)")
        if c.get("foreign"):
            lines.append(f"  {c['foreign']} foreign objects in the claim index (not entries this layout "
                         "writes): skipped by every reader; `gc --apply` deletes them")
    t = report["totals"]
    lines.append(f"totals: {t['agents']} agents, {t['objects']} objects, {t['bytes']} bytes")
    for kind, v in t["kinds"].items():
        lines.append(f"  {kind:8} {v['objects']:>9} objects {v['bytes']:>12} bytes")
    return "\n".join(lines)

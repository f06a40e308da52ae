"""``gc``: delete what is provably dead, each delete conditional on the version judged dead.

What it may delete (nothing else, ever):

* **Lease tombstones.**  A head (``l/<thread>``) that says no more than an
  absent head: no holder, epoch 0, no removal record, no packing hint
  (``inspect.tombstone_head``).  An ended lease leaves one (the scheduler one
  per job id it fires).  Deleting it changes no op's answer, since an absent
  head reads as epoch 0 with no lease.  It must be unchanged for
  ``min_age`` (default 120 s: past any retry of the write that made it, whose
  own-write check would otherwise find the key gone and answer ``outcome
  unknown``), and the delete names the version read: a taker who re-takes the
  lease in between changes the version, and the delete fails (kept).  Where
  the store does not honour a conditional delete (fake-gcs-server ignores
  ``ifGenerationMatch`` on delete; checked by a probe before deleting),
  tombstones are kept: an unconditional delete could drop a lease taken a
  moment before.
* **Due-index entries no job record names**, older than ``due_index.GRACE``
  (what ``job_next`` itself deletes when it meets one first in line).  Each
  entry key carries a fresh nonce and is written by one op only (once, or
  once more by that op after a pause, once its record landed: jobs.py), so
  a delete at its listed version can only remove the write judged dead.
* **Leftovers of removed epochs** (removal.py).  A removal record in a head
  whose removal is older than ``removal.PURGE_AFTER_MS``: not yet fenced, gc
  fences it through the drivers' own roll-forward (a create, never a
  delete); fenced, gc deletes the epoch's segments and its events below the
  fence, each at its listed version, then drops the record from the head with
  a conditional write (as the driver's purge would).  An epoch below the
  current one with no record left (its purge finished, then a late packer or
  a long-paused appender wrote into it): its segments and events below its
  fence, older than ``PURGE_AFTER_MS``; if no fence is found, all of it is
  kept.  Fences themselves are never deleted.

Never: events of a live epoch, a head with a lease or anything besides
``thread``/``epoch: 0``, job records (the drivers sweep their own tombstones),
files and their tombstones, tools, marks, days, name records, objects it does
not recognise.  When in doubt, keep.

Its reads and deletes say how far they are (``progress.Progress``, phases
``gc judge`` and ``gc delete``): a store of 4,700 objects on moto took 14 to
22 s with nothing on stderr before.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..generations import Create, NotFound, PreconditionFailed, StoreError, Update, new_nonce
from ..runtime import strict_json
from ..store import stored
from ..store.claim_index import parse_entry as parse_claim
from ..store.conversations import Conversations
from ..store.due_index import GRACE, parse_entry
from ..store.heads import checked, epoch_of
from ..store.keys import claim_root, conversation_key, due_root, name_part
from ..store.removal import FENCE, PURGE_AFTER_MS
from ..store.space import KEEP, Contention
from .inspect import claimed_record, holds_firing, named_entry, record_key, tombstone_head
from .progress import parallel_shown
from .walk import ADMIN_PREFIX, Key, ListedAgent, Opened, list_all, readable

log = logging.getLogger("cloudstore")

#: How long a lease tombstone must have stood unchanged before gc deletes it (seconds).
MIN_AGE = 120.0


@dataclass
class Policy:
    """What gc judges by.  ``now`` is the store's time (seconds); tests move it, nothing else does."""

    min_age: float = MIN_AGE
    grace: float = GRACE
    purge_after_ms: int = PURGE_AFTER_MS
    now: Callable[[], float] | None = None


@dataclass(frozen=True)
class Doomed:
    """One object judged dead: which version, of what kind, and why."""

    kind: str  # "lease-tombstone", "due-orphan", "due-foreign", "claim-orphan", "claim-foreign", "dead-epoch"
    key: str
    version: str | None
    why: str
    needs_conditional: bool = True  # unsafe to delete where the store ignores a delete's version


@dataclass
class Plan:
    """What one gc pass judged: deletions, roll-forward writes, and what it kept and why."""

    doomed: list[Doomed] = field(default_factory=list)
    fences: list[tuple[Key, dict]] = field(default_factory=list)  # (head key, head) with unfenced old removals
    records: list[tuple[Key, int, int]] = field(default_factory=list)  # (head key, epoch, fence) to drop once purged
    notes: list[str] = field(default_factory=list)


@dataclass
class Result:
    """What an applied pass did."""

    deleted: dict[str, int] = field(default_factory=dict)
    kept_changed: dict[str, int] = field(default_factory=dict)  # changed since judged: the writer won
    kept_unsafe: dict[str, int] = field(default_factory=dict)  # the store ignores a delete's version
    gone: dict[str, int] = field(default_factory=dict)  # already deleted by someone else
    fenced: int = 0
    records_dropped: int = 0


def _bump(counts: dict[str, int], kind: str) -> None:
    counts[kind] = counts.get(kind, 0) + 1


def _parse(data: bytes) -> Any:
    """A stored head as gc may judge it: strict JSON that the drivers' own check accepts, else None
    (a head no driver wrote: kept, and nothing under it judged dead)."""
    try:
        value = strict_json.loads(data.decode("utf-8"))
        if isinstance(value, dict) and isinstance(value.get("thread"), str):
            return checked(value["thread"], value)
    except (ValueError, UnicodeDecodeError, RecursionError, stored.Malformed):
        pass
    return None


def judge(opened: Opened, policy: Policy | None = None) -> Plan:
    """Read the store and decide; writes nothing."""
    policy = policy or Policy()
    now = (policy.now or opened.store.clock.earliest)()  # doomed by the least plausible age only
    plan = Plan()
    keys = list_all(opened)
    heads = [k for k in keys if k.kind == "head"]
    objs = parallel_shown(lambda k: opened.store.get(k.key), heads, "heads", "gc judge")
    head_of: dict[str, tuple[Key, Any]] = {}
    for k, obj in zip(heads, objs, strict=True):
        if obj is None:
            continue
        value = _parse(obj.data)
        head_of[k.key] = (k, value)
        if not tombstone_head(value):
            continue
        if obj.version != k.version:
            plan.notes.append(f"kept {k.key}: changed between listing and reading")
            continue
        age = now - k.modified
        if age < policy.min_age:
            continue
        plan.doomed.append(Doomed("lease-tombstone", k.key, obj.version,
                                  f"ended lease, nothing else in the head, unchanged for {age:.0f} s"))
    _judge_due(opened, keys, now, policy, plan)
    _judge_claims(opened, keys, now, policy, plan)
    _judge_epochs(opened, keys, head_of, now, policy, plan)
    return plan


def _judge_due(opened: Opened, keys: list[Key], now: float, policy: Policy, plan: Plan) -> None:
    root = due_root(opened.root)
    listed = [k for k in keys if k.kind == "due"]
    entries = [k for k in listed if parse_entry(k.key[len(root):]) is not None]
    for k in listed:
        if k not in entries and now - k.modified >= policy.grace and k.version is not None:
            plan.doomed.append(Doomed("due-foreign", k.key, k.version,
                                      "not an entry this layout writes (unparsable, or a due out of range), "
                                      f"{now - k.modified:.0f} s old", needs_conditional=False))
    old = [k for k in entries if now - k.modified >= policy.grace]
    records = sorted({record_key(opened.root, k.key) for k in old})
    named = dict(zip(records, parallel_shown(lambda r: named_entry(opened, r), records, "job records (due index)",
                                             "gc judge"), strict=True))
    for k in old:
        if named[record_key(opened.root, k.key)] == k.key or k.version is None:
            continue
        plan.doomed.append(Doomed("due-orphan", k.key, k.version,
                                  f"no job record names it, {now - k.modified:.0f} s old (grace {policy.grace:.0f} s)",
                                  needs_conditional=False))


def _judge_claims(opened: Opened, keys: list[Key], now: float, policy: Policy, plan: Plan) -> None:
    """Claim-index entries (claim_index.py) whose job record holds no job in firing, past the grace,
    and foreign objects there.  An entry's key is its job's own, written again when the job enters
    firing anew: the delete names the listed version (a conditional delete), so a claim writing it
    meanwhile keeps it."""
    root = claim_root(opened.root)
    listed = [k for k in keys if k.kind == "claim"]
    entries = [k for k in listed if parse_claim(k.key[len(root):]) is not None]
    for k in listed:
        if k not in entries and now - k.modified >= policy.grace and k.version is not None:
            plan.doomed.append(Doomed("claim-foreign", k.key, k.version,
                                      f"not an entry this layout writes, {now - k.modified:.0f} s old",
                                      needs_conditional=False))
    old = [k for k in entries if now - k.modified >= policy.grace and k.version is not None]
    records = sorted({claimed_record(opened.root, k.key) for k in old})
    firing = dict(zip(records, parallel_shown(lambda r: holds_firing(opened, r), records,
                                              "job records (claim index)", "gc judge"), strict=True))
    for k in old:
        if not firing[claimed_record(opened.root, k.key)]:
            plan.doomed.append(Doomed("claim-orphan", k.key, k.version,
                                      f"its job is not in firing, {now - k.modified:.0f} s old "
                                      f"(grace {policy.grace:.0f} s)"))


def _judge_epochs(opened: Opened, keys: list[Key], head_of: dict[str, tuple[Key, Any]], now: float,
                  policy: Policy, plan: Plan) -> None:
    # (agent, thread part) -> epoch -> keys
    epochs: dict[tuple[str, str, str], dict[int, list[Key]]] = defaultdict(lambda: defaultdict(list))
    for k in keys:
        if k.kind in ("event", "segment"):
            p = k.parts
            epochs[(p[1], p[2], p[4])][k.in_conversation.epoch].append(k)
    for key, head in head_of.values():  # a pending removal may have no key left to list under it
        if isinstance(head, dict) and head.get("removed"):
            epochs[(key.parts[1], key.parts[2], key.parts[4])]  # noqa: B018 - touch the default
    for (owner, agent_id, thread_part), by_epoch in epochs.items():
        head_key = f"{opened.root}a/{owner}/{agent_id}/l/{thread_part}"
        found = head_of.get(head_key)
        if found is None:
            if any(e > 0 for e in by_epoch):
                plan.notes.append(f"kept {len(by_epoch)} epochs under {thread_part}: no head, yet epochs past 0")
            continue
        key, head = found
        if not isinstance(head, dict):
            plan.notes.append(f"kept epochs under {head_key}: its head is not readable JSON")
            continue
        current = epoch_of(head)
        records = {int(r["epoch"]): r for r in head.get("removed", []) if isinstance(r, dict) and "epoch" in r}
        for e, r in records.items():
            if now * 1000 - int(r.get("at", now * 1000)) < policy.purge_after_ms:
                continue  # the remover (or the next reader) is still within its time
            if r.get("fence") is None:
                plan.fences.append((key, head))
                continue
            fence = int(r["fence"])
            for k in by_epoch.get(e, []):
                if k.kind == "segment" or k.in_conversation.seq < fence:
                    plan.doomed.append(Doomed("dead-epoch", k.key, k.version,
                                              f"epoch {e} removed, fenced at {fence}: purge cut short",
                                              needs_conditional=False))
            plan.records.append((key, e, fence))
        for e, items in by_epoch.items():
            if e >= current or e in records:
                continue  # live, or handled above with its record
            if any(now - k.modified < policy.purge_after_ms / 1000 for k in items):
                continue
            events = sorted((k for k in items if k.kind == "event"), key=lambda k: k.in_conversation.seq)
            found_fence = _fence_of(opened, events)
            if found_fence is None:
                plan.notes.append(f"kept epoch {e} of {head_key}: removed and purged, but no fence found")
                continue
            for k in items:
                if k.kind == "segment" or k.in_conversation.seq < found_fence:
                    plan.doomed.append(Doomed("dead-epoch", k.key, k.version,
                                              f"epoch {e} removed and purged long ago; written into it since",
                                              needs_conditional=False))


def _fence_of(opened: Opened, events: list[Key]) -> int | None:
    """The fence's number in a dead epoch: its last event key, if that holds the fence."""
    if not events:
        return None
    obj = opened.store.get(events[-1].key)
    if obj is None or obj.data != FENCE:
        return None
    return events[-1].in_conversation.seq


def honours_conditional_delete(opened: Opened) -> bool:
    """Whether the store refuses a delete naming a version the object no longer has.

    Probes a key of its own below ``_admin/``: create, update, delete at the
    first version.  GCS, S3 and the folder refuse; fake-gcs-server does not.
    """
    store = opened.store
    key = f"{opened.root}{ADMIN_PREFIX}probe-{new_nonce()}"
    first = store.put(key, b"", Create())
    second = store.put(key, b"probe", Update.of(first))
    try:
        store.delete(key, first.version)
    except PreconditionFailed:
        store.delete(key, second.version)
        return True
    return False


def apply(opened: Opened, plan: Plan, conditional: bool) -> Result:
    """Carry the plan out: every delete at the version judged; roll-forward writes as the drivers make them."""
    result = Result()
    conv = Conversations(opened.space)
    for key, head in plan.fences:
        agent = ListedAgent(owner_part=key.parts[1], id_part=key.parts[2])
        thread = head.get("thread")
        if not isinstance(thread, str) or name_part(thread) != key.parts[4]:
            continue
        unfenced = [r for r in head.get("removed", []) if r.get("fence") is None]
        try:
            conv.removals.roll_forward(agent.keys(opened.root), thread, {"removed": unfenced})
        except (StoreError, Contention) as exc:  # the next pass (or the next reader) tries again
            log.warning("fencing a removal of %s left for later: %s", key.key, exc)
            continue
        result.fenced += len(unfenced)

    def delete(d: Doomed) -> tuple[Doomed, str]:
        if d.needs_conditional and not conditional:
            return d, "unsafe"
        try:
            return d, ("deleted" if opened.store.delete(d.key, d.version) else "gone")
        except PreconditionFailed:
            return d, "changed"
        except NotFound:
            return d, "gone"

    outcomes = parallel_shown(delete, plan.doomed, "objects", "gc delete")
    failed_epochs: set[tuple[str, int]] = set()  # (agent/c/thread, epoch)
    for d, outcome in outcomes:
        counts = {"deleted": result.deleted, "gone": result.gone, "changed": result.kept_changed,
                  "unsafe": result.kept_unsafe}[outcome]
        _bump(counts, d.kind)
        if d.kind == "dead-epoch" and outcome == "changed":
            parts = d.key[len(opened.root):].split("/")
            found = conversation_key("/".join(parts[5:]))
            if found is not None:
                failed_epochs.add(("/".join(parts[1:3] + parts[4:5]), found.epoch))
    for key, epoch, fence in plan.records:
        if ("/".join(key.parts[1:3] + key.parts[4:5]), epoch) in failed_epochs:
            continue
        if _drop_record(opened, key, epoch, fence):
            result.records_dropped += 1
    return result


def _drop_record(opened: Opened, key: Key, epoch: int, fence: int) -> bool:
    """Forget a purged epoch's record in its head, by a conditional write (the driver's purge does the same)."""
    def change(head: dict | None) -> tuple[Any, bool]:
        if not isinstance(head, dict):
            return KEEP, False
        records = head.get("removed", [])
        rest = [r for r in records if not (int(r["epoch"]) == epoch and r.get("fence") == fence)]
        if len(rest) == len(records):
            return KEEP, False
        body = {k: v for k, v in head.items() if k != "removed"}
        return ({**body, "removed": rest} if rest else body), True

    try:
        return bool(opened.space.update(key.key, change))
    except (StoreError, Contention):
        return False


def run(opened: Opened, do_apply: bool, policy: Policy | None = None) -> tuple[Plan, Result | None, bool | None]:
    """One pass: judge, and with ``do_apply`` probe the store's conditional delete and apply."""
    readable(opened)  # a store of a newer format is judged by a release that knows it, never by this one
    plan = judge(opened, policy)
    if not do_apply:
        return plan, None, None
    conditional = honours_conditional_delete(opened)
    return plan, apply(opened, plan, conditional), conditional


def report(plan: Plan, result: Result | None, conditional: bool | None) -> dict:
    """One JSON-able summary of a pass."""
    by_kind: dict[str, int] = {}
    for d in plan.doomed:
        _bump(by_kind, d.kind)
    out: dict[str, Any] = {
        "applied": result is not None,
        "judged_dead": by_kind,
        "fences_due": sum(1 for _, head in plan.fences for r in head.get("removed", []) if r.get("fence") is None),
        "records_to_drop": len(plan.records),
        "items": [{"kind": d.kind, "key": d.key, "why": d.why} for d in plan.doomed],
        "notes": plan.notes,
    }
    if result is not None:
        out.update({
            "conditional_delete_honoured": conditional,
            "deleted": result.deleted, "kept_changed_since_judged": result.kept_changed,
            "kept_no_conditional_delete": result.kept_unsafe, "already_gone": result.gone,
            "fenced": result.fenced, "records_dropped": result.records_dropped,
        })
    return out


def text(summary: dict) -> str:
    """The summary for people."""
    verb = "deleting" if summary["applied"] else "would delete"
    lines = [f"{verb} {item['kind']} {item['key']}: {item['why']}" for item in summary["items"]]
    lines += [f"note: {n}" for n in summary["notes"]]
    lines.append("judged dead: " + (_counts(summary["judged_dead"]) or "nothing"))
    if summary["fences_due"]:
        lines.append(f"removals to fence (roll forward): {summary['fences_due']}")
    if not summary["applied"]:
        lines.append("dry run: nothing was changed (run again with --apply; lease tombstones are deleted only "
                     "where the store honours a conditional delete, checked then)")
        return "\n".join(lines)
    if not summary["conditional_delete_honoured"]:
        lines.append("this store ignores a delete's version (fake-gcs-server does): lease tombstones were kept")
    for name in ("deleted", "kept_changed_since_judged", "kept_no_conditional_delete", "already_gone"):
        lines.append(f"{name.replace('_', ' ')}: " + (_counts(summary[name]) or "0"))
    lines.append(f"fenced {summary['fenced']}, removal records dropped {summary['records_dropped']}")
    return "\n".join(lines)


def _counts(by_kind: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items()))

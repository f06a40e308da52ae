"""``lnk-store-admin format``: see a store's format record and the layouts it holds; lower it where provably safe.

A store's record (store_format.py) says the least reader and writer a driver
must be.  Drivers raise it themselves (before their first write); an
operator lowers it, to roll back to a release that reads records but not
the newest layout, and only where a walk of every key proves that nothing
of a newer layout is stored.  What each layout looks like is keys.py's; the
walk tells them apart by key alone (no object is read):

* layout 1 (0.3.0): conversations oldest first, ``c/<thread>/e<epoch>/...``;
* layout 2 (0.4.0): conversations newest first, ``c/<thread>/d.../`` and ``p.../``;
* layout 3 (0.5.0): file keys ending ``%``, the file ledger, the mark's shards
  ``m/<k>``, the claim index ``_claim/``.

Releases before 0.6.0 know no record at all: lowering it cannot make them
safe, so ``format`` also says, for each of them, whether this store holds
anything it would misread (docs/admin.md, "Upgrading and rolling back").
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gate import store_format
from ..gate.store_gate import FormatRefused, StoreGate
from ..generations import AlreadyExists, Create, PreconditionFailed, Update
from ..store.keys import conversation_key
from .walk import Key, Opened, list_all

#: Releases that know no record, the newest layout each reads (CHANGELOG.md).
RECORDLESS = (("0.3.0", 1), ("0.4.0", 2), ("0.4.1", 2), ("0.5.0", 3))


def layout_of(key: Key) -> int | None:
    """The layout a key first appeared in, when the key tells (None: every layout writes it alike)."""
    parts = key.parts
    if key.kind in ("event", "segment"):
        found = conversation_key("/".join(parts[5:]))
        return None if found is None else (2 if found.newest_first else 1)
    if key.kind == "claim":
        return 3
    if key.kind == "mark" and len(parts) == 5:
        return 3  # a shard, m/<k>; the single ``mark`` is every layout's
    if key.kind == "file" and key.rel.endswith("%"):
        return 3
    if key.agent is not None and len(parts) == 4 and parts[3] == "ledger":
        return 3
    return None


@dataclass
class Layouts:
    """How many keys of each layout a walk found, and one of each for the operator to see."""

    counts: dict[int, int]
    examples: dict[int, str]

    @property
    def newest(self) -> int:
        return max(self.counts, default=0)


def layouts(opened: Opened) -> Layouts:
    counts: dict[int, int] = {}
    examples: dict[int, str] = {}
    for key in list_all(opened):
        found = layout_of(key)
        if found is not None:
            counts[found] = counts.get(found, 0) + 1
            examples.setdefault(found, key.rel)
    return Layouts(counts, examples)


def _gate(opened: Opened) -> StoreGate:
    gate = opened.store.gate
    if not isinstance(gate, StoreGate):
        raise TypeError("the admin tool's stores are always gated (settings.open_store)")
    return gate


def show(opened: Opened) -> dict:
    """The record, what this release reads, the layouts found, and which record-less release may run here."""
    gate = _gate(opened)
    try:
        gate.require_read()
        refusal = None
    except FormatRefused as exc:
        refusal = str(exc)
    found = layouts(opened)
    record = gate.record
    releases = []
    for name, reads in RECORDLESS:
        newer = sorted(n for n in found.counts if n > reads)
        why = (f"it reads layouts up to {reads}; this store holds keys of layout "
               f"{', '.join(map(str, newer))} (e.g. {found.examples[newer[0]]})") if newer else None
        if why is None and record is not None and record.reader > reads:
            why = f"the record asks for a reader of format {record.reader}, and {name} reads no record"
        releases.append({"release": name, "may_run": why is None, "why": why})
    return {
        "store": opened.url,
        "record": None if record is None else record.wire(),
        "this_release": {"release": store_format.release_name(), "writes": store_format.FORMAT,
                         "reads": [store_format.READS_FROM, store_format.FORMAT]},
        "refused": refusal,
        "layouts": {str(n): found.counts[n] for n in sorted(found.counts)},
        "recordless_releases": releases,
    }


class Unsafe(Exception):
    """Lowering the record would let a driver misread what the store holds."""


def lower(opened: Opened, to: int) -> dict:
    """Set the record's reader and writer to ``to``, proved safe by a walk; the record written."""
    if not 1 <= to <= store_format.FORMAT:
        raise Unsafe(f"the format to lower to must be 1 to {store_format.FORMAT}")
    gate = _gate(opened)
    gate.require_read()
    found = layouts(opened)
    if found.newest > to:
        raise Unsafe(f"the store holds {found.counts[found.newest]} keys of layout {found.newest} "
                     f"(e.g. {found.examples[found.newest]}): a reader of format {to} would misread them")
    current = gate.store.get(gate.key)
    record = None
    if current is not None:
        record = store_format.parse(current.data)
        if record.features:
            raise Unsafe(f"the record names features ({', '.join(record.features)}) a lower format may not know")
    lowered = store_format.Record(to, to, (), f"{store_format.release_name()} (lnk-store-admin format --lower)",
                                  {} if record is None else record.extra)
    try:
        gate.store.put(gate.key, lowered.body(), Create() if current is None or current.version is None
                       else Update(current.version))
    except (AlreadyExists, PreconditionFailed):
        raise Unsafe("the record changed while it was judged (a driver wrote meanwhile): run it again") from None
    return {"store": opened.url, "record": lowered.wire(), "layouts": {str(n): c for n, c in found.counts.items()}}


def text(report: dict) -> str:
    """``show``'s report as lines for a person."""
    record = report["record"]
    lines = [f"store {report['store']}",
             "record: none (a legacy store: layouts 1-3, nothing written by 0.6.0 or later yet)" if record is None
             else f"record: reader {record['reader']}, writer {record['writer']}, features "
                  f"{record['features'] or 'none'}, written by {record['by'] or 'unknown'}",
             f"this release: {report['this_release']['release']} writes format {report['this_release']['writes']}, "
             f"reads {report['this_release']['reads'][0]} to {report['this_release']['reads'][1]}"]
    if report["refused"]:
        lines.append(f"refused: {report['refused']}")
    lines.append("layouts found: " + (", ".join(f"{n}: {c} keys" for n, c in report["layouts"].items()) or "none"))
    for r in report["recordless_releases"]:
        lines.append(f"  {r['release']}: " + ("may run here" if r["may_run"] else f"must not run here: {r['why']}"))
    return "\n".join(lines)

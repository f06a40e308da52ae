"""The claim lease's fence (store format 5, 0.7.0) beside the previous release on one store.

HEAD writes a lease's fence as its ``started`` and keeps it on an ended lease
(heads.py); the previous release (0.6.0, format 4) never heard of it.  What
each does beside the other, on the folder and on moto:

* the previous release reads a head holding a fence, live or ended, as it
  always read heads (``started`` was always a lease's field, and a head with
  no holder was never asked for it): its ``take``, ``renew``, ``end`` and
  ``leases`` answer as the contract says;
* its writes drop the fence (its ``end`` keeps only thread and epoch, its
  take writes its own start), and HEAD's next take still gives a larger one:
  store time has moved on (the fence's "now" term);
* its renewal keeps HEAD's fence, so HEAD's finish under that fence still
  holds; and the record HEAD writes asks reader 3, so it keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from releases import Driver, as_head, previous
from support import StoreUnderTest

THREAD = "job:j"
LONG_MS = 600_000


def test_the_previous_release_reads_and_rewrites_fenced_leases_and_the_fence_still_grows(
        fleet: Callable[[str], Driver], store: StoreUnderTest, monkeypatch: Any) -> None:
    monkeypatch.setenv("LNK_SCHEDULER_OPS", "1")
    new, old = fleet(as_head()), fleet(previous())
    # HEAD's scheduler ops come from a driver started with LNK_SCHEDULER_OPS=1 (the runner's own).
    first = new("lease_take", thread=THREAD, holder="A", lapse_ms=LONG_MS)
    assert first["took"] == "took" and type(first["fence"]) is int
    # The old release sees A's lease, renews it for A (keeping the fence), and is refused it.
    assert old("take", thread=THREAD, holder="B", lapse_ms=LONG_MS) == {"reply": "took", "took": "held"}
    assert old("renew", thread=THREAD, holder="A") == {"reply": "done"}
    listed = old("leases", lapse_ms=LONG_MS)["leases"]
    assert [(x["holder"], x["started"]) for x in listed] == [("A", first["fence"] / 1000)]
    again = new("lease_take", thread=THREAD, holder="A", lapse_ms=LONG_MS)
    assert again["fence"] == first["fence"], "the old release's renewal kept the fence"
    # HEAD ends it (the fence stays in the ended head); the old release reads that head as no lease.
    assert new("end", thread=THREAD, holder="A") == {"reply": "done"}
    assert old("leases", lapse_ms=LONG_MS) == {"reply": "leases", "leases": []}
    # The old release takes the ended lease (writing its own start) and ends it (dropping the field).
    assert old("take", thread=THREAD, holder="B", lapse_ms=LONG_MS) == {"reply": "took", "took": "took"}
    assert old("end", thread=THREAD, holder="B") == {"reply": "done"}
    after = new("lease_take", thread=THREAD, holder="C", lapse_ms=LONG_MS)
    assert after["took"] == "took" and after["fence"] > first["fence"], "the fence went back after an old writer"
    # And a takeover by the old release of HEAD's lapsed lease, then HEAD's of the old one's.
    assert old("take", thread=THREAD, holder="D", lapse_ms=0) == {"reply": "took", "took": "lapsed"}
    over = new("lease_take", thread=THREAD, holder="E", lapse_ms=0)
    assert over["took"] == "lapsed" and over["fence"] > after["fence"]
    assert old("take", thread=THREAD, holder="E", lapse_ms=LONG_MS) == {"reply": "took", "took": "took"}

"""Issue 27, case 4: a take that loses to a head write that was no take re-judges on what won.

On eafe802 the only taker of a lapsed lease was told ``held`` (and nobody
held it) whenever its conditional head write lost to any other head write:
the packer's prefetch hint every 512 events, a removal's roll-forward.
``Leases.take_naming`` took any lost round as proof that another taker had
won.  Now the head read again decides: the same lapsed lease there means the
winner was no take, so the taker takes it; a different lease (another taker's,
or its holder's renew) is ``held``.  The interleaving is made on purpose: the
other head write runs between the taker's read and its write.
"""

from __future__ import annotations

import time

import pytest
from faults.machines import Machine, Machines, between, in_order, write_to

import cloudstore.store.conversations as conversations
import cloudstore.store.heads as heads
import cloudstore.store.packing as packing
from cloudstore.protocol.validate import agent as parse_agent

HINT = 16


@pytest.fixture(autouse=True)
def small_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conversations, "PREFETCH_HINT_EVERY", HINT)
    monkeypatch.setattr(packing, "PACK_MIN", 8)  # blocks from 8 (32 in use), so that 40 events have a few
    monkeypatch.setattr(heads, "HINT_GAP_SECONDS", 0.0)  # every hint due is written (heads.hint_due)


def lease_key(m: Machine) -> str:
    return m.space.keys(parse_agent({"agent": m.agent})).lease("t")


def test_a_take_losing_to_the_hint_write_still_takes_the_lapsed_lease(machines: Machines) -> None:
    holder, writer, taker = machines("holder"), machines("writer"), machines("taker")
    assert holder.ok("take", thread="t", holder="A", lapse_ms=1000)["took"] == "took"
    for seq in range(1, HINT):
        writer.ok("append", thread="t", event={"seq": seq})
    time.sleep(1.3)  # A's lease lapses (1,000 ms, judged in store time)
    head = lease_key(taker)
    before = len([c for c in writer.backend.calls if c.op == "put" and c.key == head])
    # Between the taker's read of the head and its write: the writer's 16th append moves the hint
    # (a head write that changes no lease), so the taker's conditional write loses.
    taker.plan(in_order((write_to(head), between(lambda: writer.ok("append", thread="t",
                                                                   event={"seq": HINT})))))
    reply = taker.ok("take", thread="t", holder="B", lapse_ms=1000)
    moved = len([c for c in writer.backend.calls if c.op == "put" and c.key == head]) - before
    assert moved >= 1, "the hint's head write never ran between the taker's read and write: no race was made"
    assert reply["took"] in ("lapsed", "took"), reply
    leases = holder.ok("leases", lapse_ms=1000)["leases"]
    assert [x["holder"] for x in leases] == ["B"], leases
    assert holder.ok("renew", thread="t", holder="A")["reply"] == "lost"


def test_a_take_losing_to_another_taker_is_held(machines: Machines) -> None:
    holder, rival, taker = machines("holder"), machines("rival"), machines("taker")
    assert holder.ok("take", thread="t", holder="A", lapse_ms=1000)["took"] == "took"
    time.sleep(1.3)
    head = lease_key(taker)
    taker.plan(in_order((write_to(head), between(lambda: rival.ok("take", thread="t", holder="C",
                                                                  lapse_ms=1000)))))
    reply = taker.ok("take", thread="t", holder="B", lapse_ms=1000)
    assert reply["took"] == "held", reply
    assert [x["holder"] for x in holder.ok("leases", lapse_ms=1000)["leases"]] == ["C"]

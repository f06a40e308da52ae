"""A read fetches the blocks its head names as packed while the listing is still on its way.

``conversations._prefetch``: the head of a long conversation names how far
its events are packed, so a read asks for those blocks as soon as the head is
in, beside the listing that tells the last number; only the tail after the
hint waits for the listing.  What must hold besides the speed:

* every read answers the events the contract promises, from any ``first``;
* the blocks really are asked for before the listing answers (a listing held
  until a block has been asked for is released by the read itself);
* a hint is of one epoch: blocks fetched early from an epoch a removal ended
  between the head and the listing are never answered;
* the head write that moves the hint never makes a lease holder's own renew
  answer ``lost``.

The hint moves every ``PREFETCH_HINT_EVERY`` events (512); these tests make
it 16 so a conversation of 40 events has one.  Each runs on the folder,
moto and fake-gcs-server, with in-process machines (faults/machines.py).
"""

from __future__ import annotations

import threading

import pytest
from faults.backend import Call, Fault
from faults.machines import Machine, Machines

import cloudstore.store.conversations as conversations
import cloudstore.store.heads as heads
import cloudstore.store.packing as packing
from cloudstore.protocol.validate import agent as parse_agent

HINT = 16
#: How long a held listing waits for a block to be asked for: far above any request here, so a wait
#: that runs out means the read never asked for a block before its listing answered.
HOLD_SECONDS = 5.0


@pytest.fixture(autouse=True)
def small_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conversations, "PREFETCH_HINT_EVERY", HINT)
    monkeypatch.setattr(packing, "PACK_MIN", 8)  # blocks from 8 (32 in use), so that 40 events have a few
    monkeypatch.setattr(heads, "HINT_GAP_SECONDS", 0.0)  # every hint due is written (heads.hint_due)


def fill(m: Machine, count: int, text: str = "e", thread: str = "t") -> list[dict]:
    events = [{"seq": n, "text": f"{text}{n}"} for n in range(1, count + 1)]
    for event in events:
        m.ok("append", thread=thread, event=event)
    return events


def keys_of(m: Machine):
    return m.space.keys(parse_agent({"agent": m.agent}))


def segments_of(m: Machine, thread: str = "t") -> str:
    """The key prefix of the thread's blocks, whatever their epoch (keys.py: ``.../c/<thread>/p<epoch>/``)."""
    return keys_of(m).thread(thread) + "p"


class ListingHeld:
    """A plan that holds each listing of the events until a block has been asked for (or HOLD_SECONDS)."""

    def __init__(self, blocks: str, before_listing=None) -> None:
        self.blocks = blocks
        self.asked = threading.Event()
        self.released_by_block: list[bool] = []
        self.before_listing = before_listing

    def __call__(self, call: Call) -> Fault:
        if call.op == "get" and call.key.startswith(self.blocks):
            self.asked.set()
        elif call.op == "list" and "/c/" in call.key:
            self.released_by_block.append(self.asked.wait(HOLD_SECONDS))
            if self.before_listing is not None:
                run, self.before_listing = self.before_listing, None
                run()
        return Fault.NONE


def test_blocks_up_to_the_hint_are_asked_for_before_the_listing_answers(machines: Machines) -> None:
    writer = machines("writer")
    events = fill(writer, 40)  # packed up to 40, the hint at 32
    for first in (1, 5, 17, 32, 33, 40, 41):
        reader = machines(f"reader-{first}")
        held = ListingHeld(segments_of(reader))
        reader.plan(held)
        assert reader.ok("read", thread="t", first=first)["events"] == events[first - 1:]
        if first <= 32:  # the hint names blocks from here on
            assert held.released_by_block == [True], f"first={first}: no block asked for before the listing"
        gets = [c.key for c in reader.backend.calls if c.op == "get"]
        assert len(gets) == len(set(gets)), f"first={first}: a block asked for twice: {gets}"


def test_a_read_of_a_short_conversation_asks_for_nothing_more(machines: Machines) -> None:
    """Below the first hint nothing is fetched early: the head, the listing, one block of 8 and the tail
    after it; the first reader finds no tail, fetches the 7 events and writes it (packing.py, "Tails")."""
    writer = machines("writer")
    events = fill(writer, HINT - 1)
    for name, gets, puts in (("first reader", 1 + 1 + 1 + 7, 1), ("next reader", 1 + 1 + 1, 0)):
        reader = machines(name)
        assert reader.ok("read", thread="t", first=1)["events"] == events
        ops = [c.op for c in reader.backend.calls]
        assert (ops.count("list"), ops.count("get"), ops.count("put"), len(ops)) == (1, gets, puts,
                                                                                      1 + gets + puts), ops


def test_blocks_fetched_early_from_an_epoch_removed_before_the_listing_are_never_answered(
        machines: Machines, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head names epoch 0 and its hint; before the listing runs, the conversation is removed and
    written again with other events (its head naming no hint, so the read's next round fetches
    nothing early).  The listing sees the new epoch: the read answers its events, never the
    blocks it fetched of the old one, though they are keyed by the same numbers."""
    writer = machines("writer")
    fill(writer, 40, text="old")
    reader = machines("reader")
    again: list[dict] = []

    def remove_and_write_again() -> None:
        writer.ok("remove", thread="t")
        monkeypatch.setattr(conversations, "PREFETCH_HINT_EVERY", 10**9)
        again.extend(fill(writer, 40, text="new"))
        monkeypatch.setattr(conversations, "PREFETCH_HINT_EVERY", HINT)

    held = ListingHeld(segments_of(reader), before_listing=remove_and_write_again)
    reader.plan(held)
    assert reader.ok("read", thread="t", first=1)["events"] == again
    assert held.released_by_block[0], "the old epoch's blocks were not asked for early: the race was not made"


def test_moving_the_hint_never_costs_a_holder_its_lease(machines: Machines) -> None:
    """The packer writes the head (the hint) between a holder's take and its renew: the holder's
    renew and end are still its own (``done``), and another taker is still refused."""
    holder, writer, other = machines("holder"), machines("writer"), machines("other")
    assert holder.ok("take", thread="t", holder="h", lapse_ms=600_000)["took"] == "took"
    head = keys_of(writer).lease("t")
    for round_ in range(2):
        for seq in range(HINT * round_ + 1, HINT * (round_ + 1) + 1):
            writer.ok("append", thread="t", event={"seq": seq})
        assert [c for c in writer.backend.calls if c.op == "put" and c.key == head], "the hint never moved"
        writer.backend.calls.clear()
        assert holder.ok("renew", thread="t", holder="h") == {"reply": "done"}
        assert other.ok("take", thread="t", holder="x", lapse_ms=600_000)["took"] == "held"
    assert holder.ok("end", thread="t", holder="h") == {"reply": "done"}
    assert other.ok("take", thread="t", holder="x", lapse_ms=600_000)["took"] == "took"


def test_a_read_never_asks_early_for_blocks_the_process_holds(machines: Machines) -> None:
    """The writer still holds its latest events: its own read asks for the head and the listing only."""
    writer = machines("writer")
    events = fill(writer, 40)  # a machine keeps its latest 64: all of them
    writer.backend.calls.clear()
    assert writer.ok("read", thread="t", first=1)["events"] == events
    assert sorted(c.op for c in writer.backend.calls) == ["get", "list"], writer.backend.calls

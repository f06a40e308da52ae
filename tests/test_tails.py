"""Tails: the events after the last block, packed by the first reader that fetched them one by one.

packing.py, "Tails": a fresh read asks for the tail after the last block of
32 beside the blocks, and fetches singly only the events the tail does not
hold yet; a reader that fetched any writes the tail again after its reply.
What must hold besides the request counts (tests/test_request_counts.py):

* every read answers exactly the events the contract promises, from any
  ``first``, whatever tail is stored: none, stale, longer than the listing's
  last, of another range, lying about its numbers, no JSON at all;
* a tail is never believed for an epoch it was not written in (a removal
  between a reader's listing and its tail write);
* a tail that cannot be written (a read-only credential, a throttled
  bucket) costs the reply nothing;
* a tail is never written larger than ``TAIL_BYTES_MAX``.

Each runs on the folder, moto and fake-gcs-server, with in-process machines
(faults/machines.py), requests counted at each machine's backend.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from faults.backend import Call, Fault
from faults.machines import Machine, Machines

import cloudstore.store.packing as packing
from cloudstore.generations import Overwrite
from cloudstore.protocol.validate import agent as parse_agent
from cloudstore.store.keys import EpochKeys

BLOCK = packing.PACK_MIN


def fill(m: Machine, count: int, start: int = 1, text: str = "e", thread: str = "t") -> list[dict]:
    events = [{"seq": n, "text": f"{text}{n}"} for n in range(start, start + count)]
    for event in events:
        m.ok("append", thread=thread, event=event)
    return events


def epoch_keys(m: Machine, epoch: int = 0, thread: str = "t") -> EpochKeys:
    return EpochKeys(m.space.keys(parse_agent({"agent": m.agent})), thread, epoch, True)


def stored_tail(m: Machine, after: int, epoch: int = 0) -> Any:
    obj = m.space.store.get(epoch_keys(m, epoch).tail(after))
    return None if obj is None else json.loads(obj.data)


def plant_tail(m: Machine, after: int, body: bytes, epoch: int = 0) -> None:
    m.space.store.put(epoch_keys(m, epoch).tail(after), body, Overwrite())


def counts(m: Machine) -> dict[str, int]:
    """The machine's requests since it was made, by kind, and singles: event objects fetched one by one."""
    calls = m.backend.calls
    return {"get": sum(c.op == "get" for c in calls), "put": sum(c.op == "put" for c in calls),
            "list": sum(c.op == "list" for c in calls),
            "singles": sum(c.op == "get" and "/d" in c.key.rsplit("/c/", 1)[-1] for c in calls)}


def test_the_first_reader_packs_the_tail_and_the_next_reads_it_in_one_request(machines: Machines) -> None:
    writer = machines("writer")
    events = fill(writer, 2 * BLOCK + 8)  # two blocks of 32 (and one of 64), then 8 single events
    first = machines("first")
    assert first.ok("read", thread="t", first=1)["events"] == events
    assert counts(first)["singles"] == 8 and counts(first)["put"] == 1
    assert stored_tail(first, 2 * BLOCK) == events[2 * BLOCK:]
    for start in (1, 2 * BLOCK - 3, 2 * BLOCK + 1, 2 * BLOCK + 5, 2 * BLOCK + 8):
        later = machines(f"later-{start}")
        assert later.ok("read", thread="t", first=start)["events"] == events[start - 1:]
        assert counts(later)["singles"] == 0 and counts(later)["put"] == 0, (start, later.backend.calls)


def test_a_stale_tail_is_read_and_only_newer_events_are_fetched_then_it_is_written_again(
        machines: Machines) -> None:
    writer = machines("writer")
    events = fill(writer, BLOCK + 5)
    assert machines("first").ok("read", thread="t", first=1)["events"] == events
    events += fill(writer, 3, start=BLOCK + 6)
    reader = machines("reader")
    assert reader.ok("read", thread="t", first=1)["events"] == events
    assert counts(reader)["singles"] == 3 and counts(reader)["put"] == 1
    assert stored_tail(reader, BLOCK) == events[BLOCK:]


def test_a_tail_past_the_block_boundary_is_replaced_by_the_block_and_read_no_more(machines: Machines) -> None:
    writer = machines("writer")
    events = fill(writer, BLOCK + 5)
    machines("first").ok("read", thread="t", first=1)
    events += fill(writer, BLOCK, start=BLOCK + 6)  # packs 33..64: the tail after 32 is unused now
    reader = machines("reader")
    assert reader.ok("read", thread="t", first=1)["events"] == events
    tails = [c.key for c in reader.backend.calls if c.op == "get" and c.key.endswith(".0")]
    assert tails == [epoch_keys(reader).tail(2 * BLOCK)], tails


LYING = {
    "no JSON": b"{[",
    "an object": b'{"seq": 33}',
    "empty": b"[]",
    "numbers shifted": json.dumps([{"seq": n, "text": "lie"} for n in range(34, 38)]).encode(),
    "a gap": json.dumps([{"seq": 33, "text": "lie"}, {"seq": 35, "text": "lie"}]).encode(),
    "as long as a block": json.dumps([{"seq": n, "text": "lie"} for n in range(33, 33 + BLOCK)]).encode(),
    "a boolean number": json.dumps([{"seq": True, "text": "lie"}]).encode(),
    "not events": b"[1, 2, 3]",
}


@pytest.mark.parametrize("lie", sorted(LYING))
def test_a_tail_that_is_no_run_of_its_events_is_not_believed_and_is_written_right(
        machines: Machines, lie: str) -> None:
    writer = machines("writer")
    events = fill(writer, BLOCK + 5)
    plant_tail(writer, BLOCK, LYING[lie])
    reader = machines("reader")
    assert reader.ok("read", thread="t", first=1)["events"] == events
    assert counts(reader)["singles"] == 5
    assert stored_tail(reader, BLOCK) == events[BLOCK:]


def test_a_tail_holding_events_past_the_listings_last_answers_only_up_to_it(machines: Machines) -> None:
    """A tail written after this reader's listing may hold more; the read answers as of its listing."""
    writer = machines("writer")
    events = fill(writer, BLOCK + 3)
    ahead = events[BLOCK:] + [{"seq": n, "text": f"e{n}"} for n in range(BLOCK + 4, BLOCK + 9)]
    plant_tail(writer, BLOCK, json.dumps(ahead).encode())
    reader = machines("reader")
    assert reader.ok("read", thread="t", first=1)["events"] == events
    assert reader.ok("last", thread="t") == {"reply": "last", "last": BLOCK + 3}
    assert counts(reader)["singles"] == 0 and counts(reader)["put"] == 0


def test_a_tail_written_into_an_epoch_removed_under_its_reader_is_never_read(machines: Machines) -> None:
    """The reader's listing finds epoch 0 alive; the conversation is removed and begun again before the
    reader's tail write lands in epoch 0.  Reads of the new epoch never use it."""
    writer = machines("writer")
    fill(writer, BLOCK + 4, text="old")
    reader = machines("reader")

    def remove_then_write(call: Call) -> Fault:
        if call.op == "put" and call.key.endswith(".0"):
            other = machines("remover")
            other.ok("remove", thread="t")
            fill(other, BLOCK + 4, text="new")
        return Fault.NONE

    reader.plan(remove_then_write)
    reader.ok("read", thread="t", first=1)
    assert stored_tail(writer, BLOCK, epoch=0) is not None  # landed in the dead epoch
    fresh = machines("fresh")
    assert [e["text"] for e in fresh.ok("read", thread="t", first=1)["events"]] == [
        f"new{n}" for n in range(1, BLOCK + 5)]


def test_a_tail_that_cannot_be_written_costs_the_reply_nothing(machines: Machines) -> None:
    writer = machines("writer")
    events = fill(writer, BLOCK + 6)
    reader = machines("reader")
    reader.plan(lambda call: Fault.FAIL_BEFORE if call.op == "put" else Fault.NONE)
    assert reader.ok("read", thread="t", first=1)["events"] == events
    assert stored_tail(writer, BLOCK) is None
    assert machines("next").ok("read", thread="t", first=1)["events"] == events


def test_no_tail_is_written_past_its_byte_limit(machines: Machines, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packing, "TAIL_BYTES_MAX", 200)
    writer = machines("writer")
    events = fill(writer, BLOCK + 6, text="x" * 40)  # 6 events of about 55 bytes: past 200
    reader = machines("reader")
    assert reader.ok("read", thread="t", first=1)["events"] == events
    assert counts(reader)["put"] == 0 and stored_tail(writer, BLOCK) is None


def test_a_process_that_holds_the_events_asks_for_no_tail(machines: Machines) -> None:
    writer = machines("writer")
    events = fill(writer, BLOCK + 6)
    before = len(writer.backend.calls)
    assert writer.ok("read", thread="t", first=1)["events"] == events
    asked = [c.key for c in writer.backend.calls[before:] if c.op in ("get", "put")]
    assert not [k for k in asked if k.endswith(".0")], asked

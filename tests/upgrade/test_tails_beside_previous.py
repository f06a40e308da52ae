"""Tails (store format 6, 0.8.0) beside the previous release on one store.

HEAD's readers pack the single events after a conversation's last block of
32 as its tail, ``p<epoch>/<b>.0`` (packing.py, "Tails"); the previous
release (0.7.0, format 5) never heard of it.  What each does beside the
other, on the folder and on moto:

* the previous release reads a conversation that has a tail as it always
  did (no cover of its names a block of size 0): every event, once, in order;
* its appends make HEAD's tail stale, and HEAD's next read answers the tail's
  events and fetches only the newer ones, then writes the tail again;
* its packer writes the block of 32 over the tail's range, and HEAD reads
  the block from then on;
* its ``inspect`` takes the tail for one of the epoch's packed segments, and
  after its ``remove`` both releases read the conversation begun again, never
  the tail of the removed epoch.  (Its purge, 90 s of store time after the
  removal, deletes every key it lists under the epoch's segments, the tail
  among them: removal.py's ``_purge``, unchanged since 0.4.0; not waited
  for here.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from releases import HEAD, Driver, admin, previous
from support import StoreUnderTest, service_of

from cloudstore.protocol.validate import agent as parse_agent
from cloudstore.store.keys import EpochKeys
from cloudstore.store.packing import PACK_MIN

THREAD = "t"


def events(first: int, last: int) -> list[dict[str, Any]]:
    return [{"seq": n, "text": f"e{n}"} for n in range(first, last + 1)]


def append_all(driver: Driver, batch: list[dict[str, Any]]) -> None:
    for event in batch:
        assert driver("append", thread=THREAD, event=event) == {"reply": "done"}, (driver, event)


def read_fresh(fleet: Callable[[str], Driver], release: str) -> list[Any]:
    """A read by a new process of ``release`` (nothing in its memory); the process ends after its
    reply, so what it wrote after the reply (a tail) is in the store when this returns."""
    driver = fleet(release)
    reply = driver("read", thread=THREAD, first=1)
    driver.close()
    assert reply["reply"] == "events", reply
    return reply["events"]  # type: ignore[no-any-return]


def segments(store: StoreUnderTest, agent: dict[str, Any], monkeypatch: Any, epoch: int = 0) -> dict[str, Any]:
    """The epoch's packed objects, by the last part of their key, parsed."""
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    space = service_of(store).space
    at = EpochKeys(space.keys(parse_agent({"agent": agent})), THREAD, epoch, True)
    found = {}
    for item in space.store.list(at.segments()):
        obj = space.store.get(item.key)
        assert obj is not None
        found[item.key.rsplit("/", 1)[-1].lstrip("0")] = json.loads(obj.data)
    return found


def test_the_previous_release_reads_appends_packs_and_purges_beside_tails(
        fleet: Callable[[str], Driver], store: StoreUnderTest, agent: dict[str, Any], monkeypatch: Any) -> None:
    new, old = fleet(HEAD), fleet(previous())
    written = events(1, PACK_MIN + 8)
    append_all(new, written)
    assert read_fresh(fleet, HEAD) == written
    tail = f"{PACK_MIN}.0"
    assert segments(store, agent, monkeypatch)[tail] == written[PACK_MIN:], "HEAD's first reader wrote no tail"
    assert read_fresh(fleet, previous()) == written, "the previous release misread a conversation with a tail"

    more = events(PACK_MIN + 9, PACK_MIN + 13)
    append_all(old, more)  # the tail is stale now: 33..40 of 33..45
    written += more
    assert read_fresh(fleet, HEAD) == written
    assert segments(store, agent, monkeypatch)[tail] == written[PACK_MIN:], "HEAD's reader left the tail stale"

    more = events(PACK_MIN + 14, 2 * PACK_MIN)
    append_all(old, more)  # the previous release packs 33..64 (and 1..64) over the tail's range
    written += more
    old("last", thread=THREAD)  # its packing runs after the 64th append's reply, before this one is read
    found = segments(store, agent, monkeypatch)
    assert found[f"{2 * PACK_MIN}.{PACK_MIN}"] == written[PACK_MIN:]
    assert read_fresh(fleet, HEAD) == written
    assert read_fresh(fleet, previous()) == written

    seen = admin(previous(), store, "inspect", store.url, "--json")
    assert seen.returncode == 0, seen.stderr[-2000:]

    assert old("remove", thread=THREAD) == {"reply": "done"}
    again = events(1, 3)
    append_all(new, again)
    assert read_fresh(fleet, HEAD) == again
    assert read_fresh(fleet, previous()) == again

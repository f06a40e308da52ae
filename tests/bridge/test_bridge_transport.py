"""The conformance suite's bridge transport: requests for agents met on the
way are proved and answered; malformed ones come back as error replies."""

from __future__ import annotations

import argparse

from cloudstore.conformance.bridge_transport import BridgeTransport, add_options, transports_for
from cloudstore.conformance.program import Driver
from cloudstore.conformance.racing import at_once


def test_agents_met_on_the_way_are_served_and_kept_apart(short_dir):
    store = short_dir / "bucket"
    store.mkdir()
    transport = BridgeTransport(Driver("lnk-bucket-store", {"LNK_BUCKET_URL": f"file://{store}"}))
    try:
        one, two = {"id": "x", "owner": None}, {"id": "x", "owner": ""}
        assert transport.request({"op": "append", "agent": one, "thread": "t", "event": {"seq": 1}}) == {
            "reply": "done"
        }
        assert transport.request({"op": "last", "agent": one, "thread": "t"}) == {"reply": "last", "last": 1}
        assert transport.request({"op": "last", "agent": two, "thread": "t"}) == {"reply": "last", "last": 0}
        for bad in (b"not json", b"[]", b'{"op": "last"}'):
            assert transport.request(bad)["reply"] == "error"
        # Eight racers of one number through the bridge: exactly one writes it.
        racers = transport.sessions(8)
        append = {"op": "append", "agent": one, "thread": "r", "event": {"seq": 1}}
        replies = at_once([lambda c=c: (lambda: c.request(append)) for c in racers])
        assert sorted(r["reply"] for r in replies) == ["done"] + ["taken"] * 7
    finally:
        transport.close()


def test_via_bridge_option_picks_the_bridge_transport(short_dir):
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    add_options(parser)
    assert transports_for(parser.parse_args(["lnk-bucket-store"]), {}) is None
    store = short_dir / "bucket"
    store.mkdir()
    (transport,) = transports_for(parser.parse_args(["lnk-bucket-store", "--via-bridge"]),
                                  {"LNK_BUCKET_URL": f"file://{store}"})
    try:
        assert transport.mode == "bridge"
        assert transport.request({"op": "last", "agent": {"id": "a"}, "thread": "t"}) == {"reply": "last", "last": 0}
    finally:
        transport.close()

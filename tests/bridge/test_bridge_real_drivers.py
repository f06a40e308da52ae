"""This project's drivers behind the bridge: a conversation appended and read
back through the socket, on each backend of the shared ``store`` fixture
(lnk-bucket-store on a local folder and on moto, lnk-gcs on fake-gcs-server)."""

from __future__ import annotations

import uuid

from cloudstore.bridge import Limits, bridge_error_word


def test_conversation_through_the_bridge(rig, store):
    r = rig(agents=[("o", "a1"), (None, "a1")], driver=store.program, env=dict(store.env),
            limits=Limits(call_timeout=60))
    assert r.bridge.contract.serve
    thread = f"t-{uuid.uuid4().hex[:8]}"
    first, other = r.client(0), r.client(1)
    events = [{"seq": 1, "text": "hello"}, {"seq": 2, "text": "again", "big": 2**70}]
    for event in events:
        assert first.op("append", thread=thread, event=event) == {"reply": "done"}
    assert first.op("append", thread=thread, event={"seq": 2}) == {"reply": "taken", "last": 2}
    assert first.op("read", thread=thread, first=1) == {"reply": "events", "events": events}
    assert first.op("last", thread=thread) == {"reply": "last", "last": 2}
    assert other.op("last", thread=thread) == {"reply": "last", "last": 0}  # owner null is another agent
    # The driver's own error comes back as it is; the bridge's refusal says refused.
    own = first.op("read", thread=thread, first=0)
    assert own["reply"] == "error" and bridge_error_word(own) is None
    assert first.op("file_read", path="../escape")["error"].startswith("refused:")

"""What a process did, as the proxy saw it: how many requests deep (sequential rounds, counted, never
timed), and which of its requests were the store gate's (the format record, the server probe)."""

from __future__ import annotations

from collections.abc import Sequence

from cloudstore.conformance.fault_proxy import Seen
from cloudstore.gate import server_check, store_format


def rounds_of(seen: Sequence[Seen]) -> int:
    """How many requests deep a try was at the proxy, whatever the emulator's speed.

    The longest chain of requests each sent after the one before it was
    answered (the proxy's clock, both ends). Requests sent together count
    once; a request sent after another's answer only by chance counts as
    waiting on it, so this is an upper bound on the rounds the op needed.
    """
    depth: list[int] = []
    ordered = sorted(seen, key=lambda s: s.at)
    for i, s in enumerate(ordered):
        depth.append(1 + max((d for q, d in zip(ordered[:i], depth, strict=False) if q.answered <= s.at), default=0))
    return max(depth, default=0)


def gate_kind(seen: Seen) -> str | None:
    """'format' or 'probe' for a request of the store gate's (store_gate.py: once per process), else None.

    Its key is in its path (S3; a GCS read), its query or its upload's body (a GCS upload names it there).
    A test of an op's own cost leaves these out: test_format_gate_cost.py counts them.
    """
    text = seen.target.encode() + seen.content
    if store_format.KEY.encode() in text:
        return "format"
    return "probe" if server_check.PREFIX.rstrip("/").encode() in text else None

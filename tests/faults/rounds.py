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
    return len(rounds_in(seen))


def rounds_in(seen: Sequence[Seen]) -> list[list[Seen]]:
    """The requests of a try grouped by round, as ``rounds_of`` counts them, each round in the order sent.

    A request is of round k+1 when the latest round of the requests
    answered before it was sent is k (the proxy's clock, both ends): what a
    replay sends round by round to ask for the same objects in the same
    rounds (benchmarks/raw_floor.py).
    """
    depth: list[int] = []
    ordered = sorted(seen, key=lambda s: s.at)
    for i, s in enumerate(ordered):
        depth.append(1 + max((d for q, d in zip(ordered[:i], depth, strict=False) if q.answered <= s.at), default=0))
    rounds: list[list[Seen]] = [[] for _ in range(max(depth, default=0))]
    for s, d in zip(ordered, depth, strict=True):
        rounds[d - 1].append(s)
    return rounds


def gate_kind(seen: Seen) -> str | None:
    """'format' or 'probe' for a request of the store gate's (store_gate.py: once per process), else None.

    Its key is in its path (S3; a GCS read), its query or its upload's body (a GCS upload names it there).
    A test of an op's own cost leaves these out: test_format_gate_cost.py counts them.
    """
    text = seen.target.encode() + seen.content
    if store_format.KEY.encode() in text:
        return "format"
    return "probe" if server_check.PREFIX.rstrip("/").encode() in text else None

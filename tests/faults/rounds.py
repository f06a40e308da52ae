"""How many requests deep a process's work was at the proxy: sequential rounds, counted, never timed."""

from __future__ import annotations

from collections.abc import Sequence

from cloudstore.conformance.fault_proxy import Seen


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

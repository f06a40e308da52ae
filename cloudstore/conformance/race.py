"""Real concurrency: racers on separate channels released together, and bulk work spread out.

The contract's races ("of two writers of one number, on any machines, one
writes it") are only tested if the requests truly overlap at the driver: each
racer gets its own channel (its own ``serve`` process), is warmed first (the
process started and its imports paid for), waits at a barrier, and only then
sends its request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from ..protocol.client import DriverError
from .expect import Json
from .harness import Ctx
from .racing import RaceError, at_once


def race(ctx: Ctx, requests: Sequence[Json]) -> list[dict[str, Json]]:
    """Send every request at the same moment, each on its own channel; replies in request order.

    Raises DriverError naming the racers that got no reply (the others' replies
    are lost with it: a race with a racer missing proves nothing).
    """
    assert ctx.transport is not None
    channels = ctx.transport.sessions(len(requests))

    def ready(index: int) -> Callable[[], dict[str, Json]]:
        channels[index].warm(requests[index]["agent"])
        return lambda: channels[index].request(requests[index])

    try:
        return at_once([partial(ready, i) for i in range(len(requests))])
    except RaceError as exc:
        raise DriverError(str(exc)) from exc


def spread(ctx: Ctx, requests: Sequence[Json], channels: int = 8) -> list[dict[str, Json]]:
    """Send many independent requests over ``channels`` channels at once (bulk set-up); replies in order."""
    assert ctx.transport is not None
    pool = ctx.transport.sessions(channels)
    locks = [threading.Lock() for _ in pool]

    def send(index: int) -> dict[str, Json]:
        slot = index % len(pool)
        with locks[slot]:  # one request at a time per channel, as a serve process answers them
            return pool[slot].request(requests[index])

    with ThreadPoolExecutor(max_workers=len(pool)) as executor:
        return list(executor.map(send, range(len(requests))))

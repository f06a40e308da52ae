"""Real concurrency: racers on separate channels released together, and bulk work spread out.

The contract's races ("of two writers of one number, on any machines, one
writes it") are only tested if the requests truly overlap at the driver: each
racer gets its own channel (its own ``serve`` process), is warmed first (the
process started and its imports paid for), waits at a barrier, and only then
sends its request.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from ..client import DriverError
from .expect import Json
from .harness import Ctx

#: How long racers wait for each other at the barrier before giving up.
BARRIER_SECONDS = 60.0


def race(ctx: Ctx, requests: Sequence[Json]) -> list[dict[str, Json]]:
    """Send every request at the same moment, each on its own channel; replies in request order.

    Raises DriverError naming the racers that got no reply (the others' replies
    are lost with it: a race with a racer missing proves nothing).
    """
    assert ctx.transport is not None
    channels = ctx.transport.sessions(len(requests))
    barrier = threading.Barrier(len(requests), timeout=BARRIER_SECONDS)
    replies: list[Json] = [None] * len(requests)
    errors: list[str] = []

    def racer(index: int) -> None:
        request = requests[index]
        try:
            channels[index].warm(request["agent"])
            barrier.wait()
            replies[index] = channels[index].request(request)
        except threading.BrokenBarrierError:
            errors.append(f"racer {index}: another racer failed before the start")
        except Exception as exc:  # noqa: BLE001 - reported with the racer's number
            errors.append(f"racer {index}: {type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=racer, args=(i,), daemon=True) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise DriverError("; ".join(sorted(errors))[:600])
    return replies


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

"""Release racers together: the one place real concurrency is staged.

A race only proves something if the requests truly overlap at the store.
Each racer first gets ready on its own (a process started, imports paid,
a connection warmed), then every racer waits at one barrier, and only then
makes its call.  Used by the conformance suite and by the project's tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..errors import CloudstoreError

T = TypeVar("T")

#: How long racers wait for each other at the barrier before giving up.
BARRIER_SECONDS = 60.0


class RaceError(CloudstoreError):
    """Some racers failed to get ready or to call; the message names them."""


def at_once(ready: Sequence[Callable[[], Callable[[], T]]], barrier_seconds: float = BARRIER_SECONDS) -> list[T]:
    """Run each ``ready[i]()`` (which returns the call to make), then release all calls together.

    Results come back in racer order.  If any racer fails, the barrier is
    broken for the rest and RaceError names every failure: a race with a
    racer missing proves nothing.
    """
    barrier = threading.Barrier(len(ready), timeout=barrier_seconds)
    results: list = [None] * len(ready)
    errors: list[str] = []

    def racer(index: int) -> None:
        try:
            call = ready[index]()
            barrier.wait()
            results[index] = call()
        except threading.BrokenBarrierError:
            errors.append(f"racer {index}: another racer failed before the start")
        except Exception as exc:  # noqa: BLE001 - reported with the racer's number
            errors.append(f"racer {index}: {type(exc).__name__}: {exc}")
            barrier.abort()

    threads = [threading.Thread(target=racer, args=(i,), daemon=True) for i in range(len(ready))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RaceError("; ".join(sorted(errors))[:600])
    return results

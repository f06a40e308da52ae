"""Load made on purpose: jobs put at a steady rate, as a test or a benchmark needs them (not installed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def put_paced(send: Callable[[dict[str, Any]], dict[str, Any]], agent: dict[str, Any], rate: float, count: int,
              tag: str, threads: int = 2) -> list[dict[str, Any]]:
    """``count`` jobs due now, one every ``1 / rate`` s (each at its slot, at once when late), sent by
    ``send`` from ``threads`` threads so that one slow reply does not hold the next put back; the replies
    (a put that raised is an error reply naming the exception: a figure, not a crash)."""
    replies: list[dict[str, Any]] = [{} for _ in range(count)]
    started = time.monotonic()
    lock = threading.Lock()
    order = iter(range(count))

    def worker() -> None:
        while True:
            with lock:
                n = next(order, None)
            if n is None:
                return
            wait = started + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            job = {"id": f"{tag}{n:05d}", "spec": None, "due": time.time()}
            try:
                replies[n] = send({"op": "job_put", "agent": agent, "place": "waiting", "job": job})
            except Exception as exc:  # noqa: BLE001 - counted by the caller
                replies[n] = {"reply": "error", "error": repr(exc)}

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return replies

#!/usr/bin/env python3
"""What an append and a read cost on the folder store (``file://``), in this process (issue 43, item 3).

    PYTHONPATH=. python benchmarks/folder_append.py [--events 2000] [--rounds 5] [--folder DIR]

The folder store serves every op of a driver; issue 43 made every path
operation below its root go through directory file descriptors (no link
followed, every folder's owner checked), which costs system calls.  This
prints, for one thread on the Python API (``cloudstore.open``), the median
time of an ``append`` and of a ``read`` of a short conversation, each the
median over ``--rounds`` rounds of ``--events`` ops, and the backend's own
``put`` (create) and ``get`` without the ops around them.  ``PYTHONPATH``
chooses the code measured: run it on two commits to compare.

Figures, not assertions (a shared machine is noisy): an append is mostly
its ``fsync``, so compare the ``get`` figures for the cost of the walk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import cloudstore
from cloudstore.generations import Create
from cloudstore.local import LocalBackend


def per_op(count: int, work: Callable[[int], object]) -> float:
    """Microseconds per call of ``work(i)``, over ``count`` calls."""
    start = time.perf_counter()
    for i in range(count):
        work(i)
    return (time.perf_counter() - start) / count * 1e6


def one_round(folder: str, events: int, figures: dict[str, list[float]]) -> None:
    """One round of each figure, on new stores below ``folder``."""
    with cloudstore.open(f"file://{folder}-api", create=True) as store:  # a new folder: the API makes it only if asked
        me = store.agent("o1", "a1")
        last = max(1, events // 50)
        figures["append"].append(per_op(events, lambda i: me.append(f"t{i % 50}", {"seq": i // 50 + 1})))
        figures["read"].append(per_op(events, lambda i: me.read(f"t{i % 50}", first=last)))
    backend = LocalBackend(f"{folder}-raw")
    body = b"x" * 200
    figures["backend put"].append(per_op(events, lambda i: backend.put(
        f"agents/o1/a1/threads/t{i % 50}/e/{i:012d}", body, Create())))
    figures["backend get"].append(per_op(events, lambda i: backend.get(f"agents/o1/a1/threads/t{i % 50}/e/{i:012d}")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--folder", default=None, help="where to make the stores (default: a new temporary folder)")
    args = parser.parse_args()
    top = tempfile.mkdtemp(prefix="lnk-folder-bench-", dir=args.folder)
    figures: dict[str, list[float]] = {"append": [], "read": [], "backend put": [], "backend get": []}
    try:
        for r in range(args.rounds):
            one_round(f"{top}/{r}", args.events, figures)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print(f"folder store, {args.events} ops x {args.rounds} rounds, one thread (pid {os.getpid()})")
    for name, values in figures.items():
        rounds = " ".join(f"{v:.0f}" for v in values)
        print(f"  {name:12s} median {statistics.median(values):8.1f} us/op   (rounds: {rounds})")


if __name__ == "__main__":
    main()

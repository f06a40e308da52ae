#!/usr/bin/env python3
"""A driver's ``serve`` under cProfile on every thread: ``cloud_round_trips.py --profile DIR`` runs it.

    BENCH_PROFILE_DIR=DIR python benchmarks/profiled_serve.py lnk-bucket-store|lnk-gcs serve

A benchmark's hook, never the package's path: it patches, in this process
only, what the driver runs, then runs the driver's own ``serve``.  Every
request after the first (the first is the benchmark's warm-up) is profiled
under its op's name: the main thread from the request line to its encoded
reply (``Answerer.answer`` and ``encode_reply``), and every task the
process's pools (``ContextPool``: the reads sent in parallel, the request
sent beside another, the store gate's) run meanwhile, each thread with a
``cProfile.Profile`` of its own (cProfile sees only the thread that enabled
it).  At exit each op's profiles, merged, are written to
``DIR/<program>.<op>.<pid>.prof`` (``pstats``), and each profiled request's
wall and CPU time (every thread, profiling included) is appended to
``DIR/requests.txt``, with the garbage collector's passes and the modules
imported meanwhile.  ``BENCH_PROFILE_CLOCK=cpu`` times each function by
its thread's CPU time instead of the wall clock.
"""

from __future__ import annotations

import atexit
import cProfile
import gc
import json
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cloudstore import driver
from cloudstore.protocol import answerer
from cloudstore.runtime import pools

OUT = os.environ.get("BENCH_PROFILE_DIR", ".")
#: "cpu": each thread's CPU time (``time.thread_time``: where the driver's own time goes, whatever the
#: network and the other threads did meanwhile); else wall time (cProfile's own, faster, clock).
CLOCK = os.environ.get("BENCH_PROFILE_CLOCK", "wall")
PROGRAM = sys.argv[1] if len(sys.argv) > 1 else ""
_local = threading.local()
_profiles: dict[str, list[cProfile.Profile]] = {}
_lock = threading.Lock()
_active: list[str | None] = [None]  # the op being profiled, or None between requests
_seen = [0]  # request lines answered so far
_began: list[tuple[float, float]] = []  # (wall, cpu) at the start of the request profiled
_gc: dict[int, list[float]] = {}  # generation -> ms of each collection during the request profiled
_gc_start: list[float] = [0.0]
_modules: list[set[str]] = [set()]  # the modules imported before the request profiled


def _gc_watch(phase: str, info: dict[str, int]) -> None:
    """The collector's passes during a profiled request (a fresh process's heap is big: a full pass costs)."""
    if _active[0] is None:
        return
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        _gc.setdefault(info["generation"], []).append((time.perf_counter() - _gc_start[0]) * 1000)


def _profile(op: str) -> cProfile.Profile:
    """This thread's profile of ``op`` (made on first use)."""
    mine: dict[str, cProfile.Profile] = _local.__dict__.setdefault("profiles", {})
    if op not in mine:
        mine[op] = cProfile.Profile(time.thread_time) if CLOCK == "cpu" else cProfile.Profile()
        with _lock:
            _profiles.setdefault(op, []).append(mine[op])
    return mine[op]


def _run_profiled(op: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if op is None:
        return fn(*args, **kwargs)
    prof = _profile(op)
    prof.enable()
    try:
        return fn(*args, **kwargs)
    finally:
        prof.disable()


_submit = pools.ContextPool.submit


def submit(self: pools.ContextPool, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """A pool task profiled under the op being answered when it was submitted."""
    return _submit(self, _run_profiled, _active[0], fn, *args, **kwargs)


_answer = answerer.Answerer.answer


def answer(self: answerer.Answerer, line: bytes) -> dict[str, Any]:
    _seen[0] += 1
    if _seen[0] == 1:
        return _answer(self, line)  # the warm-up
    try:
        op = str(json.loads(line).get("op"))
    except (ValueError, AttributeError):
        op = "unparsed"
    _active[0] = op
    _gc.clear()
    _modules[0] = set(sys.modules)
    _began[:] = [(time.perf_counter(), time.process_time())]
    return _run_profiled(op, _answer, self, line)  # type: ignore[no-any-return]


_encode = driver.encode_reply


def encode_reply(reply: dict[str, Any]) -> str:
    op = _active[0]
    try:
        return _run_profiled(op, _encode, reply)  # type: ignore[no-any-return]
    finally:
        if op is not None and _began:
            wall, cpu = _began[0]
            with open(os.path.join(OUT, "requests.txt"), "a") as f:
                passes = " ".join(f"gen{g} x{len(ms)} {sum(ms):.1f} ms" for g, ms in sorted(_gc.items()))
                imported = sorted(set(sys.modules) - _modules[0])
                f.write(f"{PROGRAM} {op} pid {os.getpid()} wall_ms {(time.perf_counter() - wall) * 1000:.1f} "
                        f"cpu_ms {(time.process_time() - cpu) * 1000:.1f} gc: {passes or 'none'}; "
                        f"imported: {' '.join(imported) or 'none'}\n")
        _active[0] = None


def dump() -> None:
    for op, profiles in _profiles.items():
        stats = pstats.Stats(profiles[0])
        for more in profiles[1:]:
            stats.add(more)
        stats.dump_stats(os.path.join(OUT, f"{PROGRAM}.{op}.{os.getpid()}.prof"))


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("lnk-bucket-store", "lnk-gcs"):
        sys.exit("usage: profiled_serve.py lnk-bucket-store|lnk-gcs serve")
    os.makedirs(OUT, exist_ok=True)
    pools.ContextPool.submit = submit  # type: ignore[method-assign]
    answerer.Answerer.answer = answer  # type: ignore[method-assign]
    driver.encode_reply = encode_reply
    atexit.register(dump)
    gc.callbacks.append(_gc_watch)
    main_of = driver.main_bucket if sys.argv[1] == "lnk-bucket-store" else driver.main_gcs
    sys.argv = [sys.argv[1], sys.argv[2]]
    main_of()


if __name__ == "__main__":
    main()

"""Keep freed large buffers from staying in the bridge's memory (glibc only).

The byte budget (``limits.Limits.request_budget_bytes``) bounds what request
lines hold at once, but glibc's malloc raises its mmap threshold each time a
large block is freed (up to 32 MiB), after which blocks of a 16 MiB line come
from per-thread heaps that are not given back to the system: measured, six
agents sending 16 MiB lines took the bridge's peak RSS to 262 MiB with a
budget of 160 MiB, and to 151 MiB with the threshold pinned at 128 KiB.
Pinning it (``mallopt(M_MMAP_THRESHOLD)``, as ``MALLOC_MMAP_THRESHOLD_``
would) makes every block over 128 KiB its own mapping, returned on free.

It is a setting of the whole process; the bridge runs as a process of its
own (``lnk-store-bridge``), and in a process that merely hosts one (tests,
the conformance suite) it costs only a little speed on large allocations.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_MMAP_THRESHOLD = -3
THRESHOLD = 128 * 1024


def pin_mmap_threshold(threshold: int = THRESHOLD) -> bool:
    """Pin glibc's mmap threshold; whether it was pinned (False elsewhere than glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False

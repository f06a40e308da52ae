"""Driver processes whose wall clock is off by a chosen number of seconds (issue 11), with libfaketime.

``skewed_env(env, seconds)`` is ``env`` plus ``LD_PRELOAD`` of libfaketime and
``FAKETIME="+Ns"`` / ``"-Ns"`` (0 seconds: ``env`` unchanged, a true clock);
``skewed(store, seconds)`` is a store under test whose driver processes run
so.  The test is skipped, saying why, only when the library file is missing
(Debian package ``faketime``; ``.ci/run`` installs it, so on CI they run).

What libfaketime 0.9.10 does to a Python 3.11 process here, measured with a
probe script at -5 s, +5 s and +120 s:

* ``time.time()``, ``time.time_ns()``, ``datetime.now()``: off by exactly the
  offset, ticking at the real rate.  Child processes inherit the skew (the
  environment carries it): ``date`` run from a skewed process is skewed.
* ``time.monotonic()`` and ``time.perf_counter()`` are faked too, and not by
  the offset: they read as the *faked wall clock* (about 1.8e9 s), ticking at
  the real rate, so intervals measured with them are right.
* Hence **any wait with a timeout on a lock hangs for decades**:
  ``Lock.acquire(timeout=)``, ``Event.wait(t)``, ``Condition.wait(t)``,
  ``queue.Queue.get(timeout=)``.  Python 3.11 computes the deadline from the
  (faked) monotonic clock and waits with ``sem_clockwait(CLOCK_MONOTONIC)``,
  which libfaketime does not intercept, so the kernel sees a deadline ~57
  years out.  ``time.sleep``, socket timeouts and ``Popen.wait(t)`` work
  (``clock_nanosleep`` and ``poll`` are intercepted), and so do waits
  without a timeout.  Code run skewed must not wait on a lock with a timeout.
* ``FAKETIME_DONT_FAKE_MONOTONIC=1`` mends the timed waits but breaks
  ``time.sleep``: every call, even ``sleep(0)``, raises ``OSError: [Errno 22]
  Invalid argument``.  The drivers sleep in their retry backoff, so it is not
  used here.
* File timestamps the kernel writes stay *real*: a file created, written or
  renamed by a skewed process has a real ``st_mtime`` (``stat``/``fstat`` are
  not faked).  But ``os.utime(path)`` with no times (``utimensat(NULL)``) is
  intercepted and stamps the *skewed* time.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import pytest

#: Where Debian's ``libfaketime`` puts it: /usr/lib/x86_64-linux-gnu/faketime/ here, the multiarch folder elsewhere.
_FOUND = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
LIBFAKETIME = _FOUND[0] if _FOUND else "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def faketime_setting(seconds: float) -> str:
    """libfaketime's relative offset: ``+5s``, ``-5s``, ``+120s``."""
    return f"{seconds:+g}s"


def skewed_env(env: Mapping[str, str], seconds: float) -> dict[str, str]:
    """``env`` for a process whose wall clock runs ``seconds`` ahead (behind if negative).

    0 is a true clock: ``env`` as it is, no library preloaded.  Skips the
    calling test when libfaketime is missing (never on CI, which installs it).
    """
    out = dict(env)
    if seconds == 0:
        return out
    if not os.path.exists(LIBFAKETIME):
        pytest.skip(f"libfaketime missing ({LIBFAKETIME}): install the Debian package `faketime` (.ci/run does)")
    preload = " ".join(p for p in (LIBFAKETIME, os.environ.get("LD_PRELOAD", "")) if p)
    out.update({"LD_PRELOAD": preload, "FAKETIME": faketime_setting(seconds)})
    return out


def skewed(store: Any, seconds: float) -> Any:
    """The store under test with its driver processes' clocks ``seconds`` off."""
    return dataclasses.replace(store, env=skewed_env(store.env, seconds))


def measured_skew(seconds: float) -> float:
    """How far off a Python process started with ``skewed_env`` really is (a check the library works)."""
    probe = "import time, sys; sys.stdout.write(repr(time.time()))"
    env = {**os.environ, **skewed_env({}, seconds)}
    before = time.time()
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30, check=True)
    after = time.time()
    return float(out.stdout) - (before + after) / 2

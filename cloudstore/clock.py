"""The store's clock, as this process can know it: leases and the due index judge time by it.

Machines' clocks disagree, by milliseconds on a good day and by minutes on a
bad one.  A lease written by one machine and judged by another must not
depend on how much: so every time the drivers write or judge is *store time*,
this process's wall clock corrected by what the store's own replies say.

Each reply of the store carries the store's time at the moment it answered:
the HTTP ``Date`` header (whole seconds) on S3 and GCS, the kernel's
timestamp of a file just written on the local folder.  A reply received
between local times ``t0`` and ``t1`` whose store time lies in
``[s, s + resolution)`` says the offset (store - local) lies in
``[s - t1, s + resolution - t0]``.  The intersection of every such interval
narrows as replies straddle second boundaries (the NTP idea, without NTP).

The correction applied is the *smallest* offset the evidence allows: zero
whenever zero lies in the interval.  So machines whose clocks agree with the
store's (within the evidence) keep their own clock to the millisecond, and a
machine S seconds off is corrected to within the interval's width: at most
the resolution plus one round trip (about 1 s on S3 and GCS, a few
milliseconds on a folder), whatever S is.  Two machines then judge one
lease within twice that of each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime


def probe_by_reading(get: Callable[[str], object]) -> Callable[[], None]:
    """A probe for a cloud backend: read a key nobody writes; absent or not, the reply has a Date."""
    def probe() -> None:
        try:
            get("_clock")
        except Exception:  # noqa: BLE001 - only the reply's Date header matters, seen by the backend's hook
            pass

    return probe


class StoreClock:
    """This process's best knowledge of the store's time, from its replies."""

    def __init__(self, probe: Callable[[], None] | None = None) -> None:
        self._probe = probe  # makes one cheap request that observes, when nothing has yet
        self._low: float | None = None
        self._high: float | None = None
        self._lock = threading.Lock()

    def observe(self, sent: float, received: float, store_time: float, resolution: float) -> None:
        """A reply sent after local ``sent`` and received by ``received`` said the store's time was
        ``store_time`` (to within ``resolution`` above it)."""
        low, high = store_time - received, store_time + resolution - sent
        with self._lock:
            if self._low is None or self._high is None or low > self._high or high < self._low:
                self._low, self._high = low, high  # first evidence, or a clock jumped: start again
            else:
                self._low, self._high = max(self._low, low), min(self._high, high)

    def observe_http_date(self, sent: float, received: float, date: str | None) -> None:
        """The same, from an HTTP ``Date`` header (whole seconds); ignored when absent or malformed."""
        if not date:
            return
        try:
            when = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return
        self.observe(sent, received, when, 1.0)

    @property
    def offset(self) -> float:
        """Seconds to add to this process's clock: the smallest correction the evidence allows."""
        with self._lock:
            low, high = self._low, self._high
        if low is None and self._probe is not None:
            self._probe()
            with self._lock:
                low, high = self._low, self._high
        if low is None or high is None or low <= 0.0 <= high:
            return 0.0
        return low if low > 0.0 else high

    def now(self) -> float:
        """The store's time now, in seconds since 1970."""
        return time.time() + self.offset

    def now_ms(self) -> int:
        """The store's time now, in whole milliseconds since 1970."""
        return int(self.now() * 1000)

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

No single reply moves it.  A reply whose interval disagrees with the
estimate (one front-end or proxy with a wrong clock, one reply dated an hour
ahead) is set aside as an outlier once two replies have agreed on the
estimate (before that, of two disagreeing replies the one asking the
smaller correction stands, so a process whose very first reply is off
follows the next honest one); the estimate starts again only when
``RESTART_AFTER`` disagreeing replies agree among themselves and span
``RESTART_SPAN`` seconds of local time (a clock that really stepped), and
any reply that agrees with the estimate again clears them.

Judgments that destroy or take something (a lease lapsed, a removed epoch
old enough to purge, an orphan due entry, a tombstone) use ``earliest``: the
least store time that any plausible reading allows (the estimate, the
replies set aside lately, and this process's own clock until two replies
have agreed), so that a wrong
clock can delay a deletion or a takeover, never bring one forward.  Times
written (a lease's renewal, a removal's time) use ``now``, the estimate.
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


RESTART_AFTER = 5  # disagreeing replies, agreeing among themselves, before the estimate starts again
RESTART_SPAN = 2.0  # ... received over at least this many seconds of local time (no single op spans it)
OUTLIERS_KEPT = 16  # replies set aside, at most
OUTLIER_MEMORY = 60.0  # seconds (local) a reply set aside still counts in ``earliest``


def _correction(low: float, high: float) -> float:
    """How far from this process's own clock the interval ``[low, high]`` of offsets lies."""
    return 0.0 if low <= 0.0 <= high else min(abs(low), abs(high))


class StoreClock:
    """This process's best knowledge of the store's time, from its replies."""

    def __init__(self, probe: Callable[[], None] | None = None) -> None:
        self._probe = probe  # makes one cheap request that observes, when nothing has yet
        self._low: float | None = None
        self._high: float | None = None
        self._outliers: list[tuple[float, float, float]] = []  # (low, high, received) set aside
        self._confirmed = False  # whether two replies have agreed on the estimate
        self._lock = threading.Lock()

    def observe(self, sent: float, received: float, store_time: float, resolution: float) -> None:
        """A reply sent after local ``sent`` and received by ``received`` said the store's time was
        ``store_time`` (to within ``resolution`` above it)."""
        low, high = store_time - received, store_time + resolution - sent
        with self._lock:
            if self._low is None or self._high is None:
                self._low, self._high = low, high  # first evidence: tentative until a reply agrees
            elif low <= self._high and high >= self._low:
                self._low, self._high = max(self._low, low), min(self._high, high)
                self._confirmed = True  # two replies agree: one wrong reply no longer moves it
                self._outliers.clear()  # the estimate holds: what was set aside was an outlier
            elif not self._confirmed:
                self._unconfirmed(low, high, received)
            else:
                self._set_aside(low, high, received)

    def _unconfirmed(self, low: float, high: float, received: float) -> None:
        """A reply that disagrees with an estimate no second reply has confirmed: either may be wrong.

        The one asking the smaller correction stands (the rule ``offset``
        applies within an interval) and the other is set aside: so a process
        whose very first reply was an hour off follows the next honest one, and
        one honest reply is not displaced by wrong ones after it, however many
        (they start the estimate again only as a stepped clock would: enough of
        them, agreeing, over ``RESTART_SPAN``)."""
        assert self._low is not None and self._high is not None
        if _correction(low, high) < _correction(self._low, self._high):
            aside = (self._low, self._high, received)
            self._low, self._high = low, high
            self._outliers = [*self._outliers[-(OUTLIERS_KEPT - 1):], aside]
        else:
            self._set_aside(low, high, received)

    def _set_aside(self, low: float, high: float, received: float) -> None:
        """An interval that disagrees with the estimate: kept aside; the estimate starts again from
        the newest disagreeing replies only when enough of them agree, over long enough."""
        self._outliers = [*self._outliers[-(OUTLIERS_KEPT - 1):], (low, high, received)]
        agree_low, agree_high, first = low, high, received
        count = 0
        for o_low, o_high, o_received in reversed(self._outliers):
            if o_low > agree_high or o_high < agree_low:
                break
            agree_low, agree_high, first = max(agree_low, o_low), min(agree_high, o_high), o_received
            count += 1
        if count >= RESTART_AFTER and received - first >= RESTART_SPAN:
            self._low, self._high = agree_low, agree_high  # a clock really stepped: start again
            self._confirmed = True  # RESTART_AFTER replies agree on it
            self._outliers.clear()

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

    def earliest(self) -> float:
        """The least store time now that any plausible reading allows: the estimate, each reply
        set aside within ``OUTLIER_MEMORY``, and this process's own clock until two replies agree.  For judging that
        something is old enough to delete or take over: a wrong clock then only delays it."""
        offset = self.offset
        local = time.time()
        with self._lock:
            aside = [o_low for o_low, _, received in self._outliers if local - received <= OUTLIER_MEMORY]
            # This process's own clock is a plausible reading only until two replies have agreed on
            # the estimate: after that, a machine whose clock is behind would see every lapse late.
            own = [] if self._confirmed else [0.0]
        return local + min([*own, offset, *aside])

    def earliest_ms(self) -> int:
        """``earliest`` in whole milliseconds."""
        return int(self.earliest() * 1000)

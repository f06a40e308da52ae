"""What is read back from the bucket is checked before it is believed (issue 25).

Many agents share one bucket and prefix.  Any object under an agent's keys
may hold any bytes: written by an old version, a bug, or a machine holding
the bucket's credentials.  So an object is believed only as far as its own
layout allows: each collection checks the shape of what it read (``Malformed``
when it is not one this driver writes), and every key named inside an object
(a job record's due entry above all, which the driver deletes) is compared
with the key ``keys.py`` builds for that object's own agent and id before it
is read, written or deleted.

``Malformed`` is a store failure of one object, not a refusal of the request:
the op answers an error naming the object's kind (never a host path, never
another agent's key) and nothing else is touched.  It is a
``StoreUnavailable`` that certainly changed nothing by itself, so the
driver's reply ends with what the whole op did (``nothing was changed`` or
``outcome unknown``), as for any failing store, and the process goes on
answering.
"""

from __future__ import annotations

import math
from typing import Any

from .generations import StoreUnavailable
from .validate import is_int

#: The largest integer a stored counter, time or number may hold: a double's exact range, as the wire's.
COUNT_MAX = 2**53 - 1


class Malformed(StoreUnavailable):
    """A stored object is not one this driver writes: the op stops before acting on it."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(f"a stored {kind} is malformed ({why}); it was left as it is", False)
        self.kind = kind


def expect(ok: bool, kind: str, why: str) -> None:
    """Raise ``Malformed`` unless ``ok``."""
    if not ok:
        raise Malformed(kind, why)


def obj(value: Any, kind: str, what: str = "the object") -> dict[str, Any]:
    """``value`` as a JSON object, else ``Malformed``."""
    expect(isinstance(value, dict), kind, f"{what} is not a JSON object")
    return value


def count(value: Any, kind: str, what: str, minimum: int = 0, maximum: int = COUNT_MAX) -> int:
    """A stored integer within ``minimum..maximum`` (never a boolean, a float or a huge number)."""
    bound = f"from {minimum} to {maximum}" if maximum <= COUNT_MAX else f"of at least {minimum}"
    expect(is_int(value) and minimum <= value <= maximum, kind, f"{what} is not an integer {bound}")
    return int(value)


def finite(value: Any, kind: str, what: str) -> float | int:
    """A stored number a double holds, finite (an integer of any size past a double is refused)."""
    if is_int(value):
        expect(abs(value) <= 2**1023, kind, f"{what} is too large a number")
        return int(value)
    expect(isinstance(value, float) and math.isfinite(value), kind, f"{what} is not a finite number")
    return float(value)


def text(value: Any, kind: str, what: str) -> str:
    """A stored string that is valid Unicode (no lone surrogate)."""
    expect(isinstance(value, str), kind, f"{what} is not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Malformed(kind, f"{what} is not valid Unicode") from None
    return value

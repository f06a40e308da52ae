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

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..generations import StoreUnavailable
from .model import is_int

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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number no double holds")
    return value


def loads(data: bytes | str, kind: str) -> Any:
    """Strict JSON of a stored object (no NaN or Infinity, no number past a double, no lone surrogate
    once encoded), else ``Malformed``: what is answered from it must be writable as strict JSON."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Malformed(kind, "it is not strict JSON") from None


@contextmanager
def parsing(kind: str) -> Iterator[None]:
    """Within it, an object that is no JSON (or no UTF-8, or nested past the parser) is ``Malformed``."""
    try:
        yield
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise Malformed(kind, "it is not JSON") from None


def validate_int(value: Any) -> bool:
    """A JSON integer (never a boolean: ``True == 1`` in Python)."""
    return is_int(value)

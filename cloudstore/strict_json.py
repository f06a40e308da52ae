"""JSON read strictly: one value per key, no NaN or Infinity.

Parsers differ on which of two equal keys wins, so ``{"agent": A, "agent":
B}`` could be checked by one reader as A and acted on by another as B; and
``NaN`` / ``Infinity`` are not JSON at all.  The bridge's lines and the
config files are read through ``loads``, so both refuse the same things the
same way.
"""

from __future__ import annotations

import json
from typing import Any


class StrictJSONError(ValueError):
    """The text is not strict JSON; the message says how."""


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictJSONError(f"the key {json.dumps(key, ensure_ascii=False)[:80]} appears twice in one object")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not a JSON number")


def loads(text: str) -> Any:
    """The value of ``text``; StrictJSONError (a ValueError) for a repeated key or a non-finite constant,
    ValueError for any other malformed JSON, RecursionError when nested too deep."""
    return json.loads(text, object_pairs_hook=_one_value_per_key, parse_constant=_no_constant)

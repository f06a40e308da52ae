"""JSON read strictly: one value per key, no NaN or Infinity.  The project's one JSON line parser.

Parsers differ on which of two equal keys wins, so ``{"agent": A, "agent":
B}`` could be checked by one reader as A and acted on by another as B; and
``NaN`` / ``Infinity`` are not JSON at all.  Everything read from outside
goes through here, so every reader refuses the same things the same way:

* the drivers' request lines (``validate.parse_request``, through
  ``object_line``), the driver then answering an error reply and changing
  nothing;
* the bridge's proof and request lines (``bridge.rules.parse_line``, through
  ``object_line``), which it refuses before any driver runs;
* the config files (``config_schema``, through ``loads``).

docs/protocol.md says nothing of a key given twice; a request holding one is
ambiguous (which value is the request?), so it is refused everywhere, as
the bridge always refused it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import CloudstoreError


class StrictJSONError(CloudstoreError, ValueError):
    """The text is not strict JSON; the message says how."""


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: look for the first key given again
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJSONError(f"the key {json.dumps(key, ensure_ascii=False)[:80]} appears twice in one object")
            seen.add(key)
    return out


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not a JSON number")


def loads(text: str, parse_float: Callable[[str], Any] | None = None) -> Any:
    """The value of ``text``; StrictJSONError (a ValueError) for a repeated key or a non-finite constant,
    ValueError for any other malformed JSON, RecursionError when nested too deep.

    ``parse_float`` is json's: it gets the text of each number with a fraction
    or an exponent (the drivers' refuses ``1e999``, which no double holds).
    """
    return json.loads(
        text, object_pairs_hook=_one_value_per_key, parse_constant=_no_constant, parse_float=parse_float
    )


def object_line(line: bytes | str, what: str, parse_float: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """One line (without its newline) as a strict JSON object: UTF-8, strict JSON, an object.

    Anything else raises StrictJSONError whose message starts with ``what``
    (``request``, ``proof line``) and says why.  An exception ``parse_float``
    raises that is not a ValueError passes through as it is.
    """
    try:
        text = line.decode("utf-8") if isinstance(line, bytes) else line
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"{what} is not UTF-8: {exc}") from exc
    try:
        value = loads(text, parse_float)
    except (ValueError, RecursionError) as exc:
        raise StrictJSONError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise StrictJSONError(f"{what} is not a JSON object")
    return value

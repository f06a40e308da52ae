"""How a check says what it wanted: strict JSON equality and the failure it raises.

Python's ``==`` says ``1 == 1.0 == True``; the wire does not (docs/protocol.md: integers
written as integers, ``true`` is not ``1``). Every comparison a check makes of a
driver's reply goes through :func:`same_json`, so a driver answering ``1.0``
where ``1`` is due, or ``1`` where ``true`` is due, fails.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CloudstoreError

Json = Any

#: How much of a value a failure line shows (a 4 MiB file must not flood it).
SHOW = 300


class CheckFailed(CloudstoreError, AssertionError):
    """A check saw something other than what the contract says: what, expected, got."""

    def __init__(self, what: str, expected: Json, got: Json) -> None:
        self.what = what
        self.expected = short(expected)
        self.got = short(got)
        super().__init__(f"{what}: expected {self.expected}, got {self.got}")


def short(value: Json) -> str:
    """One line showing ``value`` (JSON where it can), cut to :data:`SHOW` characters."""
    if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
        text = value  # a description, not a value: shown as written
    else:
        try:
            text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))
        except (TypeError, ValueError):
            text = repr(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= SHOW else text[:SHOW] + f"...({len(text)} chars)"


def same_json(got: Json, expected: Json) -> bool:
    """Equal as JSON values, types strict: bool is not int, int is not float.

    A float is the same double whether the driver wrote it with a fraction or
    not (a JavaScript driver writes ``2.0`` as ``2``): docs/protocol.md asks for "the
    same double" there, and for integers "exactly".
    """
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, int):
        return type(got) is int and got == expected
    if isinstance(expected, float):
        if isinstance(got, float):
            return got == expected
        return type(got) is int and expected.is_integer() and float(got) == expected
    if isinstance(expected, str) or expected is None:
        return type(got) is type(expected) and got == expected
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(
            same_json(g, e) for g, e in zip(got, expected, strict=False)
        )
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(
            same_json(got[k], expected[k]) for k in expected
        )
    raise TypeError(f"not a JSON value: {expected!r}")


def expect(got: Json, expected: Json, what: str) -> None:
    """Fail unless ``got`` is ``expected`` as a JSON value (see :func:`same_json`)."""
    if not same_json(got, expected):
        raise CheckFailed(what, expected, got)


def expect_that(ok: bool, what: str, expected: Json, got: Json) -> None:
    """Fail unless ``ok``; ``expected`` describes what would have been right."""
    if not ok:
        raise CheckFailed(what, expected, got)


def expect_error(reply: Json, what: str) -> None:
    """Fail unless ``reply`` is exactly ``{"reply": "error", "error": <string>}``."""
    ok = (
        isinstance(reply, dict)
        and reply.keys() == {"reply", "error"}
        and reply["reply"] == "error"
        and isinstance(reply["error"], str)
    )
    expect_that(ok, what, '<{"reply":"error","error":"<why>"}>', reply)


def is_error(reply: Json) -> bool:
    """Whether a reply is an error reply (any shape with ``"reply": "error"``)."""
    return isinstance(reply, dict) and reply.get("reply") == "error"


def is_int(value: Json) -> bool:
    """A JSON integer (not a bool, not a float)."""
    return type(value) is int


def is_number(value: Json) -> bool:
    """A JSON number of either kind (not a bool)."""
    return type(value) in (int, float)

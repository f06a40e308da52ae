"""What parsing a request line will cost in memory, known before parsing it.

``json.loads`` builds a Python object per JSON value: a 16 MiB line of
``[{},{},...]`` becomes ~400 MiB of dicts (25 times the line), which four
proved callers at once turned into 1.7 GiB. The bridge must check a request
(``rules.parse_line``) before a driver sees it, so it charges each line this
estimate against its byte budget first, and refuses or answers ``busy``
rather than parse what it cannot afford.

The estimate is an upper bound, measured against CPython 3.11 with
tracemalloc on the worst shapes (``tests/bridge/test_bridge_cost.py``):

* the line itself, and a second copy for the driver's pipe;
* the decoded text, up to 4 bytes a character (one astral character makes
  the whole str 4 bytes wide), and the string values cut from it, as much
  again;
* every JSON value or key starts after ``[``, ``{``, ``,`` or ``:``, so their
  count (also those inside strings: an over-count, never an under-count)
  times ``PER_VALUE``, the most any one value costs (a dict from
  ``object_pairs_hook`` with its pairs list, 77 bytes measured).

Counting those four bytes is four passes of ``bytes.count`` in C: a few
milliseconds for 16 MiB, nothing like the parse it guards.
"""

from __future__ import annotations

PER_VALUE = 96  # bytes: the most one JSON value or key costs once parsed (measured 77)
BASE = 64 * 1024  # a parse's fixed costs (decoder state, the request dict's own fields)
_OPENERS = (b"{", b"[", b",", b":")


def values_upper_bound(line: bytes) -> int:
    """At least as many as the JSON values and keys in ``line``."""
    return sum(line.count(c) for c in _OPENERS) + 1


def parse_cost(line: bytes) -> int:
    """Bytes that the line and parsing it may hold at once, at most (see the module docstring)."""
    width = 1 if line.isascii() else 4
    return len(line) + 2 * width * len(line) + PER_VALUE * values_upper_bound(line) + BASE


def call_cost(line: bytes) -> int:
    """Bytes a line holds while a driver answers it: the line and the copy written to the driver."""
    return 2 * len(line) + BASE

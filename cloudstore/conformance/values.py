"""JSON values and names that a careless driver mangles, shared by every family.

Events, job specs and dues must come back equal as JSON values (docs/protocol.md):
integers of any size exactly, never through a double; other numbers as the
same double; strings, key names and nesting exactly. Names (agent ids,
owners, threads, holders, job ids, tool names) are any string and must map
injectively to wherever the driver keeps them.
"""

from __future__ import annotations

from .expect import Json

BIG_INTS: list[int] = [2**70, -(2**70), 2**64 + 1, 2**63, -(2**63) - 1, 2**53 + 1, 10**30 + 7]
FLOATS: list[float] = [
    0.1,
    1.5,
    -2.5e-10,
    1e300,
    5e-324,
    1.7976931348623157e308,
    3.141592653589793,
    1e-07,
    123456789.123,
]
STRINGS: list[str] = [
    "", "é日本🎉", "nul\u0000inside", "line\nbreak\ttab\rreturn", 'quote" back\\slash', "\u2028\u2029",
    "\u007f\u0085\u009f", "%2F/../", "e\u0301", "\u00e9", "\ufeffbom", "{\"seq\": 99}",
]
#: Key names a driver that reads or rebuilds objects tends to lose or merge.
KEY_NAMES: dict[str, Json] = {
    "": "empty key", " ": "space", "a.b": 1, "$ref": 2, "__proto__": {"x": 1}, "constructor": 3,
    "é": 4, "e\u0301": 5, "\u0000": 6, "A": 7, "a": 8, "1": 9, "seq2": 10, "Seq": 11,
}
NESTED: dict[str, Json] = {"a": [1, [2, [3, [4, [5, {"b": [None, True, False, {}, []]}]]]]], "empty": [], "obj": {}}


def json_values() -> list[Json]:
    """Every value above, plus the small ones and a long string, each a test of its own."""
    return [*BIG_INTS, *FLOATS, *STRINGS, 0, -1, True, False, None, [], {}, KEY_NAMES, NESTED, "x" * 65536]


#: Names that must stay apart from each other and from everything else.
HOSTILE_NAMES: list[str] = [
    "/", "..", ".", "%", "%2F", "a/b", "a%2Fb", "a b", "a\nb", "nul\u0000x", "日本語", "🎉",
    "e\u0301", "\u00e9", "A", "a", "", " ", "a/", "/a", "../a", "*", "?", "#", "\\", "a=", "a+",
    "~", "x" * 300,
]


def utf8_sorted(names: list[str]) -> list[str]:
    """Sorted by UTF-8 bytes, the order docs/protocol.md gives lists (also code point order)."""
    return sorted(names, key=lambda n: n.encode("utf-8", "surrogatepass"))

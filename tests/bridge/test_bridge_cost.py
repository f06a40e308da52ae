"""``cost.parse_cost`` is an upper bound of what checking a request line takes,
measured with tracemalloc on the shapes that cost the most per byte."""

from __future__ import annotations

import tracemalloc

import pytest

from cloudstore.bridge import rules
from cloudstore.bridge.cost import call_cost, parse_cost

SIZE = 256 * 1024

SHAPES = {
    "empty objects": b"{},",
    "empty lists": b"[],",
    "lists of an object": b"[{}],",
    "objects of a list": b'{"":[]},',
    "small objects": b'{"a":1},',
    "pairs of strings": b'{"ab":"cd"},',
    "short strings": b'"ab",',
    "floats": b"1.5,",
    "big integers": b"12345678901234567890,",
    "escaped text": b'"\\u00e9\\u00e9",',
    "astral text": '"\U0001f600x",'.encode(),
    "one big string": None,
}


def line_of(unit: bytes | None) -> bytes:
    head = b'{"op": "append", "agent": {"id": "a", "owner": null}, "thread": "t", "event": {"seq": 1, "x": '
    if unit is None:
        return head + b'"' + b"x" * SIZE + b'"}}'
    return head + b"[" + unit * (SIZE // len(unit)) + b"0]}}"


@pytest.mark.parametrize("name", list(SHAPES))
def test_parse_cost_is_at_least_what_parsing_takes(name):
    line = line_of(SHAPES[name])
    tracemalloc.start()
    try:
        value = rules.parse_line(line, "request")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(value, dict)
    # The line existed before tracing began: it is counted once more here.
    assert peak + len(line) <= parse_cost(line), (name, peak / len(line), parse_cost(line) / len(line))


def test_a_request_of_few_values_costs_a_few_times_its_size():
    """A 4 MiB file as base64 (the contract's largest datum) fits the default 160 MiB budget many times."""
    line = line_of(None)
    assert parse_cost(line) < 4 * len(line)
    assert call_cost(line) <= parse_cost(line)

"""The suite's own judgement: JSON compared with its types, replies parsed strictly."""

from __future__ import annotations

import pytest

from cloudstore.conformance.expect import CheckFailed, expect_error, same_json
from cloudstore.conformance.transport import parse_reply
from cloudstore.protocol.client import DriverError


@pytest.mark.parametrize("got, expected, same", [
    (1, 1, True), (1.0, 1, False), (True, 1, False), ("1", 1, False), (1, True, False),
    (2.0, 2.0, True), (2, 2.0, True), (2**70, 2**70, True), (float(2**70), 2**70, False),
    (0.1, 0.1, True), (0.1000000001, 0.1, False), (None, None, True), (None, 0, False),
    ({"a": 1}, {"a": 1}, True), ({"a": 1, "b": 2}, {"a": 1}, False), ([1, 2], [2, 1], False),
    ({"a": [1, {"b": True}]}, {"a": [1, {"b": 1}]}, False),
])
def test_same_json(got: object, expected: object, same: bool) -> None:
    assert same_json(got, expected) is same


def test_expect_error_wants_the_exact_shape() -> None:
    expect_error({"reply": "error", "error": "why"}, "x")
    for bad in ({"reply": "error"}, {"reply": "error", "error": 5}, {"reply": "error", "error": "x", "more": 1},
                {"reply": "done"}):
        with pytest.raises(CheckFailed):
            expect_error(bad, "x")


@pytest.mark.parametrize("lines", [[], ["{}", "{}"], ["not json"], ['{"reply": NaN}'], ["[1]"], ['{"reply": 5}'],
                                   ['{"error": "x"}']])
def test_parse_reply_refuses(lines: list[str]) -> None:
    with pytest.raises(DriverError):
        parse_reply(lines)


def test_parse_reply() -> None:
    assert parse_reply(['{"reply":"last","last":3}']) == {"reply": "last", "last": 3}

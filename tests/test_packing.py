"""packing.py's arithmetic: which blocks exist, and how few pieces cover any range of events.

The read path trusts ``cover`` to hold exactly the events asked for (the
first piece may start earlier, nothing may be missing or repeated) and
``halves`` to stand for a missing block; both are checked here on every
range of a small conversation and on the sizes issue 13 names.
"""

from __future__ import annotations

import pytest

from cloudstore.store.packing import PACK_MAX, PACK_MIN, Piece, cover, packed_at


def events_of(pieces: list[Piece]) -> list[int]:
    return [seq for p in pieces for seq in range(p.first, p.end + 1)]


def test_blocks_end_only_at_multiples_of_their_size() -> None:
    m = PACK_MIN
    assert packed_at(0) == [] and packed_at(m - 1) == [] and packed_at(m + m // 2) == []
    assert packed_at(m) == [m]
    assert packed_at(2 * m) == [m, 2 * m]
    assert packed_at(1024) == [s for s in (8, 16, 32, 64, 128, 256, 512, 1024) if s >= m]
    assert packed_at(PACK_MAX * 3) == [
        2**k * PACK_MIN for k in range(PACK_MAX.bit_length() - PACK_MIN.bit_length() + 1)
    ]


def test_every_range_of_a_small_conversation_is_covered_exactly_once() -> None:
    for last in range(0, 140):
        for first in range(1, last + 2):
            pieces = cover(first, last)
            seqs = events_of(pieces)
            if first > last:
                assert pieces == []
                continue
            skip = first - pieces[0].first
            assert 0 <= skip < PACK_MIN, (first, last, pieces)
            assert seqs[skip:] == list(range(first, last + 1)), (first, last, pieces)
            for p in pieces:
                assert p.size == 1 or (p.size in packed_at(p.end) and p.end <= last), p


def test_halves_hold_the_same_events() -> None:
    for size in (8, 16, 256, PACK_MAX):
        block = Piece(size * 5, size)
        assert events_of(block.halves()) == events_of([block])
        assert all(h.size == 1 or h.size in packed_at(h.end) for h in block.halves())


@pytest.mark.parametrize("first,last,most", [
    # Issue 13 asked 6, 2 and 18 with blocks from 8 up; issue 26 (appends at <= 1.1 requests, packing
    # included) made the smallest block 32, so up to 31 single events more, all fetched in the same round.
    (1, 1000, 13),     # read first=1 of 1,000: five blocks and eight events
    (991, 1000, 9),    # the last 10 of 1,000: one block and eight events
    (1, 10_000, 21),
])
def test_the_sizes_issue_13_names_take_few_objects(first: int, last: int, most: int) -> None:
    assert len(cover(first, last)) <= most, cover(first, last)


def test_a_conversation_of_any_length_takes_a_bounded_number_of_objects() -> None:
    """At most two blocks of each size below PACK_MAX, the PACK_MAX blocks, and < PACK_MIN single events."""
    levels = PACK_MAX.bit_length() - PACK_MIN.bit_length()
    for last in (1, 7, 8, 9, 63, 64, 65, 999, 4095, 4096, 4097, 8191, 12_345):
        for first in (1, 2, last // 2 + 1, max(1, last - 9)):
            pieces = cover(first, last)
            bound = 2 * levels + (last - first) // PACK_MAX + 1 + (PACK_MIN - 1)
            assert len(pieces) <= bound, (first, last, len(pieces))

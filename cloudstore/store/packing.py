"""Where a conversation's events are packed: aligned blocks of 32, 64, 128 ... 4,096 events.

A read at a real bucket's round trip (tens of milliseconds) is slow in
proportion to how many rounds it takes and costly in proportion to how many
objects it fetches, not to how many bytes.  Events are one object each (so
that one conditional create settles each number); to read many of them in
few objects, every aligned block is also written packed: the block of size
``z`` ending at ``end`` holds events ``end - z + 1 .. end`` whenever ``end``
is a multiple of ``z``, for ``z`` = ``PACK_MIN``, twice that, and so on up to
``PACK_MAX``.  Any range of events is then a few whole blocks (at most two of
each size, as in a segment tree), at most ``PACK_MIN - 1`` single events
after the last packed one, and one block that starts before the range (its
first events skipped).  ``cover`` of 1..1,000 is thirteen pieces (five
blocks, eight single events), of 1..10,000 twenty-one, of the last ten of
1,000 nine; a read fetches the single events after the last block as one
tail when a reader before it packed them (below, "Tails"): six objects,
and two.

A block is packed by whoever appended its last event, after the reply when
it runs as a driver, from the events that process holds in memory (it
appended them): the block of ``PACK_MIN`` and the left halves of the next
sizes up need no read, so packing is a write per block and nothing else in
the common case.  It may be missing (a crash, a failed write, a packer
still at work): a reader that finds it missing reads its two halves
instead, down to single events.  A block's bytes are the same whoever packs
it, so two packers write the same object.

The cost: every event is in up to ``log2(PACK_MAX / PACK_MIN) + 1`` blocks,
and blocks add about one write per sixteen appends (one block of 32, half a
block of 64, ...), off the append's own path: an append costs at most 1.1
requests on average, packing included (issue 26; 8 as the smallest size
cost 1.25).  What a smallest size of 32 costs a read: up to 31 single events
after the last block, fetched at once beside it.  Blocks of 8 and 16 that
earlier versions packed are not read (nothing names them); every block of
32 and up they packed sits where this layout looks for it, with the same
bytes.

Tails (format 6, issue 45).  The events after the last whole block of 32
are up to 31 single objects, and a fresh read fetched each: 1..1,000 was
five blocks and eight events, fifteen requests with the head and the
listing.  An appender cannot pack them without giving appends back (a tail
written every 8 events would cost 1.14 requests an append).  So the first
*reader* that had to fetch them one by one packs them, after its reply: the
tail after block boundary ``b`` holds events ``b+1 .. k`` (``k`` what that
reader read), at one name per boundary (``EpochKeys.tail``), overwritten by
the next reader who saw more.  A later read asks for the tail beside its
blocks, in the same round, and fetches singly only the events after ``k``
(a third round, only when events came since the tail was written).  So a
fresh read of 1..1,000 is the head, the listing, five blocks and the tail:
eight requests in two rounds, and the last ten of 1,000 four.

Why a tail cannot make a read wrong: every event in it was read from its
single object, and events never change while their epoch lives (only
``remove`` ends them, by a new epoch); a read uses a tail only of the epoch
the listing found alive, only its events up to the listing's last number,
and only if it is exactly a run ``b+1, b+2, ...`` of events each with its
number (anything else is read as if there were no tail, and the reader
writes a good one).  Two readers writing one tail at once write runs of
the same events; either is right.  Tails are never deleted one by one: a
block of 32 makes a tail unused, and ``remove`` purges it with the epoch's
blocks (it is a segment, ``p<epoch>/<b>.0``, for every release since 0.4.0).
"""

from __future__ import annotations

from dataclasses import dataclass

PACK_MIN = 32
PACK_MAX = 4096
#: A tail is written only if its events' bytes are at most this: past it the bytes, not the requests,
#: are a read's cost, and a reader's write should not be a large one.
TAIL_BYTES_MAX = 1024 * 1024


def tail_boundary(last: int) -> int:
    """The boundary a tail ends the packed blocks at: the last multiple of PACK_MIN at or below ``last``."""
    return last - last % PACK_MIN


@dataclass(frozen=True)
class Piece:
    """A packed block (``size`` > 1) or a single event (``size`` == 1) ending at ``end``."""

    end: int
    size: int

    @property
    def first(self) -> int:
        return self.end - self.size + 1

    def halves(self) -> list[Piece]:
        """What to read instead when this block is missing: its two halves, or its single events."""
        if self.size <= PACK_MIN:
            return [Piece(seq, 1) for seq in range(self.first, self.end + 1)]
        half = self.size // 2
        return [Piece(self.end - half, half), Piece(self.end, half)]


def packed_at(end: int) -> list[int]:
    """The sizes of the blocks that end at ``end``, smallest first (none unless a multiple of PACK_MIN)."""
    sizes = []
    size = PACK_MIN
    while size <= PACK_MAX and end % size == 0 and end > 0:
        sizes.append(size)
        size *= 2
    return sizes


def cover(first: int, last: int) -> list[Piece]:
    """Few pieces, in order, holding events ``first..last``; the first may start before ``first``.

    Blocks are taken greedily, largest aligned one first, up to the last
    multiple of PACK_MIN; the events after it are single pieces.
    """
    if first > last:
        return []
    packed_to = last - last % PACK_MIN
    pieces: list[Piece] = []
    at = (first - 1) // PACK_MIN * PACK_MIN  # events 1..at need no reading
    while at < packed_to:
        size = PACK_MIN
        while size * 2 <= PACK_MAX and at % (size * 2) == 0 and at + size * 2 <= packed_to:
            size *= 2
        pieces.append(Piece(at + size, size))
        at += size
    pieces.extend(Piece(seq, 1) for seq in range(max(at + 1, first), last + 1))
    return pieces

"""Deliberately worse drivers and runners, for proving that tests/test_request_counts.py catches them.

Python imports ``sitecustomize`` at start-up from ``sys.path``; this folder is
put first on ``PYTHONPATH`` only for the processes a meta-test starts (a
driver, or a runner and the drivers it starts, which inherit its
environment), and ``LNK_TEST_WORSE`` names the variant.  Each variant is a
plausible regression of one headline cost, made by patching the package
after it is imported, never by editing it.  Without ``LNK_TEST_WORSE`` this
module does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def pack_from_8() -> None:
    """Blocks from 8 events up, as before issue 26: an append costs 1.25 requests on average, not 1.1."""
    from cloudstore.store import packing

    packing.PACK_MIN = 8


def no_memory() -> None:
    """A serve process that never trusts what it remembers of a conversation: every append reads the head
    and lists the conversation before its write."""
    from cloudstore.store import conversations

    conversations.TRUST_SECONDS = -1.0


def no_blocks() -> None:
    """Reads that ignore packed blocks: every event fetched on its own."""
    from cloudstore.store import conversations
    from cloudstore.store.packing import Piece

    conversations.cover = lambda first, last: [Piece(seq, 1) for seq in range(first, last + 1)]  # type: ignore[attr-defined]


def small_blocks_only() -> None:
    """Reads that look for the smallest blocks only (as reads of blocks of 8 and 16 were, before they went):
    1..1,000 is 31 blocks and 8 events, not 5 blocks and 8 events."""
    from cloudstore.store import packing

    packing.PACK_MAX = packing.PACK_MIN


def no_prefetch() -> None:
    """Reads that wait for the listing before asking for any block (the head's hint ignored)."""
    from cloudstore.store.conversations import Conversations

    Conversations._prefetch = lambda *args, **kwargs: None  # type: ignore[method-assign]


def no_tail() -> None:
    """Reads that never ask for the tail (packing.py, "Tails"): the events after the last block of 32 are
    fetched one by one on every fresh read, as before issue 45."""
    from cloudstore.store.conversations import Conversations

    Conversations._ask_tail = lambda *args, **kwargs: None  # type: ignore[method-assign]


def last_lists_all() -> None:
    """The newest event found by listing the whole conversation, not its first key."""
    from cloudstore.store.conversations import Conversations

    def newest(self: Any, keys: Any, thread: str) -> Any:
        listed = list(self.store.list(keys.thread(thread)))
        return listed[0] if listed else None

    Conversations._newest = newest  # type: ignore[method-assign]


def job_next_reads_records() -> None:
    """``job_next`` reading the record behind every entry of its first listing, not the first only."""
    from cloudstore.store.due_index import LOOK, DueIndex

    answer = DueIndex.next

    def next_(self: Any, waiting_of: Callable[[Any], Any]) -> Any:
        listed = self.space.store.list(self.root, limit=LOOK)
        list(self.space.get_many(self._record_key(item.key) for item in listed))
        return answer(self, waiting_of)

    DueIndex.next = next_  # type: ignore[method-assign]


def file_list_ledger_after() -> None:
    """``file_list`` reading the agent's ledger after its listing, not beside it: a round more."""
    from cloudstore.store.files import Files

    read = Files._ledger_known
    Files._ledger_known = lambda self, keys: self._ledgers.get(keys.base)  # type: ignore[method-assign]
    Files._ledger = lambda self, keys, keep=True: read(self, keys)  # type: ignore[method-assign]  # after the listing


def idle_poll_reads_marks() -> None:
    """A runner whose every poll also asks each agent's ``job_mark``."""
    from cloudstore.scheduling.watch import IndexSource

    poll = IndexSource.poll

    def poll_(self: Any, now: float) -> Any:
        for store in self.stores.values():
            store.mark()
        return poll(self, now)

    IndexSource.poll = poll_  # type: ignore[method-assign]


def claim_reads_back() -> None:
    """A claim that reads the job back from firing after it moved it there (the bridge's way, 4 ops)."""
    from cloudstore.scheduling.store_client import AgentStore

    claim = AgentStore.claim_leased

    def claim_(self: Any, job_id: str, *args: Any, **kwargs: Any) -> Any:
        reply = claim(self, job_id, *args, **kwargs)
        self.get("firing", job_id)
        return reply

    AgentStore.claim_leased = claim_  # type: ignore[method-assign]


VARIANTS: dict[str, Callable[[], None]] = {
    "pack-from-8": pack_from_8,
    "no-memory": no_memory,
    "no-blocks": no_blocks,
    "small-blocks-only": small_blocks_only,
    "no-prefetch": no_prefetch,
    "no-tail": no_tail,
    "last-lists-all": last_lists_all,
    "job-next-reads-records": job_next_reads_records,
    "file-list-ledger-after": file_list_ledger_after,
    "idle-poll-reads-marks": idle_poll_reads_marks,
    "claim-reads-back": claim_reads_back,
}

_chosen = os.environ.get("LNK_TEST_WORSE")
if _chosen:
    VARIANTS[_chosen]()  # an unknown name fails the process at start: a meta-test never runs the good code unseen

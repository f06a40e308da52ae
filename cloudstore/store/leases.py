"""Leases: who runs a conversation's turn, kept in the conversation's head (heads.py).

Taken with a create-if-absent, taken over or renewed with a write that names
the version read (the Hudi / Litestream lock design), released by a
conditional write that drops the holder rather than a delete, since
fake-gcs-server ignores preconditions on delete.  Every body holds fresh
times (and the seam adds a nonce), so S3 ETags always change.

A taker whose conditional write loses re-reads: if another holder has the
lease now, that holder won the race and this one is told ``held``, even if
``lapse_ms`` is so short the new lease could already be called lapsed.  So of
several takers at once exactly one succeeds.

Time.  Lapse is judged to the millisecond, in one place, ``lapsed()``, on
*store time* (clock.py): the writer's and the judge's clocks are each
corrected by what the store's replies say of its own, so two machines whose
clocks differ by S judge one lease within about 2 s + a round trip of each
other (S3, GCS; milliseconds on a folder), whatever S is, and exactly
alike when their clocks agree with the store's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import stored
from .heads import HEAD, Heads, checked, fence_of, has_lease, next_fence, without_lease
from .model import Agent
from .space import KEEP, Space

#: The smallest ``lapse_ms`` the docs allow for a lease renewed every lapse/3 on GCS (docs/protocol.md,
#: *How often a lease can be renewed*).  A lease is one object, its conversation's head, and GCS takes
#: about one write a second per object name (a burst of 2 beyond it, then 429): renewed every 2 s, a
#: lease spends half of that, and the rest is left to ``take``, ``end`` and the packing hint, which is
#: written no sooner than a second after any write of this process to the head (``Heads.hint_due``).
GCS_LAPSE_MIN_MS = 6000


def lapsed(lease: dict[str, Any], lapse_ms: int, now: int) -> bool:
    """The one judgment of lapse: not renewed for ``lapse_ms`` or more (store time, ms)."""
    return now - int(lease["renewed"]) >= lapse_ms


def held_under(head: dict[str, Any], holder: str, fence: int | None) -> bool:
    """Whether ``holder`` holds the head's lease, with fence ``fence`` when one is named.  A lapsed lease
    nobody took over is still its holder's: only a take moves it on."""
    return has_lease(head) and head["holder"] == holder and (fence is None or fence_of(head) == fence)


class Leases:
    """take, renew, end, leases (``remove`` ends a lease with the epoch's bump: conversations.py)."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self.heads = Heads(space)
        self.clock = space.store.clock

    def take(self, agent: Agent, thread: str, holder: str, lapse_ms: int) -> str:
        return self.take_naming(agent, thread, holder, lapse_ms)[0]

    def take_naming(self, agent: Agent, thread: str, holder: str, lapse_ms: int,
                    guess: bool = False, wanted: Callable[[str], bool] | None = None) -> tuple[str, str | None]:
        """``take``, and who holds the lease when the answer is ``held`` (else None): ``take_fenced``
        without its fence."""
        took, held_by, _ = self.take_fenced(agent, thread, holder, lapse_ms, guess, wanted)
        return took, held_by

    def take_fenced(self, agent: Agent, thread: str, holder: str, lapse_ms: int, guess: bool = False,
                    wanted: Callable[[str], bool] | None = None, refence: bool = False,
                    at: list[float] | None = None) -> tuple[str, str | None, int | None]:
        """``take``, who holds the lease when the answer is ``held`` (else None), and the lease's fence
        when it is ``holder``'s (``took``, ``lapsed``; else None).

        The fence (heads.py) is the lease's start: a take that gives the
        lease to a holder (from no lease, or from a lapsed one) writes
        ``max(now, the fence before + 1)``, so it only grows across a
        thread's holders; a take by the holder itself renews and keeps it
        (with ``refence``, a new one all the same: a scheduler recovering a job
        it fired itself before, which a system fed the old fence must tell apart).
        ``at`` gets ``time.monotonic()`` when the write that won was decided (its
        ``renewed`` taken): how long ago the lease was confirmed (``held_ms``).

        The scheduler's own driver answers this as ``lease_take``: a runner
        refused a job's claim learns which runner has it, and so which
        runners share its agents (``scheduling.peers``), at no extra request.

        With ``guess`` (a job's claim lease), the first write starts without
        a read: from the head this process last wrote or read, else as a
        create-if-absent (a fresh job id has no head), so the common take is
        one request.  A write from a guess that loses proves nothing about
        other takers, so only writes decided on a head READ count as lost.

        ``wanted`` (a job's claim): asked, with the answer a write decided on
        a head READ would give (``took`` or ``lapsed``), whether the lease is
        still worth a write; False answers ``skipped`` and writes nothing.
        The guess found a head there (an ended lease, or one taken since):
        a claimer that then learns its job has left waiting takes no lease
        only to let it go, two writes of one object within a second.
        """
        keys = self.space.keys(agent)
        # The lapsed lease a write decided on a head READ tried to take over.  When that write
        # loses, what won is judged by the head read again: the same lapsed lease still there
        # means the winner was no take (a hint moved, a removal rolled forward), so take it again;
        # any other lease is another taker's (or its holder's renew): held, however its times look
        # by our clock, so that two takers never both take over one lapsed lease.
        tried: list[tuple[Any, Any, Any] | None] = [None]
        rounds = [0]

        def change(head: dict[str, Any]) -> tuple[Any, tuple[str, str | None, int | None]]:
            if at is not None:
                at.append(time.monotonic())
            rounds[0] += 1
            from_read = not (guess and rounds[0] == 1)
            now = self.clock.now_ms()  # what is written; lapse is judged by the earliest plausible time
            if has_lease(head):
                if head["holder"] == holder and not refence:
                    return {**head, "renewed": now}, ("took", None, fence_of(head))
                if head["holder"] == holder:
                    fence = next_fence(head, now)
                    return {**head, "started": fence, "renewed": now}, ("took", None, fence)
                lease = (head["holder"], head.get("started"), head.get("renewed"))
                if not lapsed(head, lapse_ms, self.clock.earliest_ms()) or tried[0] is not None and lease != tried[0]:
                    return KEEP, ("held", str(head["holder"]), None)
                if from_read and wanted is not None and not wanted("lapsed"):
                    return KEEP, ("skipped", None, None)
                if from_read:
                    tried[0] = lease
                answer = "lapsed"
            else:
                if from_read and wanted is not None and not wanted("took"):
                    return KEEP, ("skipped", None, None)
                if from_read:
                    tried[0] = (None, None, None)  # no lease was there: any lease found after losing is a taker's
                answer = "took"
            fence = next_fence(head, now)
            return {**without_lease(head), "holder": holder, "started": fence, "renewed": now}, (answer, None, fence)

        return self.heads.update(keys, thread, change, cached=guess, absent=guess)

    def renew(self, agent: Agent, thread: str, holder: str, at: list[float] | None = None) -> bool:
        def change(head: dict[str, Any]) -> tuple[Any, bool]:
            if at is not None:
                at.append(time.monotonic())
            if not has_lease(head) or head["holder"] != holder:
                return KEEP, False
            return {**head, "renewed": self.clock.now_ms()}, True

        return self.heads.update(self.space.keys(agent), thread, change, cached=True)

    def renew_all(self, leases: list[tuple[Agent, str]], holder: str) -> tuple[list[bool], float]:
        """``renew`` of each (agent, thread), all at once (one round trip for all, not one each): the
        scheduler's renewer confirms every claim of a round together, whatever their agents
        (``lease_renew``).  Also ``time.monotonic()`` when the earliest of the writes that won was decided."""
        stamps: list[list[float]] = [[] for _ in leases]
        done = list(self.space.pool.map(lambda i: self.renew(leases[i][0], leases[i][1], holder, stamps[i]),
                                        range(len(leases))))
        return done, min((s[-1] for s in stamps if s), default=time.monotonic())

    def end(self, agent: Agent, thread: str, holder: str, fence: int | None = None) -> None:
        """Drop the holder, conditionally: a release landing late fails instead of ending a newer lease
        (with ``fence``: only the lease of that fence, not one the same holder took again since)."""
        def change(head: dict[str, Any]) -> tuple[Any, None]:
            if not held_under(head, holder, fence):
                return KEEP, None
            return without_lease(head), None

        self.heads.update(self.space.keys(agent), thread, change, cached=True)

    def holder_of(self, agent: Agent, thread: str) -> tuple[str | None, int]:
        """Who holds the lease now, read from the store (None: nobody), and its fence (the last one's
        when it ended; 0: none known)."""
        head = self.heads.read(self.space.keys(agent), thread)
        return (str(head["holder"]) if has_lease(head) else None), fence_of(head)

    def leases(self, agent: Agent, lapse_ms: int) -> list[dict[str, Any]]:
        keys = self.space.keys(agent)
        listed = [item for item in self.space.store.list(keys.leases()) if "/" not in item.key[len(keys.leases()):]]
        with stored.parsing(HEAD):
            heads: list[dict[str, Any] | None] = self.space.listed_json(listed)
        for item, head in zip(listed, heads, strict=True):  # each head of its own key's thread (heads.checked)
            if head is not None:
                thread = stored.text(stored.obj(head, HEAD).get("thread"), HEAD, "its thread")
                stored.expect(keys.lease(thread) == item.key, HEAD, "it is of another conversation")
                checked(thread, head)
        now = self.clock.earliest_ms()  # "lapsed" as a take would judge it
        out = [
            {
                "thread": head["thread"],
                "holder": head["holder"],
                "started": head["started"] / 1000,
                "renewed": head["renewed"] / 1000,
                "lapsed": lapsed(head, lapse_ms, now),
            }
            for head in heads
            if has_lease(head)
        ]
        out.sort(key=lambda item: item["thread"].encode("utf-8", "surrogatepass"))
        return out

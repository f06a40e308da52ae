"""Which runners share an agent, and which of them should claim a given due job.

Several runners serving one agent all see each due job in their polls.  If
they all go for it, one wins and each of the others pays a refused lease
``take`` (a read, and a failed write when they race to the same moment): at
a cloud's prices that was a third of the requests per fired job with three
runners.  So each due job has an *owner*: of the runners known to share its
agent, the one whose rendezvous weight for (agent, job id) is highest.  The
owner claims it at once; the others wait a grace (longer than a poll and a
claim) and claim it only if it is still waiting then: the owner died, is
busy, or doesn't serve the agent after all.

Knowledge costs no request: a refused claim (``lease_take`` answering
``held``) names the runner holding it, which therefore serves that agent;
and the runners on one machine say who they are and which agents they serve
(``wake.Presence``, heard by the runner), so those know each other before
any claim is lost.
A runner that claims a job it deferred to another has seen that owner fail
to claim it, and forgets it for that agent; a runner not heard of for
``ttl`` is forgotten too.  Forgetting is always safe: with no peers known a
runner claims everything at once, as all runners did before, and a race
teaches it its peers again.  Rendezvous hashing moves only the jobs of a
runner that comes or goes, and needs no agreement: two runners with
different knowledge at worst both claim a job (one wins, the lease decides)
or both defer it (it waits one grace).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from .store_client import Agent

PEER_TTL = 600.0  # seconds a runner is believed to serve an agent after the last sign of it


def weight(holder: str, agent: Agent, job_id: str) -> int:
    """The rendezvous weight of ``holder`` for one job: a stable hash every runner computes alike."""
    text = "\0".join((holder, agent.label(), job_id)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


class Peers:
    """The other runners known to serve each agent (``saw``, ``drop``) and each job's ``owner``."""

    def __init__(self, me: str, ttl: float = PEER_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self.me = me
        self.ttl = ttl
        self.clock = clock
        self._seen: dict[Agent, dict[str, float]] = {}  # agent -> holder -> when last seen (clock)
        self._lock = threading.Lock()

    def saw(self, agent: Agent, holder: str) -> None:
        """``holder`` holds a lease of ``agent``'s job: it serves that agent."""
        if holder == self.me:
            return
        with self._lock:
            self._seen.setdefault(agent, {})[holder] = self.clock()

    def drop(self, agent: Agent, holder: str) -> None:
        """``holder`` let a job of ``agent`` it owned wait a grace: don't count on it for that agent."""
        with self._lock:
            self._seen.get(agent, {}).pop(holder, None)

    def known(self, agent: Agent) -> list[str]:
        """The other runners believed to serve ``agent`` now."""
        cutoff = self.clock() - self.ttl
        with self._lock:
            holders = self._seen.get(agent, {})
            for holder in [h for h, at in holders.items() if at < cutoff]:
                del holders[holder]
            return sorted(holders)

    def owner(self, agent: Agent, job_id: str) -> str:
        """Who claims ``job_id`` first: this runner's id or a peer's."""
        return max([self.me, *self.known(agent)], key=lambda holder: (weight(holder, agent, job_id), holder))

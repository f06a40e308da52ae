"""Whether each agent's store answers: ``lnk_scheduler_store_unreachable{owner,agent}``, 0 or 1.

A runner whose store is only unreachable (a bucket's network down, a bridge
restarting) is not misconfigured: it keeps running and retries with backoff
(``Runner.run``).  What the operator needs is to SEE it, beside the
``store_unreachable`` and ``store_error`` log lines: this gauge is 1 for an
agent from a request of its that got no usable reply (the transport failed,
or the store answered an error) until one that did, and starts at 0.
``Reach.watch`` wraps a ``StoreClient``; requests name their agent, so one
shared driver process reports each of its agents apart.
"""

from __future__ import annotations

import threading
from typing import Any

from ..runtime import metrics
from .store_client import StoreCallError, StoreClient

GAUGE = "lnk_scheduler_store_unreachable"
HELP = ("1 while the agent's store gave no usable reply to the runner's last request for it "
        "(no reply, or an error reply; retried with backoff), else 0.")


def _labels(agent: Any) -> metrics.Labels:
    if not isinstance(agent, dict):
        return ()
    owner = agent.get("owner")
    # Owner null and owner "" are different agents: a label can't be null, so no owner is the label absent.
    return (("agent", str(agent.get("id"))),) + ((("owner", owner),) if isinstance(owner, str) else ())


class Reach:
    """The agents' last outcomes, filled by the clients ``watch`` wraps."""

    def __init__(self) -> None:
        self._state: dict[metrics.Labels, int] = {}
        self._lock = threading.Lock()

    def known(self, agent: dict[str, Any]) -> None:
        """An agent shown as 0 before its first request."""
        with self._lock:
            self._state.setdefault(_labels(agent), 0)

    def note(self, agent: Any, failed: bool) -> None:
        with self._lock:
            self._state[_labels(agent)] = int(failed)

    def watch(self, client: StoreClient) -> Watched:
        return Watched(client, self)

    def families(self) -> dict[str, metrics.Family]:
        with self._lock:
            samples: metrics.Samples = {labels: float(v) for labels, v in self._state.items() if labels}
        return {GAUGE: metrics.Family(GAUGE, HELP, samples, kind="gauge")}


class Watched:
    """A StoreClient whose every request's outcome is noted in ``reach``, by the agent it names."""

    def __init__(self, inner: StoreClient, reach: Reach) -> None:
        self.inner = inner
        self.reach = reach

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self.inner.request(request)
        except StoreCallError:
            self.reach.note(request.get("agent"), True)
            raise
        self.reach.note(request.get("agent"), isinstance(reply, dict) and reply.get("reply") == "error")
        return reply

    def close(self) -> None:
        self.inner.close()

"""Whether each agent's store answers: ``lnk_scheduler_store_unreachable{owner,agent}``, 0 or 1.

A runner whose store is only unreachable (a bucket's network down, a bridge
restarting) is not misconfigured: it keeps running and retries with backoff
(``Runner.run``).  What the operator needs is to SEE it, beside the
``store_unreachable`` and ``store_error`` log lines: this gauge is 1 for an
agent from a request of its that got no usable reply (the transport failed,
or the store answered an error) until one that did, and starts at 0.
``Reach.watch`` wraps a ``StoreClient``; requests name their agent, so one
shared driver process reports each of its agents apart.

The same outcomes make the runner's readiness (``runtime.health``, served at
``/readyz``): with ``health``, each watched client is a source of it, named
by what it reaches (the runner's driver, a bridge), ready while its last
request got a usable reply and that reply is recent.
"""

from __future__ import annotations

import threading
from typing import Any

from ..runtime import metrics
from ..runtime.health import Health
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

    def __init__(self, health: Health | None = None) -> None:
        self._state: dict[metrics.Labels, int] = {}
        self._lock = threading.Lock()
        self.health = health

    def known(self, agent: dict[str, Any]) -> None:
        """An agent shown as 0 before its first request."""
        with self._lock:
            self._state.setdefault(_labels(agent), 0)

    def note(self, agent: Any, failed: bool, source: str = "", why: str = "") -> None:
        with self._lock:
            self._state[_labels(agent)] = int(failed)
        if self.health is not None and source:
            self.health.note(source, not failed, why)

    def watch(self, client: StoreClient, source: str = "") -> Watched:
        """``client``, its outcomes noted; ``source``: its name in the readiness (with ``health``)."""
        if self.health is not None and source:
            self.health.expect(source)
        return Watched(client, self, source)

    def families(self) -> dict[str, metrics.Family]:
        with self._lock:
            samples: metrics.Samples = {labels: float(v) for labels, v in self._state.items() if labels}
        return {GAUGE: metrics.Family(GAUGE, HELP, samples, kind="gauge")}


class Watched:
    """A StoreClient whose every request's outcome is noted in ``reach``, by the agent it names."""

    def __init__(self, inner: StoreClient, reach: Reach, source: str = "") -> None:
        self.inner = inner
        self.reach = reach
        self.source = source

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self.inner.request(request)
        except StoreCallError as exc:
            self.reach.note(request.get("agent"), True, self.source, str(exc) or type(exc).__name__)
            raise
        failed = isinstance(reply, dict) and reply.get("reply") == "error"
        self.reach.note(request.get("agent"), failed, self.source, str(reply.get("error")) if failed else "")
        return reply

    def close(self) -> None:
        self.inner.close()

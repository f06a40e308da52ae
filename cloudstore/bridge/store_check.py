"""The bridge asks its store itself: once at start-up (a store it cannot open stops it), then while idle.

A bridge whose driver setting named a folder that did not exist started,
logged INFO only, answered ``GET /metrics`` 200 and then answered every call
with an error (issue 46, item 1); the scheduler refused the same mistake at
start-up.  Now the bridge sends one request of its own through a driver
before it listens (``first_check``): a reply that no waiting changes (the
driver's setting, the store's refusal: ``health.permanent_error``) or a
driver that cannot be run stops it with exit 2 and one line naming what to
fix; a store failing only for now (a timeout, the network) is logged and
left to the readiness probe.

While running, a usable reply to any call keeps the bridge ready
(``StoreBridge.health``); when none came for ``every`` seconds, ``StoreWatch``
asks the store once itself, so an idle bridge's readiness still says
whether its store answers, at one question every ``every`` seconds at most,
and a probe never waits on the store.

The question is ``last`` of a thread no agent writes (``CHECK_THREAD``) of
the first agent served: an op every driver keeps (store-interface.txt),
that writes nothing the agents see (our drivers: a head read and a one-key
listing, sent together), and the first op of a driver process, which reads
(and judges) the store's format record before it answers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from ..runtime.health import Health, permanent_error
from .drivers import DriverFailed, DriverTimeout, NoDriverFree
from .server import STORE, StoreBridge, is_error_reply

log = logging.getLogger("cloudstore.bridge")

#: The thread the bridge's own question reads: a name no agent's conversation is expected to have.
CHECK_THREAD = ".lnk-store-bridge-check"
#: Seconds without a usable reply after which an idle bridge asks its store itself: a check is a
#: head read and a one-key listing, so an idle bridge pays at most 5,760 requests a day for it.
CHECK_EVERY = 30.0
#: How long a usable reply keeps the bridge ready: a check missed (a slow call) is not an outage yet.
FRESH_FOR = 3 * CHECK_EVERY


@dataclass(frozen=True)
class StoreProblem:
    """Why the bridge's question got no usable reply; ``fix`` when no waiting changes it (exit 2 at start)."""

    problem: str
    fix: str | None = None


def check(bridge: StoreBridge) -> StoreProblem | None:
    """Ask the store once through a driver; None when it answered usably."""
    spec = next(iter(bridge.agents.values()))
    request = {"op": "last", "agent": {"owner": spec.owner, "id": spec.id}, "thread": CHECK_THREAD}
    try:
        reply = bridge.ask_store(request)
    except DriverFailed as exc:
        if not exc.sent:  # the driver could not be run at all: no waiting changes that
            return StoreProblem(f"the driver: {exc}", "check --driver (a program on PATH, or a path)")
        return StoreProblem(f"the driver failed: {exc}")
    except (DriverTimeout, NoDriverFree) as exc:
        return StoreProblem(f"the driver: {exc}")
    if not is_error_reply(reply):
        return None
    try:
        error = str(json.loads(reply).get("error"))
    except ValueError:
        error = reply[:200].decode("utf-8", "replace")
    fix = permanent_error(error)
    if fix is not None:
        fix += " in --driver-env (or the bridge's environment)"
    return StoreProblem(f"the driver answered: {error}", fix)


def first_check(bridge: StoreBridge, health: Health | None) -> StoreProblem | None:
    """The start-up question: the problem that must stop the bridge (its ``fix`` set), or None to start.

    A store failing only for now is logged as a warning and noted in
    ``health`` (not ready until a reply comes); the bridge starts.
    """
    found = check(bridge)
    if found is None:
        if health is not None:
            health.note(STORE, True)
        return None
    if found.fix is not None:
        return found
    log.warning("the store did not answer the bridge's start-up request: %s; calls are answered meanwhile and "
                "the store is asked again every %g s (readiness: not ready until it answers)",
                found.problem, CHECK_EVERY)
    if health is not None:
        health.note(STORE, False, found.problem)
    return None


class StoreWatch:
    """Asks the store once ``every`` seconds went by without a usable reply, noting the outcome in ``health``."""

    def __init__(self, bridge: StoreBridge, health: Health, every: float = CHECK_EVERY) -> None:
        self.bridge = bridge
        self.health = health
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = health.last_ok(STORE) is None  # the start-up question already warned of it

    def start(self) -> StoreWatch:
        self._thread = threading.Thread(target=self._run, name="bridge-store-check", daemon=True)
        self._thread.start()
        return self

    def _wait(self) -> float:
        """Seconds until a check is due: ``every`` after the last usable reply, or after the last failure."""
        last = self.health.last_ok(STORE)
        return self.every if last is None else max(0.0, last + self.every - time.monotonic())

    def _run(self) -> None:
        while not self._stop.wait(self._wait()):
            last = self.health.last_ok(STORE)
            if last is not None and time.monotonic() - last < self.every:
                continue  # a call answered meanwhile: the store is known to answer
            try:
                found = check(self.bridge)
            except Exception:  # a bug must cost the check, never the bridge; the probes then say not ready
                log.exception("the bridge's store check failed")
                found = StoreProblem("the bridge's store check failed (see the log)")
            if self._stop.is_set():
                return  # the bridge is stopping: its drivers ending is no news of the store
            self._note(found)

    def _note(self, found: StoreProblem | None) -> None:
        if found is None:
            if self._failing:
                log.info("the store answers the bridge's check again")
            self._failing = False
            self.health.note(STORE, True)
            return
        if not self._failing:  # once per outage: the probes say it meanwhile
            log.warning("the store did not answer the bridge's check: %s; asked again every %g s",
                        found.problem, self.every)
        self._failing = True
        self.health.note(STORE, False, found.problem)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

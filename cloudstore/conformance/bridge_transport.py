"""The conformance suite's way in through a store bridge (``mode = "bridge"``).

The contract's checks are to pass "run here and behind the store bridge".
Behind the bridge every request is proved, so each agent a check names must
be one the bridge serves with a key the caller holds. The checks make fresh
agents as they go, so this transport runs a ``StoreBridge`` of its own over
the driver under test and, on an agent's first request, adds it with a fresh
key and folder, then proves as it. Nothing about the request is changed: a
check that one agent cannot see another's things still tests exactly that.

A request line whose agent cannot be read (malformed on purpose) is proved as
a standing placeholder agent; the bridge refuses it, which a check sees as
the ``{"reply": "error"}`` it expects.

It lives with the suite, not in ``cloudstore.bridge``: the suite uses the
bridge, the bridge never imports the suite (no import cycle between them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from ..bridge.client import exchange, proof_line
from ..bridge.limits import Limits
from ..bridge.proof import new_key_hex
from ..bridge.server import AgentSpec, StoreBridge
from ..protocol.client import DriverError
from ..protocol.validate import Agent
from .program import Driver
from .transport import Transport

_PLACEHOLDER = Agent(id="lnk-store-check malformed", owner=None)


def _agent_of(line: bytes) -> Agent:
    """The agent a request line names, or the placeholder when it names none readably."""
    try:
        value = json.loads(line)
        agent = value["agent"]
        owner = agent.get("owner")
        if isinstance(agent["id"], str) and agent["id"] and (owner is None or isinstance(owner, str)):
            return Agent(id=agent["id"], owner=owner)
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    return _PLACEHOLDER


class BridgeTransport(Transport):
    """Each request one proved connection to a bridge this transport runs."""

    mode = "bridge"
    race_window_ms = 2000  # twice serve mode's: racers pass a socket and a driver pool (warmed first)

    def __init__(self, driver: Driver, limits: Limits = Limits()) -> None:
        # /tmp, not $TMPDIR: a Unix socket's path must fit in 108 bytes.
        self.root = tempfile.mkdtemp(prefix="lsc-bridge-", dir="/tmp" if os.path.isdir("/tmp") else None)
        harness = os.path.join(self.root, "h")
        os.mkdir(harness, 0o700)
        self.bridge = StoreBridge(harness, [], driver.argv, dict(driver.env), limits)
        self._lock = threading.Lock()
        self._proofs: dict[Agent, bytes] = {}
        self._count = 0
        self.bridge.start()

    def _proof(self, agent: Agent) -> bytes:
        """The proof line for ``agent``, serving it first if the bridge does not yet."""
        with self._lock:
            proof = self._proofs.get(agent)
            if proof is None:
                self._count += 1
                folder = os.path.join(self.root, f"agent-{self._count}")
                os.makedirs(os.path.join(folder, "chats"))
                key = bytes.fromhex(new_key_hex())
                self.bridge.add_agent(AgentSpec(agent.owner, agent.id, key, folder))
                proof = self._proofs[agent] = proof_line(key, agent.owner, agent.id)
            return proof

    def raw(self, line: bytes) -> list[str]:
        if b"\n" in line:
            raise ValueError("a bridge request is one line")
        reply = exchange(self.bridge.socket_path, [self._proof(_agent_of(line)), line],
                         timeout=self.bridge.limits.call_timeout * 3)
        if not reply:
            raise DriverError("the bridge closed the connection without a reply")
        return [reply.decode("utf-8")]

    def sessions(self, count: int) -> list[Transport]:
        # Every request is a connection of its own already: one object serves all racers.
        return [self] * count

    def warm(self, agent: dict[str, Any]) -> None:
        self.request({"op": "last", "agent": agent, "thread": "lnk-store-check warm"})

    def close(self) -> None:
        self.bridge.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def add_options(parser: argparse.ArgumentParser) -> None:
    """``lnk-store-check``'s option for this transport."""
    parser.add_argument(
        "--via-bridge", action="store_true",
        help="send every request through a store bridge run here over PROGRAM (lnk-store-bridge's code: proofs, "
             "limits, driver pool), each agent a check names served with a key of its own; --mode is then unused",
    )


def transports_for(args: argparse.Namespace, env: Mapping[str, str]) -> list[Transport] | None:
    """The bridge transport when ``--via-bridge`` was given, else None (the runner's own).

    The caller closes it: ``run()`` closes only the transports it built.
    """
    if not getattr(args, "via_bridge", False):
        return None
    return [BridgeTransport(Driver(args.program, dict(env)))]

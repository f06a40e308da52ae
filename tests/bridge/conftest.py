"""Bridges with real sockets and real driver processes, for the bridge's tests.

``rig`` starts a StoreBridge in this process over the fake driver
(``fake_driver.py``) or a real one, for agents in folders of their own; the
fake driver records every request it receives, so a test can show that a
refused call never reached it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import FAKE_DRIVER

from cloudstore.bridge import AgentSpec, BridgeClient, Limits, StoreBridge
from cloudstore.bridge.proof import new_key_hex


@dataclass
class Rig:
    """A running bridge, its agents, and the fake driver's record and gate."""

    bridge: StoreBridge
    agents: list[AgentSpec]
    record: Path
    gate: Path
    root: Path

    @property
    def socket_path(self) -> str:
        return self.bridge.socket_path

    def client(self, i: int = 0, **change: Any) -> BridgeClient:
        """A client of agent ``i``; ``owner=``, ``agent_id=``, ``key=`` change what it proves."""
        spec = self.agents[i]
        return BridgeClient(
            self.socket_path,
            change.get("owner", spec.owner),
            change.get("agent_id", spec.id),
            change.get("key", spec.key),
            timeout=120.0,
        )

    def records(self) -> list[dict]:
        """Every request the fake driver received, in order."""
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def open_gate(self) -> None:
        self.gate.touch()


def agent_spec(root: Path, owner: str | None, agent_id: str) -> AgentSpec:
    """An agent with a fresh key and its own folder (with chats/)."""
    folder = root / f"agent-{agent_id}-{'none' if owner is None else 'o' + owner}"
    (folder / "chats").mkdir(parents=True)
    return AgentSpec(owner=owner, id=agent_id, key=bytes.fromhex(new_key_hex()), folder=str(folder))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a Unix socket's path must fit in 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="lsb", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rig(short_dir: Path) -> Iterator[Callable[..., Rig]]:
    """``rig(agents=[(owner, id), ...], contract={...}, limits=Limits(...), driver=..., env={...})``."""
    made: list[StoreBridge] = []

    def make(
        agents: Sequence[tuple[str | None, str]] = (("o1", "a1"),),
        contract: dict | None = None,
        limits: Limits = Limits(),
        driver: Sequence[str] | str | None = None,
        env: dict[str, str] | None = None,
    ) -> Rig:
        n = len(made)
        root = short_dir / f"r{n}"
        harness = root / "h"
        harness.mkdir(parents=True)
        specs = [agent_spec(root, owner, agent_id) for owner, agent_id in agents]
        record, gate = root / "record.jsonl", root / "gate"
        driver_env = {"FAKE_RECORD": str(record), "FAKE_GATE": str(gate)}
        if contract is not None:
            driver_env["FAKE_CONTRACT"] = json.dumps(contract)
        driver_env.update(env or {})
        bridge = StoreBridge(harness, specs, driver or FAKE_DRIVER, driver_env, limits)
        bridge.start()
        made.append(bridge)
        return Rig(bridge, specs, record, gate, root)

    yield make
    for bridge in made:
        bridge.stop()

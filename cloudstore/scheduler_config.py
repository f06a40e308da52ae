"""The runner's settings: a JSON config file first, command-line flags over it.

The JSON config (``--config FILE``) is the primary interface, since only JSON
says "no owner" (null) and any owner or id exactly::

    {
      "agents": [
        {"owner": null, "id": "a"},
        {"owner": "o", "id": "b"},
        {"owner": "o", "id": "c", "bridge": "/h/.link-store.sock", "key_file": "/h/c.key"}
      ],
      "driver": "lnk-bucket-store",            // or an argv list
      "driver_env": {"LNK_BUCKET_URL": "file:///srv/store"},
      "fire": ["/usr/local/bin/fire-job"],      // argv list, or one shell command line
      "fire_timeout": 300, "lapse": 30, "mark_interval": 0.25, "max_sleep": 30,
      "workers": 4, "keep_ending": false, "runner": "host-a"
    }

An agent with ``bridge`` and ``key_file`` is reached through its store bridge
(its own socket and key); every other agent through the ONE driver process the
runner starts (``driver`` + ``driver_env``).  Flags: ``--agent OWNER:ID``
(split at the first colon; ``--agent ID`` without a colon is an agent with no
owner, ``--agent :ID`` one whose owner is ""), ``--driver``, ``--driver-env
K=V``, ``--fire 'shell command'``, and one flag per number above; flags add
agents to the config's and override its other values.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .client import env_pairs
from .scheduler_runner import WORKERS, Timing
from .scheduler_store import Agent

KEYS = {"agents", "driver", "driver_env", "fire", "fire_timeout", "lapse", "mark_interval", "max_sleep", "workers",
        "keep_ending", "runner"}
AGENT_KEYS = {"owner", "id", "bridge", "key_file"}


class ConfigError(Exception):
    """The settings are incomplete or wrong; the message says which."""


@dataclass(frozen=True)
class AgentConfig:
    """One agent bound to this runner, and its bridge if it has one."""

    agent: Agent
    bridge: Optional[str] = None
    key_file: Optional[str] = None


@dataclass
class Settings:
    agents: list[AgentConfig] = field(default_factory=list)
    driver: Optional[str | list[str]] = None
    driver_env: dict[str, str] = field(default_factory=dict)
    fire: Optional[str | list[str]] = None
    fire_timeout: float = 300.0
    timing: Timing = Timing()
    workers: int = WORKERS
    keep_ending: bool = False
    runner: str = ""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lnk-cloud-scheduler",
        description="Fire the due jobs of the agents bound to this machine, kept by a Link store driver.",
        epilog="See docs/scheduler.md for the JSON config and what is promised.",
    )
    p.add_argument("--config", help="JSON config file (the primary interface)")
    p.add_argument("--agent", action="append", default=[], metavar="OWNER:ID",
                   help="an agent bound here (repeatable); ID alone: no owner")
    p.add_argument("--driver", help="the driver program (run as '<driver> serve')")
    p.add_argument("--driver-env", action="append", default=[], metavar="K=V", help="a setting for the driver")
    p.add_argument("--fire", help="shell command run for each job (spec on stdin)")
    p.add_argument("--fire-timeout", type=float, help="seconds before a fire is killed (default 300)")
    p.add_argument("--lapse", type=float, help="claim lease lapse, seconds (default 30)")
    p.add_argument("--mark-interval", type=float, help="seconds between job_mark polls while asleep (default 0.25)")
    p.add_argument("--max-sleep", type=float, help="longest sleep, seconds (default 30)")
    p.add_argument("--workers", type=int, help=f"jobs fired at once by this runner (default {WORKERS})")
    p.add_argument("--keep-ending", action="store_true", default=None,
                   help="leave finished jobs in 'ending' for the operator instead of removing them")
    p.add_argument("--runner-id", help="this runner's name in leases and logs (default host/pid/random)")
    return p


def agent_from_flag(text: str) -> AgentConfig:
    owner, sep, agent_id = text.partition(":")
    return AgentConfig(Agent(owner, agent_id) if sep else Agent(None, text))


def agent_from_json(value: Any) -> AgentConfig:
    if not isinstance(value, dict) or set(value) - AGENT_KEYS:
        raise ConfigError(f"an agent is an object with keys {sorted(AGENT_KEYS)}: {value!r}")
    owner, agent_id = value.get("owner"), value.get("id")
    if not isinstance(agent_id, str) or not (owner is None or isinstance(owner, str)):
        raise ConfigError(f"an agent needs a string id and a string or null owner: {value!r}")
    bridge, key_file = value.get("bridge"), value.get("key_file")
    if (bridge is None) != (key_file is None):
        raise ConfigError(f"an agent with a bridge needs its key_file, and the other way round: {value!r}")
    return AgentConfig(Agent(owner, agent_id), bridge, key_file)


def load(argv: Optional[Sequence[str]] = None) -> Settings:
    """Settings from the command line (and the config file it names); ConfigError when unusable."""
    args = parser().parse_args(argv)
    raw: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{args.config}: {exc}") from exc
        if not isinstance(raw, dict) or set(raw) - KEYS:
            raise ConfigError(f"{args.config}: an object with keys among {sorted(KEYS)}")
    agents = [agent_from_json(a) for a in raw.get("agents", [])] + [agent_from_flag(a) for a in args.agent]
    driver_env = dict(raw.get("driver_env", {}))
    try:
        driver_env.update(env_pairs(args.driver_env, "--driver-env"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc

    def pick(flag: Any, key: str, default: Any) -> Any:
        return flag if flag is not None else raw.get(key, default)

    timing = Timing(
        lapse=float(pick(args.lapse, "lapse", Timing.lapse)),
        mark_interval=float(pick(args.mark_interval, "mark_interval", Timing.mark_interval)),
        max_sleep=float(pick(args.max_sleep, "max_sleep", Timing.max_sleep)),
    )
    settings = Settings(
        agents=agents,
        driver=pick(args.driver, "driver", None),
        driver_env={str(k): str(v) for k, v in driver_env.items()},
        fire=pick(args.fire, "fire", None),
        fire_timeout=float(pick(args.fire_timeout, "fire_timeout", 300.0)),
        timing=timing,
        workers=int(pick(args.workers, "workers", WORKERS)),
        keep_ending=bool(pick(args.keep_ending, "keep_ending", False)),
        runner=str(pick(args.runner_id, "runner", "")) or default_runner_id(),
    )
    check(settings)
    return settings


def default_runner_id() -> str:
    """Unique among every runner ever: two runners must never share a lease holder."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"


def check(s: Settings) -> None:
    if not s.agents:
        raise ConfigError("no agent: give --agent or \"agents\" in the config")
    if len({a.agent for a in s.agents}) != len(s.agents):
        raise ConfigError("an agent is given twice")
    if any(a.bridge is None for a in s.agents) and not s.driver:
        raise ConfigError("agents without a bridge need a driver: --driver or \"driver\"")
    if not s.fire or not isinstance(s.fire, (str, list)):
        raise ConfigError("no fire command: --fire or \"fire\" (a shell line or an argv list)")
    t = s.timing
    if min(t.lapse, t.mark_interval, t.max_sleep, s.fire_timeout) <= 0 or s.workers < 1:
        raise ConfigError("lapse, mark_interval, max_sleep and fire_timeout must be > 0, workers >= 1")

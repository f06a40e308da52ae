"""``lnk-store-bridge``: run a store bridge until SIGTERM or SIGINT.

One agent is given by flags, more by a JSON config file::

    {"agents": [{"id": "a1", "owner": "o1", "key_file": "/k/a1.key", "folder": "/agents/a1"},
                {"id": "a2", "owner": null, "key_file": "/k/a2.key", "folder": "/agents/a2"}]}

An agent's owner must be said (``--agent-owner`` or ``--no-owner``; in the
config, ``"owner"`` present, null for none), because owner null and owner
"" are different agents and guessing between them would serve the wrong one.
Logs go to stderr; the bridge writes nothing to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Optional, Sequence

from ..client import env_pairs
from .limits import Limits
from .proof import KeyFileError, read_key_file
from .server import AgentSpec, StoreBridge

log = logging.getLogger("cloudstore.bridge")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lnk-store-bridge",
        description="Answer proved store calls at HARNESS/.link-store.sock through a store driver.",
    )
    p.add_argument("--harness", required=True, help="the harness's folder; the socket is made in it")
    p.add_argument("--agent-id", help="the served agent's id")
    owner = p.add_mutually_exclusive_group()
    owner.add_argument("--agent-owner", help="the served agent's owner")
    owner.add_argument("--no-owner", action="store_true", help="the served agent has no owner (null)")
    p.add_argument("--key-file", help="the agent's key: one line of hex, mode 0600")
    p.add_argument("--agent-folder", help="the agent's folder; its chats/ is the driver's LNK_STORE_DIR")
    p.add_argument("--config", help="JSON file listing more agents: {\"agents\": [{id, owner, key_file, folder}]}")
    p.add_argument("--driver", required=True, help="the driver program (a name, path or shell-quoted command)")
    p.add_argument("--driver-env", action="append", default=[], metavar="K=V", help="a setting for the driver")
    p.add_argument("--call-timeout", type=float, default=Limits.call_timeout, metavar="S")
    p.add_argument("--request-timeout", type=float, default=Limits.request_timeout, metavar="S")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _spec(owner: Optional[str], agent_id: str, key_file: str, folder: str) -> AgentSpec:
    # Absolute: the folder becomes the driver's LNK_STORE_DIR and is judged for links on every call.
    return AgentSpec(owner=owner, id=agent_id, key=read_key_file(key_file), folder=os.path.abspath(folder))


def agents_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[AgentSpec]:
    """The agents the flags and the config file name; a usage error when none or half of one."""
    agents: list[AgentSpec] = []
    flags = (args.agent_id, args.key_file, args.agent_folder)
    if any(flags) or args.agent_owner is not None or args.no_owner:
        if not all(flags) or (args.agent_owner is None and not args.no_owner):
            parser.error("an agent by flags needs --agent-id, --agent-owner or --no-owner, --key-file and --agent-folder")
        agents.append(_spec(None if args.no_owner else args.agent_owner, args.agent_id, args.key_file, args.agent_folder))
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            config = json.load(f)
        for i, item in enumerate(config.get("agents", [])):
            missing = {"id", "owner", "key_file", "folder"} - set(item)
            if missing:
                parser.error(f"{args.config}: agent {i} lacks {', '.join(sorted(missing))}")
            owner = item["owner"]
            if owner is not None and not isinstance(owner, str):
                parser.error(f"{args.config}: agent {i}: owner must be a string or null")
            agents.append(_spec(owner, str(item["id"]), item["key_file"], item["folder"]))
    if not agents:
        parser.error("no agent to serve: give --agent-id ... or --config")
    return agents


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="lnk-store-bridge: %(levelname)s %(message)s")
    try:
        agents = agents_from(args, parser)
    except (KeyFileError, OSError, ValueError) as exc:
        log.error("%s", exc)
        return 1
    limits = Limits(call_timeout=args.call_timeout, request_timeout=args.request_timeout)
    bridge = StoreBridge(args.harness, agents, args.driver, env_pairs(args.driver_env, "--driver-env", parser.error), limits)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        bridge.start()
    except Exception as exc:
        log.error("cannot start: %s", exc)
        return 1
    try:
        while not stop.wait(3600):
            pass
    finally:
        bridge.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

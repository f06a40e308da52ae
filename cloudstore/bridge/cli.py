"""``lnk-store-bridge``: run a store bridge until SIGTERM or SIGINT.

One agent is given by flags, more by a JSON config file::

    {"agents": [{"id": "a1", "owner": "o1", "key_file": "/k/a1.key", "folder": "/agents/a1"},
                {"id": "a2", "owner": null, "key_file": "/k/a2.key", "folder": "/agents/a2"}]}

An agent's owner must be said (``--agent-owner`` or ``--no-owner``; in the
config, ``"owner"`` present, null for none), because owner null and owner
"" are different agents and guessing between them would serve the wrong one.
The config file is checked against ``CONFIG`` (``config_schema``): an object
with ``agents`` only, each agent an object with exactly these four keys, id
a non-empty string, owner a string or null, key_file and folder non-empty
strings; anything else (or an agent given twice, or an unreadable or
non-JSON file) is a usage error: the reason, naming the key path
(``agents[2].owner``), on stderr and exit 2.  A key file that can't be used,
and a driver program that is not there or may not be run, exit 2 as well:
no restart mends them (the systemd unit's ``RestartPreventExitStatus=2``).
Exit 1 is left to what may pass (the socket or the metrics port in use, a
harness folder not made yet, a driver whose contract did not come).  Logs
go to stderr; the bridge writes nothing to stdout.

``--shared-drivers`` lets one driver process serve every agent (drivers run
without ``LNK_STORE_DIR``), for a driver that keeps nothing there: the
operator's word, as the bridge cannot tell.

Metrics (``--metrics-port``, ``--metrics-file``): the bridge's calls by op and
outcome, its drivers' counters and latencies (``LNK_METRICS_DIR`` is set for
them, see ``cloudstore.runtime.metrics``), and the bridge's own ``process_*``
and ``lnk_build_info``, in the Prometheus text format.  ``--log-format json``
(or ``LNK_LOG_FORMAT=json``): one JSON object a log line, for the drivers too.

Health (issue 46): before it listens, the bridge asks its store once through
a driver (``store_check``); a store it cannot open (the driver's setting
missing or naming a folder that does not exist, a missing bucket, refused
credentials) stops it with exit 2 and one line naming the setting, as the
scheduler does; a store failing only for now is logged and retried.  The
metrics port also answers ``GET /healthz`` (the gate's loop alive) and
``GET /readyz`` (the store answered within ``FRESH_FOR`` s: a call's usable
reply, or the bridge's own check once 30 s pass without one), 200 or 503
with a JSON body saying why.  Under systemd (``NOTIFY_SOCKET``) it sends
``READY=1`` once it serves, ``WATCHDOG=1`` while the gate runs, and
``STOPPING=1`` (``runtime.sd_notify``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..gate.store_format import FORMAT, READS_FROM
from ..protocol.client import env_pairs
from ..runtime import jsonlog, sd_notify
from ..runtime.config_schema import ConfigFileError, Field, ListOf, Nullable, Number, Obj, Str, load_config
from ..runtime.health import Health
from ..runtime.metrics import STORE_FAMILIES
from ..runtime.metrics.http import Exporter, export
from ..runtime.metrics.process import ProcessMetrics
from .limits import Limits
from .proof import KeyFileError, read_key_file
from .server import STORE, AgentSpec, StoreBridge
from .store_check import FRESH_FOR, StoreWatch, first_check

log = logging.getLogger("cloudstore.bridge")


def _parser() -> argparse.ArgumentParser:
    p = jsonlog.ArgumentParser(  # a usage error once logs are JSON: one ERROR record
        prog="lnk-store-bridge",
        description="Answer proved store calls at HARNESS/.link-store.sock through a store driver. "
        "Serve one agent by the --agent-* flags, more with --config (or both). "
        "Logs go to stderr; nothing is written to stdout.",
    )
    p.add_argument(
        "--harness", required=True,
        help="the harness's folder (required); the socket HARNESS/.link-store.sock is made in it, mode 0600",
    )
    p.add_argument(
        "--agent-id",
        help="the served agent's id; needs --agent-owner or --no-owner, --key-file and --agent-folder",
    )
    owner = p.add_mutually_exclusive_group()
    owner.add_argument(
        "--agent-owner", help='the served agent\'s owner (a string; "" is an owner, unlike --no-owner)',
    )
    owner.add_argument(
        "--no-owner", action="store_true",
        help='the served agent has no owner (owner null, another agent than owner "")',
    )
    p.add_argument(
        "--key-file",
        help="the agent's key: a regular file of one line of hex (at least 32 bytes decoded), "
        "mode 0600, owned by the bridge's user or root",
    )
    p.add_argument("--agent-folder", help="the agent's folder; its chats/ is the driver's LNK_STORE_DIR")
    p.add_argument(
        "--config",
        help='a JSON file of more agents: {"agents": [{"id": ..., "owner": ... or null, "key_file": ..., '
        '"folder": ...}]}, each key required',
    )
    p.add_argument(
        "--driver", required=True,
        help="the driver program (required): a name on PATH, a path, or a shell-quoted command line",
    )
    p.add_argument(
        "--driver-env", action="append", default=[], metavar="K=V",
        help="a setting for the driver, e.g. LNK_BUCKET_URL=s3://bucket/prefix (repeat for more; default: none)",
    )
    p.add_argument(
        "--call-timeout", type=float, default=Limits.call_timeout, metavar="S",
        help="seconds one driver call may take, also the longest wait for a free driver; past it the caller "
        "is answered timeout: and the driver is stopped and replaced (default: %(default)g; over 0, at most 86400)",
    )
    p.add_argument(
        "--request-timeout", type=float, default=Limits.request_timeout, metavar="S",
        help="seconds a caller has to send its proof line after connecting, and again its request line "
        "after the proof (default: %(default)g; over 0, at most 86400)",
    )
    p.add_argument(
        "--shared-drivers", action="store_true",
        help="let one driver process serve every agent's calls, for a driver that keeps nothing in "
        "LNK_STORE_DIR (lnk-gcs and lnk-bucket-store keep nothing on the machine): drivers then run without "
        "LNK_STORE_DIR, and with more agents than drivers a call reuses a running driver instead of starting "
        "one; the 4 driver places are still shared fairly by agent (default: off, each driver process is "
        "started with one agent's folder/chats/ as LNK_STORE_DIR and serves that agent only)",
    )
    p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="the least level logged on stderr (default: %(default)s)",
    )
    p.add_argument(
        "--log-format", choices=["text", "json"], default=None,
        help="text lines, or one JSON object a line (time, level, logger, program, message, fields), "
        "for the bridge and its drivers (default: LNK_LOG_FORMAT, else text)",
    )
    p.add_argument(
        "--metrics-port", metavar="[HOST:]PORT",
        help="serve counters (calls by op and outcome; the drivers' bucket requests, retries, outcome-unknown "
        "errors, lost compare-and-set rounds, replies, and the time of each request and op; the bridge's "
        "process_* and build) at http://HOST:PORT/metrics in the Prometheus text "
        "format (HOST default 127.0.0.1; PORT 0: any free port, logged), and the probes GET /healthz (alive) "
        "and GET /readyz (the store answered lately): 200 or 503 with a JSON reason",
    )
    p.add_argument(
        "--metrics-file", metavar="PATH",
        help="write the same text to PATH, replaced atomically every 5 s and at exit",
    )
    return p


AGENT = Obj({
    "id": Field(Str(), required=True),
    "owner": Field(Nullable(Str(empty=True)), required=True),  # null: no owner; "" is an owner
    "key_file": Field(Str(forbid="\0"), required=True),
    "folder": Field(Str(forbid="\0"), required=True),
})
CONFIG = Obj({"agents": Field(ListOf(AGENT), required=True)})
# A flag's seconds: finite (argparse takes "nan" and "inf" as floats) and at most a day.
SECONDS = Number(0, 86400.0)


def _spec(owner: str | None, agent_id: str, key_file: str, folder: str) -> AgentSpec:
    # Absolute: the folder becomes the driver's LNK_STORE_DIR and is judged for links on every call.
    return AgentSpec(owner=owner, id=agent_id, key=read_key_file(key_file), folder=os.path.abspath(folder))


def config_agents(path: str) -> list[dict[str, Any]]:
    """The agents of config file ``path``, checked; ConfigFileError naming the file and key path."""
    agents: list[dict[str, Any]] = load_config(path, CONFIG)["agents"]
    seen: dict[tuple[str | None, str], int] = {}
    for i, item in enumerate(agents):
        who = (item["owner"], item["id"])
        if who in seen:
            raise ConfigFileError(f"{path}: agents[{i}]: the same agent as agents[{seen[who]}]")
        seen[who] = i
    return agents


def agents_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[AgentSpec]:
    """The agents the flags and the config file name; a usage error when none, half of one, or a bad config.

    Every agent is checked before any key file is read, so a usage error is
    reported as one (exit 2) whatever else is wrong.
    """
    given: list[tuple[str | None, str, str, str]] = []  # owner, id, key_file, folder
    flags = (args.agent_id, args.key_file, args.agent_folder)
    if any(flags) or args.agent_owner is not None or args.no_owner:
        if not all(flags) or (args.agent_owner is None and not args.no_owner):
            parser.error(
                "an agent by flags needs --agent-id, --agent-owner or --no-owner, --key-file and --agent-folder"
            )
        given.append((None if args.no_owner else args.agent_owner, args.agent_id, args.key_file, args.agent_folder))
    if args.config:
        try:
            items = config_agents(args.config)
        except ConfigFileError as exc:
            parser.error(str(exc))
        given += [(item["owner"], item["id"], item["key_file"], item["folder"]) for item in items]
    if not given:
        parser.error("no agent to serve: give --agent-id ... or --config")
    if len({(owner, agent_id) for owner, agent_id, _, _ in given}) != len(given):
        parser.error("an agent is given twice (by the flags and the config)")
    return [_spec(*agent) for agent in given]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for flag, value in (("--call-timeout", args.call_timeout), ("--request-timeout", args.request_timeout)):
        try:
            SECONDS.check(value, flag)
        except ValueError as exc:
            parser.error(str(exc))
    as_json = jsonlog.wants_json(args.log_format)
    jsonlog.configure("lnk-store-bridge", args.log_level, "lnk-store-bridge: %(levelname)s %(message)s", as_json)
    notifier = sd_notify.Notifier.from_env()  # read (and unset) before any driver inherits the environment
    try:
        exporter = export(args.metrics_port, args.metrics_file, own=("lnk_bridge_", STORE_FAMILIES),
                          process=ProcessMetrics("lnk-store-bridge", FORMAT, READS_FROM))
    except ValueError as exc:
        parser.error(f"--metrics-port {exc}")
    health = Health("lnk-store-bridge", fresh_for=FRESH_FOR)
    health.expect(STORE)
    if exporter is not None:
        exporter.health = health  # /healthz and /readyz beside /metrics
    try:
        agents = agents_from(args, parser)
    except (KeyFileError, OSError, ValueError) as exc:  # a key file or the config: no restart mends it
        log.error("%s", exc)
        return _stopped(exporter, 2)
    # The exporter's connections are counted in the descriptors the bridge keeps free for itself.
    limits = Limits(call_timeout=args.call_timeout, request_timeout=args.request_timeout,
                    reserved_fds=exporter.descriptors if exporter is not None else 0,
                    shared_drivers=args.shared_drivers)
    driver_env = env_pairs(args.driver_env, "--driver-env", parser.error)
    if as_json:
        driver_env.setdefault(jsonlog.FORMAT_SETTING, "json")  # one stream of JSON lines: the drivers' stderr is ours
    if exporter is not None:
        driver_env.update(exporter.driver_env)
    unset = missing_driver_setting(args.driver, driver_env)
    if unset is not None:
        log.warning("the driver %s has no %s (in --driver-env or the environment): every call will answer "
                    "an error naming it", args.driver, unset)
    if args.shared_drivers and not our_driver(args.driver):
        log.warning("--shared-drivers with %s, not a driver of this project: every agent's calls share its "
                    "processes, which run without LNK_STORE_DIR; give it only if the driver keeps nothing there",
                    args.driver)
    problem = harness_problem(args.harness)
    if problem is not None:
        log.error("cannot start: %s", problem)
        return _stopped(exporter, 1)
    bridge = StoreBridge(args.harness, agents, args.driver, driver_env, limits)
    bridge.health = health
    health.alive_by(bridge.gate_problem)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if exporter is not None:
            exporter.start()
    except OSError as exc:  # the metrics port in use: the error names it, not the bridge's socket
        log.error("cannot start: %s", exc.strerror or exc)
        return _stopped(exporter, 1)
    failed = start_bridge(bridge, health)
    if failed is not None:
        code, why = failed
        log.error("cannot start: %s", why)
        bridge.stop()
        return _stopped(exporter, code)
    watch = StoreWatch(bridge, health).start()
    watchdog = sd_notify.announce_ready(notifier, lambda: health.live()[0],
                                        f"serving {len(agents)} agent(s) at {bridge.socket_path}")
    try:
        while not stop.wait(3600):
            pass
    finally:
        health.stopping()
        sd_notify.announce_stopping(notifier, watchdog)
        watch.stop()
        bridge.stop()
        _stopped(exporter, 0)
    return 0


#: The setting each of this project's drivers cannot work without (``driver.py``).
DRIVER_SETTINGS = {"lnk-bucket-store": "LNK_BUCKET_URL", "lnk-gcs": "LNK_GCS_URL"}


def our_driver(driver: str) -> bool:
    """Whether ``driver`` names one of this project's drivers, which keep nothing in LNK_STORE_DIR."""
    words = driver.split()
    return bool(words) and os.path.basename(words[0]) in DRIVER_SETTINGS


def missing_driver_setting(driver: str, driver_env: dict[str, str]) -> str | None:
    """The setting one of our drivers needs and will not get (``--driver-env`` or the environment), if any."""
    words = driver.split()
    setting = DRIVER_SETTINGS.get(os.path.basename(words[0])) if words else None
    if setting is None or driver_env.get(setting) or os.environ.get(setting):
        return None
    return setting


def harness_problem(harness: str) -> str | None:
    """Why the ``--harness`` folder cannot hold the socket, naming it; None when it can be tried.

    Checked before anything starts: the socket's bind would say only
    ``[Errno 2] No such file or directory``, naming no path.
    """
    try:
        info = os.stat(harness)
    except FileNotFoundError:
        return f"the harness folder {harness!r} (--harness) does not exist: make it, or give the right one"
    except OSError as exc:
        return f"the harness folder {harness!r} (--harness): {exc.strerror or exc}"
    if not stat.S_ISDIR(info.st_mode):
        return f"the harness folder {harness!r} (--harness) is not a folder"
    return None


def start_bridge(bridge: StoreBridge, health: Health) -> tuple[int, str] | None:
    """Read the driver's contract, ask the store once, then listen: None when serving, else (exit code, why).

    The store is asked before the socket is made, so a store the bridge
    cannot open (a setting, a missing bucket: exit 2, as the scheduler
    does) is refused before any caller can reach it.
    """
    try:
        bridge.open_drivers()
    except Exception as exc:
        # A driver program that is not there, or may not be run, is --driver's mistake: exit 2, no restart.
        missing = isinstance(exc.__cause__, (FileNotFoundError, PermissionError))
        return 2 if missing else 1, start_error(exc, bridge.socket_path)
    refused = first_check(bridge, health)
    if refused is not None:
        return 2, f"{refused.problem}; {refused.fix}"
    try:
        bridge.start()
    except Exception as exc:
        return 1, start_error(exc, bridge.socket_path)
    return None


def start_error(exc: BaseException, socket_path: str) -> str:
    """``exc`` as the operator needs it: an OSError that names no file gets the socket's path."""
    if isinstance(exc, OSError) and exc.filename is None and exc.strerror:
        return f"{exc.strerror} (errno {exc.errno}) at the socket {socket_path!r} (--harness)"
    return str(exc)


def _stopped(exporter: Exporter | None, code: int) -> int:
    """Stop the metrics export (the file written a last time, after the drivers ended); ``code``."""
    if exporter is not None:
        exporter.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())

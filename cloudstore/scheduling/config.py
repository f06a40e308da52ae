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
      "fire_env": {"JOB_API": "https://jobs.internal"},
      "fire_pass_env": ["HTTPS_PROXY"],
      "fire_timeout": 300, "lapse": 30, "poll_interval": 2, "max_sleep": 30,
      "workers": 4, "keep_ending": false, "runner": "host-a",
      "metrics_port": 9465, "metrics_file": "/var/lib/lnk/scheduler.prom"
    }

An agent with ``bridge`` and ``key_file`` is reached through its store bridge
(its own socket and key); every other agent through the ONE driver process the
runner starts (``driver`` + ``driver_env``).  The fire command gets a minimal
environment (``fire.BASE_ENV``), the runner's variables named in
``fire_pass_env``, and ``fire_env``: never the driver's credentials.  Flags:
``--agent OWNER:ID`` (split at the first colon; ``--agent ID`` without a
colon is an agent with no owner, ``--agent :ID`` one whose owner is ""),
``--store-bridge SOCKET`` with ``--key-file FILE`` (the ``--agent`` agents
through that bridge: one key file for all, or one per ``--agent`` in order,
held to the config's both-or-neither rule), ``--driver``, ``--driver-env K=V``, ``--fire 'shell command'``,
``--fire-env K=V``, ``--fire-pass-env NAME``, and one flag per number above;
flags add agents (and environment entries) to the config's and override its
other values.

The file is checked against ``SCHEMA`` (``config_schema``): strictly typed,
unknown keys refused, the reason naming the key path.  A flag's value is
checked by the same rule, named by the flag.

``metrics_port`` (a port, or ``"HOST:PORT"``; HOST defaults to 127.0.0.1)
and ``metrics_file`` export the runner's counters (one per event of its log,
``lnk_scheduler_events_total``) and its own drivers' (``cloudstore.runtime.metrics``)
in the Prometheus text format.

``log_file`` sends the runner's own log lines to that file instead of stderr,
rotated by size: at most ``log_max_bytes`` a file (64 MiB by default, from
4 KiB), ``log_backups`` old files kept (4 by default, 1 to 1,000), so the
files hold at most ``(log_backups + 1) x log_max_bytes`` (``log.RotatingFile``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CloudstoreError
from ..protocol.client import env_pairs
from ..runtime import jsonlog
from ..runtime.config_schema import (
    Bool,
    ConfigFileError,
    Either,
    Field,
    Int,
    ListOf,
    MapOf,
    Nullable,
    Number,
    Obj,
    Spec,
    Str,
    load_config,
)
from .fire import JOB_VARS, base_environment, program_problem
from .runner import WORKERS, Timing
from .store_client import Agent

# Upper bounds: far above any sensible setting, low enough that a huge value
# (1e300) is refused at start-up rather than overflowing a thread's wait
# later.  poll_interval has a floor: below 10 ms a sleeping runner would
# hammer its store.  Each worker is a thread.
DAY = 86400.0
WORKERS_MAX = 1024
#: A log file's size: at least a few lines, at most a TiB; and the old files kept.
LOG_MAX_BYTES = 64 * 1024 * 1024
LOG_BYTES_RANGE = (4096, 2**40)
LOG_BACKUPS = 4
LOG_BACKUPS_MAX = 1000


def _not_job_var(name: str) -> str | None:
    return f"is set by the runner for each job ({', '.join(sorted(JOB_VARS))})" if name in JOB_VARS else None


def _command_line(line: str) -> str | None:
    """A driver given as one string is split like a shell would (``client.program_argv``)."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        return f"is not a command line ({exc})"
    return None if words else "names no program"


def _blank_shell_line(line: str) -> str | None:
    return None if line.strip() else "is a blank shell line"


def _listen(text: str) -> str | None:
    from ..runtime.metrics.http import parse_listen

    try:
        parse_listen(text)
    except ValueError as exc:
        return str(exc)
    return None


def _argv_program(argv: list[str]) -> str | None:
    return "must start with the program, not an empty string" if argv[0] == "" else None


ENV_NAME = Str(forbid="=\0")
FIRE_ENV_NAME = Str(forbid="=\0", extra=_not_job_var)
ENV_VALUE = Str(empty=True, forbid="\0")
FILE_PATH = Str(forbid="\0")
ARGV = ListOf(Str(empty=True, forbid="\0"), min_items=1, extra=_argv_program)
DRIVER = Either((Str(forbid="\0", extra=_command_line), ARGV))
FIRE = Either((Str(forbid="\0", extra=_blank_shell_line), ARGV))


def _bridge_pair(agent: dict[str, Any]) -> str | None:
    if (agent.get("bridge") is None) != (agent.get("key_file") is None):
        return "an agent with a bridge needs its key_file, and the other way round"
    return None


AGENT = Obj(
    {
        "owner": Field(Nullable(Str(empty=True))),  # absent: null, no owner
        "id": Field(Str(), required=True),
        "bridge": Field(Nullable(FILE_PATH)),  # absent or null: through the driver
        "key_file": Field(Nullable(FILE_PATH)),
    },
    extra=_bridge_pair,
)

SCHEMA = Obj(
    {
        "agents": Field(ListOf(AGENT)),
        "driver": Field(DRIVER),
        "driver_env": Field(MapOf(ENV_NAME, ENV_VALUE)),
        "fire": Field(FIRE),
        "fire_env": Field(MapOf(FIRE_ENV_NAME, ENV_VALUE)),
        "fire_pass_env": Field(ListOf(FIRE_ENV_NAME)),
        "fire_timeout": Field(Number(0, 7 * DAY)),
        "lapse": Field(Number(0, DAY)),
        "poll_interval": Field(Number(0.01, 3600, low_included=True)),
        "mark_interval": Field(Number(0.01, 3600, low_included=True)),  # the old name of poll_interval
        "max_sleep": Field(Number(0, DAY)),
        "workers": Field(Int(1, WORKERS_MAX)),
        "keep_ending": Field(Bool()),
        "runner": Field(Str(forbid="\0")),
        "metrics_port": Field(Either((Str(extra=_listen), Int(0, 65535)))),
        "metrics_file": Field(FILE_PATH),
        "log_file": Field(FILE_PATH),
        "log_max_bytes": Field(Int(*LOG_BYTES_RANGE)),
        "log_backups": Field(Int(1, LOG_BACKUPS_MAX)),
    }
)


class ConfigError(CloudstoreError):
    """The runner's settings are incomplete or wrong; the message says which."""


@dataclass(frozen=True)
class AgentConfig:
    """One agent bound to this runner, and its bridge if it has one."""

    agent: Agent
    bridge: str | None = None
    key_file: str | None = None


@dataclass
class Settings:
    agents: list[AgentConfig] = field(default_factory=list)
    driver: str | list[str] | None = None
    driver_env: dict[str, str] = field(default_factory=dict)
    fire: str | list[str] | None = None
    fire_env: dict[str, str] = field(default_factory=dict)
    fire_pass_env: list[str] = field(default_factory=list)
    fire_timeout: float = 300.0
    timing: Timing = Timing()
    workers: int = WORKERS
    keep_ending: bool = False
    runner: str = ""
    metrics_port: str | int | None = None  # PORT or "HOST:PORT": serve GET /metrics
    metrics_file: str | None = None  # rewrite the metrics text there every few seconds
    log_file: str | None = None  # the runner's log there, rotated by size, instead of stderr
    log_max_bytes: int = LOG_MAX_BYTES
    log_backups: int = LOG_BACKUPS


EPILOG = """\
config file (--config): one JSON object, read strictly (an unknown or repeated
key, a wrong type or an out-of-range number stops the runner at start-up):
  {"agents": [{"owner": null, "id": "a"},
              {"owner": "o", "id": "c", "bridge": "/h/.link-store.sock", "key_file": "/h/c.key"}],
   "driver": "lnk-bucket-store", "driver_env": {"LNK_BUCKET_URL": "s3://bucket/prefix"},
   "fire": ["/usr/local/bin/fire-job"], "fire_env": {}, "fire_pass_env": [],
   "fire_timeout": 300, "lapse": 30, "poll_interval": 2, "max_sleep": 30,
   "workers": 4, "keep_ending": false, "runner": "host-a",
   "metrics_port": 9465, "metrics_file": "/var/lib/lnk/scheduler.prom",
   "log_file": "/var/log/lnk/scheduler.log", "log_max_bytes": 67108864, "log_backups": 4}
Flags add agents and environment entries to the file's and override the rest.
An agent with "bridge" and "key_file" is reached through its store bridge
(on the command line: --store-bridge SOCKET --key-file FILE for the --agent
agents, one key file for all or one per --agent in order);
every other through this runner's own driver processes (run as
'<driver> serve' with LNK_SCHEDULER_OPS=1).

the fire command gets the job's spec (JSON) on stdin and LNK_AGENT_ID,
LNK_JOB_ID, LNK_JOB_DUE, LNK_OWNER (when the agent has one),
LNK_JOB_RECOVERED=1 when a dead runner's job is fired again and
LNK_JOB_FENCE, a number larger for each later fire of the job; a minimal
environment otherwise (fire_env, and fire_pass_env taken from ours).

promised: a due job is fired once when no runner dies, at least once when
one does (after its lease lapses), never by two runners at the same time
while no runner pauses for lapse/3 or more (keep lapse at 30 or more; a
fired system can refuse a superseded fire by LNK_JOB_FENCE).
Idle, a runner sends about one store request a poll_interval whatever the
number of agents; a job put on this machine wakes it at once (LNK_WAKE_DIR).
Logs: one JSON object a line on stderr (its own drivers' too, unless driver_env
sets LNK_LOG_FORMAT); nothing on stdout. A fired job writes one line of about
240 bytes plus its ids. log_file: the runner's own lines in that file instead,
rotated by size (log_max_bytes a file, 64 MiB; log_backups old files, 4); the
fire commands' output and the drivers' lines stay on stderr. Metrics (metrics_port, metrics_file):
lnk_scheduler_events_total{event}, lnk_scheduler_requests_total{op}, the gauge
lnk_scheduler_store_unreachable{agent,owner} (1 while an agent's store does not
answer; retried with backoff), the drivers' lnk_store_* counters and latency
histograms, and the runner's process_* and lnk_build_info, in the
Prometheus text format. SIGTERM/SIGINT:
stop claiming, finish the fires under way (a second signal kills).
exit status: 0 after a signal, 2 for a bad setting.
"""


def parser() -> argparse.ArgumentParser:
    p = jsonlog.ArgumentParser(  # its log is JSON from the start: a usage error is one ERROR record
        prog="lnk-cloud-scheduler",
        description="Fire the due jobs of the agents bound to this machine, kept by a Link store driver.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="JSON config file (the primary interface)")
    p.add_argument("--agent", action="append", default=[], metavar="OWNER:ID",
                   help="an agent bound here (repeatable); ID alone: no owner")
    p.add_argument("--store-bridge", metavar="SOCKET",
                   help="reach the --agent agents through this store bridge (HARNESS/.link-store.sock) instead "
                        "of a driver; needs --key-file")
    p.add_argument("--key-file", action="append", default=[], metavar="FILE",
                   help="with --store-bridge: the agent's key file (mode 0600); one for all the --agent agents, "
                        "or one per --agent, in the same order")
    p.add_argument("--driver", help="the driver program (run as '<driver> serve')")
    p.add_argument("--driver-env", action="append", default=[], metavar="K=V", help="a setting for the driver")
    p.add_argument("--fire", help="shell command run for each job (spec on stdin)")
    p.add_argument("--fire-env", action="append", default=[], metavar="K=V",
                   help="a variable set for the fire command (repeatable)")
    p.add_argument("--fire-pass-env", action="append", default=[], metavar="NAME",
                   help="a variable of this environment passed to the fire command (repeatable)")
    p.add_argument("--fire-timeout", type=float, help="seconds before a fire is killed (default 300)")
    p.add_argument("--lapse", type=float, help="claim lease lapse, seconds (default 30, the least recommended)")
    p.add_argument("--poll-interval", type=float,
                   help="seconds between polls of the store's due index while idle: one request each, whatever "
                        "the number of agents (default 2; 0.01 to 3600)")
    p.add_argument("--mark-interval", type=float, help="the old name of --poll-interval")
    p.add_argument("--max-sleep", type=float, help="longest sleep between polls, seconds (default 30)")
    p.add_argument("--workers", type=int, help=f"jobs fired at once by this runner (default {WORKERS})")
    p.add_argument("--keep-ending", action="store_true", default=None,
                   help="leave finished jobs in 'ending' for the operator instead of removing them")
    p.add_argument("--runner-id", help="this runner's name in leases and logs (default host/pid/random)")
    p.add_argument("--metrics-port", metavar="[HOST:]PORT",
                   help="serve counters at http://HOST:PORT/metrics, Prometheus text format (HOST default "
                        "127.0.0.1; PORT 0: any free port, logged in a 'metrics' event), and the probes "
                        "GET /healthz (the loop alive) and GET /readyz (the store answered lately): 200 or 503")
    p.add_argument("--metrics-file", metavar="PATH",
                   help="write the same text to PATH, replaced atomically every 5 s and at exit")
    p.add_argument("--log-file", metavar="PATH",
                   help="write the runner's own log lines to PATH instead of stderr, rotated by size")
    p.add_argument("--log-max-bytes", type=int, metavar="N",
                   help=f"with --log-file: rotate before a line would take the file past N bytes "
                        f"(default {LOG_MAX_BYTES}; {LOG_BYTES_RANGE[0]} to {LOG_BYTES_RANGE[1]})")
    p.add_argument("--log-backups", type=int, metavar="N",
                   help=f"with --log-file: old files kept, PATH.1 the newest (default {LOG_BACKUPS}; "
                        f"1 to {LOG_BACKUPS_MAX})")
    return p


def agent_from_flag(text: str) -> AgentConfig:
    owner, sep, agent_id = text.partition(":")
    Str().check(agent_id if sep else text, "--agent (its id)")
    return AgentConfig(Agent(owner=owner, id=agent_id) if sep else Agent(owner=None, id=text))


def agent_from_json(value: dict[str, Any]) -> AgentConfig:
    """An agent of the config, already checked against ``AGENT``."""
    return AgentConfig(Agent(owner=value.get("owner"), id=value["id"]), value.get("bridge"), value.get("key_file"))


def bridged(agents: list[AgentConfig], bridge: str | None, key_files: Sequence[str]) -> list[AgentConfig]:
    """The ``--agent`` agents, through ``--store-bridge`` with their ``--key-file`` when given.

    The config's rule, by flag: a bridge needs its key file and the other way
    round (``_bridge_pair``), each a path as ``FILE_PATH`` checks it.  One key
    file serves every agent; several are paired with the agents in order.
    """
    if bridge is None and not key_files:
        return agents
    if bridge is None:
        raise ConfigError("--key-file needs --store-bridge: an agent with a key_file needs its bridge, "
                          "and the other way round")
    if not key_files:
        raise ConfigError("--store-bridge needs --key-file: an agent with a bridge needs its key_file, "
                          "and the other way round")
    FILE_PATH.check(bridge, "--store-bridge")
    for path in key_files:
        FILE_PATH.check(path, "--key-file")
    if not agents:
        raise ConfigError("--store-bridge applies to the --agent agents: give at least one --agent")
    if len(key_files) not in (1, len(agents)):
        raise ConfigError(f"--key-file given {len(key_files)} times for {len(agents)} --agent agents: "
                          "give one for all of them, or one per --agent in the same order")
    files = list(key_files) * len(agents) if len(key_files) == 1 else list(key_files)
    return [AgentConfig(a.agent, bridge, key) for a, key in zip(agents, files, strict=True)]


def _flag(spec: Spec, value: Any, flag: str) -> Any:
    """A flag's value checked by the rule its config key has (None: not given)."""
    return None if value is None else spec.check(value, flag)


def _flag_env(pairs: Sequence[str], flag: str, name: Spec) -> dict[str, str]:
    env = env_pairs(pairs, flag)
    for k, v in env.items():
        name.check(k, f"{flag} {k}")
        ENV_VALUE.check(v, f"{flag} {k}")
    return env


def load(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the command line (and the config file it names); ConfigError when unusable."""
    args = parser().parse_args(argv)
    try:
        return _load(args)
    except (ConfigFileError, ValueError) as exc:  # SchemaError, a bad K=V
        raise ConfigError(str(exc)) from None


def _load(args: argparse.Namespace) -> Settings:
    raw: dict[str, Any] = load_config(args.config, SCHEMA) if args.config else {}
    fields = SCHEMA.fields
    agents = [agent_from_json(a) for a in raw.get("agents", [])] + bridged(
        [agent_from_flag(a) for a in args.agent], args.store_bridge, args.key_file)
    driver_env = {**raw.get("driver_env", {}), **_flag_env(args.driver_env, "--driver-env", ENV_NAME)}
    fire_env = {**raw.get("fire_env", {}), **_flag_env(args.fire_env, "--fire-env", FIRE_ENV_NAME)}
    pass_env = raw.get("fire_pass_env", []) + [FIRE_ENV_NAME.check(n, "--fire-pass-env") for n in args.fire_pass_env]

    def pick(flag: str, key: str, default: Any) -> Any:
        given = _flag(fields[key].spec, getattr(args, flag.lstrip("-").replace("-", "_")), flag)
        return given if given is not None else raw.get(key, default)

    alone = [f"{key} ({flag})" for key, flag in (("log_max_bytes", "--log-max-bytes"), ("log_backups", "--log-backups"))
             if key in raw or getattr(args, key) is not None]
    if alone and pick("--log-file", "log_file", None) is None:
        raise ConfigError(f"{' and '.join(alone)} shape the log file: give log_file (--log-file) too, "
                          "or leave them out (the log is on stderr)")
    timing = Timing(
        lapse=pick("--lapse", "lapse", Timing.lapse),
        poll_interval=pick("--poll-interval", "poll_interval",
                           pick("--mark-interval", "mark_interval", Timing.poll_interval)),
        max_sleep=pick("--max-sleep", "max_sleep", Timing.max_sleep),
    )
    settings = Settings(
        agents=agents,
        driver=pick("--driver", "driver", None),
        driver_env=driver_env,
        fire=pick("--fire", "fire", None),
        fire_env=fire_env,
        fire_pass_env=list(dict.fromkeys(pass_env)),
        fire_timeout=pick("--fire-timeout", "fire_timeout", 300.0),
        timing=timing,
        workers=pick("--workers", "workers", WORKERS),
        keep_ending=pick("--keep-ending", "keep_ending", False),
        runner=pick("--runner-id", "runner", None) or default_runner_id(),
        metrics_port=pick("--metrics-port", "metrics_port", None),
        metrics_file=pick("--metrics-file", "metrics_file", None),
        log_file=pick("--log-file", "log_file", None),
        log_max_bytes=pick("--log-max-bytes", "log_max_bytes", LOG_MAX_BYTES),
        log_backups=pick("--log-backups", "log_backups", LOG_BACKUPS),
    )
    check(settings)
    return settings


def default_runner_id() -> str:
    """Unique among every runner ever: two runners must never share a lease holder."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"


def check(s: Settings) -> None:
    """What no single value shows: agents given, none twice, a driver when needed, a fire program that exists."""
    if not s.agents:
        raise ConfigError("no agent: give --agent or \"agents\" in the config")
    seen: set[Agent] = set()
    for a in s.agents:
        if a.agent in seen:
            raise ConfigError(f"the agent {a.agent.label()!r} (owner {a.agent.owner!r}) is given twice")
        seen.add(a.agent)
    if any(a.bridge is None for a in s.agents) and not s.driver:
        raise ConfigError("agents without a bridge need a driver: --driver or \"driver\"")
    if not s.fire:
        raise ConfigError("no fire command: --fire or \"fire\" (a shell line or an argv list)")
    env = base_environment(os.environ, s.fire_pass_env, s.fire_env)
    problem = program_problem(s.fire, env.get("PATH", os.defpath))
    if problem is not None:
        raise ConfigError(f"fire: {problem}")

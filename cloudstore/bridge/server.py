"""The store bridge: proved calls from a Unix socket to a driver program.

One connection is one call (docs/protocol.md, "Through the store bridge"): a proof
line, then within ``request_timeout`` one request line, answered with one
reply line.

Nothing reaches a driver until the caller has proved it is one of the agents
this bridge serves, the request names that same agent, and the request
passes every check of ``rules``. The bridge's own answers are error replies
whose first word says which: ``refused``, ``busy``, ``timeout``, ``driver``.

What a caller can cost, proved or not (so that no one without a key can deny
service, and no one with one can take the bridge's memory):

* Before its proof, a connection is held by the gate (``gate.Gate``): one
  thread for all of them, a buffer of at most the proof line's bound (4 KiB,
  or what the longest served agent's name needs escaped) and a deadline of
  ``request_timeout``. At most ``max_pending`` are held (fewer if the fd limit
  is low); one more evicts the oldest, so a flood churns itself while a
  prompt caller is read at once.
* A proved call holds a slot (``max_calls``, ``max_calls_per_agent``) and runs
  on a pool of at most ``max_calls`` threads (``workers.WorkerPool``).
* Its request line is held against a byte budget (``request_budget_bytes``,
  160 MiB): twice the bytes buffered while it is read, then what parsing it
  may cost (``cost.parse_cost``, an upper bound measured on the worst JSON),
  then the line and its copy while a driver answers. Over the budget the
  call is answered ``busy``; a line that alone would cost more is refused.

So the bridge's memory is bounded whatever callers send: about the
interpreter's own (~30 MiB), plus the budget, plus ``max_pending`` times a
few KiB, plus what drivers answer (reply lines are the drivers', and are not
bounded here): under 256 MiB with the default limits and replies of a few MiB
(measured: 151 MiB peak with six agents sending 16 MiB lines at once). That
holds with glibc's mmap threshold pinned (``memory``), done at ``start``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..protocol.client import dumps
from ..protocol.validate import Agent, shown
from ..runtime import metrics
from ..runtime.health import Health
from ..settings import OP_SECONDS
from . import rules
from .cost import call_cost, parse_cost
from .drivers import (
    Contract,
    DriverFailed,
    DriverPool,
    DriverTimeout,
    NoDriverFree,
    ReplyOverLimit,
    read_contract,
)
from .gate import Gate
from .limits import Busy, ByteBudget, CallSlots, Hold, Limits, MiB
from .lines import LineClosed, LineOverBudget, LineReader, LineTimeout, LineTooLong, finish, send_line
from .listener import fd_room, listen_private, remove_if_ours
from .memory import pin_mmap_threshold
from .proof import PROOF_RE, proof_line_bound, proof_matches
from .ratelog import RateLog
from .rules import Refused
from .workers import PoolBusy, WorkerPool

log = logging.getLogger("cloudstore.bridge")

SOCKET_NAME = ".link-store.sock"
LISTEN_BACKLOG = 1024  # a flood fills the backlog between the gate's turns; a caller's connect should not wait on it
_UNKNOWN_KEY = os.urandom(32)  # proofs for agents not served are still checked, at the same cost

#: Every call's end, by op (a name the driver's contract keeps; "" before the request is checked) and
#: outcome: answered (the driver's reply passed on, an error reply included), refused, busy, timeout,
#: driver (it died or answered no reply line), no_request (proved, then sent no request line in time).
CALLS = metrics.counter(
    "lnk_bridge_calls_total",
    "Calls the store bridge ended, by op (\"\" before the request was checked) and outcome.",
    ("op", "outcome"),
)
#: The time of each call a driver was asked to answer (every outcome but those refused or busy before it).
CALL_SECONDS = metrics.histogram(
    "lnk_bridge_call_duration_seconds",
    "Seconds each call handed to a driver took, from handed (the wait for a free driver included) to its reply "
    "or failure, by op: what the caller waits beyond its proof and request, one observation per call "
    "lnk_bridge_calls_total counts with an op (not \"\", refused before the check).",
    ("op",),
    # The drivers' bounds, then a call's default limit (call_timeout, 30 s) and that plus the wait for a
    # free driver (as long again): a call the bridge stopped is counted in a bucket of its own, not in +Inf.
    (*metrics.LATENCY_BUCKETS, 30.0, 60.0),
)


@dataclass(frozen=True)
class AgentSpec:
    """One agent this bridge serves: who it is, its key, and its folder."""

    owner: str | None
    id: str
    key: bytes = field(repr=False)  # never in a log line
    folder: str = ""

    @property
    def agent(self) -> Agent:
        return Agent(id=self.id, owner=self.owner)

    @property
    def store_dir(self) -> str:
        """``LNK_STORE_DIR``: the agent's chats/, so what a driver keeps moves with the agent
        (not set with shared drivers, ``Limits.shared_drivers``)."""
        return os.path.join(self.folder, "chats")


class StoreBridge:
    """Serves the given agents at ``<harness_dir>/.link-store.sock`` until stopped."""

    def __init__(
        self,
        harness_dir: str | os.PathLike[str],
        agents: Iterable[AgentSpec],
        driver: str | Sequence[str],
        driver_env: Mapping[str, str] | None = None,
        limits: Limits = Limits(),
        contract: Contract | None = None,
    ) -> None:
        self.socket_path = os.path.join(os.fspath(harness_dir), SOCKET_NAME)
        self.limits = limits
        self.proof_bound = limits.max_proof_bytes  # raised by add_agent for long names
        self.agents: dict[Agent, AgentSpec] = {}
        for spec in agents:
            self.add_agent(spec)
        self.driver = driver
        self.driver_env = dict(driver_env or {})
        self.contract = contract
        self.slots = CallSlots(limits.max_calls, limits.max_calls_per_agent)
        self.budget = ByteBudget(limits.request_budget_bytes)
        self.workers = WorkerPool(limits.max_calls)
        self.pool: DriverPool | None = None
        self.gate: Gate | None = None
        self._sock: socket.socket | None = None
        self._ident: tuple[int, int] | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None  # wakes the gate to stop
        self._accepter: threading.Thread | None = None
        self._stopping = threading.Event()
        self._log = RateLog(log)
        #: Noted at each usable driver reply (``STORE``), for the probes' readiness (``runtime.health``).
        self.health: Health | None = None

    def add_agent(self, spec: AgentSpec) -> None:
        """Serve one more agent, also while running (a test harness meets agents as it goes).

        The table is replaced, never changed in place, so a proof being
        checked meanwhile sees it whole, before or after. The proof line's
        bound grows to fit the agent's name, however it is escaped.
        """
        if spec.agent in self.agents:
            raise ValueError(f"agent {_name(spec.agent)} is given twice")
        self.proof_bound = max(self.proof_bound, proof_line_bound(spec.owner, spec.id, self.limits.max_proof_bytes))
        self.agents = {**self.agents, spec.agent: spec}

    # -- life ----------------------------------------------------------------

    def open_drivers(self) -> StoreBridge:
        """Ask the driver's contract (once) and make the driver pool, before listening (``ask_store``
        may then ask the store); raises if the contract can't be read. Done by ``start`` if not before."""
        if self.pool is not None:
            return self
        if self.contract is None:
            # Not a call: a slow first start (an SDK's imports) must not stop the bridge starting.
            self.contract = read_contract(self.driver, self.driver_env, max(self.limits.call_timeout, 30.0))
        self.pool = DriverPool(
            self.driver, self.contract, self.limits.max_drivers, self.limits.call_timeout,
            max_reply_bytes=self.limits.max_reply_bytes, shared=self.limits.shared_drivers,
        )
        return self

    def start(self) -> StoreBridge:
        """Ask the driver's contract (once, unless ``open_drivers`` did), then listen. Raises if either fails."""
        self.open_drivers()
        soft, hard, open_now, most = fd_room(self.limits)
        pinned = pin_mmap_threshold()
        self._sock, self._ident = listen_private(self.socket_path, LISTEN_BACKLOG)
        self._wake = socket.socketpair()
        self.gate = Gate(
            self._sock,
            self._wake[0],
            self._on_line,
            lambda: self.proof_bound,
            timeout=self.limits.request_timeout,
            most=most,
            evicted_reply=self._error(
                "busy: too many connections waiting to prove who they are; the oldest is dropped"
            ),
        )
        self._accepter = threading.Thread(target=self._gate_loop, name="bridge-gate", daemon=True)
        self._accepter.start()
        log.info(
            "store bridge at %s for %d agent(s), driver %s (%s)",
            self.socket_path, len(self.agents), self.driver, self.contract,
        )
        log.info(
            "file descriptors: limit %s (hard %s), %d open; holding at most %d connections not yet proved",
            soft, hard, open_now, most,
        )
        if self.limits.shared_drivers:
            log.info("driver processes are shared by every agent (--shared-drivers): drivers run without "
                     "LNK_STORE_DIR")
        log.info(
            "request lines: at most %d MiB at once%s", self.limits.request_budget_bytes // MiB,
            "" if pinned else " (malloc's mmap threshold could not be pinned: freed memory may be kept)",
        )
        return self

    def stop(self) -> None:
        """Stop taking calls, let calls under way finish (up to a call's time), stop the drivers."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._wake is not None:
            self._wake[1].send(b"x")
        if self._accepter is not None:
            self._accepter.join()
        if self._sock is not None:
            self._sock.close()
            if self._ident is not None:
                remove_if_ours(self.socket_path, self._ident)
        self.workers.close(time.monotonic() + self.limits.request_timeout + self.limits.call_timeout)
        if self.pool is not None:
            self.pool.close()
        for end in self._wake or ():
            end.close()
        if self._sock is not None:  # it listened (a bridge refused before listening was never "at" its socket)
            log.info("store bridge at %s stopped", self.socket_path)

    def gate_problem(self) -> str | None:
        """Why the bridge takes no calls now (None while its gate's loop runs): its liveness."""
        if self._accepter is None:
            return "starting: the bridge's socket is not served yet"
        if not self._accepter.is_alive():
            return "stopped" if self._stopping.is_set() else "the bridge's gate failed: no calls are taken"
        return None

    def ask_store(self, request: Mapping[str, object]) -> bytes:
        """Send ``request`` through a driver as the first agent's call would go (its environment and
        place), the bridge's own question, not a caller's: the reply line, or the pool's exceptions."""
        assert self.pool is not None, "open_drivers first"
        spec = next(iter(self.agents.values()))
        return self.pool.call(spec.agent, self._call_env(spec), dumps(dict(request)).encode("utf-8"))

    def _call_env(self, spec: AgentSpec) -> dict[str, str]:
        """A call's driver environment: the op's budget inside the call's limit (the driver stops an
        op, and says what it did, first); no LNK_STORE_DIR for shared drivers (one serves every agent)."""
        env = {**self.driver_env, OP_SECONDS: f"{self.limits.op_budget:g}"}
        if not self.limits.shared_drivers:
            env["LNK_STORE_DIR"] = spec.store_dir
        return env

    def __enter__(self) -> StoreBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connections ---------------------------------------------------------

    def _gate_loop(self) -> None:
        assert self.gate is not None
        try:
            self.gate.run()
        except BaseException:
            log.exception("the bridge's gate failed; no more calls are taken")
            raise

    def _on_line(self, sock: socket.socket, line: bytes, rest: bytes) -> bytes | None:
        """A proof line, on the gate's thread: the answer, or None when the call was handed to a worker.

        Cheap by construction (a line of a few KiB, one HMAC), so the gate
        never waits on a proved call.
        """
        try:
            spec = self._prove(line)
        except Refused as exc:
            self._log(logging.WARNING, "refused-proof", "refused a proof: %s", exc)
            CALLS.inc("", "refused")
            return self._error(f"refused: {exc}")
        try:
            self.slots.take(spec.agent)
        except Busy as exc:
            self._log(logging.WARNING, "busy", "busy for %s: %s", _name(spec.agent), exc)
            CALLS.inc("", "busy")
            return self._error(f"busy: {exc}")
        try:
            self.workers.submit(lambda: self._proved_call(sock, spec, rest))
        except PoolBusy as exc:
            self.slots.give_back(spec.agent)
            self._log(logging.WARNING, "busy", "busy for %s: %s", _name(spec.agent), exc)
            CALLS.inc("", "busy")
            return self._error(f"busy: {exc}")
        return None

    def _proved_call(self, sock: socket.socket, spec: AgentSpec, rest: bytes) -> None:
        """One proved connection, on a worker: read the request, answer it, close.

        The slot and the bytes are given back before the answer is sent, as
        the call is over then: a caller that reads its answer (or sees the
        connection closed) and calls again finds its slot free.
        """
        hold = self.budget.hold()
        reader: LineReader | None = None
        try:
            try:
                sock.setblocking(True)
                reader = LineReader(sock, rest, hold)
                reply = self._request(spec, reader, hold)
            finally:
                hold.release()
                self.slots.give_back(spec.agent)
            assert reader is not None
            if reply is not None:
                send_line(sock, reply, self.limits.request_timeout)
            # Answered before its request was read (refused, busy): the caller may still be sending.
            finish(sock, drain_seconds=0.0 if reader.lines_read >= 1 else 1.0)
        except Exception:  # a bug here must cost one connection, never the bridge
            log.exception("connection failed")
            sock.close()

    def _request(self, spec: AgentSpec, reader: LineReader, hold: Hold) -> bytes | None:
        """The reply line for a proved call, or None to close without one."""
        limits = self.limits
        try:
            line = reader.read_line(time.monotonic() + limits.request_timeout, limits.max_request_bytes)
        except (LineClosed, LineTimeout) as exc:
            log.warning("%s proved but sent no request within %g s: %s", _name(spec.agent), limits.request_timeout, exc)
            CALLS.inc("", "no_request")
            return None
        except LineTooLong as exc:
            CALLS.inc("", "refused")
            return self._error(f"refused: request {exc}")
        except LineOverBudget as exc:
            self._log(logging.WARNING, "budget", "busy for %s: %s", _name(spec.agent), exc)
            CALLS.inc("", "busy")
            return self._error(f"busy: reading requests already holds the bridge's memory budget ({exc})")
        cost = parse_cost(line)
        if cost > self.budget.total:
            CALLS.inc("", "refused")
            return self._error(
                f"refused: request would take {cost / MiB:.0f} MiB to check, over the bridge's "
                f"{self.budget.total / MiB:.0f} MiB for requests (too many JSON values)"
            )
        if not hold.resize(cost):
            self._log(
                logging.WARNING,
                "budget",
                "busy for %s: no room to check a request of %d bytes",
                _name(spec.agent),
                len(line),
            )
            CALLS.inc("", "busy")
            return self._error(f"busy: checking requests already holds the bridge's memory budget "
                               f"({self.budget.total / MiB:.0f} MiB)")
        return self._call(spec, line, hold)

    def _prove(self, line: bytes) -> AgentSpec:
        """The served agent a proof line proves, or Refused.

        An agent this bridge does not serve is checked against a random key,
        so that a refusal takes the same time whoever was named.
        """
        message = rules.parse_line(line, "proof line")
        agent = rules.named_agent(message, "proof line")
        proof = message.get("proof")
        if not isinstance(proof, str) or not PROOF_RE.match(proof):
            raise Refused("'proof' must be 64 lowercase hex digits")
        spec = self.agents.get(agent)
        key = spec.key if spec is not None else _UNKNOWN_KEY
        if not proof_matches(key, agent.owner, agent.id, proof) or spec is None:
            raise Refused(f"no agent {_name(agent)} with this proof here")
        return spec

    def _call(self, spec: AgentSpec, line: bytes, hold: Hold) -> bytes:
        """Check the request, run it through a driver, word the outcome.

        The parsed request is dropped before the driver runs, and the hold
        shrunk to what the line costs while the driver answers.
        """
        assert self.pool is not None and self.contract is not None
        try:
            request = rules.parse_line(line, "request")
            rules.check_call(request, spec.agent, self.contract, spec.folder)
        except Refused as exc:
            log.warning("refused a call of %s: %s", _name(spec.agent), exc)
            CALLS.inc("", "refused")
            return self._error(f"refused: {exc}")
        env = self._call_env(spec)
        op = _op_label(request.get("op"))
        del request
        hold.resize(min(hold.size, call_cost(line)))
        try:
            with CALL_SECONDS.time(op):
                reply = self.pool.call(spec.agent, env, line)
        except DriverTimeout as exc:
            log.warning("%s of %s: %s", op, _name(spec.agent), exc)
            CALLS.inc(op, "timeout")
            return self._error(f"timeout: {exc}; {stopped_outcome(op)}")
        except NoDriverFree as exc:
            log.warning("%s of %s: %s", op, _name(spec.agent), exc)
            CALLS.inc(op, "busy")
            return self._error(f"busy: {exc}")
        except ReplyOverLimit as exc:
            log.warning("%s of %s: %s", op, _name(spec.agent), exc)
            CALLS.inc(op, "refused")
            return self._error(f"refused: {exc}; {_what_changed(op)}")
        except DriverFailed as exc:
            log.warning("%s of %s: driver failed: %s", op, _name(spec.agent), exc)
            CALLS.inc(op, "driver")
            return self._error(f"driver: {exc}; {stopped_outcome(op) if exc.sent else _words()[1]}")
        # The reply is held until sent: counted in the budget with the request, beyond a small one.
        if len(reply) > SMALL_REPLY and not hold.resize(hold.size + len(reply)):
            del reply
            self._log(logging.WARNING, "budget", "busy for %s: no room to hold a reply", _name(spec.agent))
            CALLS.inc(op, "busy")
            return self._error(
                f"busy: replies and requests under way already hold the bridge's memory budget "
                f"({self.budget.total / MiB:.0f} MiB); {_what_changed(op)}"
            )
        log.debug("%s of %s answered", op, _name(spec.agent))
        CALLS.inc(op, "answered")
        if self.health is not None and not is_error_reply(reply):
            self.health.note(STORE, True)  # the store answered (its format record read and accepted)
        return reply

    @staticmethod
    def _error(reason: str) -> bytes:
        return dumps(rules.error_reply(reason)).encode("utf-8")


@functools.cache
def _ops() -> frozenset[str]:
    """The ops the drivers of this project answer (their table, ``service.OPS``, read once).

    Imported on first use: the bridge answers no op itself, and needs the
    table's names only, not the collections behind them at start.
    """
    from ..protocol.service import OPS

    return frozenset(OPS)


#: Ops whose driver provably writes nothing, whatever happens: their calls stopped midway changed nothing.
#: None yet: every op may write, reads included (the store gate's server probe on a process's first op,
#: the packing a read leaves, an index entry a read repairs), so every stopped call says outcome unknown.
NEVER_WRITE: frozenset[str] = frozenset()


@functools.cache
def _words() -> tuple[str, str]:
    """The drivers' own words (service.py): (outcome unknown, nothing was changed), read once."""
    from ..protocol.service import UNCHANGED_WORDS, UNKNOWN_WORDS

    return UNKNOWN_WORDS, UNCHANGED_WORDS


def stopped_outcome(op: str) -> str:
    """What a call the bridge stopped (its time, the driver's death) means for the store, in the drivers' words.

    The driver may have sent any of the op's writes before it was stopped, so
    its fate is unknown, unless the op never writes (``NEVER_WRITE``).
    ``cloudstore.errors.from_reply`` and any caller reading by the protocol's
    Errors rule then know not to take the call as one that changed nothing.
    """
    unknown, unchanged = _words()
    return unchanged if op in NEVER_WRITE else unknown


def _op_label(op: object) -> str:
    """A request's op as a metrics label: a known op's name, else "other" (a caller's string is never kept)."""
    return op if isinstance(op, str) and op in _ops() else "other"


SMALL_REPLY = 64 * 1024  # a reply this short is held outside the budget (counted per call in the bound)
#: The source a bridge's readiness names: its drivers' store.
STORE = "store"
_ERROR_REPLY = re.compile(rb'\s*\{\s*"reply"\s*:\s*"error"')


def is_error_reply(line: bytes) -> bool:
    """Whether a driver's reply line (checked by ``check_reply_line``) is an error reply, from its first bytes."""
    return _ERROR_REPLY.match(line[:64]) is not None


@functools.cache
def _read_only_ops() -> frozenset[str]:
    """The ops the drivers' table declares read-only (``Op.read_only``), read once."""
    from ..protocol.service import OPS

    return frozenset(name for name, op in OPS.items() if op.read_only)


def _what_changed(op: str) -> str:
    """What a caller may know of a call whose reply the driver wrote whole but the bridge did not pass on.

    Unlike a call stopped midway (``stopped_outcome``), the op ran to its end: a read op's end leaves
    the store as its reader sees it, so only the ops that may change what a reader sees say unknown."""
    return "nothing was changed" if op in _read_only_ops() else "outcome unknown: the driver may have acted on it"


def _name(agent: Agent) -> str:
    """An agent as logs and refusals show it: owner/id, or id alone with no owner; long names cut."""
    return shown(agent.id) if agent.owner is None else f"{shown(agent.owner)}/{shown(agent.id)}"

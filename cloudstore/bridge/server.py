"""The store bridge: proved calls from a Unix socket to a driver program.

One connection is one call (wire.md, "Through the store bridge"): a proof
line, then within ``request_timeout`` one request line, answered with one
reply line. Each connection gets a thread of its own; the limits of
``Limits`` bound how many of them hold a call or a driver at once.

Nothing reaches a driver until the caller has proved it is one of the agents
this bridge serves, the request names that same agent, and the request
passes every check of ``rules``. The bridge's own answers are error replies
whose first word says which: ``refused``, ``busy``, ``timeout``, ``driver``.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from ..client import dumps
from ..validate import Agent
from . import rules
from .drivers import Contract, DriverFailed, DriverPool, DriverTimeout, NoDriverFree, read_contract
from .limits import Busy, CallSlots, Counter, Limits
from .lines import LineClosed, LineReader, LineTimeout, LineTooLong, finish, send_line
from .listener import listen_private, remove_if_ours
from .proof import PROOF_RE, proof_matches
from .rules import Refused

log = logging.getLogger("cloudstore.bridge")

SOCKET_NAME = ".link-store.sock"
_UNKNOWN_KEY = os.urandom(32)  # proofs for agents not served are still checked, at the same cost


@dataclass(frozen=True)
class AgentSpec:
    """One agent this bridge serves: who it is, its key, and its folder."""

    owner: Optional[str]
    id: str
    key: bytes = field(repr=False)  # never in a log line
    folder: str = ""

    @property
    def agent(self) -> Agent:
        return Agent(self.id, self.owner)

    @property
    def store_dir(self) -> str:
        """``LNK_STORE_DIR``: the agent's chats/, so what a driver keeps moves with the agent."""
        return os.path.join(self.folder, "chats")


class StoreBridge:
    """Serves the given agents at ``<harness_dir>/.link-store.sock`` until stopped."""

    def __init__(
        self,
        harness_dir: str | os.PathLike[str],
        agents: Iterable[AgentSpec],
        driver: str | Sequence[str],
        driver_env: Optional[Mapping[str, str]] = None,
        limits: Limits = Limits(),
        contract: Optional[Contract] = None,
    ) -> None:
        self.socket_path = os.path.join(os.fspath(harness_dir), SOCKET_NAME)
        self.agents: dict[Agent, AgentSpec] = {}
        for spec in agents:
            self.add_agent(spec)
        self.driver = driver
        self.driver_env = dict(driver_env or {})
        self.limits = limits
        self.contract = contract
        self.slots = CallSlots(limits.max_calls, limits.max_calls_per_agent)
        self._pending = Counter(limits.max_pending)
        self.pool: Optional[DriverPool] = None
        self._sock: Optional[socket.socket] = None
        self._ident: Optional[tuple[int, int]] = None
        self._wake: Optional[tuple[socket.socket, socket.socket]] = None  # wakes the accept loop to stop
        self._threads: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()
        self._accepter: Optional[threading.Thread] = None
        self._stopping = threading.Event()

    def add_agent(self, spec: AgentSpec) -> None:
        """Serve one more agent, also while running (a test harness meets agents as it goes).

        The table is replaced, never changed in place, so a proof being
        checked meanwhile sees it whole, before or after.
        """
        if spec.agent in self.agents:
            raise ValueError(f"agent {_name(spec.agent)} is given twice")
        self.agents = {**self.agents, spec.agent: spec}

    # -- life ----------------------------------------------------------------

    def start(self) -> "StoreBridge":
        """Ask the driver's contract (once), then listen. Raises if either fails."""
        if self.contract is None:
            # Not a call: a slow first start (an SDK's imports) must not stop the bridge starting.
            self.contract = read_contract(self.driver, self.driver_env, max(self.limits.call_timeout, 30.0))
        self.pool = DriverPool(self.driver, self.contract, self.limits.max_drivers, self.limits.call_timeout)
        self._sock, self._ident = listen_private(self.socket_path)
        self._wake = socket.socketpair()
        self._accepter = threading.Thread(target=self._accept_loop, name="bridge-accept", daemon=True)
        self._accepter.start()
        log.info(
            "store bridge at %s for %d agent(s), driver %s (%s)",
            self.socket_path, len(self.agents), self.driver, self.contract,
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
        deadline = time.monotonic() + self.limits.request_timeout + self.limits.call_timeout
        with self._threads_lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.pool is not None:
            self.pool.close()
        for end in self._wake or ():
            end.close()
        log.info("store bridge at %s stopped", self.socket_path)

    def __enter__(self) -> "StoreBridge":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- connections ---------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._sock is not None and self._wake is not None
        wake = self._wake[0]
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            sel.register(wake, selectors.EVENT_READ)
            while not self._stopping.is_set():
                for key, _ in sel.select():
                    if key.fileobj is wake:
                        return
                    try:
                        conn, _ = self._sock.accept()
                    except OSError as exc:
                        log.warning("accept failed: %s", exc)
                        continue
                    thread = threading.Thread(target=self._connection, args=(conn,), daemon=True)
                    with self._threads_lock:
                        self._threads.add(thread)
                    thread.start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            reader = LineReader(conn)
            reply = self._exchange(conn, reader)
            if reply is not None:
                send_line(conn, reply, self.limits.request_timeout)
            # Answered before its request was read (refused, busy): the caller may still be sending.
            finish(conn, drain_seconds=0.0 if reader.lines_read >= 2 else 1.0)
        except Exception:  # a bug here must cost one connection, never the bridge
            log.exception("connection failed")
            conn.close()
        finally:
            with self._threads_lock:
                self._threads.discard(threading.current_thread())

    def _exchange(self, conn: socket.socket, reader: LineReader) -> Optional[bytes]:
        """The reply line for one connection, or None to close without one."""
        limits = self.limits
        if not self._pending.take():
            return self._error("busy: too many connections waiting to prove who they are")
        try:
            try:
                line = reader.read_line(time.monotonic() + limits.request_timeout, limits.max_proof_bytes)
                spec = self._prove(line)
            except (LineClosed, LineTimeout) as exc:
                log.info("connection closed without a proof: %s", exc)
                return None
            except LineTooLong as exc:
                return self._error(f"refused: proof {exc}")
            except Refused as exc:
                log.warning("refused a proof: %s", exc)
                return self._error(f"refused: {exc}")
        finally:
            self._pending.give_back()
        try:
            self.slots.take(spec.agent)
        except Busy as exc:
            log.warning("busy for %s: %s", spec.agent, exc)
            return self._error(f"busy: {exc}")
        try:
            try:
                line = reader.read_line(time.monotonic() + limits.request_timeout, limits.max_request_bytes)
            except (LineClosed, LineTimeout) as exc:
                log.warning("%s proved but sent no request within %g s: %s", spec.agent, limits.request_timeout, exc)
                return None
            except LineTooLong as exc:
                return self._error(f"refused: request {exc}")
            return self._call(spec, line)
        finally:
            self.slots.give_back(spec.agent)

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

    def _call(self, spec: AgentSpec, line: bytes) -> bytes:
        """Check the request, run it through a driver, word the outcome."""
        assert self.pool is not None and self.contract is not None
        try:
            request = rules.parse_line(line, "request")
            rules.check_call(request, spec.agent, self.contract, spec.folder)
        except Refused as exc:
            log.warning("refused a call of %s: %s", _name(spec.agent), exc)
            return self._error(f"refused: {exc}")
        env = {**self.driver_env, "LNK_STORE_DIR": spec.store_dir}
        op = request.get("op")
        try:
            reply = self.pool.call(spec.agent, env, line)
        except DriverTimeout as exc:
            log.warning("%s of %s: %s", op, _name(spec.agent), exc)
            return self._error(f"timeout: {exc}")
        except NoDriverFree as exc:
            log.warning("%s of %s: %s", op, _name(spec.agent), exc)
            return self._error(f"busy: {exc}")
        except DriverFailed as exc:
            log.warning("%s of %s: driver failed: %s", op, _name(spec.agent), exc)
            return self._error(f"driver: {exc}")
        log.debug("%s of %s answered", op, _name(spec.agent))
        return reply

    @staticmethod
    def _error(reason: str) -> bytes:
        return dumps(rules.error_reply(reason)).encode("utf-8")


def _name(agent: Agent) -> str:
    """An agent as logs and refusals show it: owner/id, or id alone with no owner."""
    return repr(agent.id) if agent.owner is None else f"{agent.owner!r}/{agent.id!r}"

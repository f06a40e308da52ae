"""How the scheduler reaches its agents' store: ``StoreClient.request(dict) -> dict``.

The runner never cares how a request travels, only that it gets one reply
object back.  Two transports fit behind that seam:

* ``ServeClient``: ONE ``<driver> serve`` process per runner (through
  ``client.ServeProcess``), shared by all the runner's agents; each request
  names its agent.  A driver that dies or hangs is killed and started afresh on
  the next request, and the request that failed is reported as an error whose
  outcome is unknown (the runner never retries a write blindly: the lease
  protocol recovers whatever it left behind).
* ``BridgeStoreClient``: one agent's store bridge (``bridge.BridgeClient``),
  one proved connection a request.

``Counted`` wraps either and counts requests by op (the benchmark reports
requests per fired job from it), and ``AgentStore`` turns one agent's ops into
typed calls that raise ``StoreCallError`` on an error reply.
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..errors import CloudstoreError
from ..protocol.client import DriverError, ServeProcess
from ..protocol.validate import Agent

REQUEST_TIMEOUT = 35.0  # the bridge stops a call at 30 s; a serve driver gets the same, plus slack


class StoreCallError(CloudstoreError):
    """A runner's request got no usable reply, or an error reply; whether a write happened is unknown.

    Not ``generations.StoreCallError`` (the seam's, inside a driver): the runner
    sees the store only through a driver's or a bridge's replies.
    """


class NotSent(StoreCallError):
    """The request never left: connecting to a bridge's socket failed, so nothing was done.

    ``permanent`` when no retry changes it (no such socket or folder, no
    permission): a misconfiguration to name, never ``outcome unknown``.
    """

    def __init__(self, message: str, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class StoreClient(Protocol):
    """Anything that sends one request (naming its agent) and returns its reply object."""

    def request(self, request: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


class ServeClient:
    """One ``<program> serve`` driver process, restarted after it fails.

    Thread-safe: ``ServeProcess`` keeps one request in flight at a time, which
    is what the contract asks of a serve driver.
    """

    def __init__(self, program: str | Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.program = program
        self.env = dict(env or {})
        self._proc: ServeProcess | None = None
        self._lock = threading.Lock()

    def _process(self) -> ServeProcess:
        with self._lock:
            if self._proc is None or not self._proc.alive():
                if self._proc is not None:
                    self._proc.kill()
                self._proc = ServeProcess(self.program, self.env)
            return self._proc

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            proc = self._process()
        except OSError as exc:
            raise StoreCallError(f"driver {self.program!r} could not start: {exc}") from exc
        try:
            reply = proc.request(request, timeout=REQUEST_TIMEOUT)
        except (DriverError, OSError, ValueError) as exc:
            # A reply may still be on its way: this process's stream is out of
            # step for good, so it is replaced rather than read on.
            with self._lock:
                if self._proc is proc:
                    proc.kill()
                    self._proc = None
            raise StoreCallError(f"driver: {exc} (outcome unknown)") from exc
        if not isinstance(reply, dict):
            raise StoreCallError(f"driver answered a non-object: {reply!r:.200}")
        return reply

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.close()
                self._proc = None


class PooledServeClient:
    """Several ``ServeClient`` processes; a request goes to the one its job (or job lease) hashes to.

    One driver process answers one request at a time, and at a cloud's round
    trips a fired job costs about ten: through one process, a runner's
    workers queue behind each other and jobs due together start late.
    Requests about one job always meet the same process, so the versions it
    remembers of that job's record and lease (``Space.update``'s ``cached``)
    save the reads of the later steps.  Polls and listings go to the first.
    """

    def __init__(self, program: str | Sequence[str], env: Mapping[str, str] | None = None, size: int = 1) -> None:
        self.clients = [ServeClient(program, env) for _ in range(max(1, size))]

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.clients[self.slot(request)].request(request)

    def slot(self, request: dict[str, Any]) -> int:
        """Which process: by the job id the request names (``id``, or a ``job:`` lease thread)."""
        if len(self.clients) == 1:
            return 0
        name = request.get("id")
        if not isinstance(name, str):
            thread = request.get("thread")
            name = thread[len("job:"):] if isinstance(thread, str) and thread.startswith("job:") else ""
        if not name:
            return 0
        return zlib.crc32(name.encode("utf-8", "surrogatepass")) % len(self.clients)

    def warm(self, request: dict[str, Any]) -> None:
        """Start every process at once (each answers ``request``): a driver's start (its SDK's
        imports) costs far more than a request, and must not fall on the first due job."""
        threads = [threading.Thread(target=_quietly, args=(c, request), daemon=True) for c in self.clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _quietly(client: ServeClient, request: dict[str, Any]) -> None:
    try:
        client.request(request)
    except StoreCallError:
        pass  # it is started again on its first real request


class BridgeStoreClient:
    """One agent's store bridge behind the StoreClient seam."""

    def __init__(self, socket_path: str, owner: str | None, agent_id: str, key: bytes) -> None:
        from ..bridge.client import BridgeClient  # only runners configured with a bridge need it

        self.bridge = BridgeClient(socket_path, owner, agent_id, key, timeout=REQUEST_TIMEOUT)

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.bridge.request(request)
        except (FileNotFoundError, NotADirectoryError, PermissionError, ConnectionRefusedError,
                BlockingIOError) as exc:
            # Only connect() fails so (a write or read after it resets or breaks): nothing was sent.
            # BlockingIOError (EAGAIN): the bridge's backlog is full, a busy bridge, not a wrong one.
            permanent = not isinstance(exc, (ConnectionRefusedError, BlockingIOError))  # refused: restarting
            raise NotSent(f"bridge {self.bridge.socket_path}: cannot connect: {exc.strerror or exc} "
                          "(nothing was sent)", permanent) from exc
        except Exception as exc:  # BridgeError, socket.timeout
            raise StoreCallError(f"bridge {self.bridge.socket_path}: {exc} (outcome unknown)") from exc

    def close(self) -> None:
        pass  # a connection per request: nothing kept open


class Counted:
    """A StoreClient that counts what it sends, by op."""

    def __init__(self, inner: StoreClient) -> None:
        self.inner = inner
        self.by_op: Counter[str] = Counter()
        self._lock = threading.Lock()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.by_op[str(request.get("op"))] += 1
        return self.inner.request(request)

    def close(self) -> None:
        self.inner.close()


def held_of(reply: dict[str, Any]) -> float:
    """Seconds between a lease write and the reply that says it (``held_ms`` of the scheduler's lease
    ops, by the driver's clock; 0 when absent): a claim's confirmation is dated by it from the reply's
    arrival when that is later than the request's start."""
    held = reply.get("held_ms")
    return held / 1000 if type(held) is int and 0 <= held <= 10**9 else 0.0


class AgentStore:
    """One agent's ops through its client; an error reply raises StoreCallError."""

    def __init__(self, agent: Agent, client: StoreClient, own_driver: bool = False) -> None:
        self.agent = agent
        self.client = client
        # Through the runner's own driver (LNK_SCHEDULER_OPS=1): job_due and job_claim are answered.
        self.own_driver = own_driver

    def op(self, op: str, **args: Any) -> dict[str, Any]:
        reply = self.client.request({"op": op, "agent": self.agent.wire(), **args})
        if reply.get("reply") == "error":
            raise StoreCallError(f"{op} for {self.agent.label()}: {reply.get('error')}")
        return reply

    def mark(self) -> int:
        return int(self.op("job_mark")["mark"])

    def next(self) -> float | None:
        return self.op("job_next")["next"]

    def due(self, limit: int, after: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """The store's due index by name (``job_due``, answered only by the runner's own driver)."""
        reply = self.op("job_due", limit=limit, after=after)
        return list(reply["due"]), bool(reply["more"])

    def claims(self, limit: int, after: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """The store's claim index by name (``job_claims``: every agent's jobs in firing, with their
        ``age_ms``), answered only by the runner's own driver."""
        reply = self.op("job_claims", limit=limit, after=after)
        return list(reply["claims"]), bool(reply["more"])

    def list(self, place: str) -> list[dict[str, Any]]:
        return list(self.op("job_list", place=place)["jobs"])

    def get(self, place: str, job_id: str) -> dict[str, Any] | None:
        return self.op("job_get", place=place, id=job_id)["job"]

    def shift(self, job_id: str, source: str, target: str) -> bool:
        return bool(self.op("job_shift", id=job_id, **{"from": source, "to": target})["found"])

    def claim(self, job_id: str) -> dict[str, Any] | None:
        """Shift waiting -> firing, answering the job moved (None: none was waiting), through a bridge.

        A bridge answers only the protocol's ops: a shift, then a read back
        from firing (what it reads is what is in firing, the same job unless
        someone put another there meanwhile).  The runner's own driver claims
        with its lease in one request instead (``claim_leased``).
        """
        if not self.shift(job_id, "waiting", "firing"):
            return None
        return self.get("firing", job_id)

    def claim_leased(self, job_id: str, thread: str, holder: str, lapse_ms: int,
                     not_after: float, recover: bool = False) -> dict[str, Any]:
        """The lease and the claim in one request (``job_claim`` with its lease fields; own driver only):
        the reply's ``took``, ``holder``, ``job``, ``recovered`` and ``fence``.  ``recover``: only a job
        left in firing, its record written anew under the lease before it is answered."""
        return self.op("job_claim", id=job_id, thread=thread, holder=holder, lapse_ms=lapse_ms,
                       not_after=not_after, **({"recover": True} if recover else {}))

    def finish_claimed(self, job_id: str, thread: str, holder: str, fence: int, keep_ending: bool) -> dict[str, Any]:
        """Out of firing only under the claim (``job_finish``; own driver only): ``finished``, ``ours``,
        and ``holder`` when it was not ours."""
        return self.op("job_finish", id=job_id, thread=thread, holder=holder, fence=fence, keep_ending=keep_ending)

    def remove(self, place: str, job_id: str) -> bool:
        return bool(self.op("job_remove", place=place, id=job_id)["found"])

    def take(self, thread: str, holder: str, lapse_ms: int) -> str:
        return str(self.op("take", thread=thread, holder=holder, lapse_ms=lapse_ms)["took"])

    def take_naming(self, thread: str, holder: str, lapse_ms: int) -> tuple[str, str | None, int | None, float]:
        """``take``, the holder when ``held``, the lease's fence when ours, and how long before the reply
        the lease was written (seconds, ``held_of``): known only through the runner's own driver
        (``lease_take``); a bridge answers the protocol's ``take``, which says none of them."""
        if not self.own_driver:
            return self.take(thread, holder, lapse_ms), None, None, 0.0
        reply = self.op("lease_take", thread=thread, holder=holder, lapse_ms=lapse_ms)
        held_by, fence = reply.get("holder"), reply.get("fence")
        return (str(reply["took"]), held_by if isinstance(held_by, str) else None,
                fence if type(fence) is int else None, held_of(reply))

    def renew(self, thread: str, holder: str) -> bool:
        return self.op("renew", thread=thread, holder=holder)["reply"] == "done"

    def renew_many(self, leases: Sequence[tuple[Agent, str]], holder: str) -> tuple[Sequence[bool], float]:
        """``renew`` of each (agent, thread) at once, in one request whatever their agents (``lease_renew``;
        own driver only): whether each was renewed (false: ``lost``), in order, and how long before the
        reply the earliest renewal was written (``held_of``)."""
        wire = [{"agent": agent.wire(), "thread": thread} for agent, thread in leases]
        reply = self.op("lease_renew", leases=wire, holder=holder)
        renewed = reply.get("renewed")
        if not isinstance(renewed, list) or len(renewed) != len(wire):
            raise StoreCallError(f"lease_renew for {self.agent.label()}: answered {renewed!r:.200}, not one "
                                 f"boolean per lease")
        return [ok is True for ok in renewed], held_of(reply)

    def end(self, thread: str, holder: str) -> None:
        self.op("end", thread=thread, holder=holder)

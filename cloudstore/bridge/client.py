"""Calling a store bridge: prove, send one request, read one reply.

``BridgeClient`` is what a harness, a scheduler or the conformance suite uses;
``exchange`` sends whatever lines it is given, so tests can send what no
well-behaved client would.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from ..errors import CloudstoreError
from ..protocol.client import dumps
from .lines import LineClosed, LineReader, LineTimeout
from .proof import compute_proof

__all__ = ["BridgeClient", "BridgeError", "bridge_error_word", "compute_proof", "exchange", "proof_line"]

BRIDGE_WORDS = ("refused", "busy", "timeout", "driver")


class BridgeError(CloudstoreError):
    """The bridge closed the connection without a reply line (or answered no JSON object).

    Whether the request reached a driver, nobody can tell (``changed`` is None).
    """

    changed = None


def proof_line(key: bytes, owner: str | None, agent_id: str) -> bytes:
    """The first line of every call: who the caller is, and the proof of it."""
    return dumps({"agent": {"id": agent_id, "owner": owner}, "proof": compute_proof(key, owner, agent_id)}).encode(
        "utf-8"
    )


def bridge_error_word(reply: dict[str, Any]) -> str | None:
    """``refused``, ``busy``, ``timeout`` or ``driver`` when the bridge itself
    answered the error (a caller may retry ``busy``); None for anything else,
    a driver's own error included."""
    if reply.get("reply") != "error" or not isinstance(reply.get("error"), str):
        return None
    word = reply["error"].split(":", 1)[0]
    return word if word in BRIDGE_WORDS else None


def exchange(socket_path: str, lines: Sequence[bytes], timeout: float = 60.0, pause: float = 0.0) -> bytes:
    """Send ``lines`` (newlines added) on one connection; the first line answered
    without its newline, or b"" when the bridge closed without answering.

    ``pause`` waits between lines (to send a request after the proof, as a
    slow caller would). A bridge may answer and close before reading all it
    was sent (a refusal); the answer is read even when sending failed.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        try:
            for i, line in enumerate(lines):
                if i and pause:
                    time.sleep(pause)
                sock.sendall(line + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _read_reply(sock, timeout)


def _read_reply(sock: socket.socket, timeout: float) -> bytes:
    """The first line the bridge answers, within ``timeout`` seconds; b"" when it closed
    (or reset the connection) before a whole line.  The bridge's own line reader, with
    no bound on the size: a reply is as long as the driver made it.  TimeoutError past
    the time."""
    try:
        return LineReader(sock).read_line(time.monotonic() + timeout, sys.maxsize)
    except LineClosed:
        return b""
    except LineTimeout as exc:
        raise TimeoutError(f"no reply line from the bridge within {timeout}s") from exc


class BridgeClient:
    """One agent's caller of one bridge: each request is one connection."""

    def __init__(self, socket_path: str, owner: str | None, agent_id: str, key: bytes, timeout: float = 60.0) -> None:
        self.socket_path = socket_path
        self.owner = owner
        self.id = agent_id
        self.timeout = timeout
        self.proof = proof_line(key, owner, agent_id)  # the first line of each of its calls

    @property
    def agent(self) -> dict[str, Any]:
        """The ``agent`` every request of this client names."""
        return {"id": self.id, "owner": self.owner}

    def request_line(self, line: bytes) -> bytes:
        """Send one raw request line; the raw reply line (BridgeError if none)."""
        reply = exchange(self.socket_path, [self.proof, line], self.timeout)
        if not reply:
            raise BridgeError(f"{self.socket_path}: closed without a reply")
        return reply

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a request as it is (its ``agent`` included); the reply as JSON."""
        reply = self.request_line(dumps(request).encode("utf-8"))
        try:
            value = json.loads(reply)
        except ValueError as exc:
            raise BridgeError(f"not a JSON reply line: {reply[:200]!r}") from exc
        if not isinstance(value, dict):
            raise BridgeError(f"not a reply object: {reply[:200]!r}")
        return value

    def op(self, op: str, **args: Any) -> dict[str, Any]:
        """A request for this client's own agent: ``client.op("last", thread="t")``."""
        return self.request({"op": op, "agent": self.agent, **args})

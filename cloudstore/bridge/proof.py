"""The store bridge's proof: who a caller is, shown without sending its key.

A caller proves it is agent (owner, id) by sending HMAC-SHA256 over the bytes
``wire.md`` ("Through the store bridge") gives, keyed with the agent's key.
The bytes are length-prefixed so that no two (owner, id) pairs share them:
owner null (one byte 0x00) and owner ``""`` (0x01 and a zero length) prove
differently, and no split of one string between owner and id can collide.
"""

from __future__ import annotations

import hmac
import hashlib
import os
import re
import stat
import struct
from typing import Optional

PREFIX = b"link store bridge v1\x00"
KEY_MIN = 32
PROOF_RE = re.compile(r"^[0-9a-f]{64}$")


class KeyFileError(Exception):
    """The key file is unsafe or malformed; the message says why."""


def _counted(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack(">I", len(raw)) + raw


def proof_message(owner: Optional[str], agent_id: str) -> bytes:
    """The bytes the proof is computed over, exactly as wire.md lays them out."""
    owner_part = b"\x00" if owner is None else b"\x01" + _counted(owner)
    return PREFIX + owner_part + _counted(agent_id)


def compute_proof(key: bytes, owner: Optional[str], agent_id: str) -> str:
    """The proof for (owner, id): 64 lowercase hex digits."""
    return hmac.new(key, proof_message(owner, agent_id), hashlib.sha256).hexdigest()


def proof_matches(key: bytes, owner: Optional[str], agent_id: str, given: str) -> bool:
    """Whether ``given`` proves (owner, id) under ``key``, compared in constant time.

    Both sides are ASCII bytes of equal shape by the time they are compared, so
    how long the comparison takes says nothing about how much of it matched.
    """
    expected = compute_proof(key, owner, agent_id).encode("ascii")
    return hmac.compare_digest(expected, given.encode("utf-8", "surrogatepass"))


def parse_key(text: str) -> bytes:
    """A key given as one line of hex; at least KEY_MIN bytes once decoded."""
    body = text[:-1] if text.endswith("\n") else text
    body = body[:-1] if body.endswith("\r") else body
    if "\n" in body or "\r" in body:
        raise KeyFileError("a key file holds one line of hex, not several")
    try:
        key = bytes.fromhex(body.strip())
    except ValueError as exc:
        raise KeyFileError(f"the key is not hex: {exc}") from exc
    if len(key) < KEY_MIN:
        raise KeyFileError(f"the key is {len(key)} bytes, fewer than {KEY_MIN}")
    return key


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """The agent's key from its own file, refused when others may read or write it.

    The mode is judged on the opened file (fstat), so the file checked is the
    file read (a link to it is followed, as secret mounts use links). Group or other access of any kind is refused, as ssh refuses a
    private key: whoever may write the key may also prove as the agent.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"{path}: mode {stat.S_IMODE(info.st_mode):04o} lets group or others at the key; make it 0600"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(64 * 1024 + 1)
    finally:
        os.close(fd)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{path}: the key is not hex") from exc
    try:
        return parse_key(text)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from exc


def new_key_hex(size: int = KEY_MIN) -> str:
    """A fresh random key as the hex line a key file holds."""
    return os.urandom(size).hex()

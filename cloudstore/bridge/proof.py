"""The store bridge's proof: who a caller is, shown without sending its key.

A caller proves it is agent (owner, id) by sending HMAC-SHA256 over the bytes
``docs/protocol.md`` ("Through the store bridge") gives, keyed with the agent's key.
The bytes are length-prefixed so that no two (owner, id) pairs share them:
owner null (one byte 0x00) and owner ``""`` (0x01 and a zero length) prove
differently, and no split of one string between owner and id can collide.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import struct

from ..errors import CloudstoreError

PREFIX = b"link store bridge v1\x00"
KEY_MIN = 32
PROOF_RE = re.compile(r"^[0-9a-f]{64}$")


class KeyFileError(CloudstoreError):
    """The key file is unsafe or malformed; the message says why."""


def _counted(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return struct.pack(">I", len(raw)) + raw


def proof_message(owner: str | None, agent_id: str) -> bytes:
    """The bytes the proof is computed over, exactly as docs/protocol.md lays them out."""
    owner_part = b"\x00" if owner is None else b"\x01" + _counted(owner)
    return PREFIX + owner_part + _counted(agent_id)


def compute_proof(key: bytes, owner: str | None, agent_id: str) -> str:
    """The proof for (owner, id): 64 lowercase hex digits."""
    return hmac.new(key, proof_message(owner, agent_id), hashlib.sha256).hexdigest()


def proof_matches(key: bytes, owner: str | None, agent_id: str, given: str) -> bool:
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


KEY_FILE_MAX = 64 * 1024  # more than any key line; a key file is read no further


def _opened_key(path: str) -> int:
    """The key file opened for reading, without waiting on anything.

    O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer, and
    would hang the bridge's start for good. Links are followed (secret mounts
    are links); what was opened is judged by fstat afterwards.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    return os.open(path, flags)


def _trusted_owner(uid: int) -> bool:
    """The user this process runs as, or root: no one else may own the key or its folders."""
    return uid in (os.geteuid(), 0)


def _folders_of(path: str) -> list[str]:
    """Every folder whose writer could put another key at ``path``: those above
    the path as given (where a link may sit) and above the file it names."""
    seen: list[str] = []
    for start in (os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))):
        folder = start
        while True:
            if folder not in seen:
                seen.append(folder)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return seen


def check_key_folders(path: str) -> None:
    """Refuse a key that someone other than this user (or root) could replace.

    Every folder above the key file, and above the file a link names, must
    be owned by this user or root, and be writable by no group or other user
    unless it is sticky (as /tmp is: there, others can add files but not
    remove or rename ours, and a file of theirs fails the owner check). A
    link given as the key file must be owned by this user or root as well.
    """
    given = os.path.abspath(path)
    link = os.lstat(given)
    if stat.S_ISLNK(link.st_mode) and not _trusted_owner(link.st_uid):
        raise KeyFileError(f"{path}: a link owned by uid {link.st_uid}, neither this user nor root")
    for folder in _folders_of(given):
        info = os.stat(folder)
        if not _trusted_owner(info.st_uid):
            raise KeyFileError(f"{path}: folder {folder} is owned by uid {info.st_uid}, neither this user nor root")
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            raise KeyFileError(
                f"{path}: folder {folder} (mode {stat.S_IMODE(info.st_mode):04o}) lets others replace the key; "
                "make it writable by its owner only"
            )


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """The agent's key from its own file, refused when anyone else may read, write or replace it.

    The file is opened without blocking and judged on the opened file
    (fstat), so the file checked is the file read: it must be a regular file
    (a FIFO or a device is refused, never waited on), owned by this user or
    root, with no group or other access of any kind, as ssh refuses a
    private key: whoever may write the key may also prove as the agent. Its
    folders are judged by ``check_key_folders``. A key of one byte repeated
    (all zeros: a placeholder never filled in) is refused.
    """
    name = os.fspath(path)
    fd = _opened_key(name)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if not _trusted_owner(info.st_uid):
            raise KeyFileError(f"{path}: owned by uid {info.st_uid}, neither this user ({os.geteuid()}) nor root")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"{path}: mode {stat.S_IMODE(info.st_mode):04o} lets group or others at the key; make it 0600"
            )
        check_key_folders(name)
        raw = b""
        while len(raw) <= KEY_FILE_MAX:
            chunk = os.read(fd, KEY_FILE_MAX + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
    finally:
        os.close(fd)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise KeyFileError(f"{path}: the key is not hex") from exc
    try:
        key = parse_key(text)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from exc
    if len(set(key)) == 1:
        raise KeyFileError(f"{path}: the key is one byte repeated ({key[:1].hex()}), not a random key")
    return key


def proof_line_bound(owner: str | None, agent_id: str, least: int) -> int:
    """The longest proof line the bridge reads for this agent: at least ``least``.

    The contract sets no length for an id or owner, so the bound follows the
    agents served: each UTF-8 byte of their names may be sent escaped in at
    most 6 bytes (``\\u0001``; an astral character's 4 bytes as 12), and 512
    bytes cover the rest (keys, the 64-digit proof, spaces). A line naming an
    agent not served cannot be proved anyway, so nothing longer is worth reading.
    """
    names = len(agent_id.encode("utf-8", "surrogatepass")) + len((owner or "null").encode("utf-8", "surrogatepass"))
    return max(least, 6 * names + 512)


def new_key_hex(size: int = KEY_MIN) -> str:
    """A fresh random key as the hex line a key file holds."""
    return os.urandom(size).hex()

"""Does the store's server honour the preconditions every promise rests on?  Checked, not assumed.

Every race the drivers settle (two appenders of one seq, takers of one
lease, writers of one file version) is settled by the server refusing a
conditional write: a create of a key that exists (S3 ``If-None-Match: *``,
GCS ``ifGenerationMatch=0``) and an update of a version that is no longer
there (S3 ``If-Match``, GCS ``ifGenerationMatch=N``).  A server that accepts
them anyway (gcp-storage-emulator ignores every precondition; some older
S3-compatible servers, and proxies, drop the headers) makes every answer
silently wrong: both appenders told ``done``.  So before a process's first
write, it asks the server to do both, where they must be refused:

1. a create of ``_probe/<k>`` (which exists after the first probe of the
   store ever) and an update of it at a version it never had (a generation
   far in the future on GCS, an ETag no body has on S3), sent together;
2. only when the create was accepted (the key was new, or the server ignores
   the precondition: one reply cannot tell), the create once more, which now
   must be refused.

A server that accepts either write is refused: every op answers an error
saying the server ignores preconditions, and nothing of any agent is written.
Each body goes through the backend's one request path (GCS uploads are
single requests at every size: gcs.py), so what was checked is what every
write takes.  Cost: the two writes, beside the format record's read, in one
round trip per process (two, for the few first probes of a shard).

The probe key is one of ``SHARDS``, picked at random: GCS counts even a
refused write against its one write a second per object, and many processes
starting at once must not make their own probe a hot spot.  A folder store
(``file://``) has no server: its own locks settle races, and it is not probed.
"""

from __future__ import annotations

import random

from ..generations import AlreadyExists, Create, NotFound, PreconditionFailed, RetryingStore, StoreRefused, Update

#: Below the store's root: ``_probe/<k>``, k in 0..SHARDS-1.
PREFIX = "_probe/"
SHARDS = 16
#: Versions no object ever has: a GCS generation in the year 2255 (generations are microseconds),
#: an S3 ETag (the MD5 of a body, and every body here holds a fresh nonce).
NEVER = {"gcs": "9007199254740991", "s3": '"ffffffffffffffffffffffffffffffff"'}
_BODY = b'{"probe": "a create of this key must be refused once it exists"}'


class ServerIgnoresPreconditions(StoreRefused):
    """The server accepted a write its precondition should have refused: no race can be settled there."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the store's server ignores preconditions: {what}; this driver settles every race by them, so it "
            "uses no store there (use a server that honours them: docs/design.md, 'The server check')")


class Probe:
    """One process's check of one store's server, in at most two rounds (see the module docstring)."""

    def __init__(self, store: RetryingStore, root: str, label: str, shard: int | None = None) -> None:
        self.store = store
        self.key = f"{root}{PREFIX}{random.randrange(SHARDS) if shard is None else shard}"
        self.never = NEVER.get(label, NEVER["s3"])
        self.label = label

    def create(self) -> bool:
        """A create of the probe key; whether the server accepted it."""
        try:
            self.store.put(self.key, _BODY, Create())
        except AlreadyExists:
            return False
        return True

    def stale_update(self) -> None:
        """An update at a version the key never had: it must be refused."""
        try:
            self.store.put(self.key, _BODY, Update(self.never))
        except (PreconditionFailed, NotFound):
            return
        what = "ifGenerationMatch of a stale generation" if self.label == "gcs" else "If-Match of another ETag"
        raise ServerIgnoresPreconditions(f"an update at a version the object never had was accepted ({what})")

    def second(self) -> None:
        """The create again, after one the server accepted: the key exists now, so it must be refused."""
        if self.create():
            what = "ifGenerationMatch=0" if self.label == "gcs" else "If-None-Match: *"
            raise ServerIgnoresPreconditions(f"a create of an object that exists was accepted ({what})")

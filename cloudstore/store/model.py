"""The domain's words: who owns a thing (``Agent``), where a job is (``PLACES``), the contract's limits.

They belong to no layer above the storage: the collections (``cloudstore.store``) keep things by
them, the request rules (``cloudstore.protocol.validate``) check a request against them, the bridge
and the scheduler name agents by them. Kept here, below all of those, so that the storage never
imports the wire's rules to learn what an agent is. ``RequestError`` is here for the same reason: a
collection refuses what breaks a rule of the contract (a file past ``FILE_MAX``) as a request would.
The limits are the contract's (docs/protocol.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..errors import CloudstoreError

SPEC_MAX = 1_048_576
FILE_MAX = 4_194_304
FILES_MAX = 4_096
PATH_MAX = 1_024
JOB_ID_MAX = 256
TOOLS_MAX = 256
VERSION_MAX = 2**53 - 1
#: A waiting job's due becomes a key of the store's shared due index (due_index.py), so it lies
#: within +-DUE_MAX seconds of 1970 (2**53 - 1: about 285 million years, every such integer exact
#: as a double, so the keys' order is the dues' order).  Firing and ending keep any number.
DUE_MAX = 2**53 - 1
WAITING_DUE_RULE = f"a waiting job's 'due' must lie within -{DUE_MAX} and {DUE_MAX} (seconds since 1970)"
PLACES = ("waiting", "firing", "ending")
FILE_ROOTS = ("instructions", "skills")



class RequestError(CloudstoreError):
    """The request breaks a rule; the message says which."""


def compact(value: Any) -> str:
    """Canonical storage form of a JSON value: compact, ASCII-only (lossless)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)


def is_int(value: Any) -> TypeGuard[int]:
    """A JSON integer: not a bool, not a float, not a string."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class Agent:
    """Who something belongs to: an id, and an owner (None: no owner; "" is an owner).

    The project's one agent identity (drivers, bridge, scheduler, API).
    Keyword-only, ``Agent(id=..., owner=...)``: two strings given by
    position are too easily swapped.
    """

    id: str
    owner: str | None

    def wire(self) -> dict[str, Any]:
        """As a request names it: ``{"id", "owner"}``."""
        return {"id": self.id, "owner": self.owner}

    def label(self) -> str:
        """For logs: ``owner/id``, or ``id`` alone when there is no owner."""
        return self.id if self.owner is None else f"{self.owner}/{self.id}"

    def due_token(self) -> str:
        """How the store's due index names this agent (``job_due``'s ``agent``)."""
        from .keys import AgentKeys  # keys.py names agents by this class: imported when asked

        return AgentKeys(root="", owner=self.owner, id=self.id).due_token()


def due_in_range(due: Any) -> bool:
    """Whether ``due`` may become a due index key: an int or a finite double within +-``DUE_MAX``.

    Compared without converting an int to a double (``10**400`` overflows one)."""
    if isinstance(due, bool) or not isinstance(due, (int, float)):
        return False
    if isinstance(due, float) and not math.isfinite(due):
        return False
    return -DUE_MAX <= due <= DUE_MAX

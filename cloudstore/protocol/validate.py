"""Every rule a request must keep, checked in one place before anything is touched.

A request that breaks a rule raises ``RequestError`` with a message saying
which rule; the driver answers it as ``{"reply": "error"}`` and nothing is
changed, because no handler runs until the whole request has passed here.
The limits and the words they are about (``Agent``, the places) are the
domain's, kept below the storage in ``cloudstore.store.model``; this module
reads a request against them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import unicodedata
from typing import Any

from ..runtime import strict_json
from ..store.model import (  # noqa: F401 - the domain's words, re-exported: requests are checked against them
    DUE_MAX,
    FILE_MAX,
    FILE_ROOTS,
    FILES_MAX,
    JOB_ID_MAX,
    PATH_MAX,
    PLACES,
    SPEC_MAX,
    TOOLS_MAX,
    VERSION_MAX,
    WAITING_DUE_RULE,
    Agent,
    RequestError,
    compact,
    due_in_range,
    is_int,
)

#: Characters of a caller's value that an error reply or a log line shows: a value may be as long as a line.
SHOWN_MAX = 80


def shown(value: object) -> str:
    """A caller's value as an error or log shows it: its repr, cut past SHOWN_MAX characters
    (and then how long it was: a string's own length, else its repr's)."""
    text = repr(value)
    if len(text) <= SHOWN_MAX:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[:SHOWN_MAX]}... ({size} characters)"


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent, refused when no double holds it (1e999)."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise RequestError(f"the number {text[:40]} is too large for a double; nothing was changed")
    return value


def unicode_text(value: str, name: str) -> str:
    """A name that is text: no lone surrogate (JSON's "\\ud800" escapes can make one), else refused."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{name!r} is not valid Unicode text (it holds a lone surrogate)") from exc
    return value


def parse_request(line: bytes | str) -> dict[str, Any]:
    """Parse one request line: UTF-8, strict JSON (no NaN/Infinity, no key given twice), an object.

    The bridge reads its lines through the same parser (``strict_json.object_line``),
    so a line one refuses the other refuses too.
    """
    try:
        return strict_json.object_line(line, "request", parse_float=_finite)
    except strict_json.StrictJSONError as exc:
        raise RequestError(str(exc)) from exc


# -- field readers ---------------------------------------------------------


def field(req: dict[str, Any], name: str) -> Any:
    if name not in req:
        raise RequestError(f"missing field {name!r}")
    return req[name]


def string(req: dict[str, Any], name: str) -> str:
    value = field(req, name)
    if not isinstance(value, str):
        raise RequestError(f"{name!r} must be a string")
    return unicode_text(value, name)


def number(req: dict[str, Any], name: str) -> float:
    """A finite number (an integer or a float, never a boolean)."""
    value = field(req, name)
    if is_int(value) and abs(value) <= 2**63:
        return float(value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise RequestError(f"{name!r} must be a finite number")


def boolean(req: dict[str, Any], name: str, default: bool | None = None) -> bool:
    """``true`` or ``false`` (absent: ``default``, when one is given)."""
    if name not in req and default is not None:
        return default
    value = field(req, name)
    if not isinstance(value, bool):
        raise RequestError(f"{name!r} must be true or false")
    return value


def integer(
    req: dict[str, Any], name: str, minimum: int = 0, maximum: int | None = None, default: int | None = None
) -> int:
    if name not in req and default is not None:
        return default
    value = field(req, name)
    if not is_int(value):
        raise RequestError(f"{name!r} must be a JSON integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"from {minimum}" + (f" to {maximum}" if maximum is not None else "")
        raise RequestError(f"{name!r} must be an integer {bound}")
    return int(value)


def agent(req: dict[str, Any]) -> Agent:
    value = field(req, "agent")
    if not isinstance(value, dict):
        raise RequestError("'agent' must be an object {\"id\", \"owner\"}")
    agent_id = value.get("id")
    if not isinstance(agent_id, str) or agent_id == "":
        raise RequestError("'agent.id' must be a non-empty string")
    owner = value.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise RequestError("'agent.owner' must be a string or null")
    unicode_text(agent_id, "agent.id")
    if owner is not None:
        unicode_text(owner, "agent.owner")
    return Agent(id=agent_id, owner=owner)


def event(req: dict[str, Any]) -> tuple[dict[str, Any], int]:
    value = field(req, "event")
    if not isinstance(value, dict):
        raise RequestError("'event' must be a JSON object")
    seq = value.get("seq")
    if not is_int(seq) or seq < 1:
        raise RequestError("'event.seq' must be a JSON integer >= 1")
    return value, int(seq)


def place(req: dict[str, Any], name: str = "place") -> str:
    value = field(req, name)
    if value not in PLACES:
        raise RequestError(f"{name!r} must be one of {', '.join(PLACES)}")
    return str(value)


def job_id(value: Any, name: str = "id") -> str:
    if not isinstance(value, str):
        raise RequestError(f"job {name!r} must be a string")
    size = len(value.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= JOB_ID_MAX:
        raise RequestError(f"job {name!r} must be 1 to {JOB_ID_MAX} bytes of UTF-8")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise RequestError(f"job {name!r} must hold no control character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"job {name!r} is not valid UTF-8 (lone surrogate)") from exc
    return value


def job(req: dict[str, Any]) -> dict[str, Any]:
    value = field(req, "job")
    if not isinstance(value, dict):
        raise RequestError("'job' must be an object {\"id\", \"spec\", \"due\"}")
    extra = set(value) - {"id", "spec", "due"}
    if extra:
        raise RequestError(f"'job' has unknown fields: {', '.join(sorted(extra))}")
    job_id(value.get("id"))
    if "spec" not in value:
        raise RequestError("'job.spec' is missing")
    spec_size = len(
        json.dumps(value["spec"], separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    )
    if spec_size > SPEC_MAX:
        raise RequestError(f"'job.spec' is {spec_size} bytes, over {SPEC_MAX}")
    due = value.get("due")
    if not (is_int(due) or isinstance(due, float)):
        raise RequestError("'job.due' must be a number (seconds since 1970)")
    return {"id": value["id"], "spec": value["spec"], "due": due}


def waiting_due(job: dict[str, Any]) -> dict[str, Any]:
    """``job``, checked as a job put in waiting: its due becomes an index key (``DUE_MAX``)."""
    if not due_in_range(job["due"]):
        raise RequestError(WAITING_DUE_RULE)
    return job


def file_path(value: Any, name: str = "path", folder: bool = False) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{name!r} must be a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise RequestError(f"{name!r} is not valid UTF-8") from exc
    if size > PATH_MAX:
        raise RequestError(f"{name!r} is {size} bytes, over {PATH_MAX}")
    if "\x00" in value:
        raise RequestError(f"{name!r} must hold no NUL")
    body = value[:-1] if folder and value.endswith("/") else value
    parts = body.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise RequestError(f"{name!r} must be relative, with no empty, '.' or '..' part")
    if parts[0] not in FILE_ROOTS:
        raise RequestError(f"{name!r} must start with instructions/ or skills/")
    if not folder and len(parts) < 2:
        raise RequestError(f"{name!r} names a folder, not a file")
    return value


def data(req: dict[str, Any]) -> bytes:
    value = field(req, "data")
    if not isinstance(value, str):
        raise RequestError("'data' must be a base64 string")
    if len(value) > (FILE_MAX // 3 + 1) * 4:
        raise RequestError(f"'data' is over {FILE_MAX} bytes decoded")
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise RequestError("'data' is not standard base64 with padding") from exc
    if base64.b64encode(raw).decode("ascii") != value:
        raise RequestError("'data' is not canonical standard base64 with padding")
    if len(raw) > FILE_MAX:
        raise RequestError(f"'data' is {len(raw)} bytes decoded, over {FILE_MAX}")
    return raw


def tools(req: dict[str, Any]) -> list[str]:
    value = field(req, "tools")
    if not isinstance(value, list):
        raise RequestError("'tools' must be a list of names")
    if len(value) > TOOLS_MAX:
        raise RequestError(f"'tools' holds {len(value)} names, over {TOOLS_MAX}")
    if not all(isinstance(t, str) and t != "" for t in value):
        raise RequestError("'tools' must hold non-empty strings only")
    for name in value:
        unicode_text(name, "tools")
    seen: dict[str, None] = {}
    for name in value:
        seen.setdefault(name, None)
    return list(seen)

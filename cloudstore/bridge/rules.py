"""What the bridge refuses before any driver runs.

Everything here answers one question about a call: may it reach the driver?
A refusal raises ``Refused`` with the reason; the bridge answers it as
``refused: <reason>``. The field rules themselves (paths, base64, sizes,
tools) are the drivers' own, from ``cloudstore.protocol.validate``, so the bridge and
the drivers can never disagree on what a legal path or datum is.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import CloudstoreError
from ..protocol import validate
from ..protocol.validate import Agent, RequestError
from ..runtime import strict_json
from .drivers import Contract

log = logging.getLogger("cloudstore.bridge")

FILE_PATH_OPS = frozenset({"file_read", "file_write", "file_remove", "file_append"})
FILE_DATA_OPS = frozenset({"file_write", "file_append"})


class Refused(CloudstoreError):
    """The call may not reach the driver; the message says why."""


def parse_line(line: bytes, what: str) -> dict[str, Any]:
    """One line as a strict JSON object: UTF-8, no NaN/Infinity, no repeated key.

    The drivers' own parser (``strict_json.object_line``, as ``validate.parse_request``
    calls it), so the bridge refuses exactly the lines a driver would.
    """
    try:
        return strict_json.object_line(line, what)
    except strict_json.StrictJSONError as exc:
        raise Refused(str(exc)) from exc


def named_agent(message: dict[str, Any], what: str) -> Agent:
    """The (owner, id) a proof line or request names; an absent owner is null."""
    try:
        return validate.agent(message)
    except RequestError as exc:
        raise Refused(f"{what}: {exc}") from exc


def check_same_agent(request: dict[str, Any], proved: Agent) -> None:
    """A request may only name the agent its caller proved to be (owner null != "")."""
    named = named_agent(request, "request")
    if named != proved:
        raise Refused("the request names another agent than the one proved")


def check_contract(request: dict[str, Any], contract: Contract) -> None:
    """Refuse job_* and file_* ops the driver's contract does not keep, and check
    the file and tools arguments the bridge answers for."""
    op = request.get("op")
    if not isinstance(op, str):
        raise Refused("'op' must be a string")
    if op.startswith("job_") and not contract.jobs:
        raise Refused(f"{op}: this driver keeps no jobs (its contract lacks \"jobs\")")
    if op.startswith("file_") and not contract.files:
        raise Refused(f"{op}: this driver keeps no files (its contract lacks \"files\")")
    try:
        if op in FILE_PATH_OPS:
            validate.file_path(validate.field(request, "path"))
        if op == "file_list":
            validate.file_path(validate.field(request, "folder"), "folder", folder=True)
        if op in FILE_DATA_OPS:
            validate.data(request)
        if op == "tools_narrow":
            validate.tools(request)
    except RequestError as exc:
        raise Refused(f"{op}: {exc}") from exc


def check_folders(agent_folder: str) -> None:
    """Refuse while the agent's folder or its chats/ (the driver's folder) is a link.

    Judged afresh on every call (lstat), because whoever writes the folder
    around them may swap one for a link at any time.
    The reply names the folder by its role, never by its host path: the
    agent who reads it has no business learning where the harness lives.
    """
    for folder, role in ((agent_folder, "the agent's folder"),
                         (os.path.join(agent_folder, "chats"), "the agent's chats/ folder")):
        if os.path.islink(folder):
            log.warning("refused: %s is a symbolic link", folder)
            raise Refused(f"{role} is a symbolic link; it is not followed")


def check_call(request: dict[str, Any], proved: Agent, contract: Contract, agent_folder: str) -> None:
    """Every check, in order: who, what the driver keeps, the arguments, the folders."""
    check_same_agent(request, proved)
    check_contract(request, contract)
    check_folders(agent_folder)


def error_reply(reason: str) -> dict[str, Any]:
    """The bridge's own answer, ``{"reply": "error", "error": "<word>: <why>"}``."""
    return {"reply": "error", "error": reason}


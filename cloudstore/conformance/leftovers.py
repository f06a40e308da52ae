"""What a run leaves in the store, said at its end.

Every check works on fresh agents, and the contract has no op that removes
an agent, so each run leaves what it wrote: on the README's folder about
8,800 files a full run (10 MB of data, 46 MB of disk), unsaid until a disk filled.
The suite cannot remove it safely itself (it speaks only the protocol, and
a store's folder or prefix may hold real agents beside the suite's), so it
says what it made (the agents, by the run's id prefix) and, where a
setting names a local folder (``file://``), how much that folder grew, and
how to get rid of it: a folder or prefix kept for the suite, removed whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .harness import Report
from .header import STORE_SETTINGS

#: How to be rid of what a run leaves: the only removal that cannot touch anyone else's agents.
HOW_TO_REMOVE = ("the contract has no op that removes an agent, so they stay: run lnk-store-check on a folder "
                 "or bucket prefix kept for it, and delete that folder or prefix when done")


@dataclass(frozen=True)
class Tally:
    """Files and bytes under one local folder a setting names."""

    setting: str
    folder: str
    files: int
    bytes: int


def local_folders(env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The store settings naming an existing local folder (``*_URL=file:///...``), and the folder: those
    given (``env``), else this environment's :data:`~.header.STORE_SETTINGS` (never any other variable:
    an unrelated ``file:///`` would be a walk of the whole disk)."""
    here = os.environ if environ is None else environ
    settings = env if env else {k: here[k] for k in STORE_SETTINGS if k in here}
    found: dict[str, str] = {}
    for key, value in settings.items():
        if key.endswith("_URL") and value.startswith("file://"):
            folder = unquote(urlsplit(value).path)
            if os.path.isabs(folder) and os.path.isdir(folder):
                found[key] = folder
    return found


def count(setting: str, folder: str) -> Tally:
    """Every regular file below ``folder`` and their bytes (links are not followed)."""
    files = size = 0
    for top, _dirs, names in os.walk(folder):
        for name in names:
            try:
                stat = os.lstat(os.path.join(top, name))
            except OSError:
                continue  # removed while counted (a driver's temporary file)
            files += 1
            size += stat.st_size
    return Tally(setting, folder, files, size)


def tally(env: Mapping[str, str]) -> list[Tally]:
    return [count(setting, folder) for setting, folder in sorted(local_folders(env).items())]


def grown(before: list[Tally], after: list[Tally]) -> list[Tally]:
    """How much each folder counted in both grew (files and bytes added, at least 0)."""
    first = {t.setting: t for t in before}
    return [Tally(t.setting, t.folder, max(t.files - first[t.setting].files, 0),
                  max(t.bytes - first[t.setting].bytes, 0))
            for t in after if t.setting in first and t.folder == first[t.setting].folder]


def summary(report: Report, growth: list[Tally]) -> list[str]:
    """The lines saying what the run left in the store and how to remove it (none when it made nothing)."""
    lines: list[str] = []
    agents = len(set(report.agents))
    if agents:
        lines.append(f"left in the store: {agents} agents named {report.agent_prefix}* (with their "
                     f"conversations, jobs and files); {HOW_TO_REMOVE}")
    for t in growth:
        lines.append(f"{t.setting}'s folder {t.folder} grew by {t.files} files, {t.bytes / 1e6:.1f} MB during "
                     f"the run")
    return lines


def as_json(report: Report, growth: list[Tally]) -> dict[str, object]:
    """The same, for the JSON report."""
    return {
        "agents": len(set(report.agents)), "agent_prefix": report.agent_prefix, "how_to_remove": HOW_TO_REMOVE,
        "folders": [{"setting": t.setting, "folder": t.folder, "files_added": t.files, "bytes_added": t.bytes}
                    for t in growth],
    }

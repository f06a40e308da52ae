"""``lnk-store-check --json PATH``: the run as one JSON document, for CI dashboards.

The result lines are for people; a dashboard would have to parse them with
a regex that breaks the day a message holds two spaces.  The document says
the same things as fields: what was judged (the header's program, contract,
store and mode), how the run ended (``outcome``: ``passed``, ``failed``,
``setup error`` or ``usage error``, and the exit status), each check (name,
label, family, mode, outcome ``pass`` / ``fail`` / ``not judged``,
duration in ms, message) and what the run left in the store.  ``schema``
names its shape; a field added later is added, never renamed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from .harness import Report, Result

SCHEMA = "lnk-store-check report 1"


def outcome(result: Result) -> str:
    return "not judged" if result.unjudged else "pass" if result.passed else "fail"


def message(result: Result) -> str:
    """The result line's words after the time: what was expected and what came back, or why not judged."""
    if result.unjudged:
        return result.unjudged
    return "" if result.passed else f"{result.what}: expected {result.expected}; got {result.got}"


def check_entry(result: Result) -> dict[str, Any]:
    return {"name": result.name, "label": result.label or result.name, "family": result.family,
            "mode": result.mode, "outcome": outcome(result), "duration_ms": round(result.ms, 1),
            "message": message(result)}


def document(*, argv: Sequence[str], settings: Mapping[str, str], mode: str, code: int, run_outcome: str,
             report: Report | None = None, contract: Mapping[str, Any] | None = None, error: str = "",
             left: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole report; ``report`` None for a run stopped before any check (``error`` says why)."""
    results = report.results if report is not None else []
    return {
        "schema": SCHEMA,
        "program": list(argv),
        "contract": dict(contract) if contract is not None else None,
        "store": dict(settings),
        "mode": mode,
        "outcome": run_outcome,
        "exit": code,
        "error": error,
        "summary": {"passed": report.passed if report else 0, "failed": report.failed if report else 0,
                    "not_judged": report.unjudged if report else 0,
                    "seconds": round(report.seconds, 3) if report else 0.0},
        "checks": [check_entry(r) for r in results],
        "not_kept": dict(report.not_kept) if report else {},
        "notes": list(report.notes) if report else [],
        "left_in_store": dict(left) if left is not None else None,
    }


def write(stream: TextIO, doc: Mapping[str, Any]) -> None:
    json.dump(doc, stream, indent=2, ensure_ascii=False)
    stream.write("\n")
    stream.flush()

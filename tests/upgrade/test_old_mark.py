"""Issue 41, finding 4: drivers before the shards read a ``job_mark`` that HEAD's changes never moved.

0.3.0, 0.4.0 and 0.4.1 read only the single ``a/<owner>/<id>/mark``; HEAD
(since 0.5.0) writes one of 128 shards per change of waiting.  Beside HEAD,
their ``job_mark`` answered one number while HEAD put, shifted and removed
jobs in waiting: a runner of theirs never woke.  Now HEAD's first change of
an agent in a process overwrites that mark with a refusal their
``job_mark`` fails on (job_mark.py, ``OldMarks``), and writes it again after
an old driver's change renumbered it (once HEAD's process has listed the
mark).  The contract's promise, held from the old side: after HEAD changes
waiting, the old ``job_mark`` answers an error or another number, never the
one before.  Fails with 0.5.0 as HEAD (``CLOUDSTORE_AS_HEAD=0.5.0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from releases import Driver, as_head

#: The releases whose job_mark reads the single old mark.
BEFORE_SHARDS = ("0.3.0", "0.4.0", "0.4.1")


def _mark(driver: Driver) -> Any:
    """An old driver's job_mark: its number, or "error" (what a refusal must give)."""
    reply = driver("job_mark")
    if reply.get("reply") == "error":
        return "error"
    assert reply.get("reply") == "mark" and isinstance(reply["mark"], int), reply
    return reply["mark"]


def _job(job_id: str, due: float = 4_000_000_000) -> dict[str, Any]:
    return {"id": job_id, "spec": {"do": job_id}, "due": due}


#: HEAD's changes of waiting: each op, and what it must answer.
CHANGES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("job_put", {"place": "waiting", "job": _job("h1")}, {"reply": "done"}),
    ("job_shift", {"id": "h1", "from": "waiting", "to": "firing"}, {"reply": "found", "found": True}),
    ("job_shift", {"id": "h1", "from": "firing", "to": "waiting"}, {"reply": "found", "found": True}),
    ("job_remove", {"place": "waiting", "id": "h1"}, {"reply": "found", "found": True}),
]


@pytest.mark.parametrize("old_release", BEFORE_SHARDS)
def test_old_job_mark_never_stays_when_head_changes_waiting(
        old_release: str, fleet: Callable[[str], Driver]) -> None:
    """Each HEAD change of waiting, with an old writer renumbering the mark before it (but the first)."""
    head, old = fleet(as_head()), fleet(old_release)
    for i, (op, args, reply) in enumerate(CHANGES):
        if i:  # an old driver's own change: the single mark holds a number again, which old readers see
            assert old("job_put", place="waiting", job=_job(f"old{i}")) == {"reply": "done"}
            assert isinstance(_mark(old), int)
            head("job_mark")  # HEAD's process lists the mark (its runners poll it) and sees the number
        before = _mark(old)
        assert head(op, **args) == reply
        after = _mark(old)
        assert after == "error" or after != before, (
            f"{old_release}'s job_mark stayed {before} after {as_head()}'s {op} {args}")


@pytest.mark.parametrize("old_release", BEFORE_SHARDS)
def test_both_sides_keep_working_beside_the_refusal(old_release: str, fleet: Callable[[str], Driver]) -> None:
    """The refusal costs neither side its jobs: the old driver's jobs ops still answer, HEAD's mark still moves
    on an old driver's change, and each sees the other's jobs."""
    head, old = fleet(as_head()), fleet(old_release)
    assert head("job_put", place="waiting", job=_job("h")) == {"reply": "done"}
    assert _mark(old) == "error"
    seen = head("job_mark")["mark"]
    assert old("job_put", place="waiting", job=_job("o")) == {"reply": "done"}
    assert head("job_mark")["mark"] != seen
    assert sorted(j["id"] for j in old("job_list", place="waiting")["jobs"]) == ["h", "o"]
    assert sorted(j["id"] for j in head("job_list", place="waiting")["jobs"]) == ["h", "o"]
    assert old("job_count", place="waiting") == {"reply": "count", "count": 2}

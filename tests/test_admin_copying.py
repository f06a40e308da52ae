"""What migrate writes for a hostile job record: the record as it is, never a crash of the whole copy.

Found by tests/test_hostile_fuzz.py (seed 495379695 on gcs, ``LNK_FUZZ_SEED=495379695``): a job record
whose ``places`` was a string made ``translator`` raise ``AttributeError`` in a copy thread, and the
migration of every other object stopped with it.
"""

from __future__ import annotations

import json

import pytest

from cloudstore.admin.copying import refusal, translator
from cloudstore.admin.walk import Key
from cloudstore.generations import frame
from cloudstore.store.model import compact

NONCE = "0" * 32


def job_key(root: str) -> Key:
    rel = "agents/o/a/jobs/j"
    return Key(key=root + rel, rel=rel, kind="job", agent=("o", "a"), size=0, modified=0.0, version=None)


@pytest.mark.parametrize("places", ["a string", 7, ["a", "list"], True])
def test_a_job_record_whose_places_are_no_object_is_copied_as_it_is(places: object) -> None:
    raw = frame(NONCE, compact({"places": places}).encode("ascii"))
    translate = translator("src/", "dst/")
    assert translate(job_key("src/"), raw) == raw
    assert refusal("src/", job_key("src/"), raw) is None


def test_a_job_records_due_entry_is_still_moved_to_the_destinations_prefix() -> None:
    """The translation the fix must keep: an entry under the source's due index, renamed under the destination's."""
    record = {"places": {"waiting": {"entry": "src/_due/x"}}}
    raw = frame(NONCE, compact(record).encode("ascii"))
    out = translator("src/", "dst/")(job_key("src/"), raw)
    assert json.loads(out.split(b"\n", 1)[1]) == {"places": {"waiting": {"entry": "dst/_due/x"}}}

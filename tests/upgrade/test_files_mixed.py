"""Issue 41, finding 2: a driver of 0.4 writing an agent's files after the new release learnt its ledger clean.

HEAD's ``Files`` skips old keys (0.4's layout, ``f/<path>`` with no ``%``)
once an agent's ledger says none is left: a hint for cost.  A driver of 0.4
run afterwards (a mixed fleet, a rollback) writes an old key anyway.  At
c81d270 (0.5.0) the listing then showed the file while a read answered null
and a write at version 0 answered ``wrote 1`` again: version 1 with two
bodies.  HEAD must never contradict itself: what a listing shows, a read
reads and a write builds on, whatever the ledger says.

Each test runs with HEAD as the new driver and, to show it fails there,
with c81d270 (``0.5.0``) in its place (``xfail(strict=True)``).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from releases import HEAD, Driver
from support import StoreUnderTest

#: The new driver: this checkout, and the previous release, which had the bug (its case must fail).
NEW = [HEAD, pytest.param("0.5.0", marks=pytest.mark.xfail(strict=True, reason="issue 41 finding 2 at c81d270"))]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def wrote(version: int) -> dict[str, Any]:
    return {"reply": "wrote", "version": version}


def learn_clean(new: Driver) -> None:
    """The new driver writes a file and lists the folder: it now knows the agent's ledger, which says clean."""
    assert new("file_write", path="skills/a.md", data=b64("a"), version=0) == wrote(1)
    assert new("file_list", folder="skills") == {"reply": "files", "files": ["skills/a.md"]}


@pytest.mark.parametrize("release", NEW)
def test_a_listing_that_meets_an_old_file_makes_reads_and_writes_find_it(release: str, fleet: Any,
                                                                        store: StoreUnderTest) -> None:
    """The issue's case: list, read, write at 0, then at 1; a fresh process agrees."""
    new = fleet(release)
    learn_clean(new)
    old = fleet("0.4.0")
    assert old("file_write", path="skills/z.md", data=b64("z by 0.4"), version=0) == wrote(1)
    old.close()
    assert new("file_list", folder="skills") == {"reply": "files", "files": ["skills/a.md", "skills/z.md"]}
    assert new("file_read", path="skills/z.md") == {"reply": "file", "file": {"data": b64("z by 0.4"), "version": 1}}
    assert new("file_write", path="skills/z.md", data=b64("z again"), version=0) == {"reply": "stale", "version": 1}
    assert new("file_write", path="skills/z.md", data=b64("z by new"), version=1) == wrote(2)
    fresh = fleet(release)  # nothing remembered: the store alone says it
    assert fresh("file_read", path="skills/z.md") == {"reply": "file", "file": {"data": b64("z by new"), "version": 2}}
    assert fresh("file_list", folder="skills") == {"reply": "files", "files": ["skills/a.md", "skills/z.md"]}


@pytest.mark.parametrize("release", NEW)
def test_a_first_write_that_meets_an_old_file_builds_on_it(release: str, fleet: Any,
                                                           store: StoreUnderTest) -> None:
    """No listing in between: the write's stub create beside the new key finds the old file, and the write
    is redone on it before the reply (stale at 0; at 1, version 2)."""
    new = fleet(release)
    learn_clean(new)
    old = fleet("0.4.0")
    assert old("file_write", path="skills/y.md", data=b64("y by 0.4"), version=0) == wrote(1)
    assert old("file_write", path="skills/x.md", data=b64("x by 0.4"), version=0) == wrote(1)
    old.close()
    assert new("file_write", path="skills/y.md", data=b64("y"), version=0) == {"reply": "stale", "version": 1}
    assert new("file_read", path="skills/y.md") == {"reply": "file", "file": {"data": b64("y by 0.4"), "version": 1}}
    assert new("file_append", path="skills/x.md", data=b64("+")) == wrote(2)
    fresh = fleet(release)
    assert fresh("file_read", path="skills/x.md") == {"reply": "file", "file": {"data": b64("x by 0.4+"),
                                                                              "version": 2}}
    assert fresh("file_list", folder="skills") == {"reply": "files",
                                                   "files": ["skills/a.md", "skills/x.md", "skills/y.md"]}

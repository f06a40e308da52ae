"""The harness itself: each release's tree is its own commit's code, and a missing commit fails loudly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
import releases as rel
from releases import HEAD, Driver, ReleaseUnavailable


@pytest.mark.parametrize("name", sorted(rel.releases()))
def test_tree_is_the_commits_code(name: str) -> None:
    """The process runs the release's own modules (not the checkout's, not the installed package's)."""
    keys = "store/keys.py" if (rel.tree(name) / "cloudstore" / "store" / "keys.py").exists() else "keys.py"  # 0.6.0 on
    module = "cloudstore." + keys[:-3].replace("/", ".")
    code = f"import {module} as k, cloudstore.driver as d; print(k.__file__); print(d.__file__)"
    argv = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(rel.tree(name))!r}); {code}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert all(path.startswith(str(rel.tree(name))) for path in out), out
    got = (rel.tree(name) / "cloudstore" / keys).read_bytes()
    want = subprocess.run(["git", "-C", str(rel.REPO), "show", f"{rel.releases()[name].commit}:cloudstore/{keys}"],
                          capture_output=True, check=True).stdout
    assert got == want


def test_previous_is_a_release() -> None:
    assert rel.previous() in rel.releases()


def test_missing_commit_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit not in the clone (a shallow clone) is an error saying what to do, never a skip."""
    fake = {"9.9.9": rel.Release("9.9.9", "0" * 40, 9, "none")}
    monkeypatch.setattr(rel, "releases", lambda: fake)
    with pytest.raises(ReleaseUnavailable, match="0{40}.*fetch --unshallow"):
        rel.tree("9.9.9")


def test_drivers_of_two_releases_share_a_store(fleet: Callable[[str], Driver]) -> None:
    """HEAD and the previous release answer each other's writes: the harness reaches one store from both."""
    head, old = fleet(HEAD), fleet(rel.previous())
    assert head("append", thread="t", event={"seq": 1}) == {"reply": "done"}
    assert old("read", thread="t", first=1) == {"reply": "events", "events": [{"seq": 1}]}

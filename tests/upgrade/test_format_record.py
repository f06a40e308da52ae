"""The store's format record (store_format.py) across releases: written before the first write, never by a
read; a release below the record's reader refuses every op, below its writer every write; a malformed
record refuses everything; nothing is changed by a refused op; the admin tool shows and lowers it.

"A newer store" is made by writing the record a later release would (reader or writer 5): so HEAD here
is the old driver meeting a newer store, which is what every release will be one day.  Each case runs
HEAD's driver processes on the folder and on moto (``fleet``), and fails on c81d270, which reads no
record (``CLOUDSTORE_AS_HEAD=0.5.0``: it answers every op of a format-5 store as if it could read it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import releases as rel
from releases import Driver, admin, as_head
from support import StoreUnderTest, environment, location_of

import cloudstore
from cloudstore.gate import store_format
from cloudstore.generations import Overwrite, RetryingStore
from cloudstore.settings import open_backend
from cloudstore.store.keys import AgentKeys

#: One op of every family that reads, and one that writes (each valid: only the record may refuse it).
#: A store format no release has written yet: what a store of a release after this one asks.
NEWER = store_format.FORMAT + 1
READS = [("last", {"thread": "t"}), ("read", {"thread": "t"}), ("threads", {}), ("leases", {"lapse_ms": 1000}),
         ("job_list", {"place": "waiting"}), ("job_next", {}), ("job_mark", {}), ("file_read", {"path": "skills/a"}),
         ("file_list", {"folder": "skills"}), ("tools_list", {})]
WRITES = [("append", {"thread": "t", "event": {"seq": 2}}), ("take", {"thread": "l", "holder": "h", "lapse_ms": 9000}),
          ("job_put", {"place": "waiting", "job": {"id": "j2", "spec": {}, "due": 5}}),
          ("file_write", {"path": "skills/b", "data": "aGk=", "version": 0}),
          ("tools_narrow", {"thread": "t", "tools": ["x"]}), ("remove", {"thread": "t"})]


@contextmanager
def raw(store: StoreUnderTest) -> Iterator[tuple[RetryingStore, str]]:
    """The test's store with no gate (as another release, or another credential holder, writes it)."""
    with environment(store.env):
        location = location_of(store)
        yield RetryingStore(open_backend(location, create=False)), location.prefix


def plant(store: StoreUnderTest, body: bytes) -> None:
    with raw(store) as (s, root):
        s.put(root + store_format.KEY, body, Overwrite())


def record_of(store: StoreUnderTest) -> dict[str, Any] | None:
    with raw(store) as (s, root):
        got = s.get(root + store_format.KEY)
    return None if got is None else json.loads(got.data)


def agent_data(store: StoreUnderTest) -> dict[str, str | None]:
    """Every key of the store and its version, but the store's own (the record, the probe's keys)."""
    with raw(store) as (s, root):
        return {i.key: i.version for i in s.list(root) if not i.key[len(root):].startswith(("_format", "_probe/"))}


def some_data(d: Driver) -> None:
    """Something of every family in the store, then ``d`` ended: its work after a reply (packing, a file's
    stub) is done before the test looks at what is stored."""
    assert d("append", thread="t", event={"seq": 1}) == {"reply": "done"}
    assert d("job_put", place="waiting", job={"id": "j", "spec": {}, "due": 1})["reply"] == "done"
    assert d("file_write", path="skills/a", data="aGk=", version=0) == {"reply": "wrote", "version": 1}
    assert d("file_list", folder="skills") == {"reply": "files", "files": ["skills/a"]}
    assert d.close() == 0


def test_the_record_is_written_before_the_first_write_and_never_by_a_read(
        fleet: Callable[[str], Driver], store: StoreUnderTest) -> None:
    d = fleet(as_head())
    for op, args in READS:
        if op != "file_list":  # a first listing writes the agent's file ledger: a write (files.py)
            assert d(op, **args)["reply"] != "error", op
    assert record_of(store) is None, "a read wrote the record: a store only read must be left as it was"
    assert d("append", thread="t", event={"seq": 1}) == {"reply": "done"}
    record = record_of(store)
    assert record is not None and (record["reader"], record["writer"]) == (3, 3)
    assert record["by"] == store_format.release_name() and record["features"] == []


@pytest.mark.parametrize("which", ["reader", "writer"])
def test_a_newer_store_is_refused_and_nothing_is_changed(
        fleet: Callable[[str], Driver], store: StoreUnderTest, which: str) -> None:
    some_data(fleet(as_head()))
    newer = {"reader": NEWER if which == "reader" else 3, "writer": NEWER, "features": [], "by": "cloudstore 9.0.0"}
    plant(store, json.dumps(newer).encode())
    before = agent_data(store)
    d = fleet(as_head())  # a fresh process: it reads the record before its first op
    for op, args in READS:
        got = d(op, **args)
        if which == "reader":
            assert got["reply"] == "error", (op, got)
            assert f"needs a reader of store format {NEWER}" in got["error"] and "cloudstore 9.0.0" in got["error"]
            assert got["error"].endswith("nothing was changed"), got
        else:
            assert got["reply"] != "error", (op, got)  # reads are answered below the writer version
    for op, args in WRITES:
        got = d(op, **args)
        assert got["reply"] == "error", (op, got)
        assert f"needs a {which} of store format {NEWER}" in got["error"], got
        assert got["error"].endswith("nothing was changed"), got
    assert agent_data(store) == before
    assert record_of(store) == newer  # never lowered by an older release


@pytest.mark.parametrize("body", [
    b"not json", b"[3, 3]", b'{"reader": "3", "writer": 3}', b'{"reader": 3}', b'{"reader": 0, "writer": 3}',
    b'{"reader": 3, "writer": 3, "features": "x"}', b'{"reader": 3, "writer": 3, "by": 7}', b"\xff" * 70_000,
], ids=["text", "array", "string", "no-writer", "zero", "features", "by", "huge"])
def test_a_malformed_record_refuses_every_op(fleet: Callable[[str], Driver], store: StoreUnderTest,
                                             body: bytes) -> None:
    some_data(fleet(as_head()))
    plant(store, body)
    before = agent_data(store)
    d = fleet(as_head())
    for op, args in READS[:2] + WRITES[:2]:
        got = d(op, **args)
        assert got["reply"] == "error" and "format record (_format) is malformed" in got["error"], (op, got)
    assert agent_data(store) == before


def test_an_unknown_feature_is_refused(fleet: Callable[[str], Driver], store: StoreUnderTest) -> None:
    plant(store, json.dumps({"reader": 3, "writer": 3, "features": ["event-compression"]}).encode())
    got = fleet(as_head())("last", thread="t")
    assert got["reply"] == "error" and "knowing the features event-compression" in got["error"], got


def test_a_lowered_record_is_raised_before_the_first_write(fleet: Callable[[str], Driver],
                                                         store: StoreUnderTest) -> None:
    plant(store, json.dumps({"reader": 1, "writer": 1, "features": [], "by": "an operator", "later": 1}).encode())
    d = fleet(as_head())
    assert d("last", thread="t") == {"reply": "last", "last": 0}
    assert record_of(store)["reader"] == 1  # type: ignore[index]  # a read leaves it
    assert d("append", thread="t", event={"seq": 1}) == {"reply": "done"}
    record = record_of(store)
    assert record is not None and (record["reader"], record["writer"], record["later"]) == (3, 3, 1)


def test_the_admin_tool_shows_refuses_and_lowers_only_where_proved(fleet: Callable[[str], Driver],
                                                                   store: StoreUnderTest) -> None:
    some_data(fleet(as_head()))
    shown = admin(as_head(), store, "format", store.url, "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["record"]["reader"] == 3 and report["layouts"]["3"] >= 1
    assert {r["release"]: r["may_run"] for r in report["recordless_releases"]} == {
        "0.3.0": False, "0.4.0": False, "0.4.1": False, "0.5.0": True}
    inspected = admin(as_head(), store, "inspect", store.url, "--json")
    assert json.loads(inspected.stdout)["format"]["reader"] == 3
    refused = admin(as_head(), store, "format", store.url, "--lower", "2")
    assert refused.returncode == 1 and "layout 3" in refused.stderr, refused.stderr
    assert admin(as_head(), store, "format", store.url, "--lower", "3").returncode == 0
    plant(store, json.dumps({"reader": NEWER, "writer": NEWER}).encode())
    newer = admin(as_head(), store, "inspect", store.url)
    assert newer.returncode == 1 and f"needs a reader of store format {NEWER}" in newer.stderr, newer.stderr
    assert admin(as_head(), store, "format", store.url).returncode == 0  # it shows a store it must not read


def test_a_release_says_its_version_and_store_formats() -> None:
    """Finding 5: every build from 06d9b75 to c81d270 printed ``0.3.0`` though their layouts differ; HEAD
    prints a version of its own and the store formats it reads and writes, and so will every release after."""
    printed = {}
    for release in [*rel.releases(), as_head()]:
        argv = rel.driver_command(release, "lnk-bucket-store") + ["--version"]
        printed[release] = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    old = [printed[r] for r in rel.releases()]
    before = [printed[r] for r in rel.releases() if rel.releases()[r].format < 4]
    assert set(before) == {"lnk-bucket-store 0.3.0"}  # the fact the matrix names them by commit for
    assert printed["0.6.0"] == "lnk-bucket-store 0.6.0 (store format 4; reads formats 1 to 4)"
    assert printed["0.7.0"] == "lnk-bucket-store 0.7.0 (store format 5; reads formats 1 to 5)"
    assert printed[as_head()] == (f"lnk-bucket-store {cloudstore.__version__} (store format {store_format.FORMAT}; "
                                  f"reads formats {store_format.READS_FROM} to {store_format.FORMAT})")
    assert printed[as_head()] not in old
    assert store_format.FORMAT > max(r.format for r in rel.releases().values())


def test_a_newer_store_is_named_as_such_where_its_objects_fail_a_read(fleet: Callable[[str], Driver],
                                                                      store: StoreUnderTest,
                                                                      agent: dict[str, Any]) -> None:
    """A store of a newer format may hold objects this release cannot parse; an op that fails on one
    answers the record's refusal (what to do), not an internal error, even where the read came first."""
    some_data(fleet(as_head()))
    with raw(store) as (s, root):
        file_key = AgentKeys(root, agent["owner"], agent["id"]).file("skills/a")
        s.put(file_key, b"\x00 a body of a newer format \xff", Overwrite())
    d = fleet(as_head())
    assert d("file_read", path="skills/a")["reply"] == "error"  # a malformed object, as before
    plant(store, json.dumps({"reader": NEWER, "writer": NEWER, "by": "cloudstore 9.0.0"}).encode())
    got = fleet(as_head())("file_read", path="skills/a")
    assert got["reply"] == "error" and f"needs a reader of store format {NEWER}" in got["error"], got

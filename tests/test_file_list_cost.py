"""``file_list`` answered from listings: what it costs from a fresh process, and that it never lies.

A file is one object for its whole life (removal leaves a tombstone), so a
folder's listing names live files and tombstones alike.  Since this layout
the stored size of each object says which it is, and a per-agent ledger
settles objects older than the layout (files.py); so a fresh ``file_list``
of a full folder costs its listing pages and a few requests, not a read per
object.  The requests are counted at a proxy in front of moto and
fake-gcs-server (every request the driver process sends) and, on the
folder, by the driver's own count of backend calls (``LNK_STORE_LOG=debug``).

A full folder (4,096 files and as many tombstones) is listed by the
request-count guard (tests/test_request_counts.py, "file_list"): its answer
and its requests, counted at the proxy, against the bounds CI holds.

The folders are written straight through the seam, in parallel, with
the bodies files.py itself makes (``files.body``): the driver's ops would
take minutes for 8,192 objects on moto.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pytest
from faults.http_proxy import FaultProxy, Rule, Seen
from faults.rounds import gate_kind
from support import BACKENDS, StoreUnderTest, fresh_agent, make_store, service_of

from cloudstore.generations import Create, RetryingStore, frame
from cloudstore.protocol.client import call_once
from cloudstore.protocol.validate import Agent
from cloudstore.store.files import GONE_RESIDUE, LIVE_RESIDUE, SIZE_MODULUS, _join, body

#: More requests than its listing pages a fresh ``file_list`` may make (issue 31): the ledger's read, and room.
EXTRA = 3
LONG = "skills/" + "long-" * 100 + "/SKILL.md"  # its key is hashed (``f/~/<sha-256>``): its path is in its header


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class Counted:
    """A store location, and how a fresh driver process's requests to it are counted."""

    backend: str
    direct: StoreUnderTest  # the emulator itself, for filling fast
    through: StoreUnderTest  # what the counted driver is given (through the proxy on an emulator)
    proxy: FaultProxy | None

    def fresh(self, request: dict[str, Any], *rules: Rule) -> tuple[dict[str, Any], int, int]:
        """``request`` answered by a fresh ``call`` process, ``rules`` at the proxy: (reply, listing requests,
        all requests)."""
        env = dict(self.through.env, LNK_STORE_LOG="debug")
        if self.proxy is not None:
            self.proxy.clear()
            for rule in rules:
                self.proxy.add(rule)
        lines, err, code = call_once(self.through.program, request, env=env, timeout=120)
        assert code == 0 and len(lines) == 1, err[-2000:]
        reply = json.loads(lines[0])
        if self.proxy is None:  # the folder: the driver's own count of backend calls, from its log
            found = re.findall(r"op=file_list reply=\S+ requests=(\d+)", err)
            assert found, err[-2000:]
            return reply, 2, int(found[-1])  # the folder's two listings are one backend call each
        seen = [s for s in self.proxy.requests() if gate_kind(s) is None]  # the gate's: test_format_gate_cost.py
        return reply, sum(1 for s in seen if is_listing(self.backend, s)), len(seen)


#: A page of a listing, as the proxy sees its target (a GET): S3 ListObjectsV2, GCS objects.list.
LISTING = {"moto": r"[?&]list-type=2", "gcs": r"^/storage/v1/b/[^/]+/o(\?|$)"}


def is_listing(backend: str, seen: Seen) -> bool:
    """Whether a request the proxy saw is a page of a listing (S3 ListObjectsV2, GCS objects.list)."""
    return seen.method == "GET" and re.search(LISTING["moto" if backend == "moto" else "gcs"], seen.target) is not None


@pytest.fixture(params=BACKENDS)
def counted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Counted]:
    base = make_store(request.param, request, tmp_path_factory, own_bucket=True)  # 8,192 objects: their own
    for key, value in base.env.items():  # service_of (the filler) reads the environment
        monkeypatch.setenv(key, value)
    if request.param == "file":
        yield Counted("file", base, base, None)
        return
    setting = "AWS_ENDPOINT_URL_S3" if request.param == "moto" else "STORAGE_EMULATOR_HOST"
    flavor = "s3" if request.param == "moto" else "gcs"
    with FaultProxy(base.env[setting], flavor=flavor) as proxy:
        yield Counted(request.param, base, replace(base, env=proxy.redirect(base.env)), proxy)


def wire(agent: Agent) -> dict[str, Any]:
    return {"id": agent.id, "owner": agent.owner}


def fill(counted: Counted, agent: Agent, live: list[str], gone: list[str], store: RetryingStore | None = None) -> None:
    """``live`` files (version 1) and tombstones (version 2: made, then removed) of ``agent``.

    The first file is written by the driver's own op, which makes the agent's
    ledger as any first file does; the rest straight through the seam, in
    parallel, as the driver would have written them (through ``store`` when
    given: the same store over a quicker backend, tests/request_counts.py).
    """
    service = service_of(counted.direct)
    reply = service.answer({"op": "file_write", "agent": wire(agent), "path": live[0], "data": b64(b"first"),
                            "version": 0})
    assert reply == {"reply": "wrote", "version": 1}, reply
    keys = service.space.keys(agent)
    store = store or service.space.store

    def put(path: str, removed: bool) -> None:
        header: dict[str, Any] = {"v": 2, "path": path, "gone": True} if removed else {"v": 1, "path": path}
        data = b"" if removed else f"# {path}\n".encode()
        store.put(keys.file(path), body(header, data, Create().lineage), Create())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: put(*item), [(p, False) for p in live[1:]] + [(p, True) for p in gone]))


def listing_of(counted: Counted, agent: Agent, folder: str) -> tuple[list[str], int, int]:
    reply, lists, total = counted.fresh({"op": "file_list", "agent": wire(agent), "folder": folder})
    assert reply["reply"] == "files", reply
    return reply["files"], lists, total


def sort_bytes(paths: list[str]) -> list[str]:
    return sorted(paths, key=lambda p: p.encode("utf-8"))


# --------------------------------------------------------------------------
# What it costs


def test_a_fresh_listing_of_files_the_driver_wrote_and_removed_costs_no_reads(counted: Counted) -> None:
    """Files made, removed, made again and removed by the driver's own ops (a serve process), then listed
    from a fresh one: listings and at most three requests more (eafe802: one read per object)."""
    agent = Agent(**fresh_agent())
    service = service_of(counted.direct)
    paths = [f"instructions/n{i:02d}.md" for i in range(40)]
    for i, path in enumerate(paths):
        assert service.answer({"op": "file_write", "agent": wire(agent), "path": path, "data": b64(b"x" * i),
                               "version": 0})["reply"] == "wrote"
        if i % 2:
            assert service.answer({"op": "file_remove", "agent": wire(agent), "path": path, "version": 1}) == {
                "reply": "found", "found": True}
    files, lists, total = listing_of(counted, agent, "instructions/")
    assert files == paths[0::2]
    assert total - lists <= EXTRA, f"{total} requests, {lists} of them listing pages"


# --------------------------------------------------------------------------
# What it shows


def test_the_listing_shows_live_files_never_tombstones_and_long_paths_by_name(counted: Counted) -> None:
    """Made, removed, made again, appended, long (hashed) paths live and removed, nested folders: a fresh
    listing and the writer's own agree with what was done, sorted by UTF-8 bytes."""
    agent = Agent(**fresh_agent())
    service = service_of(counted.direct)

    def op(**req: Any) -> dict[str, Any]:
        return service.answer({**req, "agent": wire(agent)})

    long_gone = LONG.replace("SKILL", "GONE")
    assert op(op="file_write", path="skills/a/SKILL.md", data=b64(b"a"), version=0)["version"] == 1
    assert op(op="file_write", path="skills/b.md", data=b64(b"b"), version=0)["version"] == 1
    assert op(op="file_remove", path="skills/b.md", version=1)["found"]
    assert op(op="file_write", path="skills/c.md", data=b64(b"c"), version=0)["version"] == 1
    assert op(op="file_remove", path="skills/c.md", version=1)["found"]
    assert op(op="file_write", path="skills/c.md", data=b64(b"again"), version=0)["version"] == 2
    assert op(op="file_append", path="skills/\u00e9t\u00e9.md", data=b64(b"1"))["version"] == 1
    assert op(op="file_write", path=LONG, data=b64(b"long"), version=0)["version"] == 1
    assert op(op="file_write", path=long_gone, data=b64(b"long"), version=0)["version"] == 1
    assert op(op="file_remove", path=long_gone, version=1)["found"]
    assert op(op="file_write", path="instructions/i.md", data=b64(b"i"), version=0)["version"] == 1
    want = sort_bytes(["skills/a/SKILL.md", "skills/c.md", "skills/\u00e9t\u00e9.md", LONG])
    assert op(op="file_list", folder="skills")["files"] == want
    files, _, _ = listing_of(counted, agent, "skills/")
    assert files == want
    assert listing_of(counted, agent, "skills/a")[0] == ["skills/a/SKILL.md"]
    assert listing_of(counted, agent, "instructions")[0] == ["instructions/i.md"]
    # every state by size: a body of each length residue, live and removed
    for n in range(SIZE_MODULUS):
        path = f"skills/s/{n:02d}"
        op(op="file_write", path=path, data=b64(b"z" * n), version=0)
        if n % 3 == 0:
            op(op="file_remove", path=path, version=1)
    want_s = [f"skills/s/{n:02d}" for n in range(SIZE_MODULUS) if n % 3]
    assert listing_of(counted, agent, "skills/s")[0] == want_s


def test_every_body_of_this_layout_has_the_size_of_its_state() -> None:
    """Whatever the data's length and the write's lineage, a live body's stored size is ``LIVE_RESIDUE`` and a
    tombstone's ``GONE_RESIDUE`` modulo ``SIZE_MODULUS``, and its header line is the unpadded one, spaced."""
    for lineage in (("0",), ("?",), tuple(f"{i:016x}" for i in range(16)), ("a" * 16, "0")):
        framed = len(frame("0" * 32, b"", lineage))
        for n in range(70):
            for gone in (False, True):
                header = {"v": 7, "path": "skills/x", **({"gone": True} if gone else {})}
                payload = body(header, b"d" * n, lineage)
                want = GONE_RESIDUE if gone else LIVE_RESIDUE
                assert (framed + len(payload)) % SIZE_MODULUS == want
                assert payload.startswith(_join(header).rstrip(b"\n"))


# --------------------------------------------------------------------------
# A store written by the layout before


def old_body_of_size(header: dict[str, Any], residue: int) -> bytes:
    """An old-layout body (no padding) of a live ``header`` whose stored size, framed at creation, has
    ``residue``: a live file whose size says removed, say."""
    framed = len(frame("0" * 32, b"", Create().lineage))
    raw = _join(header)
    return raw + b"d" * ((residue - framed - len(raw)) % SIZE_MODULUS)


def old_tombstone_path(stem: str, version: int, residue: int) -> str:
    """A path under ``stem`` whose old-layout tombstone (no padding), framed at creation, has ``residue``:
    a tombstone whose size says live, say."""
    framed = len(frame("0" * 32, b"", Create().lineage))
    for extra in range(SIZE_MODULUS):
        path = f"{stem}{'x' * extra}.md"
        if (framed + len(_join({"v": version, "path": path, "gone": True}))) % SIZE_MODULUS == residue:
            return path
    raise AssertionError("no path length gives the size wanted")


def test_a_store_of_the_layout_before_lists_correctly_and_cheaply_once_its_ledger_is_made(counted: Counted) -> None:
    """Old-layout objects (no ledger, sizes that say the wrong state: a tombstone sized as a live file, a
    live file as a tombstone) list correctly from a fresh process; the first listing makes the ledger, and
    the next fresh one costs listings + 3; a driver's rewrite of an old object is read once, then known."""
    agent = Agent(**fresh_agent())
    service = service_of(counted.direct)
    keys = service.space.keys(agent)
    store = service.space.store
    live = [f"skills/old/live{i}.md" for i in range(12)] + [LONG]
    gone = [old_tombstone_path(f"skills/old/gone{i}", 4, LIVE_RESIDUE if i % 2 == 0 else i % SIZE_MODULUS)
            for i in range(12)] + [LONG.replace("SKILL", "GONE")]
    for i, path in enumerate(live):  # every other one sized as if it were a tombstone
        raw = old_body_of_size({"v": 3, "path": path}, GONE_RESIDUE if i % 2 == 0 else i % SIZE_MODULUS)
        store.put(keys.file(path), raw, Create())
    for path in gone:  # every other one sized as if it were live
        store.put(keys.file(path), _join({"v": 4, "path": path, "gone": True}), Create())
    assert store.get(keys.file_ledger()) is None
    want = sort_bytes(live)
    assert listing_of(counted, agent, "skills")[0] == want  # reads them all, and makes the ledger
    assert store.get(keys.file_ledger()) is not None
    files, lists, total = listing_of(counted, agent, "skills")
    assert files == want
    assert total - lists <= EXTRA, f"{total} requests, {lists} of them listing pages"
    # the driver rewrites old objects in this layout: the ledger's entries no longer match, so they are read
    assert service.answer({"op": "file_remove", "agent": wire(agent), "path": live[0], "version": 3})["found"]
    assert service.answer({"op": "file_write", "agent": wire(agent), "path": gone[0], "data": b64(b"back"),
                           "version": 0}) == {"reply": "wrote", "version": 5}
    want = sort_bytes(live[1:] + [gone[0]])
    assert listing_of(counted, agent, "skills/old")[0] == sort_bytes([p for p in want if p.startswith("skills/old/")])
    assert listing_of(counted, agent, "skills")[0] == want
    # objects the ledger does not name whose sizes say neither state (foreign writers): read, never guessed
    odd_live, odd_gone = "skills/odd/live.md", old_tombstone_path("skills/odd/gone", 1, 7)
    store.put(keys.file(odd_live), old_body_of_size({"v": 1, "path": odd_live}, 9), Create())
    store.put(keys.file(odd_gone), _join({"v": 1, "path": odd_gone, "gone": True}), Create())
    assert listing_of(counted, agent, "skills/odd")[0] == [odd_live]


@pytest.mark.parametrize("counted", ["moto", "gcs"], indirect=True)
def test_a_listing_whose_ledger_cannot_be_written_still_answers_right(counted: Counted) -> None:
    """The store refuses the ledger's write (403): the listing that made it answers from what it read, and
    the next one, finding none, reads again; nothing is ever guessed from a size alone."""
    agent = Agent(**fresh_agent())
    service = service_of(counted.direct)
    keys = service.space.keys(agent)
    store = service.space.store
    live, gone = "skills/r/live.md", old_tombstone_path("skills/r/gone", 2, LIVE_RESIDUE)
    store.put(keys.file(live), old_body_of_size({"v": 1, "path": live}, GONE_RESIDUE), Create())
    store.put(keys.file(gone), _join({"v": 2, "path": gone, "gone": True}), Create())
    assert counted.proxy is not None
    ledger = keys.file_ledger()
    if counted.backend == "moto":
        match: dict[str, Any] = {"method": "PUT", "path": re.escape(ledger) + r"(\?|$)"}
    else:
        match = {"method": "POST", "path": r"^/upload/", "content": re.escape(ledger.encode()) + b'"'}
    for _ in range(2):
        refused = Rule("fail", status=403, times=100, **match)
        reply, _, _ = counted.fresh({"op": "file_list", "agent": wire(agent), "folder": "skills"}, refused)
        assert refused.fired >= 1
        assert reply == {"reply": "files", "files": [live]}
        assert store.get(ledger) is None

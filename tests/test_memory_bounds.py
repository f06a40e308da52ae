"""A serve process's memory is bounded by bytes, whatever an agent makes it remember (issues 12 and 44).

It once kept 64 recent events of every conversation with no limit on
conversations (10 threads x 64 events x 100 KB kept 61 MiB), and up to 20,000
records of up to 64 KiB (one job_count over 200 records of 60 KB added
279 MiB).  Now every memory is a byte-budgeted LRU (cloudstore/store/cache.py).

Issue 44: what it remembered per agent and key besides grew with the agents
it met (the mark's shard picker, about 15 kB a busy agent, never dropped)
or was counted by number (4,096 heads written, whatever their size: 300
heads with 40 KB holders held 25 MiB).  Each is now a ``Bounded`` map whose
budget is part of ``cache.BOOKKEEPING_BUDGET``; the tests below hold every
``Bounded`` of the package to the list in docs/design.md, and measure with
tracemalloc that each memory holds what its budget says.  The process as a
whole, over minutes or hours: tests/test_soak.py.
"""

from __future__ import annotations

import ast
import gc
import os
import random
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import Session

import cloudstore
from cloudstore.protocol.service import Service
from cloudstore.settings import open_store, parse_location
from cloudstore.store import confirmed, conversations, files, heads, job_mark, keys, space
from cloudstore.store.cache import BOOKKEEPING_BUDGET, CACHE_BUDGET, ENTRY_OVERHEAD, MEMORY_BUDGET, Bounded
from cloudstore.store.space import Space

MIB = 1024 * 1024


def test_bounded_keeps_within_its_budget_least_recently_used_out() -> None:
    cache: Bounded[str, bytes] = Bounded(10_000)
    for i in range(100):
        cache.put(f"k{i}", b"x" * 1000, 1000)
        assert cache.used <= 10_000
    assert len(cache) == 10_000 // (1000 + ENTRY_OVERHEAD)
    assert cache.get("k0") is None and cache.get("k99") == b"x" * 1000
    cache.get("k95")  # used: k95 now outlives k96
    cache.put("new", b"y", 1000)
    assert cache.get("k95") is not None and cache.get("k92") is None
    cache.put("huge", b"z", 20_000)
    assert cache.get("huge") is None, "an entry larger than the whole budget is not kept"
    assert cache.pop("k99") == b"x" * 1000 and cache.get("k99") is None


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads a process's memory from /proc")
def test_a_serve_process_stays_within_its_memory_budget(store: Any, session: Session) -> None:
    """Far more than the budget is written and read; the process grows by about the budget at most.

    On the emulators 14 threads of events (88 MiB, still past the budget) instead of the folder's 24:
    the bound is the process's own, and 1,536 appends of 100 KB took 104 s of CI on fake-gcs-server."""
    if session.proc.proc.pid is None:  # pragma: no cover
        pytest.skip("no process")
    before = rss_mib(session.proc.proc.pid)
    big = "e" * 100_000
    for thread in range(24 if store.backend == "file" else 14):  # 24 x 64 events x 100 KB: 150 MiB to remember
        for seq in range(1, 65):
            assert session("append", thread=f"t{thread}", event={"seq": seq, "x": big}) == {"reply": "done"}
    spec = {"items": [{"a": i, "b": "yy"} for i in range(2500)]}  # ~59 KB of many small values: kept
    for i in range(200):
        assert session("job_put", place="waiting", job={"id": f"j{i}", "spec": spec, "due": 10**9})["reply"] == "done"
    for _ in range(2):
        assert session("job_count", place="waiting") == {"reply": "count", "count": 200}
    grown = rss_mib(session.proc.proc.pid) - before
    # The budget plus what Python and the allocator keep around it: a bound, not a measurement.
    assert grown < MEMORY_BUDGET / MIB + 96, f"a serve process grew by {grown:.0f} MiB"


# --------------------------------------------------------------------------
# Every memory of a serve process, in its budget (issue 44)

#: Every ``Bounded`` of the package, by module and the budget its call names: which part of
#: ``cache.MEMORY_BUDGET`` it is, and its budget.  docs/design.md ("Memory of a serve process") lists the same.
BUDGETS: dict[tuple[str, str], tuple[str, int]] = {
    ("store/conversations.py", "RECENT_BUDGET"): ("cache", conversations.RECENT_BUDGET),
    ("store/space.py", "SEEN_BUDGET"): ("cache", space.SEEN_BUDGET),
    ("store/space.py", "WRITTEN_BUDGET"): ("cache", space.WRITTEN_BUDGET),
    ("store/files.py", "LEDGER_BUDGET"): ("bookkeeping", files.LEDGER_BUDGET),
    ("store/files.py", "CLEAN_BUDGET"): ("bookkeeping", files.CLEAN_BUDGET),
    ("store/job_mark.py", "OLD_MARKS_BUDGET"): ("bookkeeping", job_mark.OLD_MARKS_BUDGET),
    ("store/job_mark.py", "budget"): ("bookkeeping", job_mark.PICKER_BUDGET),  # ShardPicker's, by default
    ("store/heads.py", "WRITTEN_BUDGET"): ("bookkeeping", heads.WRITTEN_BUDGET),
    ("store/confirmed.py", "CONFIRMED_BUDGET"): ("bookkeeping", confirmed.CONFIRMED_BUDGET),
}
#: The encoded names ``keys._short_part`` keeps (an lru_cache: a count of names of a bounded length), at most.
PARTS_BOUND = 2 * MIB


def bounded_calls() -> set[tuple[str, str]]:
    """(module below cloudstore/, the budget expression) of every ``Bounded(...)`` call in the package."""
    root = Path(cloudstore.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Bounded":
                found.add((path.relative_to(root).as_posix(), ast.unparse(node.args[0])))
    return found


def test_every_bounded_map_of_the_package_is_in_the_documented_budget() -> None:
    assert bounded_calls() == set(BUDGETS), "a Bounded map not in BUDGETS (and docs/design.md), or one gone"
    lru = [str(p) for p in Path(cloudstore.__file__).parent.rglob("store/*.py") if "lru_cache" in p.read_text()]
    assert [Path(p).name for p in lru] == ["keys.py"], "an lru_cache of the store not counted here"
    assert sum(b for part, b in BUDGETS.values() if part == "cache") == CACHE_BUDGET


def folder_service(tmp_path: Path, scheduler_ops: bool = True) -> Service:
    loc = parse_location("LNK_BUCKET_URL", f"file://{tmp_path}", ("file",))
    return Service(Space(open_store(loc), loc.prefix), scheduler_ops=scheduler_ops)


def every_kind_of_op(service: Service, agent: dict[str, Any]) -> None:
    """One of each op that makes a serve process remember something."""
    def ok(op: str, **args: Any) -> dict[str, Any]:
        reply = service.answer({"op": op, "agent": agent, **args})
        assert reply.get("reply") != "error", (op, reply)
        return reply

    ok("append", thread="t", event={"seq": 1})
    ok("read", thread="t", first=1)
    ok("take", thread="l", holder="h", lapse_ms=60_000)
    ok("leases", lapse_ms=60_000)
    ok("remove", thread="t")
    ok("job_put", place="waiting", job={"id": "j", "spec": None, "due": 1})
    ok("job_list", place="waiting")
    ok("job_mark")
    ok("job_due")
    ok("job_claim", id="j", thread="job:j", holder="r", lapse_ms=60_000, not_after=2e9)
    ok("job_claims")
    ok("file_write", path="skills/a.md", data="eA==", version=0)
    ok("file_list", folder="skills")


def test_a_serve_process_s_memories_add_up_to_the_documented_total(tmp_path: Path) -> None:
    """Every Bounded map a serve process's service makes, once every kind of op has run: their budgets and the
    name cache's bound are ``MEMORY_BUDGET`` (the caches ``CACHE_BUDGET``, the rest ``BOOKKEEPING_BUDGET``)."""
    gc.collect()
    before = {id(o) for o in gc.get_objects() if isinstance(o, Bounded)}
    service = folder_service(tmp_path)
    every_kind_of_op(service, {"owner": "o", "id": "a"})
    service.space.run_deferred()
    gc.collect()
    made = [o for o in gc.get_objects() if isinstance(o, Bounded) and id(o) not in before]
    total = sum(o.budget for o in made)
    assert total + PARTS_BOUND <= MEMORY_BUDGET, f"{total / MIB:.1f} MiB of budgets in {len(made)} maps"
    assert total == CACHE_BUDGET + sum(b for part, b in BUDGETS.values() if part == "bookkeeping") + (
        files.CLEAN_BUDGET + confirmed.CONFIRMED_BUDGET), "two clean maps (files), two confirmed (due, claims)"
    assert MEMORY_BUDGET == CACHE_BUDGET + BOOKKEEPING_BUDGET


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """The bytes allocated since entering and still held: a reader of tracemalloc's count."""
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    try:
        yield lambda: tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def test_a_bounded_map_holds_no_more_than_its_budget() -> None:
    """``ENTRY_OVERHEAD`` is what an entry really costs beyond what it is charged (keys of 10 to 400 characters)."""
    for length in (10, 100, 400):
        with traced() as held:
            cache: Bounded[str, float] = Bounded(MIB)
            for i in range(20_000):
                key = f"{i:08d}".ljust(length, "k")
                cache.put(key, float(i), len(key))
            assert cache.used <= MIB and held() <= MIB, (length, held())


def test_the_shard_picker_holds_its_budget_over_a_hundred_thousand_agents() -> None:
    """It kept a time per (agent, shard) and never forgot an agent: 15.5 kB a busy agent, 2 GB at 100,000.
    Now an order of one byte a shard per agent, the least recently used agents forgotten past its budget;
    an agent in use keeps its order whatever the others do."""
    picker = job_mark.ShardPicker(rng=random.Random(44))
    busy, firsts = "a/_o/_busy/", []
    with traced() as held:
        for i in range(30_000):
            picker.order(f"a/_o/_agent-{i:012d}/", job_mark.TRIES)
            if i % 100 == 0:
                firsts.append(picker.order(busy, job_mark.TRIES)[0])
        assert held() <= job_mark.PICKER_BUDGET, f"{held() / MIB:.2f} MiB"
    assert sorted(firsts[:job_mark.SHARDS]) == list(range(job_mark.SHARDS)), "least recently written first"
    assert firsts[job_mark.SHARDS:2 * job_mark.SHARDS] == firsts[:job_mark.SHARDS], "then again in that order"


def test_heads_written_are_remembered_by_bytes(tmp_path: Path) -> None:
    """Every head a process wrote was kept, 4,096 of them, whatever their size: a holder may be any length,
    a head may hold 1,024 removal records.  300 leases taken with 40 KB holders kept 25 MiB; now the heads'
    memory and the objects written together hold their budgets.  A head too large to keep still says when
    it was written (its packing hint is not due at once), and one forgotten costs a read only."""
    service = folder_service(tmp_path)
    agent, holder = {"owner": "o", "id": "a"}, "h" * 40_000
    with traced() as held:
        for i in range(300):
            reply = service.answer({"op": "take", "agent": agent, "thread": f"t{i}", "holder": holder, "lapse_ms": 1})
            assert reply == {"reply": "took", "took": "took"}
        assert held() <= heads.WRITTEN_BUDGET + space.WRITTEN_BUDGET + MIB, f"{held() / MIB:.1f} MiB"
    keys_ = service.space.keys(service_agent(agent))
    big = "b" * (space.SEEN_OBJECT_MAX + 1)
    assert service.answer({"op": "take", "agent": agent, "thread": "big", "holder": big, "lapse_ms": 1})["took"]
    assert not service.leases_.heads.hint_due(keys_, "big"), "written a moment ago, too large to keep: time kept"
    assert service.leases_.heads.hint_due(keys_, "t0"), "forgotten (least recently used): due, as never written"
    assert service.answer({"op": "take", "agent": agent, "thread": "t0", "holder": "x", "lapse_ms": 1})["took"] \
        == "lapsed", "a forgotten head is read, and its lapsed lease taken over"


def service_agent(agent: dict[str, Any]) -> Any:
    from cloudstore.store.model import Agent

    return Agent(id=agent["id"], owner=agent["owner"])


def test_index_entries_found_live_are_remembered_by_bytes() -> None:
    """Counted (4,096, then all forgotten at once) while an entry's key may be hundreds of bytes; now bytes,
    the least recently confirmed forgotten first."""
    memory = confirmed.Confirmed()
    with traced() as held:
        for i in range(20_000):
            memory.add(f"_due/{i:016x}/".ljust(300, "o"))
        assert held() <= confirmed.CONFIRMED_BUDGET, f"{held() / MIB:.2f} MiB"
    assert memory.fresh(f"_due/{19_999:016x}/".ljust(300, "o")) and not memory.fresh(f"_due/{0:016x}/".ljust(300, "o"))


def test_the_name_cache_holds_its_bound() -> None:
    """``PARTS_KEPT`` names of at most ``SHORT_NAME_MAX`` characters, the costliest kind (outside the BMP)."""
    keys._short_part.cache_clear()
    with traced() as held:
        for i in range(2 * keys.PARTS_KEPT):
            keys.name_part(f"{i:08d}".ljust(keys.SHORT_NAME_MAX, "\U0001F600"))
        assert held() <= PARTS_BOUND, f"{held() / MIB:.2f} MiB"
    keys._short_part.cache_clear()

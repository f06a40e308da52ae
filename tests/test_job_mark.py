"""``job_mark``'s shards (cloudstore/store/job_mark.py): a throttled shard gives way at once, the mark never repeats.

Issue 26, case 1: on GCS one object takes about one write a second, so the
agent's mark is ``SHARDS`` objects and each change writes one of them.  A
shard write refused for its rate (429 / ``SlowDown``) was certainly not
applied, so the change moves at once to another shard instead of waiting the
throttle out; only the last of ``TRIES`` shards waits.  What a watcher reads
(one listing, hashed) changes at every bump and never comes back.  The
backend is a folder whose chosen shard keys answer ``Throttled``, so each
refusal happens exactly where the test says; the picker's ties are seeded.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from cloudstore.generations import RetryingStore, RetryPolicy, Throttled
from cloudstore.local import LocalBackend
from cloudstore.store import job_mark
from cloudstore.store.keys import AgentKeys

QUICK = RetryPolicy(first_delay=0.0, max_delay=0.0, throttle_delay=0.0)


class HotShards:
    """A folder backend whose writes of chosen keys are refused for their rate, ``times`` each."""

    def __init__(self, root: str, times: int = 1) -> None:
        self.inner = LocalBackend(root)
        self.clock = self.inner.clock
        self.hot: set[str] = set()
        self.times = times
        self.refusals: dict[str, int] = {}
        self.writes: list[tuple[str, bool]] = []  # (key, refused)

    def put(self, key: str, raw: bytes, mode: Any) -> str:
        if key in self.hot and self.refusals.get(key, 0) < self.times:
            self.refusals[key] = self.refusals.get(key, 0) + 1
            self.writes.append((key, True))
            raise Throttled("429 rateLimitExceeded")
        self.writes.append((key, False))
        return self.inner.put(key, raw, mode)

    def get(self, key: str, head: int | None = None) -> tuple[bytes, str] | None:
        return self.inner.get(key, head)

    def delete(self, key: str, version: str | None) -> None:
        self.inner.delete(key, version)

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Any]:
        return self.inner.list(prefix, start_after, limit)

    def list_dirs(self, prefix: str) -> list[str]:
        return self.inner.list_dirs(prefix)


def rig(tmp_path: Any, times: int = 1) -> tuple[HotShards, RetryingStore, AgentKeys, job_mark.ShardPicker]:
    backend = HotShards(str(tmp_path), times)
    keys = AgentKeys("", "o", "a")
    return backend, RetryingStore(backend, QUICK), keys, job_mark.ShardPicker(rng=random.Random(26))  # type: ignore[arg-type]


def test_a_throttled_shard_gives_way_at_once_to_another(tmp_path: Any) -> None:
    backend, store, keys, picker = rig(tmp_path)
    order = job_mark.ShardPicker(rng=random.Random(26)).order(keys.base, job_mark.TRIES)  # the same seed's picks
    backend.hot = {keys.mark_shard(k) for k in order[:-1]}
    job_mark.bump(store, keys, picker)
    tried = [key for key, _ in backend.writes]
    assert tried == [keys.mark_shard(k) for k in order], "each refused shard once, then the next, in turn"
    assert [refused for _, refused in backend.writes] == [True] * (job_mark.TRIES - 1) + [False]
    assert store.writes == 1, "three refusals changed nothing"
    assert job_mark.read(store, keys) != 0


def test_the_last_shard_waits_its_throttle_out(tmp_path: Any) -> None:
    backend, store, keys, picker = rig(tmp_path, times=2)
    order = job_mark.ShardPicker(rng=random.Random(26)).order(keys.base, job_mark.TRIES)
    backend.hot = {keys.mark_shard(k) for k in order}
    job_mark.bump(store, keys, picker)
    last = keys.mark_shard(order[-1])
    assert [key for key, _ in backend.writes] == [keys.mark_shard(k) for k in order[:-1]] + [last] * 3
    assert backend.writes[-1] == (last, False), "the last shard is tried until the throttle passes"


def test_the_mark_moves_at_every_bump_and_never_comes_back(tmp_path: Any) -> None:
    backend, store, keys, picker = rig(tmp_path)
    backend.hot = {keys.mark_shard(k) for k in range(0, job_mark.SHARDS, 7)}  # each refused once, then not
    seen = [job_mark.read(store, keys)]
    assert seen == [0], "no shard written: 0, as before any mark"
    for _ in range(2 * job_mark.SHARDS + 5):  # every shard written, then again: versions never repeat
        job_mark.bump(store, keys, picker)
        seen.append(job_mark.read(store, keys))
    assert sum(refused for _, refused in backend.writes) == len(backend.hot), "each hot shard met once"
    assert len(set(seen)) == len(seen), "a value a watcher could hold came back"
    assert all(1 <= mark <= job_mark.MARK_MAX for mark in seen[1:])
    written = {key for key, refused in backend.writes if not refused}
    assert written == {keys.mark_shard(k) for k in range(job_mark.SHARDS)}, "least recently written first"


def test_picks_are_the_least_recently_written_by_this_process() -> None:
    picker = job_mark.ShardPicker(shards=4, rng=random.Random(1))
    firsts = [picker.order("b/", 2)[0] for _ in range(8)]
    assert sorted(firsts[:4]) == [0, 1, 2, 3] and firsts[4:] == firsts[:4], firsts

"""HEAD beside the previous release (releases.json's ``"previous"``) on one store: every family interleaved.

A fleet is upgraded a machine at a time, so for a while two releases serve
one agent.  HEAD's layout is the previous release's plus root objects of its
own (the format record ``_format``, the server probe ``_probe/``) and the
refusal it writes over the single old job mark (job_mark.py, for releases
before the shards; the previous release counts that key as a mark write, as
it counts any).  So every answer must be what the contract
(store-interface.txt, wire.md) promises, whichever side asks and whichever
side wrote: each op below goes alternately to HEAD and to the previous
release, and each promise is checked from both.  Then the previous
release's ``lnk-store-admin inspect`` and ``gc --apply`` run on the store
HEAD wrote: they must neither fail on HEAD's objects nor delete them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from releases import Driver, admin, as_head, previous
from support import StoreUnderTest, location_of

from cloudstore.generations import Create, frame, new_nonce
from cloudstore.settings import open_store


def _pair(fleet: Callable[[str], Driver]) -> tuple[Driver, Driver]:
    return fleet(as_head()), fleet(previous())


def _sides(new: Driver, old: Driver) -> Callable[[int], Driver]:
    """Step ``i``'s driver: HEAD on even steps, the previous release on odd ones."""
    return lambda i: (new, old)[i % 2]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_conversations_interleaved(fleet: Callable[[str], Driver]) -> None:
    """append/read/last/threads/remove: one conversation, each event by the other side than the one before."""
    new, old = _pair(fleet)
    side = _sides(new, old)
    for seq in range(1, 7):
        writer, other = side(seq), side(seq + 1)
        assert writer("append", thread="t", event={"seq": seq, "by": writer.release}) == {"reply": "done"}
        # The other side was told nothing of it but must see it at once: last, and a taken of the same seq.
        assert other("last", thread="t") == {"reply": "last", "last": seq}
        assert other("append", thread="t", event={"seq": seq, "again": True}) == {"reply": "taken", "last": seq}
    events = [{"seq": s, "by": side(s).release} for s in range(1, 7)]
    for d in (new, old):
        assert d("read", thread="t") == {"reply": "events", "events": events}
        assert d("read", thread="t", first=4) == {"reply": "events", "events": events[3:]}
        assert d("threads") == {"reply": "threads", "threads": [{"thread": "t", "last": 6}]}
    assert old("remove", thread="t") == {"reply": "done"}
    for d in (new, old):
        assert d("last", thread="t") == {"reply": "last", "last": 0}
        assert d("read", thread="t") == {"reply": "events", "events": []}
    # Begun again by HEAD after the old release removed it, and continued by the old release.
    assert new("append", thread="t", event={"seq": 1}) == {"reply": "done"}
    assert old("append", thread="t", event={"seq": 2}) == {"reply": "done"}
    assert new("remove", thread="t") == {"reply": "done"}
    assert old("append", thread="t", event={"seq": 1, "after": "head's remove"}) == {"reply": "done"}
    for d in (new, old):
        assert d("read", thread="t") == {"reply": "events", "events": [{"seq": 1, "after": "head's remove"}]}


def test_leases_interleaved(fleet: Callable[[str], Driver]) -> None:
    """take/renew/end/leases: a lease taken by one side is held for the other, whoever ends it."""
    new, old = _pair(fleet)
    for taker, other in ((new, old), (old, new)):
        assert taker("take", thread="l", holder=taker.release, lapse_ms=600_000) == {"reply": "took", "took": "took"}
        assert other("take", thread="l", holder=other.release, lapse_ms=600_000) == {
            "reply": "took", "took": "held"}
        listed = other("leases", lapse_ms=600_000)["leases"]
        assert [(x["thread"], x["holder"], x["lapsed"]) for x in listed] == [("l", taker.release, False)]
        assert other("renew", thread="l", holder=other.release) == {"reply": "lost"}
        assert other("renew", thread="l", holder=taker.release) == {"reply": "done"}
        assert other("end", thread="l", holder=other.release) == {"reply": "done"}  # not its lease: nothing
        assert taker("take", thread="l", holder=other.release, lapse_ms=600_000)["took"] == "held"
        assert other("end", thread="l", holder=taker.release) == {"reply": "done"}
        assert taker("leases", lapse_ms=600_000) == {"reply": "leases", "leases": []}
    # A lapsed lease (lapse 0: lapsed at once) is taken over by the other side: exactly that taker gets it.
    assert new("take", thread="m", holder="n", lapse_ms=600_000)["took"] == "took"
    assert old("take", thread="m", holder="o", lapse_ms=0) == {"reply": "took", "took": "lapsed"}
    assert new("take", thread="m", holder="n", lapse_ms=600_000)["took"] == "held"
    assert new("renew", thread="m", holder="n") == {"reply": "lost"}
    assert [x["holder"] for x in new("leases", lapse_ms=600_000)["leases"]] == ["o"]


def _job(job_id: str, due: float) -> dict[str, Any]:
    return {"id": job_id, "spec": {"run": job_id, "n": 10**30}, "due": due}


def test_jobs_interleaved(fleet: Callable[[str], Driver]) -> None:
    """job_put/get/shift/remove/list/count/next/mark/day: each change of waiting moves BOTH sides' marks."""
    new, old = _pair(fleet)
    marks = {d.release: d("job_mark")["mark"] for d in (new, old)}
    seen: dict[str, set[int]] = {r: {m} for r, m in marks.items()}

    def waiting_changed(by: Driver, op: str, **args: Any) -> Any:
        reply = by(op, **args)
        for d in (new, old):
            mark = d("job_mark")["mark"]
            assert mark not in seen[d.release], f"{d.release}'s mark came back or stayed after {by.release}'s {op}"
            seen[d.release].add(mark)
        return reply

    assert waiting_changed(new, "job_put", place="waiting", job=_job("a", 2_000_000_000.5)) == {"reply": "done"}
    assert waiting_changed(old, "job_put", place="waiting", job=_job("b", 1_900_000_000)) == {"reply": "done"}
    for d in (new, old):
        assert d("job_get", place="waiting", id="a") == {"reply": "job", "job": _job("a", 2_000_000_000.5)}
        assert d("job_count", place="waiting") == {"reply": "count", "count": 2}
        assert d("job_next") == {"reply": "next", "next": 1_900_000_000}
    # Of one job shifted out of one place by both sides, exactly one finds it.
    assert waiting_changed(new, "job_shift", id="b", **{"from": "waiting", "to": "firing"}) == {
        "reply": "found", "found": True}
    assert old("job_shift", id="b", **{"from": "waiting", "to": "firing"}) == {"reply": "found", "found": False}
    for d in (new, old):
        assert d("job_list", place="firing") == {"reply": "jobs", "jobs": [_job("b", 1_900_000_000)]}
        assert d("job_next") == {"reply": "next", "next": 2_000_000_000.5}
    assert waiting_changed(old, "job_shift", id="b", **{"from": "firing", "to": "waiting"})["found"] is True
    assert waiting_changed(new, "job_remove", place="waiting", id="b") == {"reply": "found", "found": True}
    assert old("job_remove", place="waiting", id="b") == {"reply": "found", "found": False}
    assert waiting_changed(old, "job_remove", place="waiting", id="a") == {"reply": "found", "found": True}
    for d in (new, old):
        assert d("job_next") == {"reply": "next", "next": None}
        assert d("job_count", place="waiting") == {"reply": "count", "count": 0}
    assert new("job_put", place="ending", job=_job("c", 5)) == {"reply": "done"}
    assert old("job_get", place="ending", id="c") == {"reply": "job", "job": _job("c", 5)}
    assert old("job_set_day", day=20_000, sent=3) == {"reply": "done"}
    assert new("job_day") == {"reply": "day", "day": 20_000, "sent": 3}
    assert new("job_set_day", day=20_001, sent=1) == {"reply": "done"}
    assert old("job_day") == {"reply": "day", "day": 20_001, "sent": 1}


def test_files_interleaved(fleet: Callable[[str], Driver]) -> None:
    """file_write/read/list/remove/append: one version has one body, and no version is given twice."""
    new, old = _pair(fleet)
    given: dict[str, set[int]] = {}

    def wrote(path: str, reply: dict[str, Any]) -> int:
        """A ``wrote`` reply's version, never one given to ``path`` before (on either side)."""
        assert reply["reply"] == "wrote", reply
        assert reply["version"] not in given.setdefault(path, set()), f"{path}: version {reply['version']} twice"
        given[path].add(reply["version"])
        return int(reply["version"])

    v1 = wrote("skills/a.md", new("file_write", path="skills/a.md", data=_b64("one"), version=0))
    assert old("file_write", path="skills/a.md", data=_b64("other"), version=0) == {"reply": "stale", "version": v1}
    assert old("file_read", path="skills/a.md") == {"reply": "file", "file": {"data": _b64("one"), "version": v1}}
    v2 = wrote("skills/a.md", old("file_write", path="skills/a.md", data=_b64("two"), version=v1))
    assert new("file_write", path="skills/a.md", data=_b64("x"), version=v1) == {"reply": "stale", "version": v2}
    assert new("file_read", path="skills/a.md") == {"reply": "file", "file": {"data": _b64("two"), "version": v2}}
    wrote("skills/log.txt", old("file_append", path="skills/log.txt", data=_b64("x")))
    wrote("skills/log.txt", new("file_append", path="skills/log.txt", data=_b64("y")))
    v_log = wrote("skills/log.txt", old("file_append", path="skills/log.txt", data=_b64("z")))
    assert new("file_read", path="skills/log.txt") == {"reply": "file", "file": {"data": _b64("xyz"), "version": v_log}}
    v3 = wrote("instructions/main.md", new("file_write", path="instructions/main.md", data=_b64("m"), version=0))
    for d in (new, old):
        assert d("file_list", folder="skills/") == {"reply": "files", "files": ["skills/a.md", "skills/log.txt"]}
        assert d("file_list", folder="instructions") == {"reply": "files", "files": ["instructions/main.md"]}
    assert new("file_remove", path="skills/a.md", version=v1) == {"reply": "found", "found": False}
    assert new("file_remove", path="skills/a.md", version=v2) == {"reply": "found", "found": True}
    assert old("file_read", path="skills/a.md") == {"reply": "file", "file": None}
    assert old("file_list", folder="skills") == {"reply": "files", "files": ["skills/log.txt"]}
    wrote("skills/a.md", old("file_write", path="skills/a.md", data=_b64("again"), version=0))  # a version anew
    assert old("file_remove", path="instructions/main.md", version=v3) == {"reply": "found", "found": True}
    wrote("instructions/main.md", new("file_write", path="instructions/main.md", data=_b64("again"), version=0))


def test_tools_interleaved(fleet: Callable[[str], Driver]) -> None:
    """tools_narrow/read/list: each side narrows what the other left, and both read the same."""
    new, old = _pair(fleet)
    assert old("tools_read", thread="t") == {"reply": "tools", "tools": None}
    assert new("tools_narrow", thread="t", tools=["a", "b", "c"]) == {"reply": "tools", "tools": ["a", "b", "c"]}
    assert old("tools_narrow", thread="t", tools=["d", "c", "b"]) == {"reply": "tools", "tools": ["c", "b"]}
    assert new("tools_narrow", thread="t", tools=["b", "e"]) == {"reply": "tools", "tools": ["b"]}
    assert old("tools_narrow", thread="u", tools=[]) == {"reply": "tools", "tools": []}
    for d in (new, old):
        assert d("tools_read", thread="t") == {"reply": "tools", "tools": ["b"]}
        assert d("tools_list") == {"reply": "narrowed", "narrowed": {"t": ["b"], "u": []}}


#: Objects HEAD adds at the store's root, by the lead's design (store_format.py, server_check.py).
HEAD_ROOT_OBJECTS = {
    "_format": json.dumps({"reader": 3, "writer": 3, "features": [], "by": "cloudstore 0.6.0"}).encode(),
    "_probe/0": b"{}",
}


def _keys(store: StoreUnderTest) -> dict[str, bytes]:
    """Every key of the store below its prefix, with its bytes as stored (frame included)."""
    loc = location_of(store)
    backend = open_store(loc)
    return {item.key[len(loc.prefix):]: backend.get(item.key).data  # type: ignore[union-attr]
            for item in backend.list(loc.prefix)}


@pytest.mark.parametrize("tool", ["previous", "head"])
def test_admin_beside_head_objects(store: StoreUnderTest, fleet: Callable[[str], Driver], tool: str,
                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The previous release's (and HEAD's) inspect, gc --apply and migrate on a store HEAD wrote: they run,
    keep HEAD's objects (the root ones, the refusal over the old mark), and copy a store both drivers read.

    HEAD's root objects (``_format``, ``_probe/``) are planted where HEAD
    has not written them itself yet (as their drivers do once the record is
    in), framed as the drivers store every object."""
    new, old = _pair(fleet)
    assert new("append", thread="t", event={"seq": 1}) == {"reply": "done"}
    assert new("job_put", place="waiting", job=_job("j", 10)) == {"reply": "done"}  # also refuses the old mark
    assert new("file_write", path="skills/s.md", data=_b64("s"), version=0)["reply"] == "wrote"
    assert new("tools_narrow", thread="t", tools=["x"])["reply"] == "tools"
    for name, value in store.env.items():  # this process reads the store too (moto's endpoint and keys)
        monkeypatch.setenv(name, value)
    loc = location_of(store)
    backend = open_store(loc)

    for key, body in HEAD_ROOT_OBJECTS.items():
        if not any(k == key or k.startswith(key.split("/")[0] + "/") for k in _keys(store)):
            backend.put(loc.prefix + key, frame(new_nonce(), body), Create())
    before = _keys(store)
    assert "_format" in before and any(k.startswith("_probe/") for k in before)

    release = previous() if tool == "previous" else as_head()
    shown = admin(release, store, "inspect", store.url, "--json")
    assert shown.returncode == 0, shown.stderr
    json.loads(shown.stdout)
    cleaned = admin(release, store, "gc", store.url, "--apply", "--min-age", "0")  # no grace: all it judges dead
    assert cleaned.returncode == 0, cleaned.stderr
    copy = f"file://{tmp_path / 'copy'}"
    moved = admin(release, store, "migrate", store.url, copy)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    after = _keys(store)
    kept = {k for k in before if k.startswith(("_format", "_probe/")) or k.endswith("/mark")}
    assert kept <= set(after), f"the previous release's gc deleted {sorted(kept - set(after))}"
    # And both drivers still answer on what is left.
    for d in (new, old):
        assert d("read", thread="t") == {"reply": "events", "events": [{"seq": 1}]}
        assert d("job_count", place="waiting") == {"reply": "count", "count": 1}
        assert d("file_list", folder="skills") == {"reply": "files", "files": ["skills/s.md"]}

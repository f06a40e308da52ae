"""The object-store seam, the same tests on every backend: one vocabulary, one behaviour.

These are the promises the collections are built on: create-if-absent and
update-if-unchanged settle races with exactly one winner, every write gets a
new version (no ABA on equal bytes), listing is ordered and honours
start_after / limit, and a retried write recognises its own first attempt.
"""

from __future__ import annotations

import os
from functools import partial

import pytest
from support import S3_SERVERS, location_of, make_store

from cloudstore.conformance.racing import at_once
from cloudstore.generations import (
    AlreadyExists,
    Create,
    NotFound,
    Overwrite,
    PreconditionFailed,
    PutMode,
    RetryingStore,
    RetryPolicy,
    StoreUnavailable,
    Transient,
    Update,
)
from cloudstore.settings import open_backend


@pytest.fixture
def seam(store_env):
    """A RetryingStore on the test's fresh location, and its key prefix."""
    loc = location_of(store_env)
    return RetryingStore(open_backend(loc)), loc.prefix


def test_create_update_overwrite_and_errors(seam):
    s, root = seam
    key = root + "x/obj"
    assert s.get(key) is None
    first = s.put(key, b"one", Create())
    with pytest.raises(AlreadyExists):
        s.put(key, b"two", Create())
    got = s.get(key)
    assert got is not None and got.data == b"one" and got.version == first.version
    second = s.put(key, b"two", Update(first.version))
    with pytest.raises(PreconditionFailed):
        s.put(key, b"three", Update(first.version))
    assert s.get(key).data == b"two"
    third = s.put(key, b"four", Overwrite())
    assert len({first.version, second.version, third.version}) == 3
    with pytest.raises(PreconditionFailed):
        s.put(root + "x/missing", b"z", Update(first.version))
    assert s.get(root + "x/missing") is None


def test_equal_bytes_get_new_versions(seam):
    """ABA: S3 ETags are MD5s, so equal bodies must still give distinct versions."""
    s, root = seam
    key = root + "aba"
    v1 = s.put(key, b"same", Create()).version
    v2 = s.put(key, b"same", Update(v1)).version
    assert v1 != v2
    with pytest.raises(PreconditionFailed):
        s.put(key, b"same", Update(v1))


def test_delete(seam):
    s, root = seam
    key = root + "del"
    obj = s.put(key, b"a", Create())
    s.put(key, b"b", Update(obj.version))
    s.delete(key)
    assert s.get(key) is None
    assert s.put(key, b"again", Create()).data == b"again"


def test_conditional_delete_of_a_missing_key_is_not_found_and_of_another_version_a_precondition(store_env):
    """One answer on every server: SeaweedFS answers a conditional DELETE of a missing key 412
    (moto and AWS S3: 404), which must not read as "another version is there"."""
    loc = location_of(store_env)
    backend = open_backend(loc)
    key = loc.prefix + "cond-del"
    obj = RetryingStore(backend).put(key, b"a", Create())
    if store_env.backend != "gcs":  # fake-gcs-server does not judge a delete's ifGenerationMatch (sim/run.py)
        with pytest.raises(PreconditionFailed):
            backend.delete(key, _other_version(obj.version))
    backend.delete(key, obj.version)
    with pytest.raises(NotFound):
        backend.delete(key, obj.version)
    assert RetryingStore(backend).delete(key, obj.version) is False


def _other_version(version: str | None) -> str:
    """A version token of the same shape as ``version`` that is not it."""
    assert version
    body = version.strip('"')
    flipped = ("0" if body[0] != "0" else "1") + body[1:]
    return f'"{flipped}"' if version.startswith('"') else flipped


def test_listing_order_start_after_limit_and_dirs(seam):
    s, root = seam
    names = [f"{i:020d}" for i in (5, 1, 12, 3, 100)]
    for n in names:
        s.put(f"{root}l/ev/{n}", b"", Create())
    s.put(f"{root}l/other", b"", Create())
    s.put(f"{root}lx/ev", b"", Create())
    keys = [i.key for i in s.list(root + "l/ev/")]
    assert keys == [f"{root}l/ev/{n}" for n in sorted(names)]
    after = [i.key[-20:] for i in s.list(root + "l/ev/", start_after=f"{root}l/ev/{3:020d}", limit=2)]
    assert after == [f"{5:020d}", f"{12:020d}"]
    assert s.list(root + "l/ev/", start_after=f"{root}l/ev/{100:020d}") == []
    assert s.list_dirs(root + "l/") == ["ev", "other"]
    assert all(i.modified > 0 for i in s.list(root + "l/"))


def test_listing_gives_each_objects_current_version(seam):
    """What lets a serve process skip re-reading listed objects it already holds."""
    s, root = seam
    first = s.put(root + "v/a", b"1", Create())
    s.put(root + "v/b", b"2", Create())
    listed = {i.key: i.version for i in s.list(root + "v/")}
    assert listed == {root + "v/a": first.version, root + "v/b": s.get(root + "v/b").version}
    second = s.put(root + "v/a", b"1", Update(first.version))
    assert {i.key: i.version for i in s.list(root + "v/")}[root + "v/a"] == second.version != first.version


@pytest.mark.parametrize("mode", ["create", "update"])
def test_racers_exactly_one_wins(store_env, mode):
    """8 writers, each with its own client (as on 8 machines), released together; 5 rounds."""
    loc = location_of(store_env)
    stores = [RetryingStore(open_backend(loc)) for _ in range(8)]
    for round_ in range(5):
        key = f"{loc.prefix}race/{mode}/{round_}"
        base: str | None = None
        if mode == "update":
            base = stores[0].put(key, b"base", Create()).version
        put_mode: PutMode = Create() if base is None else Update(base)

        def ready(i: int):
            def write() -> bool:
                try:
                    stores[i].put(key, f"writer {i}".encode(), put_mode)  # noqa: B023 (run in this iteration)
                    return True
                except (AlreadyExists, PreconditionFailed):
                    return False
            return write

        won = at_once([partial(ready, i) for i in range(8)])
        wins = [i for i, w in enumerate(won) if w]
        losses = [i for i, w in enumerate(won) if not w]
        assert len(wins) == 1 and len(losses) == 7, (wins, losses)
        assert stores[0].get(key).data == f"writer {wins[0]}".encode()


class FlakyBackend:
    """Wraps a backend: the first put lands, then its reply is 'lost' (Transient)."""

    def __init__(self, inner, fail_puts: int = 1, fail_all: bool = False) -> None:
        self.inner = inner
        self.fail_puts = fail_puts
        self.fail_all = fail_all

    def get(self, key):
        return self.inner.get(key)

    def put(self, key, raw, mode):
        if self.fail_all:
            raise Transient("injected: store down")
        result = self.inner.put(key, raw, mode)
        if self.fail_puts > 0:
            self.fail_puts -= 1
            raise Transient("injected: reply lost after the write landed")
        return result

    def delete(self, key, version):
        return self.inner.delete(key, version)

    def list(self, prefix, start_after, limit):
        return self.inner.list(prefix, start_after, limit)

    def list_dirs(self, prefix):
        return self.inner.list_dirs(prefix)


def test_retry_recognises_its_own_create(store_env):
    """A conditional create whose reply was lost must not report 'already exists' about itself."""
    loc = location_of(store_env)
    fast = RetryPolicy(attempts=4, first_delay=0.001, max_delay=0.01)
    s = RetryingStore(FlakyBackend(open_backend(loc)), fast)
    key = loc.prefix + "own"
    obj = s.put(key, b"mine", Create())
    assert s.get(key).version == obj.version
    again = RetryingStore(FlakyBackend(open_backend(loc)), fast)
    assert again.put(key, b"next", Update(obj.version)).data == b"next"
    other = RetryingStore(open_backend(loc))
    with pytest.raises(AlreadyExists):
        other.put(key, b"intruder", Create())


def test_giving_up_says_outcome_unknown(store_env):
    loc = location_of(store_env)
    s = RetryingStore(
        FlakyBackend(open_backend(loc), fail_all=True), RetryPolicy(attempts=3, first_delay=0.001, max_delay=0.01)
    )
    with pytest.raises(StoreUnavailable) as info:
        s.put(loc.prefix + "down", b"x", Create())
    assert info.value.outcome_unknown and "outcome unknown" in str(info.value)


def test_local_backend_refuses_unsafe_key_parts(tmp_path):
    from cloudstore.local import LocalBackend

    backend = LocalBackend(str(tmp_path))
    for bad in ("a/../b", "a//b", "a/./b", "a/b=c"):
        with pytest.raises(ValueError):
            backend.put(bad, b"x", Overwrite())
    with pytest.raises(NotFound):
        backend.delete("absent", None)
    assert not os.path.exists(os.path.join(os.path.dirname(str(tmp_path)), "b="))


def test_long_key_parts_are_chunked_on_local_folder(tmp_path):
    from cloudstore.local import LocalBackend

    backend = LocalBackend(str(tmp_path))
    long_part = "x" * 700
    s = RetryingStore(backend)
    s.put(f"p/{long_part}/leaf", b"v", Create())
    s.put(f"p/{long_part}", b"w", Create())
    assert s.get(f"p/{long_part}/leaf").data == b"v"
    assert [i.key for i in s.list("p/")] == [f"p/{long_part}", f"p/{long_part}/leaf"]


@pytest.mark.parametrize("server", S3_SERVERS)
def test_s3_writes_carry_no_checksum_the_operation_does_not_require(server, request, tmp_path_factory, monkeypatch):
    """The drivers' S3 client asks botocore for request checksums only where an operation requires one
    (s3.config_options): no CRC32 header on a PutObject, as the GCS backend sends none, and the write
    and its read back still work on each S3 server the tests start."""
    store = make_store(server, request, tmp_path_factory)
    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    loc = location_of(store)
    backend = open_backend(loc)
    sent = []
    backend.client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: sent.append({k.lower() for k in request.headers}))
    s = RetryingStore(backend)
    written = s.put(loc.prefix + "sum", b"payload", Create())
    assert s.get(loc.prefix + "sum").data == b"payload" and written.version
    assert len(sent) == 1 and not [h for h in sent[0] if "checksum" in h], sent

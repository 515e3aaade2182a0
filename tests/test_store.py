"""ObjectStore contract, on both backends over real I/O."""

from __future__ import annotations

import os

import pytest

from flightsrv.errors import (
    CorruptObject,
    ObjectNotFound,
    OperationUnsupported,
    PreconditionFailed,
    StoreUnsupported,
)
from flightsrv.store import PutMode, open_store, verify_preconditions
from flightsrv.store.checked import CheckedStore
from flightsrv.store.faults import CountingStore, FaultPlan, FaultyStore, IgnoresPreconditions
from flightsrv.store.prefixed import PrefixedStore
from support import worker_processes


@pytest.fixture
def store(warehouse_uri):
    return open_store(warehouse_uri)


def test_create_is_exclusive(store):
    store.put("a/b.txt", b"one", mode=PutMode.CREATE)
    with pytest.raises(PreconditionFailed):
        store.put("a/b.txt", b"two", mode=PutMode.CREATE)
    assert store.get("a/b.txt")[0] == b"one"


def test_if_match_is_compare_and_swap(store):
    m1 = store.put("p", b"v1")
    m2 = store.put("p", b"v2", mode=PutMode.IF_MATCH, etag=m1.etag)
    assert m2.etag != m1.etag
    with pytest.raises(PreconditionFailed):
        store.put("p", b"v3", mode=PutMode.IF_MATCH, etag=m1.etag)
    with pytest.raises(ObjectNotFound):
        store.put("missing", b"x", mode=PutMode.IF_MATCH, etag=m1.etag)
    assert store.get("p")[0] == b"v2"


def test_same_bytes_rewrite_gets_new_etag_locally(local_uri):
    store = open_store(local_uri)
    m1 = store.put("k", b"same")
    m2 = store.put("k", b"same", mode=PutMode.IF_MATCH, etag=m1.etag)
    assert m1.etag != m2.etag
    with pytest.raises(PreconditionFailed):
        store.put("k", b"same", mode=PutMode.IF_MATCH, etag=m1.etag)


def test_rewrites_under_a_stopped_clock_never_repeat_a_pinned_version(tmp_path):
    """Pinned reads ignore the inode (a copied warehouse has new ones), so the mtime must tell
    versions of a key apart: a filesystem clock that has not moved on (coarse timestamps)
    must not give a rewrite the mtime of the version it replaces."""
    from flightsrv.store.local import LocalStore

    class StoppedClock(LocalStore):  # every file the store writes gets the same mtime
        def _write_tmp(self, data):
            tmp = super()._write_tmp(data)
            os.utime(tmp, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
            return tmp

    store = StoppedClock(str(tmp_path / "s"))
    versions = [store.put("p", b"v0")]
    for i in range(1, 4):
        versions.append(store.put("p", f"v{i}".encode(), mode=PutMode.IF_MATCH,
                                  etag=versions[-1].etag))
    assert len({v.etag for v in versions}) == 4
    for old in versions[:-1]:
        with pytest.raises(PreconditionFailed):
            store.get("p", etag=old.etag)
        with pytest.raises(PreconditionFailed):
            store.put("p", b"vX", mode=PutMode.IF_MATCH, etag=old.etag)
    assert store.get("p", etag=versions[-1].etag)[0] == b"v3"


def test_pinned_reads_survive_a_copy_of_the_store(tmp_path):
    """A copy keeps size and mtime (maybe truncated) but not the inode: reads pinned to the
    original's ETags pass on the copy; a rewrite on the copy is still caught."""
    import subprocess

    src = open_store(str(tmp_path / "a"))
    m = src.put("obj", b"0123456789")
    subprocess.run(["cp", "-a", str(tmp_path / "a"), str(tmp_path / "b")], check=True)
    subprocess.run(["tar", "--format=gnu", "-cf", str(tmp_path / "a.tar"), "-C",
                    str(tmp_path / "a"), "."], check=True)
    os.makedirs(tmp_path / "c")
    subprocess.run(["tar", "-xf", str(tmp_path / "a.tar"), "-C", str(tmp_path / "c")],
                   check=True)
    for name in ("b", "c"):
        copy = open_store(str(tmp_path / name))
        assert copy.head("obj").etag != m.etag  # a new inode
        assert copy.get("obj", etag=m.etag)[0] == b"0123456789"
        assert copy.get_range("obj", 2, 5, etag=m.etag) == b"234"
        with pytest.raises(PreconditionFailed):  # CAS compares the whole ETag
            copy.put("obj", b"x", mode=PutMode.IF_MATCH, etag=m.etag)
        copy.put("obj", b"9876543210", mode=PutMode.IF_MATCH, etag=copy.head("obj").etag)
        with pytest.raises(PreconditionFailed):
            copy.get("obj", etag=m.etag)


def test_get_pinned_to_etag(store):
    m1 = store.put("obj", b"0123456789")
    assert store.get_range("obj", 2, 5, etag=m1.etag) == b"234"
    assert store.get_range("obj", 8, 100) == b"89"
    store.put("obj", b"changed!!!", mode=PutMode.IF_MATCH, etag=m1.etag)
    with pytest.raises(PreconditionFailed):
        store.get_range("obj", 0, 3, etag=m1.etag)
    with pytest.raises(PreconditionFailed):
        store.get("obj", etag=m1.etag)
    with pytest.raises(ObjectNotFound):
        store.get("nope")


def test_list_and_delete(store):
    for k in ["t/data/1", "t/data/2", "t/manifest/v1", "u/x"]:
        store.put(k, k.encode())
    assert [m.key for m in store.list("t/data/")] == ["t/data/1", "t/data/2"]
    assert [m.key for m in store.list("t/")] == ["t/data/1", "t/data/2", "t/manifest/v1"]
    assert sorted(store.list_prefixes("")) == ["t", "u"]
    store.delete("t/data/1")
    store.delete("t/data/1")  # idempotent
    assert [m.key for m in store.list("t/data/")] == ["t/data/2"]


def test_multipart_copy_and_upload(store):
    src = bytes(range(256)) * 4096 * 24  # 24 MiB
    store.put("src", src)
    meta = store.head("src")
    uid = store.create_multipart("dst")
    assert [u.upload_id for u in store.list_multipart("dst")] == [uid]
    p1 = store.upload_part_copy("dst", uid, 1, "src", 0, 6 * 1024 * 1024, source_etag=meta.etag)
    p2 = store.upload_part("dst", uid, 2, b"X" * (5 * 1024 * 1024))
    p3 = store.upload_part_copy("dst", uid, 3, "src", 20 * 1024 * 1024, len(src))
    out = store.complete_multipart("dst", uid, [p1, p2, p3])
    data = store.get("dst")[0]
    assert out.size == len(data)
    assert data == src[:6 * 1024 * 1024] + b"X" * (5 * 1024 * 1024) + src[20 * 1024 * 1024:]
    assert list(store.list_multipart("dst")) == []
    # complete is conditional on the destination not existing
    uid2 = store.create_multipart("dst")
    p = store.upload_part("dst", uid2, 1, b"tiny")
    with pytest.raises(PreconditionFailed):
        store.complete_multipart("dst", uid2, [p])
    store.abort_multipart("dst", uid2)
    assert list(store.list_multipart("dst")) == []


def test_staged_files_follow_the_capabilities(store):
    """Every backend and wrapper answers the staged-file calls: with ``local_files`` they
    assemble an object in one pass and install it; without, they refuse with a typed error."""
    views = [store, PrefixedStore(store, "t"), CountingStore(store),
             FaultyStore(store, FaultPlan()), CheckedStore(store, lambda: "tok")]
    for n, view in enumerate(views):
        assert view.capabilities == store.capabilities
        src = view.put(f"src{n}", b"0123456789")
        if not store.capabilities.local_files:
            for call in (view.new_temp_file, lambda: view.adopt("x", "/nowhere"),
                         lambda: view.write_temp_file("/nowhere", [b"x"], source_key="src")):
                with pytest.raises(OperationUnsupported):
                    call()
            continue
        tmp = view.new_temp_file()
        view.write_temp_file(tmp, [(2, 5), b"-", (0, 1), (9, 10)], source_key=f"src{n}",
                             source_etag=src.etag)
        meta = view.adopt(f"out{n}", tmp, mode=PutMode.CREATE)
        assert view.get(f"out{n}")[0] == b"234-09" and meta.size == 6


def test_write_temp_file_pins_the_source(local_uri):
    store = open_store(local_uri)
    old = store.put("src", b"abcdef")
    store.put("src", b"ABCDEF", mode=PutMode.OVERWRITE)
    tmp = store.new_temp_file()
    with pytest.raises(PreconditionFailed):
        store.write_temp_file(tmp, [(0, 3)], source_key="src", source_etag=old.etag)
    with pytest.raises(CorruptObject):
        store.write_temp_file(tmp, [(4, 9)], source_key="src")


def test_s3_rejects_small_non_last_parts(s3_uri):
    store = open_store(s3_uri)
    uid = store.create_multipart("small")
    p1 = store.upload_part("small", uid, 1, b"a" * 1024)
    p2 = store.upload_part("small", uid, 2, b"b" * 1024)
    with pytest.raises(Exception) as info:
        store.complete_multipart("small", uid, [p1, p2])
    assert "EntityTooSmall" in str(info.value)
    store.abort_multipart("small", uid)


def test_selfcheck_accepts_real_store_and_refuses_ignoring_one(store):
    verify_preconditions(store, "ok")
    with pytest.raises(StoreUnsupported) as info:
        verify_preconditions(IgnoresPreconditions(store), "bad")
    assert "if-none-match" in str(info.value) and store.uri in str(info.value)
    assert "lacks conditional create (PutObject If-None-Match: *)" in str(info.value)


def test_selfcheck_refuses_store_ignoring_only_if_match(store):
    class IgnoresIfMatch(IgnoresPreconditions):
        def put(self, key, data, *, mode=PutMode.CREATE, etag=None):
            if mode is PutMode.IF_MATCH:
                mode = PutMode.OVERWRITE
            return self.inner.put(key, data, mode=mode, etag=etag)

    with pytest.raises(StoreUnsupported) as info:
        verify_preconditions(IgnoresIfMatch(store), "bad2")
    assert "check=if-match" in str(info.value)
    assert "lacks compare-and-swap (PutObject If-Match)" in str(info.value)


def _cas_worker(root: str, n: int) -> int:
    store = open_store(root)
    wins = 0
    while wins < n:
        data, meta = store.get("counter")
        try:
            store.put("counter", str(int(data) + 1).encode(), mode=PutMode.IF_MATCH,
                      etag=meta.etag)
            wins += 1
        except PreconditionFailed:
            pass
    return wins


def test_local_cas_is_atomic_across_processes(local_uri):
    store = open_store(local_uri)
    store.put("counter", b"0")
    with worker_processes().Pool(4) as pool:
        wins = pool.starmap(_cas_worker, [(local_uri, 50)] * 4)
    assert sum(wins) == 200
    assert int(store.get("counter")[0]) == 200
    # each lock file was removed by its holder (a waiter that locked a removed one locked
    # again: no update was lost above), so none outlives its use
    assert os.listdir(os.path.join(store.root, ".flightsrv", "locks")) == []


def _churn_worker(root: str, me: int, rounds: int) -> int:
    """Create and delete objects, each the only one in its directory, in directories other
    processes create and delete objects in too (a delete prunes an emptied directory)."""
    store = open_store(root)
    for r in range(rounds):
        key = f"d/{r % 3}/w{me}-{r}"
        store.put(key, b"x", mode=PutMode.CREATE if r % 2 else PutMode.OVERWRITE)
        assert store.get(key)[0] == b"x"
        store.delete(key)
    return rounds


def test_local_writes_survive_concurrent_pruning_of_their_directory(local_uri):
    # a write makes its directory, then links its object in; another process deleting the
    # directory's last object prunes the empty directory in between: the write must still land
    open_store(local_uri).put("keep", b"1")
    with worker_processes().Pool(4) as pool:
        done = pool.starmap(_churn_worker, [(local_uri, i, 400) for i in range(4)])
    assert done == [400] * 4

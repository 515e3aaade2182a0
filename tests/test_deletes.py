"""Deletion vectors, metadata-only deletes, masked scans, concurrency of deletes."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap64

from flightsrv import Warehouse
from flightsrv.table.fingerprint import key_for
from flightsrv.errors import ConfigurationError, CorruptObject
from flightsrv.runtime import Runtime
from flightsrv.store.faults import CountingStore
from flightsrv.table import deletes as dv
from support import worker_processes

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.int64()), ("tag", pa.string())])


def data(lo, hi):
    return pa.table({"id": list(range(lo, hi)), "grp": [i // 1000 for i in range(lo, hi)],
                     "tag": [f"t{i % 13}" for i in range(lo, hi)]}, schema=SCHEMA)


@pytest.fixture
def table(warehouse_uri):
    wh = Warehouse.open(warehouse_uri, Runtime.deterministic(3))
    t = wh.create_table("t", SCHEMA, {"row_group_bytes": 24 * 1024})
    t.append(data(0, 10_000))
    return t


def test_blob_layout_is_delta_compatible():
    bm = BitMap64([0, 7, 1 << 40])
    blob = dv.encode_blob(bm)
    (length,) = struct.unpack(">I", blob[:4])
    assert blob[4:8] == bytes([0xD1, 0xD3, 0x39, 0x64])
    assert struct.unpack("<i", blob[4:8])[0] == 1681511377
    assert length == len(blob) - 8
    assert struct.unpack(">I", blob[-4:])[0] == zlib.crc32(blob[4:-4])
    payload = blob[8:-4]
    assert struct.unpack("<Q", payload[:8])[0] == 2  # two 32-bit buckets: keys 0 and 256
    assert dv.decode_blob(blob, where="x") == bm


@pytest.mark.parametrize("corrupt,check", [
    (lambda b: b[:-1], "length"),
    (lambda b: b[:5], "size"),
    (lambda b: b[:4] + b"\x00\x00\x00\x00" + b[8:], "magic"),
    (lambda b: b[:-4] + bytes(4), "crc32"),
    (lambda b: b[:10] + bytes([b[10] ^ 0xFF]) + b[11:], "crc32"),
])
def test_corrupt_blob_is_refused(corrupt, check):
    blob = dv.encode_blob(BitMap64(range(0, 100, 3)))
    with pytest.raises(CorruptObject) as info:
        dv.decode_blob(corrupt(blob), where="tbl/tombstone/x.dv")
    assert f"check={check}" in str(info.value) and "tbl/tombstone/x.dv" in str(info.value)


def test_delete_returns_count_and_masks_scans(table):
    assert table.delete("id % 10 = 3") == 1000
    assert table.count_rows() == 9000
    got = table.to_table(columns=["id"])["id"].to_pylist()
    assert len(got) == 9000 and all(i % 10 != 3 for i in got)
    assert table.to_table(columns=[]).num_rows == 9000  # count-only scan
    assert table.to_table(columns=[], filter="id < 100").num_rows == 90
    assert table.scan(columns=["tag"]).read_all().num_rows == 9000
    assert table.delete("id % 10 = 3") == 0  # nothing left to match: no commit
    assert table.head().version == 2
    f = table.head().data_files[0]
    assert f.dv.cardinality == 1000 and f.stats_wide
    assert table.count_rows(version=1) == 10_000  # time travel before the delete


def test_large_dv_goes_to_a_tombstone_object(table):
    n = table.delete("id % 3 = 0 OR id % 7 = 1")
    f = table.head().data_files[0]
    assert f.dv.storage == "object" and f.dv.path.startswith("tombstone/")
    blob_obj = table.store.get(f.dv.path)[0]
    assert blob_obj[:1] == b"\x01"  # Delta DV file format byte
    bm = dv.decode_blob(blob_obj[f.dv.offset:f.dv.offset + f.dv.length], where="t")
    assert len(bm) == n == f.dv.cardinality


def test_place_inlines_small_and_puts_the_rest_in_one_object(table):
    """One commit's DVs: empty -> no DV, small -> inline, every large one in ONE object."""
    before = {m.key for m in table.store.list("tombstone/")}
    big1, big2 = BitMap64(range(0, 200_000, 3)), BitMap64(range(1, 300_000, 7))
    small = BitMap64([5, 9, 1000])
    out = dv.place(table, {"a": big1, "b": small, "c": BitMap64(), "d": big2})
    assert out["c"] is None
    assert out["b"].storage is dv.DVStorage.INLINE and out["b"].cardinality == 3
    assert out["a"].storage is out["d"].storage is dv.DVStorage.OBJECT
    assert out["a"].path == out["d"].path
    assert {m.key for m in table.store.list("tombstone/")} - before == {out["a"].path}
    for name, bm in (("a", big1), ("b", small), ("d", big2)):
        assert dv.read_dv(table.store, out[name], table="t", data_file=name) == bm
    assert dv.place(table, {}) == {} and dv.place(table, {"x": BitMap64()}) == {"x": None}
    assert {m.key for m in table.store.list("tombstone/")} - before == {out["a"].path}


def test_split_deleted_moves_whole_row_groups_to_metadata(table):
    f = table.head().data_files[0]
    assert f.row_groups >= 3
    g1 = f.row_group_offsets[1]
    dead = BitMap64(range(g1, g1 + f.row_group_rows(1))) | BitMap64([0, 2])
    groups, rest = dv.split_deleted(f, dead)
    assert groups == (1,) and rest == BitMap64([0, 2])
    assert dv.split_deleted(f, BitMap64([0])) == ((), BitMap64([0]))


@pytest.mark.parametrize("seed", range(20))
def test_remap_positions_matches_deleting_from_a_list(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 500))
    removed = np.unique(rng.integers(0, n, int(rng.integers(0, n))))
    old = np.unique(rng.integers(0, n, int(rng.integers(0, n))))
    rows = [i for i in range(n) if i not in set(removed.tolist())]
    expect = [rows.index(p) for p in old.tolist() if p in rows]
    assert dv.remap_positions(removed, old).tolist() == expect


def test_unknown_dv_storage_is_a_corrupt_entry():
    from flightsrv.table.datafile import file_from_json

    entry = {"path": "data/x.parquet", "size": 1, "etag": "e", "rows": 10,
             "row_group_offsets": [0], "stats": {}, "added_version": 1,
             "dv": {"storage": "pending", "cardinality": 1}}
    with pytest.raises(CorruptObject, match="unknown deletion vector storage") as info:
        file_from_json(entry)
    assert "data/x.parquet" in str(info.value)


def test_corrupt_dv_object_fails_scan_naming_it(table):
    table.delete("id % 3 = 0 OR id % 7 = 1")
    f = table.head().data_files[0]
    raw = bytearray(table.store.get(f.dv.path)[0])
    raw[f.dv.offset + 20] ^= 0xFF
    from flightsrv.store import PutMode
    table.store.put(f.dv.path, bytes(raw), mode=PutMode.OVERWRITE)
    with pytest.raises(CorruptObject) as info:
        table.to_table()
    assert f.dv.path in str(info.value) and "crc32" in str(info.value)


def test_corrupt_inline_dv_fails_scan(table):
    table.delete("id = 5")
    head = table.head()
    f = head.data_files[0]
    blob = bytearray(base64.b64decode(f.dv.data))
    blob[-1] ^= 1
    import dataclasses
    bad = dataclasses.replace(f, dv=dataclasses.replace(f.dv, data=base64.b64encode(
        bytes(blob)).decode()))
    from flightsrv.table.scan import Snapshot
    snap = Snapshot(table, dataclasses.replace(head, data_files=(bad,)))
    with pytest.raises(CorruptObject, match="crc32"):
        snap.to_table()


def test_whole_file_delete_is_metadata_only(warehouse_uri):
    """DuckDB decides which rows match (it reads the WHERE's column); a file whose every row
    matched leaves the manifest: no data file and no deletion vector is written."""
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("t", SCHEMA)
    t.append(data(0, 1000))
    t.append(data(1000, 2000))
    counting = CountingStore(wh.store)
    wh2 = Warehouse(counting)
    t2 = wh2.table("t")
    key_for(wh2)  # the warehouse's fingerprint key, written once by the first erasure
    counting.reset()
    assert t2.delete("id < 1000") == 1000
    # the manifest root (the removal sits in its overlay: no chunk is rewritten) and the
    # pointer, nothing else
    assert sorted(k.split("/")[1] for k in counting.keys["put"]) == [
        "_latest_manifest", "manifest"]
    assert len(t2.head().data_files) == 1 and t2.count_rows() == 1000
    assert t2.head().data_files[0].dv is None


def test_retention_delete_reads_only_the_key_column(warehouse_uri):
    """Time-ordered data: a delete of everything before X marks whole row groups deleted
    (metadata, no deletion vector); statistics prune the row groups that cannot match, and
    only the WHERE's column is read from the others."""
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("ev", SCHEMA, {"row_group_bytes": 512 * 1024})
    t.append(data(0, 300_000))
    f = t.head().data_files[0]
    boundary = f.row_group_offsets[3]
    counting = CountingStore(wh.store)
    t2 = Warehouse(counting).table("ev")
    assert t2.delete(f"id < {boundary}") == boundary
    f2 = t2.head().data_files[0]
    assert f2.deleted_row_groups == (0, 1, 2) and f2.dv is None
    if warehouse_uri.startswith("s3://"):  # (local files are read by DuckDB directly)
        md = pq.ParquetFile(io.BytesIO(wh.store.get(f"ev/{f.path}")[0])).metadata
        id_chunks = sum(md.row_group(g).column(0).total_compressed_size for g in range(3))
        assert counting.bytes_read <= 64 * 1024 + id_chunks + 8192  # footer + id of 3 groups
    assert t2.count_rows() == 300_000 - boundary
    assert min(t2.to_table(columns=["id"])["id"].to_pylist()) == boundary


def test_delete_request_budget(s3_uri):
    wh = Warehouse.open(s3_uri)
    t = wh.create_table("t", SCHEMA)
    t.append(data(0, 50_000))
    t.append(data(50_000, 51_000))
    counting = CountingStore(wh.store)
    wh2 = Warehouse(counting)
    t2 = wh2.table("t")
    t2.head()
    key_for(wh2)  # the fingerprint key: written once per warehouse, by its first erasure
    counting.reset()
    assert t2.delete("id % 10 = 7") == 5100  # scattered rows -> a DV object
    writes = {k: v for k, v in counting.counts.items() if k in ("put", "put_file")}
    assert writes == {"put": 3}  # one DV object, one manifest, one pointer
    assert t2.head().data_files[0].dv.storage == "object"
    counting.reset()
    assert t2.delete("id = 50003") == 1  # a small DV is inlined: manifest + pointer only
    assert {k: v for k, v in counting.counts.items() if k == "put"} == {"put": 2}


def test_bad_delete_predicates_commit_nothing(table):
    v = table.head().version
    for bad in ["id >", "nosuch = 1", "tag = 5", "id > 1; DROP TABLE t", "id > (SELECT 1"]:
        with pytest.raises(ConfigurationError, match="statement="):
            table.delete(bad)
    assert table.head().version == v
    # DuckDB reads a number as a boolean in a WHERE: the delete means what the SELECT means
    assert table.count_rows("id - 5") == 9_999
    assert table.delete("id - 5") == 9_999
    assert table.to_table()["id"].to_pylist() == [5]


def _delete_worker(uri, mod, env):
    os.environ.update(env)
    t = Warehouse.open(uri).table("t")
    return t.delete(f"id % 8 = {mod}")


@pytest.mark.usefixtures("s3_backend")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_eight_processes_delete_disjoint_keys(backend, tmp_path, request):
    uri = str(tmp_path / "wh") if backend == "local" else request.getfixturevalue("s3_uri")
    env = request.getfixturevalue("subprocess_env") if backend == "s3" else {}
    t = Warehouse.open(uri).create_table("t", SCHEMA)
    t.append(data(0, 4000))
    t.append(data(4000, 8000))
    with worker_processes().Pool(8) as pool:
        counts = pool.starmap(_delete_worker, [(uri, m, env) for m in range(8)])
    assert counts == [1000] * 8
    t = Warehouse.open(uri).table("t")
    assert t.count_rows() == 0 and t.to_table().num_rows == 0


def test_delete_and_concurrent_append_both_land(table):
    """A delete whose snapshot predates an append never deletes the appended rows (snapshot
    isolation: the append commutes), and a later delete sees both copies."""
    other = Warehouse.open(table.warehouse.uri).table("t")
    real_commit = table.commit
    calls = {"n": 0}

    def commit_after_append(mutator, **kw):
        if calls["n"] == 0:
            calls["n"] += 1
            other.append(data(0, 100))  # same ids, appended after the delete's snapshot
        return real_commit(mutator, **kw)

    table.commit = commit_after_append
    assert table.delete("id < 100") == 100
    del table.commit
    assert table.count_rows() == 10_000
    assert table.delete("id < 100") == 100  # the appended copies
    assert table.count_rows() == 9_900


def test_concurrent_deletes_merge_bitmaps(table):
    """Two deletes planned on the same snapshot of the same file both land."""
    other = Warehouse.open(table.warehouse.uri).table("t")
    calls = {"n": 0}
    real_commit = table.commit

    def commit_after_rival(mutator, **kw):
        if calls["n"] == 0:
            calls["n"] += 1
            assert other.delete("id % 2 = 0") == 5000  # lands first
        return real_commit(mutator, **kw)

    table.commit = commit_after_rival
    assert table.delete("id % 5 = 0") == 1000  # only the odd multiples of 5 are new
    ids = table.to_table(columns=["id"])["id"].to_pylist()
    assert len(ids) == 4000 and all(i % 2 and i % 5 for i in ids)

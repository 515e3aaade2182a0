"""Format 2 metadata scales (issue 15): a commit writes only the manifest chunks it changes and
a new root, a clustered point query reads at most 2 chunks besides the counter's tail leaves
(§14.2), and a retention delete of whole days from a day-partitioned table is metadata-only.
Request and byte counts come from the counting store wrapper (flightsrv/store/faults.py) over
a real local directory or moto S3."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.store.faults import CountingStore
from flightsrv.table import chunks as C

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
PER_FILE = 10


def _many_files(t, n: int, start: int = 0) -> None:
    """``n`` real data files of ``PER_FILE`` rows each, ids clustered, in one commit."""
    head = t.head()
    files = []
    for i in range(start, start + n):
        ids = pa.array(range(i * PER_FILE, (i + 1) * PER_FILE), pa.int64())
        fs, _, _ = t.write_files(pa.table({"id": ids, "v": [f"r{i}"] * PER_FILE}), head=head)
        files += fs
    t.commit_files(files, expected_schema=head.schema)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """One warehouse with a small table (20 files) and a large one (2.5 leaves of files)."""
    uri = str(tmp_path_factory.mktemp("fmt2") / "wh")
    wh = Warehouse.open(uri)
    small = wh.create_table("small", SCHEMA)
    _many_files(small, 20)
    big = wh.create_table("big", SCHEMA)
    _many_files(big, C.LEAF_MAX * 2 + C.LEAF_MAX // 2)
    return uri


def _one_file_append(uri: str, name: str) -> tuple[int, list[str]]:
    counting = CountingStore(Warehouse.open(uri).store)
    t = Warehouse(counting).table(name)
    t.head()
    counting.reset()
    t.append(pa.table({"id": pa.array([-1], pa.int64()), "v": ["new"]}))
    puts = counting.keys.get("put", []) + counting.keys.get("put_file", []) + \
        counting.keys.get("adopt", [])
    data = [k for k in puts if "/data/" in k]
    return counting.bytes_written, [k for k in puts if k not in data]


def test_commit_writes_changed_chunks_and_a_root_only(tables):
    """A 1-file append writes the data file, at most a few chunks and the root (+ pointer):
    its metadata bytes do not grow with the table (530 files vs 20)."""
    small_bytes, small_keys = _one_file_append(tables, "small")
    big_bytes, big_keys = _one_file_append(tables, "big")
    for keys in (small_keys, big_keys):
        assert sum("/manifest/" in k for k in keys) == 1
        assert sum("/chunks/" in k for k in keys) <= 3
    # the big table's full file list is ~25x the small one's; the commit is not
    big = Warehouse.open(tables).table("big")
    assert len(big.head().data_files) == C.LEAF_MAX * 2 + C.LEAF_MAX // 2 + 1
    assert big_bytes <= 2 * small_bytes + 8192, (big_bytes, small_bytes)


def test_point_query_reads_at_most_two_chunks(tables):
    counting = CountingStore(Warehouse.open(tables).store)
    wh = Warehouse(counting)
    wh.table("big").head()
    counting.reset()
    key = 3 * C.LEAF_MAX // 2 * PER_FILE + 3  # in the middle of the second leaf
    got = wh.sql(f"SELECT id, v FROM big WHERE id = {key}")
    assert got.to_pylist() == [{"id": key, "v": f"r{key // PER_FILE}"}]
    chunk_reads = [k for k in counting.keys.get("get", []) if "/chunks/" in k]
    # one leaf and the index chunk above it, plus the counter's tail leaves (an earlier
    # test appended a file): their references carry no summary to skip them by (§14.2)
    refs = wh.table("big").head().data_files.refs
    tail = sum(1 for r in refs if r.level == 0 and not r.stats)
    assert len(chunk_reads) <= 2 + tail, chunk_reads


@pytest.mark.usefixtures("s3_backend")
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_day_partitioned_retention_delete_is_metadata_only(backend, tmp_path, request):
    uri = str(tmp_path / "wh") if backend == "local" else request.getfixturevalue("s3_uri")
    wh = Warehouse.open(uri)
    schema = pa.schema([("ts", pa.timestamp("us")), ("user_id", pa.int64())])
    wh.sql("CREATE TABLE ev (ts TIMESTAMP, user_id BIGINT) PARTITIONED BY (day(ts))")
    t = wh.table("ev")
    base = dt.datetime(2024, 1, 1)
    ts = [base + dt.timedelta(hours=3 * i) for i in range(8 * 10)]  # 10 days, 8 rows a day
    t.append(pa.table({"ts": pa.array(ts, pa.timestamp("us")),
                       "user_id": pa.array(range(len(ts)), pa.int64())}, schema=schema))
    assert len(t.head().data_files) == 10  # one file per day
    counting = CountingStore(wh.store)
    wh2 = Warehouse(counting)
    wh2.table("ev").head()
    counting.reset()
    assert wh2.table("ev").delete("ts < TIMESTAMP '2024-01-03'") == 16
    puts = counting.keys.get("put", []) + counting.keys.get("put_file", []) + \
        counting.keys.get("adopt", [])
    # no data file and no deletion vector: a root (and at most one chunk) and the pointer
    assert len(puts) <= 3, puts
    assert not [k for k in puts if "/data/" in k or "/dv/" in k], puts
    head = wh.table("ev").head()
    assert len(head.data_files) == 8 and all(f.dv is None for f in head.data_files)
    assert wh.sql("SELECT count(*) AS n FROM ev").to_pylist() == [{"n": 64}]


def test_delete_by_subject_reads_one_bucket(tmp_path):
    """A table bucketed by subject: deleting one subject's rows scans at most 1/N of the
    files (here the bucket and the statistics leave exactly one), DuckDB deciding the rows."""
    from flightsrv.engine.api import ExecInfo, Session

    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.sql("CREATE TABLE e (user_id BIGINT, x INTEGER) PARTITIONED BY (bucket(8, user_id))")
    t = wh.table("e")
    for k in range(3):  # interleaved subjects: every append hits every bucket
        t.append(pa.table({"user_id": pa.array(range(k, 300, 3), pa.int64()),
                           "x": pa.array(range(100), pa.int32())}))
    files = len(t.head().data_files)
    assert files == 24
    info = ExecInfo()
    n = wh.engine.execute_update("DELETE FROM e WHERE user_id IN (205, 205)", Session("t"),
                                 info=info)
    assert n == 1
    assert info.files_scanned <= files // 8, (info.files_scanned, info.files_pruned)
    assert wh.sql("SELECT count(*) AS n FROM e WHERE user_id = 205").to_pylist() == [{"n": 0}]

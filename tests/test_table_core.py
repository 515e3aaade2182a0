"""Table format core: create, append, scan, pruning, time travel, history, errors."""

from __future__ import annotations

import datetime as dt

import duckdb
import pyarrow as pa
import pytest

from flightsrv.engine.prune import Pruner
from flightsrv.sql.plan import PruneTerm
from flightsrv import Warehouse
from flightsrv.errors import (
    ConfigurationError,
    SchemaMismatch,
    TableExists,
    TableNotFound,
    VersionNotFound,
)
from flightsrv.runtime import Runtime
from flightsrv.table.manifest import manifest_key

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC")), ("score", pa.float64())])


def rows(lo: int, hi: int) -> pa.Table:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    return pa.table({
        "id": pa.array(range(lo, hi), pa.int64()),
        "name": [f"user{i}" for i in range(lo, hi)],
        "ts": [base + dt.timedelta(minutes=i) for i in range(lo, hi)],
        "score": [i * 0.5 for i in range(lo, hi)],
    }, schema=SCHEMA)


@pytest.fixture
def wh(warehouse_uri):
    return Warehouse.open(warehouse_uri, Runtime.deterministic(7))


def test_create_append_scan_roundtrip(wh):
    t = wh.create_table("events", SCHEMA, {"user.owner": "tests"})
    assert wh.list_tables() == ["events"]
    m = t.append(rows(0, 1000))
    assert m.version == 1 and m.summary["rows_added"] == 1000
    got = t.to_table().sort_by("id")
    assert got.equals(rows(0, 1000))
    assert t.to_table(columns=["name"]).column_names == ["name"]
    assert t.properties["user.owner"] == "tests"
    f = t.head().data_files[0]
    assert f.path.startswith("data/") and f.path.endswith(".parquet")
    assert t.head().column_stats(f, "id") == {"nulls": 0, "min": 0, "max": 999}


def test_create_twice_and_unknown_table(wh):
    wh.create_table("t", SCHEMA)
    with pytest.raises(TableExists):
        wh.create_table("t", SCHEMA)
    with pytest.raises(TableNotFound) as info:
        wh.table("nope")
    assert "table=nope" in str(info.value)


def test_drop_and_recreate(wh):
    t = wh.create_table("t", SCHEMA)
    t.append(rows(0, 10))
    wh.drop_table("t")
    assert wh.list_tables() == []
    with pytest.raises(TableNotFound):
        wh.table("t")
    t2 = wh.create_table("t", pa.schema([("x", pa.int32())]))
    assert t2.count_rows() == 0 and t2.schema.names == ["x"]
    with pytest.raises(VersionNotFound, match="dropped table"):  # time travel never
        t2.to_table(version=1)  # crosses a DROP: the previous incarnation is gone to SQL


def _query_info(wh, sql):
    from flightsrv.engine.api import Session

    result = wh.engine.execute_query(sql, Session("test"))
    result.reader.read_all()
    return result.info


def test_filter_prunes_files_and_is_exact(wh):
    t = wh.create_table("t", SCHEMA)
    for i in range(5):
        t.append(rows(i * 100, (i + 1) * 100))
    info = _query_info(wh, "SELECT * FROM t WHERE id >= 250 AND id < 260")
    assert (info.files_scanned, info.files_pruned) == (1, 4)  # pruned by manifest statistics
    got = t.to_table(filter="id >= 250 AND id < 260")
    assert sorted(got.column("id").to_pylist()) == list(range(250, 260))
    got = t.to_table(filter="ts < TIMESTAMP '2026-01-01 00:05:00'")
    assert sorted(got.column("id").to_pylist()) == [0, 1, 2, 3, 4]
    assert t.to_table(filter="name LIKE 'user49_'").num_rows == 10


def test_row_group_pruning(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("t", SCHEMA, {"row_group_bytes": 4096})
    t.append(rows(0, 5000))
    f = t.head().data_files[0]
    assert f.row_groups >= 5
    snap = t.snapshot()
    pruner = Pruner(duckdb.connect(), [PruneTerm("id", "=", ("4321",))], snap.schema,
                    snap.manifest)
    (task,) = list(snap.plan(pruner.files, pruner.row_groups))
    assert len(task.row_groups) == 1
    assert t.to_table(filter="id = 4321").column("id").to_pylist() == [4321]


def test_time_travel_every_version(wh):
    t = wh.create_table("t", SCHEMA)
    expected = {0: 0}
    for v in range(1, 6):
        t.append(rows((v - 1) * 10, v * 10))
        expected[v] = v * 10
    t.delete("id % 2 = 0")
    expected[6] = 25
    for v, n in expected.items():
        assert t.count_rows(version=v) == n
        assert t.to_table(version=v).num_rows == n
    created = {h["version"]: h["created_at"] for h in t.history()}
    assert t.snapshot(as_of=created[3]).version == 3
    with pytest.raises(VersionNotFound):
        t.snapshot(version=99)
    with pytest.raises(VersionNotFound):
        t.snapshot(as_of="2000-01-01T00:00:00Z")


def test_history_reports_operations(wh):
    t = wh.create_table("t", SCHEMA)
    t.append(rows(0, 100))
    t.delete("id < 10")
    h = t.history()
    assert [x["operation"] for x in h] == ["delete", "append", "create"]
    assert h[0]["rows_deleted"] == 10 and h[1]["rows_added"] == 100
    assert h[0]["live_rows"] == 90


def test_schema_mismatch_commits_nothing(wh):
    t = wh.create_table("t", SCHEMA)
    before = t.head().version
    with pytest.raises(SchemaMismatch) as info:
        t.append(pa.table({"id": [1], "other": ["x"]}))
    assert "missing=name,ts,score" in str(info.value) and "unexpected=other" in str(info.value)
    with pytest.raises(SchemaMismatch) as info:
        bad = rows(0, 2).set_column(1, "name", pa.array([[1], [2]]))
        t.append(bad)
    assert "column=name" in str(info.value)
    assert t.head().version == before


def test_append_casts_compatible_types(wh):
    t = wh.create_table("t", pa.schema([("id", pa.int64()), ("s", pa.large_string())]))
    t.append(pa.table({"s": ["a", "b"], "id": pa.array([1, 2], pa.int32())}))
    assert t.to_table().to_pydict() == {"id": [1, 2], "s": ["a", "b"]}


def test_append_streams_reader_into_several_files(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("t", SCHEMA, {"target_file_size": 64 * 1024, "row_group_bytes": 16384})
    batches = (rows(i * 2000, (i + 1) * 2000).to_batches()[0] for i in range(10))
    t.append(pa.RecordBatchReader.from_batches(SCHEMA, batches))
    head = t.head()
    assert len(head.data_files) > 1
    assert t.count_rows() == 20000
    assert sorted(t.to_table(columns=["id"]).column("id").to_pylist()) == list(range(20000))


def test_dictionary_only_where_it_pays(local_uri):
    """The writer dictionary-encodes a flat column only when its first batch repeats values
    (an id or a random double is written plain); nested columns keep dictionaries; the
    rows and statistics do not depend on it."""
    import pyarrow.parquet as pq

    from flightsrv.table.writer import dictionary_columns

    n = 20_000
    schema = pa.schema([("id", pa.int64()), ("cat", pa.string()), ("x", pa.float64()),
                        ("flag", pa.bool_()), ("tags", pa.list_(pa.string()))])
    data = pa.table({"id": pa.array(range(n), pa.int64()),
                     "cat": [f"c{i % 5}" for i in range(n)],
                     "x": [((i * 7919) % 1000003) / 3 for i in range(n)],
                     "flag": [i % 2 == 0 for i in range(n)],
                     "tags": [[f"t{i % 3}"] for i in range(n)]}, schema=schema)
    t = Warehouse.open(local_uri).create_table("t", schema)
    t.append(data)
    f = t.head().data_files[0]
    raw, _ = t.store.get(f.path)
    md = pq.read_metadata(pa.BufferReader(raw))
    has_dict = {md.schema.column(i).path: md.row_group(0).column(i).has_dictionary_page
                for i in range(md.num_columns)}
    assert has_dict == {"id": False, "cat": True, "x": False, "flag": False,
                        "tags.list.element": True}
    assert t.to_table().sort_by("id").equals(data)
    assert t.head().column_stats(f, "id") == {"nulls": 0, "min": 0, "max": n - 1}
    assert dictionary_columns(data.slice(0, 100), schema) is True  # too few rows to tell


def test_auto_compression_keeps_zstd_only_where_it_shrinks_a_column(local_uri):
    """The default codec (``compression=auto``) writes a column ZSTD shrinks (sorted ids,
    repeated strings, nested leaves) with ZSTD and a nearly incompressible one (random
    doubles) with Snappy, which DuckDB reads without a decode; ``compression=zstd`` keeps
    ZSTD everywhere, and a first batch too small to tell writes ZSTD. Rows do not depend on
    it."""
    import numpy as np
    import pyarrow.parquet as pq

    n = 20_000
    schema = pa.schema([("id", pa.int64()), ("cat", pa.string()), ("x", pa.float64()),
                        ("tags", pa.list_(pa.string()))])
    rng = np.random.default_rng(3)
    data = pa.table({"id": pa.array(range(n), pa.int64()),
                     "cat": [f"c{i % 5}" for i in range(n)],
                     "x": pa.array(rng.random(n)),
                     "tags": [[f"t{i % 3}"] for i in range(n)]}, schema=schema)
    wh = Warehouse.open(local_uri)

    def codecs(t):
        raw, _ = t.store.get(t.head().data_files[-1].path)
        md = pq.read_metadata(pa.BufferReader(raw))
        return {md.schema.column(i).path: md.row_group(0).column(i).compression
                for i in range(md.num_columns)}

    auto = wh.create_table("auto", schema)
    auto.append(data)
    assert codecs(auto) == {"id": "ZSTD", "cat": "ZSTD", "x": "SNAPPY",
                            "tags.list.element": "ZSTD"}
    assert auto.to_table().sort_by("id").equals(data)
    small = wh.create_table("small", schema)
    small.append(data.slice(0, 100))
    assert set(codecs(small).values()) == {"ZSTD"}
    fixed = wh.create_table("fixed", schema, {"compression": "zstd"})
    fixed.append(data)
    assert set(codecs(fixed).values()) == {"ZSTD"}


def test_auto_compression_decides_once_per_table_for_several_writes(local_uri, monkeypatch):
    """Deciding ``compression=auto`` writes a ZSTD sample (about a third of a 10,000-row
    append) and the dictionary choice counts a sample's distinct values, so a process keeps
    a table's decisions for its next ``AUTO_REUSE`` writes of the same written schema, then
    samples again; another table decides for itself. The files come out the same."""
    import numpy as np
    import pyarrow.parquet as pq

    from flightsrv.table import writer

    monkeypatch.setattr(writer, "AUTO_REUSE", 2)
    samples, counts = [], []
    real, real_dict = writer.column_codecs, writer.dictionary_columns
    monkeypatch.setattr(writer, "column_codecs",
                        lambda *a, **k: samples.append(1) or real(*a, **k))
    monkeypatch.setattr(writer, "dictionary_columns",
                        lambda *a, **k: counts.append(1) or real_dict(*a, **k))
    n = 8_000
    rng = np.random.default_rng(5)
    data = pa.table({"id": pa.array(range(n), pa.int64()), "x": pa.array(rng.random(n))})
    wh = Warehouse.open(local_uri)
    got = []
    for name in ("a", "b"):
        t = wh.create_table(name, data.schema)
        for _ in range(4):
            t.append(data)
            raw, _ = t.store.get(t.head().data_files[-1].path)
            md = pq.read_metadata(pa.BufferReader(raw))
            got.append(tuple(md.row_group(0).column(i).compression for i in range(2)))
    assert got == [("ZSTD", "SNAPPY")] * 8
    # per table: the first write, then the fourth (two reuses); the dictionary choice too
    assert len(samples) == 4 and len(counts) == 4


def test_row_groups_hold_at_most_row_group_rows(local_uri):
    """A row group holds ``row_group_bytes`` of rows but at most ``row_group_rows`` (default
    DuckDB's own 122,880): 300,000 narrow rows (2.4 MB, far under 16 MiB) are three row
    groups, not one; a table may ask for fewer rows, not for fewer than 1,024."""
    from flightsrv.errors import ConfigurationError

    n = 300_000
    data = pa.table({"id": pa.array(range(n), pa.int64())})
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", data.schema)
    t.append(data)
    f = t.head().data_files[0]
    assert [f.row_group_rows(g) for g in range(f.row_groups)] == [122_880, 122_880, 54_240]
    small = wh.create_table("small", data.schema, {"row_group_rows": "50000"})
    small.append(data)
    assert small.head().data_files[0].row_groups == 6
    with pytest.raises(ConfigurationError):
        wh.create_table("tiny", data.schema, {"row_group_rows": "100"})
    assert t.to_table().column("id").to_pylist() == list(range(n))


def test_bad_predicates_are_clear(wh):
    t = wh.create_table("t", SCHEMA)
    t.append(rows(0, 10))
    for bad, word in [("id >", "syntax error"), ("nosuch = 1", "nosuch"),
                      ("name = 3", "Could not convert"), ("id > 1; DROP TABLE t", "one SQL"),
                      ("read_text('/etc/passwd') <> ''", "read_text")]:
        with pytest.raises(ConfigurationError) as info:
            t.to_table(filter=bad)
        assert word in str(info.value) and "statement=" in str(info.value)
    with pytest.raises(ConfigurationError):
        t.to_table(columns=["nosuch"])


def test_reader_rolls_forward_past_a_lagging_pointer(wh):
    t = wh.create_table("t", SCHEMA)
    t.append(rows(0, 5))
    ptr_raw, _ = t.store.get("_latest_manifest")
    t.append(rows(5, 10))
    # the pointer lags (its writer died after the commit point): readers still see v2
    t.store.put("_latest_manifest", ptr_raw, mode=__import__("flightsrv").store.PutMode.OVERWRITE)
    fresh = Warehouse.open(wh.uri).table("t")
    assert fresh.head().version == 2 and fresh.count_rows() == 10
    assert t.store.head(manifest_key(2)).size > 0


def test_in_list_prunes_by_statistics_and_is_exact(wh):
    t = wh.create_table("t", SCHEMA)
    for i in range(4):
        t.append(rows(i * 100, (i + 1) * 100))
    snap = t.snapshot()
    pruner = Pruner(duckdb.connect(), [PruneTerm("id", "in", ("5", "250", "251", "9999"))],
                    snap.schema, snap.manifest)
    assert [task.file.path for task in snap.plan(pruner.files)] == [
        snap.manifest.data_files[0].path, snap.manifest.data_files[2].path]
    assert sorted(t.to_table(filter="id IN (5, 250, 251, 9999)")["id"].to_pylist()) == [
        5, 250, 251]
    assert t.delete("id IN (7, 8, 399, NULL)") == 3
    assert t.count_rows() == 397


def test_the_pointer_swap_after_a_commit_needs_no_read_of_its_own(tmp_path):
    """The commit's own head read gives the pointer's ETag: moving the pointer forward is one
    conditional PUT against it, not a GET and a PUT (S3 requests are money and latency);
    when another writer moved the pointer meanwhile, the swap reads it and still lands."""
    from flightsrv.store import open_store

    class Counting:
        def __init__(self, inner):
            self.inner, self.pointer_gets = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def get(self, key, **kw):
            self.pointer_gets += key.endswith("_latest_manifest")
            return self.inner.get(key, **kw)

    uri = str(tmp_path / "wh")
    store = Counting(open_store(uri))
    t = Warehouse(store, Runtime()).create_table("t", pa.schema([("a", pa.int64())]))
    t.append(pa.table({"a": [1]}))
    before = store.pointer_gets
    t.append(pa.table({"a": [2]}))
    # the append's head (schema, layout) and the commit loop's head; none for the swap
    assert store.pointer_gets - before == 2
    # a stale ETag (another writer committed after this log last read the pointer)
    other = Warehouse.open(uri).table("t")
    t.log.read_pointer()
    other.append(pa.table({"a": [3]}))
    m = t.log.load(t.log.head().version)
    t.log.advance_pointer(m)  # already there: nothing moves backward
    assert t.log.read_pointer()[0].version == m.version
    t.append(pa.table({"a": [4]}))
    assert Warehouse.open(uri).table("t").log.read_pointer()[0].version == t.head().version
    assert sorted(Warehouse.open(uri).table("t").to_table()["a"].to_pylist()) == [1, 2, 3, 4]


def test_a_version_pins_one_snapshot_object_and_a_commit_a_new_one(local_uri):
    """Statements that pin the same version share its Snapshot (what it derived from the
    manifest is computed once per version); a commit makes a new one; both caches are
    bounded."""
    from flightsrv.table.scan import SNAPSHOT_DERIVED_ENTRIES
    from flightsrv.table.table import SNAPSHOTS_KEPT

    t = Warehouse.open(local_uri, Runtime.deterministic(7)).create_table("t", SCHEMA)
    t.append(rows(0, 10))
    first = t.snapshot()
    assert t.snapshot() is first and t.snapshot(version=first.version) is first
    t.append(rows(10, 20))
    after = t.snapshot()
    assert after is not first and after.version == first.version + 1
    assert after.manifest.live_rows == 20 and first.manifest.live_rows == 10
    for i in range(SNAPSHOTS_KEPT):
        t.append(rows(20 + i, 21 + i))
        t.snapshot()
    assert t.snapshot(version=first.version) is not first  # evicted: at most SNAPSHOTS_KEPT
    assert len(t._snapshots) <= SNAPSHOTS_KEPT
    for i in range(SNAPSHOT_DERIVED_ENTRIES + 5):
        assert after.derived(("k", i), lambda i=i: i) == i
    assert after.derived(("k", 0), lambda: "again") == "again"  # the oldest went first
    assert len(after._derived) <= SNAPSHOT_DERIVED_ENTRIES


def test_a_table_name_over_128_characters_is_refused_saying_so(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    wh.create_table("a" * 128, pa.schema([("x", pa.int64())]))
    with pytest.raises(ConfigurationError, match="at most 128 characters"):
        wh.create_table("a" * 129, pa.schema([("x", pa.int64())]))

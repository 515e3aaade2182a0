"""The engine's scans of pinned snapshots: DuckDB's own ``read_parquet`` over clean files on a
local warehouse (UNION ALL the masked Arrow scan of files with deletion vectors or deleted
row groups), the Arrow scan on S3. Both must return exactly the pinned version's live rows;
user SQL still cannot read files."""

from __future__ import annotations

import pathlib

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.engine import relations
from flightsrv.engine.duck import _prefetch
from flightsrv.engine.prune import Pruner
from flightsrv.sql.plan import PruneTerm
from flightsrv.errors import CorruptObject, SqlError, TableNotFound

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("s", pa.string())])
SMALL_GROUPS = {"row_group_bytes": "4096"}  # row groups of 1024 rows (the writer's minimum)
TOTAL = 12_000


def batch(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table({"id": ids, "k": [i % 10 for i in ids], "s": [f"v{i}" for i in ids]},
                    schema=SCHEMA)


def rows(engine, sql, params=None) -> pa.Table:
    return engine.execute_query(sql, Session("s"), params).reader.read_all()


def ids(engine, sql) -> list[int]:
    return rows(engine, sql)["id"].to_pylist()


def three_kinds(wh):
    """Four files of 3000 rows (3 row groups each): one with a DV, one with a deleted row
    group and a DV, one with a deleted row group only, one clean."""
    t = wh.create_table("t", SCHEMA, SMALL_GROUPS)
    for lo in range(0, TOTAL, 3000):
        t.append(batch(lo, lo + 3000))
    v_full = t.head().version
    t.delete("id % 7 = 0 AND id < 3000")
    t.delete("id >= 3000 AND id < 4100")
    t.delete("id >= 6000 AND id < 7024")
    return t, v_full


def _deleted(i: int) -> bool:
    return (i < 3000 and i % 7 == 0) or 3000 <= i < 4100 or 6000 <= i < 7024


def expected_live(v_full: bool = False) -> list[int]:
    return [i for i in range(TOTAL) if v_full or not _deleted(i)]


@pytest.mark.parametrize("masked", ["arrow", "prefetch", "duckdb", "filtered"])
def test_pinned_live_rows_native_and_arrow(warehouse_uri, masked):
    """Every read path of every kind of file; ``masked`` chooses how local files with
    deleted rows are read (the Arrow scan, or DuckDB's reader with the deleted positions
    anti-joined inside DuckDB). A join does not keep the scan's order, so results of the
    DuckDB-masked reads are compared as sets of rows."""
    if warehouse_uri.startswith("s3://") and masked != "filtered":
        pytest.skip("S3 files are always read by the Arrow scan")
    wh = Warehouse.open(warehouse_uri)
    t, v_full = three_kinds(wh)
    files = t.head().data_files
    assert any(f.dv is None and not f.deleted_row_groups for f in files)
    assert any(f.dv is not None for f in files)
    assert any(f.deleted_row_groups and f.dv is not None for f in files)
    assert any(f.deleted_row_groups and f.dv is None for f in files)
    e = DuckEngine(wh, batch_size=256, masked_scans=masked)

    def ordered(sql):  # the manifest order when the Arrow scan reads the dirty files
        got = ids(e, sql)
        return got if masked == "arrow" or not local else sorted(got)

    try:
        local = not warehouse_uri.startswith("s3://")
        assert (e.native_root is not None) == local
        if local:  # every way of reading a file is exercised below
            snap = t.snapshot()
            body = relations.build(snap, None, "r").body  # clean: DuckDB; dirty: Arrow scan
            assert "read_parquet" in body and "r_a" in body
            cur = duckdb.connect()
            pruner = Pruner(cur, [PruneTerm("id", "=", ("4103",))], snap.schema,
                            snap.manifest)
            body = relations.build(snap, None, "r", pruner=pruner).body  # a point: dirty only
            assert "r_a" in body and "read_parquet" not in body
            # inside DuckDB: dirty files by read_parquet, deleted positions anti-joined
            body = relations.build(snap, None, "r", masked_native=True).body
            assert "ANTI JOIN r_d" in body and "r_a" not in body and "BETWEEN" in body
        else:  # S3: files without a DV by pyarrow's dataset scanner, the others masked
            snap = t.snapshot()
            rel = relations.build(snap, None, "r", native=False)
            assert "r_s" in rel.body and "r_a" in rel.body
            # the DML planner's hidden columns need the masked scan's positions
            body = relations.build(snap, None, "r", native=False, hidden=True).body
            assert "r_s" not in body and "r_a" in body
        # manifest order is kept across the runs of clean and dirty files
        want = t.snapshot().to_table(["id"])["id"].to_pylist()
        assert ordered("SELECT id FROM t") == (want if masked == "arrow" or not local
                                               else sorted(want))
        assert ids(e, "SELECT * FROM t ORDER BY id") == expected_live()
        got = rows(e, "SELECT count(*) AS n, sum(k) AS sk, min(s) AS m FROM t").to_pylist()
        live = expected_live()
        assert got == [{"n": len(live), "sk": sum(i % 10 for i in live),
                        "m": min(f"v{i}" for i in live)}]
        assert ids(e, "SELECT id FROM t WHERE id BETWEEN 2995 AND 7100 ORDER BY id") == \
            [i for i in live if 2995 <= i <= 7100]
        p = pa.record_batch([pa.array([4103])], names=["0"])
        assert rows(e, "SELECT s FROM t WHERE id = ?", p).to_pylist() == [{"s": "v4103"}]
        p = pa.record_batch([pa.array([11_000])], names=["0"])
        assert rows(e, "SELECT s FROM t WHERE id = ?", p).to_pylist() == [{"s": "v11000"}]
        assert ids(e, "SELECT id FROM t WHERE id = 7") == []  # deleted by the DV
        assert ordered("SELECT id FROM t WHERE k = 3") == [i for i in live if i % 10 == 3]
        assert ids(e, "SELECT id FROM t WHERE id = 3001 OR id = 8000") == [8000]
        # time travel: the version before the deletes, and each side of a self-join
        assert ids(e, f"SELECT id FROM t AT (VERSION => {v_full}) ORDER BY id") == \
            expected_live(v_full=True)
        n = rows(e, f"SELECT count(*) AS n FROM t AS a AT (VERSION => {v_full}) "
                    "JOIN t AS b USING (id)").to_pylist()
        assert n == [{"n": len(live)}]
    finally:
        e.close()


def test_streaming_query_keeps_its_version_during_commits(warehouse_uri):
    wh = Warehouse.open(warehouse_uri)
    t, _ = three_kinds(wh)
    want = expected_live()
    e = DuckEngine(wh, batch_size=128, min_batch_rows=1)
    try:
        reader = e.execute_query("SELECT id FROM t", Session("s")).reader
        first = reader.read_next_batch()
        # commits while the query streams: deletes (new DVs), an append, a compaction
        t.delete("id % 3 = 1")
        t.append(batch(50_000, 51_000))
        t.compact()
        assert t.head().live_rows != len(want)
        rest = reader.read_all()
        got = first.column(0).to_pylist() + rest.column(0).to_pylist()
        assert sorted(got) == want
        # and a new statement sees the new head
        assert len(ids(e, "SELECT id FROM t")) == t.head().live_rows
    finally:
        e.close()


def test_user_sql_cannot_read_warehouse_files(local_uri):
    wh = Warehouse.open(local_uri)
    t, _ = three_kinds(wh)
    data = t.store.local_path(t.head().data_files[0].path)
    root = pathlib.Path(local_uri)
    e = DuckEngine(wh)
    try:
        for sql in (f"SELECT * FROM read_parquet('{data}')",
                    f"SELECT * FROM read_parquet('{root}/t/data/*.parquet')",
                    f"SELECT * FROM read_parquet(['{data}'], filename=true)",
                    f"SELECT * FROM parquet_scan('{data}')",
                    f"SELECT * FROM parquet_metadata('{data}')",
                    f"SELECT * FROM glob('{root}/*')",
                    f"SELECT * FROM read_text('{root}/t/_latest_manifest')",
                    f"SELECT * FROM read_blob('{data}')",
                    f"SELECT * FROM t WHERE id IN (SELECT id FROM read_parquet('{data}'))",
                    f"COPY (SELECT 1) TO '{root}/t/data/x.parquet'"):
            with pytest.raises(SqlError):
                rows(e, sql)
        for sql in (f"SELECT * FROM '{data}'", f"SELECT * FROM '{root}/t/data/*.parquet'"):
            with pytest.raises(TableNotFound):
                rows(e, sql)
        # the connection itself reads nothing outside the warehouse directory, not even a
        # sibling whose name extends it
        sibling = root.parent / (root.name + "2")
        sibling.mkdir()
        pa.parquet.write_table(batch(0, 3), sibling / "x.parquet")
        cur = e._cursors.cursor()
        for path in (sibling / "x.parquet", f"{root}/../{sibling.name}/x.parquet", "/etc/passwd"):
            with pytest.raises(duckdb.Error):
                cur.sql(f"SELECT * FROM read_parquet('{path}')").fetchall()
        with pytest.raises(duckdb.Error):
            cur.execute("SET allowed_directories=['/']")
        cur.close()
    finally:
        e.close()


def test_corrupt_clean_file_is_corrupt_object_naming_it(local_uri):
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", SCHEMA)
    t.append(batch(0, 100))
    f = t.head().data_files[0]
    path = pathlib.Path(t.store.local_path(f.path))
    raw = bytearray(path.read_bytes())
    raw[-4:] = b"XXXX"  # same size, no Parquet magic
    path.write_bytes(bytes(raw))
    e = DuckEngine(wh)
    try:
        with pytest.raises(CorruptObject) as ei:
            rows(e, "SELECT sum(id) FROM t")
        assert f.path in str(ei.value) and "table=t" in str(ei.value)
        assert rows(e, "SELECT 1 AS one").to_pylist() == [{"one": 1}]
    finally:
        e.close()


def test_prepared_schema_follows_the_table_schema(local_uri):
    wh = Warehouse.open(local_uri)
    wh.create_table("t", SCHEMA).append(batch(0, 10))
    e = DuckEngine(wh)
    try:
        s = Session("s")
        assert e.prepare("SELECT * FROM t", s).dataset_schema.names == ["id", "k", "s"]
        assert e.prepare("SELECT * FROM t", s).dataset_schema.names == ["id", "k", "s"]
        wh.drop_table("t")
        wh.create_table("t", pa.schema([("a", pa.float64())]))
        got = e.prepare("SELECT * FROM t", s).dataset_schema
        assert got.names == ["a"] and got.field("a").type == pa.float64()
        assert rows(e, "SELECT * FROM t").num_rows == 0  # an empty table reads as empty
    finally:
        e.close()


# -- model: any sequence of appends and deletes, every retained version ---------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 400)),
    st.tuples(st.just("mod"), st.integers(2, 6), st.integers(0, 5)),
    st.tuples(st.just("range"), st.integers(0, 1500), st.integers(1, 500)),
), min_size=1, max_size=6)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_native_scan_matches_model(tmp_path_factory, ops):
    wh = Warehouse.open(str(tmp_path_factory.mktemp("model")))
    t = wh.create_table("t", SCHEMA, SMALL_GROUPS)
    model: set[int] = set()
    history = {t.head().version: set()}
    next_id = 0
    for op in ops:
        if op[0] == "append":
            t.append(batch(next_id, next_id + op[1]))
            model |= set(range(next_id, next_id + op[1]))
            next_id += op[1]
        elif op[0] == "mod":
            m, r = op[1], op[2] % op[1]
            t.delete(f"id % {m} = {r}")
            model = {i for i in model if i % m != r}
        else:
            lo, n = op[1], op[2]
            t.delete(f"id >= {lo} AND id < {lo + n}")
            model = {i for i in model if not lo <= i < lo + n}
        history[t.head().version] = set(model)
    e = DuckEngine(wh)
    try:
        assert e.native_root is not None
        for version, live in history.items():
            got = ids(e, f"SELECT id FROM t AT (VERSION => {version}) ORDER BY id")
            assert got == sorted(live), (version, ops)
        got = rows(e, "SELECT count(*) AS n, sum(k) AS sk FROM t WHERE id >= 100").to_pylist()
        want = [i for i in model if i >= 100]
        assert got == [{"n": len(want), "sk": sum(i % 10 for i in want) if want else None}]
    finally:
        e.close()


@pytest.mark.parametrize("masked", ["prefetch", "duckdb", "filtered"])
def test_dml_over_files_masked_inside_duckdb(local_uri, masked):
    """DELETE and UPDATE find their rows' (file, position) through the DuckDB-masked read of
    files that already have deleted rows: the right rows change, deleted rows stay gone."""
    wh = Warehouse.open(local_uri)
    t, _ = three_kinds(wh)
    e = DuckEngine(wh, masked_scans=masked)
    try:
        live = expected_live()
        n = e.execute_update("DELETE FROM t WHERE k = 5 AND id < 9000", Session("s"))
        assert n == sum(1 for i in live if i % 10 == 5 and i < 9000)
        live = [i for i in live if not (i % 10 == 5 and i < 9000)]
        n = e.execute_update("UPDATE t SET s = 'u' || s WHERE k = 4 OR id = 7", Session("s"))
        assert n == sum(1 for i in live if i % 10 == 4)
        got = rows(e, "SELECT id, s FROM t ORDER BY id").to_pylist()
        assert got == [{"id": i, "s": ("u" if i % 10 == 4 else "") + f"v{i}"} for i in live]
    finally:
        e.close()


# -- every read mode on a format-2 table after schema changes, with deletes -----------------

EVOLVED_QUERIES = [
    "SELECT * FROM e",
    "SELECT id, a2, b FROM e WHERE id = 4500",
    "SELECT id, a2 FROM e WHERE id = 13",  # deleted by a DV
    "SELECT id, b, d FROM e WHERE id = 6001",
    "SELECT id FROM e WHERE a2 = 3",  # renamed and widened
    "SELECT id, b FROM e WHERE b = 'nb'",  # re-added: old files read the default
    # long lists on a renamed/widened and on a re-added column (pushed whole by "prefetch")
    "SELECT id FROM e WHERE a2 IN (" + ", ".join(str(i) for i in range(0, 40, 2)) + ")",
    "SELECT id, b FROM e WHERE b IN ('nb', " + ", ".join(f"'n{i}'" for i in range(6000, 6040))
    + ")",
    "SELECT id, b FROM e WHERE b = 'n6002'",
    "SELECT count(*) AS n, sum(a2) AS sa, sum(d) AS sd FROM e WHERE c > 1000.0",
    "SELECT count(*) AS n FROM e WHERE d IS NULL",
    "SELECT id, c FROM e WHERE id BETWEEN 4000 AND 4200",
    "SELECT id FROM e WHERE id IN (13, 26, 27, 4050, 6006, 9100, 12001, 12002)",
    "SELECT id, c FROM e WHERE id >= 12400 AND id < 12600",  # the file with a NaN
    "SELECT a2, count(*) AS n, max(b) AS mb FROM e WHERE id > 100 GROUP BY a2",
    # the statement's own expressions never see a deleted row: these raise on one
    "SELECT count(*) AS n FROM e WHERE id >= 0 AND CASE WHEN id % 13 = 0 AND id < 9000 "
    "THEN error('deleted ' || id) ELSE true END",
    "SELECT count(*) AS n FROM e WHERE id BETWEEN 3000 AND 4200 AND CASE WHEN id >= 3000 "
    "AND id < 4100 THEN CAST('row ' || id AS INTEGER) = 1 ELSE true END",
]


def _evolved(wh, name: str):
    """A format-2 table whose files hold three written schemas, with deletes in each:

    - f0 (id, a INT32, b, c), ids 0..2999; then a is renamed a2;
    - f1 (id, a2 INT32, b, c), ids 3000..5999; then b is dropped and added again as a new
      column b (default 'nb' for rows already written), d BIGINT is added, a2 widened to
      BIGINT;
    - f2 (id, a2, c, b, d), ids 6000..8999; f3 the same, ids 9000..11999, kept clean;
      f4 the same, ids 12000..12999, with a NaN in c (its statistics cannot bound c).

    Deletes: ``id % 13 = 0`` below 9000 (deletion vectors), ids 3000..4099 (f1's first row
    group whole, then a DV), id 12001. Returns (table, expected live rows by id)."""
    schema = pa.schema([("id", pa.int64()), ("a", pa.int32()), ("b", pa.string()),
                        ("c", pa.float64())])
    t = wh.create_table(name, schema, SMALL_GROUPS, format_version=2)
    rng = {}

    def old(lo, hi, a="a"):
        ids_ = list(range(lo, hi))
        t.append(pa.table({"id": ids_, a: pa.array([i % 7 for i in ids_], pa.int32()),
                           "b": [f"o{i}" for i in ids_], "c": [i * 0.5 for i in ids_]}))
        rng.update({i: {"id": i, "a2": i % 7, "b": "nb", "c": i * 0.5, "d": None}
                    for i in ids_})

    def new(lo, hi, nan=None):
        ids_ = list(range(lo, hi))
        c = [float("nan") if i == nan else i * 0.5 for i in ids_]
        t.append(pa.table({"id": ids_, "a2": [i % 7 for i in ids_], "c": c,
                           "b": [f"n{i}" for i in ids_], "d": [i * 2 for i in ids_]}))
        rng.update({i: {"id": i, "a2": i % 7, "b": f"n{i}", "c": c[i - lo], "d": i * 2}
                    for i in ids_})

    old(0, 3000)
    t.rename_column("a", "a2")
    old(3000, 6000, a="a2")
    t.drop_column("b")
    t.add_column("b", pa.string(), default="nb")
    t.add_column("d", pa.int64())
    t.alter_column_type("a2", pa.int64())
    new(6000, 9000)
    new(9000, 12000)
    new(12000, 13000, nan=12500)
    t.delete("id % 13 = 0 AND id < 9000")
    t.delete("id >= 3000 AND id < 4100")
    t.delete("id = 12001")
    live = {i: r for i, r in rng.items()
            if not ((i % 13 == 0 and i < 9000) or 3000 <= i < 4100 or i == 12001)}
    return t, live


def _expected(live: dict, schema: pa.Schema, sql: str) -> list:
    """``sql`` run by plain DuckDB over the expected live rows."""
    e = pa.Table.from_pylist(list(live.values()), schema=schema)  # noqa: F841 - read by name
    con = duckdb.connect()
    try:
        return _canon(con.sql(sql).to_arrow_table())
    finally:
        con.close()


def _canon(table: pa.Table) -> list:
    """Rows as sorted tuples (a join does not keep order; NaN made comparable)."""
    out = []
    for r in table.to_pylist():
        out.append(tuple("NaN" if isinstance(v, float) and v != v else v for v in r.values()))
    return sorted(out, key=repr)


@pytest.mark.parametrize("masked", ["arrow", "prefetch", "duckdb", "filtered"])
def test_every_read_mode_after_schema_changes_with_deletes(local_uri, masked):
    """Files of older schemas with deletes are read by field id in every mode (a renamed
    column by its old physical name, a dropped-and-re-added column as the new column's
    default, a widened column cast), deleted rows never appear nor reach the statement's
    expressions, and DML through these reads changes exactly the right rows."""
    wh = Warehouse.open(local_uri)
    t, live = _evolved(wh, "e")
    snap = t.snapshot()
    schema = snap.schema
    assert schema.names == ["id", "a2", "c", "b", "d"]
    files = snap.manifest.data_files
    assert len({f.schema_id for f in files}) == 3
    assert sum(1 for f in files if f.deleted_row_groups) == 1
    assert sum(1 for f in files if f.dv is not None) == 4
    # the masked read spells each written schema's projection and keeps NaN files on Arrow
    body = relations.build(snap, None, "r", masked_native=True).body
    assert body.count("ANTI JOIN r_d") == 3 and '"a" AS "a2"' in body
    # the writer keeps a field's physical name: "a" is a2 in every file, cast where older
    assert "'nb' AS \"b\"" in body and 'CAST("a" AS BIGINT) AS "a2"' in body
    nan_file = snap.store.local_path(files[4].path)
    assert "r_a" in body and nan_file not in body
    e = DuckEngine(wh, masked_scans=masked)
    try:
        for sql in EVOLVED_QUERIES:
            assert _canon(rows(e, sql)) == _expected(live, schema, sql), sql
        # DML finds (file, position) through the same reads
        n = e.execute_update("DELETE FROM e WHERE a2 = 5 AND id < 10000", Session("s"))
        gone = [i for i, r in live.items() if r["a2"] == 5 and i < 10000]
        assert n == len(gone)
        for i in gone:
            del live[i]
        n = e.execute_update("UPDATE e SET b = b || '!' WHERE a2 = 4 AND id > 2000",
                             Session("s"))
        changed = [i for i, r in live.items() if r["a2"] == 4 and i > 2000]
        assert n == len(changed)
        for i in changed:
            live[i] = {**live[i], "b": live[i]["b"] + "!"}
        for sql in EVOLVED_QUERIES:
            assert _canon(rows(e, sql)) == _expected(live, schema, sql), sql
    finally:
        e.close()


def test_filtered_mode_reads_with_duckdb_only_for_exact_hints(local_uri):
    """``masked_scans="filtered"`` reads files with deleted rows by DuckDB when a hint is
    exact per row; a long IN list (only its range is pushed) keeps the Arrow scan."""
    wh = Warehouse.open(local_uri)
    t, _ = three_kinds(wh)
    snap = t.snapshot()
    con = duckdb.connect()
    try:
        many = tuple(str(i) for i in range(0, 12_000, 97))
        for terms, want in (([PruneTerm("id", "=", ("4103",))], True),
                            ([PruneTerm("k", "in", ("1", "2"))], True),
                            ([PruneTerm("id", "in", many)], False),
                            ([PruneTerm("id", "in", many), PruneTerm("k", "<", ("3",))], True)):
            assert relations.pushable(Pruner(con, terms, snap.schema, snap.manifest)) == want
        assert not relations.pushable(None)
    finally:
        con.close()
    e = DuckEngine(wh)
    try:
        lst = ", ".join(str(i) for i in range(0, 12_000, 97))
        live = set(expected_live())
        assert sorted(ids(e, f"SELECT id FROM t WHERE id IN ({lst})")) == \
            [i for i in range(0, 12_000, 97) if i in live]
    finally:
        e.close()


@pytest.mark.parametrize("masked", ["arrow", "prefetch", "duckdb", "filtered"])
def test_pushed_hints_never_fail_on_a_deleted_value(local_uri, masked):
    """The pruning hints evaluated inside a masked run see deleted rows, so a hint whose
    comparison would cast the column (a BIGINT or DECIMAL(38,0) column against a decimal
    literal of high scale fails naming the value) is not evaluated there; the statement
    still gets its answer from the live rows."""
    import decimal

    schema = pa.schema([("id", pa.int64()), ("b", pa.int64()), ("x", pa.decimal128(38, 0))])
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", schema, SMALL_GROUPS)
    n = 3000
    big = (1 << 63) - 1
    t.append(pa.table({"id": list(range(n)), "b": [big if i == 7 else i for i in range(n)],
                       "x": [decimal.Decimal(9 * 10 ** 37 if i == 7 else i) for i in range(n)]},
                      schema=schema))
    t.delete("id = 7")
    e = DuckEngine(wh, masked_scans=masked)
    try:
        for where, want in (("id >= 0 AND b < 1.12345678901234567890123", 2),
                            ("b < 1.12345678901234567890123", 2),
                            ("id >= 0 AND x < 1.25", 2),
                            ("id BETWEEN 5 AND 9 AND x IN (1.5, 8)", 1),
                            ("id < 100 AND b = 7", 0)):
            got = rows(e, f"SELECT count(*) AS n FROM t WHERE {where}").to_pylist()
            assert got == [{"n": want}], where
        # bound parameters arrive as typed constants (CAST(v AS DECIMAL(38,23)))
        p = pa.record_batch([pa.array([decimal.Decimal("1.12345678901234567890123")],
                                      pa.decimal128(38, 23))], names=["0"])
        got = rows(e, "SELECT count(*) AS n FROM t WHERE id >= 0 AND b < ?", p).to_pylist()
        assert got == [{"n": 2}]
    finally:
        e.close()


def test_filtered_mode_reads_with_duckdb_only_selective_files(local_uri):
    """With ``masked_max_groups`` (the ``"filtered"`` mode) a file with deleted rows is read
    by DuckDB only when statistics keep few of its row groups; a filter that keeps them all
    (the anti join would probe every row) keeps the Arrow scan."""
    wh = Warehouse.open(local_uri)
    t, _ = three_kinds(wh)
    snap = t.snapshot()
    con = duckdb.connect()
    try:
        def body(*terms):
            pruner = Pruner(con, list(terms), snap.schema, snap.manifest)
            return relations.build(snap, None, "r", pruner=pruner, masked_native=True,
                                   masked_max_groups=2).body

        # one row group of one dirty file; file 0 has a deleted row in every row group, so
        # its bounds (maybe a deleted value) are unknown: it is read, by the Arrow scan, for
        # any filter (issue 30: pruning never depends on a deleted row's value)
        point = body(PruneTerm("id", "=", ("4103",)))
        assert "ANTI JOIN r_d" in point and "r_a0" in point and "r_a1" not in point
        bound = body(PruneTerm("id", "=", ("CAST(4103 AS BIGINT)",)))  # a bound parameter
        assert "ANTI JOIN r_d" in bound and "r_a0" in bound and "r_a1" not in bound
        broad = body(PruneTerm("k", "=", ("3",)))  # every row group may match
        assert "ANTI JOIN" not in broad and "r_a" in broad
    finally:
        con.close()


def test_prefetch_mode_hands_the_statement_live_rows_only(local_uri):
    """``masked_scans="prefetch"`` (the default) reads a selective file with deleted rows by
    DuckDB *before* the statement, with engine conditions only, and registers the live rows
    as an Arrow table: the statement's view has no anti join and no barrier, and the
    registered table holds no deleted row, so nothing the optimizer does can show one."""
    wh = Warehouse.open(local_uri)
    t, _ = three_kinds(wh)
    snap = t.snapshot()
    con = duckdb.connect()
    seen = []

    def prefetch(sql, tables):  # the engine's own prefetch, recording what it is given
        seen.append((sql, {k: v["v"].to_pylist() for k, v in tables.items()}))
        return _prefetch(con, sql, tables)

    try:
        scattered = tuple(range(7, TOTAL, 251))  # every file, most row groups, some deleted
        for term, want in ((PruneTerm("id", "=", ("4103",)), {4103}),
                           (PruneTerm("id", "between", ("2990", "3010")), None),
                           (PruneTerm("id", "in", tuple(map(str, scattered))), set(scattered))):
            pruner = Pruner(con, [term], snap.schema, snap.manifest)
            rel = relations.build(snap, None, "r", pruner=pruner, masked_native=True,
                                  masked_max_groups=2, prefetch=prefetch, hidden=True)
            assert "ANTI JOIN" not in rel.body and relations.BARRIER not in rel.body, rel.body
            sql, lists = seen[-1]
            if term.op == "in":  # a listed set is prefetched whatever the statistics keep,
                # its integers read from a registered table instead of 48 literals
                assert "r_a" not in rel.body, rel.body
                assert list(lists.values()) == [list(scattered)] and \
                    f"IN (SELECT v FROM {next(iter(lists))})" in sql, sql
            tables = [v for k, v in rel.readers.items() if k.startswith("r_p")]
            assert tables and "read_parquet" in sql
            got = {i for tb in tables for i in tb.column("id").to_pylist()}
            assert not any(_deleted(i) for i in got)  # no deleted row was registered
            if want is not None:  # (the clean last file, ids 9000-11999, is read natively)
                assert got == {i for i in want if not _deleted(i) and i < 9000}
            # the hidden columns name each row's file and physical position
            for tb in tables:
                for fi, pos, i in zip(tb.column(relations.FILE_COLUMN).to_pylist(),
                                      tb.column(relations.POSITION_COLUMN).to_pylist(),
                                      tb.column("id").to_pylist()):
                    f = rel.file_list[fi]
                    assert t.snapshot().take({f.path: np.array([pos])}, ["id"],
                                             files=[f])["id"].to_pylist() == [i]
    finally:
        con.close()


TYPED = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    ("d", pa.decimal128(18, 3)), ("ts", pa.timestamp("us", tz="UTC")), ("day", pa.date32()),
    ("b", pa.binary()), ("flag", pa.bool_()), ("f", pa.float64()),
    ("tags", pa.list_(pa.string())), ("pt", pa.struct([("x", pa.int32()), ("y", pa.string())])),
    ("m", pa.map_(pa.string(), pa.int64())),
])


def _typed(lo: int, hi: int) -> pa.Table:
    import datetime
    import decimal

    r = range(lo, hi)
    return pa.table({
        "id": list(r), "d": [decimal.Decimal(i) / 1000 for i in r],
        "ts": [datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
               + datetime.timedelta(seconds=i) for i in r],
        "day": [datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 300) for i in r],
        "b": [bytes([i % 256]) * 3 for i in r], "flag": [i % 3 == 0 for i in r],
        "f": [float("nan") if i % 97 == 0 else i / 7 for i in r],
        "tags": [[f"t{i % 5}"] * (i % 3) for i in r],
        "pt": [{"x": i, "y": None if i % 4 else f"y{i}"} for i in r],
        "m": [[("k", i)] if i % 2 else [] for i in r],
    }, schema=TYPED)


def test_every_read_path_returns_the_same_rows_and_types(warehouse_uri):
    """The same table on each backend (on S3 files with no deletion vector go through
    pyarrow's dataset scanner, the others through the masked scan): every type, a NOT NULL
    column, NaN, pruned row groups, a deleted row group, a renamed and an added column
    (older files then need the masked scan's projection) give the rows and types a plain
    DuckDB query over the expected rows gives."""
    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("ty", TYPED, SMALL_GROUPS)
    for lo in range(0, 4000, 2000):
        t.append(_typed(lo, lo + 2000))
    t.delete("id >= 1024 AND id < 2000")  # the first file's second row group: no DV
    e = DuckEngine(wh)
    live = [i for i in range(4000) if not 1024 <= i < 2000]
    con = duckdb.connect()
    try:
        def check(expected: pa.Table, columns: str) -> None:
            con.register("expected", expected)
            for where in ("", " WHERE id BETWEEN 2500 AND 2600",
                          " WHERE day = DATE '2026-03-01'", " WHERE isnan(f)", " WHERE f > 100"):
                got = rows(e, f"SELECT {columns} FROM ty{where} ORDER BY id")
                base = con.sql(f"SELECT {columns} FROM expected{where} ORDER BY id")
                base = base.to_arrow_table()
                assert got.schema.types == base.schema.types, where
                assert _nan_equal(got, base), where
            con.unregister("expected")

        expected = _typed(0, 4000).take(pa.array(live))
        if warehouse_uri.startswith("s3://"):  # no DV anywhere: every file by the dataset
            body = relations.build(t.snapshot(), None, "r", native=False).body
            assert "r_s" in body and "r_a" not in body
        check(expected, "*")
        # a renamed and an added column: the old files need a projection (the masked scan)
        e.execute_update("ALTER TABLE ty RENAME COLUMN d TO amount", Session("s"))
        e.execute_update("ALTER TABLE ty ADD COLUMN extra INTEGER DEFAULT 7", Session("s"))
        t.append(_typed(4000, 4500).rename_columns(
            ["amount" if c == "d" else c for c in TYPED.names]).append_column(
            "extra", pa.array([8] * 500, pa.int32())))
        expected = pa.concat_tables([
            expected.rename_columns(["amount" if c == "d" else c for c in TYPED.names])
            .append_column("extra", pa.array([7] * len(live), pa.int32())),
            _typed(4000, 4500).rename_columns(["amount" if c == "d" else c for c in TYPED.names])
            .append_column("extra", pa.array([8] * 500, pa.int32()))])
        check(expected, "*")
        check(expected, "id, amount, extra")
    finally:
        con.close()
        e.close()


def _nan_equal(a: pa.Table, b: pa.Table) -> bool:
    def canon(v):
        return "NaN" if isinstance(v, float) and v != v else v

    return [{k: canon(v) for k, v in r.items()} for r in a.to_pylist()] == \
        [{k: canon(v) for k, v in r.items()} for r in b.to_pylist()]


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_broken_data_file_is_named_on_every_read_path(warehouse_uri, damage):
    """A data file that is not valid Parquet (same size) or is gone fails the statement with
    CorruptObject / ObjectNotFound naming the table and the object, on the local native read
    and on S3's dataset scanner alike, and no warehouse path or relation name leaks."""
    from flightsrv.errors import ObjectNotFound
    from flightsrv.store.base import PutMode

    wh = Warehouse.open(warehouse_uri)
    t = wh.create_table("t", SCHEMA)
    t.append(batch(0, 5000))
    f = t.head().data_files[0]
    if damage == "corrupt":
        body = t.store.get(f.path)[0]
        t.store.put(f.path, body[:8] + bytes(len(body) - 16) + body[-8:],
                    mode=PutMode.OVERWRITE)
        want = CorruptObject
    else:
        t.store.delete(f.path)
        want = ObjectNotFound
    e = DuckEngine(wh)
    try:
        for sql in ("SELECT count(*) FROM t", "SELECT * FROM t WHERE id > 10"):
            with pytest.raises(want) as info:
                rows(e, sql)
            text = str(info.value)
            assert f.path in text and "table=t" in text, text
            assert f"version={t.head().version}" in text, text
            assert "__fsrv" not in text and "bench/" not in text, text
            root = warehouse_uri.split("://", 1)[-1]
            assert root not in text.replace(f.path, ""), text
    finally:
        e.close()

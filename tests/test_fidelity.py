"""SQL fidelity against DuckDB 2.0.1, second pass (issue 31): each finding compared with
plain DuckDB running the same statements on the same rows (or with the documented error).

- result column names are DuckDB's for the user's statement, never an internal relation
  name (``__fsrv_r0``), and so are error messages;
- statistics, partition values and pruning take every date and timestamp DuckDB stores
  (BC, years past 9999, ±infinity);
- ALTER COLUMN ... TYPE refuses, before commit, a widening some stored value cannot take;
- statements refused with misleading errors run: a CTAS column of type NULL, MERGE ... SET *
  from a bare table, bucket/truncate partitions at the ends of their types;
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.sql.names import PublicNames


class Twin:
    """flightsrv's engine over a fresh warehouse and plain in-memory DuckDB, side by side."""

    def __init__(self, root):
        self.wh = Warehouse.open(root)
        self.engine = DuckEngine(self.wh)
        self.plain = duckdb.connect()
        self.session = Session("s")

    def run(self, sql: str):
        """A statement on both: (flightsrv's count, DuckDB's rows)."""
        want = self.plain.execute(sql).fetchall()
        return self.engine.execute_update(sql, self.session), want

    def query(self, sql: str) -> pa.Table:
        return self.engine.execute_query(sql, self.session).reader.read_all()

    def same(self, sql: str) -> pa.Table:
        """A query on both: the same column names, types and rows."""
        got = self.query(sql)
        want = self.plain.sql(sql).to_arrow_table()
        assert got.schema.names == want.schema.names, sql
        assert got.schema.types == want.schema.types, sql
        assert got.to_pylist() == want.to_pylist(), sql
        return got


@pytest.fixture
def twin(tmp_path):
    t = Twin(str(tmp_path / "wh"))
    yield t
    t.engine.close()


@pytest.mark.parametrize("query", [
    "SELECT (SELECT count(*) FROM t)",
    "SELECT EXISTS (SELECT 1 FROM t AS x WHERE x.k = 1)",
    "SELECT 1 IN (SELECT k FROM main.t)",
    "SELECT k NOT IN (SELECT k FROM t WHERE k > 1) FROM t ORDER BY k",
    "SELECT (SELECT max(k) FROM \"select\"), (SELECT min(k) FROM T)",
    "SELECT (SELECT count(*) FROM t t1, t AS t2 WHERE t1.k = t2.k)",
])
def test_result_names_are_duckdbs(twin, query):
    for sql in ["CREATE TABLE t (k INTEGER)", "INSERT INTO t VALUES (1), (2)",
                'CREATE TABLE "select" (k INTEGER)', 'INSERT INTO "select" VALUES (3)']:
        twin.run(sql)
    got = twin.same(query)
    assert not any("__fsrv" in n for n in got.schema.names)
    prepared = twin.engine.prepare(query, twin.session)  # what Flight SQL announces
    assert prepared.dataset_schema.names == got.schema.names


def test_messages_name_no_internal_relation():
    names = PublicNames([("__fsrv_r0", "t", False), ("__fsrv_r1", "main.u", True)])
    assert names.message("Invalid Input Error: reading the stream registered as "
                         "'__fsrv_r0_a0' failed") == \
        "Invalid Input Error: reading table 't' failed"
    assert names.message("x in (SELECT k FROM __fsrv_r1 AS v), __fsrv_r1_s2, __fsrv_zz") == \
        "x in (SELECT k FROM main.u AS v), main.u, (internal)"


def test_ctas_and_dml_errors_show_the_users_names(twin):
    for sql in ["CREATE TABLE t (k INTEGER NOT NULL, d DATE)",
                "INSERT INTO t VALUES (1, DATE '2020-01-01'), (2, NULL)",
                "CREATE TABLE c AS SELECT (SELECT count(*) FROM t), EXISTS (SELECT 1 FROM t)"]:
        twin.run(sql)
    twin.same("SELECT * FROM c")
    for sql in ["UPDATE t SET k = NULL",
                "MERGE INTO t USING (SELECT 1 AS k) s ON t.k = s.k "
                "WHEN MATCHED THEN UPDATE SET k = NULL"]:
        with pytest.raises(duckdb.Error) as want:
            twin.plain.execute(sql)
        with pytest.raises(Exception) as got:
            twin.engine.execute_update(sql, twin.session)
        assert str(want.value).splitlines()[0] in str(got.value)
        assert "__fsrv" not in str(got.value) and "internal" not in str(got.value)


def test_time_travelled_references_are_named_as_duckdb_prints_them(twin):
    """DuckDB prints ``t AT (VERSION => 1)``; two subqueries over two versions of one table
    keep two names (the corpus reads them by name)."""
    twin.run("CREATE TABLE tt (k INTEGER)")
    twin.run("INSERT INTO tt VALUES (1)")
    got = twin.query("SELECT (SELECT count(*) FROM tt AT (VERSION => 1)), "
                     "(SELECT count(*) FROM tt)")
    assert got.schema.names == ["(SELECT count_star() FROM tt AT (VERSION => 1))",
                                "(SELECT count_star() FROM tt)"]
    want = twin.plain.execute("SELECT json_deserialize_sql(json_serialize_sql("
                              "'SELECT (SELECT count(*) FROM tt AT (VERSION => 1))'))")
    assert want.fetchall()[0][0] == "SELECT " + got.schema.names[0]


EDGE_ROWS = ("(1, DATE '0044-03-15 (BC)', TIMESTAMP '0044-03-15 (BC) 10:00:00', NULL), "
             "(2, DATE '12345-01-01', TIMESTAMP '12345-01-01 00:00:00', "
             "TIMESTAMPTZ '12345-01-01 00:00:00+00'), "
             "(3, 'infinity', 'infinity', '-infinity'), (4, '-infinity', '-infinity', 'infinity'), "
             "(5, DATE '2020-01-01', TIMESTAMP '2020-01-01 10:00:00', NULL), (6, NULL, NULL, NULL)")


@pytest.mark.parametrize("partitioned", ["", "identity(d)", "identity(ts)", "year(d)",
                                         "day(ts)", "month(tz)", "bucket(3, ts)",
                                         "bucket(2, d)", "bucket(3, tz)"])
def test_dates_outside_pythons_range_prune_and_partition_as_duckdb(twin, partitioned):
    """BC dates, years past 9999 and ±infinity: pruning a file with a deletion vector, and
    partition values, went through Python ``datetime`` and failed (OverflowError); such a
    row could not even be deleted by its date. A bucket partition pruned ``= 'infinity'``
    by the bucket of ``datetime.max`` (DuckDB's Python value for infinity) and lost the
    rows."""
    create = "CREATE TABLE t (k INTEGER, d DATE, ts TIMESTAMP, tz TIMESTAMPTZ)"
    twin.plain.execute(create)
    twin.engine.execute_update(create + (f" PARTITIONED BY ({partitioned})" if partitioned
                                         else ""), twin.session)
    twin.run(f"INSERT INTO t VALUES {EDGE_ROWS}")
    twin.run("DELETE FROM t WHERE k = 5")  # a deletion vector on the file(s)
    for where in ["d IS NOT NULL", "d > DATE '2020-01-01'", "d = 'infinity'",
                  "d < DATE '0001-01-01'", "ts < TIMESTAMP '0001-01-01'", "ts = '-infinity'",
                  "ts > TIMESTAMP '9999-12-31 23:59:59'", "tz = 'infinity'",
                  "d BETWEEN DATE '0100-01-01 (BC)' AND DATE '20000-01-01'"]:
        twin.same(f"SELECT k FROM t WHERE {where} ORDER BY k")
    for sql in ["DELETE FROM t WHERE d = DATE '0044-03-15 (BC)'",
                "UPDATE t SET k = k + 10 WHERE ts = 'infinity'",
                "DELETE FROM t WHERE tz = '-infinity'"]:
        got, want = twin.run(sql)
        assert got == want[0][0], sql
        twin.same("SELECT k, d::VARCHAR, ts::VARCHAR, tz::VARCHAR FROM t ORDER BY k")


@pytest.mark.parametrize("value, to", [
    ("DATE '5877642-06-25'", "TIMESTAMP"), ("DATE '300000-01-01'", "TIMESTAMP"),
    ("DATE '2500-01-01'", "TIMESTAMP_NS"), ("'infinity'", "TIMESTAMP"),
    ("DATE '0044-03-15 (BC)'", "TIMESTAMP_MS"), ("DATE '2000-01-01'", "TIMESTAMP_NS"),
])
@pytest.mark.parametrize("deleted", [False, True])
def test_alter_type_refuses_a_widening_the_data_cannot_take(twin, value, to, deleted):
    """DuckDB refuses ``ALTER COLUMN d TYPE TIMESTAMP`` when a stored date cannot be cast;
    flightsrv committed the metadata and every later read of ``d`` failed. A deleted row's
    value counts too (reads cast every stored row) and is not shown."""
    twin.run("CREATE TABLE t (k INTEGER, d DATE)")
    twin.run(f"INSERT INTO t VALUES (1, {value}), (2, DATE '2020-01-01'), (3, NULL)")
    twin.run("INSERT INTO t VALUES (4, DATE '1999-12-31')")  # a file its statistics decide
    alter = f"ALTER TABLE t ALTER COLUMN d TYPE {to}"
    try:
        twin.plain.execute(alter)
        refused = False
    except duckdb.Error:
        refused = True
    if deleted:
        twin.engine.execute_update("DELETE FROM t WHERE k = 1", twin.session)
    before = twin.wh.table("t").head().version
    if refused:
        with pytest.raises(Exception, match="cannot be cast to the new type") as ei:
            twin.engine.execute_update(alter, twin.session)
        assert twin.wh.table("t").head().version == before
        assert value.split("'")[1] not in str(ei.value)
        assert twin.query("SELECT count(d) FROM t").column(0).to_pylist() == \
            [3 - deleted]
    else:
        twin.engine.execute_update(alter, twin.session)
        if not deleted:
            twin.same("SELECT k, d::VARCHAR AS d, typeof(d) AS t FROM t ORDER BY k")


def test_a_ctas_column_of_type_null_takes_inserts_as_duckdb(twin):
    """``CREATE TABLE n AS SELECT 1 AS a, NULL AS b`` made every later INSERT fail with a
    Parser Error on SQL the user did not write (``CAST(... AS NULL)``)."""
    for sql in ["CREATE TABLE n AS SELECT 1 AS a, NULL AS b", "INSERT INTO n VALUES (2, NULL)",
                "INSERT INTO n (a) VALUES (3)", "UPDATE n SET a = a + 10 WHERE a > 1"]:
        got, want = twin.run(sql)
        assert got == want[0][0], sql
    twin.same("SELECT a, b, typeof(b) AS t FROM n ORDER BY a")


@pytest.mark.parametrize("source", ["src", "src AS s"])
def test_merge_star_with_a_bare_source_table_reads_all_its_columns(twin, source):
    """``UPDATE SET *`` / ``INSERT *`` from a bare table saw only the columns the statement
    named (``table "m" has 2 columns but 1 values were supplied``)."""
    alias = source.split()[-1]
    for sql in ["CREATE TABLE m (id INTEGER, v VARCHAR)", "INSERT INTO m VALUES (1, 'a'), (2, 'b')",
                "CREATE TABLE src (id INTEGER, v VARCHAR)",
                "INSERT INTO src VALUES (1, 'A'), (3, 'C')",
                f"MERGE INTO m USING {source} ON m.id = {alias}.id "
                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"]:
        got, want = twin.run(sql)
        assert got == (want[0][0] if want else 0), sql
    twin.same("SELECT * FROM m ORDER BY id")


@pytest.mark.parametrize("column, spec, value", [
    ("UBIGINT", "bucket(4, c)", "18446744073709551615"),
    ("UBIGINT", "bucket(4, c)", "9223372036854775808"),
    ("UBIGINT", "truncate(10, c)", "18446744073709551615"),
    ("INTEGER", "truncate(10, c)", "-2147483648"),
    ("BIGINT", "truncate(7, c)", "-9223372036854775808"),
    ("DECIMAL(5,0)", "truncate(10, c)", "-99999"),
])
def test_bucket_and_truncate_take_every_value_of_the_type(twin, column, spec, value):
    """Values at a type's ends overflowed the transform with raw pyarrow messages."""
    twin.plain.execute(f"CREATE TABLE p (k INTEGER, c {column})")
    twin.engine.execute_update(f"CREATE TABLE p (k INTEGER, c {column}) "
                               f"PARTITIONED BY ({spec})", twin.session)
    twin.run(f"INSERT INTO p VALUES (1, {value}), (2, 0), (3, NULL)")
    twin.run(f"INSERT INTO p VALUES (4, {value}), (5, 1)")
    for where in [f"c = {value}", f"c <> {value}", f"c <= {value}", f"c >= {value}",
                  "c IS NULL", f"c IN ({value}, 1)"]:
        twin.same(f"SELECT k FROM p WHERE {where} ORDER BY k")
    got, want = twin.run(f"DELETE FROM p WHERE c = {value}")
    assert got == want[0][0]
    twin.same("SELECT k, c FROM p ORDER BY k")


def test_time_travel_returns_that_versions_schema(twin):
    """A version read by time travel has that version's columns (names and types), in SQL
    (executed and prepared) and the Python API, across ADD/RENAME/ALTER TYPE/DROP."""
    steps = ["CREATE TABLE ev (id INTEGER, payload VARCHAR)", "INSERT INTO ev VALUES (1, 'a')",
             "ALTER TABLE ev ADD COLUMN country VARCHAR DEFAULT 'zz'",
             "ALTER TABLE ev RENAME COLUMN payload TO body", "INSERT INTO ev VALUES (2, 'b', 'x')",
             "ALTER TABLE ev ALTER COLUMN id TYPE BIGINT", "ALTER TABLE ev DROP COLUMN body"]
    expected = {}
    for sql in steps:
        twin.run(sql)
        v = twin.wh.table("ev").head().version
        expected[v] = twin.plain.sql("SELECT * FROM ev ORDER BY id").to_arrow_table()
    for v, want in expected.items():
        query = f"SELECT * FROM ev AT (VERSION => {v}) ORDER BY id"
        got = twin.query(query)
        assert got.schema.names == want.schema.names, v
        assert got.schema.types == want.schema.types, v
        assert got.to_pylist() == want.to_pylist(), v
        assert twin.engine.prepare(query, twin.session).dataset_schema.names == \
            want.schema.names
        snap = twin.wh.table("ev").snapshot(version=v)
        assert snap.schema.names == want.schema.names
        assert snap.to_table().sort_by("id").to_pylist() == want.to_pylist()


SECONDS_ROWS = ("(1, 'infinity', ['infinity', NULL], {'a': '-infinity'}), "
                "(2, '-infinity', ['-infinity'], {'a': 'infinity'}), "
                "(3, '2020-01-01 10:00:00', [], NULL), (4, NULL, NULL, {'a': NULL}), "
                "(5, '0044-03-15 (BC) 10:00:00', ['12345-01-01 00:00:00'], {'a': '1969-12-31 "
                "23:59:59'}), (6, '12345-01-01 00:00:01', NULL, NULL), "
                "(7, '290309-12-22 (BC) 00:00:00', NULL, NULL), "
                "(8, '294247-01-10 04:00:54', NULL, NULL)")


@pytest.mark.parametrize("partitioned", ["", "identity(ts)", "day(ts)", "year(ts)",
                                         "bucket(3, ts)"])
def test_timestamp_s_stores_every_value_duckdb_does(twin, partitioned):
    """TIMESTAMP_S ``'infinity'`` was refused (pyarrow's Parquet writer multiplied it into
    milliseconds and overflowed); a TIMESTAMP_S, at any depth, is stored in milliseconds
    with the infinities kept, and reads, pruning (manifest and footer statistics, a file
    with a deletion vector), partition values and DML by the column agree with DuckDB."""
    create = "CREATE TABLE t (k INTEGER, ts TIMESTAMP_S, l TIMESTAMP_S[], st STRUCT(a TIMESTAMP_S))"
    twin.plain.execute(create)
    twin.engine.execute_update(create + (f" PARTITIONED BY ({partitioned})" if partitioned
                                         else ""), twin.session)
    twin.run(f"INSERT INTO t VALUES {SECONDS_ROWS}")
    twin.run("INSERT INTO t VALUES (9, '2020-01-02', NULL, NULL), (10, 'infinity', NULL, NULL)")
    show = "SELECT k, ts::VARCHAR AS ts, l::VARCHAR AS l, st::VARCHAR AS st, typeof(ts) AS t, " \
           "typeof(l) AS lt, typeof(st) AS stt FROM t"
    twin.same(f"{show} ORDER BY k")
    twin.run("DELETE FROM t WHERE k = 3")  # a deletion vector on the file(s)
    for where in ["ts IS NOT NULL", "ts > TIMESTAMP_S '2020-01-01'", "ts = 'infinity'",
                  "ts < TIMESTAMP '0001-01-01'", "ts = '-infinity'", "NOT isfinite(ts)",
                  "ts >= TIMESTAMP_S '294247-01-10 04:00:54'", "l[1] = 'infinity'",
                  "st.a = '-infinity'", "ts BETWEEN '0100-01-01 (BC)' AND '20000-01-01'"]:
        twin.same(f"{show} WHERE {where} ORDER BY k")
    for sql in ["UPDATE t SET k = k + 100 WHERE ts = 'infinity'",
                "DELETE FROM t WHERE ts = '-infinity'",
                "UPDATE t SET ts = 'infinity', l = ['-infinity'] WHERE k = 9"]:
        got, want = twin.run(sql)
        assert got == want[0][0], sql
        twin.same(f"{show} ORDER BY k")
    # the Python API reads the same seconds (infinities as DuckDB exports them)
    got = twin.wh.table("t").snapshot().to_table().sort_by("k")
    want = twin.plain.sql("SELECT * FROM t ORDER BY k").to_arrow_table()
    assert got.schema.types == want.schema.types
    assert got.column("ts").cast(pa.int64()).to_pylist() == \
        want.column("ts").cast(pa.int64()).to_pylist()


def test_a_seconds_value_past_milliseconds_range_is_refused_naming_the_column(tmp_path):
    """Only an Arrow writer can hand in such a value (DuckDB's TIMESTAMP_S range fits); it
    was a raw pyarrow overflow message, and nothing is written."""
    from flightsrv.errors import SchemaMismatch

    t = Warehouse.open(str(tmp_path)).create_table(
        "t", pa.schema([("k", pa.int32()), ("ts", pa.timestamp("s"))]))
    far = pa.array([2**62], pa.int64()).cast(pa.timestamp("s"))
    with pytest.raises(SchemaMismatch, match="column=ts"):
        t.append(pa.table({"k": pa.array([1], pa.int32()), "ts": far}))
    assert t.count_rows() == 0

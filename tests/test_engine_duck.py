"""DuckEngine over a real local warehouse: queries, DML/DDL, pinning, time travel, lock-down."""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, IngestMode, Role, Session, StatementKind
from flightsrv.errors import (
    ConfigurationError,
    PermissionDenied,
    SqlError,
    TableExists,
    TableNotFound,
)

N = 2000
ITEMS = pa.table({
    "id": pa.array(range(N), pa.int64()),
    "grp": pa.array([f"g{i % 5}" for i in range(N)]),
    "v": pa.array([i * 0.25 for i in range(N)], pa.float64()),
})
GROUPS = pa.table({"grp": [f"g{i}" for i in range(6)], "label": [f"L{i}" for i in range(6)]})


@pytest.fixture
def wh(tmp_path):
    w = Warehouse.open(str(tmp_path / "wh"))
    w.create_table("items", ITEMS.schema).append(ITEMS)
    w.create_table("groups", GROUPS.schema).append(GROUPS)
    return w


@pytest.fixture
def engine(wh):
    e = DuckEngine(wh, batch_size=256)
    yield e
    e.close()


@pytest.fixture
def session():
    return Session("s1")


def rows(engine, sql, session, params=None):
    return engine.execute_query(sql, session, params).reader.read_all()


def reference(sql, **tables):
    con = duckdb.connect()
    for name, t in tables.items():
        con.register(name, t)
    return con.sql(sql).to_arrow_table()


@pytest.mark.parametrize("sql", [
    "SELECT count(*) AS n, sum(v) AS s FROM items",
    "SELECT grp, count(*) AS n, avg(v) AS a FROM items WHERE id >= 100 GROUP BY grp ORDER BY grp",
    "SELECT i.grp, g.label, count(*) AS n FROM items i JOIN groups g ON i.grp = g.grp "
    "GROUP BY ALL ORDER BY 1",
    "SELECT g.grp, count(i.id) AS n FROM groups g LEFT JOIN items i ON i.grp = g.grp "
    "AND i.id < 10 GROUP BY g.grp ORDER BY g.grp",
    "SELECT id, row_number() OVER (PARTITION BY grp ORDER BY id DESC) AS rn, "
    "sum(v) OVER (ORDER BY id ROWS 2 PRECEDING) AS s FROM items WHERE id < 50 ORDER BY id",
    "WITH c AS (SELECT grp, max(id) AS m FROM items GROUP BY grp) "
    "SELECT * FROM c JOIN c AS d USING (grp) ORDER BY grp",
    "SELECT id FROM items WHERE id < 5 UNION ALL SELECT id FROM items WHERE id > 1995 ORDER BY id",
    "SELECT * FROM items WHERE id IN (SELECT id * 3 FROM items WHERE id < 4) ORDER BY id",
    "SELECT label FROM groups g WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.grp = g.grp)",
    "SELECT * FROM items WHERE grp = 'g3' AND v BETWEEN 10 AND 20 ORDER BY id",
    "SELECT r.range AS x FROM range(3) r",
    # the user's text reaches DuckDB unchanged (only table names are spliced), so
    # unaliased columns are named exactly as DuckDB names them
    "SELECT id // 3, id % 3, 2 ** 3, max_by(grp, id) OVER (), v::INT FROM items "
    "ORDER BY id LIMIT 3",
    "SELECT grp, count(*) FILTER (WHERE v > 100) FROM items GROUP BY ALL ORDER BY ALL",
])
def test_select_matches_plain_duckdb(engine, session, sql):
    got = rows(engine, sql, session)
    want = reference(sql, items=ITEMS, groups=GROUPS)
    assert got.to_pylist() == want.to_pylist()
    assert got.column_names == want.column_names


def test_results_stream_in_batches(engine, session):
    res = engine.execute_query("SELECT * FROM items", session)
    assert isinstance(res.reader, pa.RecordBatchReader)
    batches = list(res.reader)
    assert len(batches) > 1 and sum(b.num_rows for b in batches) == N
    assert res.schema == ITEMS.schema


def test_prepare_schema_without_running(engine, session):
    p = engine.prepare("SELECT grp, count(*) AS n FROM items WHERE id > ? GROUP BY grp", session)
    assert p.kind == StatementKind.QUERY
    assert p.dataset_schema.names == ["grp", "n"]
    assert p.parameter_schema.names == ["0"]
    got = engine.execute_query(p.sql, session, pa.record_batch({"0": [10]}))
    assert got.schema.types == p.dataset_schema.types
    p = engine.prepare("DELETE FROM items WHERE id = ?", session)
    assert p.kind == StatementKind.UPDATE and len(p.dataset_schema) == 0


def test_parameters(engine, session):
    got = rows(engine, "SELECT id, grp FROM items WHERE id = $1 OR grp = $2 AND id < 10", session,
               pa.record_batch({"0": [7], "1": ["g1"]}))
    assert got.to_pylist() == [{"id": 1, "grp": "g1"}, {"id": 6, "grp": "g1"},
                               {"id": 7, "grp": "g2"}]


def test_parameter_forms(engine, session, wh):
    got = rows(engine, "SELECT ?::INT + 1 AS a, ? AS b FROM items WHERE id = ?", session,
               pa.record_batch({"0": [5], "1": ["x"], "2": [3]}))
    assert got.to_pylist() == [{"a": 6, "b": "x"}]
    v0 = wh.table("items").snapshot().version
    engine.execute_update("DELETE FROM items WHERE id < 10", session)
    got = rows(engine, "SELECT count(*) AS n FROM items AT (VERSION => ?) WHERE id < ?", session,
               pa.record_batch({"0": [v0], "1": [10]}))
    assert got["n"][0].as_py() == 10
    got = rows(engine, "SELECT count(*) AS n FROM items AT (VERSION => $1) WHERE id < $1",
               session, pa.record_batch({"0": [v0]}))
    assert got["n"][0].as_py() == min(v0, 10)


def test_delete_counts_and_time_travel(engine, session, wh):
    v0 = wh.table("items").snapshot().version
    assert engine.execute_update("DELETE FROM items WHERE id < 100", session) == 100
    assert rows(engine, "SELECT count(*) AS n FROM items", session)["n"][0].as_py() == N - 100
    again = rows(engine, f"SELECT count(*) AS n FROM items AT (VERSION => {v0})", session)
    assert again["n"][0].as_py() == N
    back = rows(engine, f"SELECT min(id) AS m FROM items AT (VERSION => {v0}) WHERE id < 100",
                session)
    assert back["m"][0].as_py() == 0
    assert engine.execute_update("DELETE FROM items WHERE id < 100", session) == 0
    assert engine.execute_update("DELETE FROM items AS x WHERE x.grp = ?", session,
                                 pa.record_batch({"0": ["g0", "g1"]})) == 2 * (N - 100) // 5
    assert engine.execute_update("DELETE FROM items", session) == 3 * (N - 100) // 5
    assert rows(engine, "SELECT count(*) AS n FROM items", session)["n"][0].as_py() == 0


def test_time_travel_by_timestamp(engine, session, wh):
    import time

    stamp = wh.table("items").history()[0]["created_at"]  # newest first
    time.sleep(0.01)  # commit times have millisecond resolution
    engine.execute_update("DELETE FROM items WHERE id >= 10", session)
    got = rows(engine, f"SELECT count(*) AS n FROM items AT (TIMESTAMP => '{stamp}')", session)
    assert got["n"][0].as_py() == N
    assert rows(engine, "SELECT count(*) AS n FROM items", session)["n"][0].as_py() == 10


@pytest.mark.parametrize("zone", ["Asia/Tokyo", "America/New_York", "UTC"])
def test_time_travel_time_is_read_by_duckdb_in_the_engine_time_zone(tmp_path, zone):
    """``AT (TIMESTAMP => 'text')`` means what ``CAST('text' AS TIMESTAMPTZ)`` means to the
    engine's DuckDB: a time without an offset is in the engine's time zone, as in every
    other statement; a text DuckDB does not read as a time is refused naming it."""
    from flightsrv.runtime import ManualClock, Runtime

    start = 1_795_000_000_000  # commit times, exactly (the clock only moves when told)
    clock = ManualClock(start, step_ms=0)
    wh = Warehouse.open(str(tmp_path / "wh"), Runtime(clock=clock))
    e = DuckEngine(wh, time_zone=zone)
    s = Session("s1")
    try:
        e.execute_update("CREATE TABLE tz (id INTEGER)", s)  # version 0 at `start`
        clock.advance(3_600_000)
        e.execute_update("INSERT INTO tz VALUES (1)", s)  # version 1, an hour later
        clock.advance(3_600_000)
        e.execute_update("INSERT INTO tz VALUES (2)", s)  # version 2, two hours later
        plain = duckdb.connect()
        plain.execute(f"SET TimeZone = '{zone}'")
        for offset_ms, want in ((1_800_000, 0), (5_400_000, 1), (9_000_000, 2)):
            # the local wall-clock text of that instant in `zone`, without an offset
            (text,) = plain.execute("SELECT strftime(make_timestamptz(?::BIGINT * 1000), "
                                    "'%Y-%m-%d %H:%M:%S')", [start + offset_ms]).fetchone()
            for spelled in (f"'{text}'", f"TIMESTAMP '{text}'"):
                got = rows(e, f"SELECT count(*) AS n FROM tz AT (TIMESTAMP => {spelled})", s)
                assert got["n"][0].as_py() == want, (zone, spelled)
        for bad, match in (("2026", "not a time DuckDB reads"), ("infinity", "finite")):
            with pytest.raises(SqlError, match=match) as ei:
                rows(e, f"SELECT * FROM tz AT (TIMESTAMP => '{bad}')", s)
            assert ei.value.context["table"] == "tz"
    finally:
        e.close()


def test_insert_values_select_and_columns(engine, session):
    assert engine.execute_update("INSERT INTO items VALUES (5000, 'new', 1.5), (5001, NULL, 2)",
                                 session) == 2
    assert engine.execute_update("INSERT INTO items (id) SELECT id + 10000 FROM items "
                                 "WHERE id < 3", session) == 3
    got = rows(engine, "SELECT * FROM items WHERE id >= 5000 ORDER BY id", session)
    assert got.to_pylist() == [
        {"id": 5000, "grp": "new", "v": 1.5}, {"id": 5001, "grp": None, "v": 2.0},
        {"id": 10000, "grp": None, "v": None}, {"id": 10001, "grp": None, "v": None},
        {"id": 10002, "grp": None, "v": None}]
    with pytest.raises(SqlError, match="number of values"):
        engine.execute_update("INSERT INTO items VALUES (1, 'x')", session)
    with pytest.raises(SqlError, match="column"):
        engine.execute_update("INSERT INTO items (nope) VALUES (1)", session)


def test_insert_reads_pinned_self(engine, session):
    # the source sees the version pinned at statement start, not its own appended rows
    assert engine.execute_update("INSERT INTO items SELECT id + 100000, grp, v FROM items",
                                 session) == N
    assert rows(engine, "SELECT count(*) AS n FROM items", session)["n"][0].as_py() == 2 * N


def test_executemany_sums_counts(engine, session):
    n = engine.execute_update("INSERT INTO items VALUES (?, ?, ?)", session,
                              pa.record_batch({"0": [7000, 7001, 7002], "1": ["a", "b", "c"],
                                               "2": [1.0, 2.0, None]}))
    assert n == 3
    n = engine.execute_update("DELETE FROM items WHERE id = ?", session,
                              pa.record_batch({"0": [7000, 7002, 99999]}))
    assert n == 2


def test_create_ctas_drop(engine, session, wh):
    assert engine.execute_update("CREATE TABLE t1 (a INTEGER NOT NULL, b VARCHAR, "
                                 "c DECIMAL(10, 2))", session) == 0
    assert engine.table_schema("t1").field("c").type == pa.decimal128(10, 2)
    with pytest.raises(TableExists):
        engine.execute_update("CREATE TABLE t1 (a INTEGER)", session)
    engine.execute_update("CREATE TABLE IF NOT EXISTS t1 (a INTEGER)", session)
    engine.execute_update("INSERT INTO t1 VALUES (1, 'x', 2.5)", session)
    assert rows(engine, "SELECT * FROM t1", session).to_pylist() == [
        {"a": 1, "b": "x", "c": __import__("decimal").Decimal("2.50")}]
    n = engine.execute_update("CREATE TABLE agg AS SELECT grp, count(*) AS n FROM items "
                              "GROUP BY grp", session)
    assert n == 5
    assert rows(engine, "SELECT sum(n) AS s FROM agg", session)["s"][0].as_py() == N
    assert "agg" in engine.list_tables()
    engine.execute_update("DROP TABLE agg", session)
    assert "agg" not in engine.list_tables()
    with pytest.raises(TableNotFound):
        engine.execute_update("DROP TABLE agg", session)
    engine.execute_update("DROP TABLE IF EXISTS agg", session)


@pytest.mark.parametrize("sql", [
    "UPDATE nn SET a = NULL",
    "MERGE INTO nn USING (SELECT 1 AS a) s ON nn.a = s.a WHEN MATCHED THEN UPDATE SET a = NULL",
])
def test_a_not_null_violation_names_the_users_table(engine, session, sql):
    engine.execute_update("CREATE TABLE nn (a INTEGER NOT NULL, b INTEGER)", session)
    engine.execute_update("INSERT INTO nn VALUES (1, 2)", session)
    with pytest.raises(SqlError) as exc:
        engine.execute_update(sql, session)
    assert "NOT NULL constraint failed: nn.a" in str(exc.value)
    assert "__fsrv" not in str(exc.value)
    assert rows(engine, "SELECT * FROM nn", session).to_pylist() == [{"a": 1, "b": 2}]


def test_unknown_table_and_bad_sql(engine, session):
    with pytest.raises(TableNotFound, match="nope"):
        rows(engine, "SELECT * FROM nope", session)
    with pytest.raises(TableNotFound, match="nope"):
        engine.execute_update("DELETE FROM nope", session)
    with pytest.raises(SqlError, match="statement="):
        rows(engine, "SELECT no_such_column FROM items", session)


def test_reader_role_cannot_write(engine):
    reader = Session("r", role=Role.READER)
    assert rows(engine, "SELECT count(*) AS n FROM items", reader)["n"][0].as_py() == N
    for sql in ("DELETE FROM items", "INSERT INTO items VALUES (1, 'a', 1)",
                "CREATE TABLE x (a INT)", "CREATE TABLE x AS SELECT 1", "DROP TABLE items",
                "VACUUM items"):
        with pytest.raises(PermissionDenied):
            engine.execute_update(sql, reader)
    with pytest.raises(PermissionDenied):
        engine.ingest("items", IngestMode.APPEND, pa.RecordBatchReader.from_batches(
            ITEMS.schema, ITEMS.to_batches()), reader)


def test_delete_mode_session_setting(engine, session):
    assert engine.execute_update("SET delete_mode = 'splice'", session) == 0
    assert session.settings["delete_mode"] == "splice"
    try:
        n = engine.execute_update("DELETE FROM items WHERE id = 1", session)
    except ConfigurationError as e:
        assert "splice" in str(e)
    else:
        assert n == 1
    engine.execute_update("SET delete_mode = 'dv'", session)
    assert engine.execute_update("DELETE FROM items WHERE id = 2", session) == 1


def test_maintenance_classified(engine, session):
    try:
        engine.execute_update("VACUUM items", session)
    except ConfigurationError as e:
        assert "VACUUM" in str(e)


def test_ingest_modes(engine, session):
    data = pa.table({"k": [1, 2, 3]})

    def rdr():
        return pa.RecordBatchReader.from_batches(data.schema, data.to_batches())

    assert engine.ingest("ing", IngestMode.CREATE, rdr(), session) == 3
    with pytest.raises(TableExists):
        engine.ingest("ing", IngestMode.CREATE, rdr(), session)
    assert engine.ingest("ing", IngestMode.APPEND, rdr(), session) == 3
    assert engine.ingest("ing", IngestMode.CREATE_APPEND, rdr(), session) == 3
    assert engine.ingest("ing2", IngestMode.CREATE_APPEND, rdr(), session) == 3
    assert engine.ingest("ing", IngestMode.REPLACE, rdr(), session) == 3
    assert rows(engine, "SELECT count(*) AS n FROM ing", session)["n"][0].as_py() == 3
    with pytest.raises(TableNotFound):
        engine.ingest("nope", IngestMode.APPEND, rdr(), session)


class _CommittingTable:
    """Proxy that appends a row after every snapshot() call: a concurrent writer."""

    def __init__(self, table, counter):
        self._t, self._counter = table, counter

    def snapshot(self, *a, **kw):
        snap = self._t.snapshot(*a, **kw)
        self._counter.append(1)
        self._t.append(pa.table({"id": [len(self._counter) + 10**6], "grp": ["z"], "v": [0.0]}))
        return snap

    def __getattr__(self, name):
        return getattr(self._t, name)


class _RacingWarehouse:
    def __init__(self, wh):
        self._wh, self.calls = wh, []

    def table(self, name):
        return _CommittingTable(self._wh.table(name), self.calls)

    def handle(self, name):  # how the engine opens the tables it pins
        return _CommittingTable(self._wh.handle(name), self.calls)

    def __getattr__(self, name):
        return getattr(self._wh, name)


def test_one_statement_sees_one_version(wh, session):
    racing = _RacingWarehouse(wh)
    e = DuckEngine(racing)
    got = rows(e, "SELECT (SELECT count(*) FROM items) - (SELECT count(*) FROM items) AS d, "
                  "(SELECT count(*) FROM items i JOIN items j USING (id)) AS n", session)
    assert got.to_pylist() == [{"d": 0, "n": N}]
    assert len(racing.calls) == 1  # pinned once for three references


def test_concurrent_streams(engine, session):
    r1 = engine.execute_query("SELECT id FROM items ORDER BY id", session).reader
    r2 = engine.execute_query("SELECT id FROM items ORDER BY id DESC", session).reader
    out = {}

    def drain(name, r):
        out[name] = r.read_all()["id"].to_pylist()

    ts = [threading.Thread(target=drain, args=(n, r)) for n, r in (("a", r1), ("b", r2))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out["a"] == list(range(N)) and out["b"] == list(reversed(range(N)))


def test_locked_down(engine, session, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a,b\n1,2\n")
    cur = engine._cursors.cursor()
    for sql in (f"SELECT * FROM read_csv('{secret}')", f"SELECT * FROM '{secret}'",
                "SELECT * FROM read_text('/etc/passwd')", f"COPY (SELECT 1) TO '{tmp_path}/o.csv'",
                f"ATTACH '{tmp_path}/x.db'", "INSTALL httpfs", "LOAD httpfs",
                "SELECT * FROM glob('/etc/*')"):
        with pytest.raises(duckdb.Error):
            cur.sql(sql).fetchall()
    for sql in ("SET enable_external_access = true", "SET lock_configuration = false",
                "RESET enable_external_access"):
        with pytest.raises(duckdb.Error):
            cur.execute(sql)
    assert not (tmp_path / "o.csv").exists()
    # and through the engine, file paths are never tables
    with pytest.raises(TableNotFound):
        rows(engine, f"SELECT * FROM '{secret}'", session)


def test_every_statement_cursor_has_the_lockdown_settings(engine):
    """Statements run on cursors (sessions of their own): a setting the engine meant for
    all of them must be global, not the root connection's session alone. Found in DuckDB
    2.0.1: ``SET parquet_metadata_cache=true`` reached no cursor, so every statement parsed
    every file's footer again (count(*) over 40 small files: 8.7 -> 5.7 ms CPU); and, until
    the fourteenth session, ``SET disable_parquet_prefetching=true`` neither, so every
    statement prefetched whole column chunks (10M rows: an aggregate 27.6 -> 19.8 ms, a point
    query 4.1 -> 3.1 ms)."""
    for cur in (engine._cursors.cursor(), engine._cursors.cursor()):
        got = dict(cur.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN ('parquet_metadata_cache',"
            " 'python_enable_replacements', 'enable_external_access', 'lock_configuration',"
            " 'enable_progress_bar', 'disable_parquet_prefetching')").fetchall())
        assert got == {"parquet_metadata_cache": "true", "python_enable_replacements": "false",
                       "disable_parquet_prefetching": "true",
                       "enable_external_access": "false", "lock_configuration": "true",
                       "enable_progress_bar": "false"}, got


@pytest.mark.parametrize("sql, types_results", [
    ("SELECT * FROM t WHERE id = ?", False),
    ("SELECT a FROM t WHERE x IN (SELECT ?) ORDER BY ? LIMIT ? OFFSET ?", False),
    ("SELECT a, (SELECT max(b) FROM u WHERE u.k = ?) AS m FROM t", False),
    ("SELECT a FROM t JOIN u ON t.k = u.k AND u.v > ? GROUP BY a HAVING count(*) > ?", False),
    ("SELECT ? AS v", True),
    ("SELECT a + ? AS v FROM t WHERE a = ?", True),
    ("SELECT (SELECT ?) AS v", True),
    ("SELECT 1 AS v UNION ALL SELECT ?", True),
    ("WITH c AS (SELECT ? AS v) SELECT * FROM c", True),
    ("SELECT coalesce(a, ?) FROM t", True),
])
def test_which_parameters_can_type_a_result_column(sql, types_results):
    from flightsrv.engine.duck import _params_type_results
    from flightsrv.sql.statements import parse_statement

    assert _params_type_results(parse_statement(sql).tree) is types_results


@pytest.mark.parametrize(("sql", "want"), [
    ("SELECT s.st.b FROM g AS s ORDER BY 1", [("x",), ("y",)]),
    ("SELECT g.st.b FROM g WHERE g.st.a = 6", [("y",)]),
    ("SELECT main.g.id FROM g ORDER BY 1", [(1,), (2,)]),
    ("SELECT x.main.g.id FROM g", "Binder Error"),
    ("SELECT information_schema.tables.table_name FROM g", "Binder Error"),
    ("SELECT q.st.b FROM g", "Binder Error"),
])
def test_struct_field_through_a_relation_name_as_duckdb(engine, session, sql, want):
    """``s.st.b`` is struct field b of column st of relation s, as DuckDB reads it (it was
    refused as an unknown schema); any other qualifier still binds to nothing."""
    engine.execute_update("CREATE TABLE g (id INTEGER, st STRUCT(a INTEGER, b VARCHAR))",
                          session)
    engine.execute_update("INSERT INTO g VALUES (1, {'a': 5, 'b': 'x'}), "
                          "(2, {'a': 6, 'b': 'y'})", session)
    if isinstance(want, str):
        with pytest.raises(SqlError, match=want):
            rows(engine, sql, session)
        return
    assert [tuple(r.values()) for r in rows(engine, sql, session).to_pylist()] == want
    # the same spelling decides the rows of UPDATE ... FROM and DELETE ... USING
    engine.execute_update("CREATE TABLE h (id INTEGER, v VARCHAR)", session)
    engine.execute_update("INSERT INTO h VALUES (1, 'a'), (2, 'b')", session)
    assert engine.execute_update("UPDATE h SET v = s.st.b FROM g AS s WHERE h.id = s.id "
                                 "AND s.st.a = 5", session) == 1
    assert engine.execute_update("DELETE FROM h USING g AS s WHERE h.id = s.id AND "
                                 "s.st.b = 'y'", session) == 1
    assert rows(engine, "SELECT * FROM h", session).to_pylist() == [{"id": 1, "v": "x"}]



_TZ_SCRIPT = r"""
import json, sys
import duckdb
from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
wh = Warehouse.open(sys.argv[1])
s = Session("tz")
out = {}
SQL = ("SELECT id, CAST(ts AS DATE)::VARCHAR AS d, ts::VARCHAR AS shown, "
       "CAST(date_trunc('day', ts) AS VARCHAR) AS day FROM ev ORDER BY id")
for zone in (None, "UTC", "Asia/Tokyo"):
    e = DuckEngine(wh, time_zone=zone)
    if zone is None:
        e.execute_update("CREATE TABLE ev (id BIGINT, ts TIMESTAMPTZ)", s)
        e.execute_update("INSERT INTO ev VALUES (1, TIMESTAMPTZ '2024-01-01 03:00:00+00'), "
                         "(2, TIMESTAMPTZ '2024-01-01 20:00:00+00')", s)
    rows = e.execute_query(SQL, s).reader.read_all().to_pylist()
    picked = e.execute_query("SELECT id FROM ev WHERE CAST(ts AS DATE) = DATE '2024-01-01'",
                             s).reader.read_all().column("id").to_pylist()
    out[zone or "default"] = {"rows": rows, "picked": picked}
    e.close()
plain = duckdb.connect()
plain.execute("CREATE TABLE ev AS SELECT * FROM (VALUES (1, TIMESTAMPTZ '2024-01-01 03:00:00+00'),"
              " (2, TIMESTAMPTZ '2024-01-01 20:00:00+00')) v(id, ts)")
out["plain"] = plain.sql(SQL).to_arrow_table().to_pylist()
print(json.dumps(out))
"""


def test_statements_run_in_the_configured_time_zone(tmp_path):
    """DuckDB's ``TimeZone`` is the host's by default (the answers plain DuckDB gives on the
    same host), and ``time_zone`` (``serve --time-zone``) pins it for every cursor: how a
    TIMESTAMPTZ is shown, cast to a date, truncated and compared in a WHERE (pruning too)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TZ="America/New_York")
    proc = subprocess.run([sys.executable, "-c", _TZ_SCRIPT, str(tmp_path / "wh")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["default"] == {"rows": got["plain"], "picked": [2]}
    assert got["default"]["rows"][0] == {"id": 1, "d": "2023-12-31",
                                         "shown": "2023-12-31 22:00:00-05",
                                         "day": "2023-12-31 00:00:00-05"}
    assert got["UTC"] == {"rows": [
        {"id": 1, "d": "2024-01-01", "shown": "2024-01-01 03:00:00+00",
         "day": "2024-01-01 00:00:00+00"},
        {"id": 2, "d": "2024-01-01", "shown": "2024-01-01 20:00:00+00",
         "day": "2024-01-01 00:00:00+00"}], "picked": [1, 2]}
    assert got["Asia/Tokyo"] == {"rows": [
        {"id": 1, "d": "2024-01-01", "shown": "2024-01-01 12:00:00+09",
         "day": "2024-01-01 00:00:00+09"},
        {"id": 2, "d": "2024-01-02", "shown": "2024-01-02 05:00:00+09",
         "day": "2024-01-02 00:00:00+09"}], "picked": [1]}
    with pytest.raises(ConfigurationError, match="unknown time zone 'Mars/Olympus'"):
        DuckEngine(Warehouse.open(str(tmp_path / "wh")), time_zone="Mars/Olympus")

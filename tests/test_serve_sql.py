"""flightsrv's own engine behind the Flight SQL server, through the ADBC client:
qualified names, maintenance and metadata statements, error codes, security, concurrency."""

from __future__ import annotations

import pathlib
import threading
import warnings

import adbc_driver_manager
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.engine.api import Role
from flightsrv.server import AuthConfig, Principal, start_in_thread

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")
TOKEN_HEADER = "adbc.flight.sql.authorization_header"
WRITER, READER = "writer-token", "reader-token"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    wh = Warehouse.open(str(tmp_path_factory.mktemp("serve") / "wh"))
    engine = DuckEngine(wh)
    auth = AuthConfig(tokens={WRITER: Principal("w", Role.WRITER),
                              READER: Principal("r", Role.READER)})
    server, port = start_in_thread(engine, auth=auth)
    yield wh, engine, f"grpc://127.0.0.1:{port}"
    server.shutdown()
    engine.close()


def connect(uri, token=WRITER):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {TOKEN_HEADER: f"Bearer {token}"} if token is not None else {}
        return dbapi.connect(uri, db_kwargs=kwargs)


def run(uri, sql, token=WRITER, params=None):
    with connect(uri, token) as conn, conn.cursor() as cur:
        cur.execute(sql, parameters=params)
        if not cur.description:
            return cur.rowcount
        return cur.fetch_arrow_table()


def failure(uri, sql, token=WRITER) -> str:
    with connect(uri, token) as conn, conn.cursor() as cur, \
            pytest.raises(adbc_driver_manager.Error) as ei:
        cur.execute(sql)
        cur.fetchall()
    return str(ei.value)


def make_table(uri, name, n=1000):
    run(uri, f"CREATE OR REPLACE TABLE {name} AS "
             f"SELECT range::BIGINT AS id, range % 7 AS k, 'v' || range AS s FROM range({n})")


# -- qualified names ---------------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["main.q", "flightsrv.main.q", '"main"."q"',
                                 '"flightsrv"."main"."q"', "FLIGHTSRV.Main.q"])
def test_qualified_table_names_as_bi_tools_send_them(served, ref):
    wh, _, uri = served
    make_table(uri, "q", 100)
    v = wh.table("q").head().version
    got = run(uri, f"SELECT count(*) AS n, max({ref}.id) AS m FROM {ref} WHERE {ref}.k = 1")
    assert got.to_pylist() == [{"n": 15, "m": 99}]
    assert run(uri, f"DELETE FROM {ref} WHERE id >= 90") == 10
    assert run(uri, f"SELECT count(*) AS n FROM {ref} AT (VERSION => {v})").to_pylist() == [
        {"n": 100}]
    assert run(uri, f"SELECT count(*) AS n FROM {ref} AS x AT (VERSION => {v}) "
                    f"JOIN {ref} USING (id)").to_pylist() == [{"n": 90}]
    assert run(uri, f"DELETE FROM {ref} WHERE id < 10") == 10
    assert run(uri, f"INSERT INTO {ref} SELECT * FROM {ref} WHERE id = 50") == 1
    assert run(uri, "SELECT count(*) AS n FROM q").to_pylist() == [{"n": 81}]


def test_time_travel_as_delta_iceberg_and_trino_write_it(served):
    """``VERSION AS OF n`` / ``FOR SYSTEM_TIME AS OF '...'`` read as ``AT (...)`` through
    ADBC, prepared with a parameter in the same statement too."""
    wh, _, uri = served
    make_table(uri, "tt", 100)
    v = wh.table("tt").head().version
    assert run(uri, "DELETE FROM tt WHERE id >= 60") == 40
    assert run(uri, f"SELECT count(*) AS n FROM tt VERSION AS OF {v}").to_pylist() == [
        {"n": 100}]
    assert run(uri, f"SELECT count(*) AS n FROM tt AS a FOR SYSTEM_VERSION AS OF {v} "
                    f"WHERE a.id >= ?", params=(50,)).to_pylist() == [{"n": 50}]
    assert run(uri, "SELECT count(*) AS n FROM tt FOR SYSTEM_TIME AS OF "
                    "TIMESTAMP '2999-01-01 00:00:00'").to_pylist() == [{"n": 60}]
    assert "VersionNotFound" in failure(uri, "SELECT * FROM tt VERSION AS OF 999")


@pytest.mark.parametrize("ref", ["other.q", "system.main.q", "system.information_schema.tables",
                                 "flightsrv.other.q"])
def test_other_schemas_and_catalogs_are_refused(served, ref):
    _, _, uri = served
    make_table(uri, "q", 10)
    msg = failure(uri, f"SELECT * FROM {ref}")
    assert "INVALID_ARGUMENT" in msg and "unknown schema or catalog" in msg and ref in msg


# -- maintenance and metadata ------------------------------------------------------------------


def _report(table: pa.Table) -> dict:
    return {(r["operation"], r["metric"]): r["value"] for r in table.to_pylist()}


def test_stats_and_history_as_relations(served):
    wh, _, uri = served
    make_table(uri, "h", 1000)
    run(uri, "DELETE FROM h WHERE k = 3")
    stats = run(uri, "SELECT * FROM flightsrv_table_stats('main.h')").to_pylist()
    assert len(stats) == 1
    st = stats[0]
    head = wh.table("h").head()
    assert (st["table"], st["version"], st["live_rows"]) == ("h", head.version, head.live_rows)
    assert st["deleted_rows"] == 1000 - head.live_rows > 0
    assert st["recommendation"] in {"compact", "expire", "vacuum", "nothing"}
    assert run(uri, "SHOW STATS h").to_pylist() == stats
    hist = run(uri, "SELECT version, operation, rows_deleted FROM flightsrv_history('h') "
                    "ORDER BY version").to_pylist()
    assert [h["operation"] for h in hist][-2:] == ["create", "delete"]  # CTAS: one commit
    assert hist[-1]["rows_deleted"] == 1000 - head.live_rows
    assert [h["version"] for h in hist] == [h["version"] for h in
                                           reversed(wh.table("h").history())]
    joined = run(uri, "SELECT count(*) AS n FROM flightsrv_history('h') AS x "
                      "JOIN h ON h.id = x.version")
    assert joined.to_pylist() == [{"n": len(hist)}]
    assert "NOT_FOUND" in failure(uri, "SELECT * FROM flightsrv_history('nope')")


def test_optimize_vacuum_purge_through_sql(served):
    wh, _, uri = served
    make_table(uri, "m", 3000)
    for i in range(3):
        run(uri, f"INSERT INTO m SELECT id + {(i + 1) * 10000}, k, s FROM m WHERE id < 100")
    run(uri, "DELETE FROM m WHERE k = 0")
    live = run(uri, "SELECT count(*) AS n, sum(id) AS s FROM m").to_pylist()
    before = wh.table("m").head()

    report = _report(run(uri, "OPTIMIZE m"))
    assert report[("compact", "table")] == "m"
    after = wh.table("m").head()
    assert after.version > before.version
    assert len(after.data_files) < len(before.data_files)
    assert run(uri, "SELECT count(*) AS n, sum(id) AS s FROM m").to_pylist() == live

    msg = failure(uri, "VACUUM m RETAIN 0 HOURS")
    assert "INVALID_ARGUMENT" in msg and "table=m" in msg and "minimum_hours=1" in msg
    assert "vacuum.allow_short_grace" in msg
    assert "INVALID_ARGUMENT" in failure(uri, "VACUUM m RETAIN 1 VERSIONS RETAIN 0 HOURS")
    assert wh.table("m").log.versions()[0] == 0  # refused before expiring anything
    wh.table("m").set_properties(**{"vacuum.allow_short_grace": "true"})
    after = wh.table("m").head()
    dry = _report(run(uri, "VACUUM m RETAIN 1 VERSIONS RETAIN 0 HOURS DRY RUN"))
    assert dry[("expire", "dry_run")] == "true" and dry[("vacuum", "dry_run")] == "true"
    assert wh.table("m").log.versions()[0] == 0  # nothing expired by a dry run
    done = _report(run(uri, "VACUUM main.m RETAIN 1 VERSIONS RETAIN 0 HOURS"))
    assert wh.table("m").log.versions() == [after.version]
    assert int(done[("vacuum", "deleted_objects")]) > 0
    assert run(uri, "SELECT count(*) AS n, sum(id) AS s FROM m").to_pylist() == live
    assert "VersionNotFound" in failure(uri, "SELECT * FROM m AT (VERSION => 0)")

    run(uri, "DELETE FROM m WHERE k = 1")
    live = run(uri, "SELECT count(*) AS n, sum(id) AS s FROM m").to_pylist()
    purged = _report(run(uri, "PURGE m"))
    assert purged[("purge", "operation")] == "purge"
    assert int(purged[("purge", "rows_removed")]) > 0
    assert all(f.dv is None for f in wh.table("m").head().data_files)
    assert run(uri, "SELECT count(*) AS n, sum(id) AS s FROM m").to_pylist() == live
    # through an update call (DoPut CommandStatementUpdate) maintenance answers 0
    with connect(uri) as conn, conn.cursor() as cur:
        assert cur.adbc_statement.set_sql_query("VACUUM m DRY RUN") is None
        assert cur.adbc_statement.execute_update() == 0


def test_reader_may_not_run_maintenance(served):
    _, _, uri = served
    make_table(uri, "ro", 10)
    for sql in ("OPTIMIZE ro", "VACUUM ro", "VACUUM ro DRY RUN", "PURGE ro",
                "DELETE FROM ro", "INSERT INTO ro VALUES (1, 1, 'x')"):
        assert "UNAUTHORIZED" in failure(uri, sql, token=READER), sql
    assert run(uri, "SELECT * FROM flightsrv_table_stats('ro')", token=READER).num_rows == 1
    assert run(uri, "SELECT count(*) AS n FROM ro").to_pylist() == [{"n": 10}]


def test_splice_delete_mode_as_table_property_and_session_setting(served):
    wh, _, uri = served
    make_table(uri, "sp", 2000)
    wh.table("sp").set_properties(delete_mode="splice")
    assert run(uri, "DELETE FROM sp WHERE id < 100") == 100
    head = wh.table("sp").head()
    assert head.operation != "delete" and all(f.dv is None for f in head.data_files)
    make_table(uri, "sp2", 2000)
    with connect(uri) as conn, conn.cursor() as cur:
        cur.execute("SET delete_mode = 'splice'")
        cur.execute("DELETE FROM sp2 WHERE k = 2")
        assert cur.rowcount == 2000 // 7 + 1
    assert all(f.dv is None for f in wh.table("sp2").head().data_files)
    assert run(uri, "SELECT count(*) AS n FROM sp2 WHERE k = 2").to_pylist() == [{"n": 0}]


# -- errors -------------------------------------------------------------------------------------


def test_corrupt_deletion_vector_is_internal_naming_the_object(served):
    wh, _, uri = served
    make_table(uri, "cor", 20_000)
    run(uri, "DELETE FROM cor WHERE id % 3 = 0")
    dvs = {f.dv.path for f in wh.table("cor").head().data_files
           if f.dv is not None and f.dv.storage == "object"}
    assert dvs, "expected the DV in its own object"
    path = next(iter(dvs))
    obj = pathlib.Path(wh.store.root) / "cor" / path
    raw = bytearray(obj.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    obj.write_bytes(bytes(raw))
    msg = failure(uri, "SELECT count(*) FROM cor")
    assert "INTERNAL" in msg and "CorruptObject" in msg and path in msg
    # the server is still up: the same failure again, then other queries are served
    with connect(uri) as conn, conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error):
        cur.execute("SELECT sum(id) FROM cor")
        cur.fetchall()
    with connect(uri) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 AS one")
        assert cur.fetchall() == [(1,)]
        cur.execute("SELECT count(*) FROM cor AT (VERSION => 0)")  # before the DELETE
        assert cur.fetchall() == [(20_000,)]


def test_missing_data_file_is_internal_naming_the_object(served):
    wh, _, uri = served
    make_table(uri, "gone", 100)
    path = wh.table("gone").head().data_files[0].path
    (pathlib.Path(wh.store.root) / "gone" / path).unlink()
    msg = failure(uri, "SELECT sum(id) FROM gone")
    assert "INTERNAL" in msg and path in msg
    # one broken table takes nothing else down
    make_table(uri, "gone_other", 10)
    assert run(uri, "SELECT count(*) AS n FROM gone_other").to_pylist() == [{"n": 10}]


def test_error_codes(served):
    _, _, uri = served
    make_table(uri, "ec", 10)
    assert "NOT_FOUND" in failure(uri, "SELECT * FROM no_such_table")
    msg = failure(uri, "SELECT nope FROM ec")
    assert "INVALID_ARGUMENT" in msg and "nope" in msg
    msg = failure(uri, "SELEC 1")
    assert "INVALID_ARGUMENT" in msg and "LINE 1: SELEC 1" in msg  # DuckDB's caret line
    assert "TableExists" in failure(uri, "CREATE TABLE ec (a INT)")
    assert "VersionNotFound" in failure(uri, "SELECT * FROM ec AT (VERSION => 99)")


# -- security through a real client ------------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "COPY (SELECT 1) TO '/tmp/flightsrv-pwned.csv'",
    "ATTACH '/tmp/x.db' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SELECT read_text('/etc/passwd')",
    "PRAGMA database_list",
    "SET enable_external_access = true",
    "SELECT 1; DROP TABLE sec",
])
def test_security_statements_refused(served, sql):
    _, _, uri = served
    msg = failure(uri, sql)
    assert "INVALID_ARGUMENT" in msg or "NOT_FOUND" in msg, msg


def test_auth_codes(served):
    _, _, uri = served
    make_table(uri, "sec", 5)
    for token in (None, "wrong"):
        with pytest.raises(adbc_driver_manager.Error) as ei:
            run(uri, "SELECT 1", token=token)
        assert "UNAUTHENTICATED" in str(ei.value)
    assert "UNAUTHORIZED" in failure(uri, "DELETE FROM sec", token=READER)
    assert run(uri, "SELECT count(*) AS n FROM sec", token=READER).to_pylist() == [{"n": 5}]


# -- concurrency --------------------------------------------------------------------------------


def test_concurrent_clients_deletes_and_inserts_all_land(served):
    wh, _, uri = served
    make_table(uri, "cc", 800)
    errors: list = []
    counts: dict = {}

    def deleter(i):
        try:
            with connect(uri) as conn, conn.cursor() as cur:
                for j in range(4):
                    lo = i * 100 + j * 25
                    cur.execute(f"DELETE FROM cc WHERE id >= {lo} AND id < {lo + 25}")
                    counts[(i, j)] = cur.rowcount
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def inserter(i):
        try:
            with connect(uri) as conn, conn.cursor() as cur:
                for j in range(4):
                    cur.execute("INSERT INTO cc VALUES (?, 9, 'new')",
                                parameters=[100_000 + i * 10 + j])
                    cur.execute("SELECT count(*) FROM cc")
                    cur.fetchall()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=deleter, args=(i,)) for i in range(4)] + [
        threading.Thread(target=inserter, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert set(counts.values()) == {25}
    got = run(uri, "SELECT count(*) AS n, count(*) FILTER (WHERE k = 9) AS new, "
                   "min(id) AS lo FROM cc").to_pylist()
    assert got == [{"n": 400 + 16, "new": 16, "lo": 400}]
    assert wh.table("cc").head().live_rows == 416


DESCRIBE_COLUMNS = ("id INTEGER NOT NULL, name VARCHAR, tags VARCHAR[], m MAP(VARCHAR, INTEGER), "
                    "ts TIMESTAMPTZ, d DECIMAL(10,2), s STRUCT(a INTEGER, \"b c\" VARCHAR), "
                    "bl BLOB, t TIME, f FLOAT, i8 TINYINT, dt DATE")


def test_show_tables_and_describe_answer_as_duckdb_does(served):
    """SHOW TABLES / DESCRIBE t / SHOW COLUMNS FROM t: the same rows DuckDB gives for a table
    created by the same statement (differential), for readers too; a missing table is
    NOT_FOUND; DESCRIBE of a query and SUMMARIZE give DuckDB's rows too."""
    import duckdb

    _, _, uri = served
    run(uri, f"CREATE TABLE described ({DESCRIBE_COLUMNS})")
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE described ({DESCRIBE_COLUMNS})")
    expected = ref.sql("DESCRIBE described").arrow().read_all().to_pylist()
    for spelling in ("DESCRIBE described", "DESC main.described",
                     "SHOW COLUMNS FROM flightsrv.main.described",
                     'describe "described"', "SHOW described", "DESCRIBE TABLE described"):
        got = run(uri, spelling, token=READER).to_pylist()
        assert got == expected, spelling
    names = run(uri, "SHOW TABLES", token=READER).column("name").to_pylist()
    assert "described" in names and names == sorted(names)
    assert run(uri, "SELECT count(*) AS n FROM flightsrv_columns('described') "
                    "WHERE \"null\" = 'NO'").column("n").to_pylist() == [1]
    assert "NOT_FOUND" in failure(uri, "DESCRIBE no_such_table")
    for sql in ("DESCRIBE SELECT 1 AS one, 'x' AS s",
                # a query's NOT NULL is DuckDB's over the Parquet it reads: YES for a
                # table's NOT NULL column (DESCRIBE t says NO), so the query leaves it out
                "DESCRIBE SELECT * EXCLUDE (id) FROM described WHERE false",
                "SUMMARIZE described"):
        assert run(uri, sql, token=READER).to_pylist() == \
            ref.sql(sql).arrow().read_all().to_pylist(), sql
    # SHOW ALL TABLES / SHOW SCHEMAS / SHOW DATABASES: DuckDB's columns, this catalog's
    # names (a table named like the keyword changes nothing, as in DuckDB)
    ref.execute("CREATE TABLE schemas (x INTEGER)")
    run(uri, "CREATE TABLE schemas (x INTEGER)")
    catalog = {"memory": "flightsrv"}
    for sql in ("SHOW ALL TABLES", "SHOW SCHEMAS", "SHOW DATABASES"):
        got = run(uri, sql, token=READER)
        want = ref.sql(sql).arrow().read_all()
        assert got.column_names == want.column_names, sql
        want = [{k: catalog.get(v, v) if isinstance(v, str) else v for k, v in r.items()}
                for r in want.to_pylist()]
        if sql == "SHOW ALL TABLES":  # the served warehouse holds other tests' tables too
            got = [r for r in got.to_pylist() if r["name"] in ("described", "schemas")]
        else:
            got = got.to_pylist()
        assert got == want, sql
    run(uri, "DROP TABLE schemas")
    run(uri, "DROP TABLE described")
    assert "described" not in run(uri, "SHOW TABLES").column("name").to_pylist()


INFO_SCHEMA_DDL = [
    f"CREATE TABLE isa ({DESCRIBE_COLUMNS})",
    "CREATE TABLE isb AS SELECT 1 AS k, 'x' AS v",
    "ALTER TABLE isb ADD COLUMN n BIGINT DEFAULT 5",
    "ALTER TABLE isb ADD COLUMN label VARCHAR DEFAULT 'it''s'",
    "ALTER TABLE isb ADD COLUMN flag BOOLEAN DEFAULT true",
]


def test_a_non_finite_float_default_keeps_information_schema_whole(served):
    """A DOUBLE column with DEFAULT 'NaN' / 'inf' / '-inf': its default is spelled as a
    literal DuckDB reads back to that value, and information_schema answers for every table
    (the default was spelled nan, a column name to DuckDB: every information_schema query of
    the warehouse failed; session 29)."""
    import math

    _, _, uri = served
    run(uri, "CREATE TABLE nandef (id INTEGER)")
    for col, value in (("a", "NaN"), ("b", "inf"), ("c", "-inf")):
        run(uri, f"ALTER TABLE nandef ADD COLUMN {col} DOUBLE DEFAULT '{value}'")
    run(uri, "INSERT INTO nandef (id) VALUES (1)")
    got = run(uri, "SELECT column_name, column_default FROM information_schema.columns "
                   "WHERE table_name = 'nandef' ORDER BY ordinal_position", token=READER)
    defaults = dict(zip(got.column("column_name").to_pylist(),
                        got.column("column_default").to_pylist()))
    import duckdb

    con = duckdb.connect()  # never the module's default connection, which other tests use
    for col, want in (("a", math.nan), ("b", math.inf), ("c", -math.inf)):
        back = con.execute(f"SELECT CAST({defaults[col]} AS DOUBLE)").fetchall()[0][0]
        assert back == want or (math.isnan(want) and math.isnan(back)), (col, defaults)
    assert run(uri, "SELECT count(*) AS n FROM information_schema.tables", token=READER
               ).column("n").to_pylist()[0] >= 1
    assert [r["default"] for r in run(uri, "DESCRIBE nandef").to_pylist()][1:] == \
        [defaults["a"], defaults["b"], defaults["c"]]
    row = run(uri, "SELECT a, b, c FROM nandef").to_pylist()[0]
    assert math.isnan(row["a"]) and row["b"] == math.inf and row["c"] == -math.inf
    run(uri, "DROP TABLE nandef")


def test_information_schema_answers_as_duckdb_does(served):
    """information_schema.tables/columns/schemata/table_constraints: the rows DuckDB gives
    for tables made by the same statements in a catalog named flightsrv (differential), for
    readers too, in every spelling DuckDB accepts; the views follow CREATE, ALTER and DROP;
    an unknown view, time travel and a write through a view are refused with the reason."""
    import duckdb

    _, _, uri = served
    ref = duckdb.connect()
    ref.execute("ATTACH ':memory:' AS flightsrv")
    ref.execute("USE flightsrv")
    for ddl in INFO_SCHEMA_DDL:
        run(uri, ddl)
        ref.execute(ddl)
    mine = "table_name IN ('isa', 'isb')"
    queries = {
        "tables": f"SELECT * FROM information_schema.tables WHERE {mine} ORDER BY table_name",
        "columns": f"SELECT * FROM information_schema.columns WHERE {mine} "
                   "ORDER BY table_name, ordinal_position",
        "schemata": "SELECT * FROM information_schema.schemata WHERE catalog_name = "
                    "'flightsrv'",
        "constraints": f"SELECT * FROM information_schema.table_constraints WHERE {mine} "
                       "ORDER BY constraint_name",
        "character_sets": "SELECT * FROM information_schema.character_sets",
    }
    for name, query in queries.items():
        expected = ref.sql(query).to_arrow_table().to_pylist()
        assert expected, name  # the reference has rows: the comparison means something
        assert run(uri, query, token=READER).to_pylist() == expected, name
    assert run(uri, "SELECT column_default FROM information_schema.columns WHERE "
                    "table_name = 'isb' AND column_name = 'label'"
               ).column("column_default").to_pylist() == ["'it''s'"]
    for spelling in ("SELECT t.table_name FROM INFORMATION_SCHEMA.TABLES t WHERE {}",
                     "SELECT tables.table_name FROM flightsrv.information_schema.tables "
                     "WHERE {}",
                     "SELECT information_schema.tables.table_name FROM "
                     "information_schema.tables WHERE {}",
                     "WITH x AS (SELECT * FROM information_schema.tables) "
                     "SELECT table_name FROM x WHERE {}"):
        got = run(uri, spelling.format(mine) + " ORDER BY 1").column(0).to_pylist()
        assert got == ["isa", "isb"], spelling
    count = f"SELECT count(*) AS n FROM information_schema.columns WHERE {mine}"
    assert run(uri, count).column("n").to_pylist() == [17]
    run(uri, "ALTER TABLE isa ADD COLUMN extra INTEGER")
    run(uri, "DROP TABLE isb")
    assert run(uri, count).column("n").to_pylist() == [13]
    assert "has no view 'nope'" in failure(uri, "SELECT * FROM information_schema.nope")
    assert "not to information_schema" in failure(
        uri, "SELECT * FROM information_schema.tables AT (VERSION => 1)")
    assert "cannot be used in DELETE" in failure(
        uri, "DELETE FROM isa WHERE id IN (SELECT ordinal_position FROM "
             "information_schema.columns)")
    assert "unknown schema" in failure(uri, "SELECT * FROM pg_catalog.pg_tables")
    run(uri, "DROP TABLE isa")


def test_truncate_is_a_delete_of_every_row(served):
    """TRUNCATE [TABLE] t deletes every row as one commit (a DELETE: time travel still sees
    the rows), and a reader may not run it."""
    wh, _, uri = served
    run(uri, "CREATE TABLE trunc AS SELECT range AS x FROM range(50)")
    before = wh.table("trunc").head().version
    assert "PermissionDenied" in failure(uri, "TRUNCATE trunc", token=READER)
    assert run(uri, "TRUNCATE TABLE main.trunc") == 50
    assert wh.table("trunc").head().version == before + 1
    assert run(uri, "SELECT count(*) AS n FROM trunc").column("n").to_pylist() == [0]
    assert run(uri, f"SELECT count(*) AS n FROM trunc AT (VERSION => {before})"
               ).column("n").to_pylist() == [50]
    assert "NOT_FOUND" in failure(uri, "TRUNCATE no_such_table")
    run(uri, "DROP TABLE trunc")


def test_column_defaults_behave_as_in_duckdb(served):
    """ALTER TABLE ... ADD COLUMN ... DEFAULT v: old rows read v, INSERTs that omit the
    column write v, an explicit NULL stays NULL, and DESCRIBE shows the default: the same
    statements on plain DuckDB give the same rows and the same DESCRIBE (differential)."""
    import duckdb

    _, _, uri = served
    statements = [
        "CREATE TABLE defaults_t (id INTEGER)",
        "INSERT INTO defaults_t VALUES (1)",
        "ALTER TABLE defaults_t ADD COLUMN note VARCHAR DEFAULT 'it''s'",
        "ALTER TABLE defaults_t ADD COLUMN n BIGINT DEFAULT -3",
        "ALTER TABLE defaults_t ADD COLUMN b BOOLEAN DEFAULT true",
        "ALTER TABLE defaults_t ADD COLUMN d DOUBLE DEFAULT 1.5",
        "INSERT INTO defaults_t (id) VALUES (2)",
        "INSERT INTO defaults_t (id, note, n) VALUES (3, NULL, 7)",
        "INSERT INTO defaults_t (n, id) SELECT 8, 4",
    ]
    ref = duckdb.connect()
    for sql in statements:
        run(uri, sql)
        ref.execute(sql)
    query = "SELECT * FROM defaults_t ORDER BY id"
    assert run(uri, query).to_pylist() == ref.sql(query).arrow().read_all().to_pylist()
    assert run(uri, "DESCRIBE defaults_t", token=READER).to_pylist() == \
        ref.sql("DESCRIBE defaults_t").arrow().read_all().to_pylist()
    run(uri, "DROP TABLE defaults_t")


def test_result_columns_carry_flight_sql_type_metadata(served):
    """A query result's fields carry the ARROW:FLIGHT:SQL:* metadata JDBC's
    ResultSetMetaData reads (the type name as GetTables gives it, a DECIMAL's precision and
    scale, read-only), for a table's columns, an expression and a bound parameter alike,
    in the schema announced before the rows (GetSchema) and in the stream itself."""
    _, _, uri = served
    run(uri, "CREATE OR REPLACE TABLE meta_cols AS SELECT CAST(1.5 AS DECIMAL(12,4)) AS d, "
             "'x' AS s, TIMESTAMPTZ '2024-01-01 00:00:00+00' AS ts")
    sql = "SELECT d, s, ts, d * 2 AS e, CAST(? AS BIGINT) AS p FROM meta_cols"
    with connect(uri) as conn, conn.cursor() as cur:
        announced = cur.adbc_execute_schema(sql, parameters=[7]) \
            if hasattr(cur, "adbc_execute_schema") else None
        cur.execute(sql, parameters=[7])
        streamed = cur.fetch_arrow_table().schema
    for schema in filter(None, (announced, streamed)):
        meta = {f.name: {k.decode().rsplit(":", 1)[1]: v.decode()
                         for k, v in (f.metadata or {}).items()} for f in schema}
        assert meta["d"] == {"TYPE_NAME": "DECIMAL(12,4)", "PRECISION": "12", "SCALE": "4",
                             "IS_READ_ONLY": "1"}
        assert meta["s"]["TYPE_NAME"] == "VARCHAR"
        assert meta["ts"]["TYPE_NAME"] == "TIMESTAMP WITH TIME ZONE"
        assert (meta["e"]["PRECISION"], meta["e"]["SCALE"]) == ("18", "4")
        assert meta["p"]["TYPE_NAME"] == "BIGINT"
    run(uri, "DROP TABLE meta_cols")


def test_pandas_through_adbc_with_an_all_none_column(served):
    """pandas' to_sql/read_sql through an ADBC connection (docs/SERVER.md): an all-None
    first frame makes a column of type null, which ALTER ... TYPE types so later frames
    append."""
    import pandas as pd

    _, _, uri = served
    with connect(uri) as conn:
        pd.DataFrame({"id": [1], "note": [None]}).to_sql("pd_null", conn, index=False,
                                                          if_exists="replace")
        with conn.cursor() as cur:
            cur.execute("ALTER TABLE pd_null ALTER COLUMN note TYPE VARCHAR")
        pd.DataFrame({"id": [2], "note": ["hello"]}).to_sql("pd_null", conn, index=False,
                                                             if_exists="append")
        got = pd.read_sql("SELECT id, note FROM pd_null ORDER BY id", conn)
    assert got.to_dict("records") == [{"id": 1, "note": None}, {"id": 2, "note": "hello"}]
    run(uri, "DROP TABLE pd_null")


COLUMN_SET_QUERIES = [
    "SELECT #2, s FROM cs WHERE id > 0",  # positional reference: the 2nd column of cs
    "SELECT #2 FROM cs",
    "SELECT x.i, x.s FROM cs AS x(s, i)",  # column aliases name columns by position
    "SELECT a FROM cs AS x(a, b)",
    "SELECT * LIKE 'i%' FROM cs",  # star filters pick columns by pattern
    "SELECT * NOT LIKE 'id' FROM cs",
    "SELECT * SIMILAR TO '(i|s)' FROM cs",
    "SELECT * ILIKE 'I%' FROM cs",
    "SELECT * GLOB 's*' FROM cs",
    "SELECT count(*), max(i) FROM cs",
]


@pytest.mark.parametrize("sql", COLUMN_SET_QUERIES)
def test_queries_whose_columns_depend_on_position_or_pattern_answer_as_duckdb(served, sql):
    """The engine hands DuckDB a view of the columns a statement names; a statement that picks
    columns by position (``#2``, ``AS x(a, b)``) or by pattern (``* LIKE 'p'``) gets every
    column, and the same answer as DuckDB over the same table (a narrowed view once gave
    ``#2`` the wrong column)."""
    import duckdb

    _, _, uri = served
    run(uri, "CREATE OR REPLACE TABLE cs (id BIGINT, i INTEGER, s VARCHAR)")
    run(uri, "INSERT INTO cs VALUES (1, 10, 'apple'), (2, 20, 'banana'), (3, 30, 'cherry')")
    run(uri, "DELETE FROM cs WHERE id = 3")
    ref = duckdb.connect()
    ref.execute("CREATE TABLE cs (id BIGINT, i INTEGER, s VARCHAR)")
    ref.execute("INSERT INTO cs VALUES (1, 10, 'apple'), (2, 20, 'banana')")
    want = ref.sql(sql).to_arrow_table()
    got = run(uri, sql)
    assert got.column_names == want.column_names
    assert sorted(got.to_pylist(), key=str) == sorted(want.to_pylist(), key=str)


def test_writes_through_positional_references_store_the_right_columns(served):
    _, _, uri = served
    run(uri, "CREATE OR REPLACE TABLE ps (id BIGINT, i INTEGER, s VARCHAR)")
    run(uri, "INSERT INTO ps VALUES (1, 10, 'apple'), (2, 20, 'banana')")
    run(uri, "CREATE OR REPLACE TABLE ps2 AS SELECT #2, s FROM ps WHERE id > 0")
    got = run(uri, "SELECT * FROM ps2 ORDER BY 1")
    assert got.column_names == ["i", "s"]
    assert got.to_pylist() == [{"i": 10, "s": "apple"}, {"i": 20, "s": "banana"}]
    run(uri, "CREATE OR REPLACE TABLE ps3 (a VARCHAR, b VARCHAR)")
    run(uri, "INSERT INTO ps3 SELECT x.i, x.s FROM ps AS x(s, i)")
    assert run(uri, "SELECT * FROM ps3 ORDER BY 1").to_pylist() == [
        {"a": "10", "b": "1"}, {"a": "20", "b": "2"}]
    assert run(uri, "DELETE FROM ps3 WHERE a IN (SELECT CAST(#2 AS VARCHAR) FROM ps "
               "WHERE id > 1)") == 1


def test_result_names_do_not_depend_on_how_parameters_bind(served):
    """A decimal or binary value reaches DuckDB as a typed literal; the result's column names
    are still DuckDB's for the parameters (``($1 + 1)``), in the announced schema and in the
    rows, as DuckDB names them whatever the values."""
    import decimal

    import duckdb

    _, _, uri = served
    sql = "SELECT ? + 1, ? * 2.5, ?"
    values = [5, decimal.Decimal("1.15"), b"\x00"]
    want = duckdb.connect().sql(sql, params=values).to_arrow_table()
    with connect(uri) as conn, conn.cursor() as cur:
        cur.execute(sql, parameters=values)
        assert [d[0] for d in cur.description] == want.column_names == \
            ["($1 + 1)", "($2 * 2.5)", "$3"]
        assert cur.fetch_arrow_table().to_pylist() == want.to_pylist()

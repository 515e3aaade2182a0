"""End to end through the ADBC Flight SQL driver (what most Python clients use)."""

import time
import warnings

import adbc_driver_manager
import pyarrow as pa
import pytest
from _server_engine import start_test_server
from adbc_driver_flightsql import dbapi

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")


def _product_engine(tmp_path):
    """flightsrv's own engine over a local warehouse, when it is importable."""
    try:
        from flightsrv import Warehouse
        from flightsrv.engine import DuckEngine
    except ImportError as exc:
        pytest.skip(f"product engine not available: {exc}")
    return DuckEngine(Warehouse.open(str(tmp_path / "wh")))


@pytest.fixture(scope="module", params=["duckdb-test-engine", "flightsrv-engine"])
def server(request, tmp_path_factory):
    """The same client tests over the tests' in-memory DuckDB engine and the real one."""
    engine = None
    if request.param == "flightsrv-engine":
        engine = _product_engine(tmp_path_factory.mktemp("adbc"))
    srv, engine, uri = start_test_server(engine=engine)
    yield srv, engine, uri
    srv.shutdown()
    close = getattr(engine, "close", None)
    if callable(close):
        close()


@pytest.fixture
def conn(server):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = dbapi.connect(server[2])
    yield c
    c.close()


def _table(conn, name, n=10):
    with conn.cursor() as cur:
        cur.execute(f"CREATE OR REPLACE TABLE {name} AS "
                    f"SELECT range AS id, 'v' || range AS s FROM range({n})")  # fmt: skip


def test_select_and_description(conn):
    _table(conn, "sel")
    with conn.cursor() as cur:
        cur.execute("SELECT id, s FROM sel ORDER BY id LIMIT 3")
        assert cur.fetchall() == [(0, "v0"), (1, "v1"), (2, "v2")]
        assert [d[0] for d in cur.description] == ["id", "s"]


def test_parameters(conn):
    _table(conn, "par")
    with conn.cursor() as cur:
        cur.execute("SELECT s FROM par WHERE id = ? OR s = ? ORDER BY s", parameters=[3, "v5"])
        assert cur.fetchall() == [("v3",), ("v5",)]


def test_dml_rowcount_through_prepared_query(conn):
    _table(conn, "dml", 20)
    with conn.cursor() as cur:
        cur.execute("DELETE FROM dml WHERE id < 5")
        assert cur.rowcount == 5
        cur.execute("INSERT INTO dml SELECT id + 100, s FROM dml WHERE id >= 18")
        assert cur.rowcount == 2
        cur.execute("DELETE FROM dml WHERE id = ?", parameters=[10])
        assert cur.rowcount == 1
        cur.execute("SELECT count(*) FROM dml")
        assert cur.fetchone() == (16,)


def test_executemany_insert(conn):
    _table(conn, "many", 0)
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO many VALUES (?, ?)", [(i, f"r{i}") for i in range(50)])
        assert cur.rowcount == 50
        cur.execute("SELECT count(*), sum(id) FROM many")
        assert cur.fetchone() == (50, sum(range(50)))


@pytest.mark.parametrize("mode", ["create", "append", "replace", "create_append"])
def test_ingest_modes(server, conn, mode):
    name = f"ing_{mode}"
    data = pa.table({"a": pa.array([1, 2, 3], pa.int64()), "b": ["x", "y", "z"]})
    with conn.cursor() as cur:
        if mode in ("append", "replace"):
            cur.adbc_ingest(name, data, mode="create")
        assert cur.adbc_ingest(name, data, mode=mode) == 3
        if mode == "create_append":
            assert cur.adbc_ingest(name, data, mode=mode) == 3
        cur.execute(f"SELECT count(*) FROM {name}")
        expected = {"create": 3, "append": 6, "replace": 3, "create_append": 6}[mode]
        assert cur.fetchone() == (expected,)


def test_ingest_errors_keep_server_up(conn):
    data = pa.table({"a": [1]})
    with conn.cursor() as cur:
        cur.adbc_ingest("ing_err", data, mode="create")
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as exc:
        cur.adbc_ingest("ing_err", data, mode="create")
    assert "TableExists" in str(exc.value) and "ing_err" in str(exc.value)
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as exc:
        cur.adbc_ingest("ing_missing", data, mode="append")
    assert "NOT_FOUND" in str(exc.value) and "ing_missing" in str(exc.value)
    with conn.cursor() as cur:  # a failed ingest spoils its cursor; a new one works
        cur.execute("SELECT count(*) FROM ing_err")
        assert cur.fetchone() == (1,)


def test_ingest_streams_many_batches(conn):
    batches = [pa.record_batch({"i": pa.array(range(k * 1000, (k + 1) * 1000))})
               for k in range(20)]  # fmt: skip
    reader = pa.RecordBatchReader.from_batches(batches[0].schema, batches)
    with conn.cursor() as cur:
        assert cur.adbc_ingest("ing_big", reader, mode="replace") == 20_000
        cur.execute("SELECT count(*), sum(i) FROM ing_big")
        assert cur.fetchone() == (20_000, sum(range(20_000)))


def test_get_objects_and_table_schema(conn):
    _table(conn, "meta_t")
    objects = conn.adbc_get_objects(depth="all", table_name_filter="meta%").read_all()
    rows = objects.to_pylist()
    assert rows[0]["catalog_name"] == "flightsrv"
    schema_entry = rows[0]["catalog_db_schemas"][0]
    assert schema_entry["db_schema_name"] == "main"
    tables = {t["table_name"]: t for t in schema_entry["db_schema_tables"]}
    assert set(tables) == {"meta_t"}
    cols = [(c["column_name"], c["xdbc_type_name"]) for c in tables["meta_t"]["table_columns"]]
    assert cols == [("id", "BIGINT"), ("s", "VARCHAR")]
    schema = conn.adbc_get_table_schema("meta_t")
    assert schema.names == ["id", "s"] and schema.field("id").type == pa.int64()
    with pytest.raises(adbc_driver_manager.Error):
        conn.adbc_get_table_schema("no_such_table")


def test_table_names_match_in_any_case(conn):
    """A table ingested as ``MixedCase`` (stored in lower case) is found by that name, as
    SQL finds it: GetTables' table name filter ignores case, its pattern otherwise the
    same (``_`` one character)."""
    with conn.cursor() as cur:
        cur.adbc_ingest("MixedCase", pa.table({"Col A": [1]}), mode="replace")
        cur.execute('SELECT "Col A" FROM MIXEDCASE')
        assert cur.fetchall() == [(1,)]
    def found(pattern):
        objects = conn.adbc_get_objects(depth="tables", table_name_filter=pattern).read_all()
        return [t["table_name"] for c in objects.to_pylist()
                for s in c["catalog_db_schemas"] or [] for t in s["db_schema_tables"] or []]

    stored = found("mixedcase")
    assert [n.lower() for n in stored] == ["mixedcase"]
    for pattern, hit in [("MixedCase", True), ("MIXED%", True), ("mIxEd_aSe", True),
                         ("Mixed_Case", False), ("MixedCas", False)]:
        assert found(pattern) == (stored if hit else []), pattern
    # the ADBC driver (Go) keeps only a returned row whose table_name equals the name asked
    # for, byte for byte, so its GetTableSchema needs the stored name (flightsrv: lower case)
    assert conn.adbc_get_table_schema(stored[0]).names == ["Col A"]
    with pytest.raises(adbc_driver_manager.Error):
        conn.adbc_get_table_schema("MixedCas")


def test_get_info(conn):
    info = conn.adbc_get_info()
    assert info["vendor_name"] == "flightsrv"
    assert info["vendor_arrow_version"] == pa.__version__


def test_table_types(conn):
    assert conn.adbc_get_table_types() == ["TABLE"]


def test_errors_name_statement_and_keep_server_up(conn):
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.ProgrammingError) as exc:
        cur.execute("SELEC 1")
    assert "INVALID_ARGUMENT" in str(exc.value) and "SELEC 1" in str(exc.value)
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as exc:
        cur.execute("SELECT * FROM missing_tbl")
    assert "NOT_FOUND" in str(exc.value) and "missing_tbl" in str(exc.value)
    with conn.cursor() as cur:
        cur.execute("SELECT 42 AS x")
        assert cur.fetchone() == (42,)


def test_large_result_streams_in_batches(server, conn):
    with conn.cursor() as cur:
        cur.execute("SELECT range AS i FROM range(300000)")
        reader = cur.fetch_record_batch()
        total = nbatches = 0
        for batch in reader:
            total += batch.num_rows
            nbatches += 1
    assert total == 300_000
    assert nbatches > 1  # DuckDB's reader batches went through one by one


def test_execute_schema(conn):
    _table(conn, "sch")
    with conn.cursor() as cur:
        schema = cur.adbc_execute_schema("SELECT id, s FROM sch")
    assert schema.names == ["id", "s"]


@pytest.mark.parametrize("mode", ["append", "create", "replace", "create_append"])
def test_ingest_the_client_aborts_commits_nothing(conn, mode):
    """A client whose own data source fails part way cancels the upload: the rows sent so
    far must not be committed, and a replace must leave the old table whole. (ADBC cancels
    the call; the server then sees what looks like the end of the stream.)"""
    name = f"ing_abort_{mode}"
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        if mode in ("append", "replace"):
            cur.adbc_ingest(name, pa.table({"a": [1], "b": ["old"]}, schema=schema),
                            mode="create")

    def source():
        yield pa.record_batch({"a": [10, 11], "b": ["partial", "partial"]}, schema=schema)
        raise RuntimeError("the client's source failed")

    cur = conn.cursor()
    with pytest.raises(adbc_driver_manager.Error, match="source failed"):
        cur.adbc_ingest(name, pa.RecordBatchReader.from_batches(schema, source()), mode=mode)
    cur.close()  # the driver cancels the call now; the server sees the stream end

    expected = [(1, "old")] if mode in ("append", "replace") else None
    for _ in range(30):  # a wrong commit lands within milliseconds of the cancel
        with conn.cursor() as check:
            check.execute("SHOW TABLES")
            present = name in {r[0] for r in check.fetchall()}
            if expected is None:
                assert not present, f"{mode}: a table was created from a cancelled upload"
            else:
                check.execute(f"SELECT a, b FROM {name} ORDER BY a")
                assert check.fetchall() == expected
        time.sleep(0.1)


def test_rows_wider_than_a_client_message_stream_in_slices(conn):
    """DuckDB hands the server 122,880-row batches; with ~230-byte rows one is ~28 MB, over
    the 16 MiB a gRPC client accepts by default (ADBC: "received message larger than max").
    The server sends such batches in slices, both when it streams a query (DoGet) and when
    it returns a result it already ran (a query through GetFlightInfo with a result id)."""
    with conn.cursor() as cur:
        cur.execute("CREATE OR REPLACE TABLE wide_rows AS SELECT range AS id, "
                    "repeat('x', 220) || range::VARCHAR AS payload FROM range(150000)")
        cur.execute("SELECT * FROM wide_rows")
        got = cur.fetch_arrow_table()
        rows = dict(zip(got.column("id").to_pylist(), got.column("payload").to_pylist()))
        assert len(rows) == got.num_rows == 150000
        assert all(rows[i] == "x" * 220 + str(i) for i in range(150000))
        cur.execute("SELECT payload FROM wide_rows WHERE id = ?", parameters=[149999])
        assert cur.fetchall() == [("x" * 220 + "149999",)]


def test_current_catalog_schema_and_session_options(server, conn):
    """ADBC reads (and sets) its current catalog and schema through Flight's session
    options; the session's SET values are session options too."""
    assert conn.adbc_current_catalog == "flightsrv"
    assert conn.adbc_current_db_schema == "main"
    conn.adbc_current_catalog = "flightsrv"  # the one there is: accepted
    conn.adbc_current_db_schema = "main"
    with pytest.raises(adbc_driver_manager.Error, match="catalog|INVALID"):
        conn.adbc_current_catalog = "other"
    with pytest.raises(adbc_driver_manager.Error, match="schema|INVALID"):
        conn.adbc_current_db_schema = "other"
    raw = conn.adbc_connection
    raw.set_options(**{"adbc.flight.sql.session.option.statement_timeout": "30s",
                       "adbc.flight.sql.session.option.delete_mode": "SPLICE"})
    import json

    options = json.loads(raw.get_option("adbc.flight.sql.session.options"))
    assert options == {"catalog": "flightsrv", "schema": "main",
                       "statement_timeout": "30000", "delete_mode": "splice"}
    for bad in ({"adbc.flight.sql.session.option.statement_timeout": "soon"},
                {"adbc.flight.sql.session.option.search_path": "x"}):
        with pytest.raises(adbc_driver_manager.Error):
            raw.set_options(**bad)
    raw.set_options(**{"adbc.flight.sql.session.optionerase.delete_mode": ""})  # unset
    options = json.loads(raw.get_option("adbc.flight.sql.session.options"))
    assert "delete_mode" not in options and options["statement_timeout"] == "30000"
    if type(server[1]).__name__ == "DuckEngine":  # SET is the product engine's
        with conn.cursor() as cur:
            cur.execute("SET statement_timeout = '1min'")
        options = json.loads(raw.get_option("adbc.flight.sql.session.options"))
        assert options["statement_timeout"] == "60000"  # one session, two spellings
        with conn.cursor() as cur:  # back to the default: RESET, SET ... = DEFAULT
            cur.execute("SET delete_mode = 'splice'")
            cur.execute("RESET statement_timeout")
            options = json.loads(raw.get_option("adbc.flight.sql.session.options"))
            assert "statement_timeout" not in options and options["delete_mode"] == "splice"
            cur.execute("SET delete_mode TO DEFAULT")
            cur.execute("SET statement_timeout = '2min'")
            options = json.loads(raw.get_option("adbc.flight.sql.session.options"))
            assert "delete_mode" not in options and options["statement_timeout"] == "120000"
            cur.execute("SET delete_mode = 'dv'")
            cur.execute("RESET ALL")
            options = json.loads(raw.get_option("adbc.flight.sql.session.options"))
            assert "delete_mode" not in options and "statement_timeout" not in options
            with pytest.raises(adbc_driver_manager.Error, match="RESET threads"):
                cur.execute("RESET threads")

"""Column types a table cannot hold are refused with a clear error naming the table and the
column, before anything is committed: INTERVAL (Parquet cannot store Arrow's month_day_nano)
from SQL, CTAS, bulk ingest and the Python API, and DECIMALs DuckDB has no type for
(precision above 38, scale above the precision)."""

from __future__ import annotations

import warnings

import adbc_driver_manager
import duckdb
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi

from flightsrv import Warehouse
from flightsrv.engine.api import IngestMode
from flightsrv.errors import ConfigurationError

INTERVALS = pa.table({"c": pa.array([pa.MonthDayNano([1, 2, 3])],
                                    pa.month_day_nano_interval())})


@pytest.fixture
def wh(tmp_path):
    return Warehouse.open(str(tmp_path / "wh"))


def _refused(wh, sql, message, column):
    with pytest.raises(ConfigurationError) as exc:
        wh.sql(sql)
    e = exc.value
    assert e.message == message, str(e)
    assert e.context.get("column") == column, str(e)
    return e


@pytest.mark.parametrize("sql,column", [
    ("CREATE TABLE iv1 (id INT, c INTERVAL)", "c"),
    ("CREATE OR REPLACE TABLE iv1 (c INTERVAL)", "c"),
    ("CREATE TABLE iv1 (s STRUCT(a INTERVAL))", "s"),
    ("CREATE TABLE iv1 (l INTERVAL[])", "l"),
    ("CREATE TABLE iv1 AS SELECT 1 AS id, INTERVAL 1 DAY AS c", "c"),
])
def test_interval_column_is_refused_naming_table_and_column(wh, sql, column):
    e = _refused(wh, sql, "unsupported column type", column)
    assert e.context.get("table") == "iv1"
    assert "iv1" not in wh.list_tables()


def test_interval_in_alter_table_is_refused(wh):
    wh.sql("CREATE TABLE t (id INT)")
    _refused(wh, "ALTER TABLE t ADD COLUMN c INTERVAL", "unsupported column type", "c")
    _refused(wh, "ALTER TABLE t ALTER COLUMN id TYPE INTERVAL", "unsupported column type", "id")
    t = wh.table("t")
    for change in (lambda: t.add_column("c", pa.month_day_nano_interval()),
                   lambda: t.alter_column_type("id", pa.month_day_nano_interval())):
        with pytest.raises(ConfigurationError, match="unsupported column type"):
            change()
    assert wh.table("t").head().version == 0
    assert wh.sql("SELECT * FROM t").schema.names == ["id"]


def test_interval_ingest_is_refused(wh):
    engine = wh.engine
    for mode in (IngestMode.CREATE, IngestMode.CREATE_APPEND):
        with pytest.raises(ConfigurationError) as exc:
            engine.ingest("iv4", mode, INTERVALS.to_reader(), wh._session())
        assert exc.value.message == "unsupported column type"
        assert exc.value.context["table"] == "iv4" and exc.value.context["column"] == "c"
    assert "iv4" not in wh.list_tables()


def test_create_or_replace_with_interval_keeps_the_old_table(wh):
    wh.sql("CREATE TABLE iv5 (id INT)")
    wh.sql("INSERT INTO iv5 VALUES (1)")
    _refused(wh, "CREATE OR REPLACE TABLE iv5 (c INTERVAL)", "unsupported column type", "c")
    assert wh.sql("SELECT * FROM iv5").to_pylist() == [{"id": 1}]


@pytest.mark.parametrize("sql,column,message", [
    ("CREATE TABLE d (id INT, d DECIMAL(40,2))", "d",
     "DECIMAL precision must be between 1 and 38"),
    ("CREATE TABLE d (d DECIMAL(39))", "d", "DECIMAL precision must be between 1 and 38"),
    ("CREATE TABLE d (d DECIMAL(5,10))", "d",
     "DECIMAL scale must not be greater than its precision"),
    ("CREATE TABLE d (s STRUCT(x DECIMAL(4,5)))", "s",
     "DECIMAL scale must not be greater than its precision"),
])
def test_decimal_duckdb_cannot_hold_is_refused(wh, sql, column, message):
    with pytest.raises(duckdb.Error):  # DuckDB refuses the same columns
        duckdb.connect().execute(sql)
    _refused(wh, sql, message, column)
    assert "d" not in wh.list_tables()


def test_decimal_limits_duckdb_accepts_are_accepted(wh):
    wh.sql("CREATE TABLE d (a DECIMAL(38,38), b DECIMAL(1), c DECIMAL(38,0))")
    wh.sql("INSERT INTO d VALUES (0.5, 7, 12345678901234567890123456789012345678)")
    assert wh.sql("SELECT count(*) AS n FROM d").column("n").to_pylist() == [1]


def test_interval_through_adbc_is_invalid_argument(wh):
    from flightsrv.engine.duck import DuckEngine
    from flightsrv.server.app import start_in_thread

    engine = DuckEngine(wh)
    server, port = start_in_thread(engine)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE iv5 (id INT)")
            for sql in ("CREATE TABLE iv1 (c INTERVAL)",
                        "CREATE TABLE iv2 AS SELECT INTERVAL 1 DAY AS c",
                        "CREATE OR REPLACE TABLE iv5 (c INTERVAL)",
                        "CREATE TABLE d1 (d DECIMAL(40,2))"):
                with pytest.raises(adbc_driver_manager.Error) as exc:
                    cur.execute(sql)
                text = str(exc.value)
                assert "INVALID_ARGUMENT" in text, text
                assert "column=" in text and "table=" in text, text
                assert "TypeError" not in text and "ValueError" not in text, text
            with pytest.raises(adbc_driver_manager.Error) as exc:
                cur.adbc_ingest("iv4", INTERVALS, mode="create")
            text = str(exc.value)
            assert "INVALID_ARGUMENT" in text and "unsupported column type" in text, text
            assert "table=iv4" in text and "column=c" in text, text
            cur.execute("SELECT count(*) FROM iv5")
            assert cur.fetchone() == (0,)
        conn.close()
    finally:
        server.shutdown()
        engine.close()


@pytest.mark.parametrize("t", [pa.decimal256(40, 2), pa.list_(pa.decimal256(39, 0)),
                               pa.struct([("x", pa.decimal256(50, 10))])])
def test_arrow_decimals_wider_than_38_digits_are_refused(wh, t):
    """DuckDB would read them as DOUBLE and lose digits; a decimal256 of 38 digits or fewer
    is stored as a decimal DuckDB has."""
    import decimal

    one = decimal.Decimal("1")
    value = [one] if pa.types.is_list(t) else {"x": one} if pa.types.is_struct(t) else one
    data = pa.table({"d": pa.array([value], t)})
    with pytest.raises(ConfigurationError, match="between 1 and 38") as exc:
        wh.engine.ingest("wide", IngestMode.CREATE, data.to_reader(), wh._session())
    assert exc.value.context["column"] == "d"
    with pytest.raises(ConfigurationError, match="between 1 and 38"):
        wh.create_table("wide", data.schema)
    assert "wide" not in wh.list_tables()
    ok = pa.table({"d": pa.array([decimal.Decimal("1.25")], pa.decimal256(20, 2))})
    wh.engine.ingest("narrow", IngestMode.CREATE, ok.to_reader(), wh._session())
    assert wh.sql("SELECT typeof(d) AS t FROM narrow").to_pylist() == [{"t": "DECIMAL(20,2)"}]


@pytest.mark.parametrize("sql,column,kind", [
    ("CREATE TABLE x (id INT, u UUID)", "u", "UUID"),
    ("CREATE TABLE x (j JSON)", "j", "JSON"),
    ("CREATE TABLE x (s STRUCT(j JSON))", "s", "JSON"),
    ("CREATE TABLE x (a INTEGER[3])", "a", "ARRAY"),
])
def test_columns_a_table_would_not_check_are_refused(wh, sql, column, kind):
    """UUID and JSON columns were stored as unchecked VARCHAR ('not-a-uuid' went in,
    equality with the canonical spelling missed rows) and INTEGER[3] as a list of any
    length: refused, naming the column, with what to declare instead."""
    with pytest.raises(ConfigurationError) as exc:
        wh.sql(sql)
    e = exc.value
    assert e.message.startswith("unsupported column type") and kind in e.message, str(e)
    assert e.context.get("column") == column and "declare" in e.message
    assert "x" not in wh.list_tables()


@pytest.mark.parametrize("query,column,kind", [
    ("SELECT 1 AS id, (2::UHUGEINT ** 127)::UHUGEINT AS u", "u", "UHUGEINT"),
    ("SELECT TIMETZ '01:02:03+02' AS t", "t", "TIME WITH TIME ZONE"),
    ("SELECT '101'::BIT AS b", "b", "BIT"),
    ("SELECT [1::UHUGEINT] AS l", "l", "UHUGEINT"),
])
def test_create_table_as_refuses_a_type_whose_values_would_change(wh, query, column, kind):
    """CREATE TABLE ... AS stored UHUGEINT 2^128-1 as -1, TIMETZ without its offset and BIT
    as bytes; it now refuses the query's column before writing anything."""
    with pytest.raises(ConfigurationError) as exc:
        wh.sql(f"CREATE TABLE x AS {query}")
    e = exc.value
    assert e.context.get("column") == column and kind in e.message, str(e)
    assert "x" not in wh.list_tables()


def test_create_table_as_refuses_a_collated_column(wh):
    """A COLLATE that gives a result column a collation: DuckDB's table keeps it (``s =
    'ABC'`` matches 'abc'), a flightsrv table stores none, so CREATE TABLE AS refuses it
    before writing anything, as CREATE TABLE refuses COLLATE (it stored plain VARCHAR and
    answered differently from DuckDB: session 29). A COLLATE that only decides a comparison
    (WHERE, ORDER BY, a join condition) is fine."""
    from flightsrv.errors import SqlError

    for query in ("SELECT 'abc' COLLATE NOCASE AS s",
                  "SELECT * FROM (VALUES ('abc'), ('ABC')) v(s0), "
                  "LATERAL (SELECT s0 COLLATE NOCASE AS s)"):
        with pytest.raises(SqlError, match="collation") as exc:
            wh.sql(f"CREATE TABLE x AS {query}")
        assert exc.value.context.get("table") == "x"
        assert "x" not in wh.list_tables()
    wh.sql("CREATE TABLE y AS SELECT s0 FROM (VALUES ('abc'), ('ABC'), ('b')) v(s0) "
           "WHERE s0 COLLATE NOCASE = 'abc' ORDER BY s0 COLLATE NOCASE")
    assert sorted(wh.sql("SELECT s0 FROM y").column("s0").to_pylist()) == ["ABC", "abc"]


def test_create_table_as_keeps_every_value_of_the_types_it_changes(wh):
    """HUGEINT (a sum of integers) as DECIMAL(38,0), JSON and UUID as text, ENUM as VARCHAR,
    ARRAY as a list: each value as DuckDB shows it."""
    query = ("SELECT sum(i) AS s, (2::HUGEINT ** 126)::HUGEINT AS h, '{\"a\": 1}'::JSON AS j, "
             "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'::UUID AS u, 'b'::ENUM('a', 'b') AS e, "
             "[1, 2]::INTEGER[2] AS a FROM range(5) r(i)")
    wh.sql(f"CREATE TABLE x AS {query}")
    got = wh.sql("SELECT s::VARCHAR, h::VARCHAR, j::VARCHAR, u::VARCHAR, e::VARCHAR, a FROM x")
    want = duckdb.sql(f"SELECT s::VARCHAR, h::VARCHAR, j::VARCHAR, u::VARCHAR, e::VARCHAR, "
                      f"a::INTEGER[] FROM ({query})").fetchall()
    assert [tuple(r.values()) for r in got.to_pylist()] == want

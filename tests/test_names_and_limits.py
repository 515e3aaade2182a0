"""What a writer hands in that could break the server for others, refused up front (found
in session 28 by a protocol run):

- a table or top-level column named with the engine's reserved prefix ``__fsrv`` through
  bulk ingest or the Python API (SQL refused it; such a table was listed to everyone but
  could not be read or dropped, and such a column broke every UPDATE of its table);
- a column type nested deeper than Arrow's C data interface can carry (it broke GetTables
  and ``adbc_get_objects`` for every principal);
- a ``statement_timeout`` too long for a float (an INTERNAL OverflowError);
- a query result nested too deep for Arrow: a statement error naming the statement."""

from __future__ import annotations

import pyarrow as pa
import pytest

from _server_harness import READER, WRITER, adbc, start

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.errors import ConfigurationError, SqlError
from flightsrv.sql.statements import MAX_DURATION_MS, parse_duration_ms


def _nested(depth: int) -> pa.DataType:
    t = pa.int32()
    for _ in range(depth):
        t = pa.struct([("a", t)])
    return t


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv, _engine, wh, uri = start(tmp_path_factory.mktemp("names"))
    yield uri, wh
    srv.shutdown()


@pytest.mark.parametrize("table, columns", [
    ("__fsrv_demo", {"id": pa.array([1])}),
    ("__FSRV_T", {"id": pa.array([1])}),
    ("hid", {"id": pa.array([1]), "__fsrv_file": pa.array(["x"])}),
    ("hid2", {"id": pa.array([1]), "__FSRV_pos": pa.array([1])}),
    ("deep", {"v": pa.array([None], _nested(33))}),
])
def test_ingest_refuses_what_sql_refuses(server, table, columns):
    uri, wh = server
    with adbc(uri, WRITER) as conn, conn.cursor() as cur:
        with pytest.raises(Exception, match="reserved|nested more than 32") as e:
            cur.adbc_ingest(table, pa.table(columns), mode="create")
        assert "INVALID_ARGUMENT" in str(e.value)
    assert table.lower() not in wh.list_tables()
    with adbc(uri, READER) as conn:  # the catalog browse BI tools make still answers
        objects = conn.adbc_get_objects(depth="columns").read_all()
        assert objects.num_rows >= 1


def test_the_deepest_column_type_allowed_is_listed_and_read(server):
    uri, wh = server
    with adbc(uri, WRITER) as conn, conn.cursor() as cur:
        cur.adbc_ingest("deep_ok", pa.table({"v": pa.array([None], _nested(32))}),
                        mode="create")
        cur.execute("SELECT count(*) FROM deep_ok")
        assert cur.fetchall() == [(1,)]
        assert conn.adbc_get_objects(depth="columns").read_all().num_rows >= 1
        cur.execute("DROP TABLE deep_ok")


def test_python_api_and_sql_refuse_them_too(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    with pytest.raises(ConfigurationError, match="reserved"):
        wh.create_table("__fsrv_x", pa.schema([("a", pa.int64())]))
    with pytest.raises(ConfigurationError, match="reserved"):
        wh.create_table("t", pa.schema([("__fsrv_file", pa.int64())]))
    wh.create_table("t", pa.schema([("s", pa.struct([("__fsrv_ok", pa.int64())]))]))
    e = DuckEngine(wh)
    s = Session("s")
    try:
        inner = "INTEGER"
        for _ in range(33):
            inner = f"STRUCT(a {inner})"
        with pytest.raises(Exception, match="nested more than 32"):
            e.execute_update(f"CREATE TABLE d (v {inner})", s)
        lit = "1"
        for _ in range(64):
            lit = "{'a': " + lit + "}"
        with pytest.raises(SqlError, match="cannot be sent as Arrow") as err:
            e.execute_query(f"SELECT {lit} AS v", s).reader.read_all()
        assert "statement=" in str(err.value)
        assert e.execute_query("SELECT 1 AS x", s).reader.read_all().num_rows == 1
    finally:
        e.close()


def test_a_timeout_of_any_length_is_a_duration():
    assert parse_duration_ms("9" * 400 + "s") == MAX_DURATION_MS
    assert parse_duration_ms("999999999999999999999") == MAX_DURATION_MS
    assert parse_duration_ms("1.5s") == 1500
    assert parse_duration_ms("0.0005s") == 1  # under a millisecond is not "no limit"
    assert parse_duration_ms("0") == 0
    with pytest.raises(ValueError):
        parse_duration_ms("9" * 1001)


def test_set_a_huge_statement_timeout(server):
    uri, _ = server
    with adbc(uri, READER) as conn, conn.cursor() as cur:
        cur.execute(f"SET statement_timeout = '{'9' * 400}s'")
        cur.execute("SELECT 42")
        assert cur.fetchall() == [(42,)]

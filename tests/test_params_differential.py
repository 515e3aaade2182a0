"""Placeholder spellings, differentially: each statement runs with the same parameters on
flightsrv (prepared through the ADBC Flight SQL driver, flightsrv's own engine) and on plain
DuckDB over the same rows; the rows must be equal (or both sides must refuse).

The spellings are the ones DuckDB accepts: ``?`` and ``$n``, with and without spaces around
commas and operators (JDBC and ORMs write ``VALUES (?,?)``), in IN lists, VALUES rows,
LIMIT, casts, and ``?``/``$1`` inside strings, quoted names and comments (not parameters).
"""

from __future__ import annotations

import warnings

import duckdb
import pyarrow as pa
import pytest
from _server_engine import start_test_server
from adbc_driver_flightsql import dbapi

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")

SETUP = "CREATE OR REPLACE TABLE pt AS SELECT range AS id, 'v' || range AS s FROM range(6)"

# (statement, parameter values)
CASES = [
    ("SELECT ?", [1]),
    ("SELECT ?, ?", [1, 2]),
    ("SELECT ?,?", [1, 2]),
    ("SELECT ?,?,?", [1, "x", 2.5]),
    ("SELECT (?)", [7]),
    ("SELECT (?),(?)", [7, 8]),
    ("SELECT ?::INT", ["41"]),
    ("SELECT ?::INT,?::VARCHAR", ["41", 5]),
    ("SELECT $1", [1]),
    ("SELECT $1,$2", [1, 2]),
    ("SELECT $2,$1", [1, 2]),
    ("SELECT $1 AS a,$1 AS b,$2", [1, 2]),
    ("SELECT $1::BIGINT+$2", [1, 2]),
    ("SELECT ?+?", [1, 2]),
    ("SELECT ?-?", [5, 2]),
    ("SELECT ?*?,?/?", [3, 4, 8, 2]),
    ("SELECT ?||?", ["a", "b"]),
    ("SELECT $1||$2", ["a", "b"]),
    ("SELECT [?,?]", [1, 2]),
    ("SELECT {'a':?,'b':?}", [1, "x"]),
    ("SELECT '?', ?", [1]),
    ("SELECT '?,?', ?", [1]),
    ("SELECT '$1,$2', $1", [1]),
    ("SELECT 1 AS \"?\", ?", [2]),
    ("SELECT ? -- ?\n", [3]),
    ("SELECT /* ?,? */ ?", [3]),
    ("SELECT $$?,?$$, ?", [3]),
    ("SELECT $t$$1,$2$t$, $1", [3]),
    ("SELECT id FROM pt WHERE id IN (?,?) ORDER BY id", [1, 3]),
    ("SELECT id FROM pt WHERE id IN ($1,$2,$1) ORDER BY id", [4, 2]),
    ("SELECT id FROM pt WHERE id BETWEEN ? AND ? ORDER BY id", [1, 3]),
    ("SELECT id FROM pt WHERE id>? AND s<>? ORDER BY id", [2, "v4"]),
    ("SELECT id FROM pt ORDER BY id LIMIT ?", [2]),
    ("SELECT id FROM pt ORDER BY id LIMIT ? OFFSET ?", [2, 3]),
    ("SELECT * FROM (VALUES (?,?),(?,?)) v(a, b) ORDER BY a", [2, "b", 1, "a"]),
    ("SELECT coalesce(?,?)", [None, 4]),
]


def _plain(sql: str, values: list) -> list[tuple]:
    con = duckdb.connect()
    con.execute(SETUP)
    return con.execute(sql, values).fetchall()


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    from flightsrv import Warehouse
    from flightsrv.engine import DuckEngine

    engine = DuckEngine(Warehouse.open(str(tmp_path_factory.mktemp("pd") / "wh")))
    srv, engine, uri = start_test_server(engine=engine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = dbapi.connect(uri)
    with c.cursor() as cur:
        cur.execute(SETUP)
    yield c
    c.close()
    srv.shutdown()
    engine.close()


@pytest.mark.parametrize(("sql", "values"), CASES, ids=[c[0] for c in CASES])
def test_same_rows_as_duckdb(conn, sql, values):
    want = _plain(sql, values)
    with conn.cursor() as cur:
        cur.execute(sql, parameters=values)
        got = cur.fetchall()
    assert got == want


@pytest.mark.parametrize("sql", ["INSERT INTO pi VALUES (?,?)", "INSERT INTO pi VALUES ($1,$2)",
                                 "INSERT INTO pi (b,a) VALUES ($2,$1)",
                                 "INSERT INTO pi VALUES (?,?),(?+1,?||'!')"])
def test_insert_values_rows_as_duckdb(conn, sql):
    n = sql.count("?") or 2
    values = [1, "x", 2, "y"][:n]
    plain = duckdb.connect()
    plain.execute("CREATE TABLE pi (a BIGINT, b VARCHAR)")
    plain.execute(sql, values)
    want = plain.execute("SELECT * FROM pi ORDER BY a").fetchall()
    with conn.cursor() as cur:
        cur.execute("CREATE OR REPLACE TABLE pi (a BIGINT, b VARCHAR)")
        cur.execute(sql, parameters=values)
        cur.execute("SELECT * FROM pi ORDER BY a")
        assert cur.fetchall() == want


def test_batch_of_rows_with_adjacent_placeholders(conn):
    """executemany-style: one prepared ``VALUES (?,?)`` bound to a batch of rows."""
    batch = pa.record_batch([pa.array([1, 2, 3]), pa.array(["a", "b", "c"])], names=["a", "b"])
    with conn.cursor() as cur:
        cur.execute("CREATE OR REPLACE TABLE pb (a BIGINT, b VARCHAR)")
        cur.executemany("INSERT INTO pb VALUES (?,?)", batch)
        cur.execute("SELECT * FROM pb ORDER BY a")
        assert cur.fetchall() == [(1, "a"), (2, "b"), (3, "c")]

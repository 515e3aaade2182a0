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


# -- values rendered into the statement's text --------------------------------------------

RENDERED = [
    # (parameter, the value DuckDB gives for it, as text)
    (pa.array([-800000], pa.date32()), "0222-09-04 (BC)"),
    (pa.array([-719163], pa.date32()), "0001-12-31 (BC)"),
    (pa.array([3000000], pa.date32()), "10183-09-21"),
    (pa.array([-10**17], pa.timestamp("us")), "1200-02-15 (BC) 14:13:20"),
    (pa.array([-10**17 + 5], pa.timestamp("us", tz="UTC")), "1200-02-15 (BC) 14:13:20.000005+00"),
    (pa.array([-1], pa.timestamp("ns")), "1969-12-31 23:59:59.999999999"),
    (pa.array([None], pa.struct([('a"b', pa.int64())])), None),
]


@pytest.mark.parametrize(("arr", "text"), RENDERED, ids=[str(r[0].type) + str(r[1])
                                                         for r in RENDERED])
def test_values_rendered_exactly(conn, arr, text):
    """BC and year > 9999 dates, timestamps beyond Python's datetime, struct field names
    with quotes: the value and its type reach DuckDB as they were bound."""
    with conn.cursor() as cur:
        cur.execute("SELECT ?::VARCHAR AS v, typeof(?) AS t",
                    parameters=pa.record_batch([arr, arr], names=["p", "q"]))
        got = cur.fetchall()
    tbl = pa.table({"p": arr})  # noqa: F841 - read by DuckDB's replacement scan
    want_type = duckdb.connect().execute("SELECT typeof(p) FROM tbl").fetchone()[0]
    assert got == [(text, want_type)]


def test_struct_field_name_is_not_sql(conn):
    """A field named ``x" INTEGER, "y`` is one field of that name (was pasted into the
    CAST type, giving two fields x and y)."""
    arr = pa.array([None], pa.struct([('x" INTEGER, "y', pa.int64())]))
    with conn.cursor() as cur:
        cur.execute("SELECT ? AS v", parameters=pa.record_batch([arr], names=["p"]))
        table = cur.fetch_arrow_table()
    assert table.schema.field("v").type == arr.type


@pytest.mark.parametrize("arr", [pa.array([2**31 - 1], pa.date32()),
                                 pa.array([10**14], pa.timestamp("s"))],
                         ids=["date32-max", "timestamp_s-far"])
def test_value_outside_duckdb_range_is_invalid_argument(conn, arr):
    with conn.cursor() as cur, pytest.raises(Exception) as exc:
        cur.execute("SELECT ? AS v", parameters=pa.record_batch([arr], names=["p"]))
        cur.fetchall()
    assert "INVALID_ARGUMENT" in str(exc.value) and "$1" in str(exc.value)
    assert "INTERNAL" not in str(exc.value)


def test_bc_date_parameter_in_dml(conn):
    """DELETE binds parameters as literals too: a BC date matches its row."""
    days = pa.array([-800000, 0], pa.date32())
    with conn.cursor() as cur:
        cur.execute("CREATE OR REPLACE TABLE pdml (d DATE)")
        cur.execute("INSERT INTO pdml SELECT * FROM (VALUES (?),(?)) v(d)",
                    parameters=pa.record_batch([days[:1], days[1:]], names=["a", "b"]))
        cur.execute("DELETE FROM pdml WHERE d = ?",
                    parameters=pa.record_batch([days[:1]], names=["a"]))
        assert cur.rowcount == 1
        cur.execute("SELECT d::VARCHAR FROM pdml")
        assert cur.fetchall() == [("1970-01-01",)]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_date_and_timestamp_text_as_duckdb_spells_them(unit):
    from flightsrv.sql.types import DATE_DAYS, date_text, timestamp_text

    days = [DATE_DAYS[0], -2_000_000, -719_529, -719_528, -719_163, -719_162, -1, 0, 1,
            11_016, 2_932_896, 2_932_897, DATE_DAYS[1]]
    con = duckdb.connect()
    want = con.execute("SELECT (DATE '1970-01-01' + d)::VARCHAR FROM unnest(?) t(d)",
                       [days]).fetchall()
    assert [(date_text(d),) for d in days] == want
    per = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
    counts = [-(10**17) * per // 10**6 + 7, -1, 0, 1, 86_400 * per - 1, 1_700_000_000 * per + 3]
    cast = {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "us": "TIMESTAMP", "ns": "TIMESTAMP_NS"}
    for c in counts:
        if unit == "ns" and not -(2**63) < c < 2**63:
            continue
        text = timestamp_text(c, unit)
        fn, scale = ("epoch_ns", 10**9) if unit == "ns" else ("epoch_us", 10**6)
        # the text is parsed as the unit's own type; the explicit widening to TIMESTAMP[_NS]
        # first is there because DuckDB 2.0.1's epoch_us(TIMESTAMP_S|MS) fails before year 1
        # ("Could not convert Timestamp to higher precision") where the cast itself succeeds
        wide = "TIMESTAMP_NS" if unit == "ns" else "TIMESTAMP"
        back = con.execute(
            f"SELECT {fn}(CAST(CAST('{text}' AS {cast[unit]}) AS {wide}))").fetchone()[0]
        assert back == c * scale // per, text


def test_union_bound_parameters_keep_their_values(conn):
    """The JDBC driver binds parameters as a union of types: the values are read from the
    union's child, not through Python (which cannot hold a BC date)."""
    bc = pa.UnionArray.from_dense(pa.array([0], pa.int8()), pa.array([0], pa.int32()),
                                  [pa.array([-800000], pa.date32()), pa.array(["x"])])
    mixed = pa.UnionArray.from_sparse(pa.array([1], pa.int8()),
                                      [pa.array([None], pa.int64()), pa.array(["y"])])
    with conn.cursor() as cur:
        cur.execute("SELECT CAST(? AS VARCHAR) AS d, ? AS s",
                    parameters=pa.record_batch([bc, mixed], names=["a", "b"]))
        got = cur.fetchall()
    expected = duckdb.sql("SELECT CAST(CAST(-800000 AS INTEGER) + DATE '1970-01-01' "
                          "AS VARCHAR)").fetchall()[0][0]
    assert got == [(expected, "y")]


# -- parameters keep the types they were bound with ----------------------------------------

TYPED = [
    pa.array([1_000_000], pa.int64()),
    pa.array([5], pa.int8()),
    pa.array([5], pa.int16()),
    pa.array([5], pa.uint32()),
    pa.array([2**63 + 1], pa.uint64()),
    pa.array([1.1], pa.float32()),
    pa.array([1.1], pa.float64()),
    pa.array(["x"], pa.large_string()),
    pa.array([b"\x00x"], pa.binary()),
    pa.array([True]),
    pa.array(["1.50"], pa.string()).cast(pa.decimal128(9, 2)),
    pa.array([1_600_000_000_123], pa.timestamp("ms")),
    pa.array([1_600_000_000_123_456], pa.timestamp("us", tz="UTC")),
    pa.array([18000], pa.date32()),
    pa.array([3_600_000_000], pa.time64("us")),
    pa.array([{"a": 5, "b": "x"}], pa.struct([("a", pa.int64()), ("b", pa.string())])),
    pa.array([[1, 2]], pa.list_(pa.int16())),
    pa.array([None], pa.int64()),
    # ADBC binds a Python [] as list<null>; DuckDB types it "NULL"[]
    pa.array([[]], pa.list_(pa.null())),
    pa.array([[None, None]], pa.list_(pa.null())),
    pa.array([[[]]], pa.list_(pa.list_(pa.null()))),
]

MAPS = [pa.array([[("k", 1), ("j", None)]], pa.map_(pa.string(), pa.int64())),
        pa.array([[]], pa.map_(pa.string(), pa.int64()))]


@pytest.mark.parametrize("arr", MAPS, ids=["entries", "empty"])
def test_map_parameters_as_duckdb_reads_them(conn, arr):
    plain = duckdb.connect()
    plain.register("b", pa.table({"p": arr}))
    want = plain.execute("SELECT typeof(p), CAST(p AS VARCHAR), p['k'] FROM b").fetchall()
    with conn.cursor() as cur:
        cur.execute("SELECT typeof(?), CAST(? AS VARCHAR), ?['k']",
                    parameters=pa.record_batch([arr] * 3, names=["0", "1", "2"]))
        assert cur.fetchall() == want


@pytest.mark.parametrize("sql", [
    "INSERT INTO pe SELECT 2, ?", "UPDATE pe SET l = ? WHERE id = 1",
    "DELETE FROM pe WHERE l = ?", "SELECT id FROM pe WHERE l = ? ORDER BY id"])
def test_empty_list_parameter_in_every_statement(conn, sql):
    """An empty list (Arrow list<null>) binds in every statement kind, as in DuckDB."""
    empty = pa.record_batch([pa.array([[]], pa.list_(pa.null()))], names=["0"])
    setup = ["CREATE OR REPLACE TABLE pe (id BIGINT, l INTEGER[])",
             "INSERT INTO pe VALUES (1, [1]), (3, [])"]
    plain = duckdb.connect()
    for q in setup:
        plain.execute(q)
    want = plain.execute(sql, [[]]).fetchall()
    with conn.cursor() as cur:
        for q in setup:
            cur.execute(q)
        cur.execute(sql, parameters=empty)
        got = cur.fetchall() if sql.startswith("SELECT") else [(cur.rowcount,)]
        cur.execute("SELECT * FROM pe ORDER BY id")
        rows = cur.fetchall()
    assert got == want
    assert rows == plain.execute("SELECT * FROM pe ORDER BY id").fetchall()


@pytest.mark.parametrize("arr", TYPED, ids=[str(a.type) for a in TYPED])
def test_parameter_types_as_duckdb_reads_them(conn, arr):
    """A bound parameter has the type it was bound with, as DuckDB types the same Arrow
    column: DuckDB types a Python ``int`` by its value, so a BIGINT 5 bound natively was an
    INTEGER, ``? * ?`` of two BIGINT parameters overflowed as INT32, and struct fields,
    FLOAT and DECIMAL changed type."""
    plain = duckdb.connect()
    plain.register("b", pa.table({"p": arr}))
    want = plain.execute("SELECT typeof(p), p, typeof(p + p) FROM b").fetchall() \
        if pa.types.is_integer(arr.type) else \
        plain.execute("SELECT typeof(p), p, NULL FROM b").fetchall()
    sql = "SELECT typeof(?), ?, typeof(? + ?)" if pa.types.is_integer(arr.type) else \
        "SELECT typeof(?), ?, NULL"
    if pa.types.is_integer(arr.type):
        batch = pa.record_batch([arr] * 4, names=["0", "1", "2", "3"])
    else:
        batch = pa.record_batch([arr] * 2, names=["0", "1"])
    with conn.cursor() as cur:
        cur.execute(sql, parameters=batch)
        assert cur.fetchall() == want


def test_bigint_parameters_multiply_as_bigint(conn):
    big = pa.array([1_000_000], pa.int64())
    with conn.cursor() as cur:
        cur.execute("SELECT ? * ?", parameters=pa.record_batch([big, big], names=["0", "1"]))
        assert cur.fetchall() == [(10**12,)]

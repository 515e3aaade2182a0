"""INSERT ... VALUES against plain DuckDB: the same statements run on flightsrv (Python API,
real local warehouse) and on a DuckDB table with the same columns; the outcome (error or
not) and the stored rows must be the same. DuckDB's INSERT casts each VALUES expression to
its target column's type; flightsrv must not type the list across its rows first (1.5 and
'NaN' in a DOUBLE column, 1.5 and 10 in a VARCHAR column). INSERT ... SELECT is typed as a
query on both sides.
"""

from __future__ import annotations

import datetime as dt
import math

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.errors import FlightsrvError

DDL = ("CREATE TABLE vc (id INTEGER NOT NULL, f DOUBLE, s VARCHAR, ts TIMESTAMPTZ, "
       "dd DECIMAL(10,2), b BOOLEAN, d DATE, l INTEGER[])")
# a column added later with a write default (omitted or DEFAULT in VALUES -> 7)
ADD = "ALTER TABLE vc ADD COLUMN k INTEGER DEFAULT 7"
COLUMNS = ["id", "f", "s", "ts", "dd", "b", "d", "l", "k"]


def _value(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.timezone.utc).isoformat()
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return repr(v)


def _comparable(column):
    """Dates and timestamps as their integer values (days, or units since the epoch in
    UTC): exact, and defined for DuckDB's infinities and years Python cannot hold."""
    t = column.type
    if pa.types.is_date32(t):
        return column.cast(pa.int32())
    if pa.types.is_timestamp(t):
        return column.cast(pa.timestamp(t.unit)).cast(pa.int64())
    return column


def canon(table) -> list:
    table = pa.table({n: _comparable(table.column(n)) for n in table.column_names})
    return sorted(tuple(_value(v) for v in r.values()) for r in table.to_pylist())


def _setup(path):
    wh = Warehouse.open(str(path))
    ref = duckdb.connect()  # the process's time zone, as the engine's DuckDB
    for sql in (DDL, ADD):
        wh.sql(sql)
        ref.execute(sql)
    return wh, ref


def _agree(wh, ref, sql: str, params: list | None = None) -> None:
    try:
        ref.execute(sql, params)
        ref_err = None
    except duckdb.Error as e:
        ref_err = e
    before = wh.table("vc").head().version
    try:
        wh.sql(sql, params)
        err = None
    except FlightsrvError as e:
        err = e
    if ref_err is not None:
        assert err is not None, f"DuckDB refused but flightsrv ran: {sql}: {ref_err}"
        assert wh.table("vc").head().version == before, "a failed INSERT committed"
    else:
        assert err is None, f"flightsrv failed where DuckDB ran: {sql}: {err}"
    order = ", ".join(COLUMNS)
    assert canon(wh.sql(f"SELECT {order} FROM vc")) == \
        canon(ref.sql(f"SELECT {order} FROM vc").to_arrow_table()), f"rows differ after: {sql}"


CASES = [
    # the tester's repro: typed per column, not across the rows
    ("INSERT INTO vc (id, f) VALUES (1, 1.5), (2, 'NaN')", None),
    ("INSERT INTO vc (id, f) VALUES (3, 0), (4, 'inf')", None),
    ("INSERT INTO vc (id, s) VALUES (5, 1), (6, 'abc')", None),
    ("INSERT INTO vc (id, dd) VALUES (7, 1), (8, 2.555)", None),
    ("INSERT INTO vc (id, dd) VALUES (9, 1.5), (10, 12345678.25)", None),
    ("INSERT INTO vc (id, ts) VALUES (11, '2024-01-01 00:00:00+00'), "
     "(12, DATE '2024-01-02')", None),
    ("INSERT INTO vc (id, s) VALUES (13, true), (14, 'x')", None),
    ("INSERT INTO vc (id, s) VALUES (20, 1.5), (21, 10)", None),  # '10', not '10.0'
    ("INSERT INTO vc (id, s) VALUES (22, 1.50), (23, 1e3)", None),
    ("INSERT INTO vc (id, b, d) VALUES (24, 'true', '2024-02-29'), (25, 0, DATE '2024-03-01')",
     None),
    ("INSERT INTO vc (id, l) VALUES (26, [1, 2.5]), (27, ['3']), (28, NULL)", None),
    ("INSERT INTO vc (id, f) VALUES (2.5, 1), (3.5, '2')", None),  # ids round to 3 and 4
    # no column list; DEFAULT and omitted columns take the column's default
    ("INSERT INTO vc VALUES (30, 1, 2, '2024-01-01', 3, 'f', '2024-01-01', [1], 8), "
     "(31, DEFAULT, 'x', NULL, 2.555, NULL, NULL, NULL, DEFAULT)", None),
    ("INSERT INTO vc (s, id) VALUES (1.5, 32), (10, 33)", None),
    ("INSERT INTO vc (id, k) VALUES (34, DEFAULT), (35, 1.5)", None),
    # parameters
    ("INSERT INTO vc (id, f) VALUES (?, ?), (?, 'NaN')", [40, 2.5, 41]),
    ("INSERT INTO vc (id, f, s) VALUES (?, ?, ?), (43, 1.5, 10)", [42, "inf", 7]),
    ("INSERT INTO vc (id, dd, s) VALUES (?, ?, ?)", [44, "1.255", 2.5]),
    # errors on both sides, nothing stored
    ("INSERT INTO vc (id, f) VALUES (50, 'abc')", None),
    ("INSERT INTO vc (id, dd) VALUES (51, 123456789012.5)", None),
    ("INSERT INTO vc (id, d) VALUES (52, '2024-02-30')", None),
    ("INSERT INTO vc (id, s) VALUES (NULL, 'x')", None),  # NOT NULL
    ("INSERT INTO vc (s) VALUES ('x')", None),  # NOT NULL, omitted
    ("INSERT INTO vc (id, f) VALUES (53, 1), (54, DEFAULT), (NULL, 2)", None),
    ("INSERT INTO vc (id) VALUES (55, 1)", None),  # more values than columns
    ("INSERT INTO vc (id, f) VALUES (56, 1), (57)", None),  # rows of different lengths
    ("INSERT INTO vc (id, b) VALUES (58, 'maybe')", None),
    # DuckDB's infinite dates and timestamps are stored and compared as they are
    ("INSERT INTO vc (id, d, ts) VALUES (59, 'inf', '-infinity'), (60, '-inf', 'inf')", None),
    # INSERT ... SELECT is typed as a query first, on both sides ('10.0')
    ("INSERT INTO vc (id, s) SELECT * FROM (VALUES (60, 1.5), (61, 10))", None),
]


@pytest.mark.parametrize("sql,params", CASES, ids=range(len(CASES)))
def test_insert_values_agrees_with_duckdb(tmp_path, sql, params):
    wh, ref = _setup(tmp_path / "wh")
    _agree(wh, ref, sql, params)


def test_insert_values_sequence_agrees_with_duckdb(tmp_path):
    wh, ref = _setup(tmp_path / "wh")
    for sql, params in CASES:
        _agree(wh, ref, sql, params)
    assert wh.sql("SELECT s FROM vc WHERE id IN (20, 21) ORDER BY id").column(
        "s").to_pylist() == ["1.5", "10"]


LITERALS = st.sampled_from([
    "NULL", "0", "1", "-1", "2.5", "1.555", "10", "1e3", "-0.0", "'NaN'", "'inf'", "'abc'",
    "''", "'10'", "'2.5'", "true", "false", "'true'", "'2024-01-01'", "DATE '2024-01-01'",
    "'2024-01-01 05:00:00+02'", "[1, 2]", "[1.5]", "99999999999", "DEFAULT",
])


@st.composite
def inserts(draw):
    cols = draw(st.lists(st.sampled_from(COLUMNS[1:]), max_size=4, unique=True))
    cols.insert(draw(st.integers(0, len(cols))), "id")
    n = draw(st.integers(1, 4))
    rows = []
    for k in range(n):
        vals = [str(k) if c == "id" else draw(LITERALS) for c in cols]
        rows.append("(" + ", ".join(vals) + ")")
    listed = draw(st.booleans()) or len(cols) != len(COLUMNS)
    target = f"vc ({', '.join(cols)})" if listed else "vc"
    if not listed:
        rows = ["(" + ", ".join(str(k) if c == "id" else draw(LITERALS) for c in COLUMNS) + ")"
                for k in range(n)]
    return f"INSERT INTO {target} VALUES {', '.join(rows)}"


@settings(max_examples=40, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sql=inserts())
def test_random_insert_values_agree_with_duckdb(tmp_path_factory, sql):
    note(sql)
    wh, ref = _setup(tmp_path_factory.mktemp("wh"))
    _agree(wh, ref, sql)

"""Differential tests (issue 10): random tables and random statements run on flightsrv and
on a plain DuckDB table holding the same rows; counts, selected rows and surviving rows must
be identical, errors must be errors on both sides (and commit nothing).

The tables have NULLs everywhere, floats with NaN, ±0.0 and ±inf, strings, dates and
timestamps with a time zone at DuckDB's limits (BC, years past 9999, ±infinity: none of them a
Python ``datetime``), UBIGINTs above 2^63, decimals, lists and structs, spread over several
files and row groups, with deletion vectors already in place. The statements are SELECT,
DELETE (with subqueries over a second table, USING and EXISTS shapes), UPDATE (also
``UPDATE ... FROM``) and MERGE, over a source that may match a target row several times (the
documented error: DuckDB 2.0.1 applies one match). Results are compared by column names and
types as well as rows. flightsrv runs them through the
Python API (the engine) and, for a smaller sample, through Flight SQL with ADBC; on local and
S3 warehouses. ``HYPOTHESIS_PROFILE``-independent: example counts are set here; the ``slow``
variant runs many more.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import warnings

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.errors import FlightsrvError

UTC = dt.timezone.utc
SCHEMA = pa.schema([
    ("id", pa.int64()), ("i", pa.int32()), ("f", pa.float64()), ("s", pa.string()),
    ("d", pa.date32()), ("ts", pa.timestamp("us", tz="UTC")), ("dec", pa.decimal128(10, 2)),
    ("l", pa.list_(pa.int32())), ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ("u", pa.uint64()),
])
SRC_SCHEMA = pa.schema([("id", pa.int64()), ("i", pa.int32()), ("s", pa.string())])

FLOATS = [None, -math.inf, -1.5, -0.0, 0.0, 1.5, 3.0, math.nan, math.inf]
STRINGS = [None, "", "a", "ab", "AB", "b", "a_b", "é", "a%"]
# dates as days and timestamps as microseconds since the epoch: DuckDB's limits do not fit a
# Python datetime (BC, years past 9999, ±infinity)
INF_DAYS, INF_MICROS = 2**31 - 1, 2**63 - 1
DATES = [None, 20757, 20758, 20759,  # 2026-10-31 .. 2026-11-02
         -735160, 3789391, INF_DAYS, -INF_DAYS]  # 0044-03-15 (BC), 12345-01-01, ±infinity
_DAY_US = 20758 * 86_400_000_000  # 2026-11-01 00:00 UTC
TIMES = [None] + [_DAY_US + (h * 3600 + m * 60) * 1_000_000 for h in (0, 4, 5, 6, 23)
                  for m in (0, 30)] + [-63517788000000000, 327403382400000000, INF_MICROS,
                                       -INF_MICROS]
UBIGS = [None, 0, 1, 2**63 - 1, 2**63, 2**64 - 1]
DECS = [None, decimal.Decimal("-1.50"), decimal.Decimal("0.00"), decimal.Decimal("2.25"),
        decimal.Decimal("10.00")]

# -- data ---------------------------------------------------------------------------------


@st.composite
def rows(draw, n_min=1, n_max=40):
    n = draw(st.integers(n_min, n_max))
    out = []
    for k in range(n):
        out.append({
            "id": k,
            "i": draw(st.one_of(st.none(), st.integers(-5, 5))),
            "f": draw(st.sampled_from(FLOATS)),
            "s": draw(st.sampled_from(STRINGS)),
            "d": draw(st.sampled_from(DATES)),
            "ts": draw(st.sampled_from(TIMES)),
            "dec": draw(st.sampled_from(DECS)),
            "l": draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(0, 4)),
                                                    max_size=3))),
            "st": draw(st.one_of(st.none(), st.builds(
                lambda a, b: {"a": a, "b": b}, st.one_of(st.none(), st.integers(0, 4)),
                st.sampled_from(STRINGS)))),
            "u": draw(st.sampled_from(UBIGS)),
        })
    return out


# -- expressions ----------------------------------------------------------------------------

INT_LIT = st.sampled_from(["NULL", "-1", "0", "1", "2", "3", "5", "2.5"])
FLOAT_LIT = st.sampled_from(["NULL", "0.0", "-0.0", "1.5", "3.0", "2.0", "'NaN'::DOUBLE",
                             "'inf'::DOUBLE", "'-inf'::DOUBLE"])
STR_LIT = st.sampled_from(["NULL", "''", "'a'", "'ab'", "'AB'", "'b'", "'é'", "'a_b'"])
DATE_LIT = st.sampled_from(["DATE '2026-11-01'", "'2026-10-31'", "NULL", "'2026-11-02'",
                            "'infinity'", "'-infinity'", "DATE '0044-03-15 (BC)'",
                            "DATE '12345-01-01'"])
TS_LIT = st.sampled_from(["'2026-11-01 05:00:00'", "TIMESTAMPTZ '2026-11-01 04:30:00+00'",
                          "'2026-11-01 05:00:00-04'", "NULL", "DATE '2026-11-01'",
                          "'infinity'", "'-infinity'", "TIMESTAMPTZ '12345-01-01 00:00:00+00'"])
U_LIT = st.sampled_from(["NULL", "0", "1", "9223372036854775807", "9223372036854775808",
                         "18446744073709551615"])
DEC_LIT = st.sampled_from(["0", "2.25", "-1.5", "10", "NULL", "2.250"])
OPS = st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM",
                       "IS NOT DISTINCT FROM"])


@st.composite
def comparison(draw):
    col, lit = draw(st.sampled_from([("i", INT_LIT), ("f", FLOAT_LIT), ("s", STR_LIT),
                                     ("d", DATE_LIT), ("ts", TS_LIT), ("dec", DEC_LIT),
                                     ("id", INT_LIT), ("u", U_LIT)]))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return f"{col} {draw(OPS)} {draw(lit)}"
    if kind == 1:
        items = draw(st.lists(lit, min_size=1, max_size=4))
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{col} {neg}IN ({', '.join(items)})"
    if kind == 2:
        return f"{col} BETWEEN {draw(lit)} AND {draw(lit)}"
    if kind == 3:
        return f"{col} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 4:
        return f"coalesce({col}, {draw(lit)}) {draw(OPS)} {draw(lit)}"
    return draw(st.sampled_from([
        "id / 2 = 10", "id // 3 = 2", "id % 4 = 1", "length(s) = 2", "upper(s) = 'AB'",
        "s LIKE 'a%'", "s LIKE 'a\\_%' ESCAPE '\\'", "s ILIKE 'A%'",
        "CAST(ts AS DATE) = DATE '2026-11-01'", "ts < '2026-11-01 05:00:00'",
        "list_contains(l, 3)", "st.a > 2", "len(l) = 2", "f = 0.0", "f IN (0.0)", "f > 2.0",
        "f != 3.0", "isnan(f)", "f < 'inf'::DOUBLE", "dec * 2 > 4", "i + 1 > 2",
        "extract(hour FROM ts) = 5", "d = CAST(ts AS DATE)", "st.b = s", "l[1] = 0",
        "i IN (SELECT i FROM src)", "id IN (SELECT id FROM src WHERE i > 0)",
        "EXISTS (SELECT 1 FROM src WHERE src.id = t.id)",
        "i > (SELECT min(i) FROM src)", "s NOT IN (SELECT s FROM src)",
        "id IN (SELECT id FROM t WHERE f > 0)"]))


def condition(depth=2):
    base = comparison()
    if depth == 0:
        return base
    sub = condition(depth - 1)
    return st.one_of(
        base, base,
        st.builds(lambda a, b: f"({a}) AND ({b})", sub, sub),
        st.builds(lambda a, b: f"({a}) OR ({b})", sub, sub),
        st.builds(lambda a: f"NOT ({a})", sub),
    )


SETS = st.lists(st.sampled_from([
    "i = i + 1", "i = NULL", "i = CASE WHEN i > 0 THEN NULL ELSE i END", "f = f * 2",
    "f = -f", "s = coalesce(s, 'z') || 'x'", "s = upper(s)", "s = NULL", "d = d + 1",
    "ts = ts + INTERVAL 1 HOUR", "dec = dec * 3", "l = list_append(l, 9)",
    "st = {'a': 7, 'b': 'q'}", "i = '4'", "i = 2.5", "f = i", "u = u // 2",
    "d = coalesce(d, DATE '0044-03-15 (BC)')", "ts = NULL",
    "i = (SELECT max(i) FROM src)", "s = (SELECT min(s) FROM t)",
]), min_size=1, max_size=3, unique_by=lambda x: x.split(" = ")[0])


@st.composite
def merge_statement(draw):
    clauses = []
    if draw(st.booleans()):
        clauses.append(f"WHEN MATCHED AND ({draw(comparison())}) THEN DELETE")
    if draw(st.booleans()):
        clauses.append("WHEN MATCHED THEN UPDATE SET i = src.i, s = src.s")
    if draw(st.booleans()):
        clauses.append("WHEN NOT MATCHED THEN INSERT (id, i, s) VALUES (src.id, src.i, src.s)")
    if draw(st.booleans()):
        clauses.append("WHEN NOT MATCHED BY SOURCE AND (t.i > 2) THEN DELETE")
    if not clauses:
        clauses.append("WHEN MATCHED THEN DELETE")
    on = draw(st.sampled_from(["t.id = src.id", "t.id = src.id AND t.i IS NOT DISTINCT FROM src.i",
                               "t.id = src.id + 1"]))
    return f"MERGE INTO t USING src ON {on} " + " ".join(clauses)


UPDATE_FROM = "UPDATE t SET i = src.i, s = src.s FROM src WHERE "


@st.composite
def statement(draw):
    kind = draw(st.sampled_from(["select", "count", "delete", "delete", "update", "merge",
                                 "delete_using", "update_from", "names"]))
    cond = draw(condition())
    if kind == "select":
        return f"SELECT * FROM t WHERE {cond}"
    if kind == "count":
        return f"SELECT count(*) AS n FROM t WHERE {cond}"
    if kind == "delete":
        return f"DELETE FROM t WHERE {cond}"
    if kind == "delete_using":
        return "DELETE FROM t USING src WHERE t.id = src.id AND (" + \
            draw(st.sampled_from(["src.i > 0", "t.s = src.s", "TRUE", "src.i IS NULL"])) + ")"
    if kind == "update":
        return f"UPDATE t SET {', '.join(draw(SETS))} WHERE {cond}"
    if kind == "update_from":
        return (UPDATE_FROM + "t.id = src.id AND ("
                + draw(st.sampled_from(["TRUE", "src.i > 0", "t.s IS NOT DISTINCT FROM src.s"]))
                + ")")
    if kind == "names":  # result names: subqueries print their table references
        return draw(st.sampled_from([
            "SELECT (SELECT count(*) FROM src), EXISTS (SELECT 1 FROM src WHERE src.id = 1)",
            f"SELECT id IN (SELECT id FROM src) AS x, (SELECT max(d) FROM t) FROM t WHERE {cond}",
            "SELECT (SELECT min(u) FROM t AS x WHERE x.u > 0), count(*) FROM t"]))
    return draw(merge_statement())


# -- running --------------------------------------------------------------------------------


def _raw_temporals(table: pa.Table) -> pa.Table:
    """Dates and timestamps as their integers (no Python ``datetime`` holds DuckDB's
    limits)."""
    cols = []
    for c in table.columns:
        if pa.types.is_date32(c.type):
            c = c.cast(pa.int32())
        elif pa.types.is_timestamp(c.type) or pa.types.is_date64(c.type):
            c = c.cast(pa.int64())
        cols.append(c)
    return pa.Table.from_arrays(cols, names=[str(i) for i in range(len(cols))])


def canon(table: pa.Table) -> list:
    """Rows as a sorted list of reprs (NaN, -0.0 and nested values compare exactly)."""
    table = _raw_temporals(table)
    def key(v):
        if isinstance(v, float):
            return "nan" if math.isnan(v) else repr(v)
        if isinstance(v, dict):
            return "{" + ",".join(f"{k}:{key(x)}" for k, x in sorted(v.items())) + "}"
        if isinstance(v, list):
            return "[" + ",".join(key(x) for x in v) + "]"
        return repr(v)

    return sorted(tuple(key(v) for v in r.values()) for r in table.to_pylist())


def reference(data: list[dict], src: list[dict]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()  # the process's time zone, as the engine's DuckDB
    con.register("_t", pa.Table.from_pylist(data, schema=SCHEMA))
    con.execute("CREATE TABLE t AS SELECT * FROM _t")
    con.register("_src", pa.Table.from_pylist(src, schema=SRC_SCHEMA))
    con.execute("CREATE TABLE src AS SELECT * FROM _src")
    return con


def _layout_key(column: str):
    """Sort rows by ``column`` before splitting them into files, so that files and row groups
    hold narrow ranges that statistics can prune (NULLs and NaN first, as a tuple sorts)."""
    def key(r):
        v = r[column]
        if v is None:
            return (0, 0, "")
        if isinstance(v, float) and math.isnan(v):
            return (1, 0, "")
        return (2, v if not isinstance(v, (dict, list)) else 0, "")
    return key


def setup_flightsrv(uri: str, data: list[dict], src: list[dict], deleted: list[int],
                    layout: tuple[str, int] = ("id", 3)):
    wh = Warehouse.open(uri)
    t = wh.create_table("t", SCHEMA, {"row_group_bytes": 512})
    column, files = layout
    ordered = sorted(data, key=_layout_key(column))
    size = max(1, math.ceil(len(ordered) / files))
    for lo in range(0, len(ordered), size):
        t.append(pa.Table.from_pylist(ordered[lo:lo + size], schema=SCHEMA))
    if deleted:
        t.delete(f"id IN ({', '.join(map(str, deleted))})")
    s = wh.create_table("src", SRC_SCHEMA)
    if src:
        s.append(pa.Table.from_pylist(src, schema=SRC_SCHEMA))
    return wh


def matched_twice(ref, sql: str) -> bool:
    """Whether the UPDATE ... FROM src / MERGE ... USING src statement ``sql`` joins some
    target row to several source rows (asked of DuckDB, before the statement runs), and acts
    on matches (MERGE: a WHEN MATCHED clause)."""
    if sql.startswith(UPDATE_FROM):
        join = f"FROM t, src WHERE {sql[len(UPDATE_FROM):]}"
    elif sql.startswith("MERGE INTO t USING src ON ") and "WHEN MATCHED" in sql:
        on = sql.split("USING src ON ", 1)[1].split(" WHEN ", 1)[0]
        join = f"FROM t JOIN src ON {on}"
    else:
        return False
    return bool(ref.execute(f"SELECT count(*) FROM (SELECT t.rowid {join} GROUP BY t.rowid "
                            "HAVING count(*) > 1)").fetchall()[0][0])


def compare(wh, ref, sql: str, run) -> None:
    note(sql)
    twice = matched_twice(ref, sql)
    ref.execute("BEGIN")
    try:
        expected = ref.sql(sql).to_arrow_table() if sql.startswith("SELECT") else \
            ref.execute(sql).fetchall()
        ref_err = None
    except duckdb.Error as e:
        expected, ref_err = None, e
    # a target row matched twice: the documented error (DuckDB 2.0.1 applies one match)
    ref.execute("ROLLBACK" if ref_err is not None or twice else "COMMIT")
    if twice and ref_err is None:
        ref_err = "a target row matched more than once"
    before = wh.table("t").head().version
    try:
        got = run(sql)
        err = None
    except (FlightsrvError, Exception) as e:  # noqa: BLE001 - compared below
        got, err = None, e
    if ref_err is not None:
        assert err is not None, f"DuckDB refused but flightsrv ran: {sql}: {ref_err}"
        assert wh.table("t").head().version == before, "a failed statement committed"
        return
    assert err is None, f"flightsrv failed where DuckDB ran: {sql}: {err}"
    if sql.startswith("SELECT"):
        assert got.schema.names == expected.schema.names, f"column names differ: {sql}"
        assert got.schema.types == expected.schema.types, f"column types differ: {sql}"
        assert canon(got) == canon(expected), sql
    else:
        assert int(got) == int(expected[0][0]), f"count differs: {sql}"
    assert canon(wh.sql("SELECT * FROM t")) == canon(ref.sql("SELECT * FROM t").to_arrow_table()), \
        f"table contents differ after: {sql}"


CASES = st.tuples(rows(), rows(0, 8), st.lists(st.integers(0, 39), max_size=5, unique=True),
                  st.lists(statement(), min_size=1, max_size=3),
                  st.tuples(st.sampled_from(["id", "i", "f", "s", "d", "ts", "dec", "u"]),
                            st.integers(1, 6)))


def _src_rows(src):
    """Source rows whose ids meet the target's; every third one repeats the id before it
    (a target row that several source rows match)."""
    out = []
    for k, r in enumerate(src):
        rid = r["id"] * 2 if k % 2 else r["id"] + 1000
        if k % 3 == 2:
            rid = out[-1]["id"]
        out.append({"id": rid, "i": r["i"], "s": r["s"]})
    return out


def _run_case(uri, case, via):
    data, src, deleted, statements, layout = case
    src = _src_rows(src)
    deleted = [d for d in deleted if d < len(data)]
    wh = setup_flightsrv(uri, data, src, deleted, layout)
    ref = reference([r for r in data if r["id"] not in deleted], src)
    run = via(wh)
    for sql in statements:
        compare(wh, ref, sql, run)


def _python_api(wh):
    return wh.sql


def _flight_sql(wh):
    from flightsrv.engine.duck import DuckEngine
    from flightsrv.server.app import start_in_thread
    import adbc_driver_flightsql.dbapi as flightsql

    engine = DuckEngine(wh)
    server, port = start_in_thread(engine)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn = flightsql.connect(f"grpc://127.0.0.1:{port}", autocommit=True)

    def run(sql):
        cur = conn.cursor()
        try:
            cur.execute(sql)
            if sql.startswith("SELECT"):
                return cur.fetch_arrow_table()
            cur.fetchall() if cur.description else None
            return cur.rowcount
        finally:
            cur.close()

    run.close = lambda: (conn.close(), server.shutdown(), engine.close())
    return run


SETTINGS = dict(deadline=None, derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@settings(max_examples=15, **SETTINGS)
@given(case=CASES)
def test_python_api_agrees_with_duckdb_local(tmp_path_factory, case):
    _run_case(str(tmp_path_factory.mktemp("wh")), case, _python_api)


@pytest.mark.s3
@settings(max_examples=5, **SETTINGS)
@given(case=CASES)
def test_python_api_agrees_with_duckdb_s3(s3_uri_factory, case):
    _run_case(s3_uri_factory(), case, _python_api)


@settings(max_examples=8, **SETTINGS)
@given(case=CASES)
def test_flight_sql_agrees_with_duckdb(tmp_path_factory, case):
    data, src, deleted, statements, layout = case
    uri = str(tmp_path_factory.mktemp("wh"))
    src_rows = _src_rows(src)
    deleted = [d for d in deleted if d < len(data)]
    wh = setup_flightsrv(uri, data, src_rows, deleted, layout)
    ref = reference([r for r in data if r["id"] not in deleted], src_rows)
    run = _flight_sql(wh)
    try:
        for sql in statements:
            compare(wh, ref, sql, run)
    finally:
        run.close()


@pytest.mark.slow
def test_python_api_agrees_with_duckdb_many(tmp_path_factory):
    """Thousands of statements (1,000 cases of up to 3); the seed is printed first and
    ``FLIGHTSRV_DIFF_SEED=<seed>`` replays the run."""
    import os
    import random

    from hypothesis import seed as with_seed

    chosen = int(os.environ.get("FLIGHTSRV_DIFF_SEED") or random.SystemRandom().getrandbits(32))
    print(f"differential seed: {chosen} (replay: FLIGHTSRV_DIFF_SEED={chosen})")

    @with_seed(chosen)
    @settings(max_examples=int(os.environ.get("FLIGHTSRV_DIFF_EXAMPLES", "1000")), **SETTINGS)
    @given(case=CASES)
    def many(case):
        _run_case(str(tmp_path_factory.mktemp("wh")), case, _python_api)

    try:
        many()
    except BaseException:
        print(f"differential seed: {chosen} (replay: FLIGHTSRV_DIFF_SEED={chosen})")
        raise


# -- floats: NaN is absent from Parquet bounds, -0.0 equals 0.0, ±inf are values --------------

FLOAT_ONLY = pa.schema([("id", pa.int64()), ("f", pa.float64())])


@settings(max_examples=25, **SETTINGS)
@given(values=st.lists(st.sampled_from(FLOATS), min_size=1, max_size=30),
       files=st.integers(1, 6),
       preds=st.lists(st.builds(lambda op, lit: f"f {op} {lit}",
                                st.sampled_from(["=", "<>", "<", "<=", ">", ">=", "IN"]),
                                FLOAT_LIT), min_size=1, max_size=4))
def test_float_filters_agree_with_duckdb(tmp_path_factory, values, files, preds):
    """Files sorted by the float column hold narrow ranges (a NaN next to small numbers),
    which is where a statistics shortcut would lose NaN rows."""
    data = [{"id": k, "f": v} for k, v in enumerate(values)]
    ordered = sorted(data, key=_layout_key("f"))
    wh = Warehouse.open(str(tmp_path_factory.mktemp("wh")))
    t = wh.create_table("t", FLOAT_ONLY, {"row_group_bytes": 128})
    size = max(1, math.ceil(len(ordered) / files))
    for lo in range(0, len(ordered), size):
        t.append(pa.Table.from_pylist(ordered[lo:lo + size], schema=FLOAT_ONLY))
    ref = duckdb.connect()
    ref.register("_t", pa.Table.from_pylist(data, schema=FLOAT_ONLY))
    ref.execute("CREATE TABLE t AS SELECT * FROM _t")
    for p in preds:
        p = p.replace("IN ", "IN (") + ")" if " IN " in p else p
        sql = f"SELECT id FROM t WHERE {p}"
        note(sql)
        want = sorted(r[0] for r in ref.execute(sql).fetchall())
        assert sorted(wh.sql(sql).column("id").to_pylist()) == want, sql
        assert t.count_rows(p) == len(want), p
        assert sorted(t.to_table(["id"], filter=p).column("id").to_pylist()) == want, p

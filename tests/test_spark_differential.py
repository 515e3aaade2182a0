"""Spark against plain DuckDB (issues 10 and 18).

- Reads: random tables (ints, floats with NaN/±0.0/±inf, strings, dates, decimals,
  timestamps with time zone, NULLs everywhere; several files of several row groups; existing
  deletion vectors) and random
  filters that Spark pushes. ``spark.read...where(expr)`` with pushdown on and off must
  return exactly the rows plain DuckDB returns for the same WHERE over the same live rows
  (the Python API and Flight SQL have their own differential test). Default run: a few
  examples; ``-m slow`` runs many more.
- ``delete_matching``: the broadcast path and the shuffle path delete exactly the rows a
  plain DuckDB semi join selects, for every key type pair (out-of-range keys, NaN, -0.0,
  int against double, date against timestamp, composite keys); a pair DuckDB cannot compare
  without parsing is refused before any task runs.

Runs on the one shared local[2] session (the ``spark`` fixture of conftest.py).
"""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import math

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

import flightsrv.spark as fs
from flightsrv.errors import SchemaMismatch
from flightsrv.warehouse import Warehouse

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("i", pa.int32()), ("f", pa.float64()),
                    ("s", pa.string()), ("d", pa.date32()), ("dec", pa.decimal128(10, 2)),
                    ("ts", pa.timestamp("us", tz="UTC"))])
INF, NAN = float("inf"), float("nan")
I_VALUES = [-2147483648, -3, -1, 0, 1, 2, 3, 7, 2147483647]
F_VALUES = [NAN, INF, -INF, 0.0, -0.0, 1.5, -2.5, 3.0, 1e300]
S_VALUES = ["", "a", "ab", "abc", "b", "ba", "é", "zz"]
D_VALUES = [dt.date(1970, 1, 1), dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 2, 29),
            dt.date(9999, 12, 31)]
DEC_VALUES = [decimal.Decimal(x) for x in ("-1.00", "0.00", "1.50", "2.25", "99999999.99")]
TS_VALUES = [dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
             dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
             dt.datetime(2024, 6, 1, 12, tzinfo=dt.UTC),
             dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)]
GROUP_ROWS = 1024  # the writer's smallest row group

row = st.tuples(*(st.one_of(st.none(), st.sampled_from(v))
                  for v in (I_VALUES, F_VALUES, S_VALUES, D_VALUES, DEC_VALUES, TS_VALUES)))

# -- filters: SQL text that Spark and DuckDB read the same way (and Spark pushes) ---------

F_LITERALS = ["1.5", "0.0", "-0.0", "3.0", "CAST('NaN' AS DOUBLE)", "CAST('Infinity' AS DOUBLE)",
              "CAST('-Infinity' AS DOUBLE)"]
OPS = ["=", "<>", "<", "<=", ">", ">="]


def _lits(values, fmt):
    return st.sampled_from([fmt(v) for v in values])


atoms = st.one_of(
    st.builds(lambda op, v: f"i {op} {v}", st.sampled_from(OPS), _lits(I_VALUES + [5], str)),
    st.builds(lambda op, v: f"f {op} {v}", st.sampled_from(OPS), st.sampled_from(F_LITERALS)),
    st.builds(lambda op, v: f"s {op} {v}", st.sampled_from(OPS),
              _lits(S_VALUES + ["aa"], lambda s: f"'{s}'")),
    st.builds(lambda op, v: f"d {op} {v}", st.sampled_from(OPS),
              _lits(D_VALUES, lambda d: f"DATE '{d.isoformat()}'")),
    st.builds(lambda op, v: f"dec {op} {v}", st.sampled_from(OPS),
              _lits(DEC_VALUES + [decimal.Decimal("1.5")], str)),
    st.builds(lambda op, v: f"ts {op} {v}", st.sampled_from(OPS),  # session zone: UTC
              _lits(TS_VALUES, lambda t: f"TIMESTAMP '{t.replace(tzinfo=None).isoformat(' ')}'")),
    st.builds(lambda c, vs: f"{c} IN ({', '.join(vs)})", st.just("i"),
              st.lists(_lits(I_VALUES + ["NULL"], str), min_size=1, max_size=3)),
    st.builds(lambda vs: f"f IN ({', '.join(vs)})",
              st.lists(st.sampled_from(F_LITERALS[:4]), min_size=1, max_size=3)),
    st.builds(lambda vs: f"s IN ({', '.join(vs)})",
              st.lists(_lits(S_VALUES, lambda s: f"'{s}'"), min_size=1, max_size=3)),
    st.builds(lambda c, neg: f"{c} IS {'NOT ' if neg else ''}NULL",
              st.sampled_from(["i", "f", "s", "d", "dec", "ts"]), st.booleans()),
    st.builds(lambda p: f"s LIKE '{p}'", st.sampled_from(["a%", "%b", "%b%", "ab%", "%"])),
)
filters = st.recursive(
    atoms,
    lambda inner: st.one_of(st.builds(lambda a: f"NOT ({a})", inner),
                            st.builds(lambda a, b: f"({a}) AND ({b})", inner, inner),
                            st.builds(lambda a, b: f"({a}) OR ({b})", inner, inner)),
    max_leaves=3)


def _canon(v):
    if isinstance(v, float):
        return ("nan",) if math.isnan(v) else ("f", v, math.copysign(1.0, v))
    return v


def _rows(t: pa.Table) -> list:
    cols = [t.column(n).to_pylist() for n in SCHEMA.names]
    return sorted((tuple(_canon(v) for v in r) for r in zip(*cols)),
                  key=lambda r: r[0])


@st.composite
def layouts(draw):
    """Files of row groups (each group one tile of a few distinct rows, so the groups'
    statistics differ), and the ids to delete after each file."""
    files = []
    for _ in range(draw(st.integers(1, 3))):
        groups = draw(st.lists(st.lists(row, min_size=1, max_size=6), min_size=1, max_size=2))
        files.append(groups)
    deletes = draw(st.lists(st.lists(st.integers(0, 10_000), max_size=8), min_size=len(files),
                            max_size=len(files)))
    return files, deletes


_counter = itertools.count()


def _build(wh: Warehouse, layout) -> tuple[str, pa.Table]:
    """Create the table; return its name and its live rows (the model)."""
    files, deletes = layout
    name = f"diff{next(_counter)}"
    table = wh.create_table(name, SCHEMA)
    live: dict[int, tuple] = {}
    next_id = 0
    for groups, dels in zip(files, deletes):
        rows = []
        for tile in groups:
            for k in range(GROUP_ROWS):
                rows.append((next_id, *tile[k % len(tile)]))
                next_id += 1
        data = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)
        table.append(data)
        live.update((r[0], r) for r in rows)
        gone = sorted({d % next_id for d in dels})
        if gone:
            table.delete(f"id IN ({', '.join(map(str, gone))})")
            for g in gone:
                live.pop(g, None)
    model = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in live.values()],
                                 schema=SCHEMA)
    return name, model


def _duckdb(model: pa.Table, where: str) -> list:
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone='UTC'")  # as the Spark session's
        con.register("t", model)
        return _rows(con.sql(f"SELECT * FROM t WHERE {where}").to_arrow_table())
    finally:
        con.close()


def _check_reads(spark, wh: Warehouse, uri_root: str, layout, wheres) -> None:
    name, model = _build(wh, layout)
    uri = f"{uri_root}/{name}"
    for where in wheres:
        want = _duckdb(model, where)
        for push in ("false", "true"):
            df = spark.read.format("flightsrv").option("pushFilters", push) \
                .option("rowGroupsPerPartition", "1").load(uri)
            got = _rows(df.where(where).toArrow())
            assert got == want, (where, push, len(got), len(want))


def _differential(spark, tmp_path_factory, max_examples):
    root = str(tmp_path_factory.mktemp("diff") / "wh")
    wh = Warehouse.open(root)

    @settings(max_examples=max_examples, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(layout=layouts(), wheres=st.lists(filters, min_size=1, max_size=4))
    def run(layout, wheres):
        _check_reads(spark, wh, root, layout, wheres)

    run()


def test_spark_reads_agree_with_duckdb(spark, tmp_path_factory):
    _differential(spark, tmp_path_factory, max_examples=3)


@pytest.mark.slow
def test_spark_reads_agree_with_duckdb_many(spark, tmp_path_factory):
    _differential(spark, tmp_path_factory, max_examples=60)


def test_known_pushdown_disagreements_of_issue_10(spark, local_uri):
    """The filters issue 10 found wrong with pushFilters, on the shapes it described."""
    wh = Warehouse.open(local_uri)
    layout = ([[[(1, NAN, "a", None, None, None), (None, 3.0, None, None, None, None)]],
               [[(2, -0.0, "b", None, None, None), (3, 1.0, "c", None, None, None)]],
               [[(None, 3.0, "x", None, None, None)]]], [[], [], []])
    _check_reads(spark, wh, local_uri, layout,
                 ["NOT (i IN (1, 2))", "f > 2.0", "f IN (0.0, 1.0)", "f <> 3.0", "f = 3.0"])


# -- delete_matching: both paths decide like DuckDB -----------------------------------------

KEY_TABLE = pa.schema([("id", pa.int64()), ("i32", pa.int32()), ("i64", pa.int64()),
                       ("f", pa.float64()), ("dec", pa.decimal128(10, 2)), ("s", pa.string()),
                       ("d", pa.date32()), ("ts", pa.timestamp("us", tz="UTC"))])
_T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
KEY_ROWS = [
    (0, 0, 2**53 + 1, NAN, decimal.Decimal("1.50"), "a", dt.date(2024, 1, 1), _T0),
    (1, 1, 2**53, 0.0, decimal.Decimal("99999999.99"), "é", dt.date(2024, 1, 2),
     _T0 + dt.timedelta(microseconds=1)),
    (2, -1, 2, -0.0, decimal.Decimal("-1.00"), "", dt.date(1970, 1, 1), None),
    (3, 2147483647, 3, INF, None, None, None, _T0),
    (4, None, None, 1.0, decimal.Decimal("0.00"), "b", dt.date(2024, 1, 1),
     _T0 + dt.timedelta(hours=1)),
]

#: (on, keys DataFrame SQL): every key type pair the paths must agree on
KEY_CASES = [
    (["i32"], ("SELECT CAST(k AS BIGINT) AS i32 FROM VALUES (4294967296L), (-4294967297L), "
              "(2147483648L), (-1L), (NULL) AS v(k)")),  # out of range keys match nothing
    (["i64"], ("SELECT CAST(k AS DOUBLE) AS i64 FROM VALUES (2.0D), (2.5D), (CAST('NaN' AS "
              "DOUBLE)), (9007199254740992D) AS v(k)")),  # DuckDB compares as DOUBLE
    (["f"], ("SELECT CAST(k AS DOUBLE) AS f FROM VALUES (CAST('NaN' AS DOUBLE)), (-0.0D), "
            "(CAST('-Infinity' AS DOUBLE)) AS v(k)")),
    (["dec"], ("SELECT CAST(k AS DECIMAL(12,4)) AS dec FROM VALUES (1.5000BD), (1.2345BD), "
              "(99999999.99BD) AS v(k)")),
    (["d"], ("SELECT CAST(k AS TIMESTAMP_NTZ) AS d FROM VALUES "
            "(TIMESTAMP_NTZ'2024-01-01 00:00:00'), (TIMESTAMP_NTZ'1970-01-01 00:00:01') "
            "AS v(k)")),
    (["s", "ts"], ("SELECT s, CAST(t AS TIMESTAMP) AS ts FROM VALUES "
                  "('a', TIMESTAMP'2024-01-01 00:00:00'), ('b', TIMESTAMP'2024-01-01 01:00:00'),"
                  " ('é', TIMESTAMP'2024-01-01 00:00:00'), (NULL, TIMESTAMP'2024-01-01 "
                  "00:00:00') AS v(s, t)")),
]


def _key_table(wh: Warehouse, name: str):
    t = wh.create_table(name, KEY_TABLE)
    t.append(pa.Table.from_pylist([dict(zip(KEY_TABLE.names, r)) for r in KEY_ROWS],
                                  schema=KEY_TABLE))
    return t


def _duckdb_matches(live: pa.Table, keys: pa.Table, on: list[str]) -> set[int]:
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone='UTC'")
        con.register("t", live)
        con.register("k", keys)
        cond = " AND ".join(f't."{c}" = k."{c}"' for c in on)
        return {r[0] for r in con.execute(f"SELECT t.id FROM t SEMI JOIN k ON {cond}")
                .fetchall()}
    finally:
        con.close()


def test_delete_matching_paths_agree_with_duckdb_for_every_key_type(spark, local_uri):
    wh = Warehouse.open(local_uri)
    broadcast, shuffle = _key_table(wh, "kb"), _key_table(wh, "ks")
    live = broadcast.to_table()
    for on, sql in KEY_CASES:
        keys = spark.sql(sql)
        want = _duckdb_matches(live, keys.toArrow(), on)
        n_b = fs.delete_matching(spark, f"{local_uri}/kb", keys, on=on)
        n_s = fs.delete_matching(spark, f"{local_uri}/ks", keys, on=on, broadcast_limit=0)
        left_b = set(broadcast.to_table(["id"]).column("id").to_pylist())
        left_s = set(shuffle.to_table(["id"]).column("id").to_pylist())
        before = set(live.column("id").to_pylist())
        assert before - left_b == want and before - left_s == want, (on, want)
        assert n_b == n_s == len(want)
        live = broadcast.to_table()


def test_delete_matching_refuses_keys_duckdb_would_parse(spark, local_uri):
    wh = Warehouse.open(local_uri)
    table = _key_table(wh, "kr")
    for sql, col in [("SELECT '1' AS i32", "i32"), ("SELECT 20240101 AS d", "d"),
                     ("SELECT X'61' AS s", "s")]:
        for limit in (5_000_000, 0):  # the same refusal on both paths, before any task
            with pytest.raises(SchemaMismatch) as e:
                fs.delete_matching(spark, f"{local_uri}/kr", spark.sql(sql), on=[col],
                                   broadcast_limit=limit)
            assert f"column={col}" in str(e.value) and "key_type=" in str(e.value)
    assert table.head().version == 1

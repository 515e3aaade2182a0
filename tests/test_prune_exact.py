"""Statistics pruning of date, timestamp, decimal, string and float columns without a statistics
query (``Pruner._run_integers``): the constants are cast to the column's type by DuckDB
(exact casts only), then compared in Python. Checked against the statistics query DuckDB
runs for the same units and terms, on generated units and constants; constants DuckDB
does not compare in the column's own type go to the query."""

from __future__ import annotations

import datetime as dt
import decimal

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _prune_units import unit_bounds

from flightsrv.engine.prune import ConstantCache, Pruner
from flightsrv.sql.plan import PruneTerm

DB = duckdb.connect()
DB.execute("SET TimeZone = 'America/New_York'")  # a TIMESTAMPTZ text without offset reads here
BASE = dt.datetime(2026, 1, 1)

#: name -> (type, value of k, SQL constants spelling value k)
KINDS = {
    "ts": (pa.timestamp("us"), lambda k: BASE + dt.timedelta(minutes=k),
           lambda v: [f"TIMESTAMP '{v}'", f"'{v}'", f"CAST('{v}' AS TIMESTAMP)"]),
    "tstz": (pa.timestamp("us", tz="UTC"), lambda k: BASE + dt.timedelta(hours=k),
             lambda v: [f"TIMESTAMPTZ '{v}+00'", f"'{v}'", f"'{v}+05:30'",
                        f"CAST('{v}' AS TIMESTAMPTZ)"]),
    "date": (pa.date32(), lambda k: BASE.date() + dt.timedelta(days=k),
             lambda v: [f"DATE '{v}'", f"'{v}'"]),
    "dec": (pa.decimal128(10, 2), lambda k: decimal.Decimal(k) / 4,
            lambda v: [str(v), f"CAST({v} AS DECIMAL(10,2))"]),
    "str": (pa.string(), lambda k: f"k{k:03d}" if k >= 0 else f"é{-k}",
            lambda v: ["'" + v.replace("'", "''") + "'"]),
    # tenths round differently in FLOAT and DOUBLE: DuckDB casts the constant to the
    # column's width; a unit holding NaN reaches above +inf, and 'nan' equals NaN
    "f32": (pa.float32(), lambda k: _tenth(k),
            lambda v: _floats(v, "DOUBLE") + ["'nan'", "'-inf'"]),
    "f64": (pa.float64(), lambda k: _tenth(k),
            lambda v: _floats(v, "FLOAT") + ["'nan'", "'inf'", "-0.0"]),
}


def _tenth(k: int) -> float:
    return {40: float("inf"), -40: float("-inf")}.get(k, k / 10)


def _floats(v: float, other: str) -> list[str]:
    if v in (float("inf"), float("-inf")):
        return [f"'{v}'", f"CAST('{v}' AS {other})"]
    return [repr(v), f"'{v}'", f"CAST({v} AS {other})"]


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(KINDS)))
    t, value, spell = KINDS[name]
    mins, maxs = unit_bounds(draw, st, -40, 40, value)
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["=", "in", "between", "<", "<=", ">", ">="]))
        k = {"=": 1, "between": 2, "in": draw(st.integers(1, 6))}.get(op, 1)
        vals = draw(st.lists(st.integers(-50, 50), min_size=k, max_size=k))
        ops = tuple(draw(st.sampled_from(spell(value(v)))) for v in vals)
        terms.append(PruneTerm("c", op, ops))
    nans = [draw(st.sampled_from([0, 0, 1, None])) if pa.types.is_floating(t) else 0
            for _ in mins]
    return name, t, mins, maxs, terms, nans


@settings(max_examples=300, deadline=None)
@given(cases())
def test_exact_constants_prune_as_the_statistics_query_does(case):
    name, t, mins, maxs, terms, nans = case
    n = len(mins)
    with DB.cursor() as cur:
        pruner = Pruner(cur, terms, pa.schema([("c", t)]), constants=ConstantCache())
        cols = {"c": {"mins": pa.array(mins, t), "maxs": pa.array(maxs, t), "nulls": [0] * n,
                      "nans": nans, "ranges": [], "buckets": []}}
        fast = pruner._run_integers(n, cols)
        # a DOUBLE constant inexact in FLOAT is compared in DOUBLE: the query decides
        inexact = name == "f32" and any(
            o.startswith("CAST(") and float(o[5:o.index(" AS")].strip("'")) !=
            float(pa.scalar(float(o[5:o.index(" AS")].strip("'")), pa.float32()).as_py())
            for term in terms for o in term.operands)
        if inexact:
            assert fast is None
            return
        assert fast is not None, (name, terms)
        slow = pruner._run_duckdb(n, [10] * n, cols)
        assert fast == slow, (name, terms, mins, maxs, fast, slow)
        assert pruner._run_integers(n, cols) == fast  # the kept casts answer alike


@pytest.mark.parametrize("t, operands", [
    (pa.timestamp("us"), ("TIMESTAMPTZ '2026-01-01 00:00:00+00'",)),  # compared in TZ
    (pa.timestamp("us"), ("DATE '2026-01-01'",)),
    (pa.timestamp("ms"), ("TIMESTAMP '2026-01-01 00:00:00.0015'",)),  # not the own type
    # DuckDB compares a TIMESTAMP_S/_MS column with a string in microseconds, casting the
    # column's values up (an error for one beyond TIMESTAMP's range): the query decides
    (pa.timestamp("ms"), ("'2026-01-01 00:00:00.001'",)),
    (pa.timestamp("s"), ("CAST('2026-01-01 00:00:01' AS TIMESTAMP_S)",)),
    (pa.timestamp("us", tz="UTC"), ("TIMESTAMP '2026-01-01 00:00:00'",)),  # cast in TZ
    (pa.date32(), ("TIMESTAMP '2026-01-01 10:00:00'",)),
    (pa.decimal128(10, 2), ("1.005",)),  # the cast rounds it
    (pa.timestamp("us"), ("NULL",)),
    (pa.float32(), ("CAST(0.1 AS DOUBLE)",)),  # compared in DOUBLE: not the cast
    (pa.float16(), ("1.5",)),
])
def test_other_constants_go_to_duckdb(t, operands):
    with DB.cursor() as cur:
        pruner = Pruner(cur, [PruneTerm("c", "<", operands)], pa.schema([("c", t)]))
        vals = [None, None]
        cols = {"c": {"mins": pa.array(vals, t), "maxs": pa.array(vals, t), "nulls": [0, 0],
                      "nans": [0, 0], "ranges": [], "buckets": []}}
        assert pruner._run_integers(2, cols) is None


def test_the_constant_cache_is_bounded():
    cache = ConstantCache(entries=2, max_operands=2)
    calls = []
    for k in range(5):
        assert cache.get(((str(k),), "t"), lambda k=k: calls.append(k) or k) == k
    assert cache.get((("4",), "t"), lambda: calls.append("again")) == 4  # kept
    assert cache.get((("0",), "t"), lambda: calls.append("again") or 0) == 0  # evicted
    assert calls.count("again") == 1
    assert len(cache._cache) <= 2
    many = tuple(str(k) for k in range(3))  # more operands than kept: computed each time
    cache.get((many, "t"), lambda: calls.append("many"))
    cache.get((many, "t"), lambda: calls.append("many"))
    assert calls.count("many") == 2


def test_a_long_list_is_tested_by_the_statistics_query():
    # casting each of thousands of constants costs more than the statistics query's range
    # test of the list (a multi-select of 1,000 strings: ~190 vs ~20 ms)
    from flightsrv.engine.prune import CAST_OPERANDS_MAX

    t = pa.string()
    cols = {"c": {"mins": pa.array(["a", "x"], t), "maxs": pa.array(["b", "z"], t),
                  "nulls": [0, 0], "nans": [0, 0], "ranges": [], "buckets": []}}
    with DB.cursor() as cur:
        for n, decided in ((CAST_OPERANDS_MAX, True), (CAST_OPERANDS_MAX + 1, False)):
            term = PruneTerm("c", "in", tuple(f"'y{k}'" for k in range(n)))
            pruner = Pruner(cur, [term], pa.schema([("c", t)]))
            assert (pruner._run_integers(2, cols) == {1}) if decided else \
                pruner._run_integers(2, cols) is None
            assert pruner._run_duckdb(2, [1, 1], cols) == {1}

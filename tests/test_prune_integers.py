"""Statistics pruning of integer columns without a query (``Pruner._run_integers``), checked
against the statistics query DuckDB runs for the same units and terms, and against the rows
a unit could hold."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _prune_units import unit_bounds

from flightsrv.engine.prune import IN_LIST_EXACT, Pruner
from flightsrv.sql.plan import PruneTerm

# one database for the module; each case gets its own cursor, as the engine gives the pruner
# a statement's cursor (a database per case was most of the property test's CPU)
DB = duckdb.connect()

TYPES = {"i8": pa.int8(), "i32": pa.int32(), "i64": pa.int64(), "u16": pa.uint16()}


def _operand(v: int, spelling: str) -> str:
    # how the planner spells a literal, a bound integer parameter, and a quoted integer
    # (``c = '7'``: DuckDB casts it to the column's type)
    return {"bound": f"CAST({v} AS BIGINT)", "quoted": f"'{v}'"}.get(spelling, str(v))


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(TYPES)))
    t = TYPES[name]
    lo_t, hi_t = (0, 60) if name == "u16" else (-60, 60)
    mins, maxs = unit_bounds(draw, st, lo_t, hi_t)
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["=", "in", "between", "<", "<=", ">", ">="]))
        spelling = draw(st.sampled_from(["literal", "bound", "quoted"]))
        k = {"=": 1, "between": 2, "in": draw(st.integers(1, IN_LIST_EXACT + 6))}.get(op, 1)
        vals = draw(st.lists(st.integers(-80, 80), min_size=k, max_size=k))
        if spelling == "quoted" and name == "u16" and min(vals) < 0:
            spelling = "literal"  # a quoted value the type cannot hold: see below
        terms.append(PruneTerm("c", op, tuple(_operand(v, spelling) for v in vals)))
    return t, mins, maxs, terms


def _holds(term: PruneTerm, x: int) -> bool:
    vals = [int(v.removeprefix("CAST(").removesuffix(" AS BIGINT)").strip("'"))
            for v in term.operands]
    return {"=": lambda: x == vals[0], "in": lambda: x in vals,
            "between": lambda: vals[0] <= x <= vals[1], "<": lambda: x < vals[0],
            "<=": lambda: x <= vals[0], ">": lambda: x > vals[0],
            ">=": lambda: x >= vals[0]}[term.op]()


@settings(max_examples=300, deadline=None)
@given(cases())
def test_integer_pruning_agrees_with_the_statistics_query(case):
    t, mins, maxs, terms = case
    n = len(mins)
    with DB.cursor() as cur:
        pruner = Pruner(cur, terms, pa.schema([("c", t)]))
        cols = {"c": {"mins": pa.array(mins, t), "maxs": pa.array(maxs, t), "nulls": [0] * n,
                      "nans": [0] * n, "ranges": [], "buckets": []}}
        fast = pruner._run_integers(n, cols)
        assert fast is not None
        slow = pruner._run_duckdb(n, [10] * n, cols)
        long_lists = any(t.op == "in" and len(t.operands) > IN_LIST_EXACT for t in terms)
        # DuckDB's query tests a long IN list by its range only: it may keep more units
        assert fast <= slow if long_lists else fast == slow, (fast, slow)
        for i in range(n):  # a unit that may hold a matching value is always kept
            if mins[i] is None:
                assert i in fast
                continue
            if any(all(_holds(term, x) for term in terms) for x in range(mins[i], maxs[i] + 1)):
                assert i in fast, (i, mins[i], maxs[i])


@pytest.mark.parametrize("terms,t,extra", [
    ([PruneTerm("c", "=", ("1.5",))], pa.int64(), {}),  # not an integer constant
    ([PruneTerm("c", "=", ("CAST(3 AS INTEGER)",))], pa.int64(), {}),  # not BIGINT
    ([PruneTerm("c", "<>", ("3",))], pa.int64(), {}),
    ([PruneTerm("c", "is_null")], pa.int64(), {}),
    ([PruneTerm("c", "=", (str(1 << 63),))], pa.int64(), {}),  # beyond BIGINT
    # a quoted value the column's type cannot hold fails the statement when a row is read
    # (DuckDB's cast): the statistics query fails alike and prunes nothing
    ([PruneTerm("c", "=", ("'300'",))], pa.int8(), {}),
    ([PruneTerm("c", "in", ("'1'", "'-1'"))], pa.uint16(), {}),
    ([PruneTerm("c", "=", ("'7.6'",))], pa.int64(), {}),  # DuckDB rounds it
])
def test_other_shapes_go_to_duckdb(terms, t, extra):
    with DB.cursor() as cur:
        pruner = Pruner(cur, terms, pa.schema([("c", t)]))
        cols = {"c": {"mins": pa.array([1, 5], t), "maxs": pa.array([4, 9], t),
                      "nulls": [0, 0], "nans": [0, 0], "ranges": [], "buckets": [], **extra}}
        assert pruner._run_integers(2, cols) is None

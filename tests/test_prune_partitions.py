"""Partition ranges and buckets pruned without a statistics query (``Pruner._run_integers``):
generated units of integer and string columns, each with its min/max bounds, a partition
range (``truncate`` gives a string only its lower bound) and a bucket (a file) or a list of
buckets (a chunk), checked against the statistics query DuckDB runs for the same units and
terms, and against the values each unit holds (one that may match is always kept)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightsrv.engine.prune import IN_LIST_EXACT, ConstantCache, Pruner
from flightsrv.sql.plan import PruneTerm
from flightsrv.table.partition import bucket_of

DB = duckdb.connect()


def _int(k: int) -> int:
    return k


def _str(k: int) -> str:
    return f"k{k + 50:03d}" if k >= 0 else f"é{-k}"


KINDS = {"i64": (pa.int64(), _int, str),
         "i32": (pa.int32(), _int, lambda v: f"CAST({v} AS BIGINT)"),
         "str": (pa.string(), _str, lambda v: "'" + v + "'")}


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(KINDS)))
    t, value, spell = KINDS[name]
    nb = draw(st.sampled_from([1, 3, 8]))
    many = draw(st.booleans())  # a chunk lists its files' buckets; a file has one
    units = []
    for _ in range(draw(st.integers(1, 6))):
        xs = draw(st.lists(st.integers(-40, 40), min_size=1, max_size=6))
        vals = [value(x) for x in xs]
        hashes = bucket_of(nb, pa.array(vals, t))
        if not many:  # a file's rows share one bucket
            vals = [v for v, h in zip(vals, hashes) if h == hashes[0]]
            hashes = hashes[:1]
        lo, hi = min(vals), max(vals)
        # a range bounds the values, each side possibly unknown (a string's truncate range
        # has no upper bound); the min/max bounds may be unknown too (deleted rows)
        rlo = draw(st.sampled_from([lo, None] + ([value(-41)] if name != "str" else [])))
        rhi = draw(st.sampled_from([hi, None] + ([value(41)] if name != "str" else [])))
        known = draw(st.integers(0, 3)) > 0
        bucket = sorted(set(hashes)) if many else hashes[0]
        if draw(st.integers(0, 4)) == 0:
            bucket = None  # an unknown bucket
        units.append((vals, lo if known else None, hi if known else None, rlo, rhi, bucket))
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["=", "in", "between", "<", "<=", ">", ">="]))
        k = {"=": 1, "between": 2, "in": draw(st.integers(1, IN_LIST_EXACT + 4))}.get(op, 1)
        xs = draw(st.lists(st.integers(-45, 45), min_size=k, max_size=k))
        terms.append(PruneTerm("c", op, tuple(spell(value(x)) for x in xs)))
    return name, t, nb, many, units, terms


def _holds(term: PruneTerm, x, value_of) -> bool:
    vals = [value_of(v) for v in term.operands]
    return {"=": lambda: x == vals[0], "in": lambda: x in vals,
            "between": lambda: vals[0] <= x <= vals[1], "<": lambda: x < vals[0],
            "<=": lambda: x <= vals[0], ">": lambda: x > vals[0],
            ">=": lambda: x >= vals[0]}[term.op]()


def _value_of(text: str):
    if text.startswith("'"):
        return text[1:-1]
    return int(text.removeprefix("CAST(").removesuffix(" AS BIGINT)"))


def _cols(t, nb, many, units):
    n = len(units)
    return {"c": {"mins": pa.array([u[1] for u in units], t),
                  "maxs": pa.array([u[2] for u in units], t), "nulls": [0] * n,
                  "nans": [0] * n,
                  "ranges": [(pa.array([u[3] for u in units], t),
                              pa.array([u[4] for u in units], t), [0] * n)],
                  "buckets": [(nb, [u[5] for u in units], many)]}}


@settings(max_examples=300, deadline=None)
@given(cases())
def test_ranges_and_buckets_prune_as_the_statistics_query_does(case):
    name, t, nb, many, units, terms = case
    n = len(units)
    cols = _cols(t, nb, many, units)
    with DB.cursor() as cur:
        pruner = Pruner(cur, terms, pa.schema([("c", t)]), constants=ConstantCache())
        fast = pruner._run_integers(n, cols)
        assert fast is not None, (name, terms)
        slow = Pruner(cur, terms, pa.schema([("c", t)]))._run_duckdb(n, [10] * n, cols)
    long_lists = any(term.op == "in" and len(term.operands) > IN_LIST_EXACT for term in terms)
    # DuckDB's query tests a long IN list by its range only: it may keep more units
    assert fast <= slow if long_lists else fast == slow, (terms, units, fast, slow)
    for i, (vals, *_rest) in enumerate(units):  # a unit holding a match is always kept
        if any(all(_holds(term, x, _value_of) for term in terms) for x in vals):
            assert i in fast, (i, units[i], terms)


def test_a_constant_the_column_cannot_hold_has_no_bucket():
    # ``c = 3000000000`` on an INTEGER column matches no row (DuckDB compares as BIGINT):
    # every unit of a known bucket goes, both ways; an unknown bucket stays
    t = pa.int32()
    units = [([1], 1, 1, None, None, 0), ([2], 2, 2, None, None, None)]
    cols = _cols(t, 1, False, units)
    cols["c"]["mins"] = cols["c"]["maxs"] = pa.nulls(2, t)
    terms = [PruneTerm("c", "=", ("3000000000",))]
    with DB.cursor() as cur:
        pruner = Pruner(cur, terms, pa.schema([("c", t)]))
        assert pruner._run_integers(2, cols) == {1}
        assert pruner._run_duckdb(2, [1, 1], cols) == {1}


@pytest.mark.parametrize("op, operands", [
    ("=", ("'3000000000'",)),  # DuckDB's cast to INTEGER fails when a row is read
    ("<>", ("3",)),
])
def test_other_bucket_terms_go_to_duckdb(op, operands):
    t = pa.int32()
    cols = _cols(t, 4, False, [([1], 1, 1, None, None, 1)])
    with DB.cursor() as cur:
        assert Pruner(cur, [PruneTerm("c", op, operands)],
                      pa.schema([("c", t)]))._run_integers(1, cols) is None

"""Spark pushed filters → statistics pruning hints (:class:`~flightsrv.sql.plan.PruneTerm`).

flightsrv never decides which rows a Spark filter keeps: every pushed filter is returned to
Spark as *not handled*, so Spark evaluates all of them after the scan. The filters that have
a prunable shape (``column op literal``, ``IN``, ``IS [NOT] NULL``) only let the scan skip
files and row groups whose statistics rule them out (:mod:`flightsrv.engine.prune`, where
DuckDB makes the comparisons; Spark and DuckDB agree on the order of numbers, NaN included,
of strings and of dates).

Not used for pruning: nested attributes (``a.b``), timestamp literals (Python datetimes
carry the session zone ambiguously), decimals (scale coercion), ``NOT``, ``LIKE``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa
from pyspark.sql import datasource as D


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value) -> str | None:
    """SQL text of a Python literal, or None if not pushable."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value) if value.is_finite() else None
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, dt.datetime):
        return None  # TIMESTAMP literals: session-zone ambiguity, let Spark evaluate
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    return None


_OPS = {D.EqualTo: "=", D.GreaterThan: ">", D.GreaterThanOrEqual: ">=", D.LessThan: "<",
        D.LessThanOrEqual: "<="}


def prune_term(f: D.Filter, schema: pa.Schema, names: dict[str, str] | None = None):
    """The pruning hint of one Spark filter, or None. ``names``: the read schema's spelling
    of a column -> the table's."""
    from flightsrv.sql.plan import PruneTerm

    attr = getattr(f, "attribute", None)
    if attr is None or len(attr) != 1:
        return None
    name = (names or {}).get(attr[0], attr[0])
    if name not in schema.names:
        return None
    t = schema.field(name).type
    if pa.types.is_decimal(t) or pa.types.is_timestamp(t):
        return None
    kind = type(f)
    if kind in _OPS:
        lit = sql_literal(f.value)
        return None if lit is None else PruneTerm(name, _OPS[kind], (lit,))
    if kind is D.In:
        lits = [sql_literal(v) for v in f.value] if f.value else [None]
        return None if any(x is None for x in lits) else PruneTerm(name, "in", tuple(lits))
    if kind is D.IsNull:
        return PruneTerm(name, "is_null")
    if kind is D.IsNotNull:
        return PruneTerm(name, "not_null")
    return None


def prune_terms(filters, schema: pa.Schema, names: dict[str, str] | None = None) -> list:
    """Pruning hints of Spark's pushed filters (a conjunction); the filters themselves all
    stay with Spark."""
    return [t for t in (prune_term(f, schema, names) for f in filters) if t is not None]

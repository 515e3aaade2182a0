"""Spark pushed filters → SQL predicate text for ``flightsrv.table.predicate.Predicate``.

``translate(filter, schema)`` returns the SQL text of one filter, or None when flightsrv cannot
evaluate it with exactly Spark's meaning (Spark then evaluates it after the scan). Pushed
filters prune files and row groups by statistics and filter rows inside the scan.

Not pushed: nested attributes (``a.b``), timestamp literals (Python datetimes carry the session
zone ambiguously), NaN literals (Spark orders NaN above every number, Arrow does not),
LIKE patterns containing ``%``, ``_`` or ``\\``, and anything ``Predicate`` rejects for the
column type.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math

import pyarrow as pa
from pyspark.sql import datasource as D

from flightsrv.errors import PredicateError
from flightsrv.table.predicate import Predicate

_CMP_SQL: dict[type, str] = {
    D.EqualTo: "=",
    D.GreaterThan: ">",
    D.GreaterThanOrEqual: ">=",
    D.LessThan: "<",
    D.LessThanOrEqual: "<=",
}
_LIKE_SQL: dict[type, str] = {
    D.StringStartsWith: "{}%",
    D.StringEndsWith: "%{}",
    D.StringContains: "%{}%",
}


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


def _column(attr: tuple, schema: pa.Schema) -> str | None:
    if len(attr) != 1 or attr[0] not in schema.names:
        return None
    return quote_ident(attr[0])


def translate(f: D.Filter, schema: pa.Schema) -> str | None:
    """SQL text for one Spark filter, or None."""
    kind = type(f)
    if kind in _CMP_SQL:
        col, lit = _column(f.attribute, schema), sql_literal(f.value)
        if col is None or lit is None:
            return None
        if isinstance(f.value, decimal.Decimal) or pa.types.is_decimal(
                schema.field(f.attribute[0]).type):
            return None  # decimal scale coercion differs between engines; let Spark do it
        return f"{col} {_CMP_SQL[kind]} {lit}"
    if kind is D.In:
        col = _column(f.attribute, schema)
        if col is None or not f.value or pa.types.is_decimal(schema.field(f.attribute[0]).type):
            return None
        if any(v is None for v in f.value):
            return None  # x IN (NULL, ...) is never TRUE for a miss; keep Spark's exact logic
        lits = [sql_literal(v) for v in f.value]
        if any(x is None for x in lits):
            return None
        return f"{col} IN ({', '.join(lits)})"
    if kind is D.IsNull:
        col = _column(f.attribute, schema)
        return None if col is None else f"{col} IS NULL"
    if kind is D.IsNotNull:
        col = _column(f.attribute, schema)
        return None if col is None else f"{col} IS NOT NULL"
    if kind in _LIKE_SQL:
        col = _column(f.attribute, schema)
        if col is None or any(c in f.value for c in "%_\\"):
            return None
        return f"{col} LIKE " + sql_literal(_LIKE_SQL[kind].format(f.value))
    if kind is D.Not:
        inner = translate(f.child, schema)
        return None if inner is None else f"NOT ({inner})"
    return None


def push(filters, schema: pa.Schema) -> tuple[list[str], list]:
    """Split Spark's filters into (SQL texts flightsrv evaluates, filters left to Spark)."""
    pushed, rest = [], []
    for f in filters:
        sql = translate(f, schema)
        if sql is not None:
            try:
                Predicate.parse(sql, schema)
            except PredicateError:
                sql = None
        if sql is None:
            rest.append(f)
        else:
            pushed.append(sql)
    return pushed, rest


def combine(sqls: list[str]) -> str | None:
    return " AND ".join(f"({s})" for s in sqls) if sqls else None

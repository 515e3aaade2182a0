"""SQL boolean predicates (DuckDB dialect, parsed by sqlglot) for scans and deletes.

``Predicate.parse(sql, schema)`` validates the expression against the table schema and gives:

- ``expression``: a ``pyarrow.compute.Expression`` that evaluates it per row (SQL three-valued
  logic: a row matches only where the predicate is TRUE);
- ``columns``: the columns it reads (deletes read only these);
- ``evaluate_stats(stats)``: ``ALL`` / ``NONE`` / ``SOME`` for a file or row group from its
  min/max/null-count statistics — ``ALL`` means every row is certainly TRUE (a metadata-only
  delete), ``NONE`` that no row can be TRUE (skip it).

Supported: comparisons, AND/OR/NOT, IN lists, BETWEEN, IS [NOT] NULL, LIKE/ILIKE, arithmetic,
literals (numbers, strings, booleans, NULL, ``TIMESTAMP '...'``, ``DATE '...'``, casts of
literals). Anything else is a ``PredicateError`` naming the predicate and the construct.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from flightsrv.errors import PredicateError


class Match(enum.Enum):
    NONE = 0
    SOME = 1
    ALL = 2


@dataclass(frozen=True)
class ColumnStats:
    min: pa.Scalar | None
    max: pa.Scalar | None
    nulls: int | None
    rows: int


StatsLookup = Callable[[str], ColumnStats | None]

_CMP = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal",
        exp.LT: "less", exp.LTE: "less_equal"}
_FLIP = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ,
         exp.NEQ: exp.NEQ}
_ARITH = {exp.Add: "add", exp.Sub: "subtract", exp.Mul: "multiply", exp.Div: "divide",
          exp.Mod: "mod"}
_BOOLEAN_NODES = (exp.And, exp.Or, exp.Not, exp.In, exp.Between, exp.Is, exp.Like, exp.ILike,
                  exp.Boolean, *_CMP)


class _Literal:
    """A literal value before it meets a column type."""

    def __init__(self, value, type_hint: str | None = None):
        self.value = value
        self.type_hint = type_hint

    def scalar_for(self, t: pa.DataType | None) -> pa.Scalar:
        v = self.value
        if v is None:
            return pa.scalar(None, t or pa.null())
        if t is None:
            return pa.scalar(v)
        textual = pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_string_view(t)
        if textual and not isinstance(v, str):
            raise PredicateError("literal does not match the column type", value=repr(v),
                                 type=str(t))
        try:
            if pa.types.is_timestamp(t) and isinstance(v, str):
                base = pa.scalar(v).cast(pa.timestamp(t.unit))
                return base.cast(t) if t.tz is None else pa.scalar(base.value, pa.timestamp(
                    t.unit, tz=t.tz))
            if pa.types.is_date(t) and isinstance(v, str):
                return pa.scalar(dt.date.fromisoformat(v), t)
            if pa.types.is_decimal(t) and not isinstance(v, str):
                import decimal
                return pa.scalar(decimal.Decimal(str(v))).cast(t)
            if pa.types.is_integer(t) and isinstance(v, float):
                return pa.scalar(v)  # compare as float; no truncation
            return pa.scalar(v).cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError) as exc:
            raise PredicateError("literal does not match the column type", value=repr(v),
                                 type=str(t), error=str(exc)) from None


class Predicate:
    def __init__(self, sql: str, schema: pa.Schema):
        self.sql = sql
        self.schema = schema
        try:
            tree = sqlglot.parse_one(sql, dialect="duckdb")
        except sqlglot.errors.ParseError as exc:
            err = exc.errors[0] if exc.errors else {}
            raise PredicateError("predicate does not parse", predicate=sql,
                                 line=err.get("line"), col=err.get("col"),
                                 error=err.get("description", str(exc))) from None
        if tree is None:
            raise PredicateError("empty predicate", predicate=sql)
        self.tree = tree
        self.columns: list[str] = []
        if not self._is_boolean(tree):
            raise PredicateError("predicate is not a boolean expression", predicate=sql,
                                 found=tree.key)
        self.expression = self._expr(tree)

    @classmethod
    def parse(cls, sql: str, schema: pa.Schema) -> "Predicate":
        return cls(sql, schema)

    # -- validation / translation -------------------------------------------------
    def _column(self, node: exp.Column) -> str:
        name = node.name
        if name in self.schema.names:
            found = name
        else:
            lower = [n for n in self.schema.names if n.lower() == name.lower()]
            if len(lower) != 1:
                raise PredicateError("predicate names an unknown column", predicate=self.sql,
                                     column=name, columns=",".join(self.schema.names))
            found = lower[0]
        if found not in self.columns:
            self.columns.append(found)
        return found

    def _is_boolean(self, node) -> bool:
        if isinstance(node, exp.Paren):
            return self._is_boolean(node.this)
        if isinstance(node, _BOOLEAN_NODES):
            return True
        if isinstance(node, exp.Column):
            name = self._column(node)
            return pa.types.is_boolean(self.schema.field(name).type)
        return False

    def _literal(self, node) -> _Literal | None:
        if isinstance(node, exp.Paren):
            return self._literal(node.this)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return _Literal(node.this)
            text = node.this
            return _Literal(float(text) if any(c in text for c in ".eE") else int(text))
        if isinstance(node, exp.Boolean):
            return _Literal(bool(node.this))
        if isinstance(node, exp.Null):
            return _Literal(None)
        if isinstance(node, exp.Neg):
            inner = self._literal(node.this)
            if inner is not None and isinstance(inner.value, (int, float)):
                return _Literal(-inner.value)
        if isinstance(node, (exp.Cast, exp.TryCast)) and self._literal(node.this) is not None:
            return _Literal(self._literal(node.this).value, node.to.sql(dialect="duckdb"))
        return None

    def _type_of(self, node) -> pa.DataType | None:
        if isinstance(node, exp.Paren):
            return self._type_of(node.this)
        if isinstance(node, exp.Column):
            return self.schema.field(self._column(node)).type
        return None

    def _value(self, node, hint: pa.DataType | None = None) -> pc.Expression:
        if isinstance(node, exp.Paren):
            return self._value(node.this, hint)
        if isinstance(node, exp.Column):
            return pc.field(self._column(node))
        lit = self._literal(node)
        if lit is not None:
            return pc.scalar(lit.scalar_for(hint))
        for cls, fn in _ARITH.items():
            if isinstance(node, cls):
                a, b = node.this, node.expression
                ta, tb = self._type_of(a), self._type_of(b)
                args = [self._value(a, tb), self._value(b, ta)]
                if fn == "mod":  # a % b = a - b * floor(a / b) is wrong for SQL; use trunc
                    q = pc.Expression._call("divide", args)
                    return pc.Expression._call("subtract", [args[0], pc.Expression._call(
                        "multiply", [args[1], pc.Expression._call("trunc", [q])])])
                return pc.Expression._call(fn + "_checked" if fn != "divide" else fn, args)
        if isinstance(node, _BOOLEAN_NODES):
            return self._expr(node)
        raise PredicateError("unsupported construct in predicate", predicate=self.sql,
                             construct=node.sql(dialect="duckdb")[:80])

    def _expr(self, node) -> pc.Expression:
        if isinstance(node, exp.Paren):
            return self._expr(node.this)
        if isinstance(node, exp.And):
            return self._expr(node.this) & self._expr(node.expression)
        if isinstance(node, exp.Or):
            return self._expr(node.this) | self._expr(node.expression)
        if isinstance(node, exp.Not):
            return ~self._expr(node.this)
        if isinstance(node, exp.Boolean):
            return pc.scalar(bool(node.this))
        for cls, fn in _CMP.items():
            if isinstance(node, cls):
                a, b = node.this, node.expression
                ta, tb = self._type_of(a), self._type_of(b)
                return pc.Expression._call(fn, [self._value(a, tb), self._value(b, ta)])
        if isinstance(node, exp.Between):
            t = self._type_of(node.this)
            v = self._value(node.this)
            return (v >= self._value(node.args["low"], t)) & (v <= self._value(node.args["high"], t))
        if isinstance(node, exp.In):
            if node.args.get("query") is not None:
                raise PredicateError("subqueries are not supported in predicates",
                                     predicate=self.sql)
            t = self._type_of(node.this)
            lits = [self._literal(e) for e in node.expressions]
            if any(x is None for x in lits):
                raise PredicateError("IN lists must hold literals", predicate=self.sql)
            values = pa.array([x.scalar_for(t).as_py() for x in lits], type=t)
            return pc.is_in(self._value(node.this), value_set=values)
        if isinstance(node, exp.Is):
            target = node.expression
            if isinstance(target, exp.Null):
                return pc.is_null(self._value(node.this))
            if isinstance(target, exp.Boolean):
                return pc.fill_null(self._value(node.this) == pc.scalar(bool(target.this)), False)
            raise PredicateError("unsupported IS form", predicate=self.sql)
        if isinstance(node, (exp.Like, exp.ILike)):
            pattern = self._literal(node.expression)
            if pattern is None or not isinstance(pattern.value, str):
                raise PredicateError("LIKE needs a string pattern", predicate=self.sql)
            return pc.Expression._call("match_like", [self._value(node.this)],
                                       pc.MatchSubstringOptions(
                                           pattern.value, ignore_case=isinstance(node, exp.ILike)))
        if isinstance(node, exp.Column):
            return pc.field(self._column(node))
        raise PredicateError("unsupported construct in predicate", predicate=self.sql,
                             construct=node.sql(dialect="duckdb")[:80])

    # -- statistics ------------------------------------------------------------------
    def evaluate_stats(self, lookup: StatsLookup) -> Match:
        try:
            return self._stats(self.tree, lookup)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
            return Match.SOME

    def _stats(self, node, lookup: StatsLookup) -> Match:
        if isinstance(node, exp.Paren):
            return self._stats(node.this, lookup)
        if isinstance(node, exp.And):
            a, b = self._stats(node.this, lookup), self._stats(node.expression, lookup)
            if Match.NONE in (a, b):
                return Match.NONE
            return Match.ALL if a is b is Match.ALL else Match.SOME
        if isinstance(node, exp.Or):
            a, b = self._stats(node.this, lookup), self._stats(node.expression, lookup)
            if Match.ALL in (a, b):
                return Match.ALL
            return Match.NONE if a is b is Match.NONE else Match.SOME
        if isinstance(node, exp.Not):
            inner = self._stats(node.this, lookup)
            return Match.NONE if inner is Match.ALL else Match.SOME
        if isinstance(node, exp.Boolean):
            return Match.ALL if node.this else Match.NONE
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) \
                and isinstance(node.this, exp.Column):
            s = lookup(self._column(node.this))
            if s is None or s.nulls is None:
                return Match.SOME
            if s.nulls == 0:
                return Match.NONE
            return Match.ALL if s.nulls == s.rows else Match.SOME
        if isinstance(node, exp.Between) and isinstance(node.this, exp.Column):
            lo = exp.GTE(this=node.this, expression=node.args["low"])
            hi = exp.LTE(this=node.this, expression=node.args["high"])
            return self._stats(exp.And(this=lo, expression=hi), lookup)
        if isinstance(node, exp.In) and isinstance(node.this, exp.Column):
            return self._in_stats(node, lookup)
        for cls in _CMP:
            if isinstance(node, cls):
                a, b = node.this, node.expression
                if isinstance(b, exp.Column) and not isinstance(a, exp.Column):
                    return self._cmp_stats(_FLIP[cls], b, a, lookup)
                return self._cmp_stats(cls, a, b, lookup)
        return Match.SOME

    def _in_values(self, node) -> list | None:
        """The IN list's non-null values, converted once and sorted (None if not comparable)."""
        cache = self.__dict__.setdefault("_in_cache", {})
        key = id(node)
        if key not in cache:
            t = self.schema.field(self._column(node.this)).type
            try:
                vals = [self._literal(e).scalar_for(t).as_py() for e in node.expressions]
                cache[key] = sorted(v for v in vals if v is not None)
            except (TypeError, AttributeError, PredicateError):
                cache[key] = None
        return cache[key]

    def _in_stats(self, node, lookup: StatsLookup) -> Match:
        """IN list vs min/max: binary search for a value inside [min, max] (one bisect per
        file or row group instead of one comparison per literal)."""
        import bisect

        values = self._in_values(node)
        s = lookup(self._column(node.this))
        if values is None or s is None or s.min is None or s.max is None \
                or not s.min.is_valid or not s.max.is_valid:
            if s is not None and s.nulls is not None and s.nulls == s.rows:
                return Match.NONE
            return Match.SOME
        lo, hi = s.min.as_py(), s.max.as_py()
        try:
            i = bisect.bisect_left(values, lo)
        except TypeError:
            return Match.SOME
        if i == len(values) or values[i] > hi:
            return Match.NONE
        if lo == hi and s.nulls == 0:
            return Match.ALL  # every row equals a listed value
        return Match.SOME

    def _cmp_stats(self, cls, col_node, lit_node, lookup: StatsLookup) -> Match:
        if isinstance(col_node, exp.Paren):
            col_node = col_node.this
        if not isinstance(col_node, exp.Column):
            return Match.SOME
        lit = self._literal(lit_node)
        if lit is None or lit.value is None:
            return Match.SOME if lit is None else Match.NONE
        name = self._column(col_node)
        s = lookup(name)
        if s is None or s.min is None or s.max is None or not s.min.is_valid:
            if s is not None and s.nulls is not None and s.nulls == s.rows:
                return Match.NONE  # all NULL: no comparison is TRUE
            return Match.SOME
        v = lit.scalar_for(self.schema.field(name).type)
        lo, hi = s.min, s.max
        lt = lambda a, b: pc.less(a, b).as_py()  # noqa: E731
        le = lambda a, b: pc.less_equal(a, b).as_py()  # noqa: E731
        no_nulls = s.nulls == 0
        if cls is exp.EQ:
            if lt(v, lo) or lt(hi, v):
                return Match.NONE
            return Match.ALL if no_nulls and le(hi, v) and le(v, lo) else Match.SOME
        if cls is exp.NEQ:
            if no_nulls and (lt(v, lo) or lt(hi, v)):
                return Match.ALL
            return Match.NONE if le(hi, v) and le(v, lo) else Match.SOME
        if cls is exp.LT:
            if le(v, lo):
                return Match.NONE
            return Match.ALL if no_nulls and lt(hi, v) else Match.SOME
        if cls is exp.LTE:
            if lt(v, lo):
                return Match.NONE
            return Match.ALL if no_nulls and le(hi, v) else Match.SOME
        if cls is exp.GT:
            if le(hi, v):
                return Match.NONE
            return Match.ALL if no_nulls and lt(v, lo) else Match.SOME
        if cls is exp.GTE:
            if lt(hi, v):
                return Match.NONE
            return Match.ALL if no_nulls and le(v, lo) else Match.SOME
        return Match.SOME


def manifest_stats_lookup(file, schema: pa.Schema) -> StatsLookup:
    """Stats of a manifest ``DataFile`` entry (physical rows; bounds stay valid after deletes)."""
    from flightsrv.table.schema import stat_from_json

    def lookup(col: str) -> ColumnStats | None:
        s = file.stats.get(col)
        if s is None:
            return None
        t = schema.field(col).type
        return ColumnStats(stat_from_json(s.get("min"), t), stat_from_json(s.get("max"), t),
                           s.get("nulls"), file.rows)

    return lookup


def rowgroup_stats_lookup(rg_meta, schema: pa.Schema) -> StatsLookup:
    """Stats of a Parquet row group (``pyarrow.parquet.RowGroupMetaData``), top-level columns."""
    index = {rg_meta.column(i).path_in_schema: i for i in range(rg_meta.num_columns)}

    def lookup(col: str) -> ColumnStats | None:
        i = index.get(col)
        if i is None:
            return None
        s = rg_meta.column(i).statistics
        if s is None:
            return None
        t = schema.field(col).type
        nulls = s.null_count if s.has_null_count else None
        if not s.has_min_max:
            return ColumnStats(None, None, nulls, rg_meta.num_rows)
        try:
            lo, hi = pa.scalar(s.min, t), pa.scalar(s.max, t)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            return ColumnStats(None, None, nulls, rg_meta.num_rows)
        return ColumnStats(lo, hi, nulls, rg_meta.num_rows)

    return lookup

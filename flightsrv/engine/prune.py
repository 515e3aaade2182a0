"""Statistics pruning whose comparisons DuckDB makes.

A scan may skip a data file or a row group only when no row in it can satisfy the
statement's WHERE. The planner (:mod:`flightsrv.sql.plan`) hands each table reference the
conjuncts of its WHERE that have the shape ``column op constant``
(:class:`~flightsrv.sql.plan.PruneTerm`); this module turns each into a condition on the
unit's statistics that is TRUE whenever a row of the unit *could* match, and lets DuckDB
evaluate it over a small relation of statistics, one row per unit, whose ``min``/``max``
columns have the column's own type. The constant is written as the user wrote it, so DuckDB
casts it (time zones, decimal scale, string-to-date) exactly as in the statement.

=========================  ==========================================================
conjunct                   keep the unit when (NULL, i.e. unknown, keeps it)
=========================  ==========================================================
``c = v``                  ``min <= v AND max >= v``
``c < v`` / ``c <= v``     ``min < v`` / ``min <= v``
``c > v`` / ``c >= v``     ``max > v`` / ``max >= v``
``c <> v``                 ``NOT (min = v AND max = v)``
``c IN (v1, ...)``         any ``c = vi`` (over 16 values: ``min <= greatest(vi)
                           AND max >= least(vi)``), each ``vi`` in the operands'
                           common type, as DuckDB compares an IN list
``c BETWEEN a AND b``      ``max >= a AND min <= b``, likewise
``c IS NULL``              ``nulls > 0``
``c IS NOT NULL``          ``nulls < rows``
=========================  ==========================================================

Soundness: every comparison DuckDB makes between the column's type and the constant's type
is monotone (the planner only pushes same-class comparisons), so ``min``/``max`` bound the
compared values. Parquet bounds leave NaN out and DuckDB orders NaN above every number, so a
float column's ``max`` is taken as NaN unless the writer recorded the unit NaN-free. ``-0.0``
and ``0.0`` compare equal in DuckDB, as in the bounds. A truncated string ``min`` is still a
lower bound; a missing bound is NULL and keeps the unit. The pruner never decides that a row
matches: every kept unit is read and DuckDB evaluates the whole WHERE on its rows.

Units are manifest chunks (:meth:`Pruner.chunks`: their summaries), data files
(:meth:`Pruner.files`) and row groups (:meth:`Pruner.row_groups`: footer statistics).
Statistics are found by field id and decoded with the type the unit was written with, then
cast to the column's current type (a widened column); a file written before a column was
added holds only the column's default, which bounds it exactly.

Deleted rows leave no trace in a pruning decision: statistics are computed over a unit's
physical rows, so a bound can be the value of a row a deletion vector hides, and whether
``WHERE s <= 'guess'`` prunes the unit (``files_pruned`` in the statement log and
``/metrics``) would answer a question about it. A data file with deleted rows (or
statistics carried over a deletion: ``stats_wide``), a manifest chunk over such files and a
row group holding a deleted position therefore have *unknown* min/max/null/NaN counts and are
never pruned by them (partition values, shared by the file's live rows, still prune). A
compaction or purge writes fresh statistics over live rows only and restores pruning.

Partition values (docs/PROTOCOL.md §15) are one more set of bounds per unit: a
``day(ts) = d`` file holds only ``ts`` values of day ``d`` (or NULLs when the value is NULL),
so the same conditions apply to those bounds. ``bucket[N]`` values prune ``c = v`` and
``c IN (...)``: DuckDB casts each constant to the column's type and confirms the cast value
equals the constant (and the constant's type compares exactly: an integer or decimal against
an integer or decimal column, a string against a string, date or timestamp column); the
writers' own bucket function hashes the cast values, and a unit is kept when its bucket is
among them. Anything unconfirmed prunes nothing.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightsrv.sql.types import quote_ident
from flightsrv.table.manifest import DataFile
from flightsrv.table.stored import widen

STATS_RELATION = "__fsrv_stats"
#: IN lists up to this long are checked value by value; longer ones by their range (one
#: condition instead of thousands: a 1,000-id DELETE spent most of its time binding them)
IN_LIST_EXACT = 16
#: more candidate files than this: prune by manifest statistics before reading footers
FILE_PREFILTER = 64
#: the decoded statistics of at most this many files are kept with their snapshot per
#: statistics query (a point query's candidate files; more are decoded each time)
KEPT_FILE_STATS = 1024
#: IN lists longer than this are not hashed into buckets (DuckDB casts each constant first)
BUCKET_LIST_MAX = 256
_NAN = float("nan")
_counter = itertools.count()


_q = quote_ident


_INT = re.compile(r"-?[0-9]+")
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int_list(vals) -> list[int] | None:
    """The operands as Python ints when every one is a plain integer literal in BIGINT's
    range (then the list is bound as a ``BIGINT[]`` parameter: DuckDB binds a 1,000-literal
    list of constants in tens of milliseconds, a list parameter in about one)."""
    if not all(_INT.fullmatch(v) for v in vals):
        return None
    out = [int(v) for v in vals]
    return out if all(_INT64[0] <= v <= _INT64[1] for v in out) else None


#: the most constants of a term :meth:`Pruner._run_integers` has DuckDB cast for Python's
#: comparison (each costs ~0.15 ms to bind, once per text for an engine's cache): a longer
#: list, as a BI tool's multi-select of thousands of strings, takes the statistics query,
#: which tests it by its range (1,000 strings: ~20 ms there, ~190 ms to cast each)
CAST_OPERANDS_MAX = 64
#: operators :meth:`Pruner._run_integers` decides without DuckDB
_INTEGER_OPS = frozenset({"=", "in", "between", "<", "<=", ">", ">="})
#: an integer constant as the planner spells it: a literal, or a bound BIGINT parameter
#: (or a quoted one, ``'77'``, which DuckDB casts to the column's integer type exactly)
_INT_OPERAND = re.compile(r"(-?[0-9]+)|CAST\((-?[0-9]+) AS BIGINT\)|'(-?[0-9]+)'")


def _int_operand(text: str, column: pa.DataType | None = None) -> int | None:
    """The integer ``text`` spells, or None. A quoted one only when it fits ``column``'s
    type: DuckDB casts it to that type, and one that does not fit fails the statement, but
    only when a row is read, so pruning must not decide it (the statistics query fails the
    same way and prunes nothing)."""
    m = _INT_OPERAND.fullmatch(text)
    if m is None:
        return None
    v = int(m.group(1) or m.group(2) or m.group(3))
    if m.group(3) is not None:
        if column is None or not pa.types.is_integer(column):
            return None
        info = np.iinfo(column.to_pandas_dtype())
        return v if info.min <= v <= info.max else None
    return v if _INT64[0] <= v <= _INT64[1] else None


def _integer_unit_may_match(op: str, vals: list, lo, hi) -> bool:
    """Whether a unit whose values lie in [lo, hi] may hold a row with ``column op vals``
    (``vals`` sorted for ``in``). A None bound is unknown: it keeps what the other bound
    does not exclude, as ``coalesce(<bound comparisons>, TRUE)`` does in SQL."""
    if op == "=":
        return (lo is None or lo <= vals[0]) and (hi is None or vals[0] <= hi)
    if op == "in":
        k = 0 if lo is None else bisect.bisect_left(vals, lo)
        return k < len(vals) and (hi is None or vals[k] <= hi)
    if op == "between":
        return (hi is None or hi >= vals[0]) and (lo is None or lo <= vals[1])
    if op == "<":
        return lo is None or lo < vals[0]
    if op == "<=":
        return lo is None or lo <= vals[0]
    if op == ">":
        return hi is None or hi > vals[0]
    return hi is None or hi >= vals[0]  # >=


def _coerced(bound: str, vals: Sequence[str]) -> list[str]:
    """Each operand of an ``IN`` list or a ``BETWEEN`` as DuckDB compares it there: in the
    one type of the column and all the operands (``v IN (9007199254740996, 1e0)`` compares
    in DOUBLE, where 2^53 + 3 equals the first constant; each alone compares exactly and
    would prune the row's unit). Each is an element of one list of the column's ``bound``
    (of the column's type) and the operands, whose element type is that common type (a
    quoted constant, DuckDB's string literal, takes the column's type as in the IN list)."""
    if len(vals) < 2:
        return list(vals)
    both = f"[{bound}, " + ", ".join(vals) + "]"
    return [f"{both}[{k}]" for k in range(2, len(vals) + 2)]


def _keep_condition(term, mn: str, mx: str, nulls: str, params: list | None = None) -> str:
    op, vals = term.op, term.stat_operands
    if term.over is not None:  # a non-decreasing function of the column: of its bounds
        if op not in ("=", "<", "<=", ">", ">=", "in", "between"):
            return "TRUE"
        mn, mx = term.over[0].format(mn), term.over[0].format(mx)
    ints = _int_list(vals) if op == "in" and len(vals) > IN_LIST_EXACT and params is not None \
        else None
    if ints is not None:
        params.append(ints)
        p = f"${len(params)}::BIGINT[]"
        return f"coalesce(({mn} <= list_max({p}) AND {mx} >= list_min({p})), TRUE)"
    if op == "=":
        cond = f"({mn} <= {vals[0]} AND {mx} >= {vals[0]})"
    elif op in ("<", "<="):
        cond = f"({mn} {op} {vals[0]})"
    elif op in (">", ">="):
        cond = f"({mx} {op} {vals[0]})"
    elif op == "<>":
        cond = f"(NOT ({mn} = {vals[0]} AND {mx} = {vals[0]}))"
    elif op == "in" and len(vals) > IN_LIST_EXACT:
        # a long list: keep the unit when its range meets the list's range (a superset of
        # "some value lies in [min, max]"; greatest/least skip NULLs, all-NULL keeps it)
        lo, hi = f"least({', '.join(vals)})", f"greatest({', '.join(vals)})"
        cond = f"({mn} <= {hi} AND {mx} >= {lo})"
    elif op == "in":
        vals = _coerced(mn, vals)
        cond = "(" + " OR ".join(f"coalesce({mn} <= {v} AND {mx} >= {v}, TRUE)"
                                 for v in vals) + ")"
    elif op == "between":
        lo, hi = _coerced(mn, vals)
        cond = f"({mx} >= {lo} AND {mn} <= {hi})"
    elif op == "prefix":
        # every string starting with p is >= p; a unit whose min is above p without
        # starting with it is above all of them
        p = vals[0]
        cond = f"({mx} >= {p} AND ({mn} <= {p} OR starts_with({mn}, {p})))"
    elif op == "is_null":
        cond = f"({nulls} > 0)"
    elif op == "not_null":
        cond = f"({nulls} < __rows)"
    else:  # unknown shape: keep everything
        return "TRUE"
    return f"coalesce({cond}, TRUE)"


def _stats_hide_deletes(f: DataFile) -> bool:
    """Whether ``f``'s manifest statistics may be a deleted row's value: rows of it were
    deleted (or its statistics were carried over a deletion). Such bounds are unknown to the
    pruner, so whether a unit is pruned (``files_pruned``, ``/metrics``) never depends on
    a deleted value."""
    return f.stats_wide or f.deleted_rows > 0


def _groups_with(f: DataFile, dead) -> set[int]:
    """The row groups of ``f`` holding a position of ``dead`` (sorted positions)."""
    if dead is None or len(dead) == 0:
        return set()
    import numpy as np

    idx = np.searchsorted(np.asarray(f.row_group_offsets, dtype=np.int64),
                          np.asarray(dead, dtype=np.int64), side="right") - 1
    return set(np.unique(idx).tolist())


def _plain(v):
    """A footer bound as a value Arrow can type: UTF-8 bytes of a string column decoded."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return v


def _temporal(t: pa.DataType) -> bool:
    return pa.types.is_date(t) or pa.types.is_timestamp(t)


def _bounds(st, t: pa.DataType) -> tuple:
    """A footer's (min, max): raw integers for a date or timestamp column (Python's
    ``datetime`` holds neither BC dates, years past 9999 nor ±infinity, all of which DuckDB
    stores), else values Arrow can type."""
    if _temporal(t):
        return st.min_raw, st.max_raw
    return _plain(st.min), _plain(st.max)


_PARQUET_UNITS = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}


def _raw_type(t: pa.DataType, md, i: int | None) -> pa.DataType:
    """The Arrow type of :func:`_bounds`' raw integers for a column of type ``t``: a date's
    days are date32's; a timestamp's are in the unit the file wrote (a ``timestamp[s]``
    column is written in milliseconds)."""
    if not _temporal(t):
        return t
    if pa.types.is_date(t):
        return pa.date32()
    unit = t.unit
    if i is not None:
        try:
            unit = _PARQUET_UNITS.get(json.loads(
                md.schema.column(i).logical_type.to_json()).get("timeUnit"), unit)
        except (ValueError, AttributeError):
            pass
    return pa.timestamp(unit, tz=t.tz)


def _from_raw(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """Raw footer bounds typed by :func:`_raw_type` as column type ``t``: a timestamp in
    seconds is stored in milliseconds, ±infinity included (:mod:`flightsrv.table.stored`)."""
    from flightsrv.table.stored import from_stored, needs_conversion

    return from_stored(arr, t) if needs_conversion(t) else arr.cast(t)


def _column_entry(t: pa.DataType, mins: list, maxs: list, encs: list, nulls: list,
                  nans: list, ranges: dict, buckets: dict, *, many: bool,
                  units: int | None) -> dict | None:
    """One column's statistics as :meth:`Pruner._run` takes them. Bounds that do not
    decode to ``t`` become NULL bounds (keep every unit) when ``units`` is given, else the
    column is left out (None). Partition ranges that do not fit ``t`` are left out;
    ``many``: a unit lists several buckets (a chunk) rather than one (a file)."""
    try:
        lo, hi = _decode(mins, encs, t), _decode(maxs, encs, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
            TypeError, ValueError, OverflowError):
        if units is None:
            return None
        lo = hi = pa.nulls(units, t)
    entry = {"mins": lo, "maxs": hi, "nulls": nulls, "nans": nans, "ranges": [],
             "buckets": [(nb, vals, many) for nb, vals in buckets.values()]}
    for rlo, rhi, pn in ranges.values():
        try:
            entry["ranges"].append((pa.array(rlo, t), pa.array(rhi, t), pn))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            pass
    return entry


def _decode(raws: list, encs: list, cur: pa.DataType) -> pa.Array:
    """Statistics JSON values as an array of type ``cur``; ``encs[i]`` is the type JSON
    value ``i`` was encoded with (None: the value is None or already of ``cur``)."""
    from flightsrv.table.schema import type_from_json

    groups: dict[str, list[int]] = {}
    for i, e in enumerate(encs):
        groups.setdefault(repr(e), []).append(i)
    parts, order = [], []
    for key, idx in groups.items():
        enc = encs[idx[0]]
        t = type_from_json(enc) if enc is not None else cur
        vals = [raws[i] for i in idx]
        parts.append(_typed(vals, t, cur))
        order += idx
    if len(parts) == 1:
        return parts[0]
    arr = pa.concat_arrays(parts)
    inverse = [0] * len(order)
    for pos, i in enumerate(order):
        inverse[i] = pos
    return arr.take(pa.array(inverse, pa.int64()))


def _typed(vals: list, t: pa.DataType, cur: pa.DataType) -> pa.Array:
    """JSON statistics values of type ``t`` as an array cast to ``cur``."""
    import decimal

    if pa.types.is_timestamp(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        arr = pa.array(vals, pa.int64()).cast(t)
    elif pa.types.is_date(t):
        arr = pa.array(vals, pa.int32()).cast(pa.date32()).cast(t)
    elif pa.types.is_decimal(t):
        arr = pa.array([None if v is None else decimal.Decimal(v) for v in vals], t)
    else:
        arr = pa.array(vals, t)
    return arr if t == cur else widen(arr, cur)


def _compares_in_python(t: pa.DataType) -> bool:
    """Column types whose values :meth:`Pruner._run_integers` compares in Python: their
    order there is DuckDB's for two values of the type (a ``TIMESTAMPTZ`` is an instant:
    its integer orders it whatever the zone). A constant's cast to a ``TIMESTAMPTZ`` reads
    a text without an offset in the session's time zone, which is the engine's for its
    whole life (``DuckEngine(time_zone=...)``; a session cannot SET it), so an engine may
    keep such casts too."""
    # a TIMESTAMP_S/_MS column is compared with a string in microseconds: DuckDB casts
    # its values up, which fails for one beyond TIMESTAMP's range (the statement fails when
    # it reads that row; the statistics query fails alike and prunes nothing, so the row is
    # read). Only microsecond timestamps (TIMESTAMP, TIMESTAMPTZ) are compared here.
    return (pa.types.is_timestamp(t) and t.unit == "us") or pa.types.is_date(t) or \
        pa.types.is_decimal(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or \
        pa.types.is_float32(t) or pa.types.is_float64(t)


#: how a float orders in DuckDB: NaN above every number (+inf too) and equal to itself;
#: -0.0 equals 0.0 (as in Python)
_NAN_KEY = (1, 0.0)


def _float_key(x):
    if x is None:
        return None
    return _NAN_KEY if x != x else (0, x)


def _comparable(arr: pa.Array) -> list:
    """Python values of ``arr`` that order as DuckDB orders the column's values: the
    integers of dates and timestamps (a Python ``datetime`` has no infinity), ``Decimal``,
    ``str``, and floats as :func:`_float_key` orders them."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_floating(arr.type):
        return [_float_key(x) for x in arr.to_pylist()]
    if pa.types.is_timestamp(arr.type) or pa.types.is_date64(arr.type):
        arr = arr.view(pa.int64())
    elif pa.types.is_date32(arr.type):
        arr = arr.view(pa.int32())
    return arr.to_pylist()


class ConstantCache:
    """An engine's constants cast to column types (:meth:`Pruner._exact_values`), so a
    statement repeated with the same constants (a dashboard's refresh) asks DuckDB nothing
    while pruning. Bounded: at most ``entries`` keys, and a key of more than ``max_operands``
    constants or ``max_chars`` of text is not kept."""

    def __init__(self, entries: int = 4096, max_operands: int = CAST_OPERANDS_MAX,
                 max_chars: int = 4096):
        from cachetools import LRUCache

        self._cache: LRUCache = LRUCache(entries)
        self._lock = threading.Lock()
        self.max_operands = max_operands
        self.max_chars = max_chars

    def get(self, key: tuple, compute: Callable[[], Any]):
        operands = key[0]
        if len(operands) > self.max_operands or sum(map(len, operands)) > self.max_chars:
            return compute()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        value = compute()
        with self._lock:
            self._cache[key] = value
        return value


def _exact_class(sql_type: str, column: pa.DataType) -> bool:
    """Whether DuckDB compares a constant of ``sql_type`` with ``column`` exactly (so
    ``column = constant`` holds for exactly one column value, the cast constant)."""
    st = sql_type.upper()
    ints = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
            "UINTEGER", "UBIGINT", "UHUGEINT")
    if pa.types.is_integer(column) or pa.types.is_decimal(column):
        return st in ints or st.startswith("DECIMAL")
    if pa.types.is_floating(column):
        # DuckDB casts an integer, decimal or string constant to the column's float type
        # (``CAST(16777217 AS BIGINT) = CAST(16777216 AS FLOAT)`` holds); a float of the
        # other width is compared in DOUBLE, which is exact when its cast is
        return st in ints or st.startswith("DECIMAL") or st in ("VARCHAR", "FLOAT", "DOUBLE")
    if pa.types.is_string(column) or pa.types.is_large_string(column) or \
            pa.types.is_string_view(column):
        return st == "VARCHAR"
    if pa.types.is_binary(column) or pa.types.is_large_binary(column):
        return st == "BLOB"
    if pa.types.is_date(column):
        return st in ("DATE", "VARCHAR")
    if pa.types.is_timestamp(column):
        from flightsrv.sql.types import sql_type_name

        own = sql_type_name(column)
        own = "TIMESTAMP WITH TIME ZONE" if own == "TIMESTAMPTZ" else own
        return st in (own, "VARCHAR")
    return False


class Pruner:
    """Prunes the units of one table reference for its ``terms``, running the statistics
    query on ``cursor`` (the statement's own DuckDB cursor, so settings such as the time
    zone are the statement's). ``snapshot``: the pinned snapshot ``schema`` and ``manifest``
    are from; the files' decoded statistics are then kept with it (``Snapshot.derived``),
    since they are a function of the version's file entries alone."""

    def __init__(self, cursor, terms: Sequence[Any], schema: pa.Schema, manifest=None, *,
                 snapshot=None, constants: ConstantCache | None = None):
        names = {f.name for f in schema}
        self._constants = constants
        self.terms = [t for t in terms if t.column in names]
        self.cursor = cursor
        self.schema = schema
        self.manifest = manifest
        self._snapshot = snapshot
        self.files_pruned = 0
        self.chunk_files_pruned = 0  # data files under the chunks pruned
        self.row_groups_pruned = 0
        self.chunks_pruned = 0
        self.chunks_kept = 0
        self.memo: dict = {}  # facts its callers derive from the terms, once
        self._hashes: dict = {}
        self._fids = {}
        if manifest is not None:
            for col in self.columns:
                self._fids[col] = manifest.field_id(col)

    def __bool__(self) -> bool:
        return bool(self.terms)

    @property
    def columns(self) -> list[str]:
        return sorted({t.column for t in self.terms})

    def _key(self, col: str) -> str:
        fid = self._fids.get(col)
        return str(fid) if fid is not None else col

    # -- the statistics query ----------------------------------------------------------

    def _run(self, n: int, rows: list, cols: dict) -> set[int]:
        """Indices of the units to keep. ``cols[col]`` holds ``mins``/``maxs`` (arrays of
        the column's type), ``nulls``, ``nans`` (lists), ``ranges`` (lists of (lo array,
        hi array, nulls list): partition bounds), ``buckets`` ([(N, values, many)]: a
        unit's bucket, or with ``many`` the list of buckets a chunk holds)."""
        if not n or not self.terms:
            return set(range(n))
        keep = self._run_integers(n, cols)
        if keep is not None:
            return keep
        return self._run_duckdb(n, rows, cols)

    def _run_integers(self, n: int, cols: dict) -> set[int] | None:
        """:meth:`_run`'s answer without a statistics query, or None when it needs one:
        when every term compares a column with constants by ``=``, ``IN``, ``BETWEEN``,
        ``<``, ``<=``, ``>`` or ``>=`` and the constants compare with the column's values
        in Python as in DuckDB:

        - an integer column with integer constants (plain literals or bound ``CAST(<int>
          AS BIGINT)`` parameters): integers compare the same in Python;
        - a date, a microsecond timestamp (with or without time zone), a decimal, a
          string or a float column (one DuckDB compares without casting its values) with
          constants DuckDB casts to the column's own type exactly (:meth:`_exact_values`:
          a constant of that very type, or a string DuckDB casts to it; for a float also
          a number DuckDB rounds to the column's width, as its comparison does): the
          comparison is then one of two values of the column's type, which compare as
          their integers (dates, timestamps), as ``Decimal``, as code points (UTF-8 bytes,
          as DuckDB compares VARCHAR) or as floats with NaN above +inf
          (:func:`_float_key`; a unit counting a NaN reaches it). DuckDB casts the
          constants, once per text for an engine (``ConstantCache``).

        Each unit's min/max bounds and each of its partition ranges (a ``day(ts)``
        partition's first and last instant) must admit a value; an ``=`` / ``IN`` term
        also needs a unit's bucket (or, for a chunk, one of its buckets) to be one of the
        constants' buckets, hashed by the writers' code (:meth:`_bucket_hashes`). A NULL
        bound or bucket keeps the unit, as ``coalesce(..., TRUE)`` does; an ``IN`` list
        keeps a unit when one of its values lies in the unit's range (DuckDB's query tests
        a long list by its range: a superset of that). A point query, a time range or a
        bucket lookup then costs no statistics query (~1.5-4 ms)."""
        keep = [True] * n
        for term in self.terms:
            c = cols.get(term.column)
            if c is None:
                continue  # no statistics for the column: every unit stays
            t = self.schema.field(term.column).type
            if term.op not in _INTEGER_OPS or term.bounds is not None or term.over is not None:
                return None
            ranges = c.get("ranges") or ()
            if pa.types.is_integer(t):
                vals = [_int_operand(v, t) for v in term.operands]
                if None in vals:
                    return None
                sets = [(c["mins"].to_pylist(), c["maxs"].to_pylist())] + \
                    [(lo.to_pylist(), hi.to_pylist()) for lo, hi, _ in ranges]
            elif _compares_in_python(t) and term.rows and \
                    len(term.operands) <= CAST_OPERANDS_MAX:
                got = self._constants_of(term, t)
                if got is None or got.null_count:
                    return None
                vals = _comparable(got)
                maxs = _comparable(c["maxs"])
                if pa.types.is_floating(t):  # a unit holding a NaN reaches above +inf
                    nans = c["nans"]
                    maxs = [_NAN_KEY if nans[i] != 0 else x for i, x in enumerate(maxs)]
                sets = [(_comparable(c["mins"]), maxs)] + \
                    [(_comparable(lo), _comparable(hi)) for lo, hi, _ in ranges]
            else:
                return None
            if not vals or (term.op == "between" and len(vals) != 2):
                return None
            if term.op == "in":
                vals.sort()
            for mins, maxs in sets:
                for i in range(n):
                    if keep[i]:
                        keep[i] = _integer_unit_may_match(term.op, vals, mins[i], maxs[i])
            for nb, values, many in c.get("buckets") or ():
                hashes = self._bucket_hashes(term, t, nb)
                if hashes is None:
                    continue  # this bucket set prunes nothing, as in the query
                for i in range(n):
                    b = values[i]
                    if not keep[i] or b is None:
                        continue
                    keep[i] = not hashes.isdisjoint(b) if many else b in hashes
        return {i for i in range(n) if keep[i]}

    def _constants_of(self, term, t: pa.DataType) -> pa.Array | None:
        """:meth:`_exact_values`, kept by the engine's ``ConstantCache`` (its casts depend
        on nothing but the engine's fixed time zone)."""
        if self._constants is None:
            return self._exact_values(term, t)
        return self._constants.get((term.operands, str(t)),
                                   lambda: self._exact_values(term, t))

    def _run_duckdb(self, n: int, rows: list, cols: dict) -> set[int]:
        arrays = [pa.array(range(n), pa.int64()), pa.array(rows, pa.int64())]
        fields = [pa.field("__i", pa.int64()), pa.field("__rows", pa.int64())]
        conds: list[str] = []
        params: list = []
        for i, col in enumerate(self.columns):
            c = cols.get(col)
            if c is None:
                continue
            t = self.schema.field(col).type
            terms = [term for term in self.terms if term.column == col]
            sets = [(c["mins"], c["maxs"], c["nulls"])] + list(c.get("ranges", ()))
            for k, (mins, maxs, nulls) in enumerate(sets):
                try:
                    if pa.types.is_floating(t) and k == 0:
                        nans = c["nans"]
                        maxs = pa.array([_NAN if nans[j] != 0 else v for j, v in
                                         enumerate(maxs.to_pylist())], t)
                    arrays += [mins, maxs, pa.array(nulls, pa.int64())]
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                    continue  # bounds not representable: this set prunes nothing
                fields += [pa.field(f"__min{i}_{k}", t), pa.field(f"__max{i}_{k}", t),
                           pa.field(f"__nulls{i}_{k}", pa.int64())]
                for term in terms:
                    conds.append(_keep_condition(term, f"__min{i}_{k}", f"__max{i}_{k}",
                                                 f"__nulls{i}_{k}", params))
            for k, (nb, values, many) in enumerate(c.get("buckets", ())):
                for term in terms:
                    hashes = self._bucket_hashes(term, t, nb)
                    if hashes is None:
                        continue
                    name = f"__b{i}_{k}"
                    listed = ", ".join(str(h) for h in sorted(hashes))
                    if not listed:  # no constant the column can hold: only unknown buckets
                        arrays.append(pa.array(values, pa.list_(pa.int32()) if many
                                               else pa.int32()))
                        fields.append(pa.field(name, arrays[-1].type))
                        conds.append(f"({name} IS NULL)")
                    elif many:
                        arrays.append(pa.array(values, pa.list_(pa.int32())))
                        fields.append(pa.field(name, pa.list_(pa.int32())))
                        conds.append(f"coalesce(list_has_any({name}, [{listed}]), TRUE)")
                    else:
                        arrays.append(pa.array(values, pa.int32()))
                        fields.append(pa.field(name, pa.int32()))
                        conds.append(f"coalesce({name} IN ({listed}), TRUE)")
        if not conds:
            return set(range(n))
        name = f"{STATS_RELATION}{next(_counter)}"
        self.cursor.register(name, pa.Table.from_arrays(arrays, schema=pa.schema(fields)))
        try:
            keep = self.cursor.execute(
                f"SELECT __i FROM {name} WHERE " + " AND ".join(conds), params or None).fetchall()
        except Exception:  # noqa: BLE001 - a bound DuckDB cannot compare: prune nothing
            return set(range(n))
        finally:
            self.cursor.unregister(name)
        return {k for (k,) in keep}

    def _bucket_hashes(self, term, t: pa.DataType, nb: int) -> set[int] | None:
        """The buckets (of ``nb``) of the column values that can equal a constant of an
        ``=`` / ``IN`` term; None when DuckDB cannot confirm every constant exactly."""
        if term.op not in ("=", "in") or len(term.operands) > BUCKET_LIST_MAX or \
                term.over is not None or term.bounds is not None:
            return None
        key = (term, str(t), nb)
        if key not in self._hashes:
            self._hashes[key] = self._hashes_of(term, t, nb)
        return self._hashes[key]

    def _hashes_of(self, term, t: pa.DataType, nb: int) -> set[int] | None:
        if pa.types.is_integer(t):
            # integers compare exactly: a constant the column's type cannot hold equals
            # none of its values (DuckDB compares in a type holding both)
            vals = [_int_operand(v, t) for v in term.operands]
            if None in vals:
                xs = self._constants_of(term, t)
            else:
                info = np.iinfo(t.to_pandas_dtype())
                xs = pa.array([v for v in vals if info.min <= v <= info.max], t)
        else:
            xs = self._constants_of(term, t)
        if xs is None:
            return None
        from flightsrv.table.partition import bucket_of

        try:
            return {h for h in bucket_of(nb, xs.cast(t)) if h is not None}
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            return None

    def _exact_values(self, term, t: pa.DataType) -> pa.Array | None:
        """The constants of ``term`` cast to ``t`` by DuckDB, as an Arrow array (a Python
        value would turn a timestamp's infinity into ``datetime.max``); None unless every
        cast is exact."""
        from flightsrv.errors import SqlError
        from flightsrv.sql.types import sql_type_name

        try:
            typ = sql_type_name(t)
        except SqlError:
            return None
        # one list of structs, each operand typed alone (a UNION ALL of one SELECT per
        # operand binds about twice as slowly)
        parts = [f"{{'k': typeof({o}), 'x': CAST({o} AS {typ}), 'e': CAST({o} AS {typ}) = {o}}}"
                 for o in term.operands]
        try:
            got = self.cursor.sql(f"SELECT unnest([{', '.join(parts)}], recursive := true)"
                                  ).to_arrow_table()
        except Exception:  # noqa: BLE001 - DuckDB cannot cast it: prune nothing
            return None
        if got.num_rows != len(term.operands):
            return None
        for kind, exact in zip(got.column("k").to_pylist(), got.column("e").to_pylist()):
            if exact is not True or not _exact_class(str(kind), t):
                return None
        return got.column("x").combine_chunks()

    # -- units -----------------------------------------------------------------------------

    def _file_cols(self, files: Sequence[DataFile]) -> dict:
        """The statistics columns (as :meth:`_run` takes them) of ``files``, one unit each:
        their manifest statistics and partition values."""
        if self._snapshot is None or len(files) > KEPT_FILE_STATS:
            return self._decode_file_cols(files)
        key = ("file stats", tuple(self.columns), tuple(f.path for f in files))
        return self._snapshot.derived(key, lambda: self._decode_file_cols(files))

    def _decode_file_cols(self, files: Sequence[DataFile]) -> dict:
        m = self.manifest
        from flightsrv.table import partition as P
        from flightsrv.table.schema import type_from_json

        out = {}
        for col in self.columns:
            t = self.schema.field(col).type
            key = self._key(col)
            fid = self._fids.get(col)
            cur_field = None
            if m is not None and fid is not None:
                from flightsrv.table.schema import field_by_name

                cur_field = field_by_name(m.schema, col)
            mins, maxs, encs, nulls, nans = [], [], [], [], []
            ranges: dict[int, list] = {}
            buckets: dict[int, tuple] = {}
            for j, f in enumerate(files):
                enc = m.field_type(f.schema_id, fid) if m is not None and fid is not None \
                    else None
                s = None if _stats_hide_deletes(f) else f.stats.get(key)
                if m is not None and fid is not None and enc is None and cur_field is not None:
                    d = cur_field.get("initial_default")  # the file predates the column
                    s = {"min": d, "max": d, "nulls": f.rows if d is None else 0, "nans": 0}
                    enc = cur_field["type"]
                s = s or {}
                mins.append(s.get("min"))
                maxs.append(s.get("max"))
                encs.append(enc)
                nulls.append(s.get("nulls"))
                nans.append(s.get("nans"))
                if m is None or fid is None or not f.partition:
                    continue
                spec = m.spec_by_id(f.spec_id)
                k_range = k_bucket = 0
                for pf, value in zip(spec["fields"], f.partition):
                    if pf["source_id"] != fid:
                        continue
                    kind, nb = P.parse_transform(pf["transform"])
                    if kind == "bucket":
                        src = m.field_type(f.schema_id, fid)
                        same = src is not None and type_from_json(src) == t
                        slot = buckets.setdefault(k_bucket, (nb, [None] * len(files)))
                        if slot[0] == nb and same:
                            slot[1][j] = value
                        k_bucket += 1
                        continue
                    if kind == "void":
                        continue
                    src = m.field_type(f.schema_id, fid)
                    lo, hi = P.bounds(pf["transform"], value, t,
                                      type_from_json(src) if src is not None else t)
                    slot = ranges.setdefault(k_range, [[None] * len(files), [None] * len(files),
                                                       [None] * len(files)])
                    slot[0][j], slot[1][j] = lo, hi
                    slot[2][j] = f.rows if value is None else 0
                    k_range += 1
            out[col] = _column_entry(t, mins, maxs, encs, nulls, nans, ranges, buckets,
                                     many=False, units=len(files))
        return out

    def files(self, files: Sequence[DataFile]) -> list[DataFile]:
        """The files whose statistics and partition values allow a match, in order."""
        if not self.terms or not files:
            return list(files)
        files = list(files)
        keep = self._run(len(files), [f.rows for f in files], self._file_cols(files))
        self.files_pruned += len(files) - len(keep)
        return [f for i, f in enumerate(files) if i in keep]

    def chunks(self, refs: Sequence) -> list:
        """The manifest chunks whose summaries allow a match (one level of the tree). A
        lone chunk is kept without a query: skipping it would save reading one chunk, while
        the statistics of the files in it (never looser than its summary) prune them anyway
        in the one query that follows, so a point query on a small table runs one query
        fewer."""
        if not self.terms or len(refs) <= 1:
            return list(refs)
        from flightsrv.table import partition as P
        from flightsrv.table.schema import type_from_json

        m = self.manifest
        refs = list(refs)
        cols = {}
        for col in self.columns:
            t = self.schema.field(col).type
            key, fid = self._key(col), self._fids.get(col)
            mins, maxs, encs, nulls, nans = [], [], [], [], []
            ranges: dict[int, list] = {}
            buckets: dict[int, tuple] = {}
            for j, r in enumerate(refs):
                # a summary over files with deleted rows may hold a deleted value: unknown
                s = {} if r.deleted_rows else (r.stats.get(key) or {})
                mins.append(s.get("min") if "t" in s else None)
                maxs.append(s.get("max") if "t" in s else None)
                encs.append(s.get("t"))
                nulls.append(s.get("nulls"))
                nans.append(s.get("nans"))
                if m is None or fid is None or len(r.parts) != 1:
                    continue
                (sid, summary), = r.parts.items()
                if not summary or summary[0].get("files") != r.files:
                    continue  # files of other specs (or unpartitioned) share the chunk
                spec = m.spec_by_id(int(sid))
                k_range = k_bucket = 0
                for pf, sm in zip(spec["fields"], summary):
                    if pf["source_id"] != fid:
                        continue
                    kind, nb = P.parse_transform(pf["transform"])
                    if kind == "bucket":
                        slot = buckets.setdefault(k_bucket, (nb, [None] * len(refs)))
                        if slot[0] == nb and "values" in sm:
                            slot[1][j] = [v for v in sm["values"] if v is not None]
                        k_bucket += 1
                        continue
                    if kind == "void":
                        continue
                    slot = ranges.setdefault(k_range, [[None] * len(refs), [None] * len(refs),
                                                       [None] * len(refs)])
                    k_range += 1
                    pn = sm.get("nulls")
                    slot[2][j] = 0 if pn == 0 else r.rows if pn == r.files else None
                    if sm.get("t") is None or "lo" not in sm:
                        continue
                    enc = type_from_json(sm["t"])
                    slot[0][j] = P.bounds(pf["transform"], sm["lo"], t, enc)[0]
                    slot[1][j] = P.bounds(pf["transform"], sm["hi"], t, enc)[1]
            entry = _column_entry(t, mins, maxs, encs, nulls, nans, ranges, buckets,
                                  many=True, units=None)
            if entry is not None:
                cols[col] = entry
        keep = self._run(len(refs), [r.rows for r in refs], cols)
        self.chunks_pruned += len(refs) - len(keep)
        self.chunks_kept += len(keep)
        # the data files under a pruned chunk were skipped by statistics too
        self.chunk_files_pruned += sum(r.files for i, r in enumerate(refs) if i not in keep)
        return [r for i, r in enumerate(refs) if i in keep]

    def _group_cols(self, f: DataFile, md, groups: Sequence[int],
                    dead=None) -> tuple[list, dict]:
        """Row counts and statistics columns (as :meth:`_run` takes them) of row groups
        ``groups`` of ``f``, from its footer ``md``, found by field id. ``dead``: the
        positions a deletion vector hides in ``f`` (None: none); a group holding one has
        unknown statistics (its footer's bounds may be that row's value)."""
        from flightsrv.table.schema import physical_name, type_from_json

        m = self.manifest
        phys: dict[str, tuple[str, pa.DataType] | None] = {}
        for col in self.columns:
            fid = self._fids.get(col)
            if m is None or fid is None:
                phys[col] = (col, self.schema.field(col).type)
                continue
            written = m.schema_by_id(f.schema_id)
            old = next((x for x in written["fields"] if int(x.get("id", -1)) == fid), None)
            phys[col] = None if old is None else (physical_name(old), type_from_json(old["type"]))
        rows, per_col = [], {c: ([], [], [], []) for c in self.columns}
        paths = {md.schema.column(i).path: i for i in range(md.num_columns)}
        hiding = _groups_with(f, dead)
        for g in groups:
            rg = md.row_group(g)
            index = {rg.column(i).path_in_schema: i for i in range(rg.num_columns)}
            rows.append(rg.num_rows)
            for col in self.columns:
                mins, maxs, nulls, nans = per_col[col]
                p = phys[col]
                i = index.get(p[0]) if p is not None else None
                st = rg.column(i).statistics if i is not None and g not in hiding else None
                lo = hi = nn = None
                if st is not None:
                    nn = st.null_count if st.has_null_count else None
                    if st.has_min_max:
                        lo, hi = _bounds(st, p[1])
                mins.append(lo)
                maxs.append(hi)
                nulls.append(nn)
                nans.append(None if _stats_hide_deletes(f) else
                            (f.stats.get(self._key(col)) or {}).get("nans"))
        cols = {}
        for col in self.columns:
            p = phys[col]
            if p is None:
                continue  # the file predates the column: the file-level check covers it
            t = self.schema.field(col).type
            mins, maxs, nulls, nans = per_col[col]
            try:
                raw = _raw_type(p[1], md, paths.get(p[0]))
                lo_a, hi_a = pa.array(mins, raw), pa.array(maxs, raw)
                if raw != p[1]:  # raw integers in the file's own unit
                    lo_a, hi_a = _from_raw(lo_a, p[1]), _from_raw(hi_a, p[1])
                if p[1] != t:  # widened since the file was written
                    lo_a, hi_a = widen(lo_a, t), widen(hi_a, t)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                    TypeError, OverflowError):
                continue
            cols[col] = {"mins": lo_a, "maxs": hi_a, "nulls": nulls, "nans": nans}
        return rows, cols

    def row_groups(self, f: DataFile, md, groups: Sequence[int]) -> list[int]:
        """The row groups of ``f`` (among ``groups``) whose footer statistics allow a match."""
        if not self.terms or not groups:
            return list(groups)
        rows, cols = self._group_cols(f, md, groups)
        keep = self._run(len(groups), rows, cols)
        self.row_groups_pruned += len(groups) - len(keep)
        return [g for i, g in enumerate(groups) if i in keep]

    def units(self, files: Sequence[DataFile], by_group: set[int],
              footer: Callable[[DataFile], Any],
              hidden: Callable[[DataFile], Any] | None = None
              ) -> tuple[list[DataFile], dict[int, list[int]]]:
        """Files and row groups of one table reference in ONE statistics query: every file of
        ``files`` is a unit (manifest statistics and partition values), except those whose
        ``id`` is in ``by_group``, whose live row groups are units (footer statistics,
        ``footer(f)``; ``hidden(f)``: the positions its deletion vector hides, whose row
        groups have unknown statistics). Returns the files that keep a unit, in order, and
        the kept groups per ``id(file)`` of the ``by_group`` files. A file dropped by its
        groups counts as a pruned file. Many files: the manifest statistics prune first (no
        footer read)."""
        if not self.terms or not files:
            return list(files), {}
        files = list(files)
        # many files: the manifest statistics prune first; the files they keep are then
        # not checked on those very statistics again (only ``by_group`` files' row groups
        # are new units), so a query by time over a year of daily files runs one query
        prefiltered = len(files) > FILE_PREFILTER
        if prefiltered:
            files = self.files(files)
        parts: list[tuple[int, list, dict]] = []  # (units, rows, cols)
        owners: list[tuple[DataFile, int | None]] = []
        whole = [f for f in files if id(f) not in by_group]
        if whole and not prefiltered:
            parts.append((len(whole), [f.rows for f in whole], self._file_cols(whole)))
            owners += [(f, None) for f in whole]
        for f in files:
            if id(f) not in by_group:
                continue
            dead = set(f.deleted_row_groups)
            live = [g for g in range(f.row_groups) if g not in dead]
            if not live:
                continue
            rows, cols = self._group_cols(f, footer(f), live,
                                          hidden(f) if hidden is not None else None)
            parts.append((len(live), rows, cols))
            owners += [(f, g) for g in live]
        if parts:
            n, rows, cols = self._concat(parts)
            keep = self._run(n, rows, cols)
        else:
            keep = set()
        groups: dict[int, list[int]] = {id(f): [] for f in files if id(f) in by_group}
        kept_files: set[int] = {id(f) for f in whole} if prefiltered else set()
        for i, (f, g) in enumerate(owners):
            if i in keep:
                kept_files.add(id(f))
                if g is not None:
                    groups[id(f)].append(g)
        out = [f for f in files if id(f) in kept_files]
        self.files_pruned += len(files) - len(out)
        self.row_groups_pruned += sum(
            1 for i, (f, g) in enumerate(owners)
            if g is not None and i not in keep and id(f) in kept_files)
        return out, groups

    def _concat(self, parts: list[tuple[int, list, dict]]) -> tuple[int, list, dict]:
        """Statistics of several unit lists as one (a missing set is NULL: keeps)."""
        if len(parts) == 1:
            return parts[0]
        n = sum(p[0] for p in parts)
        rows = [r for p in parts for r in p[1]]
        cols = {}
        for col in self.columns:
            t = self.schema.field(col).type
            if not any(col in p[2] for p in parts):
                continue
            mins, maxs, nulls, nans = [], [], [], []
            nr = max((len(p[2][col].get("ranges", ())) for p in parts if col in p[2]),
                     default=0)
            ranges = [([], [], []) for _ in range(nr)]
            for k_n, _, c in parts:
                e = c.get(col)
                if e is None:
                    mins.append(pa.nulls(k_n, t))
                    maxs.append(pa.nulls(k_n, t))
                    nulls += [None] * k_n
                    nans += [None] * k_n
                else:
                    mins.append(e["mins"])
                    maxs.append(e["maxs"])
                    nulls += list(e["nulls"])
                    nans += list(e["nans"])
                got = list(e.get("ranges", ())) if e is not None else []
                for k in range(nr):
                    lo, hi, pn = got[k] if k < len(got) else (
                        pa.nulls(k_n, t), pa.nulls(k_n, t), [None] * k_n)
                    ranges[k][0].append(lo)
                    ranges[k][1].append(hi)
                    ranges[k][2].extend(pn)
            try:
                entry = {"mins": pa.concat_arrays(mins), "maxs": pa.concat_arrays(maxs),
                         "nulls": nulls, "nans": nans,
                         "ranges": [(pa.concat_arrays(lo), pa.concat_arrays(hi), pn)
                                    for lo, hi, pn in ranges]}
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                continue
            # bucket values: only whole files have them (one list per spec field slot)
            nb_slots: dict[int, tuple[int, list]] = {}
            off = 0
            for k_n, _, c in parts:
                e = c.get(col)
                for k, (nb, vals, many) in enumerate((e or {}).get("buckets", ())):
                    if many:
                        continue
                    slot = nb_slots.setdefault(k, (nb, [None] * n))
                    if slot[0] == nb:
                        slot[1][off:off + k_n] = vals
                off += k_n
            entry["buckets"] = [(nb, vals, False) for nb, vals in nb_slots.values()]
            cols[col] = entry
        return n, rows, cols


__all__ = ["Pruner"]

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
                           AND max >= least(vi)``)
``c BETWEEN a AND b``      ``max >= a AND min <= b``
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
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from flightsrv.table.manifest import DataFile
from flightsrv.table.schema import stat_from_json

STATS_RELATION = "__fsrv_stats"
#: IN lists up to this long are checked value by value; longer ones by their range (one
#: condition instead of thousands: a 1,000-id DELETE spent most of its time binding them)
IN_LIST_EXACT = 16
#: more candidate files than this: prune by manifest statistics before reading footers
FILE_PREFILTER = 64
_NAN = float("nan")
_counter = itertools.count()


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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


def _keep_condition(term, mn: str, mx: str, nulls: str, params: list | None = None) -> str:
    op, vals = term.op, term.operands
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
        cond = "(" + " OR ".join(f"coalesce({mn} <= {v} AND {mx} >= {v}, TRUE)"
                                 for v in vals) + ")"
    elif op == "between":
        cond = f"({mx} >= {vals[0]} AND {mn} <= {vals[1]})"
    elif op == "is_null":
        cond = f"({nulls} > 0)"
    elif op == "not_null":
        cond = f"({nulls} < __rows)"
    else:  # unknown shape: keep everything
        return "TRUE"
    return f"coalesce({cond}, TRUE)"


def _plain(v):
    """A footer bound as a value Arrow can type: UTF-8 bytes of a string column decoded."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return v


class Pruner:
    """Prunes the units of one table reference for its ``terms``, running the statistics
    query on ``cursor`` (the statement's own DuckDB cursor, so settings such as the time
    zone are the statement's)."""

    def __init__(self, cursor, terms: Sequence[Any], schema: pa.Schema):
        names = {f.name for f in schema}
        self.terms = [t for t in terms if t.column in names]
        self.cursor = cursor
        self.schema = schema
        self.files_pruned = 0
        self.row_groups_pruned = 0

    def __bool__(self) -> bool:
        return bool(self.terms)

    @property
    def columns(self) -> list[str]:
        return sorted({t.column for t in self.terms})

    def _run(self, rows: list[dict]) -> set[int]:
        """Indices of the units to keep; ``rows`` hold ``min``/``max``/``nulls``/``nans``
        per column (Python values of the column's type) and ``rows``."""
        if not rows or not self.terms:
            return set(range(len(rows)))
        arrays, fields = [pa.array(range(len(rows)), pa.int64())], [pa.field("__i", pa.int64())]
        arrays.append(pa.array([r["rows"] for r in rows], pa.int64()))
        fields.append(pa.field("__rows", pa.int64()))
        conds: list[str] = []
        params: list = []
        for i, col in enumerate(self.columns):
            t = self.schema.field(col).type
            floating = pa.types.is_floating(t)
            mins, maxs, nulls = [], [], []
            for r in rows:
                s = r["cols"].get(col) or {}
                mins.append(s.get("min"))
                mx = s.get("max")
                if floating and s.get("nans") != 0:
                    mx = _NAN  # NaN rows are not in the bounds; NaN is DuckDB's largest
                maxs.append(mx)
                nulls.append(s.get("nulls"))
            try:
                arrays += [pa.array(mins, t), pa.array(maxs, t), pa.array(nulls, pa.int64())]
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
                continue  # bounds not representable: this column prunes nothing
            fields += [pa.field(f"__min{i}", t), pa.field(f"__max{i}", t),
                       pa.field(f"__nulls{i}", pa.int64())]
            for term in self.terms:
                if term.column == col:
                    conds.append(_keep_condition(term, f"__min{i}", f"__max{i}",
                                                 f"__nulls{i}", params))
        if not conds:
            return set(range(len(rows)))
        name = f"{STATS_RELATION}{next(_counter)}"
        self.cursor.register(name, pa.Table.from_arrays(arrays, schema=pa.schema(fields)))
        try:
            keep = self.cursor.execute(
                f"SELECT __i FROM {name} WHERE " + " AND ".join(conds), params or None).fetchall()
        except Exception:  # noqa: BLE001 - a bound DuckDB cannot compare: prune nothing
            return set(range(len(rows)))
        finally:
            self.cursor.unregister(name)
        return {k for (k,) in keep}

    # -- units -----------------------------------------------------------------------------

    def _file_row(self, f: DataFile) -> dict:
        cols = {}
        for col in self.columns:
            s = f.stats.get(col)
            if s is None:
                continue
            cols[col] = _file_bounds(f.path, f.etag, col, str(self.schema.field(col).type),
                                     self.schema.field(col).type, s)
        return {"rows": f.rows, "cols": cols}

    def _group_row(self, f: DataFile, md, g: int) -> dict:
        rg = md.row_group(g)
        index = {rg.column(i).path_in_schema: i for i in range(rg.num_columns)}
        cols = {}
        for col in self.columns:
            i = index.get(col)
            st = rg.column(i).statistics if i is not None else None
            if st is None:
                continue
            entry = {"nulls": st.null_count if st.has_null_count else None,
                     "nans": (f.stats.get(col) or {}).get("nans"),
                     "min": None, "max": None}
            if st.has_min_max:
                entry["min"], entry["max"] = _plain(st.min), _plain(st.max)
            cols[col] = entry
        return {"rows": rg.num_rows, "cols": cols}

    def files(self, files: Sequence[DataFile]) -> list[DataFile]:
        """The files whose manifest statistics allow a match, in order."""
        if not self.terms or not files:
            return list(files)
        keep = self._run([self._file_row(f) for f in files])
        self.files_pruned += len(files) - len(keep)
        return [f for i, f in enumerate(files) if i in keep]

    def row_groups(self, f: DataFile, md, groups: Sequence[int]) -> list[int]:
        """The row groups of ``f`` (among ``groups``) whose footer statistics allow a match."""
        if not self.terms or not groups:
            return list(groups)
        keep = self._run([self._group_row(f, md, g) for g in groups])
        self.row_groups_pruned += len(groups) - len(keep)
        return [g for i, g in enumerate(groups) if i in keep]

    def units(self, files: Sequence[DataFile], by_group: set[int],
              footer: Callable[[DataFile], Any]) -> tuple[list[DataFile], dict[int, list[int]]]:
        """Files and row groups of one table reference in ONE statistics query: every file of
        ``files`` is a unit (manifest statistics), except those whose ``id`` is in
        ``by_group``, whose live row groups are units (footer statistics, ``footer(f)``).
        Returns the files that keep a unit, in order, and the kept groups per ``id(file)``
        of the ``by_group`` files. A file dropped by its groups counts as a pruned file.
        Many files: the manifest statistics prune first (no footer read)."""
        if not self.terms or not files:
            return list(files), {}
        if len(files) > FILE_PREFILTER:
            files = self.files(files)
        rows, owners = [], []
        for f in files:
            if id(f) in by_group:
                md = footer(f)
                dead = set(f.deleted_row_groups)
                for g in range(f.row_groups):
                    if g not in dead:
                        rows.append(self._group_row(f, md, g))
                        owners.append((f, g))
            else:
                rows.append(self._file_row(f))
                owners.append((f, None))
        keep = self._run(rows)
        groups: dict[int, list[int]] = {id(f): [] for f in files if id(f) in by_group}
        kept_files: set[int] = set()
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


@functools.lru_cache(maxsize=65536)
def _file_bounds_cached(path: str, etag: str, col: str, type_name: str, t, lo_json, hi_json,
                        nulls, nans) -> dict:
    lo, hi = stat_from_json(lo_json, t), stat_from_json(hi_json, t)
    return {"min": lo.as_py() if lo is not None else None,
            "max": hi.as_py() if hi is not None else None, "nulls": nulls, "nans": nans}


def _file_bounds(path: str, etag: str, col: str, type_name: str, t, s: dict) -> dict:
    """A manifest entry's bounds as Python values of the column's type (cached: parsing
    them is most of a point query's pruning cost, and data files are immutable)."""
    lo, hi = s.get("min"), s.get("max")
    try:
        return _file_bounds_cached(path, etag, col, type_name, t, _hashable(lo), _hashable(hi),
                                   s.get("nulls"), s.get("nans"))
    except TypeError:  # unhashable bounds: parse every time
        return _file_bounds_cached.__wrapped__(path, etag, col, type_name, t, lo, hi,
                                               s.get("nulls"), s.get("nans"))


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        raise TypeError("dict bound")
    return v


__all__ = ["Pruner"]

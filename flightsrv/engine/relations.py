"""Pinned snapshots as DuckDB relations.

:func:`build` turns one table reference of a statement (a pinned :class:`Snapshot`, the
columns the statement can touch, its pruning hints) into

- a SQL body for a per-cursor temporary view, one ``SELECT`` per run of data files joined by
  ``UNION ALL`` in manifest order:

  - on a local warehouse, *clean* files (no deletion vector, no deleted row groups) are read
    by DuckDB's own multi-threaded Parquet reader,
    ``SELECT cols FROM read_parquet([...])``, which also prunes their row groups itself;
  - every other file (a deletion vector or deleted row groups, or any file of an S3
    warehouse) is read by flightsrv's masked Arrow scan (:meth:`Snapshot.scan`): deleted
    row groups are never read, the deletion vector is applied per row group as a keep mask,
    row groups are pruned by footer statistics, and it is registered as an Arrow reader
    (up to :data:`ARROW_STREAMS` readers per reference, which DuckDB consumes in parallel);

- optionally two hidden columns, :data:`FILE_COLUMN` (the file's ordinal in the relation's
  ``file_list``) and :data:`POSITION_COLUMN` (the row's physical position in that file: DuckDB's
  ``file_row_number``, or the masked scan's own count), which the DML planner selects to
  record which rows a statement touched. User statements cannot name them (the prefix is
  reserved by :mod:`flightsrv.sql.binder` and :mod:`flightsrv.engine.guard`).

Files and row groups are pruned through :class:`~flightsrv.engine.prune.Pruner`, whose
comparisons DuckDB makes: whole manifest chunks are skipped by their summaries first, so only
the chunks that may hold matching files are read; then one statistics query per reference
prunes the files (clean files by their manifest entry and partition values, DuckDB prunes
their row groups itself; Arrow-scanned files by their row groups' footer statistics).
Pruning never decides that a row matches.

Schema evolution: every file is read by field id under the current schema
(:mod:`flightsrv.table.projection`). Runs of DuckDB-read files share the schema they were
written with, and their ``SELECT`` renames (``"physical" AS "name"``), casts widened columns
and supplies the default of columns added later (``CAST(default AS type) AS "name"``); the
Arrow scan applies the same projection itself.

Pinning: the file list comes from the pinned manifest; data files are write-once under
unique keys, so reading them by path reads exactly the pinned version. Each clean file is
checked against the manifest (present, same size) before the statement runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from flightsrv.errors import CorruptObject, ObjectNotFound, SqlError
from flightsrv.table.manifest import DataFile
from flightsrv.table.scan import Snapshot, open_parquet

FILE_COLUMN = "__fsrv_file"
POSITION_COLUMN = "__fsrv_pos"
HIDDEN = (FILE_COLUMN, POSITION_COLUMN)
#: at most this many Arrow streams per table reference (each is consumed on one thread)
ARROW_STREAMS = 4


def native_root(warehouse) -> str | None:
    """The warehouse's directory when its store is a local filesystem, else None."""
    try:
        probe = warehouse.store.local_path("probe")
    except (AttributeError, ValueError):
        return None
    if probe is None:
        return None
    return os.path.dirname(os.path.abspath(probe))


def is_native(snapshot) -> bool:
    """Whether ``snapshot`` can be read natively (its table lives on a local store)."""
    try:
        return snapshot.store.local_path("probe") is not None
    except (AttributeError, ValueError):
        return False


@dataclass
class Relation:
    body: str  # SQL of the view
    readers: dict[str, Any] = field(default_factory=dict)  # name -> Arrow object to register
    files: dict[str, tuple[str, str]] = field(default_factory=dict)  # local path -> (table, key)
    file_list: tuple[DataFile, ...] = ()  # hidden file column value -> data file
    files_scanned: int = 0
    files_pruned: int = 0
    rows_masked: int = 0


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_file(path: str, f: DataFile, table: str) -> None:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise ObjectNotFound("data file referenced by the manifest is missing", table=table,
                             object=f.path) from None
    if size != f.size:
        raise CorruptObject("data file size differs from the manifest", table=table,
                            object=f.path, expected=f.size, actual=size)


def _is_clean(f: DataFile) -> bool:
    return (f.dv is None or f.dv.cardinality == 0) and not f.deleted_row_groups


def _has_nested_float(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_nested_float(t.value_type) or pa.types.is_floating(t.value_type)
    if pa.types.is_struct(t):
        return any(pa.types.is_floating(t.field(i).type) or _has_nested_float(t.field(i).type)
                   for i in range(t.num_fields))
    if pa.types.is_map(t):
        return any(pa.types.is_floating(x) or _has_nested_float(x)
                   for x in (t.key_type, t.item_type))
    return False


def _native_kind(f: DataFile, reads) -> str:
    """How a clean file may be read: "clean" (by DuckDB's Parquet reader) or "arrow" (by
    flightsrv's Arrow scan).

    DuckDB 2.0's Parquet reader trusts footer min/max of floats, which leave NaN out: it
    folds ``isnan(f)`` and ``f > 2.0`` to FALSE, skips row groups whose max is below the
    literal, and answers ``count(*) ... WHERE f = 1.5`` from the statistics alone (a NaN
    row counted as 1.5), whatever expression wraps the column. So a file is read natively
    only when the writer recorded every float column it reads NaN-free (``"nans": 0``);
    otherwise, and for floats nested in lists or structs, DuckDB gets the rows from the
    Arrow scan, which carries no statistics. ``reads``: (projection entry, stats key)."""
    for r, key in reads:
        if r.physical is None:
            continue  # the file predates the column: its default is read, not the file
        if pa.types.is_floating(r.file_type):
            if (f.stats.get(key) or {}).get("nans") != 0:
                return "arrow"
        elif _has_nested_float(r.file_type):
            return "arrow"
    return "clean"


def _select_sql(reads) -> str:
    """The projection of one run of DuckDB-read files as a SELECT list."""
    from flightsrv.sql.types import literal_sql, sql_type_name

    out = []
    for r in reads:
        if r.physical is None:
            value = literal_sql(pa.scalar(r.default, r.type))
            out.append(f"{value} AS {_ident(r.name)}")
            continue
        expr = _ident(r.physical)
        if r.cast:
            try:
                expr = f"CAST({expr} AS {sql_type_name(r.type)})"
            except SqlError:
                pass
        out.append(expr if r.physical == r.name and not r.cast
                   else f"{expr} AS {_ident(r.name)}")
    return ", ".join(out)


def build(snapshot: Snapshot, columns: list[str] | None, relation: str, *, pruner=None,
          hidden: bool = False, native: bool = True, open_scans: bool = True,
          files: list[DataFile] | None = None) -> Relation:
    """The view for one table reference (see the module docstring).

    ``columns``: the columns the view exposes (None = all, in schema order; hidden columns
    come last when ``hidden``); ``pruner``: a :class:`~flightsrv.engine.prune.Pruner` or
    None; ``native``: read clean local files with DuckDB; ``open_scans=False`` registers
    empty stand-ins (for typing a prepared statement without reading data); ``files``
    restricts the relation to some of the snapshot's files. The hidden file column is the
    file's index in the returned ``Relation.file_list``.
    """
    table = snapshot.table.name
    schema = snapshot.schema
    names = list(schema.names) if columns is None else list(columns)
    if files is None:
        files = snapshot.files(pruner.chunks if pruner else None)
    candidates = [f for f in (snapshot.live(x) for x in files) if f.live_rows > 0]
    rel = Relation("")
    manifest = snapshot.manifest
    keys = {c: (str(manifest.field_id(c)) if manifest.field_id(c) is not None else c)
            for c in names}
    kinds: dict[int, str] = {}
    spellable: dict[int, bool] = {}  # schema id -> DuckDB can spell its projection
    for f in candidates:
        kind = "arrow"
        if native and _is_clean(f):
            reads = snapshot.projection(f, names)
            kind = _native_kind(f, [(r, keys[r.name]) for r in reads])
            if kind == "clean":
                if f.schema_id not in spellable:
                    try:
                        _select_sql(reads)
                        spellable[f.schema_id] = True
                    except SqlError:  # a default DuckDB cannot spell: the Arrow scan has it
                        spellable[f.schema_id] = False
                if not spellable[f.schema_id]:
                    kind = "arrow"
        kinds[id(f)] = kind
    groups: dict[int, list[int]] = {}
    if pruner:
        # one statistics query: clean files by their manifest entry (DuckDB prunes their row
        # groups itself), Arrow-scanned files by their row groups' footer statistics
        by_group = {id(f) for f in candidates if kinds[id(f)] == "arrow"} if open_scans \
            else set()
        kept, groups = pruner.units(
            candidates, by_group, lambda f: open_parquet(snapshot.store, f, table=table).metadata)
        rel.files_pruned = len(candidates) - len(kept)
        candidates = kept
    rel.file_list = tuple(candidates)
    rel.files_scanned = len(candidates)
    rel.rows_masked = sum(f.deleted_rows for f in candidates)
    out_fields = [schema.field(c) for c in names]
    if hidden:
        out_fields += [pa.field(FILE_COLUMN, pa.int32(), nullable=False),
                       pa.field(POSITION_COLUMN, pa.int64(), nullable=False)]
    out_schema = pa.schema(out_fields)

    # runs of consecutive files read the same way: (kind, schema id, files)
    runs: list[tuple[str, int, list[DataFile]]] = []
    for f in candidates:
        kind = kinds[id(f)]
        sid = f.schema_id if kind == "clean" else -1
        if runs and runs[-1][0] == kind and runs[-1][1] == sid:
            runs[-1][2].append(f)
        else:
            runs.append((kind, sid, [f]))
    ordinal = {id(f): i for i, f in enumerate(candidates)}
    # an Arrow scan is one stream that DuckDB consumes on one thread: split a long run into
    # up to ARROW_STREAMS streams (UNION ALL branches DuckDB can consume in parallel)
    split: list[tuple[str, int, list[DataFile]]] = []
    for kind, sid, run in runs:
        if kind != "arrow" or len(run) == 1:
            split.append((kind, sid, run))
            continue
        parts = min(ARROW_STREAMS, len(run))
        size = -(-len(run) // parts)
        split.extend(("arrow", sid, run[j:j + size]) for j in range(0, len(run), size))
    runs = split
    parts = []
    store = snapshot.store
    for i, (kind, _sid, run) in enumerate(runs):
        if kind == "clean":
            paths = []
            for f in run:
                path = store.local_path(f.path)
                _check_file(path, f, table)
                rel.files[path] = (table, f.path)
                paths.append(_literal(path))
            cols = _select_sql(snapshot.projection(run[0], names))
            if hidden:
                first = ordinal[id(run[0])]
                cols += (f", CAST(file_index + {first} AS INTEGER) AS {FILE_COLUMN}"
                         f", file_row_number AS {POSITION_COLUMN}")
            parts.append(f"SELECT {cols} FROM read_parquet([{', '.join(paths)}], "
                         "hive_partitioning=false, union_by_name=false)")
            continue
        name = f"{relation}_a{i}"
        if not open_scans:
            rel.readers[name] = out_schema.empty_table()
        else:
            group_filter = (lambda f, md, gs: [g for g in gs if g in set(groups[id(f)])]) \
                if pruner else None  # the row groups the statistics query kept
            tasks = list(snapshot.plan(None, group_filter, files=run))
            by_path = {f.path: ordinal[id(f)] for f in run}
            for task in tasks:
                task.ordinal = by_path[task.file.path]
            rel.readers[name] = snapshot.scan(
                names, tasks=tasks, positions=POSITION_COLUMN if hidden else None,
                file_col=FILE_COLUMN if hidden else None)
        cols = ", ".join(_ident(c) for c in names) + \
            (f", {FILE_COLUMN}, {POSITION_COLUMN}" if hidden else "")
        parts.append(f"SELECT {cols} FROM {name}")
    if not parts:  # nothing to read: an empty relation of the snapshot's types
        name = f"{relation}_empty"
        rel.readers[name] = out_schema.empty_table()
        cols = ", ".join(_ident(c) for c in names) + \
            (f", {FILE_COLUMN}, {POSITION_COLUMN}" if hidden else "")
        parts.append(f"SELECT {cols} FROM {name}")
    rel.body = "\nUNION ALL\n".join(parts)
    return rel


def native_failure(error: BaseException,
                   files: dict[str, tuple[str, str]]) -> BaseException | None:
    """The flightsrv error behind a DuckDB error that names one of the native scan's files:
    ObjectNotFound if it is gone, CorruptObject otherwise (it is not valid Parquet)."""
    msg = str(error)
    for path, (table, key) in files.items():
        if path in msg:
            if not os.path.exists(path):
                return ObjectNotFound("data file referenced by the manifest is missing",
                                      table=table, object=key)
            first = msg.strip().splitlines()[0] if msg.strip() else type(error).__name__
            first = first.replace(path, key)
            return CorruptObject("data file is not valid Parquet", table=table, object=key,
                                 error=first)
    return None


__all__ = ["FILE_COLUMN", "HIDDEN", "POSITION_COLUMN", "Relation", "build", "is_native",
           "native_failure", "native_root"]

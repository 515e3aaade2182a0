"""Pinned snapshots as DuckDB relations.

:func:`build` turns one table reference of a statement (a pinned :class:`Snapshot`, the
columns the statement can touch, its pruning hints) into

- a SQL body for a per-cursor temporary view, one ``SELECT`` per run of data files joined by
  ``UNION ALL`` in manifest order:

  - on a local warehouse, *clean* files (no deletion vector, no deleted row groups) are read
    by DuckDB's own multi-threaded Parquet reader,
    ``SELECT cols FROM read_parquet([...])``, which also prunes their row groups itself;
  - on a local warehouse with ``masked_native`` (the engine's ``masked_scans`` mode),
    files with a deletion vector or deleted row groups are read by ``read_parquet`` too,
    through the same projection, the deleted rows removed inside DuckDB
    (:func:`_masked_part`: ``file_row_number`` ranges for deleted row groups, an anti join
    against a registered Arrow table of deleted positions for the deletion vectors); the
    reference's pruning hints are repeated as row conditions inside so DuckDB's filter and
    row-group pushdown apply, and a barrier (:data:`BARRIER`) keeps the statement's own
    expressions from ever seeing a deleted row; or, with ``prefetch`` (the engine's default
    mode), read ahead of the statement by engine SQL only and registered as an Arrow table of
    live rows (:func:`_prefetched_part`), so the statement's database never holds a deleted
    row;
  - on a local warehouse with ``masks`` (the deletion-mask extension loaded), the other
    files with deleted rows are read by ``read_parquet`` too, one branch per group of
    files (small files share one, :data:`MASK_GROUP_ROWS`), the rows its mask function
    rejects on ``file_row_number`` (and ``file_index``) removed below the same barrier
    (:func:`_cmask_part`);
  - on an S3 warehouse, a file with no deletion vector whose written schema needs no
    renames or casts for the statement's columns is read by pyarrow's dataset scanner
    (:func:`~flightsrv.table.scan.native_reader`: parallel, coalesced ranged reads in C++
    through the store's native filesystem, deleted and pruned row groups left out), unless
    the DML planner needs the hidden columns;
  - inlined files (docs/PROTOCOL.md §18: their Parquet bytes are in the manifest entry, no
    object exists) are read by flightsrv's Arrow scan ahead of the statement, in its thread,
    into one registered Arrow table (:meth:`Snapshot.read_now`, decoded files cached);
  - every other file (deleted rows without ``masked_native``, float statistics that cannot
    bound NaN, or the other files of an S3 warehouse) is read by flightsrv's masked Arrow scan
    (:meth:`Snapshot.scan`): deleted row groups are never read, the deletion vector is
    applied per row group as a keep mask, row groups are pruned by footer statistics, and it
    is registered as an Arrow reader (up to :data:`ARROW_STREAMS` readers per reference,
    which DuckDB consumes in parallel);

- optionally two hidden columns, :data:`FILE_COLUMN` (the file's ordinal in the relation's
  ``file_list``) and :data:`POSITION_COLUMN` (the row's physical position in that file: DuckDB's
  ``file_row_number``, or the masked scan's own count), which the DML planner selects to
  record which rows a statement touched. User statements cannot name them (the prefix is
  reserved by :mod:`flightsrv.sql.binder` and :mod:`flightsrv.engine.guard`).

Files and row groups are pruned through :class:`~flightsrv.engine.prune.Pruner`, whose
comparisons DuckDB makes: whole manifest chunks are skipped by their summaries first, so only
the chunks that may hold matching files are read; then one statistics query per reference
prunes the files (DuckDB-read files by their manifest entry and partition values, DuckDB prunes
their row groups itself; Arrow-scanned files by their row groups' footer statistics).
Pruning never decides that a row matches.

Schema evolution: every file is read by field id under the current schema
(:mod:`flightsrv.table.projection`). Runs of DuckDB-read files (clean or masked) share the
schema they were written with, and their ``SELECT`` renames (``"physical" AS "name"``), casts
widened columns and supplies the default of columns added later
(``CAST(default AS type) AS "name"``); the Arrow scan applies the same projection itself.

Pinning: the file list comes from the pinned manifest; data files are write-once under
unique keys, so reading them by path reads exactly the pinned version. Each DuckDB-read file
is checked against the manifest (present, same size) before the statement runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from flightsrv.errors import CorruptObject, ObjectNotFound, SqlError, StoreAccessDenied
from flightsrv.sql.types import quote_ident
from flightsrv.table.manifest import DataFile
from flightsrv.table import projection as proj
from flightsrv.table.scan import Snapshot, native_reader, open_parquet

FILE_COLUMN = "__fsrv_file"
POSITION_COLUMN = "__fsrv_pos"
HIDDEN = (FILE_COLUMN, POSITION_COLUMN)
#: at most this many Arrow streams per table reference (each is consumed on one thread)
ARROW_STREAMS = 4
#: up to this many files with deleted rows, a selective read decodes their (cached) footer
#: statistics directly in its one statistics query; above it the manifest statistics prune
#: the files first, in a query of their own
FOOTERS_WITHOUT_PREFILTER = 8


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
    def local() -> bool:
        try:
            return snapshot.store.local_path("probe") is not None
        except (AttributeError, ValueError):
            return False

    return snapshot.derived(("native",), local)


@dataclass
class Relation:
    body: str  # SQL of the view
    readers: dict[str, Any] = field(default_factory=dict)  # name -> Arrow object to register
    #: local path -> (table, key, version) of the data files DuckDB reads
    files: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    file_list: tuple[DataFile, ...] = ()  # hidden file column value -> data file
    files_scanned: int = 0
    files_pruned: int = 0
    rows_masked: int = 0
    #: the name of the one reader that is the relation column for column (a prefetched
    #: table), which may be registered under the relation's own name instead of a view
    direct: str | None = None


_ident = quote_ident


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_file(path: str, f: DataFile, table: str, version: int) -> None:
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise ObjectNotFound("data file referenced by the manifest is missing", table=table,
                             object=f.path, version=version) from None
    if size != f.size:
        raise CorruptObject("data file size differs from the manifest", table=table,
                            object=f.path, version=version, expected=f.size, actual=size)


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
    from flightsrv.sql.types import duration_sql, literal_sql, sql_type_name

    out = []
    for r in reads:
        if r.physical is None:
            value = literal_sql(pa.scalar(r.default, r.type))
            out.append(f"{value} AS {_ident(r.name)}")
            continue
        expr = _ident(r.physical)
        if pa.types.is_duration(r.type) and pa.types.is_duration(r.file_type):
            # Parquet stores a duration as an INT64 in its unit, which DuckDB's Parquet
            # reader gives as BIGINT; DuckDB reads an Arrow duration (the Arrow scan, inlined
            # rows) as INTERVAL, so the file's integers become the INTERVAL DuckDB would make
            # of them (nanoseconds truncated toward zero, as its Arrow conversion does)
            out.append(f"{duration_sql(expr, r.file_type.unit)} AS {_ident(r.name)}")
            continue
        # Parquet has no seconds unit and DuckDB reads milliseconds as TIMESTAMP: a
        # TIMESTAMP_S/_MS column is read back as the type it was declared with
        cast = r.cast or (pa.types.is_timestamp(r.type) and r.type.tz is None
                          and r.type.unit in ("s", "ms"))
        if cast:
            try:
                expr = f"CAST({expr} AS {sql_type_name(r.type)})"
            except SqlError:
                pass
        out.append(expr if r.physical == r.name and not cast
                   else f"{expr} AS {_ident(r.name)}")
    return ", ".join(out)


def build(snapshot: Snapshot, columns: list[str] | None, relation: str, *, pruner=None,
          hidden: bool = False, native: bool = True, open_scans: bool = True,
          files: list[DataFile] | None = None, masked_native: bool = False,
          masked_max_groups: int | None = None, prefetch=None, masks=None,
          listed_in_scan: int | None = None, masks_in_reader: bool = False) -> Relation:
    """The view for one table reference (see the module docstring).

    ``columns``: the columns the view exposes (None = all, in schema order; hidden columns
    come last when ``hidden``); ``pruner``: a :class:`~flightsrv.engine.prune.Pruner` or
    None; ``native``: read clean local files with DuckDB; ``masked_native``: read local
    files with deleted rows with DuckDB too (:func:`_masked_part`), with
    ``masked_max_groups`` only those whose footer statistics keep at most that many row
    groups and fewer than all (the others by the Arrow scan); ``prefetch(sql) -> pa.Table``
    (a function running engine SQL on the statement's cursor): read those files ahead of the
    statement instead (:func:`_prefetched_part`; ``prefetch(sql, tables)`` registers
    ``tables`` by name for the query), so no barrier is needed;
    ``masks(snapshot, files) -> Mask | None`` (the deletion-mask extension, :mod:`.maskext`):
    the name of a pinned mask function of ``files`` (called with ``file_row_number`` for one
    file, with ``file_index, file_row_number`` for several), or None when no slot is free;
    ``listed_in_scan`` (a reference whose filter lists the values it wants, with ``masks``):
    when the candidate files with deleted rows hold at most that many rows, they are read
    inside the statement (``"cmask"``, not the prefetch), consecutive ones of a written
    schema sharing one ``read_parquet`` whatever their rows add up to (a point read's cost
    is binding, not per-row masking; the bound keeps the group's mask, rebuilt when one of
    its files gains deletes, small); above it the prefetch reads them, as without it;
    ``masks_in_reader``: ``masks`` come from the ``"scan"`` kind (the reader applies them):
    consecutive files with deleted rows of one written schema then share one read and one
    mask slot up to :data:`SCAN_MASK_GROUP_ROWS` rows, else up to :data:`MASK_GROUP_ROWS`;
    a file with deleted rows that none of the above reads by DuckDB is then read by DuckDB
    with its group's mask (:func:`_pin_masks`, :func:`_cmask_part`) rather than by the
    Arrow scan;
    ``open_scans=False`` registers
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
    group_rows: int | None = SCAN_MASK_GROUP_ROWS if masks_in_reader else MASK_GROUP_ROWS
    if listed_in_scan is not None and masks is not None and open_scans and \
            sum(f.rows for f in candidates if not _is_clean(f)) <= listed_in_scan:
        masked_native, prefetch, group_rows = False, None, None
    rel = Relation("")
    manifest = snapshot.manifest
    remote = not is_native(snapshot)  # S3: files without deleted rows need no Python
    keys = snapshot.derived(("stats keys", tuple(names)), lambda: {
        c: (str(manifest.field_id(c)) if manifest.field_id(c) is not None else c)
        for c in names})
    kinds: dict[int, str] = {}
    spellable: dict[int, bool] = {}  # schema id -> DuckDB can spell its projection
    shadowed: dict[int, bool] = {}  # schema id -> a column hides a virtual column we read
    fns: dict[int, tuple[str, int]] = {}  # id(file) -> (mask function, group) of a "cmask"
    if not open_scans:
        masks = None

    def kind_of(f: DataFile) -> str:
        kind = "arrow"
        clean = _is_clean(f)
        if f.schema_id not in shadowed:
            shadowed[f.schema_id] = any(
                fl["name"].lower() in _VIRTUAL_COLUMNS
                for fl in manifest.schema_by_id(f.schema_id)["fields"])
        # a file with a column named file_row_number or file_index: DuckDB binds that name
        # to the column, not to the row's position, so every read that needs positions (the
        # hidden columns, a masked read) is the Arrow scan's
        # an inlined file (docs/PROTOCOL.md §18) has no object DuckDB could read: the Arrow
        # scan decodes it from its entry
        if native and f.inline is None and (clean or masked_native or masks is not None) and \
                not (shadowed[f.schema_id] and (hidden or not clean)):
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
                elif not clean:
                    kind = "masked" if masked_native else \
                        ("cmask" if masks is not None else "arrow")
        if kind == "arrow" and remote and not hidden and open_scans and f.inline is None and \
                (f.dv is None or f.dv.cardinality == 0) and \
                proj.identity(snapshot.projection(f, names)):
            kind = "dataset"  # no row to mask: pyarrow's dataset scanner reads it natively
        if f.inline is not None:
            kind = "inline"  # the Arrow scan, read ahead into one table (a few rows each)
        return kind

    # how each file is read is a function of its (immutable) entry in the pinned version
    # and of these arguments: kept with the snapshot, by path, for the next statement
    known = snapshot.derived(("kinds", tuple(names), native, masked_native,
                              masks is not None, hidden, open_scans), dict)
    for f in candidates:
        kind = known.get(f.path)
        if kind is None:
            kind = known[f.path] = kind_of(f)
        kinds[id(f)] = kind
    groups: dict[int, list[int]] = {}
    if pruner:
        # one statistics query: DuckDB-read files by their manifest entry (DuckDB prunes
        # their row groups itself), Arrow-scanned files by their row groups' footer statistics
        # (and, when their read depends on it, files with deleted rows by their row groups)
        # (a file with deleted rows that the prefetch reads whatever its statistics keep,
        # under a listed-values filter, needs no footer: DuckDB's reader prunes its groups)
        listed = prefetch is not None and point_set(pruner)
        by_group = {id(f) for f in candidates if kinds[id(f)] in ("arrow", "dataset", "inline")
                    or (kinds[id(f)] == "masked" and masked_max_groups is not None
                        and not listed)} if open_scans else set()
        before = len(candidates)
        if masked_max_groups is not None and not listed and sum(
                kinds[id(f)] == "masked" for f in candidates) > FOOTERS_WITHOUT_PREFILTER:
            # files first by their manifest statistics: a point query then decodes the footer
            # statistics of the one file that may hold it, not of every file with deletes
            candidates = pruner.files(candidates)
        kept, groups = pruner.units(
            candidates, by_group,
            lambda f: open_parquet(snapshot.store, f, table=table,
                                   version=snapshot.version).metadata,
            snapshot.deleted_positions)
        rel.files_pruned = before - len(kept)
        candidates = kept
        for f in candidates:
            if id(f) in by_group and kinds[id(f)] == "masked" and not listed:
                live = f.row_groups - len(f.deleted_row_groups)
                n = len(groups.get(id(f), ()))
                if n > masked_max_groups or n >= live:  # not selective: the keep mask wins
                    kinds[id(f)] = "cmask" if masks is not None else "arrow"
                    if kinds[id(f)] == "arrow" and id(f) not in groups:
                        groups[id(f)] = list(range(f.row_groups))
    if masks is not None:
        _pin_masks(snapshot, candidates, kinds, masks, fns,
                   groups if pruner else None, group_rows)
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
        sid = f.schema_id if kind not in ("arrow", "inline") else -1
        if kind == "cmask":  # one read_parquet per group of files sharing a mask slot
            sid = (sid, fns[id(f)][1])
        if runs and runs[-1][0] == kind and runs[-1][1] == sid:
            runs[-1][2].append(f)
        else:
            runs.append((kind, sid, [f]))
    ordinal = {id(f): i for i, f in enumerate(candidates)}
    # an Arrow scan is one stream that DuckDB consumes on one thread: split a long run into
    # up to ARROW_STREAMS streams (UNION ALL branches DuckDB can consume in parallel)
    split: list[tuple[str, int, list[DataFile]]] = []
    for kind, sid, run in runs:  # (a dataset scanner reads its files in parallel itself)
        if kind != "arrow" or len(run) == 1:
            split.append((kind, sid, run))
            continue
        parts = min(ARROW_STREAMS, len(run))
        size = -(-len(run) // parts)
        split.extend(("arrow", sid, run[j:j + size]) for j in range(0, len(run), size))
    runs = split
    parts = []
    as_is: set[str] = set()  # readers whose part is ``SELECT <the columns> FROM <reader>``
    store = snapshot.store
    for i, (kind, _sid, run) in enumerate(runs):
        if kind == "masked" and prefetch is not None:
            parts.append(_prefetched_part(snapshot, run, names, hidden, ordinal[id(run[0])],
                                          f"{relation}_p{i}", rel, open_scans, pruner,
                                          prefetch, out_schema))
            as_is.add(f"{relation}_p{i}")  # its part selects the table's columns as they are
            continue
        if kind == "cmask":
            parts.append(_cmask_part(snapshot, run, names, hidden, ordinal, rel, pruner, fns))
            continue
        if kind == "masked":
            parts.append(_masked_part(snapshot, run, names, hidden, ordinal[id(run[0])],
                                      f"{relation}_d{i}", rel, open_scans, pruner))
            continue
        if kind == "clean":
            paths = []
            for f in run:
                path = store.local_path(f.path)
                _check_file(path, f, table, snapshot.version)
                rel.files[path] = (table, f.path, snapshot.version)
                paths.append(_literal(path))
            cols = snapshot.derived(("select", run[0].schema_id, tuple(names)),
                                    lambda: _select_sql(snapshot.projection(run[0], names)))
            if hidden:
                first = ordinal[id(run[0])]
                cols += (f", CAST(file_index + {first} AS INTEGER) AS {FILE_COLUMN}"
                         f", file_row_number AS {POSITION_COLUMN}")
            parts.append(f"SELECT {cols} FROM read_parquet([{', '.join(paths)}], "
                         "hive_partitioning=false, union_by_name=false)")
            continue
        if kind == "dataset":
            name = f"{relation}_s{i}"
            live = [[g for g in range(f.row_groups) if g not in set(f.deleted_row_groups)]
                    for f in run]
            if pruner:  # the row groups the statistics query kept
                kept_groups = [set(groups[id(f)]) for f in run]
                live = [[g for g in gs if g in k] for gs, k in zip(live, kept_groups)]
            plain = pa.schema([schema.field(c) for c in names])
            rel.readers[name] = native_reader(store, run, live, plain, table=table,
                                              version=snapshot.version)
            parts.append(f"SELECT {', '.join(_ident(c) for c in names)} FROM {name}")
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
            # inlined files (PROTOCOL.md §18) hold a few rows each: read them now, in this
            # thread, into one table (their decoded rows are cached)
            read = snapshot.read_now if kind == "inline" else snapshot.scan
            rel.readers[name] = read(
                names, tasks=tasks, positions=POSITION_COLUMN if hidden else None,
                file_col=FILE_COLUMN if hidden else None)
        cols = ", ".join(_ident(c) for c in names) + \
            (f", {FILE_COLUMN}, {POSITION_COLUMN}" if hidden else "")
        parts.append(f"SELECT {cols} FROM {name}")
        as_is.add(name)
    if not parts:  # nothing to read: an empty relation of the snapshot's types
        name = f"{relation}_empty"
        rel.readers[name] = out_schema.empty_table()
        cols = ", ".join(_ident(c) for c in names) + \
            (f", {FILE_COLUMN}, {POSITION_COLUMN}" if hidden else "")
        parts.append(f"SELECT {cols} FROM {name}")
        as_is.add(name)
    rel.body = "\nUNION ALL\n".join(parts)
    if len(parts) == 1 and len(rel.readers) == 1:
        # one Arrow table that is the whole relation, column for column: DuckDB can read it
        # under the relation's name, without a view over it
        (name, only), = rel.readers.items()
        columns = names + (list(HIDDEN) if hidden else [])
        if name in as_is and isinstance(only, pa.Table) and only.schema.names == columns:
            rel.direct = name
    return rel



def file_position_order(table: pa.Table, file_column: str,
                        position_column: str) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """``table`` (rows read with their file ordinal and position) in file and position
    order, and those two columns as int64 arrays in that order. DuckDB keeps a scan's order
    (preserve_insertion_order), so the rows usually are already; never rely on it blindly."""
    # one Array each (a ChunkedArray's to_numpy goes through pandas)
    fi = table.column(file_column).combine_chunks().to_numpy(
        zero_copy_only=False).astype(np.int64)
    fr = table.column(position_column).combine_chunks().to_numpy(
        zero_copy_only=False).astype(np.int64)
    dfi, dfr = np.diff(fi), np.diff(fr)
    if not bool(np.all((dfi > 0) | ((dfi == 0) & (dfr > 0)))):
        import pyarrow.compute as pc

        order = pc.sort_indices(table, sort_keys=[(file_column, "ascending"),
                                                  (position_column, "ascending")])
        table = table.take(order)
        order = order.to_numpy()
        fi, fr = fi[order], fr[order]
    return table, fi, fr

#: DuckDB's virtual columns of a Parquet read that flightsrv's SQL names; a file column of
#: the same name (any case) takes the name over
_VIRTUAL_COLUMNS = frozenset({"file_row_number", "file_index"})

#: the registered table of deleted positions a masked run anti-joins (file_index is UBIGINT)
DELETED_SCHEMA = pa.schema([pa.field("fi", pa.uint64(), nullable=False),
                            pa.field("pos", pa.int64(), nullable=False)])
#: what ends a masked read (after its subquery's alias): a SYSTEM sample of 100%, which
#: DuckDB 2.0.1 plans as a streaming operator (it keeps each vector when a random number in
#: [0, 1] is <= 1.0, i.e. always, and runs in the scan's parallel pipeline) and which its
#: optimizer pushes no filter and no expression through (a sample is neither in its filter
#: pushdown nor its filter pull-up), so the statement's own expressions (a failing CAST,
#: ``error()``) see only rows the mask kept. The LIMIT barrier used before is a pipeline
#: breaker when DuckDB must keep the order; tests/test_maskext.py checks the plan's shape.
BARRIER = "USING SAMPLE 100 PERCENT (system)"


#: constants an integer column is compared with without being cast to a DECIMAL: integer
#: literals, bound integer parameters (``CAST(4103 AS BIGINT)``), bound floats (DOUBLE)
_SAFE_FOR_INTEGER = re.compile(
    r"-?[0-9]+|CAST\(-?[0-9]+ AS (TINYINT|SMALLINT|INT|INTEGER|BIGINT|HUGEINT|UTINYINT|"
    r"USMALLINT|UINTEGER|UBIGINT|UHUGEINT)\)|CAST\([-+.eE0-9]+ AS (DOUBLE|FLOAT|REAL)\)")


def _term_sql(term, column_type: pa.DataType, qualifier: str = "__fsrv_t.",
              exact_lists: bool = False) -> str | None:
    """A pruning hint (:class:`~flightsrv.sql.plan.PruneTerm`) as a row condition on
    ``__fsrv_t``, or None when it is not evaluated per row. The hints are conjuncts of the
    statement's WHERE (or implied by a long IN list), so a row they reject could not match
    anyway; DuckDB still evaluates the whole WHERE above the barrier.

    These conditions run on deleted rows too, so none may fail on a row's value: string,
    boolean and temporal columns are compared with constants cast to the column's type, but
    a number column may be cast to the constant's decimal type, which fails naming the
    value (``bigint_col < 1.12345678901234567890123`` casts to DECIMAL(38,23)). So an
    integer column takes only integer or DOUBLE constants (:data:`_SAFE_FOR_INTEGER`; DuckDB
    then compares in an integer type or DOUBLE, which hold every value), a decimal column
    none, and a long IN list of non-integers is left out."""
    from flightsrv.engine.prune import IN_LIST_EXACT, _int_list

    c, op, vals = qualifier + _ident(term.column), term.op, term.operands
    if pa.types.is_decimal(column_type):
        return None
    if term.bounds is not None:
        # an operand that reads the clock: a prefetch runs before the statement, in a
        # transaction of its own, so it gets the widened bounds (NULL: keep the row)
        if op not in ("<", "<=", ">", ">=", "between"):
            return None
        b = term.bounds
        cond = f"{c} BETWEEN {b[0]} AND {b[1]}" if op == "between" else f"{c} {op} {b[0]}"
        return f"coalesce({cond}, TRUE)"
    if pa.types.is_integer(column_type) and not all(_SAFE_FOR_INTEGER.fullmatch(v)
                                                    for v in vals):
        return None
    if op in ("=", "<", "<=", ">", ">=", "<>"):
        return f"{c} {op} {vals[0]}"
    if op == "in" and (len(vals) <= IN_LIST_EXACT or exact_lists):
        return f"{c} IN ({', '.join(vals)})"
    if op == "in":
        ints = _int_list(vals)
        return None if ints is None else f"{c} BETWEEN {min(ints)} AND {max(ints)}"
    if op == "between":
        return f"{c} BETWEEN {vals[0]} AND {vals[1]}"
    if op == "prefix":
        return f"starts_with({c}, {vals[0]})"
    if op == "is_null":
        return f"{c} IS NULL"
    if op == "not_null":
        return f"{c} IS NOT NULL"
    return None


def _row_conditions(pruner, schema: pa.Schema, names, qualifier: str = "__fsrv_t.",
                    exact_lists: bool = False) -> list[tuple[Any, str]]:
    """(hint, row condition) of each hint on one of ``names`` that is evaluated per row
    (``exact_lists``: a long IN list as itself, not as its range)."""
    if pruner is None:
        return []
    out = []
    for t in pruner.terms:
        if t.column in names and t.rows:
            cond = _term_sql(t, schema.field(t.column).type, qualifier, exact_lists)
            if cond is not None:
                out.append((t, cond))
    return out


def point_set(pruner) -> bool:
    """Whether ``pruner`` has a hint that selects rows by listed values (``col = c`` or
    ``col IN (c, ...)``, any length) which DuckDB can evaluate exactly per row on deleted
    rows too: the ``"prefetch"`` mode then reads files with deleted rows ahead of the
    statement whatever their statistics keep (scattered ids touch every row group, but the
    prefetched rows are only those holding a listed value)."""
    if pruner is None:
        return False
    found = pruner.memo.get("point_set")
    if found is None:  # asked by the engine and by build() for one reference: derive once
        found = pruner.memo["point_set"] = any(t.op in ("=", "in") for t, _ in _row_conditions(
            pruner, pruner.schema, pruner.schema.names, exact_lists=True))
    return found


def pushable(pruner) -> bool:
    """Whether ``pruner`` has a hint DuckDB can evaluate exactly per row inside a masked run
    (the ``"filtered"`` mode reads files with deleted rows with DuckDB only then). A long
    IN list does not count: inside it is only its range, which scattered ids make the whole
    table (a 1,000-id ``IN`` measured 1.26x the Arrow scan that way, benchmarks/RESULTS.md),
    and the list itself stays above the barrier."""
    from flightsrv.engine.prune import IN_LIST_EXACT

    if pruner is None:
        return False
    return any(not (t.op == "in" and len(t.operands) > IN_LIST_EXACT)
               for t, _ in _row_conditions(pruner, pruner.schema, pruner.schema.names))


def _native_run(snapshot: Snapshot, run: list[DataFile], names: list[str],
                rel: Relation) -> tuple[str, list[str]]:
    """The engine's own read of a run of local files that share one written schema: the
    ``SELECT`` of their projection by field id with ``__fsrv_fi`` (the run-local file index)
    and ``__fsrv_fr`` (the row's position in its file), and the conditions that cut their
    deleted row groups by those two. Each file is checked against the manifest first."""
    table = snapshot.table.name
    store = snapshot.store
    paths, ranges = [], []
    for j, f in enumerate(run):
        path = store.local_path(f.path)
        _check_file(path, f, table, snapshot.version)
        rel.files[path] = (table, f.path, snapshot.version)
        paths.append(_literal(path))
        for g in f.deleted_row_groups:
            start = f.row_group_offsets[g]
            ranges.append(f"(__fsrv_fi = {j} AND __fsrv_fr BETWEEN {start} AND "
                          f"{start + f.row_group_rows(g) - 1})")
    inner = (f"SELECT {_select_sql(snapshot.projection(run[0], names))}, "
             "file_index AS __fsrv_fi, file_row_number AS __fsrv_fr "
             f"FROM read_parquet([{', '.join(paths)}], hive_partitioning=false, "
             "union_by_name=false)")
    return inner, ranges


def _masked_part(snapshot: Snapshot, run: list[DataFile], names: list[str], hidden: bool,
                 first: int, name: str, rel: Relation, open_scans: bool, pruner) -> str:
    """One ``SELECT`` reading a run of local files that have deleted rows (and share one
    written schema) with DuckDB's Parquet reader, the deleted rows removed inside DuckDB.

    Inner query (engine SQL only): the run's projection (:func:`_select_sql`, by field id)
    with ``file_index``/``file_row_number``; the pruning hints as row conditions, which
    DuckDB pushes into the reader (projection, filter and row-group pruning); deleted row
    groups removed by ``file_row_number`` ranges; the deletion vectors' positions removed by
    an ``ANTI JOIN`` against the registered Arrow table ``name`` of (run-local file index,
    position). It ends in the barrier :data:`BARRIER`: DuckDB pushes no filter through it,
    so the statement's own WHERE (which may raise errors naming values, e.g. a failed CAST
    or ``error()``) is evaluated only on rows that are live. Without the barrier the
    optimizer evaluates it below the anti join, on deleted rows."""
    inner, ranges = _native_run(snapshot, run, names, rel)
    fis, poss = [], []
    for j, f in enumerate(run):
        if open_scans:
            pos = snapshot.deleted_positions(f)
            if pos is not None and len(pos):
                poss.append(pos)
                fis.append(np.full(len(pos), j, dtype=np.uint64))
    conds = [c for _, c in _row_conditions(pruner, snapshot.schema, names)]
    if ranges:
        conds.append(f"NOT ({' OR '.join(ranges)})")
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    join = ""
    if fis or not open_scans:
        rel.readers[name] = pa.table([pa.array(np.concatenate(fis), pa.uint64()),
                                      pa.array(np.concatenate(poss), pa.int64())],
                                     schema=DELETED_SCHEMA) if fis \
            else DELETED_SCHEMA.empty_table()
        join = (f" ANTI JOIN {name} AS __fsrv_d ON __fsrv_d.fi = __fsrv_t.__fsrv_fi"
                " AND __fsrv_d.pos = __fsrv_t.__fsrv_fr")
    cols = ", ".join(_ident(c) for c in names)
    if hidden:
        cols += (f", CAST(__fsrv_fi + {first} AS INTEGER) AS {FILE_COLUMN}"
                 f", __fsrv_fr AS {POSITION_COLUMN}")
    return (f"SELECT {cols} FROM (SELECT __fsrv_t.* FROM ({inner}) AS __fsrv_t{join}{where}"
            f") AS __fsrv_m {BARRIER}")


def _take_source(snapshot: Snapshot, files: list[DataFile], names: list[str]
                 ) -> tuple[str, list[str]] | None:
    """(select list of ``names`` by field id under the current schema, the SQL string
    literals of the local paths of ``files``) for a read by position of local files of one
    written schema; None when DuckDB cannot read them so (an inlined file, a column that
    hides ``file_row_number``, a default DuckDB cannot spell)."""
    if any(f.inline is not None for f in files) or len({f.schema_id for f in files}) != 1:
        return None  # an inlined file's bytes are in its manifest entry (PROTOCOL.md §18)
    fields = snapshot.manifest.schema_by_id(files[0].schema_id)["fields"]
    if any(fl["name"].lower() in _VIRTUAL_COLUMNS for fl in fields):
        return None
    try:
        cols = _select_sql(snapshot.projection(files[0], names))
    except SqlError:
        return None
    paths = []
    for f in files:
        path = snapshot.store.local_path(f.path)
        _check_file(path, f, snapshot.table.name, snapshot.version)
        paths.append(_literal(path))
    return cols, paths


#: read_parquet's options for every read of the engine's own files
_READ_OPTIONS = "hive_partitioning=false, union_by_name=false"


def take_sql(snapshot: Snapshot, f: DataFile, names: list[str], mask) -> str | None:
    """SQL reading, with DuckDB's Parquet reader, the rows of local file ``f`` that ``mask``
    (a :class:`~flightsrv.engine.maskext.Mask`) keeps (for UPDATE/MERGE's read by position, a
    mask whose every position is set but the wanted ones), columns ``names`` by field id
    under the current schema, in position order; None when DuckDB cannot read the file so
    (:func:`_take_source`). Only the mask is evaluated over the file's rows: no statistics
    decide a row, so float columns need no NaN record."""
    source = _take_source(snapshot, [f], names)
    if source is None:
        return None
    cols, paths = source
    read = mask.read(paths, _READ_OPTIONS)
    if mask.in_scan:
        return f"SELECT {cols} FROM {read}"
    return f"SELECT {cols} FROM {read} WHERE {mask.function}(file_row_number)"


def take_group_sql(snapshot: Snapshot, files: list[DataFile], names: list[str],
                   mask) -> str | None:
    """SQL reading, with one DuckDB read over local ``files`` (one written schema), the rows
    ``mask`` keeps (one mask per file of the list, in order), columns ``names`` by field id
    under the current schema, then ``file_index`` and ``file_row_number`` as ``__fsrv_fi``
    and ``__fsrv_fr`` (the caller checks the order and counts); None when DuckDB cannot read
    one of them so (:func:`_take_source`). One statement lets DuckDB read the files in
    parallel, where a file of one row group read alone keeps one thread busy."""
    source = _take_source(snapshot, files, names)
    if source is None:
        return None
    cols, paths = source
    text = (f"SELECT {cols}, file_index AS __fsrv_fi, file_row_number AS __fsrv_fr FROM "
            f"{mask.read(paths, _READ_OPTIONS)}")
    if mask.in_scan:
        return text
    return f"{text} WHERE {mask.function}(file_index, file_row_number)"


#: files with deleted rows read with the deletion-mask extension share one ``read_parquet``
#: (and one mask slot, the function given each row's ``file_index``) while their rows add up
#: to at most this many; a larger file has a ``read_parquet`` of its own. Binding each
#: ``read_parquet`` costs about 0.4 ms of CPU (twice per statement: the view, the statement),
#: and the two-argument mask costs about 1.2 ns per row more than the one-argument one
#: (DuckDB flattens the constant ``file_index`` vector for it): measured on 1M and 10M rows
#: in 4 files, benchmarks/RESULTS.md (2026-11-27, eleventh session)
MASK_GROUP_ROWS = 2_000_000
#: the same bound for the ``"scan"`` kind, whose reader finds a file's mask once per file
#: (no per-row cost to grouping): one read lets DuckDB spread all the files' row groups over
#: its threads, as it does for files without deletes; the bound keeps a group's mask (one bit
#: per row, rebuilt when one of its files gains deletes) at 4 MB
SCAN_MASK_GROUP_ROWS = 32_000_000


def _pin_masks(snapshot: Snapshot, candidates: list[DataFile], kinds: dict, masks,
               fns: dict, groups: dict | None, max_rows: int | None) -> None:
    """Pin the mask functions of the ``"cmask"`` files of ``candidates``: consecutive such
    files that share a written schema are grouped while their rows add up to at most
    ``max_rows`` (None: any number), and each group gets one function (``masks(snapshot, files)``;
    ``fns[id(f)] = (function, group number)``). A group whose function cannot be pinned (no
    slot free) is read by the Arrow scan (``kinds`` set to ``"arrow"``; with ``groups``, the
    pruner's kept row groups, all of its row groups)."""
    run: list[DataFile] = []
    rows = 0
    number = 0

    def close() -> None:
        nonlocal number
        if not run:
            return
        fn = masks(snapshot, list(run))
        number += 1
        for f in run:
            if fn is None:
                kinds[id(f)] = "arrow"
                if groups is not None and id(f) not in groups:
                    groups[id(f)] = list(range(f.row_groups))
            else:
                fns[id(f)] = (fn, number)
        run.clear()

    for f in candidates:
        if kinds[id(f)] != "cmask":
            close()
            rows = 0
            continue
        if run and (run[-1].schema_id != f.schema_id
                    or (max_rows is not None and rows + f.rows > max_rows)):
            close()
            rows = 0
        run.append(f)
        rows += f.rows
    close()


def _cmask_part(snapshot: Snapshot, run: list[DataFile], names: list[str], hidden: bool,
                ordinal: dict, rel: Relation, pruner, fns: dict) -> str:
    """One ``SELECT`` reading a group of local files with deleted rows (one written schema,
    one mask slot: :func:`_pin_masks`) with DuckDB's Parquet reader, their deleted rows
    (deletion vectors and deleted row groups) removed by the group's mask
    (:mod:`.maskext`): with the ``"scan"`` kind by the reader itself (``__fsrv_scan``, the
    mask as its deletion filter, applied per vector before any other filter), else by the
    mask function DuckDB evaluates per vector on ``file_row_number`` (and, for a group of
    several files, ``file_index``).

    The mask and the reference's pruning hints as row conditions (which cannot fail on a
    row's value, :func:`_term_sql`) are the only conditions inside, below the barrier
    :data:`BARRIER`: DuckDB pushes no filter through it, so the statement's own expressions
    (a failing CAST, ``error()``) are evaluated only on rows the mask kept; it is a streaming
    operator, so DuckDB still reads the files with all its threads."""
    table = snapshot.table.name
    cols = _select_sql(snapshot.projection(run[0], names))
    conds = [c for _, c in _row_conditions(pruner, snapshot.schema, names)]
    out_cols = ", ".join(_ident(c) for c in names)
    if hidden:
        out_cols += f", {FILE_COLUMN}, {POSITION_COLUMN}"
    paths = []
    for f in run:
        path = snapshot.store.local_path(f.path)
        _check_file(path, f, table, snapshot.version)
        rel.files[path] = (table, f.path, snapshot.version)
        paths.append(_literal(path))
    mask = fns[id(run[0])][0]
    extra = (f", CAST(file_index + {ordinal[id(run[0])]} AS INTEGER) AS {FILE_COLUMN}"
             f", file_row_number AS {POSITION_COLUMN}") if hidden else ""
    # a reference that lists the values it wants (a point read, a DML find) keeps the
    # reader's own filters at their fastest (no deletion filter) and tests the mask on the
    # few rows they keep; any other read has the reader drop the deleted rows
    in_reader = mask.in_scan and not point_set(pruner)
    read = mask.read(paths, _READ_OPTIONS, in_reader)
    if in_reader:  # the reader drops the deleted rows: no position to project or test
        inner = f"SELECT {cols}{extra} FROM {read}"
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        return (f"SELECT {out_cols} FROM (SELECT __fsrv_t.* FROM ({inner}) AS __fsrv_t"
                f"{where}) AS __fsrv_m {BARRIER}")
    fn = mask.function
    if len(run) == 1:
        pos, call = "", f"{fn}(__fsrv_t.__fsrv_fr)"
    else:
        pos, call = ", file_index AS __fsrv_fi", f"{fn}(__fsrv_t.__fsrv_fi, __fsrv_t.__fsrv_fr)"
    inner = f"SELECT {cols}{extra}{pos}, file_row_number AS __fsrv_fr FROM {read}"
    where = " AND ".join([call] + conds)
    return (f"SELECT {out_cols} FROM (SELECT __fsrv_t.* FROM ({inner}) AS __fsrv_t "
            f"WHERE {where}) AS __fsrv_m {BARRIER}")


def _prefetch_conditions(pruner, schema: pa.Schema, names, name: str
                         ) -> tuple[list[str], dict[str, pa.Table]]:
    """The row conditions of a prefetch (:func:`_row_conditions`, long IN lists whole) and
    the value tables they read. A long list of plain integer literals on an integer column
    becomes ``IN (SELECT v FROM <table>)`` over a registered BIGINT table of the same values:
    DuckDB binds a 1,000-literal list in about 40 ms, a table in well under one, and the
    semi join compares exactly as the list would (BIGINT against an integer column)."""
    from flightsrv.engine.prune import IN_LIST_EXACT, _int_list

    conds, lists = [], {}
    for term, cond in _row_conditions(pruner, schema, names, exact_lists=True):
        if term.op == "in" and len(term.operands) > IN_LIST_EXACT and \
                pa.types.is_integer(schema.field(term.column).type):
            ints = _int_list(term.operands)
            if ints is not None:
                table = f"{name}_v{len(lists)}"
                lists[table] = pa.table({"v": pa.array(ints, pa.int64())})
                cond = f"__fsrv_t.{_ident(term.column)} IN (SELECT v FROM {table})"
        conds.append(cond)
    return conds, lists


def _prefetched_part(snapshot: Snapshot, run: list[DataFile], names: list[str],
                     hidden: bool, first: int, name: str, rel: Relation, open_scans: bool,
                     pruner, prefetch, out_schema: pa.Schema) -> str:
    """One ``SELECT`` over a run of local files with deleted rows under a selective filter
    (statistics kept few row groups, or the filter lists the values it wants), read *before*
    the statement runs.

    ``prefetch`` runs engine SQL only (no expression of the statement): the run's projection
    (:func:`_select_sql`, by field id) with ``file_index``/``file_row_number``, the pruning
    hints as row conditions that cannot fail on a row's value (:func:`_term_sql`), so
    DuckDB's reader applies projection, filter and row-group pushdown, and deleted row groups
    removed by ``file_row_number`` ranges. flightsrv then drops the rows the deletion vectors
    name (by position, :func:`~flightsrv.table.deletes.keep_mask`) and registers what is
    left as an Arrow table. The statement reads that table: its expressions can only ever see
    live rows, whatever DuckDB's optimizer does, because deleted rows never reach the
    database it runs in. (The hints are conjuncts of the statement's WHERE, so a row they
    reject could not match; DuckDB still evaluates the whole WHERE on the prefetched rows.)"""
    from flightsrv.table.deletes import keep_mask

    inner, ranges = _native_run(snapshot, run, names, rel)
    cols = ", ".join(_ident(c) for c in names)
    if not open_scans:
        rel.readers[name] = out_schema.empty_table()
    else:
        conds, lists = _prefetch_conditions(pruner, snapshot.schema, names, name)
        if ranges:
            conds.append(f"NOT ({' OR '.join(ranges)})")
        where = f" WHERE {' AND '.join(conds)}" if conds else ""
        # the conditions name the statement's columns, so they apply to the projection
        # (a renamed, cast or re-added column), never to the file's physical columns
        sql = f"SELECT * FROM ({inner}) AS __fsrv_t{where}"
        try:
            got = prefetch(sql, lists)
        except Exception as e:  # noqa: BLE001 - a missing or broken data file, by name
            failure = native_failure(e, rel.files)
            if failure is not None:
                raise failure from None
            raise
        fi = got.column("__fsrv_fi").to_numpy().astype(np.int64, copy=False)
        fr = got.column("__fsrv_fr").to_numpy().astype(np.int64, copy=False)
        keep = np.ones(got.num_rows, dtype=bool)
        for j, f in enumerate(run):
            dead = snapshot.deleted_positions(f)
            if dead is None or not len(dead) or not got.num_rows:
                continue
            mine = np.flatnonzero(fi == j)
            if not len(mine):
                continue
            lo, hi = int(fr[mine].min()), int(fr[mine].max()) + 1
            mask = keep_mask(dead, lo, hi)
            if mask is not None:
                keep[mine] = mask[fr[mine] - lo]
        # the columns as DuckDB produced them (no cast of ours: DuckDB reads them back as
        # the same types)
        fields = [got.schema.field(c) for c in names]
        arrays = [got.column(c) for c in names]
        if hidden:
            fields += [out_schema.field(FILE_COLUMN), out_schema.field(POSITION_COLUMN)]
            arrays += [pa.array((fi + first).astype(np.int32)), pa.array(fr)]
        live = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        if not keep.all():
            live = live.filter(pa.array(keep))
        rel.readers[name] = live
    if hidden:
        cols += f", {FILE_COLUMN}, {POSITION_COLUMN}"
    return f"SELECT {cols} FROM {name}"


def _denied(path: str, table: str, key: str, version: int) -> StoreAccessDenied | None:
    """``StoreAccessDenied`` when the server may not read data file ``path`` (its mode, or
    its directory's): a file it cannot open is not damaged, and its bytes are fine."""
    try:
        with open(path, "rb"):
            return None
    except PermissionError:
        return StoreAccessDenied("the store refused access: fix the permissions of the "
                                 "object or its directory", table=table, object=key,
                                 version=version, error="Permission denied")
    except OSError:
        return None


def native_failure(error: BaseException,
                   files: dict[str, tuple[str, str, int]]) -> BaseException | None:
    """The flightsrv error behind a DuckDB error that names one of the native scan's files
    (or, for a reader error that names none, the first file that is gone or whose footer
    does not decode): ObjectNotFound if it is gone, CorruptObject otherwise (it is not
    valid Parquet), naming the table, object and version. None when no file explains it."""
    msg = str(error)
    for path, (table, key, version) in files.items():
        if path in msg:
            if not os.path.exists(path):
                return ObjectNotFound("data file referenced by the manifest is missing",
                                      table=table, object=key, version=version)
            denied = _denied(path, table, key, version)
            if denied is not None:
                return denied
            first = msg.strip().splitlines()[0] if msg.strip() else type(error).__name__
            first = first.replace(path, key)
            return CorruptObject("data file is not valid Parquet", table=table, object=key,
                                 version=version, error=first)
    if type(error).__name__ in ("Error", "IOException", "InvalidInputException"):
        # a reader error that names no file (a footer DuckDB cannot decode says only
        # "TProtocolException: Invalid data"): find the file whose footer does not read
        import pyarrow.parquet as pq

        for path, (table, key, version) in files.items():
            if not os.path.exists(path):
                return ObjectNotFound("data file referenced by the manifest is missing",
                                      table=table, object=key, version=version)
            denied = _denied(path, table, key, version)
            if denied is not None:
                return denied
            try:
                pq.read_metadata(path)
            except (pa.ArrowException, OSError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else \
                    type(exc).__name__
                return CorruptObject("data file is not valid Parquet", table=table,
                                     object=key, version=version,
                                     error=first.replace(path, key))
    return None


__all__ = ["FILE_COLUMN", "HIDDEN", "POSITION_COLUMN", "Relation", "build", "is_native",
           "native_failure", "native_root", "pushable"]

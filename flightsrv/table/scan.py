"""Scans of a pinned snapshot (docs/PROTOCOL.md §Reading).

A ``Snapshot`` is one manifest version. Its scan:
1. keeps the files and row groups a caller-supplied pruner allows (``file_filter``,
   ``group_filter``: the engine's statistics pruning, which may only skip units that cannot
   match; this layer never evaluates SQL);
2. skips whole row groups marked deleted and never reads them;
3. reads the remaining row groups (only the projected columns) in a small thread pool with
   bounded read-ahead, in order, so memory stays at a few row groups;
4. applies each file's deletion vector per row group by row offset (a keep mask), and can
   add each row's physical position in its file and the file's ordinal (hidden columns the
   engine uses to record which rows a DELETE/UPDATE/MERGE touched).

Data files are write-once under unique keys; a scan reads them pinned to the ETag recorded in
the manifest, so it never mixes versions. Footers are cached by (store, key, etag).

Each file is read under the table's current schema by field id
(:mod:`flightsrv.table.projection`): renamed columns come back under their new names, widened
ones cast, columns added after the file was written hold their default (or NULL).
"""

from __future__ import annotations

import io
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from cachetools import LRUCache

from flightsrv.errors import (
    CorruptObject,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
)
from flightsrv.store.base import arrow_filesystem
from flightsrv.table import projection as proj
from flightsrv.table.deletes import keep_mask, read_dv
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.schema import schema_from_json

#: Names of the hidden columns a scan can add (the engine renames them).
POSITION_COLUMN = "__pos"
FILE_COLUMN = "__file"

_POOL = ThreadPoolExecutor(max_workers=max(4, (os.cpu_count() or 2) * 2),
                           thread_name_prefix="flightsrv-scan")
READ_AHEAD = 4
#: consecutive row groups of one file a pool job reads through one open of the file
GROUPS_PER_READ = 4

_FOOTER_CACHE = 512
#: parsed footers by (store, path, etag), least recently used evicted
_footers: LRUCache = LRUCache(maxsize=_FOOTER_CACHE)
_footers_lock = threading.Lock()  # guards ``_footers`` and ``_sources`` (scan threads share)
#: open native input files by (filesystem, path, size): opening one costs a HEAD request
_sources: LRUCache = LRUCache(maxsize=_FOOTER_CACHE)
#: decoded deletion vectors (sorted positions, read-only arrays) by where the bitmap lives:
#: a tombstone object is written once under a unique key and an inline DV is its own bytes,
#: so an entry never goes stale. Bounded by bytes; a scan, a point query and a DELETE each
#: read every DV they touch, which cost an object read and a decode per file each time.
_DV_CACHE_BYTES = 64 << 20
_dvs: LRUCache = LRUCache(maxsize=_DV_CACHE_BYTES, getsizeof=lambda a: max(a.nbytes, 64))
_dvs_lock = threading.Lock()


class StoreFile(io.RawIOBase):
    """A read-only, seekable file over one object version (ranged GETs pinned to its ETag)."""

    def __init__(self, store, key: str, etag: str, size: int):
        self.store, self.key, self.etag, self._size = store, key, etag, size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self.store.get_range(self.key, self._pos, end, etag=self.etag)
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def _native_source(store, f: DataFile, table: str, version: int | None = None):
    """The data file opened through the store's native Arrow filesystem (parallel, coalesced
    ranged reads in C++), or None when the store has none. Data files are immutable under
    their unique keys, so the key pins the version; the size is checked against the
    manifest."""
    got = arrow_filesystem(store)
    if got is None:
        return None
    fs, root = got
    path = f"{root}/{f.path}"
    key = (id(fs), path, f.size)
    with _footers_lock:
        source = _sources.get(key)
        if source is not None:
            return source
    try:
        source = fs.open_input_file(path)
    except FileNotFoundError:
        raise ObjectNotFound("data file referenced by the manifest is missing", table=table,
                             object=f.path, version=version) from None
    except OSError as exc:
        raise StoreError("reading a data file failed", table=table, object=f.path,
                         version=version,
                         error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                         ) from None
    if source.size() != f.size:
        raise CorruptObject("data file size differs from the manifest", table=table,
                            object=f.path, version=version, expected=f.size,
                            actual=source.size())
    with _footers_lock:  # ranged reads of an S3 input file are independent: share it
        _sources[key] = source
    return source


def native_reader(store, files: list[DataFile], row_groups: list[list[int]],
                  schema: pa.Schema, *, table: str = "?",
                  version: int | None = None) -> pa.RecordBatchReader | None:
    """The rows of some data files (each file's ``row_groups`` only; ``schema``: the columns
    to read, as written) through the store's native Arrow filesystem and pyarrow's dataset
    scanner, or None when the store has no native filesystem. Each file is checked first
    (present, the manifest's size; see :func:`_native_source`); data files are write-once
    under unique keys, so the key pins the version. The scanner reads the files' row groups
    in parallel with coalesced ranged reads in C++; a file that fails to read surfaces as
    ``ObjectNotFound`` or ``CorruptObject`` naming it, as the other read paths do."""
    import pyarrow.dataset as pads

    got = arrow_filesystem(store)
    if got is None:
        return None
    fs, root = got
    fmt = pads.ParquetFileFormat(
        default_fragment_scan_options=pads.ParquetFragmentScanOptions(pre_buffer=True))
    fragments = []
    for f, groups in zip(files, row_groups):
        _native_source(store, f, table, version)
        fragments.append(fmt.make_fragment(f"{root}/{f.path}", fs, row_groups=list(groups),
                                           file_size=f.size))
    dataset = pads.FileSystemDataset(fragments, schema=schema, format=fmt, filesystem=fs)
    reader = dataset.scanner(columns=schema.names, use_threads=True).to_reader()

    def batches():
        try:
            yield from reader
        except (pa.ArrowException, OSError) as exc:
            raise _read_failure(store, files, root, table, version, exc) from None

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def _read_failure(store, files: list[DataFile], root: str, table: str, version: int | None,
                  exc: BaseException) -> Exception:
    """The flightsrv error for a failed native read of one of ``files``."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    for f in files:
        if f.path in text:
            try:
                store.head(f.path)
                store.get_range(f.path, 0, 1)  # a file the server may not read: not damaged
            except ObjectNotFound:
                return ObjectNotFound("data file referenced by the manifest is missing",
                                      table=table, object=f.path, version=version)
            except StoreAccessDenied as denied:
                return denied.with_context(table=table, object=f.path, version=version)
            detail = text.split(": ", 1)[-1] if f"{root}/{f.path}" in first else first
            return CorruptObject("data file is not valid Parquet", table=table, object=f.path,
                                 version=version, error=detail.replace(f"{root}/", ""))
    return StoreError("reading data files failed", table=table, version=version,
                      error=first.replace(f"{root}/", ""))


def open_parquet(store, f: DataFile, *, table: str = "?",
                 version: int | None = None) -> pq.ParquetFile:
    """Open a data file of the manifest (of ``version``, named in errors), pinned to its
    recorded ETag. Decode its row groups with :func:`read_row_group`."""
    if f.inline is not None:
        return _open_inline(f, table, version)
    cache_key = (store.uri, f.path, f.etag)
    with _footers_lock:
        md = _footers.get(cache_key)
    try:
        local = store.local_path(f.path)
        if local is not None:
            source = pa.memory_map(local, "r")
            if source.size() != f.size:
                raise CorruptObject("data file size differs from the manifest", table=table,
                                    object=f.path, version=version, expected=f.size,
                                    actual=source.size())
        else:
            source = _native_source(store, f, table, version)
            if source is None:
                source = pa.PythonFile(StoreFile(store, f.path, f.etag, f.size), mode="r")
        pf = pq.ParquetFile(source, metadata=md, pre_buffer=local is None)
    except (FileNotFoundError, ObjectNotFound):
        raise ObjectNotFound("data file referenced by the manifest is missing", table=table,
                             object=f.path, version=version) from None
    except PreconditionFailed:
        raise CorruptObject("data file changed under its key (ETag mismatch)", table=table,
                            object=f.path, version=version, etag=f.etag) from None
    except PermissionError:  # the server may not read it: not damaged
        raise StoreAccessDenied("the store refused access: fix the permissions of the object "
                                "or its directory", table=table, object=f.path,
                                version=version, error="Permission denied") from None
    except StoreAccessDenied as exc:
        raise exc.with_context(table=table, object=f.path, version=version) from None
    except (pa.ArrowException, OSError) as exc:
        raise _undecodable(f, table, version, exc) from None
    if md is None:
        with _footers_lock:
            _footers[cache_key] = pf.metadata
    return pf


def _open_inline(f: DataFile, table: str, version: int | None) -> pq.ParquetFile:
    """An inlined data file (docs/PROTOCOL.md §18): its Parquet bytes are in the entry."""
    import base64
    import binascii

    try:
        raw = base64.b64decode(f.inline, validate=True)
    except (binascii.Error, ValueError):
        raise CorruptObject("inlined data file is not valid base64", table=table,
                            object=f.path, version=version) from None
    if len(raw) != f.size:
        raise CorruptObject("inlined data file size differs from its entry", table=table,
                            object=f.path, version=version, expected=f.size, actual=len(raw))
    try:
        return pq.ParquetFile(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as exc:
        raise _undecodable(f, table, version, exc) from None


#: decoded inlined files (every column, as written) by their bytes: an entry's bytes are
#: its identity, so an entry never goes stale. Bounded by bytes.
_INLINE_CACHE_BYTES = 64 << 20
_inline_tables: LRUCache = LRUCache(maxsize=_INLINE_CACHE_BYTES,
                                    getsizeof=lambda v: max(v[1], 64))


def inline_row_group(f: DataFile, rg: int, columns: list[str] | None, *, table: str = "?",
                     version: int | None = None) -> pa.Table:
    """Row group ``rg`` of inlined file ``f`` (``columns``: physical names), from a cache of
    decoded inlined files."""
    with _footers_lock:
        hit = _inline_tables.get(f.inline)
    if hit is None:
        pf = _open_inline(f, table, version)
        groups = tuple(read_row_group(pf, f, g, None, table=table, version=version)
                       for g in range(pf.metadata.num_row_groups))
        hit = (groups, sum(t.nbytes for t in groups) + len(f.inline))
        if hit[1] <= _INLINE_CACHE_BYTES // 8:
            with _footers_lock:
                _inline_tables[f.inline] = hit
    if rg >= len(hit[0]):
        raise CorruptObject("inlined data file has fewer row groups than its entry",
                            table=table, object=f.path, version=version, row_group=rg)
    t = hit[0][rg]
    return t if columns is None else t.select(columns)


def _undecodable(f: DataFile, table: str, version: int | None,
                 exc: BaseException, **context) -> CorruptObject:
    """The error for a data file whose bytes do not decode: it names the table, the object
    and the version, and the decoder's reason in one line (no class names, no paths)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else "undecodable bytes"
    return CorruptObject("data file is not valid Parquet", table=table, object=f.path,
                         version=version, **context, error=first)


def read_row_group(pf: pq.ParquetFile, f: DataFile, rg: int, columns: list[str] | None, *,
                   table: str = "?", version: int | None = None) -> pa.Table:
    """Row group ``rg`` of data file ``f`` (opened by :func:`open_parquet`). Damaged bytes
    (a page that does not decompress or decode) raise ``CorruptObject`` naming the table,
    object, version and row group: the footer parsing at open time does not see them."""
    try:
        return pf.read_row_group(rg, columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise _undecodable(f, table, version, exc, row_group=rg) from None


def _bool_array(mask: np.ndarray) -> pa.BooleanArray:
    """A numpy bool mask as an Arrow boolean array, bit-packed by numpy (several times
    cheaper than ``pa.array(mask)``'s element-wise conversion)."""
    bits = np.packbits(mask, bitorder="little")
    return pa.BooleanArray.from_buffers(pa.bool_(), len(mask), [None, pa.py_buffer(bits)])


def _filter(t: pa.Table, keep: pa.BooleanArray) -> pa.Table:
    """``t.filter(keep)``, column by column when every column is one chunk: Arrow's filter
    of a whole table first turns the mask into indices and takes each column, which costs
    two to three times a direct filter of each column at a 1% deletion rate."""
    if t.num_columns and all(c.num_chunks == 1 for c in t.columns):
        return pa.Table.from_arrays([c.chunk(0).filter(keep) for c in t.columns],
                                    schema=t.schema)
    return t.filter(keep)


@dataclass
class FileTask:
    file: DataFile
    row_groups: list[int]  # to read, in order
    deleted: np.ndarray | None  # sorted deleted positions (int64), or None
    ordinal: int = 0  # the file's index in the caller's file list (the hidden file column)


#: what one :class:`Snapshot` keeps of what it derived from its (immutable) manifest:
#: this many projections and :data:`SNAPSHOT_DERIVED_ENTRIES` :meth:`Snapshot.derived`
#: values; the least recently used go first
SNAPSHOT_PROJECTIONS = 256
SNAPSHOT_DERIVED_ENTRIES = 64
_MISSING = object()


class Snapshot:
    """One pinned version of a table. ``physical``: every stored row, deleted or not (deletion
    vectors and deleted row groups are ignored; a splice erases those rows too).

    A snapshot never changes: ``Table.snapshot`` hands the same object to every statement
    that pins the same version, so what it derives from its manifest (the schema, each
    file's projection, :meth:`derived` values) is computed once per version, not once per
    statement."""

    def __init__(self, table, manifest: Manifest, *, physical: bool = False):
        self.table = table
        self.manifest = manifest
        self.version = manifest.version
        self.schema = schema_from_json(manifest.schema)
        self.physical = physical
        self._projections: LRUCache = LRUCache(maxsize=SNAPSHOT_PROJECTIONS)
        self._derived: LRUCache = LRUCache(maxsize=SNAPSHOT_DERIVED_ENTRIES)
        self._memo_lock = threading.Lock()

    def projection(self, f: DataFile, columns) -> tuple:
        """How to read ``columns`` of ``f`` (see :mod:`flightsrv.table.projection`)."""
        key = (f.schema_id, tuple(columns))
        with self._memo_lock:
            p = self._projections.get(key)
        if p is None:
            p = proj.projection(self.manifest, f.schema_id, columns)
            with self._memo_lock:
                self._projections[key] = p
        return p

    def derived(self, key: tuple, make):
        """``make()``, kept under ``key`` for this snapshot's life: for values that are a
        function of the pinned manifest and ``key`` alone (the caller's key names everything
        else they depend on); at most :data:`SNAPSHOT_DERIVED_ENTRIES` are kept. The value is
        shared by every statement that pins this version: never change it, except to fill
        in more of what is a function of the key (a dict of per-file facts)."""
        with self._memo_lock:
            hit = self._derived.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        value = make()
        with self._memo_lock:
            self._derived[key] = value
        return value

    def files(self, keep_chunks=None) -> list[DataFile]:
        """The version's data files, in order; ``keep_chunks(refs) -> refs`` may skip whole
        manifest chunks by their summaries (format 2: only kept chunks are read)."""
        files = self.manifest.data_files
        if hasattr(files, "select"):
            return files.select(keep_chunks)
        return list(files)

    def live(self, f: DataFile) -> DataFile:
        """``f`` as this snapshot reads it (with ``physical``: without its deletes)."""
        if self.physical and (f.dv is not None or f.deleted_row_groups):
            import dataclasses

            return dataclasses.replace(f, dv=None, deleted_row_groups=())
        return f

    def __repr__(self) -> str:
        return f"Snapshot(table={self.table.name!r}, version={self.version})"

    @property
    def store(self):
        return self.table.store

    def count_rows(self) -> int:
        """Exact live row count from metadata alone."""
        return self.manifest.live_rows

    def deleted_positions(self, f: DataFile) -> np.ndarray | None:
        if f.dv is None or f.dv.cardinality == 0 or self.physical:
            return None
        dv = f.dv
        key = (self.store.uri, dv.storage, dv.path, dv.offset, dv.length, dv.data,
               dv.cardinality)
        with _dvs_lock:
            cached = _dvs.get(key)
        if cached is not None:
            return cached
        bitmap = read_dv(self.store, dv, table=self.table.name, data_file=f.path,
                         version=self.manifest.version)
        # int64, not uint64: numpy compares a uint64 array with a Python int by converting the
        # whole array to float64, which made every per-row-group searchsorted O(deletes).
        positions = np.asarray(bitmap.to_array(), dtype=np.int64)
        positions.flags.writeable = False  # shared by every reader of this DV
        if positions.nbytes <= _DV_CACHE_BYTES // 4:
            with _dvs_lock:
                _dvs[key] = positions
        return positions

    def plan(self, file_filter=None, group_filter=None, *, with_deletes: bool = True,
             files=None) -> Iterator[FileTask]:
        """Files and row groups that may hold live rows a caller wants, in manifest order.

        ``file_filter(files) -> files`` and ``group_filter(file, footer, groups) -> groups``
        may drop units that cannot match (statistics pruning); ``files`` restricts the scan
        to some of the snapshot's files. Each task's ``ordinal`` is its file's index in the
        list considered (``files`` or the manifest's)."""
        candidates = [self.live(f) for f in (self.manifest.data_files if files is None
                                             else files)]
        ordinals = {id(f): i for i, f in enumerate(candidates)}
        live = [f for f in candidates if f.live_rows > 0]
        if file_filter is not None:
            live = file_filter(live)
        for f in live:
            dead = set(f.deleted_row_groups)
            groups = [i for i in range(f.row_groups) if i not in dead]
            if group_filter is not None and groups:
                md = open_parquet(self.store, f, table=self.table.name,
                                  version=self.version).metadata
                groups = group_filter(f, md, groups)
            if not groups:
                continue
            yield FileTask(f, groups, self.deleted_positions(f) if with_deletes else None,
                           ordinals[id(f)])

    def _read_groups(self, task: FileTask, rgs: list[int], columns: list[str],
                     positions: str | None, file_col: str | None) -> list[pa.Table]:
        """Row groups ``rgs`` of one task's file, live rows only, read through one open of
        the file (opening costs about as much as decoding a small column of a row group)."""
        inlined = task.file.inline is not None
        pf = None if inlined else open_parquet(self.store, task.file, table=self.table.name,
                                               version=self.version)
        reads = self.projection(task.file, columns)
        wanted = proj.read_columns(reads)
        out = []
        for rg in rgs:
            if inlined:
                t = inline_row_group(task.file, rg, wanted, table=self.table.name,
                                     version=self.version)
            else:
                t = read_row_group(pf, task.file, rg, wanted, table=self.table.name,
                                   version=self.version)
            if reads:
                t = pa.Table.from_arrays(proj.apply(t, reads), names=list(columns))
            start = task.file.row_group_offsets[rg]
            if positions is not None:
                t = t.append_column(positions, pa.array(np.arange(start, start + t.num_rows,
                                                                  dtype=np.int64)))
            if task.deleted is not None:
                mask = keep_mask(task.deleted, start, start + t.num_rows)
                if mask is not None:
                    t = _filter(t, _bool_array(mask))
            if file_col is not None:
                t = t.append_column(file_col, pa.array(np.full(t.num_rows, task.ordinal,
                                                               dtype=np.int32)))
            out.append(t)
        return out

    def iter_tables(self, columns: list[str] | None = None, *, tasks=None,
                    positions: str | None = None,
                    file_col: str | None = None) -> Iterator[tuple[FileTask, pa.Table]]:
        """(task, table) per surviving row group, in file/row-group order. ``positions`` /
        ``file_col`` name the hidden columns to add (None: not added). Row groups are read
        in the scan's thread pool, :data:`GROUPS_PER_READ` consecutive ones of a file per
        job, up to :data:`READ_AHEAD` jobs ahead of the consumer."""
        cols = list(self.schema.names) if columns is None else list(columns)
        work = ((task, task.row_groups[i:i + GROUPS_PER_READ])
                for task in (tasks if tasks is not None else self.plan())
                for i in range(0, len(task.row_groups), GROUPS_PER_READ))
        pending: deque = deque()

        def ready():
            t_task, fut = pending.popleft()
            for t in fut.result():
                yield t_task, t

        for task, rgs in work:
            pending.append((task, _POOL.submit(self._read_groups, task, rgs, cols, positions,
                                               file_col)))
            if len(pending) >= READ_AHEAD:
                yield from ready()
        while pending:
            yield from ready()

    def scan(self, columns: list[str] | None = None, *, tasks=None,
             positions: str | None = None, file_col: str | None = None,
             batch_size: int | None = None) -> pa.RecordBatchReader:
        """A streaming reader of live rows (all of them, or those of ``tasks``), with the
        hidden columns ``positions`` / ``file_col`` appended when named."""
        if columns is not None:
            unknown = [c for c in columns if c not in self.schema.names]
            if unknown:
                from flightsrv.errors import ConfigurationError
                raise ConfigurationError("unknown column in projection", table=self.table.name,
                                         columns=",".join(unknown))
        fields = [self.schema.field(c) for c in (self.schema.names if columns is None
                                                  else columns)]
        if positions is not None:
            fields.append(pa.field(positions, pa.int64(), nullable=False))
        if file_col is not None:
            fields.append(pa.field(file_col, pa.int32(), nullable=False))
        schema = pa.schema(fields)
        tables = self.iter_tables(columns, tasks=tasks, positions=positions, file_col=file_col)

        def batches():
            for _, t in tables:
                if t.num_rows == 0:
                    continue
                t = t.cast(schema) if t.schema != schema else t
                yield from t.to_batches(max_chunksize=batch_size)

        return pa.RecordBatchReader.from_batches(schema, batches())

    def take(self, positions: dict[str, np.ndarray], columns: list[str] | None = None, *,
             files=None) -> pa.Table:
        """The rows at the given physical positions (sorted int64, per data file path) of
        this snapshot's files, in file order (``files``, default the manifest's) and position
        order: the rows a caller (the DML planner, after DuckDB found them) already knows it
        wants, with every column, read by field id under the current schema. Reads only the
        row groups that hold such a position, in the scan's thread pool."""
        cols = list(self.schema.names) if columns is None else list(columns)
        schema = pa.schema([self.schema.field(c) for c in cols])
        listed = list(self.manifest.data_files if files is None else files)
        by_path = {f.path: f for f in listed}
        work = []
        for path, pos in positions.items():
            f = by_path[path]
            if len(pos) == 0:
                continue
            offsets = np.asarray(f.row_group_offsets, dtype=np.int64)
            groups = np.searchsorted(offsets, pos, side="right") - 1
            bounds = np.flatnonzero(np.diff(groups)) + 1
            for chunk in np.split(np.arange(len(pos)), bounds):
                rg = int(groups[chunk[0]])
                work.append((f, rg, pos[chunk] - offsets[rg]))
        order = {f.path: i for i, f in enumerate(listed)}
        work.sort(key=lambda w: (order[w[0].path], w[1]))

        def read(f: DataFile, rg: int, local: np.ndarray) -> pa.Table:
            pf = open_parquet(self.store, f, table=self.table.name, version=self.version)
            reads = self.projection(f, cols)
            t = read_row_group(pf, f, rg, proj.read_columns(reads), table=self.table.name,
                               version=self.version)
            if reads:
                t = pa.Table.from_arrays(proj.apply(t, reads), names=cols)
            t = t.take(pa.array(local, pa.int64()))
            return t.cast(schema) if t.schema != schema else t

        parts = [fut.result() for fut in [_POOL.submit(read, *w) for w in work]]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def read_now(self, columns: list[str] | None = None, *, tasks,
                 positions: str | None = None, file_col: str | None = None) -> pa.Table:
        """Like :meth:`scan` of ``tasks``, read whole in the calling thread (for a few small
        files, such as inlined ones, where handing each to the pool costs more than it
        reads)."""
        reader = self.scan(columns, tasks=[], positions=positions, file_col=file_col)
        schema = reader.schema
        cols = list(self.schema.names) if columns is None else list(columns)
        parts = [t for task in tasks
                 for t in self._read_groups(task, task.row_groups, cols, positions, file_col)
                 if t.num_rows]
        parts = [t.cast(schema) if t.schema != schema else t for t in parts]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def to_table(self, columns: list[str] | None = None) -> pa.Table:
        return self.scan(columns).read_all()

"""Streams Arrow data into write-once Parquet data files (ZSTD or Snappy per column,
``compression=auto``: :func:`column_codecs`) with statistics.

Files roll over at ``target_file_size`` bytes; row groups hold about ``row_group_bytes`` of
uncompressed data and at most ``row_group_rows`` rows (defaults: files of hundreds of MiB
for S3 per the seed design; row groups of DuckDB's own 122,880 rows unless the rows are so
wide that 16 MiB come first: a point read decodes a row group of the column it filters on,
6.3-6.7 ms over 279,620-row groups against 3.9-4.2 ms over 122,880-row ones, with no loss to
a full scan; benchmarks/RESULTS.md, thirteenth session). Memory stays bounded by one row
group plus the writer's buffers: input larger than memory streams through.

Encodings: a top-level column is dictionary-encoded only when the first batch says it pays
(:func:`dictionary_columns`: its distinct values plus one index per row take less room than
its plain values, the test parquet-java applies after a column's first page). Columns of
mostly distinct values (ids, measurements) are written plain: Arrow would otherwise build a
dictionary of up to 1 MiB per column chunk, then fall back to plain anyway, which cost about
40 % of the encode time and made such files larger. Nested columns keep dictionaries.

Keys: ``data/YYYY/MM/DD/HH/<id>.parquet`` from the injected clock and id source. On the local
store the file is written in place on the store's filesystem and linked into its key; on S3
it is spooled to a local temp file and uploaded (multipart for large files).

Layout (:class:`WriteLayout`): data files hold the schema's *physical* column names with
every field id as the Parquet field id; statistics are keyed by field id; each file records
the schema id and partition spec it was written with. A partitioned table's rows are split
by their partition values (``flightsrv.table.partition``): every file holds one partition.
Partitioned writes keep one open file per partition, at most ``MAX_OPEN_PARTITIONS`` at a
time (the least recently used one is finished first) and buffer at most about four row
groups of rows in all (the largest buffer is written out as a row group first).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flightsrv.runtime import Runtime
from flightsrv.store.base import ObjectStore, PutMode
from flightsrv.table.manifest import UNPARTITIONED, DataFile, schema_with_ids
from flightsrv.table.properties import PROPERTIES, value
from flightsrv.errors import SchemaMismatch
from flightsrv.table.schema import (
    has_stats,
    physical_arrow_schema,
    physical_name,
    schema_from_json,
    schema_to_json,
    stat_to_json,
)
from flightsrv.table.stored import (
    INFINITY,
    check_readable,
    holds_milliseconds,
    stored_schema,
    to_stored,
)

DEFAULT_TARGET_FILE_SIZE = PROPERTIES["target_file_size"].default
DEFAULT_ROW_GROUP_BYTES = PROPERTIES["row_group_bytes"].default  # uncompressed; ~2-8 MiB zstd
MAX_ROW_GROUP_ROWS = 1 << 20
MAX_OPEN_PARTITIONS = 64
#: rows of the first batch that decide each column's dictionary encoding (about what
#: parquet-java decides on: a first page, at most 20,000 rows); a first batch under
#: ``DICTIONARY_MIN_SAMPLE`` rows decides nothing (every column keeps a dictionary). Counting
#: 16k rows' distinct values costs ~1 ms a column, 64k rows' cost ~4x that.
DICTIONARY_SAMPLE_ROWS = 1 << 14
DICTIONARY_MIN_SAMPLE = 4096
#: ``compression=auto``: a column (a Parquet leaf) is written with ZSTD when ZSTD shrinks its
#: encoded pages in the sample to at most this fraction, with Snappy otherwise. ZSTD decodes
#: at about 1.3 GB/s a core in DuckDB 2.0.1 where Snappy over bytes it could not shrink is
#: a copy: a sum over 10M random doubles (ZSTD keeps 94% of their bytes) took 57 ms from
#: ZSTD files and 27 ms from the same files with that column in Snappy, 1% larger
#: (benchmarks/RESULTS.md, thirteenth session)
AUTO_ZSTD_RATIO = 0.8
#: ``compression=auto`` decides from a sample written with ZSTD, about 3 ms for a batch of
#: 10,000 five-column rows (a third of such an append), and the dictionary choice from a
#: sample's distinct values (~3 ms more): each decision is kept per table and written schema
#: (the codecs also per dictionary choice) for this many more writes of this process, then
#: taken again from the next write's own sample; at most ``AUTO_DECISIONS`` are kept
AUTO_REUSE = 32
AUTO_DECISIONS = 256


@dataclass(frozen=True)
class WriteLayout:
    """What a writer writes: the table schema (with field ids and ``schema_id``), the
    partition spec rows are split by, and optionally a fixed partition to stamp on every
    file without computing it (rewrites of one file, whose rows share its partition)."""

    schema: dict
    spec: dict = None  # type: ignore[assignment]
    fixed_partition: tuple | None = None  # (spec_id, values)

    def __post_init__(self):
        if self.spec is None:
            object.__setattr__(self, "spec", dict(UNPARTITIONED))

    @classmethod
    def of(cls, schema, spec: dict | None = None) -> "WriteLayout":
        """From a manifest's schema JSON (with ids) or a plain Arrow schema (ids 1..n)."""
        if isinstance(schema, WriteLayout):
            return schema
        if isinstance(schema, pa.Schema):
            schema, _ = schema_with_ids(schema_to_json(schema))
        elif "schema_id" not in schema or any("id" not in f for f in schema["fields"]):
            schema, _ = schema_with_ids(schema, int(schema.get("schema_id", 0)))
        return cls(schema, spec)

    @classmethod
    def from_manifest(cls, m) -> "WriteLayout":
        return cls(m.schema, m.partition_spec)

    @property
    def arrow(self) -> pa.Schema:
        return schema_from_json(self.schema)

    @property
    def schema_id(self) -> int:
        return int(self.schema.get("schema_id", 0))

    @property
    def partitioned(self) -> bool:
        return bool(self.spec["fields"]) and self.fixed_partition is None


@dataclass(frozen=True)
class WriteOptions:
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    compression: str = PROPERTIES["compression"].default
    compression_level: int | None = None
    data_page_bytes: int = PROPERTIES["data_page_bytes"].default
    row_group_rows: int = PROPERTIES["row_group_rows"].default

    @classmethod
    def from_properties(cls, props: dict) -> "WriteOptions":
        """From table properties (typed by ``flightsrv.table.properties``)."""
        return cls(target_file_size=value(props, "target_file_size"),
                   row_group_bytes=value(props, "row_group_bytes"),
                   row_group_rows=value(props, "row_group_rows"),
                   compression=value(props, "compression"),
                   data_page_bytes=value(props, "data_page_bytes"))


def data_key(runtime: Runtime) -> str:
    t = dt.datetime.fromtimestamp(runtime.clock.now_ms() / 1000, tz=dt.timezone.utc)
    return f"data/{t:%Y/%m/%d/%H}/{runtime.ids.new_id()}.parquet"


def file_stats(md: pq.FileMetaData, layout, nans: dict[str, int] | None = None
               ) -> tuple[tuple[int, ...], dict]:
    """Row-group offsets and per-column min/max/null count from a Parquet footer, keyed by
    field id (``layout``: a :class:`WriteLayout`, a schema JSON with ids, or an Arrow
    schema, whose columns get ids 1..n).

    Parquet min/max leave NaN out, so a float column's bounds say nothing about NaN rows;
    ``nans`` (NaN count per float column, by physical name, counted while writing) is
    recorded as ``"nans"`` so that a reader can tell a NaN-free file (bounds are then exact)
    from an unknown one."""
    layout = WriteLayout.of(layout)
    offsets, row = [], 0
    agg: dict[str, dict] = {}
    top = {physical_name(f): (str(f["id"]), pa_type) for f, pa_type in
           zip(layout.schema["fields"], layout.arrow.types) if has_stats(pa_type)}
    names = {}
    for rg_i in range(md.num_row_groups):
        rg = md.row_group(rg_i)
        offsets.append(row)
        row += rg.num_rows
        for ci in range(rg.num_columns):
            col = rg.column(ci)
            name = col.path_in_schema
            if name not in top:
                continue
            names[name] = True
            s = col.statistics
            a = agg.setdefault(name, {"min": None, "max": None, "nulls": 0, "ok": True})
            if s is None:
                a["ok"] = False
                continue
            a["nulls"] = a["nulls"] + (s.null_count or 0) if s.has_null_count else None \
                if a["nulls"] is None else a["nulls"]
            if not s.has_min_max:
                if s.has_null_count and s.null_count == rg.num_rows:
                    continue  # all-null row group: no bounds needed
                a["ok"] = False
                continue
            t = top[name][1]
            try:
                if pa.types.is_date(t) or pa.types.is_timestamp(t):
                    # raw integers: no Python datetime holds a BC date, a year past 9999 or
                    # ±infinity, all of which DuckDB stores
                    lo, hi = _raw_bound(s.min_raw, t, md, ci, up=False), \
                        _raw_bound(s.max_raw, t, md, ci, up=True)
                else:
                    lo, hi = s.min, s.max
            except (OverflowError, ValueError):
                a["ok"] = False  # no bounds: the column is never pruned on
                continue
            a["min"] = lo if a["min"] is None or lo < a["min"] else a["min"]
            a["max"] = hi if a["max"] is None or hi > a["max"] else a["max"]
    stats = {}
    for name, a in agg.items():
        fid, t = top[name]
        entry = {"nulls": a["nulls"]}
        if nans is not None and name in nans:
            entry["nans"] = nans[name]
        if a["ok"] and (pa.types.is_date(t) or pa.types.is_timestamp(t)):
            entry["min"], entry["max"] = a["min"], a["max"]  # already days / ticks
        elif a["ok"]:
            entry["min"] = stat_to_json(a["min"], t, is_max=False)
            entry["max"] = stat_to_json(a["max"], t, is_max=True)
        stats[fid] = entry
    return tuple(offsets), stats


_PARQUET_UNITS = {"MILLIS": "ms", "MICROS": "us", "NANOS": "ns", "milliseconds": "ms",
                  "microseconds": "us", "nanoseconds": "ns"}
_TICKS = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}


def _raw_bound(raw: int, t: pa.DataType, md: pq.FileMetaData, i: int, *, up: bool) -> int:
    """A date's or timestamp's footer bound (the raw integer of Parquet column ``i``) in the
    statistics encoding of column type ``t``: days, or ticks of ``t``'s unit. A timestamp in
    seconds is stored in milliseconds (:mod:`flightsrv.table.stored`): a maximum is rounded
    up, a minimum down, ±infinity kept."""
    raw = int(raw)
    if pa.types.is_date(t):
        return raw
    import json

    unit = _PARQUET_UNITS.get(
        json.loads(md.schema.column(i).logical_type.to_json()).get("timeUnit"), t.unit)
    if unit == t.unit or abs(raw) == INFINITY:
        return raw
    factor = _TICKS[unit] // _TICKS[t.unit]
    if factor < 1:
        raise ValueError("a file unit coarser than the column's")
    return -(-raw // factor) if up else raw // factor


def _rows_per_group(batch: pa.RecordBatch, row_group_bytes: int,
                    row_group_rows: int = MAX_ROW_GROUP_ROWS) -> int:
    """Rows per row group: ``row_group_bytes`` of ``batch``'s rows, at most
    ``row_group_rows`` (and ``MAX_ROW_GROUP_ROWS``), at least 1,024."""
    cap = min(MAX_ROW_GROUP_ROWS, row_group_rows)
    if batch.num_rows == 0:
        return cap
    per_row = max(1, batch.nbytes // batch.num_rows)
    return int(max(1024, min(cap, row_group_bytes // per_row)))


def dictionary_columns(sample: pa.RecordBatch | pa.Table, physical: pa.Schema
                       ) -> bool | list[str]:
    """What to dictionary-encode (pyarrow's ``use_dictionary``: True for every column, or a
    list of Parquet column paths), decided from up to ``DICTIONARY_SAMPLE_ROWS`` rows of
    ``sample`` (columns in the order of ``physical``).

    A flat column gets a dictionary when ``distinct values + one index per row`` is smaller
    than its plain values in the sample; every leaf of a nested column keeps one (as before),
    and so does a column whose distinct values Arrow cannot count. A sample of fewer than
    ``DICTIONARY_MIN_SAMPLE`` rows looks distinct whatever the column holds: True."""
    sample = sample.slice(0, DICTIONARY_SAMPLE_ROWS)
    rows = sample.num_rows
    if rows < DICTIONARY_MIN_SAMPLE:
        return True
    paths: list[str] = []
    nested = False
    for field, col in zip(physical, sample.columns):
        if pa.types.is_nested(field.type):
            nested = True
            continue
        if pa.types.is_boolean(field.type):
            continue  # Arrow never dictionary-encodes booleans
        try:
            distinct = len(pc.unique(col))
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            paths.append(field.name)
            continue
        plain = col.nbytes
        if plain * distinct / rows + rows * max(1, distinct.bit_length()) / 8 < plain:
            paths.append(field.name)
    if nested:  # the leaves' Parquet paths (``a.list.element``, ...), as pyarrow names them
        buf = io.BytesIO()
        pq.write_table(physical.empty_table(), buf)
        md = pq.read_metadata(io.BytesIO(buf.getvalue()))
        tops = tuple(f.name + "." for f in physical if pa.types.is_nested(f.type))
        paths += [c.path for c in md.schema if c.path.startswith(tops)]
    return paths


def column_codecs(sample: pa.Table | pa.RecordBatch, dictionary: bool | list[str],
                  data_page_bytes: int) -> str | dict[str, str]:
    """pyarrow's ``compression`` for ``compression=auto``: ``"zstd"`` for every column, or a
    codec per Parquet leaf path, decided from up to ``DICTIONARY_SAMPLE_ROWS`` rows of
    ``sample`` (physical columns, as the file stores them) written with ZSTD and the file's
    dictionary choice: a leaf whose compressed pages are more than :data:`AUTO_ZSTD_RATIO`
    of its uncompressed pages gets Snappy (nearly incompressible values, random doubles or
    hashes: ZSTD would save little and cost a decode on every read). A sample of fewer than
    ``DICTIONARY_MIN_SAMPLE`` rows decides nothing: ``"zstd"``."""
    sample = sample.slice(0, DICTIONARY_SAMPLE_ROWS)
    if sample.num_rows < DICTIONARY_MIN_SAMPLE:
        return "zstd"
    if isinstance(sample, pa.RecordBatch):
        sample = pa.Table.from_batches([sample])
    buf = io.BytesIO()
    pq.write_table(sample, buf, compression="zstd", use_dictionary=dictionary,
                   data_page_size=data_page_bytes, write_statistics=False)
    md = pq.read_metadata(io.BytesIO(buf.getvalue()))
    packed: dict[str, list[int]] = {}
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for i in range(rg.num_columns):
            c = rg.column(i)
            sizes = packed.setdefault(c.path_in_schema, [0, 0])
            sizes[0] += c.total_compressed_size
            sizes[1] += c.total_uncompressed_size
    codecs = {path: "zstd" if packed_ <= AUTO_ZSTD_RATIO * plain else "snappy"
              for path, (packed_, plain) in packed.items()}
    if all(c == "zstd" for c in codecs.values()):
        return "zstd"
    return codecs


class _WriteDecisions:
    """The kept write decisions, a table's dictionary choice and ``compression=auto``
    codecs (:data:`AUTO_REUSE`, :data:`AUTO_DECISIONS`): key -> [decision, writes left];
    least recently used dropped first. Thread-safe."""

    def __init__(self, max_entries: int = AUTO_DECISIONS):
        self._kept: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def decide(self, key, sample_rows: int, decide):
        """The kept decision for ``key`` while it has writes left; else ``decide()`` (kept
        only when the sample had enough rows to decide anything, ``sample_rows``)."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[1] > 0:
                kept[1] -= 1
                self._kept.move_to_end(key)
                return kept[0]
        decision = decide()
        if sample_rows >= DICTIONARY_MIN_SAMPLE:
            with self._lock:
                self._kept[key] = [decision, AUTO_REUSE]
                self._kept.move_to_end(key)
                while len(self._kept) > self.max_entries:
                    self._kept.popitem(last=False)
        return decision

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


#: the process's kept write decisions
WRITE_DECISIONS = _WriteDecisions()


def _rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Regroup a batch stream into tables of exactly ``rows`` rows (the last may be short)."""
    pending: list[pa.RecordBatch] = []
    n = 0
    for b in batches:
        while b.num_rows:
            take = min(rows - n, b.num_rows)
            pending.append(b.slice(0, take))
            n += take
            b = b.slice(take)
            if n == rows:
                yield pa.Table.from_batches(pending)
                pending, n = [], 0
    if n:
        yield pa.Table.from_batches(pending)


class _Sink:
    """One open data file of one partition: its writer and the rows not yet written."""

    def __init__(self, key: str, tmp: str, writer: pq.ParquetWriter, partition: tuple):
        self.key, self.tmp, self.writer, self.partition = key, tmp, writer, partition
        self.pending: list[pa.RecordBatch] = []
        self.rows = 0
        self.bytes = 0
        self.nans: dict[str, int] = {}


class DataFileWriter:
    """Writes one stream into as many data files as ``target_file_size`` (and, for a
    partitioned table, the partitions) require."""

    def __init__(self, store: ObjectStore, layout, runtime: Runtime,
                 options: WriteOptions, version_hint: int = 0):
        self.store = store
        self.layout = WriteLayout.of(layout)
        self.schema = self.layout.arrow  # logical: what callers hand in
        self.physical = physical_arrow_schema(self.layout.schema)
        #: what the files hold: a timestamp in seconds as milliseconds (``table.stored``)
        self.stored = stored_schema(self.physical)
        #: columns holding milliseconds, whose values DuckDB's range bounds
        self._milliseconds = [i for i, f in enumerate(self.stored)
                              if holds_milliseconds(f.type)]
        self.runtime = runtime
        self.options = options
        self.version_hint = version_hint
        self.files: list[DataFile] = []
        #: every key this writer may have created, recorded *before* the object is written,
        #: so that a caller interrupted at any point can delete them all (idempotently)
        self.keys: list[str] = []
        self.bytes_written = 0
        self.rows_written = 0
        self._floats = [f.name for f in self.physical if pa.types.is_floating(f.type)]
        self._nans: dict[str, int] = {}
        #: pyarrow's ``use_dictionary``: every column until ``write`` sees its first batch
        self._dictionary: bool | list[str] = True
        #: pyarrow's ``compression`` (``auto``: ZSTD until ``write`` samples its first batch)
        self._codecs: str | dict[str, str] = \
            "zstd" if options.compression == "auto" else options.compression

    def _to_physical(self, t):
        """A batch/table with the logical names as one with physical names, field ids and
        the types data files store (:mod:`flightsrv.table.stored`)."""
        cols = t.columns
        if self.stored is not self.physical:
            cols = [self._stored_column(c, f) for c, f in zip(cols, self.schema)]
        for i in self._milliseconds:
            try:
                check_readable(cols[i], self.stored.field(i).type)
            except SchemaMismatch as exc:
                raise SchemaMismatch(exc.message, column=self.schema.field(i).name) from None
        if isinstance(t, pa.Table):
            return pa.Table.from_arrays(cols, schema=self.stored)
        return pa.RecordBatch.from_arrays(cols, schema=self.stored)

    @staticmethod
    def _stored_column(col, field: pa.Field):
        try:
            return to_stored(col, field.type)
        except SchemaMismatch as exc:
            raise SchemaMismatch(exc.message, column=field.name) from None

    def _count_nans(self, group, into: dict | None = None) -> None:
        into = self._nans if into is None else into
        for name in self._floats:
            col = group.column(name)
            n = pc.sum(pc.is_nan(col)).as_py() if col.null_count < len(col) else 0
            into[name] = into.get(name, 0) + (n or 0)

    def _open(self) -> tuple[str, str, pq.ParquetWriter]:
        key = data_key(self.runtime)
        if self.store.capabilities.local_files:  # written in place, installed by ``adopt``
            tmp = self.store.new_temp_file()
        else:
            fd, tmp = tempfile.mkstemp(suffix=".parquet", prefix="flightsrv-")
            os.close(fd)
        try:
            level = self.options.compression_level
            if level is not None and isinstance(self._codecs, dict):
                level = {p: level for p, c in self._codecs.items() if c == "zstd"} or None
            w = pq.ParquetWriter(tmp, self.stored, compression=self._codecs,
                                 compression_level=level,
                                 use_dictionary=self._dictionary,
                                 data_page_size=self.options.data_page_bytes,
                                 write_statistics=True, store_schema=True)
        except BaseException:  # interrupted before the caller owns ``tmp``: remove it here
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return key, tmp, w

    def _finish(self, key: str, tmp: str, w: pq.ParquetWriter, partition: tuple = (),
                nans: dict | None = None) -> None:
        nans = self._nans if nans is None else nans
        w.close()
        md = w.writer.metadata
        if md.num_rows == 0:
            os.unlink(tmp)
            nans.clear()
            return
        self.keys.append(key)
        if self.store.capabilities.local_files:
            meta = self.store.adopt(key, tmp, mode=PutMode.CREATE)
        else:
            try:
                meta = self.store.put_file(key, tmp, mode=PutMode.CREATE)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        offsets, stats = file_stats(md, self.layout, nans)
        nans.clear()
        spec_id = int(self.layout.spec.get("spec_id", 0))
        if self.layout.fixed_partition is not None:
            spec_id, partition = self.layout.fixed_partition
        self.files.append(DataFile(
            path=key, size=meta.size, etag=meta.etag, rows=md.num_rows,
            row_group_offsets=offsets, stats=stats, added_version=self.version_hint,
            schema_id=self.layout.schema_id, spec_id=spec_id, partition=tuple(partition),
        ))
        self.bytes_written += meta.size
        self.rows_written += md.num_rows

    def write(self, batches: Iterable[pa.RecordBatch]) -> list[DataFile]:
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return self.files
        rows = _rows_per_group(first, self.options.row_group_bytes,
                               self.options.row_group_rows)
        table_key = (getattr(self.store, "uri", None), self.layout.schema_id, self.stored)
        # counting a sample's distinct values costs ~1 ms a column: kept as the codecs are
        self._dictionary = WRITE_DECISIONS.decide(
            table_key + ("dictionary",), first.num_rows,
            lambda: dictionary_columns(first, self.physical))
        if self.options.compression == "auto":
            dictionary = self._dictionary
            key = table_key + (tuple(dictionary) if isinstance(dictionary, list)
                               else dictionary, self.options.data_page_bytes)
            self._codecs = WRITE_DECISIONS.decide(
                key, first.num_rows, lambda: column_codecs(
                    self._to_physical(first.slice(0, DICTIONARY_SAMPLE_ROWS)), dictionary,
                    self.options.data_page_bytes))

        def chain():
            yield first
            yield from it

        if self.layout.partitioned:
            return self._write_partitioned(chain(), rows)
        key, tmp, w = self._open()
        try:
            for group in _rebatch(chain(), rows):
                group = self._to_physical(group)
                self._count_nans(group)
                w.write_table(group, row_group_size=rows)
                if os.path.getsize(tmp) >= self.options.target_file_size:
                    self._finish(key, tmp, w)
                    key, tmp, w = self._open()
            self._finish(key, tmp, w)
        except BaseException:
            with contextlib.suppress(Exception):
                w.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return self.files

    # -- partitioned ----------------------------------------------------------------
    def _write_partitioned(self, batches, rows: int) -> list[DataFile]:
        from flightsrv.table.partition import partition_keys

        sinks: OrderedDict[tuple, _Sink] = OrderedDict()
        budget = max(4 * self.options.row_group_bytes, 1)
        held = 0

        def flush(sink: _Sink, whole: bool) -> int:
            """Write the sink's pending rows as row groups (whole: also a short last one).
            Returns the bytes released."""
            if not sink.pending:
                return 0
            table = pa.Table.from_batches(sink.pending)
            keep = table.num_rows if whole else (table.num_rows // rows) * rows
            released = 0
            if keep:
                out = self._to_physical(table.slice(0, keep))
                self._count_nans(out, sink.nans)
                sink.writer.write_table(out, row_group_size=rows)
                released = sink.bytes if keep == table.num_rows else \
                    int(sink.bytes * keep / table.num_rows)
            rest = table.slice(keep)
            sink.pending = rest.to_batches() if rest.num_rows else []
            sink.rows = rest.num_rows
            sink.bytes -= released
            if os.path.getsize(sink.tmp) >= self.options.target_file_size:
                self._finish(sink.key, sink.tmp, sink.writer, sink.partition, sink.nans)
                sink.key, sink.tmp, sink.writer = self._open()
                sink.nans = {}
            return released

        def close(sink: _Sink) -> None:
            sinks.pop(sink.partition, None)
            self._finish(sink.key, sink.tmp, sink.writer, sink.partition, sink.nans)

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                for values, idx in partition_keys(self.layout.spec, self.layout.schema, batch):
                    part = batch.take(idx)
                    sink = sinks.get(values)
                    if sink is None:
                        if len(sinks) >= MAX_OPEN_PARTITIONS:
                            oldest = next(iter(sinks.values()))
                            held -= flush(oldest, True)
                            close(oldest)
                        key, tmp, w = self._open()
                        sink = sinks[values] = _Sink(key, tmp, w, values)
                    sinks.move_to_end(values)
                    sink.pending.append(part)
                    sink.rows += part.num_rows
                    sink.bytes += part.nbytes
                    held += part.nbytes
                    if sink.rows >= rows:
                        held -= flush(sink, False)
                    while held > budget and sinks:
                        big = max(sinks.values(), key=lambda s: s.bytes)
                        if not big.bytes:
                            break
                        held -= flush(big, True)
            for sink in list(sinks.values()):
                flush(sink, True)
                close(sink)
        except BaseException:
            for sink in sinks.values():
                with contextlib.suppress(Exception):
                    sink.writer.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(sink.tmp)
            raise
        return self.files

"""Streams Arrow data into write-once Parquet data files (ZSTD) with statistics.

Files roll over at ``target_file_size`` bytes; row groups hold about ``row_group_bytes`` of
uncompressed data (defaults suit S3 per the seed design: files of hundreds of MiB, row groups
of a few MiB compressed). Memory stays bounded by one row group plus the writer's buffers:
input larger than memory streams through.

Keys: ``data/YYYY/MM/DD/HH/<id>.parquet`` from the injected clock and id source. On the local
store the file is written in place on the store's filesystem and linked into its key; on S3
it is spooled to a local temp file and uploaded (multipart for large files).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flightsrv.runtime import Runtime
from flightsrv.store.base import ObjectStore, PutMode
from flightsrv.table.manifest import DataFile
from flightsrv.table.properties import PROPERTIES, value
from flightsrv.table.schema import has_stats, stat_to_json

DEFAULT_TARGET_FILE_SIZE = PROPERTIES["target_file_size"].default
DEFAULT_ROW_GROUP_BYTES = PROPERTIES["row_group_bytes"].default  # uncompressed; ~2-8 MiB zstd
MAX_ROW_GROUP_ROWS = 1 << 20


@dataclass(frozen=True)
class WriteOptions:
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES
    compression: str = PROPERTIES["compression"].default
    compression_level: int | None = None

    @classmethod
    def from_properties(cls, props: dict) -> "WriteOptions":
        """From table properties (typed by ``flightsrv.table.properties``)."""
        return cls(target_file_size=value(props, "target_file_size"),
                   row_group_bytes=value(props, "row_group_bytes"),
                   compression=value(props, "compression"))


def data_key(runtime: Runtime) -> str:
    t = dt.datetime.fromtimestamp(runtime.clock.now_ms() / 1000, tz=dt.timezone.utc)
    return f"data/{t:%Y/%m/%d/%H}/{runtime.ids.new_id()}.parquet"


def file_stats(md: pq.FileMetaData, schema: pa.Schema,
               nans: dict[str, int] | None = None) -> tuple[tuple[int, ...], dict]:
    """Row-group offsets and per-column min/max/null count from a Parquet footer.

    Parquet min/max leave NaN out, so a float column's bounds say nothing about NaN rows;
    ``nans`` (NaN count per float column, counted while writing) is recorded as ``"nans"``
    so that a reader can tell a NaN-free file (bounds are then exact) from an unknown one."""
    offsets, row = [], 0
    agg: dict[str, dict] = {}
    top = {f.name: f for f in schema if has_stats(f.type)}
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
            lo, hi = s.min, s.max
            a["min"] = lo if a["min"] is None or lo < a["min"] else a["min"]
            a["max"] = hi if a["max"] is None or hi > a["max"] else a["max"]
    stats = {}
    for name, a in agg.items():
        t = top[name].type
        entry = {"nulls": a["nulls"]}
        if nans is not None and name in nans:
            entry["nans"] = nans[name]
        if a["ok"]:
            entry["min"] = stat_to_json(a["min"], t, is_max=False)
            entry["max"] = stat_to_json(a["max"], t, is_max=True)
        stats[name] = entry
    return tuple(offsets), stats


def _rows_per_group(batch: pa.RecordBatch, row_group_bytes: int) -> int:
    if batch.num_rows == 0:
        return MAX_ROW_GROUP_ROWS
    per_row = max(1, batch.nbytes // batch.num_rows)
    return int(max(1024, min(MAX_ROW_GROUP_ROWS, row_group_bytes // per_row)))


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


class DataFileWriter:
    """Writes one stream into as many data files as ``target_file_size`` requires."""

    def __init__(self, store: ObjectStore, schema: pa.Schema, runtime: Runtime,
                 options: WriteOptions, version_hint: int = 0):
        self.store = store
        self.schema = schema
        self.runtime = runtime
        self.options = options
        self.version_hint = version_hint
        self.files: list[DataFile] = []
        #: every key this writer may have created, recorded *before* the object is written,
        #: so that a caller interrupted at any point can delete them all (idempotently)
        self.keys: list[str] = []
        self.bytes_written = 0
        self.rows_written = 0
        self._floats = [f.name for f in schema if pa.types.is_floating(f.type)]
        self._nans: dict[str, int] = {}

    def _count_nans(self, group: pa.Table) -> None:
        for name in self._floats:
            col = group.column(name)
            n = pc.sum(pc.is_nan(col)).as_py() if col.null_count < len(col) else 0
            self._nans[name] = self._nans.get(name, 0) + (n or 0)

    def _open(self) -> tuple[str, str, pq.ParquetWriter]:
        key = data_key(self.runtime)
        tmp = self.store.new_temp_file() if hasattr(self.store, "new_temp_file") else None
        if tmp is None:
            fd, tmp = tempfile.mkstemp(suffix=".parquet", prefix="flightsrv-")
            os.close(fd)
        try:
            w = pq.ParquetWriter(tmp, self.schema, compression=self.options.compression,
                                 compression_level=self.options.compression_level,
                                 write_statistics=True, store_schema=True)
        except BaseException:  # interrupted before the caller owns ``tmp``: remove it here
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return key, tmp, w

    def _finish(self, key: str, tmp: str, w: pq.ParquetWriter) -> None:
        w.close()
        md = w.writer.metadata
        if md.num_rows == 0:
            os.unlink(tmp)
            self._nans = {}
            return
        self.keys.append(key)
        if self.store.local_path(key) is not None and hasattr(self.store, "adopt"):
            meta = self.store.adopt(key, tmp, mode=PutMode.CREATE)
        else:
            try:
                meta = self.store.put_file(key, tmp, mode=PutMode.CREATE)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        offsets, stats = file_stats(md, self.schema, self._nans)
        self._nans = {}
        self.files.append(DataFile(
            path=key, size=meta.size, etag=meta.etag, rows=md.num_rows,
            row_group_offsets=offsets, stats=stats, added_version=self.version_hint,
        ))
        self.bytes_written += meta.size
        self.rows_written += md.num_rows

    def write(self, batches: Iterable[pa.RecordBatch]) -> list[DataFile]:
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return self.files
        rows = _rows_per_group(first, self.options.row_group_bytes)

        def chain():
            yield first
            yield from it

        key, tmp, w = self._open()
        try:
            for group in _rebatch(chain(), rows):
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

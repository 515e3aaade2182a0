"""Data inlining (docs/PROTOCOL.md §18): small appends live in the manifest chunks.

An append of at most ``inline.max_rows`` rows (table property; 0, the default, turns
inlining off) whose encoded bytes stay within ``inline.max_bytes`` is written exactly as a
data file would be (the same writer, statistics, partition split), but its Parquet bytes go
into the data-file entry itself (``DataFile.inline``, base64) under a key ``inline/<id>.parquet``
that names no object. Everything that works on data-file entries (positions, deletion
vectors, statistics pruning, chunk trees, time travel, compaction's carry-over, erasure's
replacement) works on inlined entries unchanged; what reads bytes reads them from the entry
(:func:`flightsrv.table.scan.open_parquet`). A version that reaches an inlined entry is
written as format 3, which format-2 readers refuse.

:func:`take_small` decides whether a stream is small without reading more than
``inline.max_rows`` + 1 rows of it; :func:`write_inline` encodes the small rows;
:func:`needs_flush` says when a version holds enough inlined rows that
:func:`flightsrv.table.maintenance.flush.flush_inlined` should turn them into Parquet.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa

from flightsrv.store.base import ObjectMeta, PutMode, StoreCapabilities
from flightsrv.table.datafile import INLINE_PREFIX, DataFile
from flightsrv.table.properties import value


#: the most bytes one inlined append may hold whatever ``inline.max_bytes`` says: chunks are
#: cached by count (``ChunkStore``), so an entry's size bounds the cache's bytes
MAX_INLINE_BYTES = 1 << 20


@dataclass(frozen=True)
class InlineSettings:
    max_rows: int
    max_bytes: int
    flush_rows: int
    flush_files: int

    @classmethod
    def of(cls, props: dict) -> "InlineSettings":
        return cls(int(value(props, "inline.max_rows")),
                   min(int(value(props, "inline.max_bytes")), MAX_INLINE_BYTES),
                   int(value(props, "inline.flush_rows")),
                   int(value(props, "inline.flush_files")))


def enabled(head) -> bool:
    """Whether appends to ``head``'s table may be inlined: format 2 or later, the property
    on, and no mirrors to publish (a Delta or Iceberg reader cannot read an inlined file)."""
    if head is None or head.format_version < 2 or head.properties.get("publish.formats"):
        return False
    return InlineSettings.of(head.properties).max_rows > 0


def take_small(batches: Iterable[pa.RecordBatch], max_rows: int
               ) -> tuple[list[pa.RecordBatch], Iterator[pa.RecordBatch] | None]:
    """Read ``batches`` until more than ``max_rows`` rows were seen. Returns (the batches
    read, None) when the stream ended within the limit, else (the batches read, the rest of
    the stream): the caller chains them and writes a data file as usual."""
    it = iter(batches)
    got: list[pa.RecordBatch] = []
    rows = 0
    for b in it:
        got.append(b)
        rows += b.num_rows
        if rows > max_rows:
            return got, it
    return got, None


class _Capture:
    """The store a ``DataFileWriter`` writes an inlined append into: it keeps each object's
    bytes in memory, by key, and writes nothing anywhere."""

    capabilities = StoreCapabilities(local_files=False)

    def __init__(self, uri: str):
        self.uri = uri
        self.objects: dict[str, bytes] = {}

    def put_file(self, key: str, path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        with open(path, "rb") as fh:
            raw = fh.read()
        self.objects[key] = raw
        return ObjectMeta(key, len(raw), "inline-" + hashlib.sha256(raw).hexdigest()[:32])

    def put(self, key: str, data: bytes, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        self.objects[key] = bytes(data)
        return ObjectMeta(key, len(data), "inline-" + hashlib.sha256(data).hexdigest()[:32])

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


def write_inline(table, batches: list[pa.RecordBatch], head, settings: InlineSettings
                 ) -> list[DataFile] | None:
    """The inlined entries of ``batches`` (rows conformed to ``head``'s schema), or None when
    their encoding is over ``settings.max_bytes`` (the caller writes a data file instead)."""
    from flightsrv.table.writer import DataFileWriter, WriteLayout, WriteOptions

    sink = _Capture(table.store.uri)
    writer = DataFileWriter(sink, WriteLayout.from_manifest(head), table.runtime,
                            WriteOptions.from_properties(head.properties), head.version + 1)
    files = writer.write(b for b in batches if b.num_rows)
    if sum(len(v) for v in sink.objects.values()) > settings.max_bytes:
        return None
    out = []
    for f in files:
        raw = sink.objects[f.path]
        name = os.path.basename(f.path)
        out.append(dataclasses.replace(f, path=INLINE_PREFIX + name,
                                       inline=base64.b64encode(raw).decode("ascii")))
    return out


def needs_flush(m) -> bool:
    """Whether version ``m`` holds more inlined rows or files than its properties allow."""
    if m is None or m.format_version < 2 or m.dropped:
        return False
    files, rows = m.inline
    if not files:
        return False
    s = InlineSettings.of(m.properties)
    return files > s.flush_files or rows > s.flush_rows or (
        s.max_rows == 0 or bool(m.properties.get("publish.formats")))


__all__ = ["InlineSettings", "enabled", "needs_flush", "take_small", "write_inline"]

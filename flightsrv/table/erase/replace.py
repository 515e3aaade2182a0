"""Building the replacement object for one data file, before any commit.

``_prepare`` (``_replace``) chooses the path per target file:

- **drop**: no row survives, nothing is written;
- **splice** (``flightsrv.table.splice``): re-encode only the touched row groups, copy every
  other byte inside the store (UploadPartCopy, or one-pass ``write_temp_file`` + ``adopt`` on
  a store with local files), new footer;
- **rewrite**: read the surviving rows and write them with ``DataFileWriter``, when the store
  needs equal part sizes (R2), the file is smaller than two minimum parts, or the splice
  engine refuses the file (``SpliceUnsupported``).

The new object keeps the file's own schema, partition spec and partition. Nothing here
commits: ``_discard`` deletes what was written when the commit does not land.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flightsrv.errors import CorruptObject, FlightsrvError, PreconditionFailed
from flightsrv.store.base import ObjectMeta, PutMode
from flightsrv.table.erase.results import FileErasure
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.schema import physical_arrow_schema
from flightsrv.table.stored import from_stored
from flightsrv.table.splice import Copy, SpliceUnsupported, assemble, rewrite_row_groups
from flightsrv.table.writer import (
    DataFileWriter,
    WriteLayout,
    WriteOptions,
    data_key,
    file_stats,
)

log = logging.getLogger("flightsrv.erase")


def _group_split(f: DataFile, positions: np.ndarray) -> dict[int, np.ndarray]:
    """File positions → {row group: positions within the group}."""
    offsets = np.asarray(f.row_group_offsets, dtype=np.int64)
    groups = np.searchsorted(offsets, positions, side="right") - 1
    out = {}
    for g in np.unique(groups):
        out[int(g)] = positions[groups == g] - offsets[g]
    return out


@dataclass
class Target:
    """One data file of an erasure plan and the rows to remove from it."""

    file: DataFile  # as seen in the planning snapshot
    remove: np.ndarray  # sorted old positions to drop (int64)


@dataclass
class Replacement:
    """What replaces a target: its new files (written, not yet committed) and the report."""

    target: Target
    new_files: list[DataFile]  # uncommitted, in row order
    report: FileErasure


def _metadata_from_footer(footer: bytes) -> pq.FileMetaData:
    frame = b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1"
    return pq.read_metadata(pa.BufferReader(frame))


def _rewrite_reason(store, f: DataFile) -> str | None:
    if f.inline is not None:  # its bytes live in the manifest (PROTOCOL.md §18)
        return "inlined rows: the survivors are written as a data file"
    if getattr(store, "equal_part_sizes", False):
        return "store needs equal part sizes"
    min_part = int(getattr(store, "min_part_size", 0) or 0)
    if min_part and f.size < 2 * min_part:
        return "file smaller than two minimum parts"
    return None


def _assemble(store, plan, key: str) -> ObjectMeta:
    """``splice.assemble``, except on a store with local files: there the store writes the
    new file in one pass (``write_temp_file``: copied ranges stay inside the kernel, the
    source pinned to the plan's ETag) and installs it with ``adopt`` (CREATE), instead of
    parts that the local multipart emulation copies twice."""
    if not store.capabilities.local_files:
        return assemble(store, plan, key)
    tmp = store.new_temp_file()
    try:
        pieces = [(p.src_start, p.src_end) if isinstance(p, Copy) else p.data
                  for p in plan.parts]
        store.write_temp_file(tmp, pieces, source_key=plan.source_key,
                              source_etag=plan.source_etag)
        meta = store.adopt(key, tmp, mode=PutMode.CREATE)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if meta.size != plan.new_size:
        store.delete(key)
        raise CorruptObject("spliced object has the wrong size", key=key,
                            expected=plan.new_size, found=meta.size)
    return meta


def _splice(table, snap, t: Target) -> Replacement:
    f = t.file
    page = WriteOptions.from_properties(snap.manifest.properties).data_page_bytes
    plan = rewrite_row_groups(table.store, f.path, f.etag, f.size, _group_split(f, t.remove),
                              data_page_size=page)
    key = data_key(table.runtime)
    meta = _assemble(table.store, plan, key)
    # the spliced object keeps the file's own columns: its schema, spec and partition
    layout = _file_layout(snap.manifest, f)
    offsets, stats = file_stats(_metadata_from_footer(plan.footer), layout)
    nf = DataFile(path=key, size=meta.size, etag=meta.etag, rows=plan.new_num_rows,
                  row_group_offsets=offsets, stats=stats, added_version=0,
                  schema_id=f.schema_id, spec_id=f.spec_id, partition=tuple(f.partition))
    return Replacement(t, [nf], FileErasure(
        f.path, (key,), plan.path, plan.old_num_rows - plan.new_num_rows, f.size, meta.size,
        plan.bytes_downloaded, plan.bytes_uploaded, plan.bytes_copied,
        "" if plan.path == "splice" else "no byte range could be copied"))


def _file_layout(m: Manifest, f: DataFile) -> WriteLayout:
    """How ``f`` was written: its schema (by ``schema_id``), spec and partition."""
    return WriteLayout(m.schema_by_id(f.schema_id), m.partition_spec,
                       fixed_partition=(f.spec_id, tuple(f.partition)))


def _rewrite(table, snap, t: Target, reason: str) -> Replacement:
    """Copy-on-write: read the surviving rows, write them with the table's writer."""
    from flightsrv.table.scan import open_parquet, read_row_group

    f = t.file
    pf = open_parquet(table.store, f, table=table.name, version=snap.version)
    # rewritten with the schema (physical columns), spec and partition it was written with
    layout = _file_layout(snap.manifest, f)
    schema = layout.arrow
    physical = physical_arrow_schema(layout.schema)
    read = {"bytes": 0}

    def batches():
        for g in range(f.row_groups):
            start, n = f.row_group_offsets[g], f.row_group_rows(g)
            lo, hi = np.searchsorted(t.remove, [start, start + n])
            if hi - lo == n:
                continue  # every row of the group goes: never read it
            rg = pf.metadata.row_group(g)
            read["bytes"] += sum(rg.column(j).total_compressed_size for j in range(rg.num_columns))
            tbl = read_row_group(pf, f, g, physical.names, table=table.name,
                                 version=snap.version)
            tbl = pa.Table.from_arrays([from_stored(c, t) for c, t in
                                        zip(tbl.columns, schema.types)], names=schema.names)
            if hi > lo:
                keep = np.ones(n, dtype=bool)
                keep[t.remove[lo:hi] - start] = False
                tbl = tbl.filter(pa.array(keep))
            tbl = tbl.cast(schema) if tbl.schema != schema else tbl
            yield from tbl.to_batches()

    writer = DataFileWriter(table.store, layout, table.runtime,
                            WriteOptions.from_properties(snap.manifest.properties),
                            snap.version + 1)
    files = writer.write(batches())
    return Replacement(t, files, FileErasure(
        f.path, tuple(x.path for x in files), "rewrite", len(t.remove), f.size,
        writer.bytes_written, read["bytes"], writer.bytes_written, 0, reason))


def _prepare(table, snap, t: Target) -> Replacement:
    """The replacement of ``t.file``. A data file whose bytes changed under its key (a
    pinned read fails) or do not decode raises ``CorruptObject`` naming the table, the
    object and the planning version."""
    try:
        return _replace(table, snap, t)
    except PreconditionFailed:  # data files are written once: a changed one is damaged
        raise CorruptObject("data file changed under its key (ETag mismatch)",
                            table=table.name, object=t.file.path, version=snap.version,
                            etag=t.file.etag) from None
    except CorruptObject as exc:
        if "table" in exc.context:
            raise
        detail = {k: v for k, v in exc.context.items()
                  if k not in ("store", "key", "object", "table", "version")}
        written = exc.context.get("key")
        if written not in (None, t.file.path):  # about the new object, not the source
            detail["written"] = written
        raise CorruptObject(exc.message, table=table.name, object=t.file.path,
                            version=snap.version, **detail) from None


def _replace(table, snap, t: Target) -> Replacement:
    f = t.file
    if len(t.remove) >= f.rows:
        return Replacement(t, [], FileErasure(f.path, (), "drop", f.rows, f.size, 0, 0, 0, 0))
    reason = _rewrite_reason(table.store, f)
    if reason is None:
        try:
            return _splice(table, snap, t)
        except SpliceUnsupported as exc:
            reason = f"splice unsupported: {exc.message}"
            log.info("splice refused, rewriting", extra={"table": table.name,
                                                         "object": f.path, "why": str(exc)})
    return _rewrite(table, snap, t, reason)


def _discard(table, prepared: list[Replacement]) -> None:
    """Delete objects written for a commit that did not land (best effort)."""
    head = table.log.head()
    live = {f.path for f in head.data_files} if head else set()
    for p in prepared:
        for nf in p.new_files:
            if nf.path not in live:
                try:
                    table.store.delete(nf.path)
                except FlightsrvError as exc:  # vacuum finds it later
                    log.warning("could not delete an uncommitted object",
                                extra={"table": table.name, "object": nf.path, "error": str(exc)})

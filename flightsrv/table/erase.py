"""Hard erasure: physically remove rows from data files (docs/ERASURE.md).

Layers, top to bottom:

- **Who decides which rows.** ``purge(table)`` (``Table.purge``, SQL ``PURGE t``): every row
  already marked deleted (DVs, deleted row groups). A ``DELETE`` with ``delete_mode =
  'splice'`` (SQL, ``Table.delete(where, mode="splice")``, Spark): the stored rows DuckDB
  finds for its WHERE (:mod:`flightsrv.engine.dml`). Both build a *positions plan* on a
  pinned snapshot.
- **The physical splice.** ``splice_positions(table, snapshot, plan)`` takes an
  already-decided plan ``{data file path: BitMap64 of row positions}`` and removes those rows
  (plus the dead rows of every row group it re-encodes anyway) in one commit. Per affected
  file F:
  1. build a new object under a new ``data/YYYY/MM/DD/HH/<id>.parquet`` key:
     - **splice** (``flightsrv.table.splice``): re-encode only the touched row groups, copy
       every other byte inside the store (UploadPartCopy / ``copy_file_range``), new footer;
     - **rewrite**: read F's surviving rows and write them with ``DataFileWriter``, when the
       store needs equal part sizes (R2), the file is smaller than two minimum parts, or the
       splice engine refuses the file (``SpliceUnsupported``);
     - **drop**: no row survives, nothing is written;
  2. one commit swaps F for its replacement. The mutator re-validates against each head:
     F gone from the head (compacted, spliced by someone else) → what was written is deleted
     and ``StalePlan`` is raised (``erase_positions`` re-plans on a new snapshot); rows
     deleted in the head but not removed (a concurrent DV delete) are carried to the new file
     as a DV at their shifted positions, so no delete is lost and no deleted row comes back.
- **Completion and proof** (``flightsrv.table.erasure_check``): older versions still reach
  F. With ``expire=True`` the versions that reach an erased object or carry request text are
  expired, the objects deleted, and stale unreferenced objects swept; then the store is
  re-read and the result says ``erased`` only if nothing holding the rows is left.
  A certificate (``flightsrv.table.certificate``) records it under ``_erasures/``.

The commit summary names the path taken per file and the bytes downloaded, uploaded and
copied. The request is recorded only as its keyed fingerprint (``request_fingerprint``,
``flightsrv.table.fingerprint``), never as text or an unkeyed hash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from flightsrv.errors import (
    CommitConflict,
    ConfigurationError,
    CorruptObject,
    FlightsrvError,
)
from flightsrv.store.base import ObjectMeta, PutMode
from flightsrv.table import erasure_check as check
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import dead_positions, place, remap_positions
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.splice import Copy, SpliceUnsupported, assemble, rewrite_row_groups
from flightsrv.table.schema import physical_arrow_schema
from flightsrv.table.writer import (
    DataFileWriter,
    WriteLayout,
    WriteOptions,
    data_key,
    file_stats,
)

__all__ = ["ErasedCount", "ErasedObject", "FileErasure", "PurgeResult", "StalePlan",
           "erase_positions", "purge", "splice_positions"]

log = logging.getLogger("flightsrv.erase")

MAX_REPLANS = 5
#: Unreferenced objects younger than this may be writes in flight: an erasure with expire
#: leaves them (and reports them). Table property ``erasure.orphan_grace`` overrides.
DEFAULT_ORPHAN_GRACE = dt.timedelta(hours=1)
ORPHAN_GRACE_PROPERTY = "erasure.orphan_grace"


class _Replan(Exception):
    """A file the erasure targets left the head (internal to the commit mutator)."""


class StalePlan(CommitConflict):
    """A file a positions plan targets is no longer in the head (rewritten concurrently):
    the positions mean nothing there. Re-plan on a new snapshot (``erase_positions`` does)."""


# -- results -------------------------------------------------------------------------


@dataclass(frozen=True)
class FileErasure:
    """What happened to one data file."""

    old_path: str
    new_paths: tuple[str, ...]
    path: str  # "splice" | "rewrite" | "drop"
    rows_removed: int  # physically gone from the bytes
    old_size: int
    new_size: int
    bytes_downloaded: int
    bytes_uploaded: int
    bytes_copied: int
    reason: str = ""  # why a rewrite was chosen over a splice

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"new_paths": list(self.new_paths)}


@dataclass(frozen=True)
class ErasedObject:
    """An object that held erased rows: a replaced data file ("data"), an earlier copy
    rewritten away before ("history"), or an old DV object ("dv", row positions only).
    ``referenced_by`` lists the retained versions that still reach it; ``deleted`` is True
    once the verification found it gone from the store."""

    key: str
    kind: str
    referenced_by: tuple[int, ...]
    deleted: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"referenced_by": list(self.referenced_by)}


@dataclass
class PurgeResult:
    table: str
    operation: str  # "splice_delete" | "purge" | "delete_matching"
    version: int | None  # the committed erasure version (None: nothing to rewrite)
    rows_deleted: int = 0  # rows this commit turned from live to deleted
    rows_removed: int = 0  # rows whose bytes left the data files
    files: list[FileErasure] = field(default_factory=list)
    objects: list[ErasedObject] = field(default_factory=list)
    expired_versions: list[int] = field(default_factory=list)
    read_version: int | None = None
    table_uuid: str | None = None
    fingerprint: str | None = None  # the request's keyed fingerprint (purge: None)
    covers: list[str] = field(default_factory=list)  # fingerprints of deletes it erased
    source: str = "python"
    head_before: int | None = None
    head_after: int | None = None
    redacted_version: int | None = None  # a clean head committed over request text
    deleted_objects: list[str] = field(default_factory=list)
    uploads_aborted: list[str] = field(default_factory=list)
    verification: check.Verification | None = None
    certificate: str | None = None  # key of the stored certificate
    started_at_ms: int | None = None
    committed_at_ms: int | None = None

    @property
    def status(self) -> str:
        """"erased" once the verification found nothing that still holds the rows."""
        return self.verification.status if self.verification is not None else check.PENDING

    @property
    def complete(self) -> bool:
        """True when the re-read store holds no erased row (``status == "erased"``)."""
        return self.status == check.ERASED

    @property
    def retained_versions(self) -> list[int]:
        """Retained versions that still reach erased bytes (time travel would show them)."""
        return sorted({v for o in self.objects if not o.deleted and o.kind != "dv"
                       for v in o.referenced_by})

    def to_dict(self) -> dict:
        ver = self.verification
        return {
            "table": self.table, "operation": self.operation, "version": self.version,
            "rows_deleted": self.rows_deleted, "rows_removed": self.rows_removed,
            "status": self.status, "complete": self.complete,
            "retained_versions": self.retained_versions,
            "expired_versions": list(self.expired_versions),
            "request_fingerprint": self.fingerprint, "certificate": self.certificate,
            "files": [f.to_dict() for f in self.files],
            "objects": [o.to_dict() for o in self.objects],
            "objects_deleted": len(self.deleted_objects),
            "verification": None if ver is None else {
                "objects_scanned": ver.objects_scanned, "matches": ver.matches,
                "manifests_read": len(ver.manifests), "objects_listed": sum(ver.listed.values()),
                "pending": ver.pending},
        }


class ErasedCount(int):
    """The row count ``Table.delete`` returns, with the full ``PurgeResult`` attached."""

    result: PurgeResult

    def __new__(cls, n: int, result: PurgeResult):
        obj = super().__new__(cls, n)
        obj.result = result
        return obj


# -- positions -----------------------------------------------------------------------


def _dead_positions(table, f: DataFile) -> np.ndarray:
    """Sorted old positions (int64) dead in ``f`` (``deletes.dead_positions`` as an array)."""
    return np.asarray(dead_positions(table, f).to_array(), dtype=np.int64)


def _group_split(f: DataFile, positions: np.ndarray) -> dict[int, np.ndarray]:
    """File positions → {row group: positions within the group}."""
    offsets = np.asarray(f.row_group_offsets, dtype=np.int64)
    groups = np.searchsorted(offsets, positions, side="right") - 1
    out = {}
    for g in np.unique(groups):
        out[int(g)] = positions[groups == g] - offsets[g]
    return out


# -- building the replacement --------------------------------------------------------


@dataclass
class _Target:
    file: DataFile  # as seen in the planning snapshot
    remove: np.ndarray  # sorted old positions to drop (int64)


@dataclass
class _Prepared:
    target: _Target
    new_files: list[DataFile]  # uncommitted, in row order
    report: FileErasure


def _metadata_from_footer(footer: bytes) -> pq.FileMetaData:
    frame = b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1"
    return pq.read_metadata(pa.BufferReader(frame))


def _rewrite_reason(store, f: DataFile) -> str | None:
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


def _splice(table, snap, t: _Target) -> _Prepared:
    f = t.file
    plan = rewrite_row_groups(table.store, f.path, f.etag, f.size, _group_split(f, t.remove))
    key = data_key(table.runtime)
    meta = _assemble(table.store, plan, key)
    # the spliced object keeps the file's own columns: its schema, spec and partition
    layout = _file_layout(snap.manifest, f)
    offsets, stats = file_stats(_metadata_from_footer(plan.footer), layout)
    nf = DataFile(path=key, size=meta.size, etag=meta.etag, rows=plan.new_num_rows,
                  row_group_offsets=offsets, stats=stats, added_version=0,
                  schema_id=f.schema_id, spec_id=f.spec_id, partition=tuple(f.partition))
    return _Prepared(t, [nf], FileErasure(
        f.path, (key,), plan.path, plan.old_num_rows - plan.new_num_rows, f.size, meta.size,
        plan.bytes_downloaded, plan.bytes_uploaded, plan.bytes_copied,
        "" if plan.path == "splice" else "no byte range could be copied"))


def _file_layout(m: Manifest, f: DataFile) -> WriteLayout:
    """How ``f`` was written: its schema (by ``schema_id``), spec and partition."""
    return WriteLayout(m.schema_by_id(f.schema_id), m.partition_spec,
                       fixed_partition=(f.spec_id, tuple(f.partition)))


def _rewrite(table, snap, t: _Target, reason: str) -> _Prepared:
    """Copy-on-write: read the surviving rows, write them with the table's writer."""
    from flightsrv.table.scan import open_parquet

    f = t.file
    pf = open_parquet(table.store, f, table=table.name)
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
            tbl = pf.read_row_group(g, columns=physical.names, use_threads=False)
            tbl = pa.Table.from_arrays(tbl.columns, names=schema.names)
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
    return _Prepared(t, files, FileErasure(
        f.path, tuple(x.path for x in files), "rewrite", len(t.remove), f.size,
        writer.bytes_written, read["bytes"], writer.bytes_written, 0, reason))


def _prepare(table, snap, t: _Target) -> _Prepared:
    f = t.file
    if len(t.remove) >= f.rows:
        return _Prepared(t, [], FileErasure(f.path, (), "drop", f.rows, f.size, 0, 0, 0, 0))
    reason = _rewrite_reason(table.store, f)
    if reason is None:
        try:
            return _splice(table, snap, t)
        except SpliceUnsupported as exc:
            reason = f"splice unsupported: {exc.message}"
            log.info("splice refused, rewriting", extra={"table": table.name,
                                                         "object": f.path, "why": str(exc)})
    return _rewrite(table, snap, t, reason)


def _discard(table, prepared: list[_Prepared]) -> None:
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


# -- the commit ----------------------------------------------------------------------


def _mutator(table, snap, prepared: list[_Prepared], operation: str, extra: dict, out: dict):
    targets = {p.target.file.path: p for p in prepared}

    def mutate(head: Manifest | None) -> Manifest:
        head = require_table(head, table.name)
        by_path = head.files_by_path()
        for path, p in targets.items():
            hf = by_path.get(path)
            if hf is None or hf.etag != p.target.file.etag:
                raise _Replan()
        version = head.version + 1
        carried_over: dict[str, BitMap64] = {}  # new file -> positions deleted meanwhile
        replaced: dict[str, list[DataFile]] = {}
        newly_deleted = 0
        old_dv_objects: set[str] = set()
        for path, p in targets.items():
            hf = by_path[path]
            if hf.dv_object:
                old_dv_objects.add(hf.dv_object)
            dead = _dead_positions(table, hf)
            remove = p.target.remove
            newly_deleted += int(len(remove) - np.isin(remove, dead, assume_unique=True).sum())
            # deletions that landed after the plan read the file: carry them over
            carried = remap_positions(remove, dead)
            entries, base = [], 0
            for nf in p.new_files:
                here = carried[(carried >= base) & (carried < base + nf.rows)] - base
                base += nf.rows
                if len(here) >= nf.rows:
                    continue  # every row of this new file was deleted meanwhile
                nf = dataclasses.replace(nf, added_version=version)
                if len(here):
                    carried_over[nf.path] = BitMap64(here.astype(np.uint64))
                    nf = dataclasses.replace(nf, stats_wide=True)
                entries.append(nf)
            replaced[path] = entries
        dvs = place(table, carried_over)
        replaced = {k: [dataclasses.replace(f, dv=dvs[f.path]) if f.path in dvs else f
                        for f in v] for k, v in replaced.items()}
        files: list[DataFile] = []
        for f in head.data_files:
            files.extend(replaced.get(f.path, [f]))
        rows_removed = sum(p.report.rows_removed for p in prepared)
        summary = {
            "rows_added": 0, "rows_deleted": newly_deleted,
            "files_added": sum(len(v) for v in replaced.values()),
            "files_removed": len(replaced), "rows_purged": rows_removed,
            "read_version": snap.version,
            "bytes_downloaded": sum(p.report.bytes_downloaded for p in prepared),
            "bytes_uploaded": sum(p.report.bytes_uploaded for p in prepared),
            "bytes_copied": sum(p.report.bytes_copied for p in prepared),
            "erase": [{"file": p.report.old_path, "path": p.report.path,
                       "new": list(p.report.new_paths), "rows_removed": p.report.rows_removed,
                       "bytes_downloaded": p.report.bytes_downloaded,
                       "bytes_uploaded": p.report.bytes_uploaded,
                       "bytes_copied": p.report.bytes_copied,
                       **({"reason": p.report.reason} if p.report.reason else {})}
                      for p in prepared],
            **extra,
        }
        out.update(newly_deleted=newly_deleted, rows_removed=rows_removed,
                   old_dv_objects=old_dv_objects)
        return dataclasses.replace(head, operation=operation, summary=summary,
                                   data_files=tuple(files))

    return mutate


# -- planning: a positions plan → targets ------------------------------------------


def _targets(table, snap, plan: dict) -> list[_Target]:
    """Validate a positions plan against ``snap`` and widen it to the dead rows of every row
    group it touches (they are re-encoded anyway, so their bytes go too)."""
    by_path = snap.manifest.files_by_path()
    targets = []
    for path, positions in plan.items():
        f = by_path.get(path)
        if f is None:
            raise ConfigurationError("the positions plan names a data file that is not in its "
                                     "snapshot", table=table.name, object=path,
                                     version=snap.version)
        new = np.asarray(BitMap64(positions).to_array(), dtype=np.int64)
        if not len(new):
            continue
        if new[-1] >= f.rows:
            raise ConfigurationError("the positions plan names a row past the end of the file",
                                     table=table.name, object=path, rows=f.rows,
                                     position=int(new[-1]))
        dead = _dead_positions(table, f)
        touched = np.unique(np.searchsorted(f.row_group_offsets, new, side="right") - 1)
        dead_groups = np.searchsorted(f.row_group_offsets, dead, side="right") - 1
        targets.append(_Target(f, np.union1d(new, dead[np.isin(dead_groups, touched)])))
    return targets


# -- the erasure: commit, complete, verify, certify ----------------------------------


def _grace_ms(table, grace) -> int:
    from flightsrv.table.erasure_status import parse_duration_ms

    if grace is None:
        prop = table.properties.get(ORPHAN_GRACE_PROPERTY)
        if prop is None:
            return int(DEFAULT_ORPHAN_GRACE.total_seconds() * 1000)
        return parse_duration_ms(prop, what=ORPHAN_GRACE_PROPERTY, table=table.name)
    if isinstance(grace, dt.timedelta):
        ms = int(grace.total_seconds() * 1000)
    elif isinstance(grace, (int, float)):
        ms = int(grace * 1000)
    else:
        raise ConfigurationError("grace must be a timedelta or seconds", table=table.name,
                                 got=type(grace).__name__)
    if ms < 0:
        raise ConfigurationError("grace must not be negative", table=table.name, seconds=ms / 1000)
    return ms


def _history(table, before: int, may_hold) -> dict[str, str]:
    """Data files of retained versions before ``before`` that the head no longer references
    and that may hold earlier copies of erased rows (e.g. rewritten away by a compaction):
    kind "history". ``may_hold(manifest, data_file)`` narrows them (None: all)."""
    head = require_table(table.log.head(), table.name)
    current = head.referenced_keys()
    out = {}
    for m in check.retained(table):
        if m.version >= before:
            continue
        for f in m.data_files:
            if f.path not in current and f.path not in out and (
                    may_hold is None or may_hold(m, f)):
                out[f.path] = "history"
    return out


def _covers(table, manifests: list[Manifest], erased: set[str]) -> list[str]:
    """Fingerprints of the retained deletes whose rows sat in ``erased`` objects. Versions
    written before fingerprints existed carry the predicate text: it is fingerprinted here."""
    from flightsrv.table.fingerprint import fingerprint

    by_version = {m.version: m for m in manifests}
    out = []
    for m in manifests:
        fp = m.summary.get("request_fingerprint")
        text = m.summary.get("predicate")
        if fp is None and not isinstance(text, str):
            continue
        prev = by_version.get(m.version - 1)
        if prev is None:
            continue
        now = m.files_by_path()
        touched = {f.path for f in prev.data_files
                   if f.path not in now or now[f.path].deleted_rows > f.deleted_rows}
        if touched & erased:
            out.append(fp if fp is not None else fingerprint(table, text))
    return out


def _finish(table, result: PurgeResult, erased: dict[str, str], *, expire: bool, grace,
            all_dead: bool, certificate) -> PurgeResult:
    """Complete (with ``expire``), verify and certify; fills ``result``."""
    grace_ms = _grace_ms(table, grace) if expire else None
    retained = check.retained(table)
    result.covers = _covers(table, retained, {k for k, v in erased.items() if v != "dv"})
    if expire:
        clean = check.clean_head(table)
        if clean is not None:
            result.redacted_version = clean.version
            retained = check.retained(table)
        head = require_table(table.log.head(), table.name)
        unclean = check.unclean_versions(retained, erased, head.version)
        if unclean:
            result.expired_versions = check.expire_through(table, max(unclean))
        result.deleted_objects, result.uploads_aborted = check.sweep(table, erased, grace_ms)
    result.verification = check.verify(table, erased, all_dead=all_dead, grace_ms=grace_ms)
    refs = check.references(table)
    absent = set(result.verification.erased_absent)
    result.objects = [_erased_object(key, kind, refs, absent)
                      for key, kind in sorted(erased.items())]
    head = table.log.head()
    result.head_after = head.version if head is not None else None
    changed = result.version is not None or result.expired_versions or result.deleted_objects \
        or result.redacted_version is not None
    if certificate or (certificate is None and changed):
        from flightsrv.table import certificate as cert

        result.certificate = cert.write(table, cert.build(
            table, result, cert_id=cert.new_id(table.runtime)))
    log.info("erasure", extra={"table": table.name, "operation": result.operation,
                               "version": result.version, "status": result.status,
                               "rows_removed": result.rows_removed,
                               "expired": len(result.expired_versions),
                               "deleted": len(result.deleted_objects)})
    return result


def _erased_object(key: str, kind: str, refs: dict, absent: set) -> ErasedObject:
    return ErasedObject(key, kind, tuple(refs.get(key, ())), key in absent)


def splice_positions(table, snapshot, plan: dict, *, fingerprint: str | None = None,
                     operation: str = "splice_delete", expire: bool = False, grace=None,
                     progress=None, certificate: bool | None = None, source: str = "python",
                     may_hold: Callable | None = None, all_dead: bool = False) -> PurgeResult:
    """Physically delete already-decided rows in one commit, then complete and verify.

    Contract:

    - ``snapshot`` is the pinned ``Snapshot`` the rows were found on; ``plan`` maps the path
      of a data file *of that snapshot* to the row positions (0-based, physical: the file's
      own row order, counting rows a DV already hides) to remove, as a ``BitMap64`` (or
      anything ``BitMap64()`` accepts). Positions past the file's end, or a path not in the
      snapshot, raise ``ConfigurationError`` before anything is written.
    - Every planned row leaves the bytes, whether it was live or already deleted. So do the
      already-deleted rows of each row group that is re-encoded; other row groups keep their
      DV. ``rows_deleted`` counts the planned rows that were live in the head at commit time
      (a row deleted concurrently is not counted twice); ``rows_removed`` counts every row
      whose bytes left.
    - One commit (``operation``), whose summary records ``fingerprint`` as
      ``request_fingerprint`` and never any text. Deletes that land on a target file between
      ``snapshot`` and the commit are carried over to the replacement at shifted positions.
      If a target file is no longer in the head (rewritten concurrently), the objects this
      call wrote are deleted and ``StalePlan`` is raised: the caller re-plans on a new
      snapshot (``erase_positions`` does this for a plan-building function).
    - An empty plan commits nothing; completion and verification still run, so a repeated
      call with ``expire=True`` finishes an earlier erasure of the same rows.
    - Then, with ``expire``: versions that reach a replaced file, an earlier copy
      (``may_hold(manifest, data_file)`` narrows which history files count; default all) or
      request text are expired and those objects deleted; unreferenced objects older than
      ``grace`` (default: table property ``erasure.orphan_grace``, else 1 hour) are swept.
      The store is re-read (``erasure_check.verify``): ``result.status`` is ``"erased"`` only
      when nothing that still holds the rows is stored. ``certificate`` (None: when anything
      changed) stores a record under ``_erasures/``.
    """
    try:
        return _splice_positions(table, snapshot, plan, fingerprint=fingerprint,
                                 operation=operation, expire=expire, grace=grace,
                                 progress=progress, certificate=certificate, source=source,
                                 may_hold=may_hold, all_dead=all_dead)
    finally:
        if progress is not None and hasattr(progress, "finish"):
            progress.finish()


def _splice_positions(table, snapshot, plan: dict, *, fingerprint, operation, expire, grace,
                      progress, certificate, source, may_hold, all_dead) -> PurgeResult:
    started = table.runtime.clock.now_ms()
    targets = _targets(table, snapshot, plan)
    if progress is not None and progress.total is None:
        progress.total = len(targets) or None
    result = PurgeResult(table.name, operation, None, read_version=snapshot.version,
                         table_uuid=snapshot.manifest.table_uuid, fingerprint=fingerprint,
                         source=source, head_before=snapshot.version, started_at_ms=started)
    erased: dict[str, str] = {}
    if targets:
        prepared: list[_Prepared] = []
        out: dict = {}
        extra = {"request_fingerprint": fingerprint} if fingerprint else {}
        try:
            for t in targets:
                prepared.append(_prepare(table, snapshot, t))
                if progress is not None:
                    r = prepared[-1].report
                    progress.advance(1, f"{r.path} {r.old_path}")
            # fold: no chunk may keep the replaced file's entry (its statistics) behind the
            # root's overlay
            committed = table.commit(_mutator(table, snapshot, prepared, operation, extra,
                                              out), fold=True)
        except _Replan:
            _discard(table, prepared)
            raise StalePlan("a data file of the erasure plan was rewritten concurrently",
                            table=table.name, read_version=snapshot.version) from None
        except BaseException:
            _discard(table, prepared)
            raise
        result.version = committed.version
        result.committed_at_ms = committed.created_at_ms
        result.head_before = committed.version - 1
        result.rows_deleted = out["newly_deleted"]
        result.rows_removed = out["rows_removed"]
        result.files = [p.report for p in prepared]
        erased.update({k: "dv" for k in out["old_dv_objects"]})
        erased.update({p.target.file.path: "data" for p in prepared})
        before = committed.version
    else:
        head = require_table(table.log.head(), table.name)
        result.head_before = head.version
        before = head.version + 1
    erased = {**_history(table, before, may_hold), **erased}
    return _finish(table, result, erased, expire=expire, grace=grace, all_dead=all_dead,
                   certificate=certificate)


def erase_positions(table, find: Callable, **kw) -> PurgeResult:
    """``splice_positions`` on a plan ``find(snapshot)`` builds, re-planned on a new
    snapshot (at most ``MAX_REPLANS`` times) while target files keep being rewritten."""
    kw = {"fingerprint": None, "operation": "splice_delete", "expire": False, "grace": None,
          "progress": None, "certificate": None, "source": "python", "may_hold": None,
          "all_dead": False, **kw}
    progress = kw["progress"]
    try:
        for _ in range(MAX_REPLANS):
            snap = table.snapshot()
            try:
                return _splice_positions(table, snap, find(snap), **kw)
            except StalePlan:
                continue
    finally:
        if progress is not None and hasattr(progress, "finish"):
            progress.finish()
    raise CommitConflict("erasure re-planned too often: its files keep being rewritten",
                         table=table.name, operation=kw.get("operation", "splice_delete"),
                         attempts=MAX_REPLANS)


# -- entry points --------------------------------------------------------------------


def purge(table, *, expire: bool = False, grace=None, progress=None,
          certificate: bool | None = None, source: str = "python") -> PurgeResult:
    """Physically remove every row already marked deleted (DVs, deleted row groups).

    With ``expire`` the table reaches the erased state from any starting state: the versions
    that reach a purged file, an earlier copy of any row (every data file older versions
    reference and the head does not) or request text are expired, their objects deleted,
    stale unreferenced objects swept, and the store re-read; see ``splice_positions``.
    Running it again when nothing is left to purge only re-verifies."""

    def find(snap) -> dict:
        return {f.path: dead_positions(table, f)
                for f in snap.manifest.data_files if f.dv is not None or f.deleted_row_groups}

    return erase_positions(table, find, operation="purge", expire=expire, grace=grace,
                           progress=progress, certificate=certificate, source=source,
                           all_dead=True)

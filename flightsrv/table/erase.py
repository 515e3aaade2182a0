"""Hard erasure: physically remove rows from data files (docs/ERASURE.md).

Two entry points, both one commit through the commit loop:

- ``splice_positions(table, base, positions)`` (``DELETE`` with ``delete_mode = 'splice'``,
  ``Table.delete(where, mode="splice")``): the rows DuckDB found (physical positions, decided
  on version ``base``), plus the rows already dead in each touched row group, leave the bytes.
- ``purge(table)`` (``Table.purge()``): every file with a deletion vector or deleted row
  groups loses those rows physically.

Per affected file F (pinned to the snapshot S the work was planned on):

1. *remove* = sorted old positions to drop: for a delete, the predicate's matches plus the
   dead rows (in S) of the row groups that are re-encoded anyway; for a purge, every dead row.
2. Build a new object under a new ``data/YYYY/MM/DD/HH/<id>.parquet`` key:
   - **splice** (``flightsrv.table.splice``): re-encode only the touched row groups, copy every
     other byte inside the store (UploadPartCopy / ``copy_file_range``), new footer;
   - **rewrite**: read F's live rows and write them with ``DataFileWriter``, when the store
     needs equal part sizes (R2), the file is smaller than two minimum parts, or the splice
     engine refuses the file (``SpliceUnsupported``);
   - **drop**: no row survives, nothing is written.
3. One commit swaps F for its replacement. The mutator re-validates against the head it gets:
   - F gone from the head (compacted, spliced by someone else) → delete what was written and
     re-plan from a new snapshot;
   - rows deleted in the head's DV / deleted row groups but not in *remove* (a concurrent
     DV delete) are carried to the new file as a DV at their shifted positions, so no delete
     is lost and no deleted row comes back.

The commit summary names the path taken per file and the bytes downloaded, uploaded and
copied. It never records the predicate text (it may hold the very value being erased), only
its SHA-256.

Erasure completeness: older versions still reference F and its old DV objects. The result
(``PurgeResult``) lists those objects and the retained versions that reference them. With
``expire=True`` those versions (never the head) are expired and the objects deleted once no
retained version references them. Expiry goes through ``maintenance.expire_snapshots``:
every version older than the newest one that reaches erased bytes expires, so the retained
versions stay a contiguous run ending at the head. Multipart uploads left by a crash are
aborted by ``maintenance.vacuum``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from flightsrv.errors import (
    CommitConflict,
    CorruptObject,
    FlightsrvError,
    ObjectNotFound,
    PreconditionFailed,
)
from flightsrv.store.base import ObjectMeta, PutMode
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import INLINE_LIMIT, encode_blob, inline_descriptor, read_dv
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.splice import Copy, SpliceUnsupported, assemble, rewrite_row_groups
from flightsrv.table.writer import DataFileWriter, WriteOptions, data_key, file_stats

__all__ = ["ErasedCount", "ErasedObject", "FileErasure", "PurgeResult", "purge",
           "splice_positions"]

log = logging.getLogger("flightsrv.erase")

MAX_REPLANS = 5


class _Replan(Exception):
    """A file the erasure targets left the head: plan again from a new snapshot."""


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
    """An object that holds erased bytes: a replaced data file ("data") or the DV object that
    described its deletions ("dv", row positions only). ``referenced_by`` lists the retained
    versions that still reach it; ``deleted`` is True once it was removed from the store."""

    key: str
    kind: str
    referenced_by: tuple[int, ...]
    deleted: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"referenced_by": list(self.referenced_by)}


@dataclass
class PurgeResult:
    table: str
    operation: str  # "splice_delete" | "purge"
    version: int | None  # the committed version (None: nothing to do)
    rows_deleted: int = 0  # rows this commit turned from live to deleted
    rows_removed: int = 0  # rows whose bytes left the data files
    files: list[FileErasure] = field(default_factory=list)
    objects: list[ErasedObject] = field(default_factory=list)
    expired_versions: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when no object holding erased row bytes is left in the store."""
        return all(o.deleted for o in self.objects if o.kind == "data")

    @property
    def retained_versions(self) -> list[int]:
        """Retained versions that still reach erased bytes (time travel would show them)."""
        return sorted({v for o in self.objects if not o.deleted for v in o.referenced_by})

    def to_dict(self) -> dict:
        return {
            "table": self.table, "operation": self.operation, "version": self.version,
            "rows_deleted": self.rows_deleted, "rows_removed": self.rows_removed,
            "complete": self.complete, "retained_versions": self.retained_versions,
            "expired_versions": list(self.expired_versions),
            "files": [f.to_dict() for f in self.files],
            "objects": [o.to_dict() for o in self.objects],
        }

    def rows(self) -> list[dict]:
        """One row per file and per object still holding erased bytes (CLI table)."""
        out = [{"kind": "file", "object": f.old_path, "path": f.path,
                "new": ",".join(f.new_paths) or "-", "rows_removed": f.rows_removed,
                "downloaded": f.bytes_downloaded, "uploaded": f.bytes_uploaded,
                "copied": f.bytes_copied, "status": f.reason or "ok"} for f in self.files]
        for o in self.objects:
            out.append({"kind": o.kind, "object": o.key, "path": "", "new": "",
                        "rows_removed": "", "downloaded": "", "uploaded": "", "copied": "",
                        "status": "deleted" if o.deleted else
                        "referenced by v" + ",".join(map(str, o.referenced_by))
                        if o.referenced_by else "unreferenced (vacuum removes it)"})
        out.append({"kind": "total", "object": f"version {self.version}", "path": "",
                    "new": "", "rows_removed": self.rows_removed, "downloaded": sum(
                        f.bytes_downloaded for f in self.files),
                    "uploaded": sum(f.bytes_uploaded for f in self.files),
                    "copied": sum(f.bytes_copied for f in self.files),
                    "status": "erased" if self.complete else "old versions still hold bytes"})
        return out


class ErasedCount(int):
    """The row count ``Table.delete`` returns, with the full ``PurgeResult`` attached."""

    result: PurgeResult

    def __new__(cls, n: int, result: PurgeResult):
        obj = super().__new__(cls, n)
        obj.result = result
        return obj


# -- positions -----------------------------------------------------------------------


def _dead_positions(table, f: DataFile) -> np.ndarray:
    """Sorted old positions (int64) dead in ``f``: its DV plus its deleted row groups."""
    bm = read_dv(table.store, f.dv, table=table.name, data_file=f.path) if f.dv else BitMap64()
    for g in f.deleted_row_groups:
        start = f.row_group_offsets[g]
        bm.add_range(start, start + f.row_group_rows(g))
    return np.asarray(bm.to_array(), dtype=np.int64)


def _group_split(f: DataFile, positions: np.ndarray) -> dict[int, np.ndarray]:
    """File positions → {row group: positions within the group}."""
    offsets = np.asarray(f.row_group_offsets, dtype=np.int64)
    groups = np.searchsorted(offsets, positions, side="right") - 1
    out = {}
    for g in np.unique(groups):
        out[int(g)] = positions[groups == g] - offsets[g]
    return out


def _remap(removed: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Old positions → positions after ``removed`` rows left (those in ``removed`` vanish).
    The same rule as ``SplicePlan.remap_positions``; also holds for a rewrite, which keeps
    row order."""
    old = old[~np.isin(old, removed, assume_unique=True)]
    return old - np.searchsorted(removed, old, side="left")


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


_COPY_CHUNK = 1 << 30


def _assemble(store, plan, key: str) -> ObjectMeta:
    """``splice.assemble``, except on a local store: there the new file is written in one
    pass (``os.copy_file_range`` for copied ranges, inside the kernel) and installed with
    ``adopt`` (CREATE), instead of parts that the local multipart emulation copies twice."""
    src_path = store.local_path(plan.source_key)
    if src_path is None or not hasattr(store, "adopt") or not hasattr(store, "new_temp_file"):
        return assemble(store, plan, key)
    tmp = store.new_temp_file()
    try:
        with open(src_path, "rb") as src, open(tmp, "wb", buffering=0) as dst:
            # pin the source: the descriptor we copy from is the version the plan read
            if store.head(plan.source_key).etag != plan.source_etag or \
                    os.fstat(src.fileno()).st_ino != os.stat(src_path).st_ino:
                raise PreconditionFailed("source changed since the splice was planned",
                                         key=plan.source_key, etag=plan.source_etag)
            for part in plan.parts:
                if not isinstance(part, Copy):
                    view = memoryview(part.data)
                    while view:
                        view = view[dst.write(view):]
                    continue
                off, left = part.src_start, part.size
                while left:
                    n = os.copy_file_range(src.fileno(), dst.fileno(), min(left, _COPY_CHUNK),
                                           off)
                    if n <= 0:
                        raise CorruptObject("source ended inside a copied range",
                                            key=plan.source_key, offset=off, missing=left)
                    off, left = off + n, left - n
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
    offsets, stats = file_stats(_metadata_from_footer(plan.footer), snap.schema)
    nf = DataFile(path=key, size=meta.size, etag=meta.etag, rows=plan.new_num_rows,
                  row_group_offsets=offsets, stats=stats, added_version=0)
    return _Prepared(t, [nf], FileErasure(
        f.path, (key,), plan.path, plan.old_num_rows - plan.new_num_rows, f.size, meta.size,
        plan.bytes_downloaded, plan.bytes_uploaded, plan.bytes_copied,
        "" if plan.path == "splice" else "no byte range could be copied"))


def _rewrite(table, snap, t: _Target, reason: str) -> _Prepared:
    """Copy-on-write: read the surviving rows, write them with the table's writer."""
    from flightsrv.table.scan import open_parquet

    f = t.file
    pf = open_parquet(table.store, f, table=table.name)
    schema = snap.schema
    read = {"bytes": 0}

    def batches():
        for g in range(f.row_groups):
            start, n = f.row_group_offsets[g], f.row_group_rows(g)
            lo, hi = np.searchsorted(t.remove, [start, start + n])
            if hi - lo == n:
                continue  # every row of the group goes: never read it
            rg = pf.metadata.row_group(g)
            read["bytes"] += sum(rg.column(j).total_compressed_size for j in range(rg.num_columns))
            tbl = pf.read_row_group(g, columns=schema.names, use_threads=False)
            if hi > lo:
                keep = np.ones(n, dtype=bool)
                keep[t.remove[lo:hi] - start] = False
                tbl = tbl.filter(pa.array(keep))
            tbl = tbl.cast(schema) if tbl.schema != schema else tbl
            yield from tbl.to_batches()

    writer = DataFileWriter(table.store, schema, table.runtime,
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
    from flightsrv.table.deletes import write_dv_object

    targets = {p.target.file.path: p for p in prepared}

    def mutate(head: Manifest | None) -> Manifest:
        head = require_table(head, table.name)
        by_path = head.files_by_path()
        for path, p in targets.items():
            hf = by_path.get(path)
            if hf is None or hf.etag != p.target.file.etag:
                raise _Replan()
        version = head.version + 1
        pending: list = []
        replaced: dict[str, list[DataFile]] = {}
        newly_deleted = 0
        old_dv_objects: set[str] = set()
        for path, p in targets.items():
            hf = by_path[path]
            if hf.dv is not None and hf.dv.storage == "object":
                old_dv_objects.add(hf.dv.path)
            dead = _dead_positions(table, hf)
            remove = p.target.remove
            newly_deleted += int(len(remove) - np.isin(remove, dead, assume_unique=True).sum())
            # deletions that landed after the plan read the file: carry them over
            carried = _remap(remove, dead)
            entries, base = [], 0
            for nf in p.new_files:
                here = carried[(carried >= base) & (carried < base + nf.rows)] - base
                base += nf.rows
                if len(here) >= nf.rows:
                    continue  # every row of this new file was deleted meanwhile
                nf = dataclasses.replace(nf, added_version=version)
                if len(here):
                    bm = BitMap64(here.astype(np.uint64))
                    blob = encode_blob(bm)
                    if len(blob) <= INLINE_LIMIT:
                        nf = dataclasses.replace(nf, dv=inline_descriptor(bm), stats_wide=True)
                    else:
                        pending.append((nf.path, blob, len(bm)))
                        nf = dataclasses.replace(nf, dv="pending", stats_wide=True)
                entries.append(nf)
            replaced[path] = entries
        if pending:
            descriptors = write_dv_object(table, pending)
            replaced = {k: [dataclasses.replace(f, dv=descriptors[f.path])
                            if f.dv == "pending" else f for f in v] for k, v in replaced.items()}
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


def _erase(table, select, suspect, operation: str, extra: dict, *, expire: bool, progress
           ) -> PurgeResult:
    """Plan with ``select(snapshot) -> [_Target]``, build replacements, commit, report.
    ``suspect(manifest, data_file)`` says whether an older file may hold erased rows."""
    try:
        for _ in range(MAX_REPLANS):
            snap = table.snapshot()
            targets = select(snap)
            if not targets:
                return PurgeResult(table.name, operation, None)
            if progress is not None and progress.total is None:
                progress.total = len(targets)
            table.warehouse.ensure_writable()
            prepared: list[_Prepared] = []
            out: dict = {}
            try:
                for t in targets:
                    prepared.append(_prepare(table, snap, t))
                    if progress is not None:
                        r = prepared[-1].report
                        progress.advance(1, f"{r.path} {r.old_path}")
                committed = table.commit(_mutator(table, snap, prepared, operation, extra, out))
            except _Replan:
                _discard(table, prepared)
                continue
            except BaseException:
                _discard(table, prepared)
                raise
            result = PurgeResult(table.name, operation, committed.version,
                                 out["newly_deleted"], out["rows_removed"],
                                 [p.report for p in prepared])
            erased = _history_copies(table, committed.version, suspect)
            erased.update({k: "dv" for k in out["old_dv_objects"]})
            erased.update({p.target.file.path: "data" for p in prepared})
            if expire:
                result.expired_versions = _expire_referencing(
                    table, committed.version, {k for k, v in erased.items() if v != "dv"})
            result.objects = _account(table, erased, delete=expire)
            return result
        raise CommitConflict("erasure re-planned too often: its files keep being rewritten",
                             table=table.name, operation=operation, attempts=MAX_REPLANS)
    finally:
        if progress is not None:
            progress.finish()


# -- erasure completeness ------------------------------------------------------------


def _retained(table) -> list[Manifest]:
    out = []
    for v in table.log.versions():
        m = table.log.try_load(v)
        if m is not None:
            out.append(m)
    return out


def _history_copies(table, erase_version: int, suspect) -> dict[str, str]:
    """Data files of versions before the erasure that the head no longer references and that
    may hold earlier copies of the erased rows (rewritten away before the erasure, e.g. by
    compaction): kind "history"."""
    head = require_table(table.log.head(), table.name)
    current = head.referenced_keys()
    out = {}
    for m in _retained(table):
        if m.version >= erase_version:
            continue
        for f in m.data_files:
            if f.path not in current and f.path not in out and suspect(m, f):
                out[f.path] = "history"
    return out


def _expire_referencing(table, erase_version: int, keys: set[str]) -> list[int]:
    """Expire every version up to the newest one before ``erase_version`` that references
    ``keys``, through ``maintenance.expire_snapshots`` (so retained versions stay a contiguous
    run ending at the head, and the pointer is moved to the head first). Never the head.

    If a commit lands between reading the head here and inside ``expire_snapshots``, up to
    that many more (older-than-head) versions expire; the erasure itself is never weakened.
    """
    doomed = [m.version for m in _retained(table)
              if m.version < erase_version and m.referenced_keys() & keys]
    if not doomed:
        return []
    keep_from = max(doomed) + 1
    head = require_table(table.log.head(), table.name)
    result = table.expire_snapshots(retain_last=max(1, head.version - keep_from + 1))
    log.info("expired versions holding erased bytes",
             extra={"table": table.name, "versions": result.expired_versions})
    return list(result.expired_versions)


def _account(table, erased: dict[str, str], *, delete: bool) -> list[ErasedObject]:
    """Which retained versions reach each erased object; delete the unreferenced ones."""
    refs: dict[str, list[int]] = {k: [] for k in erased}
    for m in _retained(table):
        for k in m.referenced_keys() & refs.keys():
            refs[k].append(m.version)
    out = []
    for key, kind in sorted(erased.items()):
        deleted = False
        if not refs[key]:
            if delete:
                table.store.delete(key)
                deleted = True
            else:
                try:
                    table.store.head(key)
                except ObjectNotFound:
                    deleted = True
        out.append(ErasedObject(key, kind, tuple(refs[key]), deleted))
    return out


# -- entry points --------------------------------------------------------------------


def splice_positions(table, base: Manifest, positions: dict, *, expire: bool = False,
                     progress=None) -> "ErasedCount":
    """Physically delete rows decided elsewhere (by DuckDB, ``delete_mode = 'splice'``).

    ``positions`` maps data file paths of ``base`` to *physical* row positions (rows already
    deleted by a deletion vector may be among them: a splice erases their bytes too). The
    dead rows of every row group re-encoded anyway go as well. Concurrent deletion vectors
    on the same files are carried over by the commit; if a file is gone from the head
    (rewritten concurrently), :class:`~flightsrv.table.delete_plan.Rerun` asks the caller
    to decide again on a new snapshot. Returns the rows deleted (live before, gone now) as
    an ``ErasedCount`` whose ``.result`` is the ``PurgeResult``."""
    from flightsrv.table.delete_plan import Rerun

    wanted = {p: np.asarray(bm.to_array(), dtype=np.int64) for p, bm in positions.items()
              if len(bm)}

    def select(snap) -> list[_Target]:
        by_path = snap.manifest.files_by_path()
        targets = []
        for path, new in wanted.items():
            f = by_path.get(path)
            if f is None:
                raise Rerun("a data file the statement changes was rewritten", path)
            dead = _dead_positions(table, f)
            touched = np.unique(np.searchsorted(f.row_group_offsets, new, side="right") - 1)
            dead_groups = np.searchsorted(f.row_group_offsets, dead, side="right") - 1
            targets.append(_Target(f, np.union1d(new, dead[np.isin(dead_groups, touched)])))
        return targets

    result = _erase(table, select, lambda m, f: True, "splice_delete", {},
                    expire=expire, progress=progress)
    return ErasedCount(result.rows_deleted, result)


def purge(table, *, expire: bool = False, progress=None) -> PurgeResult:
    """Physically remove every row already marked deleted (DVs, deleted row groups)."""

    def select(snap) -> list[_Target]:
        return [_Target(f, _dead_positions(table, f)) for f in snap.manifest.data_files
                if f.dv is not None or f.deleted_row_groups]

    return _erase(table, select, lambda m, f: True, "purge", {}, expire=expire,
                  progress=progress)

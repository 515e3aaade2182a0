"""Table maintenance: compaction, snapshot expiry, vacuum of orphans, health stats
(docs/MAINTENANCE.md; the spec text lives in docs/PROTOCOL.md §Maintenance).

``compact``  rewrites data files whose deleted fraction is over ``compact.min_deleted_fraction``
             and bin-packs small files up to the target file size (optionally sorted by
             columns); coalesces the deletion vectors of files it keeps into one tombstone
             object. One commit swaps inputs for outputs. A delete that commits between the
             compaction's read and its commit is *carried over*: the commit maps the newly
             deleted input positions to output positions (output row = rank of the input row
             in the write order) and gives the outputs a DV. A group whose input file vanished
             (rewritten or wholly deleted concurrently) is dropped from the commit (its outputs
             become orphans for vacuum). Files appended concurrently are kept: the commit only
             removes its own inputs from the head it is given.
``expire_snapshots``  deletes manifests of versions below a cutoff, oldest first, so retained
             versions stay a contiguous suffix ending at the head; the pointer is moved to the
             head first and the cutoff never passes it, so pointer roll-forward keeps working.
``vacuum``   deletes objects under ``data/`` and ``tombstone/`` that no retained version
             references and that are older than the grace period, and aborts multipart
             uploads older than it; likewise mirror objects (``_delta_log/``, ``_delta_dv/``,
             ``metadata/``, see ``flightsrv.table.mirror``) that no retained mirror version
             references. ``expire_snapshots`` also removes expired versions from the mirrors. It lists objects *before* reading the retained versions
             (and re-reads the head before deleting), so anything committed meanwhile is seen.
``table_stats``  files, row groups, rows, deleted fraction, DVs, orphan bytes, versions, and
             a recommendation.

Time comes from the table's injected ``Runtime`` clock; object ages compare the store's
``last_modified_ms`` with it (an object from "the future" counts as young and is kept).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from flightsrv.errors import ConfigurationError, ObjectNotFound
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import (
    INLINE_LIMIT,
    encode_blob,
    inline_descriptor,
    read_dv,
    write_dv_object,
)
from flightsrv.table.manifest import DataFile, DeletionVector, Manifest, manifest_key
from flightsrv.table.scan import FileTask, Snapshot
from flightsrv.table.writer import DataFileWriter, WriteLayout, WriteOptions

log = logging.getLogger("flightsrv.maintenance")

DEFAULT_MIN_DELETED_FRACTION = 0.1
DEFAULT_SMALL_FILE_FRACTION = 0.5  # a file under half the target size is "small"
DEFAULT_SORT_GROUP_BYTES = 512 * 1024 * 1024  # largest input group sorted in memory
DEFAULT_GRACE = dt.timedelta(days=7)
#: key prefixes vacuum may delete from; everything else under the table prefix is left alone
VACUUM_PREFIXES = ("data/", "tombstone/", "chunks/")
#: stats recommends expiry above this many retained versions (table property overrides)
DEFAULT_MAX_VERSIONS = 100


def _table_ctx(table) -> dict:
    return {"table": table.name}


# ---------------------------------------------------------------------------------------
# results


class _Result:
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def rows(self) -> list[dict]:
        return [{"metric": k, "value": v} for k, v in self.to_dict().items()
                if not isinstance(v, (list, dict))]


@dataclass
class CompactResult(_Result):
    table: str
    dry_run: bool
    read_version: int
    version: int | None = None  # the committed version (None: nothing committed)
    groups_planned: int = 0
    groups_committed: int = 0
    groups_aborted: int = 0  # an input vanished concurrently; outputs left for vacuum
    files_rewritten: int = 0
    files_added: int = 0
    bytes_rewritten: int = 0
    bytes_written: int = 0
    rows_written: int = 0
    deleted_rows_purged: int = 0  # rows masked by DVs at the read version, now gone
    deletes_carried_over: int = 0  # rows deleted concurrently, mapped onto the outputs
    dvs_coalesced: int = 0  # kept files whose DV moved into the new tombstone object
    dv_objects_before: int = 0
    dv_objects_after: int = 0
    reasons: dict = field(default_factory=dict)  # input path -> "deletes" | "small" | "sort"
    #: deletions whose bytes are stored past the table's erasure.deadline (erasure_status)
    erasures_overdue: list = field(default_factory=list)

    def rows(self) -> list[dict]:
        return super().rows() + _overdue_rows(self.erasures_overdue)


@dataclass
class ExpireResult(_Result):
    table: str
    dry_run: bool
    head_version: int
    oldest_retained: int
    expired_versions: list = field(default_factory=list)
    manifests_deleted: int = 0
    #: mirror format -> mirror objects removed with the expired versions
    mirrors: dict = field(default_factory=dict)
    mirror_error: str | None = None  # the mirrors could not be updated (logged)

    def rows(self) -> list[dict]:
        return [{"metric": "head_version", "value": self.head_version},
                {"metric": "oldest_retained", "value": self.oldest_retained},
                {"metric": "versions_expired", "value": len(self.expired_versions)},
                {"metric": "expired_range", "value": (
                    f"{self.expired_versions[0]}..{self.expired_versions[-1]}"
                    if self.expired_versions else "-")},
                {"metric": "manifests_deleted", "value": self.manifests_deleted},
                {"metric": "dry_run", "value": self.dry_run}] + [
                {"metric": f"{fmt}_mirror_objects_deleted", "value": len(keys)}
                for fmt, keys in sorted(self.mirrors.items())]


@dataclass
class VacuumResult(_Result):
    table: str
    dry_run: bool
    grace_seconds: float
    oldest_retained: int | None = None
    head_version: int | None = None
    referenced_objects: int = 0
    objects: list = field(default_factory=list)  # [{key, kind, size, age_s}] (to go / gone)
    uploads: list = field(default_factory=list)  # [{key, upload_id, age_s}] aborted
    kept_young: int = 0  # unreferenced, but younger than the grace period
    kept_young_bytes: int = 0
    #: deletions whose bytes are stored past the table's erasure.deadline (erasure_status)
    erasures_overdue: list = field(default_factory=list)
    #: manifests of dropped incarnations removed (their DROP is older than the grace)
    dropped_versions: list = field(default_factory=list)

    @property
    def deleted_objects(self) -> int:
        return len(self.objects)

    @property
    def deleted_bytes(self) -> int:
        return sum(o["size"] for o in self.objects)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["deleted_objects"], d["deleted_bytes"] = self.deleted_objects, self.deleted_bytes
        return d

    def rows(self) -> list[dict]:
        if self.dry_run:
            return [{"would_delete": o["key"], "kind": o["kind"], "bytes": o["size"],
                     "age_h": round(o["age_s"] / 3600, 1)} for o in self.objects] + [
                {"would_delete": f"{u['key']} (multipart {u['upload_id'][:12]})",
                 "kind": "upload", "bytes": "", "age_h": round(u["age_s"] / 3600, 1)}
                for u in self.uploads] + [
                {"would_delete": r["value"], "kind": r["metric"]}
                for r in _overdue_rows(self.erasures_overdue)]
        by_kind: dict[str, list] = {}
        for o in self.objects:
            k = by_kind.setdefault(o["kind"], [0, 0])
            k[0] += 1
            k[1] += o["size"]
        out = [{"kind": k, "deleted": n, "bytes": b} for k, (n, b) in sorted(by_kind.items())]
        if self.uploads:
            out.append({"kind": "multipart upload", "deleted": len(self.uploads), "bytes": ""})
        out.append({"kind": "kept (younger than grace)", "deleted": self.kept_young,
                    "bytes": self.kept_young_bytes})
        return out + [{"kind": r["metric"], "deleted": r["value"]}
                      for r in _overdue_rows(self.erasures_overdue)]


@dataclass
class TableStats(_Result):
    table: str
    version: int
    files: int
    row_groups: int
    total_rows: int  # physical rows
    live_rows: int
    deleted_rows: int
    deleted_fraction: float
    deleted_row_groups: int
    data_bytes: int
    small_files: int
    dv_count: int  # files with a deletion vector
    dv_inline: int
    dv_objects: int  # distinct tombstone objects the head references
    orphan_objects: int
    orphan_bytes: int
    abandoned_uploads: int
    version_count: int
    oldest_retained_version: int | None
    recommendation: str  # "compact" | "expire" | "vacuum" | "nothing" (the first to run)
    reasons: list = field(default_factory=list)  # [{"action", "reason"}]

    def rows(self) -> list[dict]:  # type: ignore[override]
        out = [{"metric": k, "value": v} for k, v in self.to_dict().items()
               if k not in ("reasons",)]
        for r in self.reasons:
            out.append({"metric": f"why {r['action']}", "value": r["reason"]})
        return out


def _overdue_rows(items: list) -> list[dict]:
    """Result rows naming deletions past their erasure deadline (VACUUM, OPTIMIZE)."""
    if not items:
        return []
    return [{"metric": "erasures past deadline", "value": len(items)}] + [
        {"metric": "erasure past deadline",
         "value": f"{i['object']} ({i['kind']}, {i['rows']} rows, {i['age_days']}d): "
                  f"{i['remedy']}"} for i in items]


def _overdue(table) -> list:
    from flightsrv.table.erasure_status import overdue_erasures

    return overdue_erasures(table)


# ---------------------------------------------------------------------------------------
# helpers


def _deleted_set(table, f: DataFile) -> BitMap64:
    """Every deleted row position of ``f``: its DV plus the rows of its deleted row groups."""
    bm = read_dv(table.store, f.dv, table=table.name, data_file=f.path) if f.dv else BitMap64()
    for g in f.deleted_row_groups:
        start = f.row_group_offsets[g]
        bm.add_range(start, start + f.row_group_rows(g))
    return bm


def _dv_for(bitmap: BitMap64, pending: list, out_path: str):
    """Descriptor for ``bitmap``: inline when small, else queued for one tombstone object."""
    blob = encode_blob(bitmap)
    if len(blob) <= INLINE_LIMIT:
        return inline_descriptor(bitmap)
    pending.append((out_path, blob, len(bitmap)))
    return "pending"


_write_tombstone = write_dv_object  # one writer of DV objects (flightsrv.table.deletes)


def _seconds(value, what: str, table) -> float:
    if isinstance(value, dt.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (int, float)):
        s = float(value)
    else:
        raise ConfigurationError(f"{what} must be a timedelta or seconds",
                                 table=getattr(table, "name", None), got=repr(value))
    if s < 0:
        raise ConfigurationError(f"{what} must not be negative",
                                 table=getattr(table, "name", None), seconds=s)
    return s


def _progress_start(progress, total: int | None, unit: str = "") -> None:
    if progress is not None:
        progress.total = total
        if unit:
            progress.unit = unit


def _progress_finish(progress) -> None:
    if progress is not None and hasattr(progress, "finish"):
        progress.finish()


# ---------------------------------------------------------------------------------------
# compaction


@dataclass
class _Input:
    file: DataFile  # as of the read version
    deleted: np.ndarray  # sorted deleted positions at the read version (uint64)
    base: int = 0  # first sequence number of this file's kept rows in the group's write order
    reason: str = ""

    @property
    def kept(self) -> int:
        return self.file.rows - len(self.deleted)


@dataclass
class _Group:
    inputs: list
    outputs: list = field(default_factory=list)  # DataFile, in write order
    out_offsets: np.ndarray | None = None  # first sequence number of each output
    inverse: np.ndarray | None = None  # sorted groups: input sequence -> output sequence
    aborted: bool = False

    @property
    def live_bytes(self) -> float:
        return sum(i.file.size * i.kept / max(1, i.file.rows) for i in self.inputs)


def _plan_groups(head: Manifest, table, *, target: int, min_deleted: float, small: int,
                 sort_by, sort_group_bytes: int) -> tuple[list[_Group], dict]:
    """Choose input files and pack them into groups of about ``target`` live bytes."""
    reasons: dict[str, str] = {}
    for f in head.data_files:
        if f.live_rows == 0:
            reasons[f.path] = "deletes"
        elif sort_by:
            reasons[f.path] = "sort"
        elif f.rows and f.deleted_rows / f.rows > min_deleted:
            reasons[f.path] = "deletes"
        elif f.size < small:
            reasons[f.path] = "small"
    chosen = [f for f in head.data_files if f.path in reasons]
    est = {f.path: f.size * f.live_rows / max(1, f.rows) for f in chosen}
    cap = sort_group_bytes if sort_by else target
    bins: list[list[DataFile]] = []
    sizes: list[float] = []
    keys: list[tuple] = []  # a group holds files of one partition (spec id, values)
    for f in sorted(chosen, key=lambda f: -est[f.path]):  # first fit decreasing
        key = (f.spec_id, tuple(f.partition))
        for i, s in enumerate(sizes):
            if keys[i] == key and s + est[f.path] <= cap:
                bins[i].append(f)
                sizes[i] += est[f.path]
                break
        else:
            bins.append([f])
            sizes.append(est[f.path])
            keys.append(key)
    groups = []
    order = {f.path: i for i, f in enumerate(head.data_files)}
    for b in bins:
        # a lone small file with few deletes gains nothing from a rewrite
        if len(b) == 1 and reasons[b[0].path] == "small":
            del reasons[b[0].path]
            continue
        b.sort(key=lambda f: order[f.path])  # keep the table's file order inside a group
        inputs = []
        for f in b:
            deleted = np.asarray(_deleted_set(table, f).to_array(), dtype=np.uint64)
            inputs.append(_Input(f, deleted, reason=reasons[f.path]))
        groups.append(_Group(inputs))
    return groups, reasons


def _write_group(table, snap: Snapshot, g: _Group, options: WriteOptions, sort_by,
                 version_hint: int, progress) -> None:
    """Write the group's live rows, recording the order (output row = input rank)."""
    schema = snap.schema
    tasks = []
    seq = 0
    for inp in g.inputs:
        inp.base = seq
        seq += inp.kept
        f = inp.file
        groups = [i for i in range(f.row_groups) if i not in set(f.deleted_row_groups)]
        dv = None
        if f.dv is not None and f.dv.cardinality:
            dv = np.asarray(read_dv(table.store, f.dv, table=table.name,
                                    data_file=f.path).to_array(), dtype=np.uint64)
        if groups and inp.kept:
            tasks.append(FileTask(f, groups, dv))
    counts: dict[str, int] = {}

    def live_tables():
        for task, t in snap.iter_tables(tasks=tasks):
            counts[task.file.path] = counts.get(task.file.path, 0) + t.num_rows
            if progress is not None:
                progress.advance(0, note=task.file.path.rsplit("/", 1)[-1])
            yield t

    # the current schema (rows come projected to it by field id); the group's own partition
    # (its files share one), so output rows stay in input order
    first = g.inputs[0].file
    layout = WriteLayout(snap.manifest.schema, snap.manifest.partition_spec,
                         fixed_partition=(first.spec_id, tuple(first.partition)))
    writer = DataFileWriter(table.store, layout, table.runtime, options, version_hint)
    if sort_by:
        whole = pa.concat_tables(list(live_tables())) if tasks else schema.empty_table()
        whole = whole.append_column("__seq", pa.array(np.arange(whole.num_rows, dtype=np.int64)))
        order = pc.sort_indices(whole, sort_keys=[(c, "ascending") for c in sort_by])
        whole = whole.take(order)
        perm = whole.column("__seq").to_numpy()
        inverse = np.empty_like(perm)
        inverse[perm] = np.arange(len(perm), dtype=perm.dtype)
        g.inverse = inverse
        whole = whole.drop_columns(["__seq"])
        writer.write(b for b in whole.to_batches() if b.num_rows)
    else:
        writer.write(b for t in live_tables() for b in t.to_batches() if b.num_rows)
    for inp in g.inputs:
        got = counts.get(inp.file.path, 0)
        if got != inp.kept:
            from flightsrv.errors import CorruptObject
            raise CorruptObject("compaction read a different number of live rows than the "
                                "manifest records", table=table.name, object=inp.file.path,
                                expected=inp.kept, read=got)
    g.outputs = list(writer.files)
    g.out_offsets = np.cumsum([0] + [o.rows for o in g.outputs[:-1]]).astype(np.int64) \
        if g.outputs else np.zeros(0, dtype=np.int64)
    if progress is not None:
        progress.advance(sum(i.file.size for i in g.inputs))


def _carry_over(table, g: _Group, head_files: dict[str, DataFile]):
    """Outputs of ``g`` adjusted for deletes committed after the read, or None to abort.

    Returns (outputs, rows newly deleted, pending large DVs)."""
    fresh_seq = []
    for inp in g.inputs:
        hf = head_files.get(inp.file.path)
        if hf is None or hf.etag != inp.file.etag:
            return None  # rewritten or wholly deleted concurrently: abort this group
        if hf.dv == inp.file.dv and hf.deleted_row_groups == inp.file.deleted_row_groups:
            continue
        now = np.asarray(_deleted_set(table, hf).to_array(), dtype=np.uint64)
        if not np.isin(inp.deleted, now, assume_unique=True).all():
            return None  # deletions only grow; anything else means we cannot map safely
        fresh = np.setdiff1d(now, inp.deleted, assume_unique=True)
        if len(fresh) == 0:
            continue
        # rank of a kept position p among kept rows = p - (deleted positions below p)
        rank = fresh.astype(np.int64) - np.searchsorted(inp.deleted, fresh, side="left")
        fresh_seq.append(inp.base + rank)
    if not fresh_seq:
        return list(g.outputs), 0, []
    seq = np.concatenate(fresh_seq)
    if g.inverse is not None:
        seq = g.inverse[seq]
    which = np.searchsorted(g.out_offsets, seq, side="right") - 1
    outs, pending, carried = [], [], 0
    for i, o in enumerate(g.outputs):
        pos = seq[which == i] - g.out_offsets[i]
        if len(pos) == 0:
            outs.append(o)
            continue
        bm = BitMap64(pos.astype(np.uint64))
        carried += len(bm)
        if len(bm) >= o.rows:
            continue  # every row of this output was deleted meanwhile
        outs.append(dataclasses.replace(o, dv=_dv_for(bm, pending, o.path), stats_wide=True))
    return outs, carried, pending


def _coalesce_plan(table, head: Manifest, inputs: set[str]) -> dict[str, DeletionVector]:
    """New descriptors for kept files' object DVs when they are spread over 2+ objects."""
    kept = [f for f in head.data_files if f.path not in inputs and f.dv is not None
            and f.dv.storage == "object"]
    if len({f.dv.path for f in kept}) < 2:
        return {}
    pending, out = [], {}
    for f in kept:
        bm = read_dv(table.store, f.dv, table=table.name, data_file=f.path)
        d = _dv_for(bm, pending, f.path)
        if d != "pending":
            out[f.path] = d
    if pending:
        out.update(_write_tombstone(table, pending))
    return out


def compaction_options(table, props: dict, *, target_file_size=None,
                       min_deleted_fraction=None, small_file_fraction=None,
                       small_file_threshold=None) -> tuple[WriteOptions, float, float, int]:
    """Resolve compaction settings from arguments, then table properties, then defaults:
    (write options, min deleted fraction, small-file fraction, small-file threshold bytes).
    Shared by ``compact`` and the Spark compaction."""
    options = WriteOptions.from_properties(props)
    if target_file_size is not None:
        if int(target_file_size) <= 0:
            raise ConfigurationError("target_file_size must be positive", table=table.name,
                                     target_file_size=target_file_size)
        options = dataclasses.replace(options, target_file_size=int(target_file_size))
    try:
        min_del = float(min_deleted_fraction if min_deleted_fraction is not None else
                        props.get("compact.min_deleted_fraction", DEFAULT_MIN_DELETED_FRACTION))
        frac = float(small_file_fraction if small_file_fraction is not None else
                     props.get("compact.small_file_fraction", DEFAULT_SMALL_FILE_FRACTION))
    except (TypeError, ValueError):
        raise ConfigurationError("compaction thresholds must be numbers", table=table.name,
                                 min_deleted_fraction=min_deleted_fraction,
                                 small_file_fraction=small_file_fraction) from None
    if not 0 <= min_del <= 1 or not 0 <= frac <= 1:
        raise ConfigurationError("compaction fractions must be within [0, 1]", table=table.name,
                                 min_deleted_fraction=min_del, small_file_fraction=frac)
    small = int(small_file_threshold) if small_file_threshold is not None else \
        int(options.target_file_size * frac)
    return options, min_del, frac, small


def commit_groups(table, head: Manifest, groups: list, result: CompactResult, *,
                  coalesced: dict | None = None, extra_summary: dict | None = None):
    """The one compaction commit (used by ``compact`` and the Spark compaction): swap each
    group's inputs for its written outputs, carrying over deletes that landed after ``head``
    was read (or aborting a group whose input vanished), move coalesced DVs, keep every other
    file of the head. Fills ``result``; returns the committed manifest or None."""
    coalesced = coalesced or {}
    read_dvs = {f.path: f.dv for f in head.data_files}
    stash: dict = {}

    def mutate(cur):
        cur = require_table(cur, table.name)
        if cur.schema != head.schema:
            stash.clear()
            stash["schema_changed"] = True
            return None
        by_path = cur.files_by_path()
        replace: dict[str, list] = {}  # first input path -> outputs (placed there)
        removed: set[str] = set()
        pending: list = []
        committed = aborted = carried = 0
        stats = {"files_rewritten": 0, "files_added": 0, "bytes_rewritten": 0,
                 "bytes_written": 0, "rows_written": 0, "deleted_rows_purged": 0}
        for g in groups:
            r = _carry_over(table, g, by_path)
            if r is None:
                aborted += 1
                continue
            outs, n, pend = r
            committed += 1
            carried += n
            pending += pend
            removed |= {i.file.path for i in g.inputs}
            replace[g.inputs[0].file.path] = outs
            stats["files_rewritten"] += len(g.inputs)
            stats["files_added"] += len(outs)
            stats["bytes_rewritten"] += sum(i.file.size for i in g.inputs)
            stats["bytes_written"] += sum(o.size for o in g.outputs)
            stats["rows_written"] += sum(o.rows for o in g.outputs)
            stats["deleted_rows_purged"] += sum(len(i.deleted) for i in g.inputs)
        moved = {p: d for p, d in coalesced.items()
                 if p in by_path and p not in removed and by_path[p].dv == read_dvs.get(p)}
        if not committed and not moved:
            stash.clear()
            stash["aborted"] = aborted
            return None
        descriptors = _write_tombstone(table, pending) if pending else {}
        new_version = cur.version + 1
        files = []
        for f in cur.data_files:
            if f.path in replace:
                for o in replace[f.path]:
                    o = dataclasses.replace(o, added_version=head.version)
                    if o.dv == "pending":
                        o = dataclasses.replace(o, dv=descriptors[o.path])
                    files.append(o)
            elif f.path in removed:
                continue
            elif f.path in moved:
                files.append(dataclasses.replace(f, dv=moved[f.path]))
            else:
                files.append(f)
        stash.clear()
        stash.update(stats, groups_committed=committed, groups_aborted=aborted,
                     deletes_carried_over=carried, dvs_coalesced=len(moved),
                     version=new_version)
        summary = {"rows_added": 0, "rows_deleted": carried,
                   "files_added": stats["files_added"],
                   "files_removed": stats["files_rewritten"], "read_version": head.version,
                   "bytes_rewritten": stats["bytes_rewritten"],
                   "bytes_written": stats["bytes_written"],
                   "deleted_rows_purged": stats["deleted_rows_purged"],
                   "deletes_carried_over": carried, "dvs_coalesced": len(moved),
                   **(extra_summary or {})}
        return dataclasses.replace(cur, operation="compact", summary=summary,
                                   data_files=tuple(files))

    m = table.commit(mutate)
    if m is None:
        result.groups_aborted = stash.get("aborted", len(groups))
        if stash.get("schema_changed"):
            log.warning("compaction abandoned: schema changed", extra=_table_ctx(table))
        return None
    for k, v in stash.items():
        setattr(result, k, v)
    result.version = m.version
    result.dv_objects_after = len({f.dv.path for f in m.data_files
                                   if f.dv is not None and f.dv.storage == "object"})
    return m


def compact(table, *, target_file_size: int | None = None,
            min_deleted_fraction: float | None = None, small_file_fraction: float | None = None,
            small_file_threshold: int | None = None, sort_by=None,
            sort_group_bytes: int = DEFAULT_SORT_GROUP_BYTES, coalesce_dvs: bool = True,
            dry_run: bool = False, progress=None) -> CompactResult:
    """Rewrite delete-heavy and small files (and coalesce DVs) in one commit.

    Files whose deleted fraction is over ``min_deleted_fraction`` (table property
    ``compact.min_deleted_fraction``, default 0.1) are rewritten without their deleted rows;
    files under ``small_file_threshold`` bytes (default ``small_file_fraction`` × target,
    property ``compact.small_file_fraction``, default 0.5) are bin-packed up to
    ``target_file_size`` (property ``target_file_size``, writer default). With ``sort_by``
    every file is rewritten sorted by those columns (groups of up to ``sort_group_bytes``
    are sorted in memory). See the module docstring for the concurrency rule."""
    snap = table.snapshot()
    head = snap.manifest
    props = head.properties
    options, min_del, frac, small = compaction_options(
        table, props, target_file_size=target_file_size,
        min_deleted_fraction=min_deleted_fraction, small_file_fraction=small_file_fraction,
        small_file_threshold=small_file_threshold)
    if isinstance(sort_by, str):
        sort_by = [c.strip() for c in sort_by.split(",") if c.strip()]
    sort_by = list(sort_by or [])
    unknown = [c for c in sort_by if c not in snap.schema.names]
    if unknown:
        raise ConfigurationError("unknown sort column", table=table.name,
                                 columns=",".join(unknown))

    result = CompactResult(table=table.name, dry_run=dry_run, read_version=head.version)
    groups, reasons = _plan_groups(head, table, target=options.target_file_size,
                                   min_deleted=min_del, small=small, sort_by=sort_by,
                                   sort_group_bytes=sort_group_bytes)
    inputs = {i.file.path for g in groups for i in g.inputs}
    result.reasons = {p: r for p, r in reasons.items() if p in inputs}
    result.groups_planned = len(groups)
    result.dv_objects_before = len({f.dv.path for f in head.data_files
                                    if f.dv is not None and f.dv.storage == "object"})
    if dry_run:
        result.files_rewritten = len(inputs)
        result.bytes_rewritten = sum(i.file.size for g in groups for i in g.inputs)
        result.deleted_rows_purged = sum(len(i.deleted) for g in groups for i in g.inputs)
        result.erasures_overdue = _overdue(table)
        return result

    _progress_start(progress, sum(i.file.size for g in groups for i in g.inputs) or None, " B")
    try:
        for g in groups:
            _write_group(table, snap, g, options, sort_by, head.version, progress)
        coalesced = _coalesce_plan(table, head, inputs) if coalesce_dvs else {}
        m = commit_groups(table, head, groups, result, coalesced=coalesced) \
            if groups or coalesced else None
        if m is not None:
            log.info("compact", extra={"table": table.name, "version": m.version,
                                       "files_rewritten": result.files_rewritten,
                                       "files_added": result.files_added})
        result.erasures_overdue = _overdue(table)
        return result
    finally:
        _progress_finish(progress)


# ---------------------------------------------------------------------------------------
# expiry


def _forget(tlog, version: int) -> None:
    """Drop an expired manifest from this process's TableLog cache, so time travel to it
    fails here at once (other processes' caches forget it as they evict)."""
    cache, lock = getattr(tlog, "_cache", None), getattr(tlog, "_lock", None)
    if cache is not None and lock is not None:
        with lock:
            cache.pop(version, None)


def _older_than_ms(table, older_than) -> int | None:
    from flightsrv.table.timestamps import parse_timestamp_ms

    if older_than is None:
        return None
    if isinstance(older_than, dt.timedelta):
        return table.runtime.clock.now_ms() - int(older_than.total_seconds() * 1000)
    return parse_timestamp_ms(older_than)


def expire_snapshots(table, *, older_than=None, retain_last: int = 1,
                     dry_run: bool = False) -> ExpireResult:
    """Delete the manifests of versions outside the retention window.

    Kept: the last ``retain_last`` versions (at least 1, so never the head) and, when
    ``older_than`` is given (datetime, ISO string, epoch ms, or a timedelta before now), every
    version committed at or after that time. Manifests are deleted oldest first, so the
    retained versions always form a contiguous run ending at the head."""
    if not isinstance(retain_last, int) or retain_last < 1:
        raise ConfigurationError("retain_last must be an integer >= 1 (the head is always "
                                 "retained)", table=table.name, retain_last=retain_last)
    cutoff_ms = _older_than_ms(table, older_than)
    head = table.head()
    cutoff = head.version - retain_last + 1
    if not dry_run:
        # the pointer must name a retained version: move it to the head first, and never
        # expire past wherever it is (a failed move leaves it lagging)
        table.log.advance_pointer(head)
        ptr, _ = table.log.read_pointer()
        if ptr is None or ptr.table_uuid != head.table_uuid:
            cutoff = 0  # readers without a usable pointer start from v0: keep everything
        else:
            cutoff = min(cutoff, ptr.version)
    listed = table.log.versions()
    versions = [v for v in listed if v < cutoff]
    if cutoff_ms is not None:
        # created_at is non-decreasing in version order: stop at the first young version
        for v in versions:
            m = table.log.try_load(v)
            if m is not None and m.created_at_ms >= cutoff_ms:
                cutoff = v
                break
        versions = [v for v in versions if v < cutoff]
    result = ExpireResult(table=table.name, dry_run=dry_run, head_version=head.version,
                          oldest_retained=min(v for v in listed + [head.version] if v >= cutoff),
                          expired_versions=versions)
    if dry_run:
        return result
    for v in versions:  # oldest first
        table.store.delete(manifest_key(v))
        _forget(table.log, v)
        result.manifests_deleted += 1
    oldest = table.log.oldest_version()
    result.oldest_retained = head.version if oldest is None else oldest
    if versions:
        from flightsrv.errors import FlightsrvError
        from flightsrv.table.mirror import expire as expire_mirrors

        try:
            result.mirrors = expire_mirrors(table)
        except FlightsrvError as exc:  # the expiry stands; the next publish catches up
            result.mirror_error = str(exc)
            log.warning("expiring the mirrors failed", extra={"table": table.name,
                                                              "error": str(exc)})
    log.info("expire", extra={"table": table.name, "expired": len(versions),
                              "oldest_retained": result.oldest_retained})
    return result


# ---------------------------------------------------------------------------------------
# vacuum


def _kind(key: str) -> str:
    return key.split("/", 1)[0]


def incarnation(table, head: Manifest) -> tuple[int, int | None]:
    """(first version of the head's incarnation, when the previous incarnation was dropped
    in ms or None). A table dropped and created again is a new incarnation (a new
    ``table_uuid``); a dropped head is its own incarnation, holding no data."""
    start, v = head.version, head.version - 1
    while v >= 0:
        m = table.log.try_load(v)
        if m is None or m.table_uuid != head.table_uuid or m.dropped:
            break
        start, v = v, v - 1
    if head.dropped:
        return head.version, head.created_at_ms
    prev = table.log.try_load(start - 1) if start > 0 else None
    return start, (prev.created_at_ms if prev is not None else None)


def _retained_refs(table, grace_s: float = 0.0) -> tuple[set[str], int | None, int]:
    """Objects referenced by any retained version (oldest listed .. head), and that range.

    Versions of a dropped incarnation (before the last DROP) stop counting once the DROP is
    older than ``grace_s``: SQL can no longer reach them (time travel never crosses a DROP)
    and a reader pinned before the DROP has had the grace period to finish."""
    versions = table.log.versions()
    head = table.log.head()
    if head is None:
        return set(), None, -1
    start, dropped_ms = incarnation(table, head)
    now = table.runtime.clock.now_ms()
    old_gone = dropped_ms is not None and now - dropped_ms >= grace_s * 1000
    refs: set[str] = set()
    lo = versions[0] if versions else head.version
    for v in range(lo, head.version + 1):
        if v < start and old_gone:
            continue
        m = head if v == head.version else table.log.try_load(v)
        if m is not None:  # missing below the head: expired meanwhile
            refs |= m.referenced_keys()
    return refs, lo, head.version


def _expire_dropped(table, grace_s: float, dry_run: bool) -> list[int]:
    """Delete the manifests of dropped incarnations once their DROP is older than the grace
    (oldest first, so the retained versions stay a contiguous run ending at the head)."""
    head = table.log.head()
    if head is None:
        return []
    start, dropped_ms = incarnation(table, head)
    now = table.runtime.clock.now_ms()
    if dropped_ms is None or now - dropped_ms < grace_s * 1000:
        return []
    gone = [v for v in table.log.versions() if v < start]
    if not dry_run:
        for v in gone:
            table.store.delete(manifest_key(v))
    return gone


def _scan_orphans(table, grace_s: float):
    """(old orphans, young orphans, old uploads, refs, oldest, head) — listing first."""
    from flightsrv.table.mirror import MIRROR_PREFIXES, referenced as mirror_refs

    now = table.runtime.clock.now_ms()
    limit = now - int(grace_s * 1000)
    listing = [m for p in VACUUM_PREFIXES + MIRROR_PREFIXES for m in table.store.list(p)]
    uploads = list(table.store.list_multipart(""))
    refs, lo, hv = _retained_refs(table, grace_s)  # AFTER listing: sees commits that raced it
    if any(m.key.startswith(MIRROR_PREFIXES) for m in listing):
        refs |= mirror_refs(table)  # also after listing: a publish that raced it is seen
    old, young = [], []
    for m in listing:
        if m.key in refs:
            continue
        # unknown (0) or future modification times count as young
        (old if 0 < m.last_modified_ms <= limit else young).append((m, now))
    old_uploads = [(u, now) for u in uploads if 0 < u.initiated_ms <= limit]
    return old, young, old_uploads, refs, lo, hv


def vacuum(table, *, grace=DEFAULT_GRACE, dry_run: bool = False, progress=None) -> VacuumResult:
    """Delete unreferenced objects older than ``grace`` and abort stale multipart uploads.

    Only keys under ``VACUUM_PREFIXES`` are candidates; manifests are removed by
    ``expire_snapshots``, never here. An object any retained version references is never
    deleted; an unreferenced object younger than ``grace`` is kept (a writer may be about to
    commit it), so ``grace`` must exceed the longest write-to-commit time of any writer."""
    grace_s = _seconds(grace, "grace", table)
    old, young, uploads, refs, lo, hv = _scan_orphans(table, grace_s)
    if old and not dry_run:
        # re-read the head: a commit after our reference read may name a listed object
        head = table.log.head()
        if head is not None and head.version != hv:
            for v in range(hv + 1, head.version + 1):
                m = table.log.try_load(v)
                if m is not None:
                    refs |= m.referenced_keys()
            old = [(m, now) for m, now in old if m.key not in refs]
    result = VacuumResult(table=table.name, dry_run=dry_run, grace_seconds=grace_s,
                          oldest_retained=lo, head_version=hv, referenced_objects=len(refs),
                          kept_young=len(young), kept_young_bytes=sum(m.size for m, _ in young))
    _progress_start(progress, len(old) + len(uploads) or None, " objects")
    try:
        for m, now in old:
            if not dry_run:
                table.store.delete(m.key)
            result.objects.append({"key": m.key, "kind": _kind(m.key), "size": m.size,
                                   "age_s": (now - m.last_modified_ms) / 1000})
            if progress is not None:
                progress.advance(1)
        for u, now in uploads:
            if not dry_run:
                try:
                    table.store.abort_multipart(u.key, u.upload_id)
                except ObjectNotFound:
                    pass
            result.uploads.append({"key": u.key, "upload_id": u.upload_id,
                                   "age_s": (now - u.initiated_ms) / 1000})
            if progress is not None:
                progress.advance(1)
    finally:
        _progress_finish(progress)
    result.dropped_versions = _expire_dropped(table, grace_s, dry_run)
    head = table.log.head()
    result.erasures_overdue = _overdue(table) if head is not None and not head.dropped else []
    log.info("vacuum", extra={"table": table.name, "dry_run": dry_run,
                              "objects": result.deleted_objects, "bytes": result.deleted_bytes})
    return result


@dataclass
class OrphanVacuumResult(_Result):
    """What ``Warehouse.vacuum_orphans`` removed (or would remove, with ``dry_run``)."""

    dry_run: bool
    grace_seconds: float
    prefixes_checked: int = 0  # table-name prefixes that hold no table
    prefixes: list = field(default_factory=list)  # those with old objects (to go / gone)
    objects: list = field(default_factory=list)  # [{key, kind, size, age_s}]
    uploads: list = field(default_factory=list)  # [{key, upload_id, age_s}] aborted
    kept_young: int = 0  # younger than the grace period: a create may still commit them
    kept_young_bytes: int = 0

    @property
    def deleted_objects(self) -> int:
        return len(self.objects)

    @property
    def deleted_bytes(self) -> int:
        return sum(o["size"] for o in self.objects)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["deleted_objects"], d["deleted_bytes"] = self.deleted_objects, self.deleted_bytes
        return d

    def rows(self) -> list[dict]:
        out = super().rows()
        out.insert(2, {"metric": "prefixes", "value": ",".join(self.prefixes) or "-"})
        return out


def vacuum_orphan_prefixes(warehouse, *, grace=DEFAULT_GRACE, dry_run: bool = False,
                           progress=None) -> OrphanVacuumResult:
    """Delete the objects that prefixes *without a table* hold: a job that was creating table
    ``t`` and failed (or was killed) before its create committed leaves data files under
    ``t/data/`` that no table references and no table-level vacuum reaches.

    A prefix counts only when it is a valid table name and has no manifest at all (a dropped
    table still has its log: its own ``vacuum`` applies). Only keys under the table object
    prefixes (``data/``, ``tombstone/``) and unfinished multipart uploads are candidates,
    and only when older than ``grace``: a create in progress writes its files before its
    commit creates the table, so ``grace`` must exceed the longest write-to-commit time of
    any writer. Each prefix is checked again for a table right before its objects go."""
    from flightsrv.table.names import is_table_name

    grace_s = _seconds(grace, "grace", warehouse)
    if not dry_run:
        warehouse.ensure_writable()
    store = warehouse.store
    now = warehouse.runtime.clock.now_ms()
    limit = now - int(grace_s * 1000)
    result = OrphanVacuumResult(dry_run=dry_run, grace_seconds=grace_s)
    plan: list[tuple[str, list, list]] = []
    for name in store.list_prefixes(""):
        if not is_table_name(name) or _has_log(store, name):
            continue
        result.prefixes_checked += 1
        old, uploads = [], []
        for p in VACUUM_PREFIXES:
            for m in store.list(f"{name}/{p}"):
                if 0 < m.last_modified_ms <= limit:
                    old.append(m)
                else:  # unknown (0) or future modification times count as young
                    result.kept_young += 1
                    result.kept_young_bytes += m.size
        uploads = [u for u in store.list_multipart(f"{name}/") if 0 < u.initiated_ms <= limit]
        if old or uploads:
            plan.append((name, old, uploads))
    _progress_start(progress, sum(len(o) + len(u) for _, o, u in plan) or None, " objects")
    try:
        for name, old, uploads in plan:
            if not dry_run and _has_log(store, name):
                continue  # a create committed meanwhile: its files are a table's now
            result.prefixes.append(name)
            for m in old:
                if not dry_run:
                    store.delete(m.key)
                result.objects.append({"key": m.key, "kind": _kind(m.key.split("/", 1)[1]),
                                       "size": m.size,
                                       "age_s": (now - m.last_modified_ms) / 1000})
                if progress is not None:
                    progress.advance(1)
            for u in uploads:
                if not dry_run:
                    try:
                        store.abort_multipart(u.key, u.upload_id)
                    except ObjectNotFound:
                        pass
                result.uploads.append({"key": u.key, "upload_id": u.upload_id,
                                       "age_s": (now - u.initiated_ms) / 1000})
                if progress is not None:
                    progress.advance(1)
    finally:
        _progress_finish(progress)
    log.info("vacuum_orphans", extra={"dry_run": dry_run, "prefixes": len(result.prefixes),
                                      "objects": result.deleted_objects,
                                      "bytes": result.deleted_bytes})
    return result


def _has_log(store, name: str) -> bool:
    """Whether prefix ``name`` holds a table's log (a pointer or any manifest)."""
    from flightsrv.table.manifest import POINTER_KEY

    try:
        store.head(f"{name}/{POINTER_KEY}")
        return True
    except ObjectNotFound:
        pass
    return next(iter(store.list(f"{name}/manifest/")), None) is not None


# ---------------------------------------------------------------------------------------
# stats


def table_stats(table) -> TableStats:
    """Health of the head version plus storage-level figures and a recommendation."""
    head = table.head()
    props = head.properties
    files = head.data_files
    rows = sum(f.rows for f in files)
    live = head.live_rows
    deleted = rows - live
    options = WriteOptions.from_properties(props)
    frac = float(props.get("compact.small_file_fraction", DEFAULT_SMALL_FILE_FRACTION))
    min_del = float(props.get("compact.min_deleted_fraction", DEFAULT_MIN_DELETED_FRACTION))
    small = int(options.target_file_size * frac)
    small_files = sum(1 for f in files if f.size < small)
    heavy = sum(1 for f in files if f.rows and f.deleted_rows / f.rows > min_del)
    dv_objects = {f.dv.path for f in files if f.dv is not None and f.dv.storage == "object"}
    old, young, uploads, _refs, _lo, _hv = _scan_orphans(table, 0)
    orphans = [m for m, _ in old] + [m for m, _ in young]
    versions = table.log.versions()
    data_bytes = sum(f.size for f in files)
    reasons = []
    if heavy:
        reasons.append({"action": "compact", "reason": f"{heavy} file(s) have more than "
                        f"{min_del:.0%} of their rows deleted"})
    if small_files >= 2:
        reasons.append({"action": "compact", "reason": f"{small_files} small file(s) under "
                        f"{small} bytes can be bin-packed"})
    if len(dv_objects) >= 2 and not heavy:
        reasons.append({"action": "compact", "reason": f"{len(dv_objects)} tombstone objects "
                        "can be coalesced"})
    max_versions = int(props.get("maintenance.max_versions", DEFAULT_MAX_VERSIONS))
    if len(versions) > max_versions:
        reasons.append({"action": "expire", "reason": f"{len(versions)} retained versions "
                        f"(more than {max_versions})"})
    orphan_bytes = sum(m.size for m in orphans)
    if orphans and (orphan_bytes > 0.1 * data_bytes or len(orphans) > 50 or uploads):
        reasons.append({"action": "vacuum", "reason": f"{len(orphans)} unreferenced object(s), "
                        f"{orphan_bytes} bytes"})
    elif uploads:
        reasons.append({"action": "vacuum", "reason": f"{len(uploads)} abandoned upload(s)"})
    return TableStats(
        table=table.name, version=head.version, files=len(files),
        row_groups=sum(f.row_groups for f in files), total_rows=rows, live_rows=live,
        deleted_rows=deleted, deleted_fraction=round(deleted / rows, 6) if rows else 0.0,
        deleted_row_groups=sum(len(f.deleted_row_groups) for f in files),
        data_bytes=data_bytes, small_files=small_files,
        dv_count=sum(1 for f in files if f.dv is not None),
        dv_inline=sum(1 for f in files if f.dv is not None and f.dv.storage == "inline"),
        dv_objects=len(dv_objects), orphan_objects=len(orphans), orphan_bytes=orphan_bytes,
        abandoned_uploads=len(uploads),
        version_count=len(versions), oldest_retained_version=versions[0] if versions else None,
        recommendation=reasons[0]["action"] if reasons else "nothing", reasons=reasons)


__all__ = ["CompactResult", "ExpireResult", "TableStats", "VacuumResult", "compact",
           "expire_snapshots", "table_stats", "vacuum"]

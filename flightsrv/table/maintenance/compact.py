"""Compaction (``OPTIMIZE``): DV-aware rewrite and bin-packing, deletes carried over, DV
coalescing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from flightsrv.errors import ConfigurationError
from flightsrv.table.types import cast_table
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import dead_positions, place, read_dv, remap_positions
from flightsrv.table.maintenance.common import (
    DEFAULT_MIN_DELETED_FRACTION,
    DEFAULT_SMALL_FILE_FRACTION,
    DEFAULT_SORT_GROUP_BYTES,
    _overdue,
    _progress_finish,
    _progress_start,
    _table_ctx,
    log,
)
from flightsrv.table.maintenance.results import CompactResult
from flightsrv.table.manifest import DataFile, DeletionVector, Manifest
from flightsrv.table.scan import FileTask, Snapshot
from flightsrv.table.writer import DataFileWriter, WriteLayout, WriteOptions

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
                 sort_by, sort_group_bytes: int,
                 max_input_bytes: int | None = None) -> tuple[list[_Group], dict]:
    """Choose input files and pack them into groups of about ``target`` live bytes.
    ``max_input_bytes``: small files are taken smallest first while their sizes add up to at
    most this (automatic maintenance's per-run budget); the others wait for a later run."""
    reasons: dict[str, str] = {}
    for f in head.data_files:
        if f.live_rows == 0:
            reasons[f.path] = "deletes"
        elif sort_by:
            reasons[f.path] = "sort"
        elif f.rows and f.deleted_rows / f.rows > min_deleted:
            reasons[f.path] = "deletes"
        elif f.inline is not None:  # inlined rows (PROTOCOL.md §18): OPTIMIZE flushes them
            reasons[f.path] = "inline"
        elif f.size < small:
            reasons[f.path] = "small"
    if max_input_bytes is not None:
        budget = max_input_bytes
        for f in sorted((f for f in head.data_files if reasons.get(f.path) == "small"),
                        key=lambda f: (f.size, f.path)):
            if f.size <= budget:
                budget -= f.size
            else:
                del reasons[f.path]
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
            deleted = np.asarray(dead_positions(table, f, head.version).to_array(),
                                 dtype=np.uint64)
            inputs.append(_Input(f, deleted, reason=reasons[f.path]))
        groups.append(_Group(inputs))
    return groups, reasons


def _engine_tables(snap: Snapshot, tasks, read_live):
    """(task, table) of each task's live rows in position order: by ``read_live(snap,
    file)`` (an engine's reader), or this module's own row-group read where it returns None;
    every table cast to the snapshot's schema, so the two sources' tables (whose nullability
    and list field names may differ) batch together."""
    schema = snap.schema
    for task in tasks:
        tables = read_live(snap, task.file)
        if tables is None:
            tables = (t for _, t in snap.iter_tables(tasks=[task]))
        for t in tables:
            yield task, cast_table(t, schema)


def _write_group(table, snap: Snapshot, g: _Group, options: WriteOptions, sort_by,
                 version_hint: int, progress, read_live=None) -> None:
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
        source = snap.iter_tables(tasks=tasks) if read_live is None \
            else _engine_tables(snap, tasks, read_live)
        for task, t in source:
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


#: a compaction whose input vanished looks through at most this many versions committed
#: since its read for the delete that emptied it (``files_emptied``); beyond, it aborts
EMPTIED_LOOKBACK = 256


def _emptied_since(table, read_version: int, head_version: int) -> set[str] | None:
    """Data files a delete dropped, every row deleted, in versions after ``read_version`` up
    to ``head_version`` (their ``files_emptied`` summaries), or None when that cannot be told
    (more than :data:`EMPTIED_LOOKBACK` versions, or one of them expired). A file removed by
    anything else (or by a delete emptying more than it lists) is in no such list: the group
    that read it aborts."""
    if head_version - read_version > EMPTIED_LOOKBACK:
        return None
    out: set[str] = set()
    for v in range(read_version + 1, head_version + 1):
        try:
            m = table.log.load(v)
        except Exception:  # noqa: BLE001 - expired or unreadable: cannot tell, so abort
            return None
        out.update((m.summary or {}).get("files_emptied", ()))
    return out


def _carry_over(table, g: _Group, head_files: dict[str, DataFile], emptied=None):
    """Outputs of ``g`` adjusted for deletes committed after the read, or None to abort.

    An input missing from the head is carried over as wholly deleted only when a delete
    listed it as emptied (``emptied()``: the set, or None when unknown): its rows were
    deleted, never moved; one rewritten elsewhere (a compaction, a splice, a flush) aborts
    the group, so no row lives twice and no erased byte is written again.

    Returns (outputs, rows newly deleted, {output path: positions its DV must hold}); the
    caller places the DVs, once per commit."""
    fresh_seq = []
    for inp in g.inputs:
        hf = head_files.get(inp.file.path)
        if hf is None:
            gone = emptied() if emptied is not None else None
            if gone is None or inp.file.path not in gone:
                return None  # rewritten concurrently, or cannot tell: abort this group
            now = np.arange(inp.file.rows, dtype=np.uint64)  # every row is deleted now
        elif hf.etag != inp.file.etag:
            return None  # rewritten concurrently: abort this group
        elif hf.dv == inp.file.dv and hf.deleted_row_groups == inp.file.deleted_row_groups:
            continue
        else:
            now = np.asarray(dead_positions(table, hf).to_array(), dtype=np.uint64)
        if not np.isin(inp.deleted, now, assume_unique=True).all():
            return None  # deletions only grow; anything else means we cannot map safely
        fresh = np.setdiff1d(now, inp.deleted, assume_unique=True)
        if len(fresh) == 0:
            continue
        # rank of a kept position among the kept rows the outputs were written from
        fresh_seq.append(inp.base + remap_positions(inp.deleted, fresh))
    if not fresh_seq:
        return list(g.outputs), 0, {}
    seq = np.concatenate(fresh_seq)
    if g.inverse is not None:
        seq = g.inverse[seq]
    which = np.searchsorted(g.out_offsets, seq, side="right") - 1
    outs, bitmaps, carried = [], {}, 0
    for i, o in enumerate(g.outputs):
        pos = seq[which == i] - g.out_offsets[i]
        if len(pos) == 0:
            outs.append(o)
            continue
        bm = BitMap64(pos.astype(np.uint64))
        carried += len(bm)
        if len(bm) >= o.rows:
            continue  # every row of this output was deleted meanwhile
        bitmaps[o.path] = bm
        outs.append(dataclasses.replace(o, stats_wide=True))
    return outs, carried, bitmaps


def _coalesce_plan(table, head: Manifest, inputs: set[str]) -> dict[str, DeletionVector]:
    """New descriptors for kept files' object DVs when they are spread over 2+ objects."""
    kept = [f for f in head.data_files if f.path not in inputs and f.dv_object]
    if len({f.dv_object for f in kept}) < 2:
        return {}
    return place(table, {f.path: read_dv(table.store, f.dv, table=table.name,
                                          data_file=f.path, version=head.version)
                         for f in kept})


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
                  coalesced: dict | None = None, extra_summary: dict | None = None,
                  operation: str = "compact"):
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
        last: list = []  # outputs of a group none of whose inputs is in the head any more
        removed: set[str] = set()
        carried_dvs: dict[str, BitMap64] = {}
        committed = aborted = carried = 0
        stats = {"files_rewritten": 0, "files_added": 0, "bytes_rewritten": 0,
                 "bytes_written": 0, "rows_written": 0, "deleted_rows_purged": 0}
        found: list = []

        def emptied():  # looked up once per attempt, only when an input is missing
            if not found:
                found.append(_emptied_since(table, head.version, cur.version))
            return found[0]

        for g in groups:
            r = _carry_over(table, g, by_path, emptied)
            if r is None:
                aborted += 1
                continue
            outs, n, bitmaps = r
            committed += 1
            carried += n
            carried_dvs.update(bitmaps)
            removed |= {i.file.path for i in g.inputs}
            # the outputs take the place of the first input still in the head (one a delete
            # emptied meanwhile is not); with none left they go last
            anchor = next((i.file.path for i in g.inputs if i.file.path in by_path), None)
            if anchor is None:
                last.extend(outs)
            else:
                replace[anchor] = outs
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
        descriptors = place(table, carried_dvs)
        new_version = cur.version + 1
        files = []
        def placed(o):
            o = dataclasses.replace(o, added_version=head.version)
            if o.path in descriptors:
                o = dataclasses.replace(o, dv=descriptors[o.path])
            return o

        for f in cur.data_files:
            if f.path in replace:
                files.extend(placed(o) for o in replace[f.path])
            elif f.path in removed:
                continue
            elif f.path in moved:
                files.append(dataclasses.replace(f, dv=moved[f.path]))
            else:
                files.append(f)
        files.extend(placed(o) for o in last)
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
        return dataclasses.replace(cur, operation=operation, summary=summary,
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
    result.dv_objects_after = len({f.dv_object for f in m.data_files if f.dv_object})
    return m


def compact(table, *, target_file_size: int | None = None,
            min_deleted_fraction: float | None = None, small_file_fraction: float | None = None,
            small_file_threshold: int | None = None, sort_by=None,
            sort_group_bytes: int = DEFAULT_SORT_GROUP_BYTES, coalesce_dvs: bool = True,
            dry_run: bool = False, progress=None, max_input_bytes: int | None = None,
            extra_summary: dict | None = None, report_overdue: bool = True,
            read_live=None) -> CompactResult:
    """Rewrite delete-heavy and small files (and coalesce DVs) in one commit.

    Files whose deleted fraction is over ``min_deleted_fraction`` (table property
    ``compact.min_deleted_fraction``, default 0.1) are rewritten without their deleted rows;
    files under ``small_file_threshold`` bytes (default ``small_file_fraction`` × target,
    property ``compact.small_file_fraction``, default 0.5) are bin-packed up to
    ``target_file_size`` (property ``target_file_size``, writer default). With ``sort_by``
    every file is rewritten sorted by those columns (groups of up to ``sort_group_bytes``
    are sorted in memory). See the module docstring for the concurrency rule.

    ``max_input_bytes``: rewrite at most this many bytes of small files, smallest first.
    ``extra_summary``: merged into the commit's summary (automatic maintenance records
    ``trigger`` and ``task`` there). ``report_overdue=False`` skips the erasure-deadline
    report (``erasures_overdue`` stays empty). ``read_live(snapshot, file)``: an engine's
    reader of one file's live rows (current schema, position order, an iterable of Arrow
    tables), or None where it does not read that file; the row count is checked against
    the manifest either way."""
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
                                   sort_group_bytes=sort_group_bytes,
                                   max_input_bytes=max_input_bytes)
    inputs = {i.file.path for g in groups for i in g.inputs}
    result.reasons = {p: r for p, r in reasons.items() if p in inputs}
    result.groups_planned = len(groups)
    result.dv_objects_before = len({f.dv_object for f in head.data_files if f.dv_object})
    if dry_run:
        result.files_rewritten = len(inputs)
        result.bytes_rewritten = sum(i.file.size for g in groups for i in g.inputs)
        result.deleted_rows_purged = sum(len(i.deleted) for g in groups for i in g.inputs)
        result.erasures_overdue = _overdue(table, result) if report_overdue else []
        return result

    _progress_start(progress, sum(i.file.size for g in groups for i in g.inputs) or None, " B")
    try:
        for g in groups:
            _write_group(table, snap, g, options, sort_by, head.version, progress, read_live)
        coalesced = _coalesce_plan(table, head, inputs) if coalesce_dvs else {}
        m = commit_groups(table, head, groups, result, coalesced=coalesced,
                          extra_summary=extra_summary) if groups or coalesced else None
        if m is not None:
            log.info("compact", extra={"table": table.name, "version": m.version,
                                       "files_rewritten": result.files_rewritten,
                                       "files_added": result.files_added,
                                       **(extra_summary or {})})
        result.erasures_overdue = _overdue(table, result) if report_overdue else []
        return result
    finally:
        _progress_finish(progress)

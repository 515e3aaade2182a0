"""``Table.delete(predicate)`` as deletion-vector and metadata-only commits.

Plan against a pinned snapshot S:
1. prune files by manifest statistics: NONE → skip; ALL → drop the whole file (metadata only);
2. prune row groups by footer statistics: NONE → skip; ALL → mark the row group deleted
   (metadata only, its bytes are never read);
3. in the remaining row groups read only the predicate's columns, skip rows already deleted,
   and collect the matching row positions.

Commit (one version, through the commit loop): for each touched file of the head, union the new
positions with the head's DV (concurrent deletes merge), add deleted row groups, drop files
with no live rows left. Rows appended after S live in files S never saw, so they are never
deleted (snapshot isolation for the predicate). If a targeted file is gone from the head
(compacted or spliced concurrently), the whole delete is re-planned against the new head.
The returned count is the number of rows this commit turned from live to deleted.
"""

from __future__ import annotations

import dataclasses

from pyroaring import BitMap64

from flightsrv.errors import CommitConflict
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import (
    INLINE_LIMIT,
    encode_blob,
    inline_descriptor,
    read_dv,
    write_dv_object,
)
from flightsrv.table.manifest import DataFile
from flightsrv.table.predicate import Match, Predicate, manifest_stats_lookup, rowgroup_stats_lookup
from flightsrv.table.scan import FileTask, open_parquet

MAX_REPLANS = 5


class _Replan(Exception):
    pass


@dataclasses.dataclass
class FileDelete:
    whole_file: bool = False
    row_groups: set = dataclasses.field(default_factory=set)
    positions: BitMap64 = dataclasses.field(default_factory=BitMap64)


def plan_delete(snap, pred: Predicate) -> dict[str, FileDelete]:
    plan: dict[str, FileDelete] = {}
    tasks: list[FileTask] = []
    for f in snap.manifest.data_files:
        if f.live_rows == 0:
            continue
        m = pred.evaluate_stats(manifest_stats_lookup(f, snap.schema))
        if m is Match.NONE:
            continue
        if m is Match.ALL:
            plan[f.path] = FileDelete(whole_file=True)
            continue
        md = open_parquet(snap.store, f, table=snap.table.name).metadata
        fd = FileDelete()
        some = []
        for i in range(f.row_groups):
            if i in f.deleted_row_groups:
                continue
            rm = pred.evaluate_stats(rowgroup_stats_lookup(md.row_group(i), snap.schema))
            if rm is Match.ALL:
                fd.row_groups.add(i)
            elif rm is Match.SOME:
                some.append(i)
        if fd.row_groups and len(fd.row_groups) + len(f.deleted_row_groups) == f.row_groups:
            plan[f.path] = FileDelete(whole_file=True)
            continue
        if some:
            tasks.append(FileTask(f, some, snap.deleted_positions(f)))
        plan[f.path] = fd
    for task, t in snap.iter_tables([], pred, with_positions=True, tasks=tasks):
        if t.num_rows:
            plan[task.file.path].positions.update(t.column("__pos").to_numpy().astype("uint64"))
    return {p: d for p, d in plan.items() if d.whole_file or d.row_groups or d.positions}


def _apply(table, head_file: DataFile, d: FileDelete, dvs_out: list) -> tuple[DataFile | None, int]:
    """New entry for ``head_file`` after delete ``d`` (None: file removed) and rows deleted."""
    if d.whole_file:
        return None, head_file.live_rows
    existing = read_dv(table.store, head_file.dv, table=table.name, data_file=head_file.path) \
        if head_file.dv else BitMap64()
    dead_groups = set(head_file.deleted_row_groups)
    new_groups = d.row_groups - dead_groups
    count = 0
    for g in new_groups:
        start = head_file.row_group_offsets[g]
        end = start + head_file.row_group_rows(g)
        count += (end - start) - existing.range_cardinality(start, end)
        existing.remove_range(start, end)  # the group marker now covers these rows
    dead_groups |= new_groups
    positions = BitMap64(d.positions)
    for g in dead_groups:
        start = head_file.row_group_offsets[g]
        positions.remove_range(start, start + head_file.row_group_rows(g))
    fresh = positions - existing
    count += len(fresh)
    merged = existing | fresh
    if count == 0:
        return head_file, 0
    live = head_file.rows - len(merged) - sum(head_file.row_group_rows(g) for g in dead_groups)
    if live <= 0:
        return None, count
    dv = None
    if len(merged):
        blob = encode_blob(merged)
        if len(blob) <= INLINE_LIMIT:
            dv = inline_descriptor(merged)
        else:
            dvs_out.append((head_file.path, blob, len(merged)))
            dv = "pending"
    return dataclasses.replace(head_file, dv=dv, deleted_row_groups=tuple(sorted(dead_groups)),
                               stats_wide=True), count


def plan_mutator(table, plan: dict[str, FileDelete], summary: dict, result: dict,
                 operation: str = "delete"):
    """The commit mutator of a delete plan: merges each file's positions into the head's DV
    (``_apply``), drops files left without live rows, writes large DVs in one object.
    ``result["count"]`` gets the rows this commit deletes. Raises ``_Replan`` if a file the
    plan targets is gone from the head (rewritten concurrently)."""

    def mutate(head):
        head = require_table(head, table.name)
        by_path = head.files_by_path()
        if any(p not in by_path for p in plan):
            raise _Replan()
        pending: list = []
        new_files, count, removed = [], 0, 0
        for f in head.data_files:
            if f.path not in plan:
                new_files.append(f)
                continue
            nf, n = _apply(table, f, plan[f.path], pending)
            count += n
            if nf is None:
                removed += 1
            else:
                new_files.append(nf)
        result["count"] = count
        if count == 0:
            return None
        if pending:
            descriptors = write_dv_object(table, pending)
            new_files = [dataclasses.replace(f, dv=descriptors[f.path])
                         if f.dv == "pending" else f for f in new_files]
        full = {"rows_added": 0, "rows_deleted": count, "files_added": 0,
                "files_removed": removed, **summary}
        return dataclasses.replace(head, operation=operation, summary=full,
                                   data_files=tuple(new_files))

    return mutate


def commit_plan(table, plan: dict[str, FileDelete], *, read_version: int,
                operation: str = "delete", summary: dict | None = None) -> int | None:
    """Commit a delete plan computed elsewhere (e.g. by Spark executors) in one version.

    Returns the rows deleted (0: nothing committed), or None when a file the plan targets is
    gone from the head, so the caller must re-plan against a new snapshot."""
    if not plan:
        return 0
    result: dict = {}
    try:
        committed = table.commit(plan_mutator(
            table, plan, {**(summary or {}), "read_version": read_version}, result, operation))
    except _Replan:
        return None
    return result.get("count", 0) if committed is not None else 0


def delete_rows(table, predicate: str) -> int:
    snap = table.snapshot()
    pred = Predicate.parse(predicate, snap.schema)
    for _ in range(MAX_REPLANS):
        plan = plan_delete(snap, pred)
        if not plan:
            return 0
        n = commit_plan(table, plan, read_version=snap.version,
                        summary={"predicate": predicate})
        if n is None:
            snap = table.snapshot()
            continue
        return n
    raise CommitConflict("delete re-planned too often: its files keep being rewritten",
                         table=table.name, predicate=predicate, attempts=MAX_REPLANS)

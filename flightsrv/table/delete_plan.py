"""Commit a decided change: rows to delete (physical positions per data file) and data files
to add, in one version, with the conflict rules of docs/PROTOCOL.md §8.

Which rows a DELETE, UPDATE or MERGE touches is decided elsewhere (by DuckDB, in
:mod:`flightsrv.engine.dml`, or by Spark executors running the same planner) against a pinned
*base* version; this module only records the decision. The commit goes through the one
commit loop, and its mutator re-validates against whatever head it is given:

- a data file the change deletes from is gone from the head (compacted, spliced): the
  positions mean nothing any more → :class:`Rerun` (the caller re-runs the statement on a
  new snapshot; stale positions are never applied);
- the head deleted, after the base, some of the rows this change deletes (a concurrent
  DELETE, or an UPDATE that moved them): → :class:`Rerun` (the row may live on elsewhere,
  e.g. as an updated copy, and only a re-run can find it);
- the head deleted *other* rows of the same files (disjoint concurrent deletes): the bitmaps
  merge, nothing re-runs;
- ``appends_conflict`` (a MERGE that inserts): files added after the base → :class:`Rerun`
  (a concurrently appended row could have matched);
- everything else (appends, changes to other files) commutes.

Representation: a row group whose live rows are all deleted is marked in
``deleted_row_groups`` (metadata only); a file left with no live row is removed from the
manifest; other positions merge into the file's deletion vector (inline when small, else one
shared object per commit). The count returned is the number of rows this commit turned from
live to deleted.
"""

from __future__ import annotations

import dataclasses

from pyroaring import BitMap64

from flightsrv.table.commit import require_table
from flightsrv.table.deletes import dead_positions, place, split_deleted
from flightsrv.table.manifest import DataFile, Manifest

MAX_RERUNS = 8


class Rerun(Exception):
    """The change was decided on a version the head no longer agrees with; re-run the
    statement against a new snapshot (``reason`` says why)."""

    def __init__(self, reason: str, path: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.path = path


@dataclasses.dataclass
class FileDelete:
    """Positions to delete in one data file (kept for callers that build plans by hand:
    Spark executors). ``whole_file``/``row_groups`` are folded into positions on commit."""

    whole_file: bool = False
    row_groups: set = dataclasses.field(default_factory=set)
    positions: BitMap64 = dataclasses.field(default_factory=BitMap64)


#: a delete's summary lists (``files_emptied``) the data files it dropped because it deleted
#: their last live rows, when they are at most this many (PROTOCOL.md §3); a compaction that
#: read such a file carries the deletion over instead of aborting its group
EMPTIED_LISTED = 128


def _same_deletes(a: DataFile, b: DataFile) -> bool:
    return a.dv == b.dv and a.deleted_row_groups == b.deleted_row_groups


def _apply(head_file: DataFile, positions: BitMap64,
           dead: BitMap64) -> tuple[DataFile, BitMap64] | None:
    """``head_file`` with ``positions`` (disjoint from ``dead``, its current deletions)
    deleted: the entry with its new deleted row groups and the positions its deletion vector
    must hold (placed by the caller, once per commit); None when no live row is left."""
    merged = dead | positions
    if len(merged) >= head_file.rows:
        return None
    groups, rest = split_deleted(head_file, merged)
    return dataclasses.replace(head_file, dv=None, deleted_row_groups=groups,
                               stats_wide=True), rest


def commit_changes(table, base: Manifest, deletes: dict[str, BitMap64],
                   added: list[DataFile] = (), *, operation: str, summary: dict | None = None,
                   appends_conflict: bool = False) -> tuple[Manifest | None, int]:
    """Commit ``deletes`` (positions live in ``base``) and ``added`` files in one version.

    Returns (manifest, rows deleted); (None, 0) when there is nothing to do. Raises
    :class:`Rerun` per the module docstring."""
    deletes = {p: bm for p, bm in deletes.items() if len(bm)}
    if not deletes and not added:
        return None, 0
    base_files = base.files_by_path()
    base_dead = {p: dead_positions(table, base_files[p]) for p in deletes}
    for p, bm in deletes.items():
        if len(bm & base_dead[p]):
            raise ValueError(f"positions of {p} already deleted in version {base.version}")
    base_paths = set(base_files)
    result = {"count": 0}

    def mutate(head):
        head = require_table(head, table.name)
        if head.table_uuid != base.table_uuid:
            raise Rerun("the table was dropped and re-created")
        by_path = head.files_by_path()
        for p in deletes:
            if p not in by_path:
                raise Rerun("a data file the statement changes was rewritten", p)
        if appends_conflict and any(f.path not in base_paths for f in head.data_files):
            raise Rerun("rows were appended concurrently")
        changed: dict[str, tuple[DataFile, BitMap64]] = {}
        new_files, count, removed, emptied = [], 0, 0, []
        for f in head.data_files:
            positions = deletes.get(f.path)
            if positions is None:
                new_files.append(f)
                continue
            if _same_deletes(f, base_files[f.path]):
                dead = base_dead[f.path]
            else:
                dead = dead_positions(table, f)
                if len(positions & (dead - base_dead[f.path])):
                    raise Rerun("rows the statement changes were deleted concurrently", f.path)
            applied = _apply(f, positions, dead)
            count += len(positions)
            if applied is None:
                removed += 1
                emptied.append(f.path)
            else:
                changed[f.path] = applied
                new_files.append(applied[0])
        dvs = place(table, {p: rest for p, (_, rest) in changed.items()})
        new_files = [dataclasses.replace(f, dv=dvs[f.path]) if f.path in changed else f
                     for f in new_files]
        version = head.version + 1
        fresh = tuple(dataclasses.replace(f, added_version=version) for f in added)
        result["count"] = count
        full = {"rows_added": sum(f.rows for f in added), "rows_deleted": count,
                "files_added": len(added), "files_removed": removed,
                "read_version": base.version, **(summary or {})}
        if 0 < len(emptied) <= EMPTIED_LISTED:
            # files dropped because no row of theirs is left (never moved elsewhere): a
            # compaction that read one before can still commit, its rows deleted
            full["files_emptied"] = sorted(emptied)
        return dataclasses.replace(head, operation=operation, summary=full,
                                   data_files=tuple(new_files) + fresh)

    m = table.commit(mutate)
    return m, result["count"]


def commit_plan(table, plan: dict[str, FileDelete], *, read_version: int,
                operation: str = "delete", summary: dict | None = None) -> int | None:
    """Commit a delete plan computed elsewhere (e.g. by Spark executors) against
    ``read_version``. Returns the rows deleted (0: nothing committed), or None when the
    statement must be re-planned on a new snapshot (:class:`Rerun`)."""
    if not plan:
        return 0
    base = table.log.load(read_version)
    by_path = base.files_by_path()
    deletes = {}
    for path, d in plan.items():
        f = by_path.get(path)
        if f is None:
            return None
        bm = BitMap64(d.positions)
        if d.whole_file:
            bm.add_range(0, f.rows)
        for g in d.row_groups:
            start = f.row_group_offsets[g]
            bm.add_range(start, start + f.row_group_rows(g))
        deletes[path] = bm - dead_positions(table, f)
    try:
        _, n = commit_changes(table, base, deletes, operation=operation, summary=summary)
    except Rerun:
        return None
    return n


__all__ = ["FileDelete", "MAX_RERUNS", "Rerun", "commit_changes", "commit_plan",
           "dead_positions"]

"""Planning and committing an erasure: a positions plan becomes targets (``_targets``), and
one commit swaps each target file for its replacement (``_mutator``).

The mutator re-validates against each head: a target file gone from the head (compacted,
spliced by someone else) raises ``_Replan``, which the entry point turns into ``StalePlan``
after deleting what it wrote; rows deleted in the head but not removed (a concurrent DV
delete) are carried to the new file as a DV at their shifted positions, so no delete is lost
and no deleted row comes back. ``MAX_REPLANS`` is the one re-plan budget of every erasure
path (``erase_positions``, ``flightsrv.spark.erasure``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from pyroaring import BitMap64

from flightsrv.errors import CommitConflict, ConfigurationError
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import dead_positions, place, remap_positions
from flightsrv.table.erase.replace import Replacement, Target
from flightsrv.table.manifest import DataFile, Manifest

MAX_REPLANS = 5


class _Replan(Exception):
    """A file the erasure targets left the head (internal to the commit mutator)."""


class StalePlan(CommitConflict):
    """A file a positions plan targets is no longer in the head (rewritten concurrently):
    the positions mean nothing there. Re-plan on a new snapshot (``erase_positions`` does)."""


def _dead_positions(table, f: DataFile) -> np.ndarray:
    """Sorted old positions (int64) dead in ``f`` (``deletes.dead_positions`` as an array)."""
    return np.asarray(dead_positions(table, f).to_array(), dtype=np.int64)


# -- the commit ----------------------------------------------------------------------


def _mutator(table, snap, prepared: list[Replacement], operation: str, extra: dict, out: dict,
             *, strict: bool = False):
    """``strict`` (a SQL DELETE's plan, rows the statement found live): a planned row
    deleted in the head since ``snap`` re-plans (``_Replan``), as a deletion vector commit
    re-runs its statement: an UPDATE may have moved that row, and its new copy must be
    found and deleted too."""
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
            if strict and len(remove) and (hf.dv, hf.deleted_row_groups) != (
                    p.target.file.dv, p.target.file.deleted_row_groups):
                was = _dead_positions(table, p.target.file)
                if bool(np.any(np.isin(remove, dead, assume_unique=True)
                               & ~np.isin(remove, was, assume_unique=True))):
                    raise _Replan()
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


def _positions(table, f: DataFile, positions) -> np.ndarray:
    """The plan's positions in ``f`` as sorted int64, checked as unsigned 64-bit numbers
    before the conversion (a position of 2**63 or more would wrap to a negative one)."""
    try:
        bm = positions if isinstance(positions, BitMap64) else BitMap64(positions)
    except (OverflowError, TypeError, ValueError):
        try:
            bad = next((p for p in positions if not (isinstance(p, (int, np.integer))
                                                     and 0 <= int(p) < 2**64)), None)
        except TypeError:  # not a collection of positions at all
            bad = type(positions).__name__
        raise ConfigurationError("the positions plan names a position that is not a row "
                                 "number (an integer from 0)", table=table.name,
                                 object=f.path, position=bad) from None
    if len(bm) and bm.max() >= f.rows:
        raise ConfigurationError("the positions plan names a row past the end of the file",
                                 table=table.name, object=f.path, rows=f.rows,
                                 position=bm.max())
    return np.asarray(bm.to_array(), dtype=np.int64)


def _targets(table, snap, plan: dict) -> list[Target]:
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
        new = _positions(table, f, positions)
        if not len(new):
            continue
        dead = _dead_positions(table, f)
        touched = np.unique(np.searchsorted(f.row_group_offsets, new, side="right") - 1)
        dead_groups = np.searchsorted(f.row_group_offsets, dead, side="right") - 1
        targets.append(Target(f, np.union1d(new, dead[np.isin(dead_groups, touched)])))
    return targets

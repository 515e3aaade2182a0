"""Flushing inlined rows into Parquet (docs/PROTOCOL.md §18.5).

:func:`flush_inlined` rewrites every inlined data file of the head into ordinary Parquet data
files (one group per partition value, live rows only) and swaps them in with one commit
through compaction's commit (:func:`flightsrv.table.maintenance.compact.commit_groups`): a
delete that commits on an inlined file after the flush read it is carried over to the
output's rows, and a group whose input vanished meanwhile (another flush, an erasure) is
dropped, so a racing delete never resurrects a row. Only the chunks whose summaries count
inlined entries are read. ``OPTIMIZE`` flushes too (its planner always picks inlined files).

It is a plain function so that a background maintenance scheduler can run it as one task:
call it when :func:`flightsrv.table.inline.needs_flush` says so for the head.
"""

from __future__ import annotations

import numpy as np

from flightsrv.table.deletes import dead_positions
from flightsrv.table.maintenance.common import _table_ctx, log
from flightsrv.table.maintenance.compact import _Group, _Input, _write_group, commit_groups
from flightsrv.table.maintenance.results import CompactResult
from flightsrv.table.writer import WriteOptions


def inlined_files(head) -> list:
    """The head's inlined data-file entries, reading only chunks that hold some."""
    files = head.data_files
    if hasattr(files, "select"):
        listed = files.select(lambda refs: [r for r in refs if r.inline[0]])
    else:
        listed = list(files)
    return [f for f in listed if f.inline is not None]


def flush_inlined(table, *, progress=None) -> CompactResult:
    """Turn the head's inlined rows into Parquet data files in one commit (operation
    ``flush``). Returns what was done; ``version`` is None when nothing was inlined (or
    every group lost a race and nothing committed)."""
    snap = table.snapshot()
    head = snap.manifest
    result = CompactResult(table=table.name, dry_run=False, read_version=head.version)
    inlined = inlined_files(head)
    if not inlined:
        return result
    by_key: dict[tuple, list] = {}
    for f in inlined:
        by_key.setdefault((f.spec_id, tuple(f.partition)), []).append(f)
    groups = []
    for files in by_key.values():
        inputs = [_Input(f, np.asarray(dead_positions(table, f).to_array(), dtype=np.uint64),
                         reason="inline") for f in files]
        groups.append(_Group(inputs))
    result.groups_planned = len(groups)
    result.reasons = {f.path: "inline" for f in inlined}
    options = WriteOptions.from_properties(head.properties)
    for g in groups:
        _write_group(table, snap, g, options, [], head.version, progress)
    m = commit_groups(table, head, groups, result, operation="flush",
                      extra_summary={"inlined_files_flushed": len(inlined)})
    if m is not None:
        log.info("flush inlined rows", extra={**_table_ctx(table), "version": m.version,
                                               "files_flushed": result.files_rewritten,
                                               "files_added": result.files_added})
    return result


__all__ = ["flush_inlined", "inlined_files"]

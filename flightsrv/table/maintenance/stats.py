"""Table health: files, row groups, rows, deleted fraction, DVs, orphans, versions and a
recommendation."""

from __future__ import annotations

from flightsrv.table.datafile import DVStorage
from flightsrv.table.maintenance.common import (
    DEFAULT_MAX_VERSIONS,
    DEFAULT_MIN_DELETED_FRACTION,
    DEFAULT_SMALL_FILE_FRACTION,
)
from flightsrv.table.maintenance.results import TableStats
from flightsrv.table.maintenance.vacuum import _scan_orphans
from flightsrv.table.writer import WriteOptions

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
    dv_objects = {f.dv_object for f in files if f.dv_object}
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
        dv_inline=sum(1 for f in files if f.dv is not None and f.dv.storage is DVStorage.INLINE),
        dv_objects=len(dv_objects), orphan_objects=len(orphans), orphan_bytes=orphan_bytes,
        abandoned_uploads=len(uploads),
        version_count=len(versions),
        oldest_retained_version=table.log.oldest_readable(versions),
        recommendation=reasons[0]["action"] if reasons else "nothing", reasons=reasons,
        inlined_files=head.inline[0], inlined_rows=head.inline[1])


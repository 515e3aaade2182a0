"""What maintenance operations return: result dataclasses with ``to_dict()`` (the JSON form
SQL answers and ``--format jsonl`` use). How the CLI shows them lives in
:mod:`flightsrv.cli.render`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------------------
# results


class _Result:
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class _DeletesObjects(_Result):
    """A result listing the objects it deleted (or would delete) in ``objects``."""

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
    #: deletions whose bytes are stored past the table's erasure.deadline (erasure_status);
    #: None: unknown (a retained manifest could not be read; ``warnings`` says which)
    erasures_overdue: list | None = field(default_factory=list)
    #: what could not be done after the work itself (which stands): e.g. an old manifest
    #: that does not parse, so the erasure deadlines were not checked
    warnings: list = field(default_factory=list)


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


@dataclass
class VacuumResult(_DeletesObjects):
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
    #: deletions whose bytes are stored past the table's erasure.deadline (erasure_status);
    #: None: unknown (a retained manifest could not be read; ``warnings`` says which)
    erasures_overdue: list | None = field(default_factory=list)
    #: what could not be done after the work itself (which stands): e.g. an old manifest
    #: that does not parse, so the erasure deadlines were not checked
    warnings: list = field(default_factory=list)
    #: manifests of dropped incarnations removed (their DROP is older than the grace)
    dropped_versions: list = field(default_factory=list)


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
    inlined_files: int = 0  # appends whose rows live in the manifest (PROTOCOL.md §18)
    inlined_rows: int = 0


@dataclass
class OrphanVacuumResult(_DeletesObjects):
    """What ``Warehouse.vacuum_orphans`` removed (or would remove, with ``dry_run``)."""

    dry_run: bool
    grace_seconds: float
    prefixes_checked: int = 0  # table-name prefixes that hold no table
    prefixes: list = field(default_factory=list)  # those with old objects (to go / gone)
    objects: list = field(default_factory=list)  # [{key, kind, size, age_s}]
    uploads: list = field(default_factory=list)  # [{key, upload_id, age_s}] aborted
    kept_young: int = 0  # younger than the grace period: a create may still commit them
    kept_young_bytes: int = 0
    temp_files: int = 0  # killed writers' temp files (local store) older than the grace
    temp_bytes: int = 0

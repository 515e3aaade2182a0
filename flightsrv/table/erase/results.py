"""What an erasure returns: ``FileErasure`` (one data file), ``ErasedObject`` (one object
that held erased rows), ``PurgeResult`` (the whole erasure, with its verification) and
``ErasedCount`` (the row count ``Table.delete`` returns). Data and ``to_dict()`` only; how the
CLI shows them lives in :mod:`flightsrv.cli.render`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from flightsrv.table import erasure_check as check


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
    redacted_version: int | None = None  # a clean head (request text, hidden entries)
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
            "redacted_version": self.redacted_version,
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

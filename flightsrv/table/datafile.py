"""Data-file entries of a manifest (docs/PROTOCOL.md §4): the frozen models and their JSON
form, shared by the version root (:mod:`flightsrv.table.manifest`) and the manifest chunks
(:mod:`flightsrv.table.chunks`) that list them in format 2."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from flightsrv.errors import CorruptObject

FORMAT_VERSION = 2  # the format new tables are created with (manifest re-exports it)
#: format 3 is format 2 whose version reaches inlined data files (docs/PROTOCOL.md §18): a
#: root (and a chunk) is written as 3 exactly when it holds or reaches an inlined entry, so
#: readers that know only format 2 refuse it instead of failing on a missing object
INLINE_FORMAT = 3
INLINE_PREFIX = "inline/"


class DVStorage(enum.StrEnum):
    """Where a deletion vector's bytes live."""

    INLINE = "inline"  # base64 of the framed bytes, in the manifest entry itself
    OBJECT = "object"  # a (offset, length) slice of a write-once object under tombstone/


@dataclass(frozen=True)
class DeletionVector:
    """Where a file's deleted row positions live (the bytes are a framed roaring bitmap,
    see ``flightsrv.table.deletes``, which also decides the storage): ``INLINE`` (``data`` =
    base64 of the framed bytes) or ``OBJECT`` (``path`` at ``offset``/``length`` inside a
    write-once object)."""

    storage: DVStorage
    cardinality: int
    data: str | None = None
    path: str | None = None
    offset: int = 0
    length: int = 0


@dataclass(frozen=True)
class DataFile:
    path: str  # key relative to the table root
    size: int
    etag: str
    rows: int  # physical rows in the file
    row_group_offsets: tuple[int, ...]  # first row of each row group
    stats: dict  # column -> {"min":..,"max":..,"nulls":..}; JSON-encoded values
    added_version: int
    dv: DeletionVector | None = None
    deleted_row_groups: tuple[int, ...] = ()  # whole row groups deleted (not also in the DV)
    stats_wide: bool = False  # True once rows were deleted: min/max are bounds, not exact
    schema_id: int = 0  # the table schema the file was written with (format 2)
    spec_id: int = 0  # the partition spec its rows were split by
    partition: tuple = ()  # the partition values (JSON), one per field of that spec
    #: an inlined file (format 3, docs/PROTOCOL.md §18): base64 of its Parquet bytes, held in
    #: the entry itself; its ``path`` (under ``inline/``) names no object
    inline: str | None = None

    @property
    def is_inline(self) -> bool:
        return self.inline is not None

    @property
    def row_groups(self) -> int:
        return len(self.row_group_offsets)

    def row_group_rows(self, i: int) -> int:
        end = self.row_group_offsets[i + 1] if i + 1 < self.row_groups else self.rows
        return end - self.row_group_offsets[i]

    @property
    def deleted_rows(self) -> int:
        n = self.dv.cardinality if self.dv else 0
        return n + sum(self.row_group_rows(i) for i in self.deleted_row_groups)

    @property
    def dv_object(self) -> str | None:
        """The key of the write-once object holding this file's deletion vector, if its DV
        is stored in one (None: no DV, or an inline one)."""
        dv = self.dv
        return dv.path if dv is not None and dv.storage is DVStorage.OBJECT else None

    @property
    def live_rows(self) -> int:
        return self.rows - self.deleted_rows


def file_to_json(f: DataFile, format_version: int = FORMAT_VERSION,
                 names: dict[str, str] | None = None) -> dict:
    """Shallow JSON form of a data-file entry (``dataclasses.asdict`` deep-copies, which
    dominates commit latency for manifests with thousands of files). Format 1 keys the
    statistics by column name (``names``: field id -> name)."""
    stats = f.stats
    if format_version == 1 and names is not None:
        stats = {names.get(k, k): v for k, v in stats.items()}
    out = {"path": f.path, "size": f.size, "etag": f.etag, "rows": f.rows,
           "row_group_offsets": f.row_group_offsets, "stats": stats,
           "added_version": f.added_version}
    if f.dv is not None:
        dv = f.dv
        if format_version == 1:
            out["dv"] = {"storage": dv.storage.value, "cardinality": dv.cardinality,
                         "data": dv.data, "path": dv.path, "offset": dv.offset, "length": dv.length}
        elif dv.storage is DVStorage.INLINE:
            out["dv"] = {"storage": "inline", "cardinality": dv.cardinality, "data": dv.data}
        else:
            out["dv"] = {"storage": "object", "cardinality": dv.cardinality, "path": dv.path,
                         "offset": dv.offset, "length": dv.length}
    if f.deleted_row_groups:
        out["deleted_row_groups"] = f.deleted_row_groups
    if f.stats_wide:
        out["stats_wide"] = True
    if format_version >= 2:
        if f.schema_id:
            out["schema_id"] = f.schema_id
        if f.spec_id:
            out["spec_id"] = f.spec_id
        if f.partition:
            out["partition"] = list(f.partition)
        if f.inline is not None:
            out["inline"] = f.inline
    return out


def file_from_json(d: dict, format_version: int = FORMAT_VERSION,
                   ids: dict[str, str] | None = None) -> DataFile:
    """A data-file entry from its JSON (format 1: ``ids`` re-keys statistics by id)."""
    dv = d.get("dv")
    stats = d.get("stats") or {}
    if ids is not None:
        stats = {ids.get(k, k): v for k, v in stats.items()}
    return DataFile(
        path=d["path"], size=d["size"], etag=d["etag"], rows=d["rows"],
        row_group_offsets=tuple(d["row_group_offsets"]), stats=stats,
        added_version=d["added_version"],
        dv=dv_from_json(dv, d["path"]) if dv else None,
        deleted_row_groups=tuple(d.get("deleted_row_groups", ())),
        stats_wide=bool(d.get("stats_wide", False)),
        schema_id=int(d.get("schema_id", 0)) if format_version >= 2 else 0,
        spec_id=int(d.get("spec_id", 0)) if format_version >= 2 else 0,
        partition=tuple(d.get("partition", ())) if format_version >= 2 else (),
        inline=d.get("inline") if format_version >= 2 else None,
    )


def dv_from_json(d: dict, data_file: str) -> DeletionVector:
    """A descriptor from its JSON; an unknown storage kind is a corrupt entry."""
    try:
        storage = DVStorage(d.get("storage"))
    except ValueError:
        raise CorruptObject("unknown deletion vector storage", file=data_file,
                            storage=str(d.get("storage"))[:32]) from None
    return DeletionVector(storage, int(d["cardinality"]), data=d.get("data"),
                          path=d.get("path"), offset=int(d.get("offset", 0)),
                          length=int(d.get("length", 0)))

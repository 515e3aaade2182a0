"""The on-storage model: pointer, manifest, data-file entries (docs/PROTOCOL.md).

Frozen dataclasses; change one with ``dataclasses.replace``. JSON names are the field names.
Every manifest carries ``format_version``; readers refuse versions newer than they know.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from flightsrv.errors import CorruptObject

FORMAT_VERSION = 1
POINTER_KEY = "_latest_manifest"


def manifest_key(version: int) -> str:
    return f"manifest/v{version:020d}.json"


def version_of_key(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if name.startswith("v") and name.endswith(".json"):
        try:
            return int(name[1:-5])
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class DeletionVector:
    """Where a file's deleted row positions live (the bytes are a framed roaring bitmap,
    see ``flightsrv.table.deletes``). ``storage`` is "inline" (``data`` = base64 of the framed
    bytes) or "object" (``path`` at ``offset``/``length`` inside a write-once object)."""

    storage: str
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
    def live_rows(self) -> int:
        return self.rows - self.deleted_rows


def _file_to_dict(f: DataFile) -> dict:
    """Shallow JSON form of a data-file entry (``dataclasses.asdict`` deep-copies, which
    dominates commit latency for manifests with thousands of files)."""
    out = {"path": f.path, "size": f.size, "etag": f.etag, "rows": f.rows,
           "row_group_offsets": f.row_group_offsets, "stats": f.stats,
           "added_version": f.added_version}
    if f.dv is not None:
        dv = f.dv
        out["dv"] = {"storage": dv.storage, "cardinality": dv.cardinality, "data": dv.data,
                     "path": dv.path, "offset": dv.offset, "length": dv.length}
    if f.deleted_row_groups:
        out["deleted_row_groups"] = f.deleted_row_groups
    if f.stats_wide:
        out["stats_wide"] = True
    return out


@dataclass(frozen=True)
class Manifest:
    version: int
    previous: int | None
    table_uuid: str
    commit_id: str
    created_at_ms: int
    operation: str
    summary: dict
    schema: dict  # flightsrv.table.schema JSON
    properties: dict
    data_files: tuple[DataFile, ...]
    deletes: dict = field(default_factory=dict)  # reserved: table-level tombstones
    format_version: int = FORMAT_VERSION

    @property
    def dropped(self) -> bool:
        return self.operation == "drop"

    @property
    def live_rows(self) -> int:
        return sum(f.live_rows for f in self.data_files)

    def referenced_keys(self) -> set[str]:
        """Every object key (relative to the table) this version needs: data files and DV
        objects. Vacuum keeps them; erasure reports versions by them."""
        refs = set()
        for f in self.data_files:
            refs.add(f.path)
            if f.dv is not None and f.dv.storage == "object" and f.dv.path:
                refs.add(f.dv.path)
        return refs

    def files_by_path(self) -> dict[str, DataFile]:
        return {f.path: f for f in self.data_files}

    def to_json(self) -> bytes:
        import datetime as dt

        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["created_at"] = dt.datetime.fromtimestamp(self.created_at_ms / 1000,
                                                    tz=dt.timezone.utc).isoformat()
        d["data_files"] = [_file_to_dict(f) for f in self.data_files]
        return json.dumps(d, separators=(",", ":"), sort_keys=False).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = "?") -> "Manifest":
        try:
            d = json.loads(raw)
            fv = d.get("format_version", 0)
            if fv > FORMAT_VERSION:
                raise CorruptObject("manifest format_version is newer than this reader",
                                    key=key, format_version=fv, supported=FORMAT_VERSION)
            d.pop("created_at", None)
            files = []
            for f in d.pop("data_files"):
                dv = f.pop("dv", None)
                files.append(DataFile(
                    dv=DeletionVector(**dv) if dv else None,
                    row_group_offsets=tuple(f.pop("row_group_offsets")),
                    deleted_row_groups=tuple(f.pop("deleted_row_groups", ())),
                    **f,
                ))
            return cls(data_files=tuple(files), **d)
        except CorruptObject:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptObject("manifest does not parse", key=key, error=str(exc)) from exc


@dataclass(frozen=True)
class Pointer:
    version: int
    table_uuid: str
    commit_id: str

    def to_json(self) -> bytes:
        return json.dumps({"format_version": FORMAT_VERSION, "version": self.version,
                           "manifest": manifest_key(self.version), "table_uuid": self.table_uuid,
                           "commit_id": self.commit_id}).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = POINTER_KEY) -> "Pointer":
        try:
            d = json.loads(raw)
            return cls(int(d["version"]), d["table_uuid"], d["commit_id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptObject("pointer does not parse", key=key, error=str(exc)) from exc

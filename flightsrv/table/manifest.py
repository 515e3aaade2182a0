"""The on-storage model: pointer, manifest (a version's root), data-file entries
(docs/PROTOCOL.md §3, §4).

Frozen dataclasses; change one with ``dataclasses.replace``. JSON names are the field names.
Every manifest carries ``format_version``; readers refuse versions newer than they know.

Two formats are read and written:

- **format 1**: one JSON object per version listing every live data file; column statistics
  keyed by column name; no field ids.
- **format 2**: the version's root lists references to immutable manifest chunks
  (:mod:`flightsrv.table.chunks`) instead of the files, every field has a stable id, files
  record the schema and partition spec they were written with, statistics are keyed by
  field id, and the root carries the table's schema history and partition specs.

In memory both look alike: a format-1 manifest is given field ids on load (top-level columns
1..n, then nested fields, the order the mirrors always used) and its statistics are re-keyed
by id; writing it back as format 1 undoes that. ``Manifest.data_files`` is a tuple (format 1,
or a draft) or a lazily loaded :class:`~flightsrv.table.chunks.FileList` (format 2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from flightsrv.errors import CorruptObject
from flightsrv.table.datafile import (  # noqa: F401 - re-exported
    FORMAT_VERSION,
    INLINE_FORMAT,
    INLINE_PREFIX,
    DataFile,
    DeletionVector,
    DVStorage,
    file_from_json,
    file_to_json,
)

# FORMAT_VERSION (2) is what new tables are created with
SUPPORTED_FORMATS = (1, 2)  # what a table is created with; format 3 is read (§18)
POINTER_KEY = "_latest_manifest"
UNPARTITIONED = {"spec_id": 0, "fields": []}


def manifest_key(version: int) -> str:
    return f"manifest/v{version:020d}.json"


#: a manifest's name (``manifest_key``): exactly 20 digits. Other names under ``manifest/``
#: (``v9.json``, ``v-1.json``, an editor's backup) are stray files, never versions
_MANIFEST_NAME = re.compile(r"v([0-9]{20})\.json")


def version_of_key(key: str) -> int | None:
    m = _MANIFEST_NAME.fullmatch(key.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def _strip_ids(t):
    """A type JSON without field ids (format 1)."""
    if not isinstance(t, dict):
        return t
    out = dict(t)
    for k in ("item", "key"):
        if k in out:
            out[k] = _strip_field(out[k])
    if "fields" in out:
        out["fields"] = [_strip_field(x) for x in out["fields"]]
    return out


def _strip_field(f: dict) -> dict:
    return {k: (_strip_ids(v) if k == "type" else v) for k, v in f.items()
            if k not in ("id", "physical", "initial_default", "write_default")}


def format1_schema(schema: dict) -> dict:
    return {"fields": [_strip_field(f) for f in schema["fields"]]}


def schema_with_ids(schema: dict, schema_id: int = 0) -> tuple[dict, int]:
    """A schema JSON in format-2 form: ids for every field (kept where present), and
    ``schema_id``. Returns (schema, largest field id)."""
    from flightsrv.table.schema import max_field_id, with_field_ids

    fields, last = with_field_ids(schema["fields"], max_field_id(schema["fields"]))
    return {"schema_id": schema_id, "fields": fields}, last


@dataclass(frozen=True)
class Manifest:
    version: int
    previous: int | None
    table_uuid: str
    commit_id: str
    created_at_ms: int
    operation: str
    summary: dict
    schema: dict  # the current schema (flightsrv.table.schema JSON, with ids)
    properties: dict
    data_files: Sequence[DataFile]  # a tuple, or a lazily loaded chunks.FileList
    deletes: dict = field(default_factory=dict)  # reserved: table-level tombstones
    format_version: int = FORMAT_VERSION
    schemas: tuple = ()  # earlier schemas files may have been written with (format 2)
    partition_spec: dict = field(default_factory=lambda: dict(UNPARTITIONED))
    partition_specs: tuple = ()  # earlier partition specs
    last_column_id: int = 0
    last_partition_id: int = 999

    @property
    def dropped(self) -> bool:
        return self.operation == "drop"

    @property
    def schema_id(self) -> int:
        return int(self.schema.get("schema_id", 0))

    @property
    def spec_id(self) -> int:
        return int(self.partition_spec.get("spec_id", 0))

    @property
    def live_rows(self) -> int:
        files = self.data_files
        if hasattr(files, "live_rows"):
            return files.live_rows
        return sum(f.live_rows for f in files)

    @property
    def stored_format(self) -> int:
        """The ``format_version`` this version's root is written with: 3 when it reaches an
        inlined entry (§18), else :attr:`format_version` (which a format-3 root reads back
        as 2: the writer decides 3 from the entries)."""
        if self.format_version >= 2 and self.inline[0] > 0:
            return INLINE_FORMAT
        return self.format_version

    @property
    def inline(self) -> tuple[int, int]:
        """(inlined data files, their physical rows) of this version (docs/PROTOCOL.md §18),
        from the chunk references' summaries alone."""
        files = self.data_files
        if hasattr(files, "inline"):
            return files.inline
        got = [f.rows for f in files if f.inline is not None]
        return len(got), sum(got)

    def schema_by_id(self, schema_id: int) -> dict:
        if schema_id == self.schema_id:
            return self.schema
        for s in self.schemas:
            if int(s.get("schema_id", 0)) == schema_id:
                return s
        raise CorruptObject("a data file names a schema the manifest does not hold",
                            version=self.version, schema_id=schema_id)

    def spec_by_id(self, spec_id: int) -> dict:
        if spec_id == self.spec_id:
            return self.partition_spec
        for s in self.partition_specs:
            if int(s.get("spec_id", 0)) == spec_id:
                return s
        if spec_id == 0:
            return dict(UNPARTITIONED)
        raise CorruptObject("a data file names a partition spec the manifest does not hold",
                            version=self.version, spec_id=spec_id)

    def field_type(self, schema_id: int, field_id: int):
        """The type JSON of field ``field_id`` in schema ``schema_id`` (None: absent)."""
        try:
            schema = self.schema_by_id(schema_id)
        except CorruptObject:
            return None
        for f in schema["fields"]:
            if int(f.get("id", -1)) == field_id:
                return f["type"]
        return None

    def field_id(self, name: str) -> int | None:
        """The id of current column ``name`` (case-insensitive fallback)."""
        from flightsrv.table.schema import field_by_name

        f = field_by_name(self.schema, name)
        return int(f["id"]) if f is not None and "id" in f else None

    def column_stats(self, f: DataFile, name: str) -> dict | None:
        """The statistics of current column ``name`` in file ``f`` (by field id)."""
        fid = self.field_id(name)
        return None if fid is None else f.stats.get(str(fid))

    def referenced_keys(self) -> set[str]:
        """Every object key (relative to the table) this version needs: data files, DV
        objects and (format 2) manifest chunks. Vacuum keeps them; erasure reports versions
        by them."""
        files = self.data_files
        if hasattr(files, "referenced_keys"):
            return files.referenced_keys()
        refs = set()
        for f in files:
            refs.add(f.path)
            if f.dv_object:
                refs.add(f.dv_object)
        return refs

    def literal_keys(self) -> set[str]:
        """Like :meth:`referenced_keys`, plus files and DV objects that stored chunks still
        list behind the root's overlay (what an erasure must not leave behind)."""
        files = self.data_files
        if hasattr(files, "literal_keys"):
            return files.literal_keys()
        return self.referenced_keys()

    def files_by_path(self) -> dict[str, DataFile]:
        return {f.path: f for f in self.data_files}

    # -- JSON ------------------------------------------------------------------------
    def _common_json(self) -> dict:
        import datetime as dt

        return {"format_version": self.format_version, "version": self.version,
                "previous": self.previous, "table_uuid": self.table_uuid,
                "commit_id": self.commit_id, "created_at_ms": self.created_at_ms,
                "created_at": dt.datetime.fromtimestamp(self.created_at_ms / 1000,
                                                        tz=dt.timezone.utc).isoformat(),
                "operation": self.operation, "summary": self.summary}

    def to_json(self, chunk_refs=None) -> bytes:
        """The manifest's bytes. Format 2 needs the root's chunk references (the commit
        writes the chunks first, :func:`flightsrv.table.chunks.build`)."""
        d = self._common_json()
        if self.format_version == 1:
            names = {str(f["id"]): f["name"] for f in self.schema["fields"] if "id" in f}
            d.update(schema=format1_schema(self.schema), properties=self.properties,
                     data_files=[file_to_json(f, 1, names) for f in self.data_files],
                     deletes=self.deletes)
            return json.dumps(d, separators=(",", ":"), sort_keys=False).encode()
        files = self.data_files
        if chunk_refs is None:
            refs = getattr(files, "refs", None)
            if refs is None or getattr(files, "tail", ()):
                raise ValueError("a format-2 manifest is written with its chunk references")
            chunk_refs = refs
        overlay = files.overlay_json() if getattr(files, "overlay", None) else []
        # format 3 exactly when the version reaches an inlined entry (§18): a reader that
        # knows only format 2 refuses it instead of failing on an object that does not exist
        inlined = sum(r.inline[0] for r in chunk_refs) - sum(
            1 for o in overlay if o.get("removed") and o["path"].startswith(INLINE_PREFIX))
        if inlined > 0:
            d["format_version"] = INLINE_FORMAT
        # a root is written by every commit: fields at their defaults are left out (readers
        # default them, §14.1); every field of §4 without a default stays, ``created_at`` too
        d.update(schema=self.schema, last_column_id=self.last_column_id,
                 properties=self.properties, chunks=[r.to_json() for r in chunk_refs])
        if self.schemas:
            d["schemas"] = list(self.schemas)
        if self.partition_spec != UNPARTITIONED or self.partition_specs:
            d["partition_spec"] = self.partition_spec
        if self.partition_specs:
            d["partition_specs"] = list(self.partition_specs)
        if self.last_partition_id != 999:
            d["last_partition_id"] = self.last_partition_id
        if self.deletes:
            d["deletes"] = self.deletes
        if overlay:
            d["overlay"] = overlay
        return json.dumps(d, separators=(",", ":"), sort_keys=False).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = "?", chunks=None) -> "Manifest":
        """Parse a manifest. ``chunks``: the table's ``ChunkStore`` the data-file list of a
        format-2 manifest is loaded through (lazily)."""
        try:
            d = json.loads(raw)
            fv = d.get("format_version", 0)
            if fv > INLINE_FORMAT:
                raise CorruptObject("manifest format_version is newer than this reader",
                                    key=key, format_version=fv, supported=INLINE_FORMAT)
            d.pop("created_at", None)
            if fv >= 2:
                from flightsrv.table.chunks import ChunkRef, FileList

                refs = [ChunkRef.from_json(r) for r in d.pop("chunks")]
                overlay, was = FileList.overlay_from_json(d.get("overlay"))
                return cls(
                    version=d["version"], previous=d["previous"], table_uuid=d["table_uuid"],
                    commit_id=d["commit_id"], created_at_ms=d["created_at_ms"],
                    operation=d["operation"], summary=d["summary"], schema=d["schema"],
                    properties=d["properties"],
                    data_files=FileList(chunks, refs, (), overlay, was),
                    deletes=d.get("deletes") or {}, format_version=2,
                    schemas=tuple(d.get("schemas") or ()),
                    partition_spec=d.get("partition_spec") or dict(UNPARTITIONED),
                    partition_specs=tuple(d.get("partition_specs") or ()),
                    last_column_id=int(d.get("last_column_id", 0)),
                    last_partition_id=int(d.get("last_partition_id", 999)))
            d.pop("format_version", None)
            schema, last = schema_with_ids(d.pop("schema"))
            ids = {f["name"]: str(f["id"]) for f in schema["fields"]}
            files = tuple(file_from_json(f, 1, ids) for f in d.pop("data_files"))
            return cls(data_files=files, schema=schema, last_column_id=last,
                       format_version=max(fv, 1), **d)
        except CorruptObject:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptObject("manifest does not parse", key=key, error=str(exc)) from exc


@dataclass(frozen=True)
class Pointer:
    version: int
    table_uuid: str
    commit_id: str
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return json.dumps({"format_version": self.format_version, "version": self.version,
                           "manifest": manifest_key(self.version), "table_uuid": self.table_uuid,
                           "commit_id": self.commit_id}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = POINTER_KEY) -> "Pointer":
        try:
            d = json.loads(raw)
            return cls(int(d["version"]), d["table_uuid"], d["commit_id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptObject("pointer does not parse", key=key, error=str(exc)) from exc

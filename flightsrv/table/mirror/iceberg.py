"""The Iceberg v3 mirror: ``metadata/`` under the table prefix (docs/INTEROP.md §Iceberg).

- One snapshot per flightsrv version: ``snapshot-id = sequence-number = version + 1``
  (Iceberg readers treat a snapshot id of 0 as "none"), with the summary property
  ``flightsrv.version``. Table metadata files ``metadata/v<M>.metadata.json`` are numbered on
  their own (one per publish or expiry, not per version) and ``metadata/version-hint.text``
  names the newest; every retained snapshot is in the newest file, so time travel by snapshot
  id works from it.
- Manifests are Avro (fastavro), entries spread over ``B`` buckets by a hash of the data
  file path, so a version rewrites only the manifests of buckets it touched: O(changed
  files × bucket size), with about ``BUCKET_TARGET`` entries per bucket (``B`` doubles as
  the table grows; a resize rewrites every manifest once). Untouched manifests are reused by
  the next snapshot's manifest list. Data manifests and delete manifests are bucketed alike.
- Deletion vectors: each DV a version adds or changes is copied into a Puffin file of its
  own (``metadata/dv-<version>-<digest>.puffin``, see ``puffin.py``; DuckDB 1.5.5 applies
  the wrong blob when one Puffin holds the DVs of several data files); delete-manifest
  entries carry ``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes``.
- Row lineage (v3): every data file gets an explicit ``first_row_id``; ``next-row-id``,
  a snapshot's ``first-row-id``/``added-rows`` and a new data manifest's ``first_row_id``
  follow the rows assigned.

Writes are CREATEs of content-addressed objects; the metadata file is the commit point: a
publisher that loses the race re-reads the newest metadata and continues from it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid

import fastavro

from flightsrv.errors import CorruptObject, ObjectNotFound, PreconditionFailed
from flightsrv.store.base import PutMode
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.mirror import puffin
from flightsrv.table.mirror.avro_schemas import MANIFEST_ENTRY_V3, MANIFEST_FILE_V3
from flightsrv.table.mirror.common import diff, digest, put_once, table_location
from flightsrv.table.mirror.dvs import has_deletes, mirror_dv
from flightsrv.table.mirror.types import MappedSchema, iceberg_stats

log = logging.getLogger("flightsrv.mirror")

PREFIX = "metadata/"
VERSION_HINT = "metadata/version-hint.text"
BUCKET_TARGET = 128
ADDED, EXISTING = 1, 0
DATA, DELETES = 0, 1
_ENTRY = fastavro.parse_schema(MANIFEST_ENTRY_V3)
_LIST = fastavro.parse_schema(MANIFEST_FILE_V3)


def snapshot_id(version: int) -> int:
    """The Iceberg snapshot id of a flightsrv version."""
    return version + 1


def metadata_key(n: int) -> str:
    return f"{PREFIX}v{n}.metadata.json"


def metadata_number(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if name.startswith("v") and name.endswith(".metadata.json") and name[1:-14].isdigit():
        return int(name[1:-14])
    return None


def _uuid(table_uuid: str) -> str:
    try:
        return str(uuid.UUID(hex=table_uuid))
    except ValueError:
        return str(uuid.UUID(bytes=hashlib.sha256(table_uuid.encode()).digest()[:16]))


def _bucket(path: str, buckets: int) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") % buckets


def _bucket_count(files: int) -> int:
    b = 1
    while files > b * BUCKET_TARGET:
        b *= 2
    return b


def _avro(schema, records: list, meta: dict, seed: str) -> bytes:
    buf = io.BytesIO()
    sync = hashlib.sha256(seed.encode()).digest()[:16]  # deterministic bytes, same content
    fastavro.writer(buf, schema, records, metadata=meta, codec="deflate", sync_marker=sync)
    return buf.getvalue()


class IcebergMirror:
    """Publishes one table's versions as Iceberg v3 metadata."""

    name = "iceberg"

    def __init__(self, table):
        self.table = table
        self.store = table.store
        self.location = table_location(table)

    def uri(self, key: str) -> str:
        return f"{self.location}/{key}"

    def key(self, uri: str) -> str | None:
        prefix = self.location + "/"
        return uri[len(prefix):] if uri.startswith(prefix) else None

    # -- state ----------------------------------------------------------------------
    def latest(self) -> tuple[int, dict] | None:
        """(number, JSON) of the newest table metadata file, or None: no mirror."""
        n = None
        try:
            raw, _ = self.store.get(VERSION_HINT)
            n = int(raw.decode().strip())
        except (ObjectNotFound, ValueError):
            listed = [metadata_number(m.key) for m in self.store.list(PREFIX)]
            listed = [x for x in listed if x is not None]
            n = max(listed) if listed else None
        if n is None:
            return None
        found = None
        probe = n
        while True:  # the hint may lag: roll forward; it may also name a deleted file
            try:
                raw, _ = self.store.get(metadata_key(probe))
            except ObjectNotFound:
                break
            found = (probe, raw)
            probe += 1
        if found is None:
            listed = [metadata_number(m.key) for m in self.store.list(PREFIX)]
            listed = [x for x in listed if x is not None]
            if not listed:
                return None
            return self.latest_from(max(listed))
        try:
            return found[0], json.loads(found[1])
        except ValueError as exc:
            raise CorruptObject("Iceberg metadata does not parse", table=self.table.name,
                                key=metadata_key(found[0]), error=str(exc)) from None

    def latest_from(self, n: int) -> tuple[int, dict] | None:
        raw, _ = self.store.get(metadata_key(n))
        return n, json.loads(raw)

    def read_list(self, uri: str) -> list[dict]:
        raw, _ = self.store.get(self.key(uri))
        return list(fastavro.reader(io.BytesIO(raw)))

    def read_manifest(self, uri: str) -> list[dict]:
        raw, _ = self.store.get(self.key(uri))
        return list(fastavro.reader(io.BytesIO(raw)))

    # -- one snapshot ---------------------------------------------------------------
    def _entries(self, prev_list: list[dict], content: int, buckets: set[int] | None,
                 n_buckets: int) -> dict[str, dict]:
        """Live entries of the previous snapshot's manifests of ``content`` in ``buckets``
        (None: all), keyed by data file URI."""
        out = {}
        for mf in prev_list:
            if mf["content"] != content:
                continue
            b, nb = _manifest_bucket(mf["manifest_path"])
            if nb == n_buckets and buckets is not None and b not in buckets:
                continue
            for e in self.read_manifest(mf["manifest_path"]):
                if e["status"] == 2:
                    continue
                df = e["data_file"]
                key = df["file_path"] if content == DATA else df["referenced_data_file"]
                out[key] = e
        return out

    def snapshot(self, prev: Manifest | None, prev_list: list[dict], prev_buckets: int,
                 m: Manifest, mapped: MappedSchema, next_row_id: int) -> dict:
        """Write the manifests, Puffin and manifest list of version ``m``; return the
        snapshot JSON plus ``_list`` (its manifest-list entries), ``_buckets`` and
        ``_next_row_id`` for the next version."""
        sid, seq = snapshot_id(m.version), snapshot_id(m.version)
        d = diff(prev, m)
        n_buckets = max(prev_buckets, _bucket_count(len(m.data_files)))
        resize = prev is None or n_buckets != prev_buckets
        loc = {f.path: self.uri(f.path) for f in d.added}
        data_touch = {_bucket(self.uri(f.path), n_buckets) for f in d.added + d.removed}
        new_dvs = [f for f in d.added if has_deletes(f)] + [n for _, n in d.redeleted
                                                            if has_deletes(n)]
        gone_dvs = [f for f in d.removed if has_deletes(f)] + [o for o, _ in d.redeleted
                                                               if has_deletes(o)]
        del_touch = {_bucket(self.uri(f.path), n_buckets) for f in new_dvs + gone_dvs}
        if resize:
            data_touch = del_touch = set(range(n_buckets))

        # deletion vectors of this version: one Puffin file per DV (DuckDB 1.5.5's
        # iceberg_scan applies the wrong blob when one Puffin holds the DVs of several files)
        dv_entries = {}
        for f in new_dvs:
            dv = mirror_dv(self.store, self.table.name, f, need_blob=True)
            ref = self.uri(f.path)
            body, spans = puffin.build([(ref, dv.blob, dv.cardinality)])
            pkey = f"{PREFIX}dv-{m.version}-{digest(body)}.puffin"
            put_once(self.store, pkey, body)
            (off, length), = spans
            dv_entries[ref] = {"status": ADDED, "snapshot_id": sid, "sequence_number": seq,
                               "file_sequence_number": seq, "data_file": {
                                   "content": 1, "file_path": self.uri(pkey),
                                   "file_format": "PUFFIN", "partition": {},
                                   "record_count": dv.cardinality,
                                   "file_size_in_bytes": len(body),
                                   "referenced_data_file": ref, "content_offset": off,
                                   "content_size_in_bytes": length}}

        # data entries
        old_data = self._entries(prev_list, DATA, None if resize else data_touch,
                                 prev_buckets) if prev is not None else {}
        removed = {self.uri(f.path) for f in d.removed}
        data_by_bucket: dict[int, list] = {b: [] for b in data_touch}
        for uri_, e in old_data.items():
            if uri_ in removed:
                continue
            b = _bucket(uri_, n_buckets)
            if b in data_by_bucket:
                data_by_bucket[b].append(_existing(e))
        first_row_id = next_row_id
        added_rows = 0
        new_ids = {}
        for f in d.added:
            new_ids[f.path] = next_row_id + added_rows
            added_rows += f.rows
            data_by_bucket[_bucket(loc[f.path], n_buckets)].append(
                {"status": ADDED, "snapshot_id": sid, "sequence_number": seq,
                 "file_sequence_number": seq, "data_file": self._data_file(
                     f, loc[f.path], mapped, new_ids[f.path])})

        # delete entries
        old_dels = self._entries(prev_list, DELETES, None if resize else del_touch,
                                 prev_buckets) if prev is not None else {}
        drop_dv = {self.uri(f.path) for f in gone_dvs}
        dels_by_bucket: dict[int, list] = {b: [] for b in del_touch}
        for ref, e in old_dels.items():
            if ref in drop_dv or ref in dv_entries:
                continue
            b = _bucket(ref, n_buckets)
            if b in dels_by_bucket:
                dels_by_bucket[b].append(_existing(e))
        for ref, e in dv_entries.items():
            dels_by_bucket[_bucket(ref, n_buckets)].append(e)

        # manifests: reuse untouched, write touched
        listing = [] if resize else [
            mf for mf in prev_list
            if _manifest_bucket(mf["manifest_path"])[0] not in (
                data_touch if mf["content"] == DATA else del_touch)]
        for content, groups in ((DATA, data_by_bucket), (DELETES, dels_by_bucket)):
            for b in sorted(groups):
                entries = groups[b]
                if not entries:
                    continue
                listing.append(self._write_manifest(m, mapped, content, b, n_buckets, entries,
                                                    sid, seq, first_row_id if content == DATA
                                                    else None, new_ids))
        listing.sort(key=lambda mf: (mf["content"], mf["manifest_path"]))
        list_meta = {"snapshot-id": str(sid), "sequence-number": str(seq),
                     "format-version": "3", "first-row-id": str(first_row_id)}
        if prev is not None:
            list_meta["parent-snapshot-id"] = str(snapshot_id(prev.version))
        body = _avro(_LIST, listing, list_meta, f"list-{sid}-{len(listing)}")
        lkey = f"{PREFIX}snap-{sid}-{digest(body)}.avro"
        put_once(self.store, lkey, body)
        # totals over the whole table would cost O(files); the spec makes them optional
        summary = {"operation": _operation(d), "flightsrv.version": str(m.version),
                   "flightsrv.operation": m.operation,
                   "added-data-files": str(len(d.added)),
                   "deleted-data-files": str(len(d.removed)),
                   "total-data-files": str(len(m.data_files))}
        snap = {"snapshot-id": sid, "sequence-number": seq, "timestamp-ms": m.created_at_ms,
                "manifest-list": self.uri(lkey), "summary": summary,
                "schema-id": m.schema_id,
                "first-row-id": first_row_id, "added-rows": added_rows}
        if prev is not None:
            snap["parent-snapshot-id"] = snapshot_id(prev.version)
        snap["_list"], snap["_buckets"] = listing, n_buckets
        snap["_schema"] = (m.schema_id, mapped)
        snap["_next_row_id"] = next_row_id + added_rows
        snap["_changed"] = d.changed_files
        return snap

    def _data_file(self, f: DataFile, uri_: str, mapped: MappedSchema, row_id: int) -> dict:
        df = {"content": 0, "file_path": uri_, "file_format": "PARQUET", "partition": {},
              "record_count": f.rows, "file_size_in_bytes": f.size, "first_row_id": row_id}
        for k, v in iceberg_stats(mapped, f.stats, f.rows).items():
            df[k] = v or None
        return df

    def _write_manifest(self, m: Manifest, mapped: MappedSchema, content: int, bucket: int,
                        n_buckets: int, entries: list, sid: int, seq: int,
                        first_row_id: int | None, new_ids: dict) -> dict:
        schema = dict(mapped.iceberg, **{"schema-id": m.schema_id})
        meta = {"schema": json.dumps(schema), "schema-id": str(m.schema_id),
                "partition-spec": "[]",
                "partition-spec-id": "0", "format-version": "3",
                "content": "data" if content == DATA else "deletes"}
        kind = "data" if content == DATA else "dels"
        body = _avro(_ENTRY, entries, meta, f"{kind}-{sid}-{bucket}-{len(entries)}")
        key = f"{PREFIX}m-{kind}-b{bucket}-of{n_buckets}-{digest(body)}.avro"
        put_once(self.store, key, body)
        added = [e for e in entries if e["status"] == ADDED]
        existing = [e for e in entries if e["status"] == EXISTING]
        starts = [e["data_file"].get("first_row_id") for e in added]
        return {"manifest_path": self.uri(key), "manifest_length": len(body),
                "partition_spec_id": 0, "content": content, "sequence_number": seq,
                "min_sequence_number": min(e["sequence_number"] for e in entries),
                "added_snapshot_id": sid, "added_files_count": len(added),
                "existing_files_count": len(existing), "deleted_files_count": 0,
                "added_rows_count": sum(e["data_file"]["record_count"] for e in added),
                "existing_rows_count": sum(e["data_file"]["record_count"] for e in existing),
                "deleted_rows_count": 0, "partitions": [], "key_metadata": None,
                "first_row_id": (min(starts) if starts else None) if content == DATA
                and first_row_id is not None else None}

    # -- table metadata -------------------------------------------------------------
    def metadata(self, head: Manifest, mapped: MappedSchema, snapshots: list[dict],
                 prev_meta: tuple[int, dict] | None, buckets: int, next_row_id: int) -> dict:
        current = snapshots[-1]
        # every schema a retained snapshot was written with (a time-travel read projects
        # with its snapshot's schema), the head's current; carried-over snapshots keep the
        # schemas the previous metadata listed
        schemas = {head.schema_id: (mapped.iceberg, mapped.name_mapping)}
        if prev_meta is not None:
            for s in prev_meta[1].get("schemas", []):
                sid_ = int(s["schema-id"])
                body = {k: v for k, v in s.items() if k != "schema-id"}
                schemas.setdefault(sid_, (body, None))
        for s in snapshots:
            if "_schema" in s:
                sid_, vm = s["_schema"]
                schemas.setdefault(sid_, (vm.iceberg, vm.name_mapping))
        used = {int(s.get("schema-id", 0)) for s in snapshots} | {head.schema_id}
        # files hold columns under physical names of whatever schema wrote them: the name
        # mapping lists, per field id, every name a retained schema gives it
        names: dict[int, dict] = {}
        for sid_ in sorted(used):
            for entry in (schemas[sid_][1] or []):
                e = names.setdefault(entry["field-id"], dict(entry, names=[]))
                e["names"] += [n for n in entry["names"] if n not in e["names"]]
        if prev_meta is not None:
            old = prev_meta[1].get("properties", {}).get("schema.name-mapping.default")
            for entry in (json.loads(old) if old else []):
                e = names.setdefault(entry["field-id"], dict(entry, names=[]))
                e["names"] += [n for n in entry["names"] if n not in e["names"]]
        name_mapping = [names[k] for k in sorted(names)]
        last_column_id = max([mapped.last_column_id] + [
            max([f["id"] for f in schemas[s][0]["fields"]], default=0) for s in used])
        props = {"schema.name-mapping.default": json.dumps(name_mapping),
                 "flightsrv.table-uuid": head.table_uuid,
                 "flightsrv.version": str(current["summary"]["flightsrv.version"]),
                 "flightsrv.buckets": str(buckets), "format-version": "3"}
        mlog = []
        if prev_meta is not None:
            n, pm = prev_meta
            kept = {s["snapshot-id"] for s in snapshots}
            if all(s["snapshot-id"] in kept for s in pm.get("snapshots", [])):
                mlog = [e for e in pm.get("metadata-log", [])][-9:] + [
                    {"timestamp-ms": pm["last-updated-ms"], "metadata-file":
                     self.uri(metadata_key(n))}]
        return {
            "format-version": 3, "table-uuid": _uuid(head.table_uuid),
            "location": self.location, "last-sequence-number": current["sequence-number"],
            "last-updated-ms": current["timestamp-ms"],
            "last-column-id": last_column_id,
            "current-schema-id": head.schema_id,
            "schemas": [dict(schemas[s][0], **{"schema-id": s}) for s in sorted(used)],
            "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
            "last-partition-id": 999, "default-sort-order-id": 0,
            "sort-orders": [{"order-id": 0, "fields": []}], "properties": props,
            "current-snapshot-id": current["snapshot-id"],
            "refs": {"main": {"snapshot-id": current["snapshot-id"], "type": "branch"}},
            "snapshots": [{k: v for k, v in s.items() if not k.startswith("_")}
                          for s in snapshots],
            "snapshot-log": [{"timestamp-ms": s["timestamp-ms"], "snapshot-id": s["snapshot-id"]}
                             for s in snapshots],
            "metadata-log": mlog, "statistics": [], "partition-statistics": [],
            "next-row-id": next_row_id,
        }

    def commit_metadata(self, number: int, meta: dict) -> bool:
        """CREATE metadata file ``number`` (the commit point); False if a racer won."""
        body = json.dumps(meta, indent=1).encode()
        if not put_once(self.store, metadata_key(number), body):
            return False
        self._advance_hint(number)
        return True

    def _advance_hint(self, number: int) -> None:
        body = str(number).encode()
        for _ in range(8):
            try:
                raw, meta = self.store.get(VERSION_HINT)
            except ObjectNotFound:
                if put_once(self.store, VERSION_HINT, body):
                    return
                continue
            try:
                if int(raw.decode().strip()) >= number:
                    return
            except ValueError:
                pass
            try:
                self.store.put(VERSION_HINT, body, mode=PutMode.IF_MATCH, etag=meta.etag)
                return
            except (PreconditionFailed, ObjectNotFound):
                continue

    def drop(self) -> list[str]:
        gone = []
        for meta in list(self.store.list(PREFIX)):
            self.store.delete(meta.key)
            gone.append(meta.key)
        return gone

    # -- what the metadata references (vacuum, erasure) -----------------------------
    def object_refs(self, key: str) -> set[str]:
        """Table keys one mirror object makes readers read: the live entries of a manifest
        (data files; a delete manifest's Puffin files). Other objects name only mirror
        objects, and a Puffin file holds row positions, never values."""
        name = key.rsplit("/", 1)[-1]
        if not (name.startswith("m-") and name.endswith(".avro")):
            return set()
        refs = set()
        for e in self.read_manifest(self.uri(key)):
            if e["status"] != 2:
                k = self.key(e["data_file"]["file_path"])
                if k:
                    refs.add(k)
        return refs

    def referenced(self) -> set[str]:
        """Mirror keys the newest metadata needs: itself, the files in its metadata log,
        the manifest lists of its snapshots, their manifests and those manifests' Puffin
        files."""
        latest = self.latest()
        keep: set[str] = {VERSION_HINT}
        if latest is None:
            return keep
        n, meta = latest
        keep.add(metadata_key(n))
        for e in meta.get("metadata-log", []):
            k = self.key(e["metadata-file"])
            if k:
                keep.add(k)
        seen = set()
        for s in meta.get("snapshots", []):
            keep.add(self.key(s["manifest-list"]))
            for mf in self.read_list(s["manifest-list"]):
                mkey = self.key(mf["manifest_path"])
                keep.add(mkey)
                if mkey in seen or mf["content"] != DELETES:
                    continue
                seen.add(mkey)
                for e in self.read_manifest(mf["manifest_path"]):
                    k = self.key(e["data_file"]["file_path"])
                    if k:
                        keep.add(k)
        return keep


def _existing(e: dict) -> dict:
    out = dict(e)
    out["status"] = EXISTING
    return out


def _manifest_bucket(uri: str) -> tuple[int, int]:
    name = uri.rsplit("/", 1)[-1]
    try:
        parts = name.split("-")
        return int(parts[2][1:]), int(parts[3][2:])
    except (IndexError, ValueError):
        return -1, -1


def _operation(d) -> str:
    if d.removed or d.redeleted:
        return "overwrite" if d.added else "delete"
    return "append"

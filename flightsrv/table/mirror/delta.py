"""The Delta Lake mirror: ``_delta_log/`` under the table prefix (docs/INTEROP.md §Delta).

One commit ``_delta_log/<version:020d>.json`` per flightsrv version, with the same version
number, holding only what changed (``add``/``remove`` of data files, ``remove`` + ``add`` of a
file whose deletes changed), so publishing a version writes O(changed files). The first
published version of an incarnation also carries ``protocol`` and ``metaData``; a mirror that
starts after version 0 (expiry, or a first publish of an older table) gets a checkpoint at its
first version. A classic checkpoint (``<v>.checkpoint.parquet`` + ``_last_checkpoint``) is
written every ``publish.delta.checkpoint_interval`` versions.

Spec: https://github.com/delta-io/delta/blob/master/PROTOCOL.md (reader 3 / writer 7 with the
``deletionVectors`` and ``columnMapping`` table features, column mapping mode ``name``).

Deletion vectors point at flightsrv's bytes: storage type ``p`` with the absolute URI of our
DV object, our offset (the blob's length field) and ``sizeInBytes = length - 8`` (Delta's
size excludes the length and the CRC). Inline DVs become Delta inline DVs (``i``, Z85 of
magic + bitmap). Files with whole deleted row groups get a union blob, inline when small,
else in a content-addressed DV file ``_delta_dv/<digest>.bin`` (``0x01`` + blob).

Every object is written with CREATE: a commit file is the commit point (a racing publisher
that loses finds the version published and moves on), DV files are named by their content.
"""

from __future__ import annotations

import io
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq

from flightsrv.errors import CorruptObject, ObjectNotFound, PreconditionFailed
from flightsrv.store.base import PutMode
from flightsrv.table.deletes import INLINE_LIMIT, OBJECT_FORMAT_BYTE
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.mirror.common import Diff, diff, put_once, table_location
from flightsrv.table.mirror.dvs import MirrorDV, mirror_dv, z85
from flightsrv.table.mirror.types import (
    MappedSchema,
    UnsupportedForMirror,
    delta_stats,
    map_schema,
)

log = logging.getLogger("flightsrv.mirror")

LOG_PREFIX = "_delta_log/"
DV_PREFIX = "_delta_dv/"
LAST_CHECKPOINT = "_delta_log/_last_checkpoint"
DEFAULT_CHECKPOINT_INTERVAL = 100
READER_VERSION, WRITER_VERSION = 3, 7


def commit_key(version: int) -> str:
    return f"{LOG_PREFIX}{version:020d}.json"


def checkpoint_key(version: int) -> str:
    return f"{LOG_PREFIX}{version:020d}.checkpoint.parquet"


def log_version(key: str) -> tuple[int, str] | None:
    """(version, "commit"|"checkpoint") of a log key, None for anything else."""
    name = key.rsplit("/", 1)[-1]
    head, _, rest = name.partition(".")
    if len(head) != 20 or not head.isdigit():
        return None
    if rest == "json":
        return int(head), "commit"
    if rest == "checkpoint.parquet":
        return int(head), "checkpoint"
    return None


DELETION_VECTORS, COLUMN_MAPPING = "deletionVectors", "columnMapping"


def needs_column_mapping(m: Manifest) -> bool:
    """Whether version ``m`` needs column mapping: from the first rename (a column's name
    is no longer the name data files hold it under) or drop (files still hold the dropped
    column, and a later column may be given its name). ``m.schemas`` keeps every earlier
    schema, so once true it stays true."""
    current = {f.get("id") for f in m.schema["fields"]}
    for s in list(m.schemas) + [m.schema]:
        for f in s["fields"]:
            if f.get("physical", f["name"]) != f["name"] or f.get("id") not in current:
                return True
    return False


def needed_features(m: Manifest, mapped: MappedSchema) -> set[str]:
    """The reader (and writer) table features version ``m`` itself needs. A version
    declares these plus whatever the version before it declared: a feature, once declared,
    stays (Delta removes one only by its own drop-feature protocol)."""
    out = set(mapped.delta_features)
    if any(f.dv is not None or f.deleted_row_groups for f in m.data_files):
        out.add(DELETION_VECTORS)
    if needs_column_mapping(m):
        out.add(COLUMN_MAPPING)
    return out


def check_expressible(table: str, m: Manifest) -> None:
    """Refuse a version Delta cannot express: a column added with ``DEFAULT v`` while data
    files written before it are live. flightsrv reads ``v`` for their rows
    (``initial_default``), but Delta has no such notion (a Delta reader reads NULL for a
    column a file lacks), and giving those rows the value means rewriting the files, which
    publishing never does (docs/INTEROP.md §3.1). Only a version whose schema changed, or
    the first one published, needs the check: files added later are written with the
    column, and a version after a refused one is never published."""
    for f in m.schema["fields"]:
        if f.get("initial_default") is None or "id" not in f:
            continue
        for df in m.data_files:
            if df.rows - df.deleted_rows <= 0:
                continue  # no live row reads the column
            written = m.schema_by_id(df.schema_id)
            if not any(w.get("id") == f["id"] for w in written["fields"]):
                raise UnsupportedForMirror(
                    "Delta cannot give rows written before ADD COLUMN ... DEFAULT the default "
                    "(a Delta reader would read NULL): rewrite their rows (UPDATE t SET c = c) "
                    "and expire the versions before that (VACUUM t RETAIN n VERSIONS), or "
                    "publish Iceberg only",
                    table=table, column=f["name"], version=m.version, file=df.path,
                    format="delta")


def _without_mapping(struct: dict) -> dict:
    """A Delta struct type without column-mapping metadata (mode ``none``: readers resolve
    columns by name, which equals the name in the files until the first rename)."""
    def strip(t):
        if not isinstance(t, dict):
            return t
        if t["type"] == "struct":
            return {"type": "struct", "fields": [
                dict(f, type=strip(f["type"]), metadata={}) for f in t["fields"]]}
        if t["type"] == "array":
            return dict(t, elementType=strip(t["elementType"]))
        if t["type"] == "map":
            return dict(t, keyType=strip(t["keyType"]), valueType=strip(t["valueType"]))
        return t
    return strip(struct)


class DeltaMirror:
    """Publishes one table's versions as a Delta log."""

    name = "delta"

    def __init__(self, table):
        self.table = table
        self.store = table.store
        self.location = table_location(table)

    # -- state ----------------------------------------------------------------------
    def listing(self) -> tuple[list[int], list[int]]:
        """(commit versions, checkpoint versions) present, ascending."""
        commits, checkpoints = [], []
        for meta in self.store.list(LOG_PREFIX):
            lv = log_version(meta.key)
            if lv is not None:
                (commits if lv[1] == "commit" else checkpoints).append(lv[0])
        return sorted(commits), sorted(checkpoints)

    def commit_info(self, version: int) -> dict | None:
        """The ``flightsrv`` part of a published commit's ``commitInfo`` (None: absent)."""
        try:
            raw, _ = self.store.get(commit_key(version))
        except ObjectNotFound:
            return None
        for line in raw.decode().splitlines():
            if '"commitInfo"' in line:
                return json.loads(line)["commitInfo"].get("flightsrv", {})
        return {}

    # -- descriptors ----------------------------------------------------------------
    def _dv_descriptor(self, f: DataFile, out_files: list) -> dict | None:
        dv = mirror_dv(self.store, self.table.name, f, need_blob=False)
        if dv is None:
            return None
        if dv.in_place and dv.blob is None:
            return {"storageType": "p", "pathOrInlineDv": f"{self.location}/{dv.object_key}",
                    "offset": dv.offset, "sizeInBytes": dv.length - 8,
                    "cardinality": dv.cardinality}
        return self._blob_descriptor(dv, out_files)

    def _blob_descriptor(self, dv: MirrorDV, out_files: list) -> dict:
        payload = dv.blob[4:-4]  # magic + bitmap: Delta's inline form has no length or CRC
        if len(dv.blob) <= INLINE_LIMIT:
            return {"storageType": "i", "pathOrInlineDv": z85(payload),
                    "sizeInBytes": len(payload), "cardinality": dv.cardinality}
        key = f"{DV_PREFIX}{dv.digest}.bin"
        out_files.append((key, OBJECT_FORMAT_BYTE + dv.blob))
        return {"storageType": "p", "pathOrInlineDv": f"{self.location}/{key}", "offset": 1,
                "sizeInBytes": len(dv.blob) - 8, "cardinality": dv.cardinality}

    def _add(self, f: DataFile, m: Manifest, mapped: MappedSchema, out_files: list) -> dict:
        dv = self._dv_descriptor(f, out_files)
        tight = dv is None and not f.stats_wide
        add = {"path": f.path, "partitionValues": {}, "size": f.size,
               "modificationTime": m.created_at_ms, "dataChange": True,
               "stats": delta_stats(mapped, f.stats, f.rows, tight=tight)}
        if dv is not None:
            add["deletionVector"] = dv
        return {"add": add}

    def _remove(self, f: DataFile, m: Manifest, out_files: list) -> dict:
        rm = {"path": f.path, "deletionTimestamp": m.created_at_ms, "dataChange": True,
              "extendedFileMetadata": True, "partitionValues": {}, "size": f.size}
        dv = self._dv_descriptor(f, out_files)
        if dv is not None:
            rm["deletionVector"] = dv
        return {"remove": rm}

    def _protocol_and_metadata(self, m: Manifest, mapped: MappedSchema,
                               features: set[str]) -> list[dict]:
        if features:
            names = sorted(features)
            protocol = {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION,
                        "readerFeatures": names, "writerFeatures": names}
        else:  # nothing a plain Parquet reader of the log lacks
            protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
        mapping = COLUMN_MAPPING in features
        config = {}
        if DELETION_VECTORS in features:
            config["delta.enableDeletionVectors"] = "true"
        if mapping:
            config["delta.columnMapping.mode"] = "name"
            config["delta.columnMapping.maxColumnId"] = str(mapped.last_column_id)
        schema = mapped.delta if mapping else _without_mapping(mapped.delta)
        meta = {"id": m.table_uuid, "name": self.table.name,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema, separators=(",", ":")),
                "partitionColumns": [], "configuration": config,
                "createdTime": m.created_at_ms}
        return [{"protocol": protocol}, {"metaData": meta}]

    def _commit_info(self, m: Manifest, features: set[str]) -> dict:
        return {"commitInfo": {
            "timestamp": m.created_at_ms, "operation": _OPERATIONS.get(m.operation, "WRITE"),
            "operationParameters": {}, "engineInfo": "flightsrv", "isBlindAppend": False,
            "flightsrv": {"version": m.version, "table_uuid": m.table_uuid,
                          "commit_id": m.commit_id, "operation": m.operation,
                          "features": sorted(features)}}}

    def declared(self, version: int) -> set[str]:
        """The table features published version ``version`` declares (a commit written
        before features were tracked declared all three)."""
        info = self.commit_info(version)
        if info is None or "features" not in info:
            return {DELETION_VECTORS, COLUMN_MAPPING} | (
                map_schema(self.table.log.load(version).schema, ("delta",)).delta_features)
        return set(info["features"])

    # -- publishing -----------------------------------------------------------------
    def actions(self, prev: Manifest | None, m: Manifest, mapped: MappedSchema,
                out_files: list, features: set[str],
                prev_features: set[str] | None = None) -> tuple[list[dict], Diff | None]:
        """The actions of version ``m``: a diff against ``prev``, or the whole table when
        ``prev`` is None (the first published version)."""
        if prev is None:
            acts = self._protocol_and_metadata(m, mapped, features)
            acts += [self._add(f, m, mapped, out_files) for f in m.data_files]
            return acts + [self._commit_info(m, features)], None
        d = diff(prev, m)
        # a schema change (ALTER TABLE) or a newly needed table feature is a new protocol
        # and metaData in the same commit
        changed = prev.schema != m.schema or features != prev_features
        acts = self._protocol_and_metadata(m, mapped, features) if changed else []
        acts += [self._remove(f, m, out_files) for f in d.removed]
        for old, new in d.redeleted:
            acts.append(self._remove(old, m, out_files))
            acts.append(self._add(new, m, mapped, out_files))
        acts += [self._add(f, m, mapped, out_files) for f in d.added]
        return acts + [self._commit_info(m, features)], d

    def publish(self, prev: Manifest | None, m: Manifest, *, checkpoint_interval: int,
                prev_features: set[str] | None = None) -> dict:
        """Write version ``m`` (``prev`` None: the mirror starts here; ``prev_features``:
        the features ``prev``'s commit declared). Returns figures, ``features`` included.
        Raises ``UnsupportedForMirror`` when Delta cannot express the version."""
        mapped = map_schema(m.schema, ("delta",))
        if prev is None or prev.schema != m.schema:
            check_expressible(self.table.name, m)
        features = needed_features(m, mapped) | (prev_features or set())
        out_files: list = []
        acts, d = self.actions(prev, m, mapped, out_files, features, prev_features)
        written = 0
        for key, data in out_files:
            written += len(data) if put_once(self.store, key, data) else 0
        body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in acts).encode()
        won = put_once(self.store, commit_key(m.version), body)
        figures = {"version": m.version, "actions": len(acts) - 1, "bytes": len(body) + written,
                   "changed_files": d.changed_files if d else len(m.data_files),
                   "published": won, "features": features}
        if prev is None and m.version > 0:
            # readers need a checkpoint where the log starts
            self.checkpoint(m, mapped, features)
        elif checkpoint_interval and m.version and m.version % checkpoint_interval == 0:
            self.checkpoint(m, mapped, features)
            figures["checkpoint"] = True
        return figures

    # -- checkpoints ----------------------------------------------------------------
    def checkpoint(self, m: Manifest, mapped: MappedSchema | None = None,
                   features: set[str] | None = None) -> None:
        """Write the classic checkpoint of version ``m`` (CREATE; idempotent) and move
        ``_last_checkpoint`` forward to it. ``features``: what its commit declared (None:
        read them from the commit)."""
        mapped = mapped or map_schema(m.schema, ("delta",))
        if features is None:
            features = self.declared(m.version)
        out_files: list = []
        rows = self._protocol_and_metadata(m, mapped, features)
        rows += [self._add(f, m, mapped, out_files) for f in m.data_files]
        for key, data in out_files:
            put_once(self.store, key, data)
        table = _checkpoint_table(rows)
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        put_once(self.store, checkpoint_key(m.version), buf.getvalue())
        self._advance_last_checkpoint(m.version, table.num_rows)

    def _advance_last_checkpoint(self, version: int, size: int) -> None:
        body = json.dumps({"version": version, "size": size}).encode()
        for _ in range(8):
            try:
                raw, meta = self.store.get(LAST_CHECKPOINT)
            except ObjectNotFound:
                if put_once(self.store, LAST_CHECKPOINT, body):
                    return
                continue
            try:
                current = int(json.loads(raw)["version"])
            except (ValueError, KeyError, TypeError):
                current = -1
            if current >= version:
                return
            try:
                self.store.put(LAST_CHECKPOINT, body, mode=PutMode.IF_MATCH, etag=meta.etag)
                return
            except (PreconditionFailed, ObjectNotFound):
                continue

    # -- expiry ---------------------------------------------------------------------
    def expire(self, oldest: Manifest) -> list[str]:
        """Make ``oldest`` the first version of the log: checkpoint it, then delete older
        commits and checkpoints (oldest first, so the log stays readable throughout)."""
        commits, checkpoints = self.listing()
        if not commits or commits[0] >= oldest.version:
            return []
        if oldest.version not in commits:
            return []  # not published yet: the next publish starts the log there
        if oldest.version not in checkpoints:
            self.checkpoint(oldest)
        gone = []
        for v in sorted(set(commits) | set(checkpoints)):
            if v >= oldest.version:
                break
            for key in (commit_key(v), checkpoint_key(v)):
                if (key == commit_key(v) and v in commits) or (
                        key == checkpoint_key(v) and v in checkpoints):
                    self.store.delete(key)
                    gone.append(key)
        return gone

    def drop(self) -> list[str]:
        """Remove the whole log (the table was dropped or starts a new incarnation)."""
        gone = []
        for prefix in (LOG_PREFIX, DV_PREFIX):
            for meta in list(self.store.list(prefix)):
                self.store.delete(meta.key)
                gone.append(meta.key)
        return gone

    # -- what the log references (vacuum, erasure) ----------------------------------
    def read_actions(self, key: str) -> list[dict]:
        """The actions of one log object (commit JSON or checkpoint), as dicts."""
        raw, _ = self.store.get(key)
        if key.endswith(".json"):
            try:
                return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
            except ValueError as exc:
                raise CorruptObject("Delta commit does not parse", table=self.table.name,
                                    key=key, error=str(exc)) from None
        t = pq.read_table(io.BytesIO(raw))
        return [{k: v for k, v in row.items() if v is not None} for row in t.to_pylist()]

    def object_refs(self, key: str) -> set[str]:
        """Table keys one log object makes readers read: ``add`` paths (a ``remove`` names
        a file without reading it) and the DV files they point at."""
        if log_version(key) is None:
            return set()
        prefix = f"{self.location}/"
        refs = set()
        for a in self.read_actions(key):
            act = a.get("add")
            if not act:
                continue
            refs.add(act["path"])
            dv = act.get("deletionVector") or {}
            if dv.get("storageType") == "p" and dv["pathOrInlineDv"].startswith(prefix):
                refs.add(dv["pathOrInlineDv"][len(prefix):])
        return refs

    def referenced(self) -> set[str]:
        """Mirror keys the retained log needs: every log object (expiry, not vacuum,
        shortens the log) and the DV files its ``add`` and ``remove`` actions point at."""
        keep: set[str] = set()
        prefix = f"{self.location}/{DV_PREFIX}"
        for meta in self.store.list(LOG_PREFIX):
            keep.add(meta.key)
            if log_version(meta.key) is None:
                continue
            for a in self.read_actions(meta.key):
                for kind in ("add", "remove"):
                    dv = (a.get(kind) or {}).get("deletionVector") or {}
                    if dv.get("storageType") == "p" and dv["pathOrInlineDv"].startswith(prefix):
                        keep.add(dv["pathOrInlineDv"][len(self.location) + 1:])
        return keep


_OPERATIONS = {"create": "CREATE TABLE", "replace": "CREATE OR REPLACE TABLE",
               "append": "WRITE", "spark_append": "WRITE",
               "delete": "DELETE", "splice_delete": "DELETE", "purge": "DELETE",
               "compact": "OPTIMIZE", "set_properties": "SET TBLPROPERTIES",
               "spark_overwrite": "WRITE", "redact": "SET TBLPROPERTIES"}

# -- checkpoint schema (PROTOCOL.md §Checkpoint Schema) ------------------------------------

_STR_MAP = pa.map_(pa.string(), pa.string())
_DV = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()),
                 ("offset", pa.int32()), ("sizeInBytes", pa.int32()),
                 ("cardinality", pa.int64())])
CHECKPOINT_SCHEMA = pa.schema([
    ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32()),
                            ("readerFeatures", pa.list_(pa.string())),
                            ("writerFeatures", pa.list_(pa.string()))])),
    ("metaData", pa.struct([("id", pa.string()), ("name", pa.string()),
                            ("description", pa.string()),
                            ("format", pa.struct([("provider", pa.string()),
                                                  ("options", _STR_MAP)])),
                            ("schemaString", pa.string()),
                            ("partitionColumns", pa.list_(pa.string())),
                            ("configuration", _STR_MAP), ("createdTime", pa.int64())])),
    ("add", pa.struct([("path", pa.string()), ("partitionValues", _STR_MAP),
                       ("size", pa.int64()), ("modificationTime", pa.int64()),
                       ("dataChange", pa.bool_()), ("stats", pa.string()),
                       ("tags", _STR_MAP), ("deletionVector", _DV),
                       ("baseRowId", pa.int64()), ("defaultRowCommitVersion", pa.int64())])),
    ("remove", pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64()),
                          ("dataChange", pa.bool_()), ("extendedFileMetadata", pa.bool_()),
                          ("partitionValues", _STR_MAP), ("size", pa.int64()),
                          ("deletionVector", _DV)])),
])


def _map(d: dict | None):
    return None if d is None else list(d.items())


def _checkpoint_table(actions: list[dict]) -> pa.Table:
    cols: dict[str, list] = {name: [] for name in CHECKPOINT_SCHEMA.names}
    for a in actions:
        (kind, body), = a.items()
        row = dict(body)
        if kind == "metaData":
            row["format"] = {"provider": body["format"]["provider"],
                             "options": _map(body["format"].get("options", {}))}
            row["configuration"] = _map(body.get("configuration", {}))
        if kind in ("add", "remove"):
            row["partitionValues"] = _map(body.get("partitionValues", {}))
        for name in cols:
            cols[name].append(row if name == kind else None)
    return pa.table({n: pa.array(v, type=CHECKPOINT_SCHEMA.field(n).type)
                     for n, v in cols.items()}, schema=CHECKPOINT_SCHEMA)

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
from flightsrv.table.mirror.types import MappedSchema, delta_stats, map_schema

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

    def _protocol_and_metadata(self, m: Manifest, mapped: MappedSchema) -> list[dict]:
        features = sorted({"deletionVectors", "columnMapping"} | mapped.delta_features)
        protocol = {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION,
                    "readerFeatures": features, "writerFeatures": features}
        meta = {"id": m.table_uuid, "name": self.table.name,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(mapped.delta, separators=(",", ":")),
                "partitionColumns": [],
                "configuration": {"delta.enableDeletionVectors": "true",
                                  "delta.columnMapping.mode": "name",
                                  "delta.columnMapping.maxColumnId": str(mapped.last_column_id)},
                "createdTime": m.created_at_ms}
        return [{"protocol": protocol}, {"metaData": meta}]

    def _commit_info(self, m: Manifest) -> dict:
        return {"commitInfo": {
            "timestamp": m.created_at_ms, "operation": _OPERATIONS.get(m.operation, "WRITE"),
            "operationParameters": {}, "engineInfo": "flightsrv", "isBlindAppend": False,
            "flightsrv": {"version": m.version, "table_uuid": m.table_uuid,
                          "commit_id": m.commit_id, "operation": m.operation}}}

    # -- publishing -----------------------------------------------------------------
    def actions(self, prev: Manifest | None, m: Manifest, mapped: MappedSchema,
                out_files: list) -> tuple[list[dict], Diff | None]:
        """The actions of version ``m``: a diff against ``prev``, or the whole table when
        ``prev`` is None (the first published version)."""
        if prev is None:
            acts = self._protocol_and_metadata(m, mapped)
            acts += [self._add(f, m, mapped, out_files) for f in m.data_files]
            return acts + [self._commit_info(m)], None
        d = diff(prev, m)
        # a schema change (ALTER TABLE) is a new metaData action in the same commit
        acts = self._protocol_and_metadata(m, mapped) if prev.schema != m.schema else []
        acts += [self._remove(f, m, out_files) for f in d.removed]
        for old, new in d.redeleted:
            acts.append(self._remove(old, m, out_files))
            acts.append(self._add(new, m, mapped, out_files))
        acts += [self._add(f, m, mapped, out_files) for f in d.added]
        return acts + [self._commit_info(m)], d

    def publish(self, prev: Manifest | None, m: Manifest, *, checkpoint_interval: int) -> dict:
        """Write version ``m`` (``prev`` None: the mirror starts here). Returns figures."""
        mapped = map_schema(m.schema, ("delta",))
        out_files: list = []
        acts, d = self.actions(prev, m, mapped, out_files)
        written = 0
        for key, data in out_files:
            written += len(data) if put_once(self.store, key, data) else 0
        body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in acts).encode()
        won = put_once(self.store, commit_key(m.version), body)
        figures = {"version": m.version, "actions": len(acts) - 1, "bytes": len(body) + written,
                   "changed_files": d.changed_files if d else len(m.data_files),
                   "published": won}
        if prev is None and m.version > 0:
            self.checkpoint(m, mapped)  # readers need a checkpoint where the log starts
        elif checkpoint_interval and m.version and m.version % checkpoint_interval == 0:
            self.checkpoint(m, mapped)
            figures["checkpoint"] = True
        return figures

    # -- checkpoints ----------------------------------------------------------------
    def checkpoint(self, m: Manifest, mapped: MappedSchema | None = None) -> None:
        """Write the classic checkpoint of version ``m`` (CREATE; idempotent) and move
        ``_last_checkpoint`` forward to it."""
        mapped = mapped or map_schema(m.schema, ("delta",))
        out_files: list = []
        rows = self._protocol_and_metadata(m, mapped)
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

"""``Table``: one table of a warehouse: snapshots, append, delete, history.

A table knows its warehouse only through a :class:`TableHome`: the store it prefixes, the
injected runtime, the warehouse URI and the erasure key. Its own store view proves the
store's conditional writes before its first write (``store/checked.py``).

Every change goes through ``flightsrv.table.commit.commit`` with a mutator; this module holds
the mutators' meaning (append rebases over anything; deletes merge bitmaps and re-plan when a
file they target was rewritten).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import pyarrow as pa

from flightsrv.errors import (
    ConfigurationError,
    CorruptObject,
    FlightsrvError,
    SchemaMismatch,
    TableNotFound,
    VersionNotFound,
)
from flightsrv.table import inline, types
from flightsrv.table.commit import TableLog, commit, require_table
from flightsrv.table.manifest import Manifest
from flightsrv.table.scan import Snapshot
from flightsrv.table.schema import schema_fingerprint, schema_from_json
from flightsrv.table.timestamps import parse_timestamp_ms  # noqa: F401  (re-exported)
from flightsrv.table.writer import DataFileWriter, WriteLayout, WriteOptions

if TYPE_CHECKING:
    from flightsrv.runtime import Runtime
    from flightsrv.store.base import ObjectStore
    from flightsrv.table.fingerprint import ErasureKey


_log = logging.getLogger("flightsrv.table")
#: versions of one table whose Snapshot objects are kept for reuse (``Table._pinned``)
SNAPSHOTS_KEPT = 4
#: (warehouse, table) of the flushes running in this process (one at a time per table)
_FLUSHING: set = set()
_FLUSHING_LOCK = threading.Lock()


@dataclass(frozen=True)
class TableHome:
    """What a table needs from the warehouse it lives in, and nothing more."""

    store: "ObjectStore"  # the warehouse's store; the table works under its name's prefix
    runtime: "Runtime"  # injected clock and ids
    uri: str  # the warehouse URI (mirror locations, descriptions)
    erasure_key: Callable[[], "ErasureKey"]  # the key request fingerprints are made with


class Table:
    def __init__(self, home: TableHome, name: str):
        from flightsrv.store.checked import CheckedStore
        from flightsrv.store.prefixed import PrefixedStore

        self.home = home
        self.name = name
        self.runtime = home.runtime
        self._checked = CheckedStore(home.store, self.runtime.ids.new_id)
        #: the table's objects; the first write proves the store's conditional writes
        self.store = PrefixedStore(self._checked, name)
        self.log = TableLog(self.store, name, self.runtime)
        self.log.after_commit.append(self._publish_after_commit)
        #: version -> the Snapshot handed out for it (the newest few): a statement that pins
        #: a version pinned before gets the same object, with what it already derived
        self._snapshots: dict[int, Snapshot] = {}
        self._snapshots_lock = threading.Lock()

    @property
    def warehouse_uri(self) -> str:
        return self.home.uri

    @property
    def erasure_key(self) -> "ErasureKey":
        """The warehouse's erasure key (``flightsrv.table.fingerprint``); request
        fingerprints of this table are made with it."""
        return self.home.erasure_key()

    def ensure_writable(self) -> None:
        """Prove now (once per store) that the store enforces If-None-Match / If-Match, e.g.
        before handing work to Spark executors; writes through ``store`` prove it anyway."""
        self._checked.ensure_checked()

    def _publish_after_commit(self, m: Manifest) -> None:
        """Queue a publish of the mirrors when the version has ``publish.formats``, and the
        removal of a replaced table's mirrors after a CREATE OR REPLACE
        (``flightsrv.table.mirror``; best effort, after the commit)."""
        if m.properties.get("publish.formats") or m.operation == "replace":
            from flightsrv.table.mirror.publisher import after_commit

            after_commit(self, m)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, warehouse={self.home.uri!r})"

    # -- reading -------------------------------------------------------------------
    def head(self) -> Manifest:
        return require_table(self.log.head(), self.name)

    def snapshot(self, version: int | None = None, as_of=None) -> Snapshot:
        """Pin a version: the latest, ``version=N``, or the last one committed at or before
        ``as_of`` (datetime, ISO string or epoch milliseconds)."""
        if version is not None and as_of is not None:
            raise ConfigurationError("give version or as_of, not both", table=self.name)
        head = self.head()
        if version is not None:
            m = self.head_or_retained(head, int(version))
        elif as_of is not None:
            m = self._version_as_of(parse_timestamp_ms(as_of))
        else:
            return self._pinned(head)
        if m.dropped:
            raise VersionNotFound("the table was dropped at that version", table=self.name,
                                  version=m.version)
        if m.table_uuid != head.table_uuid:
            # time travel never crosses a DROP or a CREATE OR REPLACE: a new table does not
            # expose the rows of the table it replaced
            raise VersionNotFound("that version belongs to a dropped table of the same name "
                                  "(dropped, or replaced by CREATE OR REPLACE)",
                                  table=self.name, version=m.version)
        return self._pinned(m)

    def _pinned(self, m: Manifest) -> Snapshot:
        """The snapshot of manifest ``m``: the one handed out before for this very manifest
        object (the log's cache returns one object per version), else a new one, kept for
        the last :data:`SNAPSHOTS_KEPT` versions that needed one (the oldest goes first)."""
        with self._snapshots_lock:
            snap = self._snapshots.get(m.version)
            if snap is not None and snap.manifest is m:
                return snap
        snap = Snapshot(self, m)
        with self._snapshots_lock:
            self._snapshots.pop(m.version, None)
            self._snapshots[m.version] = snap  # newest last
            while len(self._snapshots) > SNAPSHOTS_KEPT:
                del self._snapshots[next(iter(self._snapshots))]
        return snap

    def head_or_retained(self, head: Manifest, version: int) -> Manifest:
        """Version ``version`` for time travel: the head itself, or an older version that
        is still retained (not only still in this process's cache: see
        :meth:`TableLog.load_retained`)."""
        if version == head.version:
            return head
        return self.log.load_retained(version)

    def _version_as_of(self, ts_ms: int) -> Manifest:
        versions = self.log.versions()
        lo, hi, best = 0, len(versions) - 1, None
        while lo <= hi:  # created_at is non-decreasing in version order
            mid = (lo + hi) // 2
            m = self.log.load(versions[mid])
            if m.created_at_ms <= ts_ms:
                best, lo = m, mid + 1
            else:
                hi = mid - 1
        if best is None:
            raise VersionNotFound("no retained version at or before that time", table=self.name,
                                  timestamp_ms=ts_ms,
                                  oldest_retained=self.log.oldest_readable(versions))
        return best  # in the listing just read: retained now, whatever the cache holds

    @property
    def schema(self) -> pa.Schema:
        return schema_from_json(self.head().schema)

    @property
    def properties(self) -> dict:
        return dict(self.head().properties)

    def scan(self, columns=None, *, version=None, as_of=None) -> pa.RecordBatchReader:
        """Every live row of a version (no filtering here: the public ``flightsrv.Table``
        filters with SQL through the engine)."""
        return self.snapshot(version, as_of).scan(columns)

    def to_table(self, columns=None, *, version=None, as_of=None) -> pa.Table:
        return self.scan(columns, version=version, as_of=as_of).read_all()

    def count_rows(self, *, version=None, as_of=None) -> int:
        return self.snapshot(version, as_of).count_rows()

    def history(self, limit: int | None = None) -> list[dict]:
        """Newest first: version, time, operation and its summary; at most ``limit``
        versions (0: none)."""
        out: list[dict] = []
        if limit is not None and limit <= 0:
            return out
        for v in reversed(self.log.versions()):
            m = self.log.try_load(v)
            if m is None:
                continue
            out.append({
                "version": m.version,
                "created_at": dt.datetime.fromtimestamp(m.created_at_ms / 1000,
                                                        tz=dt.timezone.utc).isoformat(),
                "operation": m.operation,
                "rows_added": m.summary.get("rows_added", 0),
                "rows_deleted": m.summary.get("rows_deleted", 0),
                "files_added": m.summary.get("files_added", 0),
                "files_removed": m.summary.get("files_removed", 0),
                "live_rows": m.live_rows,
                "files": len(m.data_files),
                **{k: v2 for k, v2 in m.summary.items() if k not in (
                    "rows_added", "rows_deleted", "files_added", "files_removed")},
            })
            if limit is not None and len(out) >= limit:
                break
        return out

    # -- writing -------------------------------------------------------------------
    def commit(self, mutator, **kw) -> Manifest | None:
        """Run a mutator through the one commit loop (after the store's self-check)."""
        return commit(self.log, mutator, runtime=self.runtime, **kw)

    def _conform(self, data, schema: pa.Schema) -> Iterable[pa.RecordBatch]:
        if isinstance(data, pa.Table):
            src_schema, batches = data.schema, data.to_batches()
        elif isinstance(data, pa.RecordBatch):
            src_schema, batches = data.schema, [data]
        elif isinstance(data, pa.RecordBatchReader):
            src_schema, batches = data.schema, data
        else:
            raise ConfigurationError("append takes a pyarrow Table, RecordBatch or "
                                     "RecordBatchReader", table=self.name, got=type(data).__name__)
        # the analysis step: every column pair is an exact widening, else nothing is written
        match = types.plan_columns(schema, src_schema, table=self.name)

        def gen():
            for b in batches:
                if b.num_rows:
                    yield types.conform_batch(b, schema, match, table=self.name)

        return gen()

    def write_files(self, data, *, head: Manifest | None = None, keys: list | None = None):
        """Write data files (not committed). Returns (files, bytes, rows). ``keys``: a list
        the key of every object is appended to *before* it is written, so a caller
        interrupted anywhere (even between this call's return and its next statement) can
        discard them all with :meth:`discard_keys`."""
        head = head or self.head()
        schema = schema_from_json(head.schema)
        batches = self._conform(data, schema)
        if inline.enabled(head):  # a small append goes into the manifest (PROTOCOL.md §18)
            settings = inline.InlineSettings.of(head.properties)
            small, rest = inline.take_small(batches, settings.max_rows)
            if rest is None:
                files = inline.write_inline(self, small, head, settings)
                if files is not None:
                    return files, sum(f.size for f in files), sum(f.rows for f in files)
            batches = itertools.chain(small, rest or ())
        writer = DataFileWriter(self.store, WriteLayout.from_manifest(head), self.runtime,
                                WriteOptions.from_properties(head.properties), head.version + 1)
        if keys is not None:
            writer.keys = keys
        try:
            files = writer.write(batches)
        except BaseException:
            # nothing references the files written so far (or being written when interrupted):
            # remove them (best effort; vacuum would find them as orphans after its grace)
            if keys is None:
                self.discard_keys(writer.keys)
            raise
        return files, writer.bytes_written, writer.rows_written

    def discard_files(self, files) -> None:
        """Delete data files that were written but never committed (best effort)."""
        self.discard_keys([f.path for f in files])

    def discard_keys(self, keys) -> None:
        """Delete objects written but never committed (best effort; missing keys are fine)."""
        for key in keys:
            try:
                self.store.delete(key)
            except Exception:  # noqa: BLE001 - cleanup must not hide the original error
                pass

    def append(self, data, *, expected_uuid: str | None = None,
               maintain: bool = False, written_for: Manifest | None = None
               ) -> Manifest | None:
        """Stream ``data`` into new data files and commit them in one version.
        Returns the new manifest (None if there were no rows). ``expected_uuid``: the
        ``table_uuid`` the rows were made for (an INSERT ... SELECT read that version); if
        the table was replaced since, nothing is written (TableNotFound). ``maintain``: after
        the commit, run one automatic-maintenance pass (:meth:`maintain`) in this thread.
        ``written_for``: the version whose columns ``data`` has (an INSERT's pinned one):
        the files are written with its schema and commit on any head that still holds it,
        so a column added, dropped or renamed meanwhile does not refuse the rows
        (docs/PROTOCOL.md §14.3); default: the head now."""
        head = self.head() if written_for is None else written_for
        check_incarnation(self.head() if written_for is not None else head, expected_uuid,
                          self.name)
        files, nbytes, nrows = self.write_files(data, head=head)
        if not files:
            return None
        m = self.commit_files(files, operation="append", extra={"bytes_added": nbytes},
                              expected_schema=head.schema, expected_uuid=head.table_uuid)
        if maintain:
            self.maintain(raise_errors=False)
        return m

    def maintain(self, *, tasks=None, raise_errors: bool = True) -> list:
        """One automatic-maintenance pass: the tasks the table's properties make due
        (``auto_compact``: compaction of small files, DV coalescing;
        ``flightsrv.table.maintenance.auto``), each committed with ``trigger: auto``.
        Returns their ``TaskOutcome``s. ``raise_errors=False`` (writers after their own
        commit, which has landed either way): a failure is logged, not raised."""
        from flightsrv.table.maintenance.auto import log as auto_log
        from flightsrv.table.maintenance.auto import maintain

        try:
            return maintain(self, tasks)
        except Exception as exc:
            if raise_errors:
                raise
            auto_log.warning("auto maintenance failed", extra={
                "table": self.name, "error_class": type(exc).__name__, "error": str(exc)})
            return []

    def commit_files(self, files, *, operation: str = "append", extra: dict | None = None,
                     expected_schema: dict | None = None,
                     expected_uuid: str | None = None, on_commit=None) -> Manifest:
        """Commit already-written data files (appends commute, so this rebases freely).

        ``expected_schema``: the schema JSON the files were written with. Format 2: the
        files commit on any head that still holds that schema (by its ``schema_id``)
        unchanged: appends commute with schema and partitioning changes (docs/PROTOCOL.md
        §14.3). Format 1: the head's schema must be the same. ``expected_uuid``: the
        ``table_uuid`` of the table the files were written for; if the table was dropped
        and created again or replaced meanwhile, nothing is committed (the rows were meant
        for a table that no longer exists). ``on_commit``: see ``flightsrv.table.commit``."""
        schema_json = expected_schema

        def mutate(head):
            head = require_table(head, self.name)
            check_incarnation(head, expected_uuid, self.name)
            check_written_schema(head, files, schema_json, self.name)
            added = tuple(dataclasses.replace(f, added_version=head.version + 1) for f in files)
            summary = {"rows_added": sum(f.rows for f in files), "files_added": len(files),
                       "rows_deleted": 0, "files_removed": 0, **(extra or {})}
            return dataclasses.replace(head, operation=operation, summary=summary,
                                       data_files=head.data_files + added)

        m = self.commit(mutate, on_commit=on_commit)
        if any(f.inline is not None for f in files):
            self.maybe_flush(m)
        return m

    def maybe_flush(self, m: Manifest | None) -> None:
        """Flush the inlined rows when version ``m`` holds more than its properties allow
        (after an inlined append committed). Best effort: the append is committed whatever
        happens here, so a failure is logged, never raised, and a flush already running in
        this process for the table is not started twice."""
        if not inline.needs_flush(m):
            return
        key = (self.home.uri, self.name)
        with _FLUSHING_LOCK:
            if key in _FLUSHING:
                return
            _FLUSHING.add(key)
        try:
            self.flush_inlined()
        except FlightsrvError as exc:
            _log.warning("flushing inlined rows failed; the next append retries",
                         extra={"table": self.name, "error": str(exc)})
        finally:
            with _FLUSHING_LOCK:
                _FLUSHING.discard(key)

    def flush_inlined(self, **kw):
        """Turn inlined rows into Parquet data files in one commit
        (``flightsrv.table.maintenance.flush``; SQL ``OPTIMIZE t`` flushes too)."""
        from flightsrv.table.maintenance.flush import flush_inlined

        return flush_inlined(self, **kw)

    # -- schema and partitioning (format 2; flightsrv.table.evolution) ---------------------
    def _evolve(self, change, *args, **kw) -> Manifest | None:
        """Commit one metadata-only change, re-validated against each head it meets."""
        from flightsrv.table import evolution

        fn = getattr(evolution, change)

        def mutate(head):
            return fn(require_table(head, self.name), self.name, *args, **kw)

        return self.commit(mutate)

    def add_column(self, name: str, type: pa.DataType, *, nullable: bool = True,
                   default=None) -> Manifest:
        """``ALTER TABLE t ADD COLUMN``: rows already written read ``default`` (or NULL).
        Refused with a default on a table with rows that publishes a Delta mirror (the
        ``publish.formats`` property names it, or its log exists): Delta cannot give rows
        already written a value without rewriting them (docs/INTEROP.md §5)."""
        from flightsrv.table import evolution

        delta = default is not None and self._publishes_delta()

        def mutate(head):
            head = require_table(head, self.name)
            m = evolution.add_column(head, self.name, name, type, nullable=nullable,
                                     default=default)
            if delta and any(f.rows > f.deleted_rows for f in head.data_files):
                raise ConfigurationError(
                    "ADD COLUMN ... DEFAULT on a table that publishes a Delta mirror: Delta "
                    "readers would read NULL, not the default, for the rows already written "
                    "(Delta cannot express a default for them without rewriting the files); "
                    "add the column without DEFAULT and set it with UPDATE, or stop "
                    "publishing Delta (publish.formats = 'iceberg')",
                    table=self.name, column=name, version=head.version)
            return m

        return self.commit(mutate)

    def _publishes_delta(self) -> bool:
        from flightsrv.table.mirror import publisher

        head = self.log.head()
        if head is not None and "delta" in publisher.parse_formats(
                head.properties.get(publisher.PROPERTY)):
            return True
        return "delta" in publisher.mirrors_present(self)

    def rename_column(self, old: str, new: str) -> Manifest | None:
        return self._evolve("rename_column", old, new)

    def drop_column(self, name: str) -> Manifest:
        return self._evolve("drop_column", name)

    def alter_column_type(self, name: str, type: pa.DataType, *,
                          check=None) -> Manifest | None:
        """Widen a column's type (int8->16->32->64, float32->64, decimal precision up,
        date->timestamp); old files are cast when read. ``check(head)``, when given, runs
        on each head the change is about to commit on and raises to refuse it (the engine
        checks there that every stored value takes the new type)."""
        from flightsrv.table import evolution

        def mutate(head):
            head = require_table(head, self.name)
            m = evolution.alter_column_type(head, self.name, name, type)
            if m is not None and check is not None:
                check(head)
            return m

        return self.commit(mutate)

    def widen_column(self, name: str, type: pa.DataType) -> Manifest | None:
        """Alias of :meth:`alter_column_type` (only widening is allowed)."""
        return self.alter_column_type(name, type)

    def set_partition_spec(self, fields) -> Manifest | None:
        """Alias of :meth:`set_partitioning`."""
        return self.set_partitioning(fields)

    def set_partitioning(self, fields) -> Manifest | None:
        """Partition new files by ``fields`` (``["day(ts)", "bucket(64, user_id)"]`` or
        ``[(transform, column)]``; empty: unpartitioned). Files already written keep their
        spec."""
        from flightsrv.table.partition import parse_field

        items = [parse_field(f) if isinstance(f, str) else tuple(f) for f in fields or ()]
        return self._evolve("set_partitioning", items)

    def upgrade(self) -> Manifest | None:
        """Move a format-1 table to format 2 in one commit (no data file is rewritten);
        None when it already is format 2."""
        return self._evolve("upgrade")

    @property
    def partitioning(self) -> str:
        """The current partition spec in SQL spelling (empty: unpartitioned)."""
        from flightsrv.table.partition import describe

        head = self.head()
        return describe(head.partition_spec, head.schema)

    def set_properties(self, **props) -> Manifest | None:
        """Set table properties in one commit; a value of None removes the property. None
        (and no commit) when every property already has the value given.
        Every value is checked against its type first (``flightsrv.table.properties``:
        unknown names outside ``user.`` are refused, sizes may be written ``64MB``)."""
        from flightsrv.table import properties as table_properties

        removed = sorted(k for k, v in props.items() if v is None)
        for k in removed:
            table_properties.check_name(k)
        given = {k: v for k, v in props.items() if v is not None}
        table_properties.normalize(given, table=self.name)  # fail before any I/O

        def mutate(head):
            head = require_table(head, self.name)
            names = schema_from_json(head.schema).names
            merged = {**head.properties, **table_properties.normalize(given, names,
                                                                      table=self.name)}
            for k in removed:
                merged.pop(k, None)
            if merged == head.properties:
                return None  # nothing changes: no new version
            summary = {"properties": sorted(props)}
            if removed:
                summary["removed"] = removed
            return dataclasses.replace(head, operation="set_properties", summary=summary,
                                       properties=merged)

        return self.commit(mutate)

    # -- maintenance and erasure (implemented in their own modules) ---------------------
    def compact(self, **kw):
        """DV-aware compaction (``flightsrv.table.maintenance.compact``)."""
        from flightsrv.table.maintenance import compact

        return compact(self, **kw)

    optimize = compact  # SQL ``OPTIMIZE t`` (the engine looks the verb up on the table)

    def expire_snapshots(self, **kw):
        from flightsrv.table.maintenance import expire_snapshots

        return expire_snapshots(self, **kw)

    def vacuum(self, **kw):
        from flightsrv.table.maintenance import vacuum

        return vacuum(self, **kw)

    def stats(self, **kw):
        from flightsrv.table.maintenance import table_stats

        return table_stats(self, **kw)

    def purge(self, **kw):
        """Physically remove rows already marked deleted (``flightsrv.table.erase.purge``)."""
        from flightsrv.table.erase import purge

        return purge(self, **kw)

    def erasures(self) -> list[dict]:
        """The erasure certificates stored under ``_erasures/``, oldest first."""
        from flightsrv.table.certificate import list_certificates

        return list_certificates(self)

    def publish(self, format="all", **kw):
        """Publish every retained version as Delta Lake and/or Iceberg v3 mirrors under the
        table prefix (``format``: "delta", "iceberg", "all" or a list;
        ``flightsrv.table.mirror.publisher``). Returns a ``PublishResult``."""
        from flightsrv.table.mirror.publisher import publish

        return publish(self, format, **kw)

    def erasure_status(self, **kw):
        """Deletions whose bytes are still stored, with their age and deadline
        (``flightsrv.table.erasure_status``)."""
        from flightsrv.table.erasure_status import erasure_status

        return erasure_status(self, **kw)


def check_incarnation(head: Manifest, expected_uuid: str | None, table: str) -> None:
    """TableNotFound unless ``head`` belongs to the table ``expected_uuid`` names (None:
    any): rows written or computed for a table that was dropped and created again, or
    replaced, never land in the new one."""
    if expected_uuid is not None and head.table_uuid != expected_uuid:
        raise TableNotFound("the table was replaced while the data was written; nothing "
                            "was appended", table=table, version=head.version)


def check_written_schema(head: Manifest, files, expected: dict | None, table: str) -> None:
    """SchemaMismatch unless ``files`` (written with schema JSON ``expected``) fit ``head``
    (see ``Table.commit_files``)."""
    if head.format_version < 2:
        if expected is not None and schema_fingerprint(head.schema) != \
                schema_fingerprint(expected):
            raise SchemaMismatch("table schema changed while the data was written",
                                 table=table, version=head.version)
        return
    for sid in sorted({f.schema_id for f in files}):
        try:
            have = head.schema_by_id(sid)
        except CorruptObject:
            raise SchemaMismatch("the data was written with a schema the table does not have "
                                 "(dropped and re-created meanwhile?)", table=table,
                                 version=head.version, schema_id=sid) from None
        if expected is not None and int(expected.get("schema_id", 0)) == sid and \
                have["fields"] != expected["fields"]:
            raise SchemaMismatch("table schema changed while the data was written",
                                 table=table, version=head.version, schema_id=sid)

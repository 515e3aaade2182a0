"""The format-level ``Warehouse``: a directory or bucket prefix holding tables, one
sub-prefix each. (The public ``flightsrv.Warehouse`` extends it with SQL.)

No catalog service: a table ``t`` is the prefix ``t/`` with its ``_latest_manifest`` pointer.
Creating a table commits version 0 (or, after a DROP, the next version) with operation
"create"; dropping commits a "drop" version, so names can be reused and a reader pinned to an
older version keeps working until vacuum. CREATE OR REPLACE is one "replace" commit that
starts a new table (a new ``table_uuid``) on top of the old one's versions.

Opening a warehouse creates nothing; the first write does. ``is_initialized()`` tells a location
that holds a warehouse from one that does not (a mistyped path, a table's own directory).
"""

from __future__ import annotations

import dataclasses
import os
import threading

import pyarrow as pa

from flightsrv.errors import (
    ConfigurationError,
    FlightsrvError,
    ObjectNotFound,
    TableExists,
    TableNotFound,
    TransientError,
)
from flightsrv.runtime import DEFAULT_RUNTIME, Runtime
from flightsrv.store import ensure_checked, open_store
from flightsrv.table.commit import require_table
from flightsrv.table import properties as table_properties
from flightsrv.table.manifest import (
    FORMAT_VERSION,
    POINTER_KEY,
    SUPPORTED_FORMATS,
    UNPARTITIONED,
    Manifest,
    schema_with_ids,
)
from flightsrv.table.schema import (
    check_column_names,
    check_column_types,
    normalize_schema,
    schema_to_json,
)
from flightsrv.table.names import _NAME, check_name, is_table_name  # noqa: F401 (re-exported)
from flightsrv.table.table import Table, TableHome


class Warehouse:
    def __init__(self, store, runtime: Runtime = DEFAULT_RUNTIME):
        self.store = store
        self.runtime = runtime
        self.uri = store.uri
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()
        #: HMAC key for request fingerprints (bytes); None: resolved by
        #: ``flightsrv.table.fingerprint.key_for`` (environment, then the warehouse object)
        self.erasure_key: bytes | None = None
        self._erasure_key_cache = None
        #: what its tables may use of this warehouse
        self.home = TableHome(store, runtime, self.uri, self._table_erasure_key)

    def _table_erasure_key(self):
        from flightsrv.table.fingerprint import key_for

        return key_for(self)

    def _new_table(self, name: str) -> Table:
        """A handle for table ``name`` (the SQL-level warehouse hands out its own kind)."""
        return Table(self.home, name)

    @classmethod
    def open(cls, uri: str, runtime: Runtime | None = None) -> "Warehouse":
        runtime = runtime or DEFAULT_RUNTIME
        return cls(open_store(uri, runtime), runtime)

    def __repr__(self) -> str:
        return f"Warehouse({self.uri!r})"

    def is_initialized(self) -> bool:
        """Whether this location holds a warehouse: it holds a table (a dropped one counts)
        or, on a local directory, a write already happened here (``.flightsrv/``). Reads
        only; a location that is a file raises ConfigurationError."""
        if getattr(self.store, "initialized", False):
            return True
        root = getattr(self.store, "root", None)
        if root is not None and os.path.exists(root) and not os.path.isdir(root):
            raise ConfigurationError("the warehouse path is a file, not a directory",
                                     warehouse=root)
        return any(_NAME.fullmatch(n) and self._has_pointer(n)
                   for n in self.store.list_prefixes(""))

    def is_table_location(self) -> bool:
        """Whether this location is itself a table's prefix (someone passed a table's
        directory as the warehouse)."""
        try:
            self.store.head(POINTER_KEY)
            return True
        except ObjectNotFound:
            return False

    def _has_pointer(self, name: str) -> bool:
        try:
            self.store.head(f"{name}/{POINTER_KEY}")
            return True
        except ObjectNotFound:
            return False

    def ensure_writable(self) -> None:
        """Prove once that the store enforces If-None-Match / If-Match (StoreUnsupported)."""
        ensure_checked(self.store, self.runtime.ids.new_id())

    def _table(self, name: str) -> Table:
        n = check_name(name)
        with self._lock:
            t = self._tables.get(n)
            if t is None:
                t = self._tables[n] = self._new_table(n)
            return t

    def handle(self, name: str) -> Table:
        """The handle of table ``name``, reading nothing: its ``snapshot()`` raises
        TableNotFound as ``table(name)`` would, with one read of the pointer instead of two
        (statement planning pins every table this way)."""
        return self._table(name)

    def table(self, name: str, *, dropped_ok: bool = False) -> Table:
        """The table ``name``; TableNotFound if it never existed or (unless ``dropped_ok``,
        for VACUUM of what a DROP left behind) if it was dropped."""
        t = self._table(name)
        head = t.log.head()
        if dropped_ok and head is not None:
            return t
        require_table(head, t.name)
        return t

    def exists(self, name: str) -> bool:
        try:
            self.table(name)
            return True
        except TableNotFound:
            return False

    def list_tables(self, broken: list | None = None) -> list[str]:
        """Names of the live tables. A table whose pointer or head manifest cannot be read
        (``CorruptObject``, a missing object, a pointer naming a missing version) is left
        out and, when ``broken`` is a list, appended to it as ``(name, error)``; it never
        hides the other tables. Transient store errors still raise."""
        out = []
        for n in self.store.list_prefixes(""):
            if not _NAME.fullmatch(n):
                continue
            try:
                head = self._table(n).log.head()
            except TransientError:
                raise
            except FlightsrvError as exc:
                if broken is not None:
                    broken.append((n, exc))
                continue
            if head is not None and not head.dropped:
                out.append(n)
        return out

    def create_table(self, name: str, schema: pa.Schema, properties: dict | None = None, *,
                     exist_ok: bool = False, replace: bool = False, data=None, data_files=(),
                     summary: dict | None = None, partition_by=None,
                     format_version: int = FORMAT_VERSION) -> Table:
        """Create table ``name`` (one commit, operation "create"). ``data_files`` (written
        with this schema, not yet committed) become the new table's first rows in the same
        commit, so a failed create leaves no table behind; ``summary`` adds to the commit
        summary. With ``exist_ok``, an existing table is returned unchanged (and
        ``data_files`` are not committed). ``partition_by``: hidden partitioning of its
        files, e.g. ``["day(event_time)", "bucket(64, user_id)"]`` (docs/PROTOCOL.md §15);
        ``format_version`` 1 makes a table of the old format (no field ids, no chunks).

        ``data`` (a pyarrow Table, RecordBatch or RecordBatchReader of ``schema``) is written
        as the table's files *before* the commit, and committed with it: a failure while it
        is read or written commits nothing and removes what was written.

        ``replace``: CREATE OR REPLACE. The new table (a new ``table_uuid``, operation
        "replace" when a live table was there) takes the name in the same single commit,
        so the old table stays whole and readable until the new one is complete, a failed
        replace leaves it untouched, and two racing replaces each commit one whole table
        (the later wins). Time travel does not cross a replace; the old table's versions
        stay readable by readers that pinned them until they expire."""
        from flightsrv.table.partition import make_spec, parse_field

        t = self._table(name)
        if format_version not in SUPPORTED_FORMATS:
            raise ConfigurationError("unknown table format version", table=t.name,
                                     format_version=format_version,
                                     supported=",".join(map(str, SUPPORTED_FORMATS)))
        check_column_types(schema, t.name)
        schema = normalize_schema(schema)
        if not len(schema):
            raise ConfigurationError("a table needs at least one column", table=t.name)
        check_column_names(schema, t.name)
        schema_json, last_id = schema_with_ids(schema_to_json(schema))
        props = table_properties.normalize(properties, schema.names, table=t.name)
        items = [parse_field(f) if isinstance(f, str) else tuple(f) for f in partition_by or ()]
        spec, last_pid = make_spec(0, items, schema_json, 999, table=t.name)
        if items and format_version < 2:
            raise ConfigurationError("partitioned tables need format 2", table=t.name)
        if exist_ok and replace:
            raise ConfigurationError("give exist_ok or replace, not both", table=t.name)
        draft = Manifest(version=0, previous=None, table_uuid="", commit_id="",
                         created_at_ms=0, operation="create", summary={},
                         schema=schema_json, properties=props, data_files=(), deletes={},
                         format_version=format_version,
                         partition_spec=spec if items else dict(UNPARTITIONED),
                         last_column_id=last_id, last_partition_id=last_pid)
        keys: list[str] = []  # every object written for ``data``, removed unless committed
        extra = dict(summary or {})
        if data is not None:
            if not replace:  # refuse before the upload is read, not after
                head = t.log.head()
                if head is not None and not head.dropped:
                    if exist_ok:
                        return t
                    raise TableExists("table already exists", table=t.name)
            try:
                written, nbytes, _rows = t.write_files(data, head=draft, keys=keys)
            except BaseException:
                t.discard_keys(keys)
                raise
            data_files = tuple(data_files) + tuple(written)
            if written:
                extra.setdefault("bytes_added", nbytes)
        existed = {}

        def mutate(head):
            live = head is not None and not head.dropped
            if live and not replace:
                existed["yes"] = True
                return None
            version = 0 if head is None else head.version + 1
            files = tuple(dataclasses.replace(f, added_version=version) for f in data_files)
            out = {"rows_added": sum(f.rows for f in files), "rows_deleted": 0,
                   "files_added": len(files), "files_removed": 0, **extra}
            if live:
                out.update(rows_deleted=head.live_rows, files_removed=len(head.data_files),
                           replaced_version=head.version)
            return dataclasses.replace(
                draft, table_uuid=t.runtime.ids.new_id(), data_files=files, summary=out,
                operation="replace" if live else "create")

        try:
            t.commit(mutate)
        except BaseException:
            t.discard_keys(keys)
            raise
        if existed:
            t.discard_keys(keys)
            if exist_ok:
                return t
            raise TableExists("table already exists", table=t.name)
        return t

    def vacuum_orphans(self, *, grace=None, dry_run: bool = False, progress=None):
        """Delete objects older than ``grace`` (default 7 days) under prefixes that hold no
        table: the files of creates that failed before they committed (see
        :func:`flightsrv.table.maintenance.vacuum_orphan_prefixes`). Returns an
        ``OrphanVacuumResult``."""
        from flightsrv.table.maintenance import DEFAULT_GRACE, vacuum_orphan_prefixes

        return vacuum_orphan_prefixes(self, grace=DEFAULT_GRACE if grace is None else grace,
                                      dry_run=dry_run, progress=progress)

    def drop_table(self, name: str, *, missing_ok: bool = False) -> None:
        t = self._table(name)
        found = {}

        def mutate(head):
            if head is None or head.dropped:
                return None
            found["yes"] = True
            return dataclasses.replace(
                head, operation="drop", data_files=(),
                summary={"rows_added": 0, "rows_deleted": head.live_rows, "files_added": 0,
                         "files_removed": len(head.data_files)})

        t.commit(mutate)
        if not found and not missing_ok:
            raise TableNotFound("no such table", table=t.name)

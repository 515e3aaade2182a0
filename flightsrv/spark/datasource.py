"""The ``flightsrv`` Spark data source (PySpark Python Data Source API).

Write: ``df.write.format("flightsrv").mode(m).save("<warehouse>/<table>")``, ``m`` one of
``errorifexists`` (Spark's default), ``ignore``, ``append``, ``overwrite``:

- planning (``writer()``): opens the table, or plans to create it from the DataFrame's schema
  (nested fields nullable; ``option("create", "false")`` refuses). Columns resolve by name,
  ignoring case unless ``spark.sql.caseSensitive``; every type pair must be an exact widening
  of :mod:`flightsrv.table.types`, else ``SchemaMismatch`` names the column, the table type
  and the incoming type before any task runs. DataFrame columns the table lacks are refused
  unless ``option("mergeSchema", "true")``, which adds them (nullable, metadata-only commits
  of format 2, before any task runs); files are written with the table's field ids and
  split by its partition spec;
- tasks (``write()``): stream Spark's Arrow batches, conformed to the table schema, through
  the table's ``DataFileWriter`` into the table's store, and return the ``DataFile`` entries
  as the commit message. A task whose Python code fails (a NULL in a NOT NULL field, a store
  error) deletes the files it wrote; what tasks Spark kills leave behind is vacuum's;
- ``commit()`` (a Python worker the JVM starts, not the driver) commits ONCE through the
  commit loop: a new table is created *with* its files in one commit (a failed job leaves no
  table); append = ``Table.commit_files`` (rebases over concurrent commits); overwrite = one
  mutator replacing every data file. The summary names the job (``spark_job``);
- ``abort()`` deletes the files of finished tasks unless a version of this job committed them
  (files of a failed create that escape it: ``Warehouse.vacuum_orphans``).

Spark hands a Python data source only "overwrite or not" and refuses ``errorifexists`` and
``ignore`` for it; ``flightsrv.spark.register`` teaches PySpark's writer to carry those modes
to the source as the option ``saveMode`` (:mod:`flightsrv.spark.modes`).

Read: ``spark.read.format("flightsrv").option("versionAsOf", n) |
option("timestampAsOf", iso_or_epoch_ms).load(uri)``

- the snapshot is pinned at load (``__init__``/``schema()``, which Spark runs once per
  ``load`` and whose object it reuses for every query of the DataFrame), as in Delta;
- partitions are one per data file, split into chunks of ``rowGroupsPerPartition`` row groups
  (default 4) for big files; deletion vectors and deleted row groups apply inside the scan;
- with ``option("pushFilters", "true")``, Spark's pushed filters prune files and row groups
  by statistics (``flightsrv.spark.filters``); flightsrv never filters rows itself: every
  filter is reported back as not handled and Spark evaluates it. Off by default because of a
  Spark 4.3 defect: the pushdown worker stores the reader (with its filters) in the
  DataFrame's data source object, and a later query on the *same* DataFrame that pushes no
  filter reuses it, so its files would be pruned for the earlier filter. Load a fresh
  DataFrame per filtered query when pushdown is on;
- projection: Spark 4.3 does not prune columns for Python sources, so pass the columns you
  need as ``option("columns", "a,b")`` or a user schema ``.schema("a long, b string")`` (it
  may widen a column, never narrow it); only those columns are read from Parquet;
- ``option("metadataColumns", "true")`` adds ``_file`` (data file key) and ``_row_position``
  (physical row position in that file, the position a deletion vector names).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from flightsrv.errors import (
    ConfigurationError,
    FlightsrvError,
    SchemaMismatch,
    TableExists,
    TableNotFound,
)
from flightsrv.spark import filters as F
from flightsrv.spark.location import split_uri, table_handle
from flightsrv.spark.types import (
    arrow_schema_to_spark,
    spark_arrow_schema,
    spark_schema_to_arrow,
    spark_to_arrow,
)
from flightsrv.table import types as rules
from flightsrv.table.properties import normalize as normalize_properties
from flightsrv.table.commit import require_table
from flightsrv.table.manifest import UNPARTITIONED, DataFile, schema_with_ids
from flightsrv.table.scan import FileTask, Snapshot
from flightsrv.table.schema import normalize_schema, schema_from_json, schema_to_json
from flightsrv.table.timestamps import parse_timestamp_ms
from flightsrv.table.writer import DataFileWriter, WriteLayout, WriteOptions

NAME = "flightsrv"
FILE_COLUMN = "_file"
POSITION_COLUMN = "_row_position"
METADATA_FIELDS = (T.StructField(FILE_COLUMN, T.StringType(), True),
                   T.StructField(POSITION_COLUMN, T.LongType(), True))
DEFAULT_ROW_GROUPS_PER_PARTITION = 4

#: The save modes and what each does when the table exists / does not exist. Spark hands a
#: Python data source only "overwrite or not"; ``flightsrv.spark.register`` carries the
#: other modes to it as the option ``saveMode`` (see :mod:`flightsrv.spark.modes`).
SAVE_MODES = ("errorifexists", "ignore", "append", "overwrite")
SAVE_MODE_ALIASES = {"error": "errorifexists", "default": "errorifexists"}
#: Option set by ``flightsrv.spark.register`` from the session's ``spark.sql.caseSensitive``;
#: ``option("caseSensitive", ...)`` overrides it.
SESSION_CASE_OPTION = "sessionCaseSensitive"


def _flag(options, key: str, default: bool = False) -> bool:
    v = options.get(key)
    if v is None:
        return default
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def case_sensitive(options) -> bool:
    """``option("caseSensitive")``, else the session's ``spark.sql.caseSensitive`` (carried
    by ``register``), else False (Spark's default)."""
    if options.get("caseSensitive") is not None:
        return _flag(options, "caseSensitive")
    return _flag(options, SESSION_CASE_OPTION)


def save_mode(options, overwrite: bool) -> str:
    if overwrite:
        return "overwrite"
    m = str(options.get("saveMode") or "append").strip().lower()
    m = SAVE_MODE_ALIASES.get(m, m)
    if m not in SAVE_MODES:
        raise ConfigurationError("unknown save mode", mode=m, modes=",".join(SAVE_MODES))
    return m


def _location(options) -> tuple[str, str]:
    path = options.get("path")
    if not path:
        raise ConfigurationError("the flightsrv data source needs a path: "
                                 ".save('<warehouse uri>/<table>') or .load(...)")
    return split_uri(path)


_INTEGER = re.compile(r"\s*\d+\s*")


def time_travel(options, table: str) -> tuple[int | None, int | None]:
    """(version, timestamp ms) from ``versionAsOf`` (alias ``version``) and ``timestampAsOf``
    (ISO 8601, or epoch milliseconds; Spark passes every option as a string). At most one."""
    version = None
    given = {k: options.get(k) for k in ("versionAsOf", "version") if options.get(k) is not None}
    for key, raw in given.items():
        if not _INTEGER.fullmatch(str(raw)):
            raise ConfigurationError(f"{key} must be a version number (an integer >= 0)",
                                     table=table, value=raw)
        v = int(str(raw))
        if version is not None and v != version:
            raise ConfigurationError("versionAsOf and version disagree", table=table,
                                     versionAsOf=given.get("versionAsOf"),
                                     version=given.get("version"))
        version = v
    as_of = options.get("timestampAsOf")
    if version is not None and as_of is not None:
        raise ConfigurationError("give versionAsOf or timestampAsOf, not both", table=table)
    return version, (None if as_of is None else parse_timestamp_ms(str(as_of)))


def _snapshot(table, options) -> Snapshot:
    version, as_of = time_travel(options, table.name)
    if version is None and as_of is None and options.get("pinnedVersion") is not None:
        version = int(options["pinnedVersion"])  # the head when load() ran (modes.py)
    return table.snapshot(version, as_of)


def _resolve(name: str, names: list[str], exact: bool) -> str | None:
    if name in names:
        return name
    if exact:
        return None
    hits = [n for n in names if n.lower() == name.lower()]
    return hits[0] if len(hits) == 1 else None


class FlightsrvDataSource(DataSource):
    """Registered as ``flightsrv`` by ``flightsrv.spark.register(spark)``.

    A loaded DataFrame is pinned at load. With ``register`` the driver passes the version it
    saw at ``load()`` (option ``pinnedVersion``, :mod:`flightsrv.spark.modes`). Without it,
    Spark creates the source once per ``load()`` (``__init__``, then ``schema()``) and
    pickles it, and every query of that DataFrame plans from the pickled copy, so every one of
    them reads the version pinned here (with a user schema Spark creates the source per
    query instead, so only ``register`` pins such a DataFrame at load)."""

    def __init__(self, options):
        super().__init__(options)
        self.pinned: int | None = None
        try:
            self.pinned = self._pin()
        except FlightsrvError:
            pass  # not a readable table (yet): schema()/reader()/writer() raise with context

    @classmethod
    def name(cls) -> str:
        return NAME

    def _pin(self) -> int | None:
        wh, name = _location(self.options)
        table = table_handle(wh, name)
        if table.log.head() is None:
            return None
        return _snapshot(table, self.options).version

    def _pinned_snapshot(self) -> Snapshot:
        wh, name = _location(self.options)
        table = table_handle(wh, name)
        require_table(table.log.head(), name)
        if self.pinned is None:
            self.pinned = _snapshot(table, self.options).version
        return table.snapshot(self.pinned)

    def schema(self) -> T.StructType:
        snap = self._pinned_snapshot()
        name = snap.table.name
        fields = list(snap.schema)
        cols = self.options.get("columns")
        if cols:
            exact = case_sensitive(self.options)
            wanted = [c.strip() for c in cols.split(",") if c.strip()]
            found = [_resolve(c, snap.schema.names, exact) for c in wanted]
            unknown = [c for c, f in zip(wanted, found) if f is None]
            if unknown:
                raise ConfigurationError("unknown column in option columns", table=name,
                                         columns=",".join(unknown))
            fields = [snap.schema.field(c) for c in found]
        # only the columns read need a Spark type: a column Spark cannot represent (TIME)
        # left out by option columns does not make the table unreadable
        st = arrow_schema_to_spark(pa.schema(fields))
        if _flag(self.options, "metadataColumns"):
            clash = [f.name for f in METADATA_FIELDS
                     if any(n.lower() == f.name for n in snap.schema.names)]
            if clash:
                raise ConfigurationError("table columns clash with metadata columns",
                                         table=name, columns=",".join(clash))
            st = T.StructType(list(st.fields) + list(METADATA_FIELDS))
        return st

    def reader(self, schema: T.StructType) -> FlightsrvReader:
        # Spark refuses any reader that defines pushFilters unless
        # spark.sql.python.filterPushdown.enabled is set, so pushdown lives in a subclass used
        # only when asked for (it is opt-in anyway, see the module docstring). A plain session
        # with automatic registration can then read.
        snap = self._pinned_snapshot()
        if _flag(self.options, "pushFilters"):
            return FlightsrvPushdownReader(self.options, schema, snap)
        return FlightsrvReader(self.options, schema, snap)

    def writer(self, schema: T.StructType, overwrite: bool) -> FlightsrvWriter:
        return FlightsrvWriter(self.options, schema, overwrite)


# -- read ---------------------------------------------------------------------------------


class FilePartition(InputPartition):
    """One data file's row groups at a pinned version (carries the manifest entry)."""

    def __init__(self, file: DataFile, row_groups: list[int], version: int):
        super().__init__((file.path, tuple(row_groups), version))
        self.file = file
        self.row_groups = list(row_groups)
        self.version = version


class FlightsrvReader(DataSourceReader):
    def __init__(self, options, schema: T.StructType, snap: Snapshot):
        self.wh_uri, self.name = _location(options)
        self.version = snap.version
        self.schema = schema
        self.table_schema_json = snap.manifest.schema
        exact = case_sensitive(options)
        names = schema.fieldNames()
        self.want_file = FILE_COLUMN in names
        self.want_position = POSITION_COLUMN in names
        self.out_names = [n for n in names if n not in (FILE_COLUMN, POSITION_COLUMN)]
        self.columns = [_resolve(n, snap.schema.names, exact) for n in self.out_names]
        unknown = [n for n, c in zip(self.out_names, self.columns) if c is None]
        if unknown:
            raise ConfigurationError("read schema names columns the table does not have",
                                     table=self.name, version=self.version,
                                     columns=",".join(unknown))
        # a user schema may widen a column, never narrow it (no silent change of value):
        # checked against the type the column reads as by default (arrow_to_spark: a
        # nanosecond timestamp reads as Spark's microseconds, as documented)
        want = spark_arrow_schema(schema)
        for out, col in zip(self.out_names, self.columns):
            stored = snap.schema.field(col)
            default = spark_arrow_schema(arrow_schema_to_spark(pa.schema([stored])))[0].type
            why = rules.refusal(want.field(out).type, default, case_sensitive=exact)
            if why is not None:
                raise SchemaMismatch(
                    "read schema does not fit the table's column (a user schema may widen a "
                    "column, never narrow it)", table=self.name, version=self.version,
                    column=col, table_type=rules.type_name(stored.type),
                    read_type=rules.type_name(want.field(out).type), reason=why)
        raw = options.get("rowGroupsPerPartition", str(DEFAULT_ROW_GROUPS_PER_PARTITION))
        try:
            self.rg_per_part = int(str(raw).strip())
        except ValueError:
            self.rg_per_part = 0
        if self.rg_per_part < 1:
            raise ConfigurationError("rowGroupsPerPartition must be an integer >= 1",
                                     table=self.name, value=raw)
        self.prune: list = []  # PruneTerm hints from pushed filters (never decide rows)
        self.push = _flag(options, "pushFilters")

    def partitions(self):
        snap = table_handle(self.wh_uri, self.name).snapshot(self.version)
        parts = []
        file_filter = group_filter = None
        if self.prune:
            import duckdb

            from flightsrv.engine.prune import Pruner

            pruner = Pruner(duckdb.connect(), self.prune, snap.schema, snap.manifest)
            file_filter, group_filter = pruner.files, pruner.row_groups
        for task in snap.plan(file_filter, group_filter, with_deletes=False):
            rgs = task.row_groups
            for i in range(0, len(rgs), self.rg_per_part):
                parts.append(FilePartition(task.file, rgs[i:i + self.rg_per_part], self.version))
        return parts

    def read(self, partition):
        if not isinstance(partition, FilePartition):
            return  # Spark's stand-in partition for an empty table
        table = table_handle(self.wh_uri, self.name)
        # inlined rows travel in the partition itself (no object to read, whose absence
        # would stop a DataFrame planned before an erasure expired its version): their
        # version must still be retained now (one HEAD when the manifest was cached)
        load = table.log.load_retained if partition.file.is_inline else table.log.load
        snap = Snapshot(table, load(self.version))
        target = spark_arrow_schema(self.schema)
        task = FileTask(partition.file, partition.row_groups,
                        snap.deleted_positions(partition.file))
        positions = POSITION_COLUMN if self.want_position else None
        for _, t in snap.iter_tables(self.columns, tasks=[task], positions=positions):
            if t.num_rows == 0:
                continue
            t = t.rename_columns(self.out_names + ([POSITION_COLUMN] if positions else []))
            if self.want_file:
                t = t.append_column(FILE_COLUMN, pa.array([partition.file.path] * t.num_rows,
                                                          pa.string()))
            t = t.select(target.names).cast(target, safe=False)
            yield from t.to_batches()


class FlightsrvPushdownReader(FlightsrvReader):
    """The reader with ``pushFilters`` (needs spark.sql.python.filterPushdown.enabled)."""

    def pushFilters(self, filters):
        if not self.push:
            return filters  # see the module docstring: Spark would reuse them stale
        schema = schema_from_json(self.table_schema_json)
        # Spark names attributes as the read schema spells them
        spelled = dict(zip(self.out_names, self.columns))
        self.prune = F.prune_terms(filters, schema, spelled)
        return filters  # Spark evaluates every filter; flightsrv only prunes


# -- write --------------------------------------------------------------------------------


@dataclass
class FilesWritten(WriterCommitMessage):
    """A task's commit message: the data files it wrote (not yet committed)."""

    files: list[DataFile]
    bytes: int
    rows: int


def _spark_type_names(spark_schema: T.StructType):
    by_name = {f.name: f.dataType.simpleString() for f in spark_schema.fields}
    return lambda col: by_name.get(col, "?")


def check_fits(table_name: str, table_schema: pa.Schema, spark_schema: T.StructType, *,
               case_sensitive: bool = False) -> dict[str, str]:
    """The write's analysis step (on Spark's planning worker): the DataFrame's columns
    resolved to the table's (ignoring case unless ``case_sensitive``), and every type pair
    checked against the shared type rules (:mod:`flightsrv.table.types`). Returns table
    column -> DataFrame column; raises ``SchemaMismatch`` naming what does not fit, before any
    task runs."""
    incoming = pa.schema([pa.field(f.name, spark_to_arrow(f.dataType, column=f.name), True)
                          for f in spark_schema.fields])
    return rules.plan_columns(table_schema, incoming, table=table_name,
                              case_sensitive=case_sensitive,
                              incoming_names=_spark_type_names(spark_schema))


def merge_schema(table, head, spark_schema: T.StructType, *, case_sensitive: bool = False):
    """``option("mergeSchema", "true")``: add the DataFrame's columns the table lacks (one
    metadata-only commit each, nullable, through the commit loop; format 2 only), before any
    task runs. Returns the new head. The columns stay if the job fails later."""
    names = schema_from_json(head.schema).names
    have = set(names) if case_sensitive else {n.lower() for n in names}
    for f in spark_schema.fields:
        key = f.name if case_sensitive else f.name.lower()
        if key in have:
            continue
        t = rules.nullable_nested(spark_to_arrow(f.dataType, column=f.name))
        table.add_column(f.name, t)
        have.add(key)
    return table.log.head()


class FlightsrvWriter(DataSourceArrowWriter):
    def __init__(self, options, spark_schema: T.StructType, overwrite: bool):
        self.wh_uri, self.name = _location(options)
        self.mode = save_mode(options, overwrite)
        self.overwrite = overwrite
        self.case_sensitive = case_sensitive(options)
        #: option("maintain", "true"): one automatic-maintenance pass after the commit
        self.maintain = _flag(options, "maintain")
        self.skip = False
        table = table_handle(self.wh_uri, self.name)
        self.job_id = table.runtime.ids.new_id()
        head = table.log.head()
        if head is None or head.dropped:
            if not _flag(options, "create", True):
                raise TableNotFound("no such table (and option create=false)", table=self.name)
            schema = normalize_schema(spark_schema_to_arrow(spark_schema))
            self.create = True
            # checked here, on the driver, before any task writes a file
            self.properties = normalize_properties(
                {k[len("property."):]: str(v) for k, v in options.items()
                 if k.startswith("property.")}, schema.names, table=self.name)
            self.match = {n: n for n in schema.names}
            version_hint = 0 if head is None else head.version + 1
        else:
            if self.mode == "errorifexists":
                raise TableExists("table already exists (save mode errorifexists, Spark's "
                                  "default: use mode 'append' or 'overwrite', or 'ignore' to "
                                  "skip the write)", table=self.name)
            self.create = False
            self.skip = self.mode == "ignore"
            if _flag(options, "mergeSchema") and not self.skip:
                head = merge_schema(table, head, spark_schema,
                                    case_sensitive=self.case_sensitive)
            schema = schema_from_json(head.schema)
            try:
                # mode "ignore" on an existing table writes nothing: its rows need not fit
                self.match = {} if self.skip else check_fits(
                    self.name, schema, spark_schema, case_sensitive=self.case_sensitive)
            except SchemaMismatch as e:
                if not e.context.get("unexpected"):
                    raise
                raise SchemaMismatch(e.message + "; set option mergeSchema=true to add the "
                                     "new columns to the table", **e.context) from None
            self.properties = dict(head.properties)
            version_hint = head.version + 1
        # the schema with field ids the files are written with, and the partition spec
        self.schema_json = head.schema if not self.create else \
            schema_with_ids(schema_to_json(schema))[0]
        self.spec_json = dict(UNPARTITIONED) if self.create else head.partition_spec
        self.version_hint = version_hint
        #: the table the job writes for (None: it creates one); a table dropped and created
        #: again or replaced while the job runs does not take its rows
        self.table_uuid = None if self.create else head.table_uuid

    def write(self, iterator) -> FilesWritten:
        if self.skip:
            return FilesWritten([], 0, 0)
        table = table_handle(self.wh_uri, self.name)
        schema = schema_from_json(self.schema_json)
        writer = DataFileWriter(table.store, WriteLayout(self.schema_json, self.spec_json),
                                table.runtime, WriteOptions.from_properties(self.properties),
                                self.version_hint)
        batches = (rules.conform_batch(b, schema, self.match, table=self.name,
                                       case_sensitive=self.case_sensitive)
                   for b in iterator if b.num_rows)
        try:
            files = writer.write(batches)
        except BaseException:
            table.discard_files(writer.files)  # a failed task leaves nothing behind
            raise
        return FilesWritten(list(files), writer.bytes_written, writer.rows_written)

    def _summary(self, nbytes: int) -> dict:
        return {"bytes_added": nbytes, "spark_job": self.job_id}

    def commit(self, messages) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        nbytes = sum(m.bytes for m in messages if m is not None)
        from flightsrv.warehouse import Warehouse

        if self.skip:
            return
        wh = Warehouse.open(self.wh_uri)
        table = table_handle(self.wh_uri, self.name)
        if self.create:
            try:
                wh.create_table(self.name, schema_from_json(self.schema_json), self.properties,
                                data_files=files, summary=self._summary(nbytes))
                return
            except TableExists:
                if self.mode in ("errorifexists", "ignore"):
                    table.discard_files(files)  # never committed
                    if self.mode == "ignore":
                        return
                    raise TableExists("table was created by another writer while this job "
                                      "ran (save mode errorifexists)", table=self.name) from None
                # append / overwrite: the table another writer created takes the rows
        if not self.overwrite:
            if files:
                table.commit_files(files, operation="spark_append",
                                   expected_schema=self.schema_json,
                                   expected_uuid=self.table_uuid,
                                   extra=self._summary(nbytes))
                if self.maintain:  # the rows have landed; a failure here is only logged
                    table.maintain(raise_errors=False)
            elif table.head().schema != self.schema_json:
                raise SchemaMismatch("table schema changed while the data was written",
                                           table=self.name)
            return
        schema_json, name, summary_extra = self.schema_json, self.name, self._summary(nbytes)

        def replace_all(head):
            head = require_table(head, name)
            if head.schema != schema_json:
                raise SchemaMismatch("table schema changed while the data was written",
                                           table=name, version=head.version)
            added = tuple(dataclasses.replace(f, added_version=head.version + 1) for f in files)
            summary = {"rows_added": sum(f.rows for f in files), "files_added": len(files),
                       "rows_deleted": head.live_rows, "files_removed": len(head.data_files),
                       **summary_extra}
            return dataclasses.replace(head, operation="spark_overwrite", summary=summary,
                                       data_files=added)

        table.commit(replace_all)

    def abort(self, messages) -> None:
        """The job failed (a task, or the commit): delete the files finished tasks wrote,
        unless a version committed by this job references them (the commit landed before
        something after it failed). Failed tasks already deleted their own files."""
        files = [f for m in messages or () if m is not None for f in m.files]
        if not files:
            return
        table = table_handle(self.wh_uri, self.name)
        if self._committed(table):
            return
        table.discard_files(files)

    def _committed(self, table) -> bool:
        head = table.log.head()
        if head is None:
            return False
        for v in range(self.version_hint, head.version + 1):
            m = table.log.try_load(v)
            if m is not None and m.summary.get("spark_job") == self.job_id:
                return True
        return False

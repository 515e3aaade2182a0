"""The ``flightsrv`` Spark data source (PySpark Python Data Source API).

Write: ``df.write.format("flightsrv").mode("append"|"overwrite").save("<warehouse>/<table>")``

- planning (``writer()``): opens the table, or plans to create it from the DataFrame's schema
  (``option("create", "false")`` refuses); a column set or type that does not fit raises
  ``SchemaMismatch`` naming the columns;
- tasks (``write()``): stream Spark's Arrow batches through the table's ``DataFileWriter``
  straight into the table's store and return the ``DataFile`` entries as the commit message;
- ``commit()`` (a Python worker the JVM starts, not the driver) commits ONCE through the
  commit loop: append = ``Table.commit_files`` (rebases over concurrent commits); overwrite =
  one mutator replacing every data file with the new ones. The table is created here if it
  did not exist, so a failed job leaves no table behind;
- ``abort()`` commits nothing: files of finished tasks stay as orphans for vacuum (deleting
  them is unsafe when the commit's outcome is unknown).

Read: ``spark.read.format("flightsrv").option("version", n) | option("timestampAsOf", t)
.load(uri)``

- the snapshot is pinned once at planning; partitions are one per data file, split into
  chunks of ``rowGroupsPerPartition`` row groups (default 4) for big files;
- deletion vectors and deleted row groups are applied inside the scan;
- with ``option("pushFilters", "true")``, Spark's pushed filters prune files and row groups
  by statistics (``flightsrv.spark.filters``); flightsrv never filters rows itself: every
  filter is reported back as not handled and Spark evaluates it. Off by default because of a
  Spark 4.3 defect: the pushdown worker stores the reader (with its filters) in the
  DataFrame's data source object, and a later query on the *same* DataFrame that pushes no
  filter reuses it, so its files would be pruned for the earlier filter. Load a fresh
  DataFrame per filtered query when pushdown is on;
- projection: Spark 4.3 does not prune columns for Python sources, so pass the columns you
  need as ``option("columns", "a,b")`` or a user schema ``.schema("a long, b string")``;
  only those columns are read from Parquet;
- ``option("metadataColumns", "true")`` adds ``_file`` (data file key) and ``_row_position``
  (physical row position in that file, the position a deletion vector names).
"""

from __future__ import annotations

import dataclasses
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

from flightsrv.errors import ConfigurationError, SchemaMismatch, TableNotFound
from flightsrv.spark import filters as F
from flightsrv.spark.location import split_uri, table_handle
from flightsrv.spark.types import (
    arrow_schema_to_spark,
    spark_arrow_schema,
    spark_schema_to_arrow,
    spark_to_arrow,
)
from flightsrv.table.commit import require_table
from flightsrv.table.manifest import DataFile
from flightsrv.table.scan import FileTask, Snapshot
from flightsrv.table.schema import normalize_schema, schema_from_json, schema_to_json
from flightsrv.table.writer import DataFileWriter, WriteOptions

NAME = "flightsrv"
FILE_COLUMN = "_file"
POSITION_COLUMN = "_row_position"
METADATA_FIELDS = (T.StructField(FILE_COLUMN, T.StringType(), True),
                   T.StructField(POSITION_COLUMN, T.LongType(), True))
DEFAULT_ROW_GROUPS_PER_PARTITION = 4


def _flag(options, key: str, default: bool = False) -> bool:
    v = options.get(key)
    if v is None:
        return default
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _location(options) -> tuple[str, str]:
    path = options.get("path")
    if not path:
        raise ConfigurationError("the flightsrv data source needs a path: "
                                 ".save('<warehouse uri>/<table>') or .load(...)")
    return split_uri(path)


def _snapshot(table, options) -> Snapshot:
    version = options.get("version", options.get("versionAsOf"))
    as_of = options.get("timestampAsOf")
    return table.snapshot(int(version) if version is not None else None, as_of)


class FlightsrvDataSource(DataSource):
    """Registered as ``flightsrv`` by ``flightsrv.spark.register(spark)``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> T.StructType:
        wh, name = _location(self.options)
        table = table_handle(wh, name)
        require_table(table.log.head(), name)
        snap = _snapshot(table, self.options)
        st = arrow_schema_to_spark(snap.schema)
        cols = self.options.get("columns")
        if cols:
            wanted = [c.strip() for c in cols.split(",") if c.strip()]
            unknown = [c for c in wanted if c not in st.fieldNames()]
            if unknown:
                raise ConfigurationError("unknown column in option columns", table=name,
                                         columns=",".join(unknown))
            st = T.StructType([st[c] for c in wanted])
        if _flag(self.options, "metadataColumns"):
            clash = [f.name for f in METADATA_FIELDS if f.name in snap.schema.names]
            if clash:
                raise ConfigurationError("table columns clash with metadata columns",
                                         table=name, columns=",".join(clash))
            st = T.StructType(list(st.fields) + list(METADATA_FIELDS))
        return st

    def reader(self, schema: T.StructType) -> "FlightsrvReader":
        # Spark refuses any reader that defines pushFilters unless
        # spark.sql.python.filterPushdown.enabled is set, so pushdown lives in a subclass used
        # only when asked for (it is opt-in anyway, see the module docstring). A plain session
        # with automatic registration can then read.
        if _flag(self.options, "pushFilters"):
            return FlightsrvPushdownReader(self.options, schema)
        return FlightsrvReader(self.options, schema)

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
    def __init__(self, options, schema: T.StructType):
        self.wh_uri, self.name = _location(options)
        table = table_handle(self.wh_uri, self.name)
        snap = _snapshot(table, options)
        self.version = snap.version
        self.schema = schema
        self.table_schema_json = snap.manifest.schema
        names = schema.fieldNames()
        self.columns = [n for n in names if n not in (FILE_COLUMN, POSITION_COLUMN)]
        unknown = [c for c in self.columns if c not in snap.schema.names]
        if unknown:
            raise ConfigurationError("read schema names columns the table does not have",
                                     table=self.name, version=self.version,
                                     columns=",".join(unknown))
        self.want_file = FILE_COLUMN in names
        self.want_position = POSITION_COLUMN in names
        self.rg_per_part = max(1, int(options.get("rowGroupsPerPartition",
                                                  DEFAULT_ROW_GROUPS_PER_PARTITION)))
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
        snap = Snapshot(table, table.log.load(self.version))
        target = spark_arrow_schema(self.schema)
        task = FileTask(partition.file, partition.row_groups,
                        snap.deleted_positions(partition.file))
        positions = POSITION_COLUMN if self.want_position else None
        for _, t in snap.iter_tables(self.columns, tasks=[task], positions=positions):
            if t.num_rows == 0:
                continue
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
        self.prune = F.prune_terms(filters, schema_from_json(self.table_schema_json))
        return filters  # Spark evaluates every filter; flightsrv only prunes


# -- write --------------------------------------------------------------------------------


@dataclass
class FilesWritten(WriterCommitMessage):
    """A task's commit message: the data files it wrote (not yet committed)."""

    files: list[DataFile]
    bytes: int
    rows: int


def check_fits(table_name: str, table_schema: pa.Schema, spark_schema: T.StructType) -> None:
    """Raise ``SchemaMismatch`` naming the columns if a DataFrame cannot append to a table."""
    src = {f.name: f.dataType for f in spark_schema.fields}
    missing = [n for n in table_schema.names if n not in src]
    extra = [n for n in src if n not in table_schema.names]
    if missing or extra:
        raise SchemaMismatch("DataFrame columns do not match the table's columns",
                             table=table_name, missing=",".join(missing) or None,
                             unexpected=",".join(extra) or None)
    for f in table_schema:
        st = spark_to_arrow(src[f.name], column=f.name)
        if st == f.type:
            continue
        try:
            pa.array([], st).cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SchemaMismatch("DataFrame column type does not match the table",
                                 table=table_name, column=f.name, expected=str(f.type),
                                 found=src[f.name].simpleString()) from None


def conform(batch: pa.RecordBatch, schema: pa.Schema, table_name: str) -> pa.RecordBatch:
    """Reorder and cast one Spark batch to the table schema."""
    cols = []
    for f in schema:
        col = batch.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatch("value does not fit the column type", table=table_name,
                                     column=f.name, expected=str(f.type),
                                     error=str(exc)) from None
        if not f.nullable and col.null_count:
            raise SchemaMismatch("NULL in a NOT NULL column", table=table_name, column=f.name)
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=schema)


class FlightsrvWriter(DataSourceArrowWriter):
    def __init__(self, options, spark_schema: T.StructType, overwrite: bool):
        self.wh_uri, self.name = _location(options)
        self.overwrite = overwrite
        table = table_handle(self.wh_uri, self.name)
        head = table.log.head()
        if head is None or head.dropped:
            if not _flag(options, "create", True):
                raise TableNotFound("no such table (and option create=false)", table=self.name)
            schema = normalize_schema(spark_schema_to_arrow(spark_schema))
            self.create = True
            self.properties = {k[len("property."):]: str(v) for k, v in options.items()
                               if k.startswith("property.")}
            version_hint = 0
        else:
            schema = schema_from_json(head.schema)
            check_fits(self.name, schema, spark_schema)
            self.create = False
            self.properties = dict(head.properties)
            version_hint = head.version + 1
        self.schema_json = schema_to_json(schema)
        self.version_hint = version_hint

    def write(self, iterator) -> FilesWritten:
        table = table_handle(self.wh_uri, self.name)
        schema = schema_from_json(self.schema_json)
        writer = DataFileWriter(table.store, schema, table.runtime,
                                WriteOptions.from_properties(self.properties), self.version_hint)
        files = writer.write(conform(b, schema, self.name) for b in iterator if b.num_rows)
        return FilesWritten(list(files), writer.bytes_written, writer.rows_written)

    def commit(self, messages) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        nbytes = sum(m.bytes for m in messages if m is not None)
        from flightsrv.warehouse import Warehouse

        wh = Warehouse.open(self.wh_uri)
        if self.create:
            wh.create_table(self.name, schema_from_json(self.schema_json), self.properties,
                            exist_ok=True)
        table = wh.table(self.name)
        if not self.overwrite:
            if files:
                table.commit_files(files, operation="spark_append",
                                   expected_schema=self.schema_json,
                                   extra={"bytes_added": nbytes})
            elif table.head().schema != self.schema_json:
                raise SchemaMismatch("table schema changed while the data was written",
                                     table=self.name)
            return
        schema_json, name = self.schema_json, self.name

        def replace_all(head):
            head = require_table(head, name)
            if head.schema != schema_json:
                raise SchemaMismatch("table schema changed while the data was written",
                                     table=name, version=head.version)
            added = tuple(dataclasses.replace(f, added_version=head.version + 1) for f in files)
            summary = {"rows_added": sum(f.rows for f in files), "files_added": len(files),
                       "rows_deleted": head.live_rows, "files_removed": len(head.data_files),
                       "bytes_added": nbytes}
            return dataclasses.replace(head, operation="spark_overwrite", summary=summary,
                                       data_files=added)

        table.commit(replace_all)

    def abort(self, messages) -> None:
        """Nothing was committed; written files are orphans that vacuum removes."""
        return

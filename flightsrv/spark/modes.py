"""Spark's save modes and session options for the ``flightsrv`` format.

Spark 4.3 lets a Python data source see only "overwrite or not", and refuses the other save
modes before the source runs: ``df.write.format(...).save(path)`` without a mode (Spark's
default is ``errorifexists``) and ``mode("ignore")`` fail with
``UNSUPPORTED_DATA_SOURCE_SAVE_MODE``. The Python Data Source API has no way to express them
(no "does the table exist" hook, no mode in ``writer()``), so ``flightsrv.spark.register``
installs this small shim on PySpark's classic ``DataFrameWriter`` / ``DataFrameReader``; it
acts only on the ``flightsrv`` format:

- ``save(uri)`` in mode ``errorifexists`` / ``error`` / ``default`` / ``ignore``: the driver
  checks whether the table exists. If it does, ``errorifexists`` raises ``TableExists`` and
  ``ignore`` returns without running the job (as Spark's file sources do). If not, the job
  runs as Spark's ``append`` with the option ``saveMode=<mode>``, and the data source keeps
  the mode's meaning at planning and at commit (a table created by someone else meanwhile:
  ``errorifexists`` fails and deletes the job's files, ``ignore`` deletes them and succeeds).
  With the path given as ``option("path", ...)`` instead, the data source alone decides (at
  planning: ``TableExists``, or for ``ignore`` a job whose tasks write nothing);
- every ``save``/``load`` of the format gets the option ``sessionCaseSensitive`` from the
  session's ``spark.sql.caseSensitive``, which the data source uses to resolve column names
  (an explicit ``option("caseSensitive", ...)`` wins);
- ``load(uri)`` reads the table's latest version on the driver and passes it as the option
  ``pinnedVersion``: every query of the DataFrame reads that version (pinned at load, as in
  Delta), also with a user schema. ``versionAsOf`` / ``timestampAsOf`` take precedence.

Without ``register`` (Spark's automatic discovery of ``pyspark_flightsrv``) and on Spark
Connect, only ``append`` and ``overwrite`` work, as Spark's own error says; names then resolve
case-insensitively unless ``option("caseSensitive", "true")``.
"""

from __future__ import annotations

from flightsrv.errors import ConfigurationError, TableExists

FORMAT_NAMES = ("flightsrv",)
_INSTALLED = "_flightsrv_modes_installed"
_CREATE_MODES = {"errorifexists": "errorifexists", "error": "errorifexists",
                 "default": "errorifexists", "ignore": "ignore"}


def _ours(obj) -> bool:
    return str(getattr(obj, "_flightsrv_format", "")).lower() in FORMAT_NAMES


def _case_option(spark) -> str:
    v = spark.conf.get("spark.sql.caseSensitive", "false")
    return "true" if str(v).strip().lower() == "true" else "false"


def _head_version(path) -> int | None:
    """The table's latest version, read on the driver when ``load(uri)`` is called."""
    if not isinstance(path, str):
        return None
    from flightsrv.errors import FlightsrvError
    from flightsrv.spark.location import split_uri, table_handle

    try:
        wh, name = split_uri(path)
        head = table_handle(wh, name).log.head()
    except FlightsrvError:
        return None  # the data source reports it, with context
    return None if head is None or head.dropped else head.version


def install() -> None:
    """Wrap PySpark's classic writer and reader (once per process; other formats are
    untouched)."""
    from pyspark.sql.readwriter import DataFrameReader, DataFrameWriter

    if getattr(DataFrameWriter, _INSTALLED, False):
        return
    w_format, w_mode, w_save = DataFrameWriter.format, DataFrameWriter.mode, DataFrameWriter.save
    w_partition_by = DataFrameWriter.partitionBy
    r_format, r_load = DataFrameReader.format, DataFrameReader.load

    def no_partition_by(path) -> ConfigurationError:
        # Spark's own check then failed with "do not match the existing table's ... table: "
        # (empty), whether or not the table existed
        return ConfigurationError(
            "partitionBy is not supported by the flightsrv data source: a table's "
            "partitioning is its own (CREATE TABLE ... PARTITIONED BY, ALTER TABLE ... SET "
            "PARTITIONED BY, Table.set_partitioning) and every write is split by it",
            uri=path)

    def writer_partition_by(self, *cols):
        if _ours(self):
            raise no_partition_by(None)
        return w_partition_by(self, *cols)

    def writer_format(self, source):
        self._flightsrv_format = source
        return w_format(self, source)

    def writer_mode(self, saveMode):
        if saveMode is not None:
            self._flightsrv_mode = saveMode
        return w_mode(self, saveMode)

    def writer_save(self, path=None, format=None, mode=None, partitionBy=None, **options):
        if format is not None:
            self.format(format)
        if mode is not None:
            self.mode(mode)
        if not _ours(self):
            return w_save(self, path, partitionBy=partitionBy, **options)
        if partitionBy:
            raise no_partition_by(path)
        self.options(**options)
        self._jwrite = self._jwrite.option("sessionCaseSensitive", _case_option(self._spark))
        m = str(getattr(self, "_flightsrv_mode", None) or "errorifexists").strip().lower()
        create_mode = _CREATE_MODES.get(m)
        if create_mode is not None:
            if path is not None:  # decided here, before anything runs
                from flightsrv.spark.location import split_uri
                from flightsrv.warehouse import Warehouse

                wh, name = split_uri(path)
                if Warehouse.open(wh).exists(name):
                    if create_mode == "ignore":
                        return None
                    raise TableExists(
                        "table already exists (save mode errorifexists, Spark's default: use "
                        "mode 'append' or 'overwrite', or 'ignore' to skip the write)",
                        table=name, uri=path)
            # the data source keeps the mode's meaning at planning and at commit
            self._jwrite = self._jwrite.mode("append").option("saveMode", create_mode)
        return w_save(self, path, partitionBy=partitionBy)

    def reader_format(self, source):
        self._flightsrv_format = source
        return r_format(self, source)

    def reader_load(self, path=None, format=None, schema=None, **options):
        if format is not None:
            self.format(format)
        if _ours(self):
            self.option("sessionCaseSensitive", _case_option(self._spark))
            version = _head_version(path)
            if version is not None:  # pinned at load (time-travel options take precedence)
                self.option("pinnedVersion", str(version))
        return r_load(self, path, schema=schema, **options)

    DataFrameWriter.format, DataFrameWriter.mode = writer_format, writer_mode
    DataFrameWriter.partitionBy = writer_partition_by
    DataFrameWriter.save = writer_save
    DataFrameReader.format, DataFrameReader.load = reader_format, reader_load
    setattr(DataFrameWriter, _INSTALLED, True)

"""Erasure on Spark: delete the rows whose keys appear in a DataFrame, or that match a predicate.

``delete_matching(spark, uri, keys_df, on=[...])`` (the erasure-list workload: millions of user
ids against a big table):

1. the driver pins snapshot S and lists scan tasks (data file, row-group chunk);
2. executors read only the key columns of their row groups, skipping rows already deleted;
3. matching: DuckDB decides equality on both paths, as ``DELETE FROM t WHERE (k) IN (SELECT
   ...)`` would: each key column pair is compared in the type DuckDB unifies the table's column
   type and the key type to (chosen once, on the driver; a pair with no common type, such as
   a string key for an integer column, is refused before any task runs). A value that does
   not fit that type (an out-of-range key) matches nothing; a NULL key never matches.
   - *broadcast* (up to ``broadcast_limit`` distinct keys, default 5M): the driver collects
     the distinct keys as Arrow and ships them inside the task; each task has DuckDB
     semi-join its rows with the keys and emits one roaring bitmap per file. No shuffle, and
     only bitmaps cross into the JVM;
   - *shuffle* (more keys): tasks emit ``(file id, row position, bucket, keys...)`` where the
     bucket is DuckDB's hash of the keys in the comparison types, the keys get the same
     bucket, Spark co-groups both sides by bucket, and DuckDB semi-joins each bucket
     (Spark's own join equality is never used);
4. the driver turns them into a delete plan ``{path: FileDelete(positions)}`` and commits it
   once through the commit loop (``flightsrv.table.delete_plan.commit_plan``: bitmaps merge
   with concurrent deletes; a file rewritten since S makes the whole job re-plan on a new
   snapshot).

``delete_where(spark, uri, predicate)``: ``DELETE FROM t WHERE <predicate>`` through the one
SQL engine (:meth:`flightsrv.Table.delete`), so it matches exactly the rows the same WHERE
matches over Flight SQL.

``mode="splice"`` erases instead: the executors match the *stored* rows (rows a DV already
hides but whose bytes remain match too), and ``flightsrv.table.erase.splice_positions``
removes exactly those rows from the data files in one commit (no DV commit first), then
completes and verifies the erasure (``expire=True`` expires the versions that still reach the
rows) and stores an erasure certificate under ``_erasures/`` (operation ``delete_matching``
or ``splice_delete``, source ``spark``).

The request is recorded only as its keyed fingerprint (``request_fingerprint`` in the commit
summary and the certificate; ``flightsrv.table.fingerprint``): for a key list, an
order-independent HMAC over the distinct key rows, folded per partition on the executors;
for a predicate, the HMAC of its canonical text. Neither keys nor predicate text are stored.

Both return the number of rows this call turned from live to deleted; in splice mode the
value is an ``ErasedCount`` whose ``.result`` is the erasure's ``PurgeResult`` (its
``.certificate`` names the stored certificate).
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64
from pyspark.sql import types as T

from flightsrv.errors import CommitConflict, ConfigurationError, SchemaMismatch
from flightsrv.spark.location import split_uri, table_handle
from flightsrv.spark.types import arrow_to_spark, spark_arrow_schema, spark_to_arrow
from flightsrv.table import fingerprint as fpr
from flightsrv.table.delete_plan import FileDelete, commit_plan
from flightsrv.table.erase import MAX_REPLANS  # one re-plan budget for every erasure path
from flightsrv.table.scan import FileTask, Snapshot
from flightsrv.table.schema import schema_from_json, schema_to_json

BROADCAST_LIMIT = 5_000_000
ROW_GROUPS_PER_TASK = 4
FID, POS, TASK, BITMAP, BUCKET = "_fid", "_pos", "_task", "_bitmap", "_bucket"
ROWS_PER_BUCKET = 2_000_000
TASKS_SCHEMA = T.StructType([T.StructField(FID, T.IntegerType(), False),
                             T.StructField(TASK, T.BinaryType(), False)])
BITMAPS_SCHEMA = T.StructType([T.StructField(FID, T.IntegerType(), True),
                               T.StructField(BITMAP, T.BinaryType(), True)])


def _open(uri: str):
    wh, name = split_uri(uri)
    t = table_handle(wh, name)
    t.head()  # TableNotFound early, on the driver
    return wh, name, t


def _physical(table, snap: Snapshot) -> Snapshot:
    """``snap`` with deletions ignored: every stored row is a candidate (splice mode)."""
    import dataclasses

    return Snapshot(table, dataclasses.replace(snap.manifest, data_files=tuple(
        dataclasses.replace(f, dv=None, deleted_row_groups=()) for f in snap.manifest.data_files)))


def _tasks_df(spark, snap: Snapshot):
    """(file id, pickled (DataFile, row groups)) per chunk of row groups, and the paths."""
    paths, rows = [], []
    for task in snap.plan(with_deletes=False):
        fid = len(paths)
        paths.append(task.file.path)
        for i in range(0, len(task.row_groups), ROW_GROUPS_PER_TASK):
            chunk = task.row_groups[i:i + ROW_GROUPS_PER_TASK]
            rows.append((fid, pickle.dumps((task.file, chunk))))
    if not rows:
        return None, paths
    n = max(1, min(len(rows), spark.sparkContext.defaultParallelism * 2))
    return spark.createDataFrame(rows, TASKS_SCHEMA).repartition(n), paths


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def task_connection():
    """The DuckDB connection a task matches with: one thread, UTC (a comparison between a
    timestamp with and one without time zone must not depend on the executor's zone), then
    locked down like the engine's."""
    import duckdb

    from flightsrv.engine.connection import LOCKDOWN

    con = duckdb.connect(":memory:")
    con.execute("SET threads=1")
    con.execute("SET TimeZone='UTC'")
    for stmt in LOCKDOWN:
        con.execute(stmt)
    return con


def comparison_types(table_schema: pa.Schema, on: list[str], key_types: list[pa.DataType],
                     table: str) -> list[str]:
    """Per key column, the DuckDB type a table value and a key are compared in: the type
    DuckDB unifies the two to (``[t.c, k.c]``), as its ``=`` does. A pair DuckDB cannot unify
    (a string key for a number or date column, where DuckDB would parse each string) is
    refused here, before any task runs."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        out = []
        for c, kt in zip(on, key_types):
            tt = table_schema.field(c).type
            con.register("__t", pa.table({"c": pa.array([], tt)}))
            con.register("__k", pa.table({"c": pa.array([], kt)}))
            try:
                out.append(con.execute(
                    "SELECT typeof([__t.c, __k.c][1]) FROM (SELECT 1) "
                    "LEFT JOIN __t ON TRUE LEFT JOIN __k ON TRUE").fetchall()[0][0])
            except duckdb.Error:
                raise SchemaMismatch(
                    "key column type cannot be compared with the table's column type "
                    "(DuckDB has no common type for them; cast the keys explicitly)",
                    table=table, column=c, table_type=str(tt), key_type=str(kt)) from None
        return out
    finally:
        con.close()


def _cast_keys(side: str, on: list[str], ctypes: list[str]) -> list[str]:
    return [f"TRY_CAST({side}.{_ident(c)} AS {x})" for c, x in zip(on, ctypes)]


def _load_keys(con, keys: pa.Table, on: list[str], ctypes: list[str]) -> None:
    """``__keys``: the distinct keys cast to the comparison types; keys that do not fit them
    (TRY_CAST gives NULL) and NULL keys are dropped: they match nothing."""
    con.register("__keys_src", keys)
    cast = _cast_keys("k", on, ctypes)
    cols = ", ".join(f"{e} AS {_ident(c)}" for e, c in zip(cast, on))
    notnull = " AND ".join(f"{e} IS NOT NULL" for e in cast)
    con.execute(f"CREATE OR REPLACE TEMP TABLE __keys AS SELECT DISTINCT {cols} "
                f"FROM __keys_src k WHERE {notnull}")
    con.unregister("__keys_src")


def _match(con, t: pa.Table, on: list[str], ctypes: list[str]) -> pa.Table:
    """The rows of ``t`` (key columns + ``__pos``) whose keys equal a row of ``__keys``
    (:func:`_load_keys`), as DuckDB's semi join decides in the comparison types."""
    cast = _cast_keys("t", on, ctypes)
    cond = " AND ".join(f"{e} = k.{_ident(c)}" for e, c in zip(cast, on))
    con.register("__rows", t)
    try:
        return con.sql(f"SELECT t.* FROM __rows t SEMI JOIN __keys k ON {cond}").to_arrow_table()
    finally:
        con.unregister("__rows")


def _bucketed(con, t: pa.Table, on: list[str], ctypes: list[str], buckets: int) -> pa.Table:
    """``t`` plus the bucket of its keys: DuckDB's hash of the keys in the comparison types
    (equal keys, -0.0/0.0 and NaNs included, hash alike); rows with a NULL or unfittable key
    are dropped (they match nothing)."""
    cast = _cast_keys("t", on, ctypes)
    notnull = " AND ".join(f"{e} IS NOT NULL" for e in cast)
    con.register("__rows", t)
    try:
        return con.sql(f"SELECT t.*, CAST(hash({', '.join(cast)}) % {int(buckets)} AS INTEGER) "
                       f"AS {BUCKET} FROM __rows t WHERE {notnull}").to_arrow_table()
    finally:
        con.unregister("__rows")


def _all_valid(t: pa.Table, on: list[str]):
    mask = pc.is_valid(t.column(on[0]))
    for c in on[1:]:
        mask = pc.and_(mask, pc.is_valid(t.column(c)))
    return mask


def _scanner(wh_uri: str, name: str, version: int, columns: list[str], ctypes: list[str],
             out_json: str, as_bitmaps: bool, keys: pa.Table | None = None,
             physical: bool = False, buckets: int = 0):
    """mapInArrow function: per task row, the positions of live rows (with ``physical``, of
    every stored row, deleted ones included); with ``keys``, only of rows DuckDB matches
    with ``keys`` (as bitmaps); else (shuffle path) ``(fid, pos, keys..., bucket)`` rows."""

    def scan(batches):
        out_schema = spark_arrow_schema(T.StructType.fromJson(json.loads(out_json)))
        table = table_handle(wh_uri, name)
        snap = Snapshot(table, table.log.load(version))
        con = task_connection()
        if keys is not None:
            _load_keys(con, keys, columns, ctypes)
        for b in batches:
            for fid, blob in zip(b.column(FID).to_pylist(), b.column(TASK).to_pylist()):
                f, rgs = pickle.loads(blob)
                task = FileTask(f, rgs, None if physical else snap.deleted_positions(f))
                bm = BitMap64() if as_bitmaps else None
                for _, t in snap.iter_tables(columns, tasks=[task], positions="__pos"):
                    if t.num_rows and keys is not None:
                        t = _match(con, t, columns, ctypes)
                    elif t.num_rows:
                        t = _bucketed(con, t, columns, ctypes, buckets)
                    if t.num_rows == 0:
                        continue
                    pos = t.column("__pos")
                    if as_bitmaps:
                        bm.update(pos.to_numpy().astype(np.uint64))
                        continue
                    cols = [pa.array(np.full(t.num_rows, fid, dtype=np.int32)), pos]
                    cols += [t.column(c) for c in columns] + [t.column(BUCKET)]
                    out = pa.Table.from_arrays(cols, names=out_schema.names)
                    yield from out.cast(out_schema, safe=False).to_batches()
                if as_bitmaps and len(bm):
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([fid], pa.int32()), pa.array([bm.serialize()], pa.binary())],
                        schema=spark_arrow_schema(BITMAPS_SCHEMA))

    return scan


def _bucket_keys(on: list[str], ctypes: list[str], buckets: int, out_json: str):
    """mapInArrow function: the distinct keys with their bucket (as :func:`_bucketed`)."""

    def run(batches):
        out_schema = spark_arrow_schema(T.StructType.fromJson(json.loads(out_json)))
        con = task_connection()
        for b in batches:
            if b.num_rows:
                t = _bucketed(con, pa.Table.from_batches([b]), on, ctypes, buckets)
                if t.num_rows:
                    yield from t.select(out_schema.names).cast(out_schema).to_batches()

    return run


def _join_buckets(on: list[str], ctypes: list[str], table_types_json: str):
    """cogroup function: one bucket's table rows ``(fid, pos, keys...)`` and keys; DuckDB
    semi-joins them in the comparison types; returns one bitmap per file id."""

    def join(rows: pa.Table, keys: pa.Table) -> pa.Table:
        empty = pa.table({FID: pa.array([], pa.int32()), BITMAP: pa.array([], pa.binary())})
        if rows.num_rows == 0 or keys.num_rows == 0:
            return empty
        types = schema_from_json(json.loads(table_types_json))
        # key values travelled in Spark types: back to the table's exact types
        rows = pa.table([rows.column(FID), rows.column(POS).cast(pa.int64())]
                        + [rows.column(c).cast(types.field(c).type, safe=False) for c in on],
                        names=[FID, "__pos"] + on)
        con = task_connection()
        try:
            _load_keys(con, keys.select(on), on, ctypes)
            hit = _match(con, rows, on, ctypes)
        finally:
            con.close()
        if hit.num_rows == 0:
            return empty
        acc: dict[int, BitMap64] = {}
        for fid, pos in zip(hit.column(FID).to_numpy(), hit.column("__pos").to_numpy()):
            acc.setdefault(int(fid), BitMap64()).add(int(pos))
        return pa.table({FID: pa.array(list(acc), pa.int32()),
                         BITMAP: pa.array([bm.serialize() for bm in acc.values()], pa.binary())})

    return join


def _transport_type(t: pa.DataType, column: str) -> T.DataType:
    """The Spark type a table key column travels in on the shuffle path: its read type, or
    epoch units as a long where Spark's type would round (nanosecond timestamps)."""
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return T.LongType()
    return arrow_to_spark(t, column=column)


def _collect_plan(bitmaps_df, paths: list[str]) -> dict[str, FileDelete]:
    plan: dict[str, FileDelete] = {}
    for row in bitmaps_df.collect():
        d = plan.setdefault(paths[row[FID]], FileDelete())
        d.positions |= BitMap64.deserialize(bytes(row[BITMAP]))
    return {p: d for p, d in plan.items() if d.positions}


def _run(spark, uri: str, build_plan, what: dict, mode: str, request_fingerprint, *,
         operation: str, expire: bool = False, grace=None,
         certificate: bool | None = None) -> int:
    """Plan (``build_plan(wh, name, snapshot, physical)``), then commit a DV delete or, in
    splice mode, erase the planned rows physically; re-plan while targets are rewritten."""
    if mode not in ("dv", "splice"):
        raise ConfigurationError("unknown delete mode (use 'dv' or 'splice')", mode=mode)
    wh, name, table = _open(uri)
    if mode == "splice":
        try:
            from flightsrv.table import erase
        except ImportError:
            raise ConfigurationError("splice erasure is not available in this build",
                                     table=name) from None
    for _ in range(MAX_REPLANS):
        snap = table.snapshot()
        plan = build_plan(wh, name, snap, mode == "splice")
        fp = request_fingerprint(table)
        if mode == "splice":
            try:
                result = erase.splice_positions(
                    table, snap, {p: d.positions for p, d in plan.items()}, fingerprint=fp,
                    operation=operation, expire=expire, grace=grace,
                    certificate=certificate, source="spark", strict=True)
            except erase.StalePlan:
                continue  # a targeted file was rewritten concurrently: re-plan
            return erase.ErasedCount(result.rows_deleted, result)
        n = commit_plan(table, plan, read_version=snap.version,
                        summary={**what, "request_fingerprint": fp})
        if n is None:
            continue  # a targeted file was rewritten concurrently: re-plan on a new snapshot
        return n
    raise CommitConflict("erasure re-planned too often: its files keep being rewritten",
                         table=name, attempts=MAX_REPLANS)


def _broadcast_keys(keys_df, on: list[str], limit: int) -> pa.Table | None:
    """The distinct keys with no NULL part, as Arrow in their own types (DuckDB compares them
    with the table's in the comparison types), or None if more than ``limit`` (then the
    shuffle path)."""
    got = keys_df.limit(limit + 1).toArrow()
    if got.num_rows > limit:
        return None
    keys = got.select(on)
    return keys.filter(_all_valid(keys, on)).combine_chunks()


def resolve_key_columns(on: list[str], key_names: list[str], table_names: list[str], *,
                        case_sensitive: bool, uri: str) -> list[tuple[str, str]]:
    """(keys DataFrame column, table column) per ``on`` name; names match ignoring case
    unless ``case_sensitive`` (Spark's ``spark.sql.caseSensitive``)."""

    def find(name: str, names: list[str]) -> list[str]:
        if case_sensitive:
            return [n for n in names if n == name]
        exact = [n for n in names if n == name]
        return exact or [n for n in names if n.lower() == name.lower()]

    pairs, missing_keys, missing_table, ambiguous = [], [], [], []
    for name in on:
        k, t = find(name, key_names), find(name, table_names)
        if not k:
            missing_keys.append(name)
        if not t:
            missing_table.append(name)
        if len(k) > 1 or len(t) > 1:
            ambiguous.append(name)
        if len(k) == 1 and len(t) == 1:
            pairs.append((k[0], t[0]))
    if missing_keys:
        raise ConfigurationError("keys DataFrame lacks key columns", uri=uri,
                                 columns=",".join(missing_keys))
    if missing_table:
        raise ConfigurationError("key columns are not in the table", uri=uri,
                                 columns=",".join(missing_table))
    if ambiguous:
        raise ConfigurationError("key column names are ambiguous ignoring case", uri=uri,
                                 columns=",".join(ambiguous))
    if len({t for _, t in pairs}) != len(pairs):
        raise ConfigurationError("a key column is named twice", uri=uri, on=",".join(on))
    return pairs


def _keys_partials(secret: bytes, on: list[str]):
    """mapInArrow function: (count, HMAC sum) of the distinct key rows of each partition."""

    def fold(batches):
        acc = fpr.KeySetFingerprint(fpr.ErasureKey(secret, "spark"), on)
        for b in batches:
            if b.num_rows:
                t = pa.Table.from_batches([b])
                acc.update(t.filter(_all_valid(t, on)))  # as the broadcast path: no NULLs
        count, total = acc.partial()
        yield pa.RecordBatch.from_arrays([pa.array([count], pa.int64()),
                                          pa.array([total], pa.string())], names=["n", "h"])

    return fold


def delete_matching(spark, uri: str, keys_df, on, *, mode: str = "dv",
                    broadcast_limit: int = BROADCAST_LIMIT, expire: bool = False,
                    grace=None, certificate: bool | None = None) -> int:
    """Delete every live row of the table at ``uri`` whose ``on`` columns equal a row of
    ``keys_df``; one commit. Returns the rows deleted. DuckDB decides equality (see the
    module docstring). Up to ``broadcast_limit`` distinct keys are shipped to the tasks (no
    shuffle); more are co-grouped with the rows by bucket. ``on`` names resolve ignoring
    case unless ``spark.sql.caseSensitive``. ``mode="splice"`` erases the matching stored
    rows physically (``expire``, ``grace``, ``certificate``: as for
    ``flightsrv.table.erase.splice_positions``)."""
    on = [on] if isinstance(on, str) else list(on)
    if not on:
        raise ConfigurationError("delete_matching needs at least one key column", uri=uri)
    from pyspark.sql import functions as SF

    table0 = _open(uri)[2]
    exact = str(spark.conf.get("spark.sql.caseSensitive", "false")).strip().lower() == "true"
    pairs = resolve_key_columns(on, list(keys_df.columns), table0.schema.names,
                                case_sensitive=exact, uri=uri)
    on = [t for _, t in pairs]  # the table's spelling from here on
    keys = keys_df.select(*[SF.col("`" + k.replace("`", "``") + "`").alias(t)
                            for k, t in pairs]).dropDuplicates()
    key_types = [spark_to_arrow(keys.schema[c].dataType, column=c) for c in on]
    shipped: dict = {}

    def request_fingerprint(table):
        if "fp" not in shipped:
            key = table.erasure_key
            small = shipped.get("keys")
            acc = fpr.KeySetFingerprint(key, on)
            if small is not None:
                acc.update(small)
            else:  # too many keys to collect: fold them on the executors
                out = T.StructType([T.StructField("n", T.LongType(), False),
                                    T.StructField("h", T.StringType(), False)])
                for row in keys.mapInArrow(_keys_partials(key.secret, on), out).collect():
                    acc.merge(row["n"], row["h"])
            shipped["fp"] = acc.result()
        return shipped["fp"]

    def build_plan(wh, name, snap, physical):
        unknown = [c for c in on if c not in snap.schema.names]
        if unknown:
            raise ConfigurationError("key columns are not in the table", table=name,
                                     columns=",".join(unknown))
        ctypes = comparison_types(snap.schema, on, key_types, name)  # before any task
        if "keys" not in shipped:
            shipped["keys"] = _broadcast_keys(keys, on, broadcast_limit)
        if physical:
            snap = _physical(snap.table, snap)
        tasks, paths = _tasks_df(spark, snap)
        if tasks is None:
            return {}
        small = shipped["keys"]
        if small is not None:
            if small.num_rows == 0:
                return {}
            bitmaps = tasks.mapInArrow(
                _scanner(wh, name, snap.version, on, ctypes, BITMAPS_SCHEMA.json(),
                         as_bitmaps=True, keys=small, physical=physical), BITMAPS_SCHEMA)
            return _collect_plan(bitmaps, paths)
        parts = int(spark.conf.get("spark.sql.shuffle.partitions", "200"))
        buckets = max(parts, -(-snap.manifest.live_rows // ROWS_PER_BUCKET))
        key_fields = [T.StructField(c, _transport_type(snap.schema.field(c).type, c), True)
                      for c in on]
        out = T.StructType([T.StructField(FID, T.IntegerType(), True),
                            T.StructField(POS, T.LongType(), True)] + key_fields
                           + [T.StructField(BUCKET, T.IntegerType(), True)])
        rows = tasks.mapInArrow(
            _scanner(wh, name, snap.version, on, ctypes, out.json(), as_bitmaps=False,
                     physical=physical, buckets=buckets), out)
        keyed_schema = T.StructType(list(keys.schema.fields)
                                    + [T.StructField(BUCKET, T.IntegerType(), True)])
        keyed = keys.mapInArrow(_bucket_keys(on, ctypes, buckets, keyed_schema.json()),
                                keyed_schema)
        types_json = json.dumps(schema_to_json(pa.schema([snap.schema.field(c) for c in on])))
        bitmaps = rows.groupBy(BUCKET).cogroup(keyed.groupBy(BUCKET)).applyInArrow(
            _join_buckets(on, ctypes, types_json), BITMAPS_SCHEMA)
        return _collect_plan(bitmaps, paths)

    return _run(spark, uri, build_plan, {"erasure": "join", "on": ",".join(on)}, mode,
                request_fingerprint, operation="delete_matching", expire=expire, grace=grace,
                certificate=certificate)


def delete_where(spark, uri: str, predicate: str, *, mode: str = "dv", expire: bool = False,
                 grace=None, certificate: bool | None = None) -> int:
    """``DELETE FROM t WHERE <predicate>`` through the one SQL engine (DuckDB decides which
    rows match, exactly as over Flight SQL); one commit. Returns the rows deleted.
    ``mode="splice"``: as for ``delete_matching``. ``spark`` is unused (both erasure entry
    points take the same arguments)."""
    if mode not in ("dv", "splice"):
        raise ConfigurationError("unknown delete mode (use 'dv' or 'splice')", mode=mode)
    table = _open(uri)[2]
    return table.delete(predicate, mode=mode, expire=expire, grace=grace,
                        certificate=certificate, source="spark")

"""Erasure on Spark: delete the rows whose keys appear in a DataFrame, or that match a predicate.

``delete_matching(spark, uri, keys_df, on=[...])`` (the erasure-list workload: millions of user
ids against a big table):

1. the driver pins snapshot S and lists scan tasks (data file, row-group chunk);
2. executors read only the key columns of their row groups, skipping rows already deleted;
3. matching (a NULL key never matches):
   - *broadcast* (up to ``broadcast_limit`` distinct keys, default 5M): the driver collects
     the distinct keys as Arrow, cast to the table's key types, and ships them inside the
     task; each task has DuckDB semi-join its rows with the keys (DuckDB decides equality)
     and emits one roaring bitmap per file. No shuffle, and only bitmaps cross into the JVM;
   - *shuffle* (more keys): tasks emit ``(file id, row position, keys...)``, Spark left-semi
     joins that with the keys, and executors fold the matches into one bitmap per file;
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

from flightsrv.errors import CommitConflict, ConfigurationError
from flightsrv.spark.location import split_uri, table_handle
from flightsrv.spark.types import arrow_to_spark, spark_arrow_schema
from flightsrv.table import fingerprint as fpr
from flightsrv.table.delete_plan import FileDelete, commit_plan
from flightsrv.table.scan import FileTask, Snapshot

MAX_REPLANS = 5
BROADCAST_LIMIT = 5_000_000
ROW_GROUPS_PER_TASK = 4
FID, POS, TASK, BITMAP = "_fid", "_pos", "_task", "_bitmap"
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
            rows.append((fid, pickle.dumps((task.file, task.row_groups[i:i + ROW_GROUPS_PER_TASK]))))
    if not rows:
        return None, paths
    n = max(1, min(len(rows), spark.sparkContext.defaultParallelism * 2))
    return spark.createDataFrame(rows, TASKS_SCHEMA).repartition(n), paths


def _match(con, t: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of ``t`` (key columns + ``__pos``) whose keys equal a row of ``keys``, as
    DuckDB's semi join decides (a NULL key never matches)."""
    on = keys.column_names
    cond = " AND ".join(f't."{c}" = k."{c}"' for c in (n.replace('"', '""') for n in on))
    con.register("__rows", t)
    con.register("__keys", keys)
    try:
        return con.sql(f"SELECT t.* FROM __rows t SEMI JOIN __keys k ON {cond}").to_arrow_table()
    finally:
        con.unregister("__rows")
        con.unregister("__keys")


def _all_valid(t: pa.Table, on: list[str]):
    mask = pc.is_valid(t.column(on[0]))
    for c in on[1:]:
        mask = pc.and_(mask, pc.is_valid(t.column(c)))
    return mask


def _scanner(wh_uri: str, name: str, version: int, columns: list[str],
             out_json: str, as_bitmaps: bool, keys: pa.Table | None = None,
             physical: bool = False):
    """mapInArrow function: per task row, the positions of live (and matching) rows; with
    ``keys``, only rows whose key columns are in ``keys``; with ``physical``, of every stored
    row (deleted ones included)."""

    def scan(batches):
        from flightsrv.engine.connection import open_locked

        out_schema = spark_arrow_schema(T.StructType.fromJson(json.loads(out_json)))
        table = table_handle(wh_uri, name)
        snap = Snapshot(table, table.log.load(version))
        con = open_locked(threads=1) if keys is not None else None
        for b in batches:
            for fid, blob in zip(b.column(FID).to_pylist(), b.column(TASK).to_pylist()):
                f, rgs = pickle.loads(blob)
                task = FileTask(f, rgs, None if physical else snap.deleted_positions(f))
                bm = BitMap64() if as_bitmaps else None
                for _, t in snap.iter_tables(columns, tasks=[task], positions="__pos"):
                    if keys is not None and t.num_rows:
                        t = _match(con, t, keys)
                    if t.num_rows == 0:
                        continue
                    pos = t.column("__pos")
                    if as_bitmaps:
                        bm.update(pos.to_numpy().astype(np.uint64))
                        continue
                    cols = [pa.array(np.full(t.num_rows, fid, dtype=np.int32)), pos]
                    cols += [t.column(c) for c in columns]
                    out = pa.Table.from_arrays(cols, names=out_schema.names)
                    yield from out.cast(out_schema, safe=False).to_batches()
                if as_bitmaps and len(bm):
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([fid], pa.int32()), pa.array([bm.serialize()], pa.binary())],
                        schema=spark_arrow_schema(BITMAPS_SCHEMA))

    return scan


def _fold_bitmaps(batches):
    """mapInArrow function: (file id, position) rows → one serialized bitmap per file id."""
    acc: dict[int, BitMap64] = {}
    for b in batches:
        if b.num_rows == 0:
            continue
        fids = b.column(FID).to_numpy(zero_copy_only=False)
        pos = b.column(POS).to_numpy(zero_copy_only=False).astype(np.uint64)
        order = np.argsort(fids, kind="stable")
        fids, pos = fids[order], pos[order]
        bounds = np.flatnonzero(np.diff(fids)) + 1
        for chunk_f, chunk_p in zip(np.split(fids, bounds), np.split(pos, bounds)):
            acc.setdefault(int(chunk_f[0]), BitMap64()).update(chunk_p)
    if acc:
        yield pa.RecordBatch.from_arrays(
            [pa.array(list(acc), pa.int32()),
             pa.array([bm.serialize() for bm in acc.values()], pa.binary())],
            schema=spark_arrow_schema(BITMAPS_SCHEMA))


def _collect_plan(bitmaps_df, paths: list[str]) -> dict[str, FileDelete]:
    plan: dict[str, FileDelete] = {}
    for row in bitmaps_df.collect():
        d = plan.setdefault(paths[row[FID]], FileDelete())
        d.positions |= BitMap64.deserialize(bytes(row[BITMAP]))
    return {p: d for p, d in plan.items() if d.positions}


def _run(spark, uri: str, build_plan, what: dict, mode: str, request_fingerprint, *,
         operation: str, expire: bool = False, certificate: bool | None = None) -> int:
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
                    operation=operation, expire=expire, certificate=certificate,
                    source="spark")
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


def _broadcast_keys(keys_df, on: list[str], schema: pa.Schema, limit: int,
                    table: str) -> pa.Table | None:
    """The distinct non-null keys as Arrow in the table's key types, or None if more than
    ``limit`` (then Spark joins)."""
    got = keys_df.limit(limit + 1).toArrow()
    if got.num_rows > limit:
        return None
    cols = []
    for c in on:
        want = schema.field(c).type
        col = got.column(c)
        try:
            cols.append(col.cast(want) if col.type != want else col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigurationError("key values do not fit the table's key column",
                                     table=table, column=c, expected=str(want),
                                     found=str(col.type), error=str(exc)) from None
    keys = pa.table(cols, names=on)
    return keys.filter(_all_valid(keys, on)).combine_chunks()


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
                    certificate: bool | None = None) -> int:
    """Delete every live row of the table at ``uri`` whose ``on`` columns equal a row of
    ``keys_df``; one commit. Returns the rows deleted. Up to ``broadcast_limit`` distinct
    keys are shipped to the tasks (no shuffle); more are joined by Spark. ``mode="splice"``
    erases the matching stored rows physically (``expire``, ``certificate``: as for
    ``flightsrv.table.erase.splice_positions``)."""
    on = [on] if isinstance(on, str) else list(on)
    if not on:
        raise ConfigurationError("delete_matching needs at least one key column", uri=uri)
    missing_keys = [c for c in on if c not in keys_df.columns]
    if missing_keys:
        raise ConfigurationError("keys DataFrame lacks key columns", uri=uri,
                                 columns=",".join(missing_keys))
    keys = keys_df.select(*on).dropDuplicates()
    shipped: dict = {}

    def request_fingerprint(table):
        if "fp" not in shipped:
            key = fpr.key_for(table.warehouse)
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
        if "keys" not in shipped:
            shipped["keys"] = _broadcast_keys(keys, on, snap.schema, broadcast_limit, name)
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
                _scanner(wh, name, snap.version, on, BITMAPS_SCHEMA.json(),
                         as_bitmaps=True, keys=small, physical=physical), BITMAPS_SCHEMA)
            return _collect_plan(bitmaps, paths)
        out = T.StructType([T.StructField(FID, T.IntegerType(), True),
                            T.StructField(POS, T.LongType(), True)]
                           + [T.StructField(c, arrow_to_spark(snap.schema.field(c).type,
                                                              column=c), True) for c in on])
        positions = tasks.mapInArrow(
            _scanner(wh, name, snap.version, on, out.json(), as_bitmaps=False,
                     physical=physical), out)
        matched = positions.join(keys, on=on, how="left_semi").select(FID, POS)
        parts = max(1, min(len(paths), spark.sparkContext.defaultParallelism * 2))
        bitmaps = matched.repartition(parts, FID).mapInArrow(_fold_bitmaps, BITMAPS_SCHEMA)
        return _collect_plan(bitmaps, paths)

    return _run(spark, uri, build_plan, {"erasure": "join", "on": ",".join(on)}, mode,
                request_fingerprint, operation="delete_matching", expire=expire,
                certificate=certificate)


def delete_where(spark, uri: str, predicate: str, *, mode: str = "dv", expire: bool = False,
                 certificate: bool | None = None) -> int:
    """``DELETE FROM t WHERE <predicate>`` through the one SQL engine (DuckDB decides which
    rows match, exactly as over Flight SQL); one commit. Returns the rows deleted.
    ``mode="splice"``: as for ``delete_matching``. ``spark`` is unused (both erasure entry
    points take the same arguments)."""
    if mode not in ("dv", "splice"):
        raise ConfigurationError("unknown delete mode (use 'dv' or 'splice')", mode=mode)
    wh, name, table = _open(uri)
    return table.delete(predicate, mode=mode, expire=expire, certificate=certificate,
                        source="spark")

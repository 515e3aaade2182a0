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

``mode="splice"`` then physically removes the deleted rows (``Table.purge``, one more commit)
when the build has ``flightsrv.table.erase``; otherwise it raises ``ConfigurationError``.

Both return the number of rows this call turned from live to deleted.
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
             out_json: str, as_bitmaps: bool, keys: pa.Table | None = None):
    """mapInArrow function: per task row, the positions of live (and matching) rows; with
    ``keys``, only rows whose key columns are in ``keys``."""

    def scan(batches):
        from flightsrv.engine.connection import open_locked

        out_schema = spark_arrow_schema(T.StructType.fromJson(json.loads(out_json)))
        table = table_handle(wh_uri, name)
        snap = Snapshot(table, table.log.load(version))
        con = open_locked(threads=1) if keys is not None else None
        for b in batches:
            for fid, blob in zip(b.column(FID).to_pylist(), b.column(TASK).to_pylist()):
                f, rgs = pickle.loads(blob)
                task = FileTask(f, rgs, snap.deleted_positions(f))
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


def _run(spark, uri: str, build_plan, what: dict, mode: str) -> int:
    if mode not in ("dv", "splice"):
        raise ConfigurationError("unknown delete mode (use 'dv' or 'splice')", mode=mode)
    wh, name, table = _open(uri)
    if mode == "splice":
        try:
            from flightsrv.table import erase  # noqa: F401
        except ImportError:
            raise ConfigurationError("splice erasure is not available in this build",
                                     table=name) from None
    for _ in range(MAX_REPLANS):
        snap = table.snapshot()
        plan = build_plan(wh, name, snap)
        n = commit_plan(table, plan, read_version=snap.version, summary=what)
        if n is None:
            continue  # a targeted file was rewritten concurrently: re-plan on a new snapshot
        if mode == "splice" and n:
            table.purge()
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


def delete_matching(spark, uri: str, keys_df, on, *, mode: str = "dv",
                    broadcast_limit: int = BROADCAST_LIMIT) -> int:
    """Delete every live row of the table at ``uri`` whose ``on`` columns equal a row of
    ``keys_df``; one commit. Returns the rows deleted. Up to ``broadcast_limit`` distinct
    keys are shipped to the tasks (no shuffle); more are joined by Spark."""
    on = [on] if isinstance(on, str) else list(on)
    if not on:
        raise ConfigurationError("delete_matching needs at least one key column", uri=uri)
    missing_keys = [c for c in on if c not in keys_df.columns]
    if missing_keys:
        raise ConfigurationError("keys DataFrame lacks key columns", uri=uri,
                                 columns=",".join(missing_keys))
    keys = keys_df.select(*on).dropDuplicates()
    shipped: dict = {}

    def build_plan(wh, name, snap):
        unknown = [c for c in on if c not in snap.schema.names]
        if unknown:
            raise ConfigurationError("key columns are not in the table", table=name,
                                     columns=",".join(unknown))
        tasks, paths = _tasks_df(spark, snap)
        if tasks is None:
            return {}
        if "keys" not in shipped:
            shipped["keys"] = _broadcast_keys(keys, on, snap.schema, broadcast_limit, name)
        small = shipped["keys"]
        if small is not None:
            if small.num_rows == 0:
                return {}
            bitmaps = tasks.mapInArrow(
                _scanner(wh, name, snap.version, on, BITMAPS_SCHEMA.json(),
                         as_bitmaps=True, keys=small), BITMAPS_SCHEMA)
            return _collect_plan(bitmaps, paths)
        out = T.StructType([T.StructField(FID, T.IntegerType(), True),
                            T.StructField(POS, T.LongType(), True)]
                           + [T.StructField(c, arrow_to_spark(snap.schema.field(c).type,
                                                              column=c), True) for c in on])
        positions = tasks.mapInArrow(
            _scanner(wh, name, snap.version, on, out.json(), as_bitmaps=False), out)
        matched = positions.join(keys, on=on, how="left_semi").select(FID, POS)
        parts = max(1, min(len(paths), spark.sparkContext.defaultParallelism * 2))
        bitmaps = matched.repartition(parts, FID).mapInArrow(_fold_bitmaps, BITMAPS_SCHEMA)
        return _collect_plan(bitmaps, paths)

    return _run(spark, uri, build_plan, {"erasure": "join", "on": ",".join(on)}, mode)


def delete_where(spark, uri: str, predicate: str, *, mode: str = "dv") -> int:
    """``DELETE FROM t WHERE <predicate>`` through the one SQL engine (DuckDB decides which
    rows match, exactly as over Flight SQL); one commit. Returns the rows deleted. ``spark``
    is unused (kept so that both erasure entry points take the same arguments)."""
    if mode not in ("dv", "splice"):
        raise ConfigurationError("unknown delete mode (use 'dv' or 'splice')", mode=mode)
    wh, name, table = _open(uri)
    return int(table.delete(predicate, mode=mode))

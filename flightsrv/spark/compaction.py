"""Compaction on Spark, for tables too big for one process. Same rules as ``Table.compact``
(``flightsrv.table.maintenance``), whose planning, group writer and carry-over it reuses:

1. the driver pins snapshot S and plans groups (delete-heavy files rewritten without their
   deleted rows; small files bin-packed up to the target file size);
2. each group is one Spark task: an executor reads the group's live rows (DVs applied) and
   writes new data files with the table's ``DataFileWriter``; outputs come back to the driver;
3. the driver commits ONCE through the commit loop. The mutator re-validates every group
   against the head it is given: a delete committed after S on an input file is *carried
   over* to the outputs as a DV at the shifted positions (never a lost delete); a group whose
   input vanished (rewritten or wholly deleted concurrently) is dropped from the commit, its
   outputs left as orphans for vacuum. Concurrent appends are kept.

Sorting and DV coalescing stay with ``Table.compact`` (single process).
"""

from __future__ import annotations

import pickle

import pyarrow as pa
from pyspark.sql import types as T

from flightsrv.errors import ConfigurationError
from flightsrv.spark.location import split_uri, table_handle
from flightsrv.spark.types import spark_arrow_schema
from flightsrv.table.maintenance.common import DEFAULT_SORT_GROUP_BYTES
from flightsrv.table.maintenance.compact import (
    _Group,
    _plan_groups,
    _write_group,
    compaction_options,
)
from flightsrv.table.maintenance.compact import commit_groups as shared_commit_groups
from flightsrv.table.maintenance.common import _overdue
from flightsrv.table.maintenance.results import CompactResult
from flightsrv.table.scan import Snapshot
from flightsrv.table.writer import WriteOptions

GROUP_SCHEMA = T.StructType([T.StructField("gid", T.IntegerType(), True),
                             T.StructField("group", T.BinaryType(), True)])


def plan(table, *, target_file_size=None, min_deleted_fraction=None, small_file_fraction=None,
         small_file_threshold=None) -> tuple[Snapshot, list[_Group], dict, WriteOptions]:
    """Pin the head and choose the groups (driver side)."""
    snap = table.snapshot()
    props = snap.manifest.properties
    options, min_del, _frac, small = compaction_options(
        table, props, target_file_size=target_file_size,
        min_deleted_fraction=min_deleted_fraction, small_file_fraction=small_file_fraction,
        small_file_threshold=small_file_threshold)
    groups, reasons = _plan_groups(snap.manifest, table, target=options.target_file_size,
                                   min_deleted=min_del, small=small, sort_by=[],
                                   sort_group_bytes=DEFAULT_SORT_GROUP_BYTES)
    return snap, groups, reasons, options


def _writer(wh_uri: str, name: str, version: int, options: WriteOptions):
    """mapInArrow function: write each group's live rows, return the group with outputs."""

    def run(batches):
        table = table_handle(wh_uri, name)
        snap = Snapshot(table, table.log.load(version))
        target = spark_arrow_schema(GROUP_SCHEMA)
        for b in batches:
            for gid, blob in zip(b.column("gid").to_pylist(), b.column("group").to_pylist()):
                g = pickle.loads(blob)
                _write_group(table, snap, g, options, [], version, None)
                yield pa.RecordBatch.from_arrays(
                    [pa.array([gid], pa.int32()), pa.array([pickle.dumps(g)], pa.binary())],
                    schema=target)

    return run


def rewrite_groups(spark, wh_uri: str, name: str, snap: Snapshot, groups: list[_Group],
                   options: WriteOptions) -> list[_Group]:
    """Run one Spark task per group; returns the groups with their outputs, in plan order."""
    if not groups:
        return []
    rows = [(i, pickle.dumps(g)) for i, g in enumerate(groups)]
    df = spark.createDataFrame(rows, GROUP_SCHEMA).repartition(len(groups))
    done = df.mapInArrow(_writer(wh_uri, name, snap.version, options), GROUP_SCHEMA).collect()
    by_id = {r["gid"]: pickle.loads(bytes(r["group"])) for r in done}
    missing = [i for i in range(len(groups)) if i not in by_id]
    if missing:
        raise ConfigurationError("compaction tasks returned no result for some groups",
                                 table=name, groups=",".join(map(str, missing)))
    return [by_id[i] for i in range(len(groups))]


def commit_groups(table, snap: Snapshot, groups: list[_Group],
                  result: CompactResult) -> CompactResult:
    """One commit swapping each still-valid group's inputs for its outputs: the same commit
    as ``Table.compact`` (``maintenance.commit_groups``: carry-over, abort on vanished
    inputs, appends kept)."""
    shared_commit_groups(table, snap.manifest, groups, result,
                         extra_summary={"engine": "spark"})
    return result


def compact(spark, uri: str, *, target_file_size: int | None = None,
            min_deleted_fraction: float | None = None, small_file_fraction: float | None = None,
            small_file_threshold: int | None = None, dry_run: bool = False) -> CompactResult:
    """Compact the table at ``uri`` with one Spark task per group and one commit."""
    wh_uri, name = split_uri(uri)
    table = table_handle(wh_uri, name)
    snap, groups, reasons, options = plan(
        table, target_file_size=target_file_size, min_deleted_fraction=min_deleted_fraction,
        small_file_fraction=small_file_fraction, small_file_threshold=small_file_threshold)
    inputs = {i.file.path for g in groups for i in g.inputs}
    result = CompactResult(table=name, dry_run=dry_run, read_version=snap.version,
                           groups_planned=len(groups),
                           reasons={p: r for p, r in reasons.items() if p in inputs})
    if dry_run or not groups:
        result.files_rewritten = len(inputs) if dry_run else 0
        result.erasures_overdue = _overdue(table, result)
        return result
    table.ensure_writable()
    written = rewrite_groups(spark, wh_uri, name, snap, groups, options)
    commit_groups(table, snap, written, result)
    # the erasure-deadline report Table.compact gives (docs/MAINTENANCE.md, Results)
    result.erasures_overdue = _overdue(table, result)
    return result

"""Spark: write throughput through the ``flightsrv`` data source, and erasure by join.

One local[2] SparkSession for the module (its start-up, 12-17 s, is not in any figure).

- **write**: the same cached DataFrame (``id``, ``user_id``, ``u`` double, ``s`` string; N
  rows in 2 partitions) written by ``df.write.format("flightsrv").mode("overwrite")`` (tasks
  write ZSTD Parquet through the table's writer, one commit) vs Spark's built-in Parquet
  writer with ZSTD to a local directory. Rows/s for both; ratio = built-in time / ours
  (higher is better; goal >= 0.7x). Runs interleaved, median of 3 at both scales.
  The codecs differ in level: ours is pyarrow's ZSTD default (level 1), Spark's is
  parquet-java's (level 3); the note gives both outputs' sizes so that the comparison shows
  what each wrote. Warm-up writes a small DataFrame of *2* partitions with each writer, so
  that both local[2] task slots have a Python worker running (a ``limit`` warm-up has one
  partition: the timed write then started the second worker, about 1 s of process start and
  imports that only the data source pays, once per executor slot and session).
- **erasure by join**: ``delete_matching`` of K distinct ids against the N-row table (DVs, one
  commit) vs what a plain Spark pipeline does without deletion vectors: read the Parquet
  copy, ``left_anti`` join with the keys, write the table again. Ratio = copy-on-write time /
  ours (higher is better). The rows deleted are checked to be exactly K.
"""

from __future__ import annotations

import os
import time

from benchmarks.harness import Context, Row, mb, timed_pair

NAME = "spark"


def _label(n: int) -> str:
    return f"{n // 1_000_000}M rows" if n >= 1_000_000 else f"{n // 1000}k rows"


def run(ctx: Context) -> list[Row]:
    import flightsrv.spark as fs
    from flightsrv.warehouse import Warehouse

    n = ctx.rows(500_000, 10_000_000)
    k = ctx.rows(5_000, 100_000)
    repeat = 3
    spark = fs.session("local[2]", "flightsrv-bench", conf={
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.driver.memory": "4g"})
    rows: list[Row] = []
    try:
        wh = ctx.tempdir("spark-wh")
        pq_dir = ctx.tempdir("spark-parquet")
        uri = f"{wh}/events"
        df = spark.range(0, n, numPartitions=2).selectExpr(
            "id", "id % 100003 AS user_id", "rand(7) AS u",
            "concat('k', cast(id % 4 AS string)) AS s")
        df.cache().count()
        # warm-up: a Python worker per task slot (2 partitions), the store's one-time
        # self-check, the JVM's code paths of both writers
        warm = spark.range(0, 2000, numPartitions=2).selectExpr(
            "id", "id % 100003 AS user_id", "rand(7) AS u",
            "concat('k', cast(id % 4 AS string)) AS s")
        warm.write.format("flightsrv").mode("overwrite").save(uri)
        warm.write.mode("overwrite").option("compression", "zstd").parquet(pq_dir)

        times = timed_pair({
            "ours": lambda: df.write.format("flightsrv").mode("overwrite").save(uri),
            "parquet": lambda: df.write.mode("overwrite").option("compression", "zstd")
            .parquet(os.path.join(pq_dir, "t")),
        }, repeat=repeat)
        ratio = times["parquet"] / times["ours"]
        table = Warehouse.open(wh).table("events")
        ours_bytes = sum(f.size for f in table.head().data_files)
        pq_bytes = sum(e.stat().st_size for e in os.scandir(os.path.join(pq_dir, "t"))
                       if e.name.endswith(".parquet"))
        rows.append(Row(
            "spark write (data source)", f"{_label(n)}, 4 cols, local[2]",
            f"{n / times['ours'] / 1e6:.2f} M rows/s ({times['ours']:.2f} s)",
            f"Spark built-in Parquet (zstd) {n / times['parquet'] / 1e6:.2f} M rows/s "
            f"({times['parquet']:.2f} s)", ratio, ">= 0.7x", ratio >= 0.7,
            f"files: ours {mb(ours_bytes)} (zstd level 1), built-in {mb(pq_bytes)} "
            f"(zstd level 3)"))
        df.unpersist()

        assert table.count_rows() == n
        keys = spark.range(0, k, numPartitions=2).selectExpr(f"(id * 7919) % {n} AS id")
        keys.cache().count()
        t0 = time.perf_counter()
        deleted = fs.delete_matching(spark, uri, keys, on=["id"])
        ours = time.perf_counter() - t0
        if deleted != k:
            raise AssertionError(f"delete_matching deleted {deleted} rows, expected {k}")
        src = os.path.join(pq_dir, "t")
        t0 = time.perf_counter()
        spark.read.parquet(src).join(keys, "id", "left_anti").write.mode("overwrite") \
            .option("compression", "zstd").parquet(os.path.join(pq_dir, "erased"))
        cow = time.perf_counter() - t0
        rows.append(Row(
            "spark erasure by join", f"{k // 1000}k keys vs {_label(n)}",
            f"{ours:.2f} s, {deleted} rows deleted (DVs, 1 commit)",
            f"Spark left_anti join + Parquet rewrite {cow:.2f} s", cow / ours, "", None,
            "ratio = rewrite time / ours"))
    finally:
        spark.stop()
    return rows

"""Table-format core: append throughput, projected scan throughput, commit latency.

Rows (all on the local store, under the run's temp directory):

- **append**: ``Table.append`` of an in-memory Arrow table vs ``pyarrow.parquet.write_table``
  of the same table (ZSTD, the same disk). MB/s = Arrow in-memory bytes / wall time, for both.
  Our figure includes statistics, the fsyncs of the local store and the commit.
- **scan**: ``Snapshot.scan(columns=["x"])`` consumed batch by batch vs DuckDB
  ``SELECT x FROM read_parquet([...])`` over the very same data files, streamed with
  ``to_arrow_reader``. MB/s = the column's Arrow bytes / wall time.
- **commit latency** with 1, 10, 100 and 1,000 data files in the manifest: one
  ``Table.commit_files`` of one more file (warm: the same writer, head manifest cached; cold:
  a fresh ``Warehouse`` that reads and parses the head first). The manifests are built in one
  commit from synthetic entries (copies of one tiny real file's entry under distinct keys).
  Baseline: the 1-file commit; ratio = N-file ms / 1-file ms (lower is better).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import Context, Row, mb, timed_pair

NAME = "core"


def make_data(n: int, seed: int = 1) -> pa.Table:
    """``id`` 0..n-1 (sorted), ``x`` random int64, ``u`` uniform [0, 1), ``s`` 4-value string."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(n, dtype=np.int64)),
        "x": pa.array(rng.integers(0, 1_000_000, n, dtype=np.int64)),
        "u": pa.array(rng.random(n)),
        "s": pa.array(np.array(["alpha", "beta", "gamma", "delta"])[rng.integers(0, 4, n)]),
    })


def rows_label(n: int) -> str:
    return f"{n // 1_000_000}M rows" if n >= 1_000_000 and n % 1_000_000 == 0 \
        else f"{n // 1000}k rows"


def data_paths(table) -> list[str]:
    return [table.store.local_path(f.path) for f in table.head().data_files]


def bench_append(ctx: Context, wh, data: pa.Table, label: str) -> Row:
    base_dir = ctx.tempdir("core-append-baseline")
    t = wh.create_table("append_bench", data.schema)
    t.append(data.slice(0, 10))  # warm-up: the store's one-time self-check, imports
    i = [0]

    def ours():
        t.append(data)

    def baseline():
        i[0] += 1
        pq.write_table(data, os.path.join(base_dir, f"b{i[0]}.parquet"), compression="zstd")

    def durable():  # the same plus the fsync our local store does for durability
        i[0] += 1
        path = os.path.join(base_dir, f"b{i[0]}.parquet")
        pq.write_table(data, path, compression="zstd")
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    repeat = 3 if ctx.full else 5
    times = timed_pair({"ours": ours, "base": baseline, "durable": durable}, repeat=repeat,
                       setup=os.sync)
    ours_mbs = data.nbytes / times["ours"] / 1e6
    base_mbs = data.nbytes / times["base"] / 1e6
    durable_mbs = data.nbytes / times["durable"] / 1e6
    on_disk = t.head().data_files[-1].size
    ratio = ours_mbs / base_mbs
    return Row("append throughput", f"{label}, {mb(data.nbytes)} Arrow, {mb(on_disk)} Parquet",
               f"{ours_mbs:.0f} MB/s", f"pyarrow write_table {base_mbs:.0f} MB/s", ratio,
               ">= 0.8x", ratio >= 0.8,
               f"median of {repeat}, interleaved, os.sync() before each; ours includes stats, "
               f"fsync and commit; write_table + fsync: {durable_mbs:.0f} MB/s "
               f"({ours_mbs / durable_mbs:.2f}x)")


def bench_scan(ctx: Context, wh, data: pa.Table, label: str) -> Row:
    import duckdb

    t = wh.create_table("scan_bench", data.schema)
    t.append(data)
    snap = t.snapshot()
    paths = data_paths(t)
    con = duckdb.connect()
    con.sql("SET enable_progress_bar=false")
    col_bytes = data.column("x").nbytes
    counts = {}

    def ours():
        counts["ours"] = sum(b.num_rows for b in snap.scan(columns=["x"]))

    def baseline():
        r = con.sql(f"SELECT x FROM read_parquet({paths!r})").to_arrow_reader(122_880)
        counts["base"] = sum(b.num_rows for b in r)

    ours()
    baseline()  # warm both (footer cache, page cache)
    times = timed_pair({"ours": ours, "base": baseline}, repeat=5)
    assert counts["ours"] == counts["base"] == data.num_rows, counts
    ours_mbs = col_bytes / times["ours"] / 1e6
    base_mbs = col_bytes / times["base"] / 1e6
    ratio = ours_mbs / base_mbs
    return Row("scan throughput, 1 projected int64 column",
               f"{label}, {len(paths)} file(s), "
               f"{sum(t.head().data_files[i].row_groups for i in range(len(paths)))} row groups",
               f"{ours_mbs:.0f} MB/s ({times['ours'] * 1000:.0f} ms)",
               f"DuckDB read_parquet {base_mbs:.0f} MB/s ({times['base'] * 1000:.0f} ms)",
               ratio, ">= 0.8x", ratio >= 0.8, "median of 5, interleaved, warm page cache")


def bench_commits(ctx: Context, wh, uri: str) -> list[Row]:
    from flightsrv.warehouse import Warehouse

    repeat = 9 if ctx.full else 5
    tiny = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "x": pa.array([4, 5, 6], pa.int64())})
    results = {}
    for n in (1, 10, 100, 1000):
        name = f"commit_{n}"
        t = wh.create_table(name, tiny.schema)
        files, _, _ = t.write_files(tiny)
        proto = files[0]
        synth = [dataclasses.replace(proto, path=f"{proto.path[:-8]}-{i}.parquet")
                 for i in range(n - 1)]
        t.commit_files([proto] + synth)
        def one(table, proto=proto, k=[0]):  # noqa: B006 (a per-size counter)
            k[0] += 1
            table.commit_files([dataclasses.replace(proto, path=f"{proto.path[:-8]}-x{k[0]}"
                                                               f".parquet")])

        os.sync()  # earlier benchmarks' dirty pages must not land on our fsyncs

        warm = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            one(t)
            warm.append(time.perf_counter() - t0)
        cold = []
        for _ in range(repeat):
            fresh = Warehouse.open(uri)
            fresh.ensure_writable()
            ft = fresh.table(name)
            t0 = time.perf_counter()
            one(ft)
            cold.append(time.perf_counter() - t0)
        manifest_bytes = len(t.head().to_json())
        results[n] = (statistics.median(warm), statistics.median(cold), manifest_bytes)
    rows = []
    base_warm, base_cold, _ = results[1]
    for n, (w, c, size) in results.items():
        rows.append(Row(f"commit latency, {n} data file(s)",
                        f"local store, manifest {size / 1000:.0f} kB",
                        f"{w * 1000:.1f} ms (cold {c * 1000:.1f} ms)",
                        f"1-file commit {base_warm * 1000:.1f} ms (cold {base_cold * 1000:.1f} ms)",
                        w / base_warm, "", None,
                        f"median of {repeat}; ratio = ms / 1-file ms, lower is better"))
    return rows


def run(ctx: Context) -> list[Row]:
    from flightsrv.warehouse import Warehouse

    n = ctx.rows(1_000_000, 10_000_000)
    data = make_data(n)
    label = rows_label(n)
    uri = ctx.tempdir("core-wh")
    wh = Warehouse.open(uri)
    rows = [bench_append(ctx, wh, data, label)]
    wh.drop_table("append_bench")
    rows.append(bench_scan(ctx, wh, data, label))
    rows.extend(bench_commits(ctx, wh, uri))
    for d in glob.glob(os.path.join(ctx.workdir, "core-*")):
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    return rows

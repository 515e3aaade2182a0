"""The default codec (``compression=auto``) against all-ZSTD and all-Snappy data files.

Data: ``bench_peers.make_events`` (``id`` sorted, ``user_id`` random in [0, 1M),
``event_time`` random, ``value`` random doubles, ``payload`` 24 random characters), 1M rows
(small) or 10M (full), appended to one table per codec in 4 appends at default settings
otherwise (122,880-row groups). Each statement runs on DuckDB 2.0 (2 threads) over the same
table's files (``read_parquet``, the engine's reader), medians of 7 interleaved runs:

- ``count(*), sum(value)`` (one incompressible column),
- ``max(id), sum(user_id)`` (two compressible columns),
- ``count(*) WHERE payload LIKE '%abc%'`` (a string column ZSTD shrinks by about 40%),
- ``SELECT * WHERE id = <random>`` (a point read: one page per column).

The ratio is auto's time over ZSTD's (lower is better); the note gives each table's bytes
on disk, the all-Snappy time beside them, and which codec auto chose per column.
"""

from __future__ import annotations

import random
import statistics
import time

import pyarrow.parquet as pq

from benchmarks.harness import Context, Row, mb

NAME = "codec"
CODECS = ("auto", "zstd", "snappy")


def run(ctx: Context) -> list[Row]:
    import duckdb

    from benchmarks.bench_peers import load, make_events
    from flightsrv import Warehouse

    n = ctx.rows(1_000_000, 10_000_000)
    data = make_events(n)
    wh = Warehouse.open(ctx.tempdir("codec"))
    files, sizes = {}, {}
    for codec in CODECS:
        t = wh.create_table(f"t_{codec}", data.schema, {"compression": codec})
        step = n // 4
        for a in range(0, n, step):
            t.append(data.slice(a, step))
        files[codec] = [t.store.local_path(f.path) for f in t.head().data_files]
        sizes[codec] = sum(f.size for f in t.head().data_files)
    md = pq.ParquetFile(files["auto"][0]).metadata.row_group(0)
    chosen = ", ".join(f"{md.column(i).path_in_schema} {md.column(i).compression.lower()}"
                       for i in range(md.num_columns))
    con = duckdb.connect()
    con.execute("SET threads = 2")
    rng = random.Random(5)
    queries = {
        "sum of random doubles": "SELECT count(*), sum(value) FROM read_parquet({})",
        "sums of two compressible columns": "SELECT max(id), sum(user_id) FROM read_parquet({})",
        "LIKE over a string column": "SELECT count(*) FROM read_parquet({}) "
                                     "WHERE payload LIKE '%abc%'",
        "point read": "SELECT * FROM read_parquet({}) WHERE id = {}",
    }
    rows = []
    for name, sql in queries.items():
        t = {c: [] for c in CODECS}
        for _ in range(8):
            key = rng.randrange(n)
            for c in CODECS:
                text = sql.format("[" + ", ".join(f"'{p}'" for p in files[c]) + "]", key)
                t0 = time.perf_counter()
                con.execute(text).fetchall()
                t[c].append(time.perf_counter() - t0)
        m = {c: statistics.median(v[1:]) * 1000 for c, v in t.items()}
        ratio = m["auto"] / m["zstd"]
        rows.append(Row(f"codec: {name}", f"{n // 1_000_000}M rows x 5 cols, 4 files, DuckDB "
                        "read_parquet at 2 threads", f"auto {m['auto']:.1f} ms",
                        f"all ZSTD {m['zstd']:.1f} ms", ratio, "", None,
                        f"all Snappy {m['snappy']:.1f} ms; bytes auto {mb(sizes['auto'])}, "
                        f"ZSTD {mb(sizes['zstd'])}, Snappy {mb(sizes['snappy'])}; auto chose "
                        f"{chosen}; medians of 7; load {load()}"))
    con.close()
    return rows

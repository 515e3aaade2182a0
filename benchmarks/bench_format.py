"""Table format 2 (issue 15): metadata that scales with the change, not the table.

- **commit latency**: a 1-file append (``Table.append`` of one row) to a table holding N data
  files vs the same append to a table holding 1 file, local store; median of 9 appends each.
  Ratio = big / small (goal <= 2x). Bytes written per commit (``CountingStore``, data file
  excluded) for both.
- **point-query planning**: a fresh warehouse object (cold chunk cache) over a
  ``CountingStore`` whose engine has started; ``SELECT * FROM t WHERE id = k`` on the N-file
  table whose ``id`` is
  clustered (file i holds ids 10i..10i+9). Figures: manifest chunks read (goal <= 2) and the
  statement's wall time (goal <= 20 ms of planning; the figure includes reading the one file).
- **retention delete**: a table partitioned by ``day(ts)`` with 365 days (one file a day);
  ``DELETE ... WHERE ts < <day 2>``; writes counted (goal: metadata-only, <= 3 writes).

N is 10,000 at ``--scale small`` and 100,000 at ``--scale full``. The N files are real,
distinct Parquet files of 10 rows each, written by pyarrow into the table's store and
committed with the statistics the table's writer would record (``file_stats``), in one
commit (writing them through ``Table.append`` one by one would take most of an hour).
"""

from __future__ import annotations

import datetime as dt
import io
import statistics
import time

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import Context, Row

NAME = "format"
PER_FILE = 10


def _bulk_files(t, n: int) -> None:
    from flightsrv.store.base import PutMode
    from flightsrv.table.manifest import DataFile
    from flightsrv.table.writer import WriteLayout, data_key, file_stats
    from flightsrv.table.schema import physical_arrow_schema

    head = t.head()
    layout = WriteLayout.from_manifest(head)
    physical = physical_arrow_schema(layout.schema)
    files = []
    for i in range(n):
        ids = pa.array(range(i * PER_FILE, (i + 1) * PER_FILE), pa.int64())
        tbl = pa.Table.from_arrays([ids, pa.array([f"r{i}"] * PER_FILE)], schema=physical)
        buf = io.BytesIO()
        pq.write_table(tbl, buf, compression="zstd", write_statistics=True)
        raw = buf.getvalue()
        key = data_key(t.runtime)
        meta = t.store.put(key, raw, mode=PutMode.CREATE)
        md = pq.read_metadata(io.BytesIO(raw))
        offsets, stats = file_stats(md, layout, {})
        files.append(DataFile(path=key, size=meta.size, etag=meta.etag, rows=PER_FILE,
                              row_group_offsets=offsets, stats=stats, added_version=0,
                              schema_id=layout.schema_id))
    t.commit_files(files, expected_schema=head.schema)


def _append_once(t, i: int) -> None:
    t.append(pa.table({"id": pa.array([-i - 1], pa.int64()), "v": ["new"]}))


def run(ctx: Context) -> list[Row]:
    from flightsrv import Warehouse
    from flightsrv.store.faults import CountingStore

    n = ctx.rows(10_000, 100_000)
    uri = ctx.tempdir("format")
    wh = Warehouse.open(uri)
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    small = wh.create_table("one", schema)
    _bulk_files(small, 1)
    big = wh.create_table("many", schema)
    t0 = time.perf_counter()
    _bulk_files(big, n)
    build_s = time.perf_counter() - t0

    rows: list[Row] = []
    lat = {}
    written = {}
    for name in ("one", "many"):
        counting = CountingStore(wh.store)
        t = Warehouse(counting).table(name)
        t.head()
        samples, sizes = [], []
        for i in range(9):
            counting.reset()
            c0 = time.perf_counter()
            _append_once(t, i)
            samples.append(time.perf_counter() - c0)
            # bytes of puts: the data file is adopted (local store), so this is metadata
            sizes.append(counting.bytes_written)
        lat[name] = statistics.median(samples)
        written[name] = statistics.median(sizes)
    ratio = lat["many"] / lat["one"]
    rows.append(Row("format 2: 1-file append commit latency", f"{n:,} files vs 1 file (local)",
                    f"{lat['many'] * 1000:.0f} ms", f"1 file {lat['one'] * 1000:.0f} ms",
                    ratio, "<= 2x", ratio <= 2.0,
                    f"table of {n:,} files built in {build_s:.0f} s"))
    wr = written["many"] / max(1, written["one"])
    rows.append(Row("format 2: metadata bytes written per 1-file append",
                    f"{n:,} files vs 1 file", f"{written['many'] / 1024:.1f} KiB",
                    f"1 file {written['one'] / 1024:.1f} KiB", wr,
                    "independent of size", wr <= 2.0, "root + changed chunks + pointer"))

    counting = CountingStore(wh.store)
    cold = Warehouse(counting)
    cold.sql("SELECT count(*) FROM one")  # start the engine (not part of planning)
    cold.table("many").head()
    counting.reset()
    key = (n // 2) * PER_FILE + 3
    c0 = time.perf_counter()
    got = cold.sql(f"SELECT * FROM many WHERE id = {key}")
    q_s = time.perf_counter() - c0
    assert got.num_rows == 1
    chunk_reads = len([k for k in counting.keys.get("get", []) if "/chunks/" in k])
    rows.append(Row("format 2: clustered point query", f"{n:,} files, cold chunk cache",
                    f"{chunk_reads} chunks read, {q_s * 1000:.0f} ms",
                    "goal: <= 2 chunks, <= 20 ms planning", chunk_reads / 2, "<= 2 chunks",
                    chunk_reads <= 2, "time includes reading the one data file"))

    ev = wh.create_table("days", pa.schema([("ts", pa.timestamp("us")), ("u", pa.int64())]),
                         partition_by=["day(ts)"])
    base = dt.datetime(2024, 1, 1)
    ts = [base + dt.timedelta(hours=6 * i) for i in range(365 * 4)]
    ev.append(pa.table({"ts": pa.array(ts, pa.timestamp("us")),
                        "u": pa.array(range(len(ts)), pa.int64())}))
    counting = CountingStore(wh.store)
    t = Warehouse(counting).table("days")
    t.head()
    counting.reset()
    deleted = t.delete("ts < TIMESTAMP '2024-01-02'")
    writes = sum(counting.counts.get(op, 0) for op in ("put", "put_file", "adopt"))
    rows.append(Row("format 2: retention delete of one day", "365 days, day(ts) partitions",
                    f"{writes} writes, {deleted} rows", "budget: metadata only, 3 writes",
                    writes / 3, "<= 3 writes", writes <= 3,
                    "the day's file leaves the root; no data file or DV written"))
    return rows

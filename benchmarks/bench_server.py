"""The Flight SQL server end to end: ADBC client -> loopback gRPC -> DuckEngine -> table.

Data: ``benchmarks.bench_core.make_data`` (``id`` sorted 0..n-1, ``x``, ``u``, ``s``; 2M
rows small, 10M full) appended to a local warehouse, with the table property
``row_group_bytes`` = 2 MiB (about 65k rows per row group): the scan prunes by row-group
statistics but reads a surviving row group whole, so with the default 16 MiB groups (about
500k rows here) a point query costs ~80 ms of Parquet decoding. The server runs in this process
(``start_in_thread``); clients are ``adbc_driver_flightsql.dbapi`` connections over
127.0.0.1.

- **large result**: ``SELECT * FROM t`` fetched whole with ``fetch_arrow_table()`` through
  ADBC, vs in-process DuckDB ``read_parquet([the same files]).to_arrow_table()``; both
  warmed up once, then runs interleaved, median of 3. Ratio = ours / DuckDB (goal <= 1.2x).
- **point query**: ``SELECT * FROM t WHERE id = ?`` with random ids on one connection, p50
  and p99 over the runs (each one full prepare -> GetFlightInfo -> DoGet -> close round trip).
  Baseline: the same query in-process on DuckDB over the same files (p50). Goal p50 < 20 ms.
- **8 concurrent clients**: 8 threads, each with its own connection, run point queries;
  queries/s. Ratio = 8-client throughput / 1-client throughput (how well it scales on this
  2-core box; the GIL and 2 cores bound it).
- **DELETE**: ``DELETE FROM t WHERE id = <random>`` through ADBC (one DV commit), median
  of 5. Baseline: ``Table.delete`` of the same kind of predicate in process. Ratio = through
  Flight SQL / in process (the protocol's overhead).
- **large result after deletes**: the large result again once those 10 deletes left a
  deletion vector on most data files (each such file is read by DuckDB with a positional
  keep mask), vs the same in-process DuckDB read of the files (which ignores the deletes).

On a local warehouse the engine reads data files with DuckDB's own ``read_parquet``
(``flightsrv.engine.native``); on S3 it uses flightsrv's Arrow scan.
"""

from __future__ import annotations

import statistics
import threading
import time
import warnings

import duckdb
import numpy as np

from benchmarks.bench_core import data_paths, make_data, rows_label
from benchmarks.harness import Context, Row, mb, timed_pair

NAME = "server"
CLIENTS = 8
ROW_GROUP_BYTES = 2 << 20


def _connect(uri):
    from adbc_driver_flightsql import dbapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(uri)


def _point_latencies(conn, ids) -> list[float]:
    out = []
    with conn.cursor() as cur:
        for i in ids:
            t0 = time.perf_counter()
            cur.execute("SELECT * FROM t WHERE id = ?", parameters=[int(i)])
            rows = cur.fetchall()
            out.append(time.perf_counter() - t0)
            assert len(rows) <= 1
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))]


def run(ctx: Context) -> list[Row]:
    from flightsrv import Warehouse
    from flightsrv.engine import DuckEngine
    from flightsrv.server import start_in_thread

    n = ctx.rows(2_000_000, 10_000_000)
    label = rows_label(n)
    rng = np.random.default_rng(7)
    wh = Warehouse.open(ctx.tempdir("server-wh"))
    data = make_data(n)
    # row groups of ~2 MiB (uncompressed): a point lookup reads one small group
    t = wh.create_table("t", data.schema, {"row_group_bytes": str(ROW_GROUP_BYTES)})
    step = max(1, n // 4)
    for a in range(0, n, step):
        t.append(data.slice(a, step))
    del data
    paths = data_paths(t)
    nbytes = sum(f.size for f in t.head().data_files)
    engine = DuckEngine(wh)
    server, port = start_in_thread(engine)
    uri = f"grpc://127.0.0.1:{port}"
    rows: list[Row] = []
    try:
        conn = _connect(uri)
        duck = duckdb.connect()
        duck.execute("SET enable_progress_bar=false")
        files_sql = "[" + ",".join(f"'{p}'" for p in paths) + "]"

        def ours():
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM t")
                got = cur.fetch_arrow_table()
            assert got.num_rows == n

        def baseline():
            got = duck.sql(f"SELECT * FROM read_parquet({files_sql})").to_arrow_table()
            assert got.num_rows == n

        ours()  # warm-up: caches, first prepared statement
        baseline()
        tm = timed_pair({"ours": ours, "duckdb": baseline}, repeat=3)
        ratio = tm["ours"] / tm["duckdb"]
        rows.append(Row("large result through ADBC", f"{label}, {mb(nbytes)} Parquet, SELECT *",
                        f"{tm['ours']:.2f} s", f"in-process DuckDB {tm['duckdb']:.2f} s", ratio,
                        "<= 1.2x", ratio <= 1.2, "loopback gRPC, client in the same process"))

        k = 300 if ctx.full else 150
        ids = rng.integers(0, n, k)
        _point_latencies(conn, ids[:10])  # warm-up
        lat = _point_latencies(conn, ids)
        p50, p99 = _pct(lat, 0.5), _pct(lat, 0.99)
        base = []
        for i in ids[:50]:
            t0 = time.perf_counter()
            duck.execute(f"SELECT * FROM read_parquet({files_sql}) WHERE id = ?", [int(i)])
            duck.fetchall()
            base.append(time.perf_counter() - t0)
        b50 = statistics.median(base)
        rows.append(Row("point query latency", f"{label}, id = ?, {k} queries",
                        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms",
                        f"in-process DuckDB p50 {b50 * 1000:.1f} ms", p50 / b50,
                        "p50 < 20 ms", p50 < 0.020, "ratio = p50 / DuckDB p50"))

        single_qps = len(lat) / sum(lat)
        per_client = k // CLIENTS * 2
        conns = [_connect(uri) for _ in range(CLIENTS)]
        errors: list = []

        def client(c, seed):
            try:
                _point_latencies(c, np.random.default_rng(seed).integers(0, n, per_client))
            except Exception as exc:  # noqa: BLE001 - reported in the row
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(c, s)) for s, c in enumerate(conns)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        for c in conns:
            c.close()
        qps = CLIENTS * per_client / wall
        rows.append(Row(f"point queries, {CLIENTS} concurrent clients",
                        f"{label}, {CLIENTS} x {per_client} queries", f"{qps:.0f} queries/s",
                        f"1 client {single_qps:.0f} queries/s", qps / single_qps, "", None,
                        f"errors: {len(errors)}" if errors else "2 cores"))

        flight_times, local_times = [], []
        with conn.cursor() as cur:
            for _ in range(5):
                i = int(rng.integers(0, n))
                t0 = time.perf_counter()
                cur.execute(f"DELETE FROM t WHERE id = {i}")
                flight_times.append(time.perf_counter() - t0)
                assert cur.rowcount in (0, 1)
                j = int(rng.integers(0, n))
                t0 = time.perf_counter()
                t.delete(f"id = {j}")
                local_times.append(time.perf_counter() - t0)
        fd, ld = statistics.median(flight_times), statistics.median(local_times)
        rows.append(Row("DELETE through Flight SQL", f"{label}, id = <random>, median of 5",
                        f"{fd * 1000:.0f} ms", f"Table.delete in process {ld * 1000:.0f} ms",
                        fd / ld, "", None, "one deletion-vector commit each"))

        files = t.head().data_files
        with_dv = sum(1 for f in files if f.dv is not None)
        live = t.head().live_rows

        def ours_after():
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM t")
                got = cur.fetch_arrow_table()
            assert got.num_rows == live

        ours_after()
        tm = timed_pair({"ours": ours_after, "duckdb": baseline}, repeat=3)
        ratio = tm["ours"] / tm["duckdb"]
        rows.append(Row("large result after deletes",
                        f"{label}, DVs on {with_dv} of {len(files)} files, SELECT *",
                        f"{tm['ours']:.2f} s", f"in-process DuckDB {tm['duckdb']:.2f} s", ratio,
                        "<= 1.2x", ratio <= 1.2, "files with DVs read by DuckDB with their mask"))
        conn.close()
        duck.close()
    finally:
        server.shutdown()
        engine.close()
    return rows

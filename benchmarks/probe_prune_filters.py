"""How the filters BI tools and dashboards write prune a year of daily files.

``python -m benchmarks.probe_prune_filters [--days N] [--rows R] [--runs K]``

One table of ``N`` daily files (``R`` rows each, 30 s apart: ``id``, ``ts`` TIMESTAMP,
``tz`` TIMESTAMPTZ, ``v``), the last day ending now. Each statement runs through the engine
in process (``Warehouse.engine.execute_query``, the server's statement path without the
RPCs) and, beside it in the same run, as DuckDB's own ``read_parquet`` over the same files
(which prunes row groups by their footer statistics itself, but reads every footer). The
figure is the median wall time of ``K`` runs after one warm-up, and the files the engine
read (``files_scanned``). Not a timed test; the numbers go to RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time

import duckdb
import pyarrow as pa

STATEMENTS = [
    "SELECT count(*), sum(v) FROM ev WHERE tz > now() - INTERVAL 1 DAY",
    "SELECT count(*), sum(v) FROM ev WHERE ts >= date_trunc('day', localtimestamp)"
    " - INTERVAL 7 DAY",
    "SELECT count(*), sum(v) FROM ev WHERE CAST(ts AS DATE) = current_date - 100",
    "SELECT count(*), sum(v) FROM ev WHERE date_trunc('month', ts) = "
    "date_trunc('month', localtimestamp)",
    "SELECT count(*), sum(v) FROM ev WHERE year(ts) = year(localtimestamp) - 1",
    "SELECT count(*), sum(v) FROM ev WHERE id = 400000 OR id = 900000",
    "SELECT count(*), sum(v) FROM ev WHERE id = '400000'",
    "SELECT count(*), sum(v) FROM ev WHERE k LIKE 'd0100-%'",
]


def _table(days: int, rows: int):
    from flightsrv import Warehouse

    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us")),
                        ("tz", pa.timestamp("us", tz="UTC")), ("k", pa.string()),
                        ("v", pa.float64())])
    wh = Warehouse.open(tempfile.mkdtemp(prefix="prune-filters-"))
    t = wh.create_table("ev", schema)
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)
    n = 0
    for day in range(days):
        start = now - dt.timedelta(days=days - day)
        stamps = [start + dt.timedelta(seconds=30 * k) for k in range(rows)]
        t.append(pa.table({
            "id": range(n, n + rows), "ts": stamps,
            "tz": [s.replace(tzinfo=dt.timezone.utc) for s in stamps],
            "k": [f"d{day:04d}-{k}" for k in range(rows)], "v": [1.0] * rows},
            schema=schema))
        n += rows
    files = [t.store.local_path(f.path) for f in t.head().data_files]
    return wh, files


def _median(fn, runs: int) -> float:
    fn()
    lat = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t0)
    return statistics.median(lat) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=366)
    ap.add_argument("--rows", type=int, default=2880)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()

    from flightsrv.engine.api import Session

    wh, files = _table(args.days, args.rows)
    con = duckdb.connect()
    con.execute(f"SET TimeZone = '{wh.engine.time_zone}'" if getattr(wh.engine, "time_zone",
                                                                      None) else "SELECT 1")
    print(f"{args.days} daily files x {args.rows} rows; median of {args.runs}")
    print("| statement | flightsrv (files read) | DuckDB read_parquet | ratio |")
    print("|---|---|---|---|")
    for sql in STATEMENTS:
        info = {}

        def ours():
            res = wh.engine.execute_query(sql, Session("bench"))
            info["out"] = res.reader.read_all().to_pylist()
            info["scanned"] = res.info.files_scanned

        theirs_sql = sql.replace("FROM ev", f"FROM read_parquet({files!r})")
        got = {}

        def theirs():
            got["out"] = con.execute(theirs_sql).fetchall()

        a, b = _median(ours, args.runs), _median(theirs, args.runs)
        assert list(info["out"][0].values())[0] == got["out"][0][0], sql
        where = sql.split(" WHERE ", 1)[1]
        print(f"| `{where}` | {a:.1f} ms ({info['scanned']}/{len(files)}) | {b:.1f} ms | "
              f"{a / b:.2f}x |")


if __name__ == "__main__":
    main()

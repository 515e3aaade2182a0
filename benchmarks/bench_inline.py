"""Reads after many small commits, with data inlining (issue 35, docs/PROTOCOL.md §18).

N commits of 10 rows each (``small``: 1,000; ``full``: 10,000) through ``Table.append`` on a
local warehouse, then ``SELECT count(*)`` and a 5-group aggregate through the in-process
engine (``Warehouse.sql``, the engine the server runs), median of 5 runs each:

- flightsrv with inlining on (``inline.max_rows`` = 100, flush thresholds at their defaults:
  the writers flush every 64 inlined commits into one Parquet file);
- flightsrv with inlining off (one Parquet file per commit, the default);
- the same rows in one file (compacted), flightsrv;
- DuckLake 1.5.5 with data inlining (``DATA_INLINING_ROW_LIMIT 100``), in process, in its
  own DuckDB 1.5.5 virtualenv (``flightsrv.testing.interop.duckdb_venv``), the same inserts
  (10-row ``INSERT ... VALUES``, one commit each) and the same two queries.

Also reported: the bytes of manifests + chunks written per commit, inline on and off.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

import pyarrow as pa

from benchmarks.harness import Context, Row

NAME = "inline"
ROWS_PER_COMMIT = 10
COUNT = "SELECT count(*) FROM ev"
AGG = "SELECT grp, count(*), sum(val) FROM ev GROUP BY grp ORDER BY grp"


def _batch(i: int) -> pa.Table:
    ids = list(range(i * ROWS_PER_COMMIT, (i + 1) * ROWS_PER_COMMIT))
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "grp": pa.array([x % 5 for x in ids], pa.int32()),
                     "val": pa.array([float(x % 97) for x in ids], pa.float64())})


def _median(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _meta_bytes(root: str) -> int:
    total = 0
    for sub in ("manifest", "chunks"):
        for dirpath, _, files in os.walk(os.path.join(root, sub)):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def _ours(ctx: Context, n: int, props: dict, label: str) -> dict:
    from flightsrv import Warehouse

    d = ctx.tempdir(f"inline-{label}")
    wh = Warehouse.open(d)
    t = wh.create_table("ev", _batch(0).schema, props)
    t0 = time.perf_counter()
    for i in range(n):
        t.append(_batch(i))
    write_s = time.perf_counter() - t0
    assert wh.sql(COUNT).column(0)[0].as_py() == n * ROWS_PER_COMMIT
    head = t.head()
    return {"count": _median(lambda: wh.sql(COUNT)), "agg": _median(lambda: wh.sql(AGG)),
            "commits_per_s": n / write_s, "meta_per_commit": _meta_bytes(f"{d}/ev") / n,
            "data_files": len(list(t.store.list("data/"))), "inlined": head.inline[0],
            "wh": wh}


_LAKE = r"""
import glob, json, os, statistics, sys, time
import duckdb
req = json.loads(sys.argv[1])
base = os.path.dirname(os.path.dirname(duckdb.__file__))
ext = glob.glob(os.path.join(base, "duckdb_extension_ducklake", "extensions", "*",
                             "ducklake.duckdb_extension"))[0]
con = duckdb.connect()
con.execute("SET enable_progress_bar=false")
con.execute(f"LOAD '{ext}'")
d = req["dir"]
con.execute(f"ATTACH 'ducklake:{d}/cat.ducklake' AS lake (DATA_PATH '{d}/data', "
            "DATA_INLINING_ROW_LIMIT 100)")
con.execute("CREATE TABLE lake.ev (id BIGINT, grp INTEGER, val DOUBLE)")
rows = req["rows"]
t0 = time.perf_counter()
for i in range(req["n"]):
    vals = ", ".join(f"({x}, {x % 5}, {float(x % 97)})" for x in range(i * rows, (i + 1) * rows))
    con.execute(f"INSERT INTO lake.ev VALUES {vals}")
write_s = time.perf_counter() - t0
def med(sql):
    ts = []
    for _ in range(5):
        t = time.perf_counter(); con.execute(sql).fetchall(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
assert con.execute("SELECT count(*) FROM lake.ev").fetchall()[0][0] == req["n"] * rows
files = len(glob.glob(os.path.join(d, "data", "**", "*.parquet"), recursive=True))
print(json.dumps({"count": med("SELECT count(*) FROM lake.ev"),
                  "agg": med("SELECT grp, count(*), sum(val) FROM lake.ev GROUP BY grp "
                             "ORDER BY grp"),
                  "commits_per_s": req["n"] / write_s, "data_files": files}))
"""


def _ducklake(ctx: Context, n: int) -> dict | None:
    from flightsrv.testing.interop import duckdb_venv

    try:
        python = duckdb_venv()
    except RuntimeError:
        return None
    d = ctx.tempdir("inline-ducklake")
    r = subprocess.run([python, "-c", _LAKE, json.dumps({"dir": d, "n": n,
                                                          "rows": ROWS_PER_COMMIT})],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"DuckLake run failed: {r.stderr[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(ctx: Context) -> list[Row]:
    n = 1_000 if ctx.scale == "small" else 10_000
    on = _ours(ctx, n, {"inline.max_rows": 100}, "on")
    off = _ours(ctx, n, {}, "off")
    t = on["wh"].table("ev")
    t.compact()
    compacted = {"count": _median(lambda: on["wh"].sql(COUNT)),
                 "agg": _median(lambda: on["wh"].sql(AGG))}
    lake = _ducklake(ctx, n)
    work = f"{n:,} commits x {ROWS_PER_COMMIT} rows, local"
    rows = []
    for q in ("count", "agg"):
        label = "count(*)" if q == "count" else "5-group aggregate"
        base = lake[q] if lake else None
        rows.append(Row(
            f"{label} after small commits, inlining on", work,
            f"{on[q] * 1000:.1f} ms",
            f"DuckLake+inlining {base * 1000:.1f} ms" if base else "DuckLake unavailable",
            round(base / on[q], 2) if base else None, ">= 1x (<= DuckLake time)",
            (on[q] <= base) if base else None,
            f"inline off {off[q] * 1000:.1f} ms; compacted {compacted[q] * 1000:.1f} ms; "
            f"{on['data_files']} data files + {on['inlined']} inlined appends "
            f"(off: {off['data_files']} files)"))
    rows.append(Row(
        "metadata bytes per 10-row commit, inlining on", work,
        f"{on['meta_per_commit'] / 1024:.1f} KiB",
        f"inline off {off['meta_per_commit'] / 1024:.1f} KiB",
        None, "<= 4 KiB (issue 35)", on["meta_per_commit"] <= 4096,
        f"commits/s: inline on {on['commits_per_s']:.0f}, off {off['commits_per_s']:.0f}"
        + (f", DuckLake {lake['commits_per_s']:.0f}" if lake else "")))
    return rows

"""Reads after many small commits, with data inlining (issue 35, docs/PROTOCOL.md §18).

N commits of 10 rows each (``small``: 1,000; ``full``: 10,000) through ``Table.append`` on a
local warehouse, then ``SELECT count(*)`` and a 5-group aggregate through the in-process
engine (``Warehouse.sql``, the engine the server runs), median of 5 runs each:

- flightsrv with inlining on (``inline.max_rows`` = 100, flush thresholds at their defaults:
  the writers flush every 64 inlined commits into one Parquet file);
- flightsrv with inlining off (one Parquet file per commit, the default);
- flightsrv at default settings (inlining off) with the server's maintenance worker
  (``MaintenanceScheduler`` at its default interval and rate, as ``flightsrv serve`` runs
  it) going during the commits: the issue's "default settings, no manual OPTIMIZE"; read
  right after the last commit, and (a second table) after the worker's next tick;
- the same rows in one file (one commit), flightsrv;
- DuckLake 1.5.5 with data inlining (``data_inlining_row_limit`` 100), in process in its
  own DuckDB 1.5.5 virtualenv (``bench_peers``' worker, ``flightsrv.testing.interop.
  duckdb_venv``), the same rows as 10-row ``INSERT ... VALUES`` commits, the same queries;
  every contender's runs interleaved (median of 9), so the machine's load hits each alike.

Also reported: the bytes of manifests + chunks written per commit, inline on and off.
"""

from __future__ import annotations

import os
import statistics
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


def _meta_bytes(root: str) -> int:
    total = 0
    for sub in ("manifest", "chunks"):
        for dirpath, _, files in os.walk(os.path.join(root, sub)):
            total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def _ours(ctx: Context, n: int, props: dict, label: str, worker: bool = False,
          settle: bool = False) -> dict:
    """``worker``: the server's background maintenance worker runs at its default settings
    (``MaintenanceScheduler``, what ``flightsrv serve`` starts) during the commits and is
    stopped after the last one, so the reads see whatever it had done by then; with
    ``settle`` it first finishes one more tick (a read a moment after the writer paused)."""
    from flightsrv import Warehouse
    from flightsrv.table.maintenance.scheduler import MaintenanceScheduler

    d = ctx.tempdir(f"inline-{label}")
    wh = Warehouse.open(d)
    t = wh.create_table("ev", _batch(0).schema, props)
    sched = MaintenanceScheduler(wh).start() if worker else None
    t0 = time.perf_counter()
    for i in range(n):
        t.append(_batch(i))
    write_s = time.perf_counter() - t0
    if sched is not None:
        if settle:
            sched.tick_now()
            sched.wait_ticks(1, timeout=120)
        sched.stop()
    head = t.head()
    return {"commits_per_s": n / write_s, "meta_per_commit": _meta_bytes(f"{d}/ev") / n,
            "data_files": len(list(t.store.list("data/"))), "inlined": head.inline[0],
            "live_files": len(list(t.snapshot().files())),
            "wh": wh}


def _ducklake(ctx: Context, n: int):
    """DuckLake with data inlining, filled with the same commits: the worker process of
    ``bench_peers`` (its ``time`` command runs any statement), or None when its virtualenv
    cannot be built."""
    from benchmarks.bench_peers import DuckLake

    try:
        lake = DuckLake()
    except RuntimeError:
        return None
    d = ctx.tempdir("inline-ducklake")
    lake.call(cmd="setup", dir=d, tables={})
    lake.time("CALL lake.set_option('data_inlining_row_limit', 100)")
    lake.time("CREATE TABLE lake.ev (id BIGINT, grp INTEGER, val DOUBLE)")
    t0 = time.perf_counter()
    for i in range(n):
        vals = ", ".join(f"({x}, {x % 5}, {float(x % 97)})"
                         for x in range(i * ROWS_PER_COMMIT, (i + 1) * ROWS_PER_COMMIT))
        lake.time(f"INSERT INTO lake.ev VALUES {vals}")
    lake.commits_per_s = n / (time.perf_counter() - t0)
    lake.files = sum(len([f for f in fs if f.endswith(".parquet")])
                     for _, _, fs in os.walk(os.path.join(d, "data")))
    return lake


def _interleaved(fns: dict, repeat: int = 15) -> dict:
    """(Median, min) seconds of each ``fns[name]()`` (returning its own seconds, or None to
    be timed here), runs interleaved so the machine's load hits each alike."""
    out: dict = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm up
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            got = fn()
            out[k].append(got if isinstance(got, float) else time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in out.items()}


def run(ctx: Context) -> list[Row]:
    n = 1_000 if ctx.scale == "small" else 10_000
    on = _ours(ctx, n, {"inline.max_rows": 100}, "on")
    off = _ours(ctx, n, {}, "off")
    dflt = _ours(ctx, n, {}, "defaults", worker=True)
    settled = _ours(ctx, n, {}, "defaults-settled", worker=True, settle=True)
    comp = _ours(ctx, 1, {}, "compacted")
    comp["wh"].table("ev").append(pa.concat_tables([_batch(i) for i in range(1, n)]))
    lake = _ducklake(ctx, n)
    work = f"{n:,} commits x {ROWS_PER_COMMIT} rows, local"
    rows = []
    try:
        for q, sql in (("count", COUNT), ("agg", AGG)):
            fns = {"on": lambda sql=sql: on["wh"].sql(sql),
                   "off": lambda sql=sql: off["wh"].sql(sql),
                   "defaults": lambda sql=sql: dflt["wh"].sql(sql),
                   "settled": lambda sql=sql: settled["wh"].sql(sql),
                   "compacted": lambda sql=sql: comp["wh"].sql(sql)}
            if lake is not None:
                fns["lake"] = lambda sql=sql: lake.time(sql.replace("FROM ev", "FROM lake.ev"))
            got = _interleaved(fns)
            m = {k: v[0] for k, v in got.items()}
            low = {k: v[1] for k, v in got.items()}
            label = "count(*)" if q == "count" else "5-group aggregate"
            base = m.get("lake")

            def vs_lake(what: str, key: str, note: str) -> Row:
                """One contender's median against DuckLake+inlining's (same runs)."""
                return Row(
                    f"{label} after small commits, {what}", work, f"{m[key] * 1000:.1f} ms",
                    f"DuckLake+inlining {base * 1000:.1f} ms" if base else
                    "DuckLake unavailable", round(base / m[key], 2) if base else None,
                    ">= 1x (<= DuckLake time)", (m[key] <= base) if base else None,
                    f"median of 15, interleaved (min: ours {low[key] * 1000:.1f}, DuckLake "
                    f"{low.get('lake', 0) * 1000:.1f} ms); {note}; one file "
                    f"{m['compacted'] * 1000:.1f} ms (min {low['compacted'] * 1000:.1f})")

            rows.append(vs_lake(
                "inlining on", "on",
                f"inline off {m['off'] * 1000:.1f} ms; {on['data_files']} data files + "
                f"{on['inlined']} inlined appends (off: {off['data_files']} files; DuckLake: "
                f"{lake.files if lake else '-'} files)"))
            rows.append(vs_lake(
                "default settings", "defaults",
                "no inlining, the server's maintenance worker at its defaults ran during the "
                f"commits: {dflt['live_files']} live data files at the end"))
            rows.append(vs_lake(
                "default settings, after the worker's next tick", "settled",
                "as above, the worker finishing one more tick after the last commit: "
                f"{settled['live_files']} live data files"))
    finally:
        if lake is not None:
            lake.close()
    rows.append(Row(
        "metadata bytes per 10-row commit, inlining on", work,
        f"{on['meta_per_commit'] / 1024:.1f} KiB",
        f"inline off {off['meta_per_commit'] / 1024:.1f} KiB",
        None, "<= 4 KiB (issue 35)", on["meta_per_commit"] <= 4096,
        f"commits/s (Table.append): inline on {on['commits_per_s']:.0f}, off "
        f"{off['commits_per_s']:.0f}"
        + (f"; DuckLake INSERT {lake.commits_per_s:.0f}" if lake else "")))
    return rows

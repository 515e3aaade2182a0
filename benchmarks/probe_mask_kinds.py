"""Issue 33: the two deletion-mask extension kinds side by side, in process.

``python -m benchmarks.probe_mask_kinds [--rows N] [--rounds R]``

The same table (``bench_peers.make_events``: N rows x 5 columns in 4 files) in two layouts,
DuckLake's (Snappy, 122,880-row groups, ``row_group_bytes`` as ``bench_masked`` sets it) and
flightsrv's default (``compression=auto``), with 1% and then 10% of the rows deleted at
random. For each layout, interleaved (the order rotated each round: the read after another
one of the same files runs faster), medians of R rounds, wall and process CPU (two DuckDB
threads):

- ``clean``: DuckDB's own ``read_parquet`` of the same files on a plain connection;
- ``engine clean``: the engine (default kind) at the version before the deletes;
- ``scan 1%`` / ``filter 1%``: ``DuckEngine(mask_extension="scan" | "filter")`` with 1% deleted;
- ``scan 10%`` / ``filter 10%``: the same with 10% deleted;

for ``SELECT count(*), sum(value)``, and the point query ``SELECT * WHERE id = <k>`` (p50 of
41 ids) on the 1%-deleted version against the engine at the clean version. Ratios are to
``clean`` (aggregate) and to ``engine clean`` (point). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.bench_peers import make_events


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    from flightsrv.engine import DuckEngine, Session
    from flightsrv.warehouse import Warehouse

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    n = args.rows
    data = make_events(n)
    rng = np.random.default_rng(7)
    tmp = tempfile.mkdtemp(prefix="probe-mask-kinds-")
    wh = Warehouse.open(os.path.join(tmp, "wh"))
    layouts = {
        "DuckLake's layout (Snappy, 122,880-row groups)":
            {"row_group_bytes": str(int(122_880 * data.nbytes / n)), "compression": "snappy"},
        "flightsrv's default layout": {},
    }
    session = Session("bench")
    engines = {k: DuckEngine(wh, mask_extension=k, threads=2) for k in ("scan", "filter")}
    for k, e in engines.items():
        assert e.mask_slots is not None and e.mask_slots.kind == k, k
    print(f"{n:,} rows x 5 columns, 4 files; medians of {args.rounds}; 2 threads; "
          f"load {os.getloadavg()[0]:.1f}")
    print()
    print("| layout | read | aggregate wall | / clean | aggregate CPU | / clean |")
    print("|---|---|---|---|---|---|")
    points = [int(i) for i in rng.integers(0, n, 41)]
    point_rows = []
    try:
        for li, (layout, props) in enumerate(layouts.items()):
            name = f"events{li}"
            t = wh.create_table(name, data.schema, props)
            step = n // 4
            for a in range(0, n, step):
                t.append(data.slice(a, step))
            v_clean = t.head().version
            ids = rng.choice(n, n // 100, replace=False)
            more = rng.choice(np.setdiff1d(np.arange(n), ids), 9 * n // 100, replace=False)
            e0 = engines["scan"]
            for j, chosen in enumerate((ids, more)):
                subj = wh.create_table(f"subj{li}_{j}", pa.schema([("id", pa.int64())]))
                subj.append(pa.table({"id": np.sort(chosen)}))
                e0.execute_update(f"DELETE FROM {name} WHERE id IN (SELECT id FROM "
                                  f"subj{li}_{j})", session)
                if j == 0:
                    v1 = t.head().version
            v10 = t.head().version
            files = [t.store.local_path(f.path) for f in t.head().data_files]
            raw = duckdb.connect(config={"threads": "2"})
            agg = "SELECT count(*), sum(value) FROM {src}"
            lst = "[" + ", ".join(f"'{p}'" for p in files) + "]"

            def eng(e, at):
                sql = agg.format(src=f"{name} AT (VERSION => {at})")
                return lambda: e.execute_query(sql, session).reader.read_all()

            runs = {
                "clean (DuckDB read_parquet)":
                    lambda: raw.execute(agg.format(src=f"read_parquet({lst})")).fetchall(),
                "engine, no deletes": eng(e0, v_clean),
                "scan kind, 1% deleted": eng(engines["scan"], v1),
                "filter kind, 1% deleted": eng(engines["filter"], v1),
                "scan kind, 10% deleted": eng(engines["scan"], v10),
                "filter kind, 10% deleted": eng(engines["filter"], v10),
            }
            counts = {k: (f() if k.startswith("clean") else f().column(0)[0].as_py())
                      for k, f in runs.items()}
            assert counts["scan kind, 1% deleted"] == counts["filter kind, 1% deleted"] \
                == n - len(ids), counts
            wall = {k: [] for k in runs}
            cpu = {k: [] for k in runs}
            order = list(runs)
            for r in range(args.rounds):
                for k in order[r % len(order):] + order[:r % len(order)]:  # rotated
                    f = runs[k]
                    c0, t0 = _cpu(), time.perf_counter()
                    f()
                    wall[k].append(time.perf_counter() - t0)
                    cpu[k].append(_cpu() - c0)
            base_w = statistics.median(wall["clean (DuckDB read_parquet)"])
            base_c = statistics.median(cpu["clean (DuckDB read_parquet)"])
            for k in runs:
                w, c = statistics.median(wall[k]), statistics.median(cpu[k])
                print(f"| {layout} | {k} | {w * 1000:.1f} ms | {w / base_w:.2f}x | "
                      f"{c * 1000:.1f} ms | {c / base_c:.2f}x |")
            # point queries
            pt = {"engine, no deletes": (e0, v_clean), "scan kind, 1% deleted":
                  (engines["scan"], v1), "filter kind, 1% deleted": (engines["filter"], v1)}
            lat = {k: [] for k in pt}
            order = list(pt)
            for r, i in enumerate(points):
                for k in order[r % len(order):] + order[:r % len(order)]:  # rotated
                    e, at = pt[k]
                    sql = f"SELECT * FROM {name} AT (VERSION => {at}) WHERE id = {i}"
                    t0 = time.perf_counter()
                    e.execute_query(sql, session).reader.read_all()
                    lat[k].append(time.perf_counter() - t0)
            base = statistics.median(lat["engine, no deletes"])
            for k in pt:
                m = statistics.median(lat[k])
                point_rows.append(f"| {layout} | {k} | {m * 1000:.1f} ms | {m / base:.2f}x |")
            raw.close()
    finally:
        for e in engines.values():
            e.close()
    print()
    print("| layout | point `SELECT * WHERE id = k` | p50 | / no deletes |")
    print("|---|---|---|---|")
    for r in point_rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 13: how local files with deleted rows are read, each ``DuckEngine(masked_scans=...)``
mode against the others and against the same files without deletes, in one run.

Data: ``bench_peers.make_events`` (n = 1M small, 10M full) appended as 4 files with DuckDB's
row-group size (122,880 rows, Snappy, as in ``bench_peers``); then 1% of the ids, chosen at
random, are deleted (one ``DELETE ... WHERE id IN (SELECT id FROM subjects)``), so every row
group holds deleted rows. The "no deletes" baseline is the same files at the version before
the delete (time travel), read by DuckDB's ``read_parquet`` as clean files.

Modes (in process, no Flight, so only the read path differs):

- ``arrow``: flightsrv's masked Arrow scan (the path before issue 13's masked read);
- ``filtered`` (the default): DuckDB's ``read_parquet`` with the deleted rows anti-joined
  inside DuckDB when the reference has a prunable filter, else the Arrow scan;
- ``duckdb``: DuckDB's reader with the anti join always;
- ``mask`` (issue 33): ``prefetch`` with the deletion-mask extension: every other file with
  deleted rows read by DuckDB's reader with its mask applied per vector on
  ``file_row_number`` (:mod:`flightsrv.engine.maskext`). The other modes run with the
  extension off (``mask_extension=False``), as before it.

Queries: a point ``SELECT * WHERE id = <random>`` (p50 over random ids), ``count(*)`` of a
1,000-id ``IN`` list, ``count(*), sum(value)`` over 20% of the id range, and over the whole
table (no filter). Rounds are interleaved across the modes and the baseline.

``FLIGHTSRV_BENCH_MASKED=aggregate`` runs only the no-filter aggregate (modes ``arrow``,
``prefetch``, ``mask`` and the baseline) and the parallelism rows: a quicker run on a
loaded machine.

Two more rows (issue 33's goals), from the no-filter aggregate's interleaved rounds: the
``mask`` engine at a later version where a further 9% of the ids are deleted (about 10% in
all) against the same files without deletes (goal <= 1.5x), and the engine over the files
without deletes against DuckDB's own ``read_parquet`` of the same files on a plain
connection with the engine's Parquet settings (the engine's own overhead; goal <= 1.05x).
Every contender reads at an explicit version (``AT (VERSION => v)``).

Parallelism (:func:`_parallel`): the ``mask`` engine and the clean baseline again with
DuckDB's ``threads`` set to 1 and to 2, the no-filter aggregate and the same aggregate over
one file (``WHERE id < n/4``: only the first file's masked branch reads rows at
``--scale full``; at ``small`` the four 250k-row files share one branch), where a
barrier that serialised the scan
would show), interleaved; besides the wall times, the share of the busiest OS thread in the
process's CPU time per query (Linux ``/proc/self/task``): about 0.5 when two threads share
the scan, near 1.0 when one thread does it. A ``limit`` contender (2 threads) runs the
``mask`` path with the barrier used before (each file's masked subquery ending in
``LIMIT 9223372036854775807`` instead of followed by ``relations.BARRIER``) for comparison.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import pyarrow as pa

from benchmarks.bench_peers import DUCKDB_ROW_GROUP, _label, load, make_events
from benchmarks.harness import Context, Row, mb

NAME = "masked"
MODES = ("arrow", "prefetch", "filtered", "duckdb", "mask")


def run(ctx: Context) -> list[Row]:
    from flightsrv.engine import DuckEngine, Session
    from flightsrv.warehouse import Warehouse

    n = ctx.rows(1_000_000, 10_000_000)
    data = make_events(n)
    rng = np.random.default_rng(7)
    wh = Warehouse.open(ctx.tempdir("masked-wh"))
    props = {"row_group_bytes": str(int(DUCKDB_ROW_GROUP * data.nbytes / n)),
             "compression": "snappy"}
    t = wh.create_table("events", data.schema, props)
    step = n // 4
    for a in range(0, n, step):
        t.append(data.slice(a, step))
    v_clean = t.head().version
    subjects = wh.create_table("subjects", pa.schema([("id", pa.int64())]))
    subject_ids = np.sort(rng.choice(n, n // 100, replace=False))
    subjects.append(pa.table({"id": subject_ids}))
    more = wh.create_table("subjects10", pa.schema([("id", pa.int64())]))
    rest = np.setdiff1d(np.arange(n), subject_ids)
    more.append(pa.table({"id": np.sort(rng.choice(rest, 9 * n // 100, replace=False))}))
    files = t.head().data_files
    workload = (f"{_label(n)}, 5 cols, {len(files)} files, "
                f"{sum(f.row_groups for f in files)} row groups, snappy, "
                f"{mb(sum(f.size for f in files))}, 1% deleted at random")
    session = Session("bench")
    engines = {m: DuckEngine(wh, masked_scans=m, mask_extension=False)
               for m in MODES if m != "mask"}
    engines["mask"] = DuckEngine(wh, masked_scans="prefetch", mask_extension=True)
    if engines["mask"].mask_slots is None:
        raise RuntimeError("the deletion-mask extension did not load (see the log)")
    try:
        engines["arrow"].execute_update(
            "DELETE FROM events WHERE id IN (SELECT id FROM subjects)", session)
        v1 = t.head().version
        engines["arrow"].execute_update(
            "DELETE FROM events WHERE id IN (SELECT id FROM subjects10)", session)
        v10 = t.head().version
        in_list = ", ".join(str(int(i)) for i in rng.choice(n, 1000, replace=False))
        queries = {
            "point `SELECT * WHERE id = ?` (p50)": None,
            "`count(*) WHERE id IN (<1,000 ids>)`":
                f"SELECT count(*) FROM events{{at}} WHERE id IN ({in_list})",
            "`count(*), sum(value) WHERE id BETWEEN` 20% of the range":
                f"SELECT count(*), sum(value) FROM events{{at}} WHERE id BETWEEN {n // 10} "
                f"AND {3 * n // 10}",
            "`count(*), sum(value)` (no filter)": "SELECT count(*), sum(value) FROM events{at}",
        }
        points = [int(i) for i in rng.integers(0, n, 41)]
        modes = MODES
        if os.environ.get("FLIGHTSRV_BENCH_MASKED") == "aggregate":
            queries = {k: v for k, v in queries.items() if "no filter" in k}
            modes = ("arrow", "prefetch", "mask")
        contenders = {m: (engines[m], f" AT (VERSION => {v1})") for m in modes}
        contenders["clean"] = (engines["arrow"], f" AT (VERSION => {v_clean})")
        raw = _raw_duckdb([t.store.local_path(f.path) for f in files])

        def go(engine, sql):
            if engine is None:
                raw.execute(sql).fetchall()
            else:
                engine.execute_query(sql, session).reader.read_all()

        rows = []
        for label, sql in queries.items():
            extra = {}
            if "no filter" in label:  # ~10% deleted; the engine's overhead without deletes
                extra = {"mask10": (engines["mask"], f" AT (VERSION => {v10})"),
                         "mask_clean": (engines["mask"], f" AT (VERSION => {v_clean})"),
                         "raw": (None, "")}
            times: dict[str, list[float]] = {c: [] for c in {**contenders, **extra}}
            for r in range(len(points) if sql is None else 7):
                for c, (engine, at) in {**contenders, **extra}.items():
                    q = (f"SELECT * FROM events{at} WHERE id = {points[r]}" if sql is None
                         else sql.format(at=at) if engine is not None
                         else sql.format(at="").replace("FROM events", "FROM clean_files"))
                    t0 = time.perf_counter()
                    go(engine, q)
                    times[c].append(time.perf_counter() - t0)
            med = {c: statistics.median(ts[1:]) for c, ts in times.items()}  # first warms
            base = med["arrow"]
            for m in (m for m in modes if m != "arrow"):
                rows.append(Row(
                    f"masked read `{m}` vs `arrow`", f"{workload}; {label}",
                    f"{med[m] * 1000:.1f} ms",
                    f"Arrow scan (`arrow`) {base * 1000:.1f} ms; same files without deletes "
                    f"{med['clean'] * 1000:.1f} ms", med[m] / base, "< 1.0x", med[m] < base,
                    f"in process; vs no deletes {med[m] / med['clean']:.2f}x (`arrow`: "
                    f"{base / med['clean']:.2f}x); median of {len(times[m]) - 1}, "
                    f"interleaved; load {load()}"))
            if extra:
                ratio = med["mask10"] / med["clean"]
                rows.append(Row(
                    "masked read `mask`, ~10% deleted, vs no deletes",
                    f"{workload.replace('1% deleted', '10% deleted')}; {label}",
                    f"{med['mask10'] * 1000:.1f} ms",
                    f"same files without deletes {med['clean'] * 1000:.1f} ms", ratio,
                    "<= 1.5x", ratio <= 1.5,
                    f"in process; 1% deleted: {med['mask'] / med['clean']:.2f}x; median of "
                    f"{len(times['mask10']) - 1}, interleaved; load {load()}"))
                ratio = med["mask_clean"] / med["raw"]
                rows.append(Row(
                    "engine over files without deletes vs DuckDB `read_parquet`",
                    f"{workload.replace(', 1% deleted at random', '')}; {label}",
                    f"{med['mask_clean'] * 1000:.1f} ms",
                    f"DuckDB `read_parquet` of the same files {med['raw'] * 1000:.1f} ms",
                    ratio, "<= 1.05x", ratio <= 1.05,
                    f"in process (`mask` engine, no deletes at that version; DuckDB on a "
                    f"plain connection with the engine's Parquet settings); median of "
                    f"{len(times['raw']) - 1}, interleaved; load {load()}"))
        raw.close()
        rows += _parallel(wh, session, n, v_clean, v1, workload)
        return rows
    finally:
        for e in engines.values():
            e.close()


def _raw_duckdb(paths: list[str]):
    """A plain DuckDB connection with the engine's Parquet settings (metadata cache, no
    prefetching) and a view ``clean_files`` over ``paths``."""
    import duckdb

    con = duckdb.connect()
    for stmt in ("SET enable_progress_bar=false", "SET parquet_metadata_cache=true",
                 "SET disable_parquet_prefetching=true"):
        con.execute(stmt)
    con.execute(f"CREATE VIEW clean_files AS SELECT * FROM read_parquet({paths!r})")
    return con


def _thread_cpu() -> dict[str, int]:
    """CPU ticks (user + system) of each thread of this process."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[t] = int(fields[11]) + int(fields[12])
    return out


def _parallel(wh, session, n: int, v_clean: int, v1: int, workload: str) -> list[Row]:
    from flightsrv.engine import DuckEngine
    from flightsrv.engine import relations

    engines = {(kind, th): DuckEngine(wh, masked_scans="prefetch", mask_extension=True,
                                      threads=th)
               for kind in ("mask", "clean") for th in (1, 2)}
    engines[("limit", 2)] = DuckEngine(wh, masked_scans="prefetch", mask_extension=True,
                                       threads=2)
    cmask_part = relations._cmask_part

    def limit_part(*a, **k):  # the shape before: the LIMIT inside each masked subquery
        return cmask_part(*a, **k).replace(
            f") AS __fsrv_m {relations.BARRIER}", " LIMIT 9223372036854775807) AS __fsrv_m")

    linux = os.path.isdir("/proc/self/task")
    rows = []
    try:
        for label, where in (("all 4 files", ""), ("one file", f" WHERE id < {n // 4}")):
            walls: dict = {k: [] for k in engines}
            shares: dict = {k: [] for k in engines}
            for _ in range(9):
                for (kind, th), engine in engines.items():
                    at = f" AT (VERSION => {v_clean if kind == 'clean' else v1})"
                    sql = f"SELECT count(*), sum(value) FROM events{at}{where}"
                    relations._cmask_part = limit_part if kind == "limit" else cmask_part
                    before = _thread_cpu() if linux else {}
                    t0 = time.perf_counter()
                    try:
                        engine.execute_query(sql, session).reader.read_all()
                    finally:
                        relations._cmask_part = cmask_part
                    walls[(kind, th)].append(time.perf_counter() - t0)
                    if linux:
                        after = _thread_cpu()
                        ticks = [after[t] - before.get(t, 0) for t in after]
                        if sum(ticks):
                            shares[(kind, th)].append(max(ticks) / sum(ticks))
            med = {k: statistics.median(v[1:]) for k, v in walls.items()}
            share = {k: statistics.median(v[1:]) if len(v) > 1 else float("nan")
                     for k, v in shares.items()}
            ratio = med[("mask", 2)] / med[("mask", 1)]
            rows.append(Row(
                "masked read `mask`, threads 2 vs 1", f"{workload}; `count(*), sum(value)`, "
                f"{label}", f"{med[('mask', 2)] * 1000:.1f} ms at 2 threads",
                f"{med[('mask', 1)] * 1000:.1f} ms at 1 thread", ratio, "< 1.0x", ratio < 1.0,
                f"busiest thread's CPU share {share[('mask', 2)]:.2f} at 2 threads "
                f"({share[('mask', 1)]:.2f} at 1); the LIMIT barrier at 2 threads: "
                f"{med[('limit', 2)] * 1000:.1f} ms, share {share[('limit', 2)]:.2f}; clean files: "
                f"{med[('clean', 2)] * 1000:.1f} vs {med[('clean', 1)] * 1000:.1f} ms, share "
                f"{share[('clean', 2)]:.2f}; masked vs clean at 2 threads "
                f"{med[('mask', 2)] / med[('clean', 2)]:.2f}x; median of 8, interleaved; "
                f"load {load()}"))
        return rows
    finally:
        for e in engines.values():
            e.close()

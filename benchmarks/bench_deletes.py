"""Deletes: latency vs table size and vs peers, masked-scan overhead, requests per delete.

Data: ``benchmarks.bench_core.make_data`` (``id`` sorted 0..n-1, ``x`` random int64, ``u``
uniform, ``s`` string), appended with ``Table.append`` on the local store.

- **delete latency**: ``Table.delete("id IN (<1,000 random ids>)")`` (scattered: every row
  group holds some) on a smaller and a larger table; median of 3, each run deleting a fresh id
  set. Ratio = larger / smaller (goal: within 1.5x). A second row deletes a clustered id range
  of 1,000 rows (``id BETWEEN a AND a+999``), which statistics prune to one row group.
- **vs deltalake / pyiceberg**: the same data written by ``deltalake.write_deltalake`` and by
  pyiceberg (SQLite catalog), and the same kind of 1,000-id delete
  (``DeltaTable.delete("id in (...)")``, ``Table.delete(In("id", ids))``). Both rewrite the
  touched files (copy-on-write). Ratio = peer / ours (goal for deltalake: >= 50x).
- **scan overhead**: count and sum of ``x`` through ``Snapshot.scan(columns=["x"])`` (summed
  with pyarrow.compute) at versions with 0.1%, 1% and 10% of rows deleted (``u < p``, so the
  positions are random) vs the version before the deletes: the very same data files, by time
  travel. The same through ``DuckEngine.execute_query("SELECT count(*), sum(x) FROM t AT
  (VERSION => n)")``. Ratio = masked / unmasked time (lower is better; goal <= 1.10x at 1%).
- **requests per delete**: the store wrapped in ``CountingStore``; writes vs the seed design's
  budget (1 DV object + 1 manifest + 1 pointer write).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.bench_core import make_data, rows_label
from benchmarks.harness import Context, Row

NAME = "deletes"
DELETE_ROWS = 1000


def _in_list(ids) -> str:
    return "id IN (" + ",".join(str(int(i)) for i in ids) + ")"


def _scattered(rng, n: int):
    return np.sort(rng.choice(n, DELETE_ROWS, replace=False))


def _timed_cpu(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``fn()``; CPU covers every thread of this process and
    is steadier than wall time on a shared, loaded machine."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))


def _interleaved(fns: dict, repeat: int) -> tuple[dict, dict]:
    """Median wall and CPU seconds per contender, runs interleaved."""
    samples: dict = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            samples[k].append(_timed_cpu(fn))
    med = {k: _medians(v) for k, v in samples.items()}
    return {k: m[0] for k, m in med.items()}, {k: m[1] for k, m in med.items()}


def _median_delete(table, n: int, rng, repeat: int,
                   clustered: bool = False) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        if clustered:
            a = int(rng.integers(0, n - DELETE_ROWS))
            pred = f"id BETWEEN {a} AND {a + DELETE_ROWS - 1}"
        else:
            pred = _in_list(_scattered(rng, n))
        got = []
        times.append(_timed_cpu(lambda p=pred, got=got: got.append(table.delete(p))))
        # fresh random sets may overlap earlier ones by a few rows
        assert DELETE_ROWS * 0.9 <= got[0] <= DELETE_ROWS, got
    return _medians(times)


def bench_latency(ctx: Context, wh, sizes, datas, repeat: int) -> tuple[list[Row], dict]:
    rng = np.random.default_rng(7)
    scattered, clustered = {}, {}
    for n in sizes:
        t = wh.create_table(f"del_{n}", datas[n].schema)
        t.append(datas[n])
        t.delete("id = -1")  # warm-up (self-check, imports); deletes nothing
        scattered[n] = _median_delete(t, n, rng, repeat)
        clustered[n] = _median_delete(t, n, rng, repeat, clustered=True)
    small, large = sizes
    rows = []
    for label, res in (("scattered, id IN list", scattered), ("clustered, id BETWEEN", clustered)):
        ratio = res[large][0] / res[small][0]
        rows.append(Row(f"delete latency, 1,000 rows ({label})",
                        f"{rows_label(large)} vs {rows_label(small)}",
                        f"{res[large][0] * 1000:.0f} ms at {rows_label(large)}",
                        f"{res[small][0] * 1000:.0f} ms at {rows_label(small)}", ratio,
                        "<= 1.5x (larger/smaller)", ratio <= 1.5,
                        f"median of {repeat}; ratio lower is better; CPU "
                        f"{res[large][1] * 1000:.0f} vs {res[small][1] * 1000:.0f} ms "
                        f"({res[large][1] / res[small][1]:.2f}x)"))
    return rows, scattered


def bench_deltalake(ctx: Context, data: pa.Table, ours: tuple, repeat: int) -> Row:
    n = data.num_rows
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError as exc:
        return Row("delete vs deltalake", rows_label(n), "skipped", "-", None,
                   note=f"deltalake not installed: {exc}")
    import deltalake

    path = ctx.tempdir("del-delta")
    write_deltalake(path, data)
    rng = np.random.default_rng(11)
    times = []
    for _ in range(repeat):
        pred = "id in (" + ",".join(str(int(i)) for i in _scattered(rng, n)) + ")"
        dt = DeltaTable(path)
        times.append(_timed_cpu(lambda dt=dt, p=pred: dt.delete(p)))
    peer, peer_cpu = _medians(times)
    shutil.rmtree(path, ignore_errors=True)
    ratio = peer / ours[0]
    return Row(f"delete 1,000 scattered rows vs deltalake {deltalake.__version__}", rows_label(n),
               f"{ours[0] * 1000:.0f} ms", f"DeltaTable.delete {peer * 1000:.0f} ms", ratio,
               ">= 50x faster", ratio >= 50,
               f"median of {repeat}; peer rewrites the touched file(s); ratio = peer/ours; "
               f"CPU {ours[1] * 1000:.0f} vs {peer_cpu * 1000:.0f} ms "
               f"({peer_cpu / ours[1]:.2f}x)")


def bench_pyiceberg(ctx: Context, data: pa.Table, ours: tuple, repeat: int) -> Row:
    n = data.num_rows
    try:
        import pyiceberg
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.expressions import In
    except ImportError as exc:
        return Row("delete vs pyiceberg", rows_label(n), "skipped", "-", None,
                   note=f"pyiceberg[sql-sqlite] not installed ({type(exc).__name__}); it "
                        "needs SQLAlchemy 2, which the test extra excludes: use a virtualenv "
                        "without .[test]")
    path = ctx.tempdir("del-iceberg")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cat = SqlCatalog("bench", uri=f"sqlite:///{path}/catalog.db",
                             warehouse=f"file://{path}/wh")
            cat.create_namespace("b")
            tbl = cat.create_table("b.t", schema=data.schema)
            tbl.append(data)
            rng = np.random.default_rng(13)
            times = []
            for _ in range(repeat):
                ids = [int(i) for i in _scattered(rng, n)]
                tbl = cat.load_table("b.t")
                times.append(_timed_cpu(lambda tbl=tbl, ids=ids: tbl.delete(
                    delete_filter=In("id", ids))))
    except Exception as exc:  # noqa: BLE001 (a failing peer must not sink our rows)
        return Row("delete vs pyiceberg", rows_label(n), "skipped", "-", None,
                   note=f"pyiceberg failed: {type(exc).__name__}: {str(exc)[:80]}")
    finally:
        shutil.rmtree(path, ignore_errors=True)
    peer, peer_cpu = _medians(times)
    ratio = peer / ours[0]
    return Row(f"delete 1,000 scattered rows vs pyiceberg {pyiceberg.__version__} (SQLite "
               f"catalog)", rows_label(n), f"{ours[0] * 1000:.0f} ms",
               f"Table.delete {peer * 1000:.0f} ms", ratio, "", None,
               f"median of {repeat}; copy-on-write; ratio = peer/ours; CPU "
               f"{ours[1] * 1000:.0f} vs {peer_cpu * 1000:.0f} ms ({peer_cpu / ours[1]:.2f}x)")


def bench_requests(ctx: Context, data: pa.Table) -> Row:
    from flightsrv.store import open_store
    from flightsrv.store.faults import CountingStore
    from flightsrv.warehouse import Warehouse

    uri = ctx.tempdir("del-count")
    store = CountingStore(open_store(uri))
    wh = Warehouse(store)
    wh.ensure_writable()
    n = data.num_rows
    t = wh.create_table("counted", data.schema)
    t.append(data)
    rng = np.random.default_rng(17)
    # the warehouse's first delete also creates its erasure key (_flightsrv-keys/, once per
    # warehouse): counted apart, so the figure is what every later delete writes
    store.reset()
    t.delete(_in_list(_scattered(rng, n)))
    first = sum(v for k, v in store.counts.items() if k in ("put", "put_file", "adopt"))
    pred = _in_list(_scattered(rng, n))
    store.reset()
    got = t.delete(pred)
    counts = {k: v for k, v in store.counts.items() if k not in ("local_path", "uri")}
    writes = sum(v for k, v in counts.items() if k in ("put", "put_file", "adopt", "upload_part",
                                                        "complete_multipart", "delete"))
    detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    shutil.rmtree(uri, ignore_errors=True)
    return Row("requests per delete (1,000 scattered rows)",
               f"{rows_label(n)}, {len(t.head().data_files)} data file(s), {got} rows deleted",
               f"{writes} writes", "budget 3 writes (DV object, manifest, pointer)",
               3 / writes if writes else None, "<= 3 writes", writes <= 3,
               f"the second delete of the warehouse; all calls: {detail} (the first wrote "
               f"{first}: it also creates the warehouse's erasure key); data files are read "
               f"through mmap (local_path), not counted")


def bench_scan_overhead(ctx: Context, wh, data: pa.Table, repeat: int) -> list[Row]:
    from flightsrv.engine.api import Session
    from flightsrv.engine.duck import DuckEngine

    n = data.num_rows
    t = wh.create_table("masked", data.schema)
    t.append(data)
    base_v = t.head().version
    versions = {}
    for frac in (0.001, 0.01, 0.1):
        t.delete(f"u < {frac}")
        versions[frac] = t.head().version

    def via_scan(v):
        snap = t.snapshot(version=v)

        def go():
            count, total = 0, 0
            for b in snap.scan(columns=["x"]):
                count += b.num_rows
                total += pc.sum(b.column(0)).as_py() or 0
            return count, total
        return go

    engine = DuckEngine(wh)
    session = Session("bench")

    def via_engine(v):
        sql = f"SELECT count(*), sum(x) FROM masked AT (VERSION => {v})"

        def go():
            return engine.execute_query(sql, session).reader.read_all()
        return go

    rows = []
    for path_name, make in (("Snapshot.scan + pyarrow.compute", via_scan),
                            ("DuckEngine SELECT count(*), sum(x)", via_engine)):
        fns = {"none": make(base_v), **{f: make(v) for f, v in versions.items()}}
        assert fns["none"]()[0] if path_name.startswith("Snapshot") else True
        for f in fns.values():
            f()  # warm
        wall, cpu = _interleaved(fns, repeat)
        for frac in versions:
            ratio = wall[frac] / wall["none"]
            goal = "<= 1.10x" if frac == 0.01 else ""
            rows.append(Row(f"scan overhead, {frac:.1%} deleted ({path_name})",
                            f"{rows_label(n)}, {len(t.head().data_files)} file(s)",
                            f"{wall[frac] * 1000:.1f} ms",
                            f"same files, no deletes {wall['none'] * 1000:.1f} ms", ratio, goal,
                            ratio <= 1.10 if goal else None,
                            f"median of {repeat}, interleaved; ratio = masked/unmasked, "
                            f"lower is better; CPU {cpu[frac] * 1000:.0f} vs "
                            f"{cpu['none'] * 1000:.0f} ms ({cpu[frac] / cpu['none']:.2f}x)"))
    engine.close()
    return rows


def run(ctx: Context) -> list[Row]:
    from flightsrv.warehouse import Warehouse

    sizes = (ctx.rows(100_000, 1_000_000), ctx.rows(1_000_000, 10_000_000))
    datas = {n: make_data(n) for n in sizes}
    wh = Warehouse.open(ctx.tempdir("del-wh"))
    rows, scattered = bench_latency(ctx, wh, sizes, datas, repeat=3)
    large = sizes[1]
    peer_repeat = 2 if ctx.full else 3
    rows.append(bench_deltalake(ctx, datas[large], scattered[large], peer_repeat))
    rows.append(bench_pyiceberg(ctx, datas[large], scattered[large], peer_repeat))
    rows.append(bench_requests(ctx, datas[large]))
    for n in sizes[:1]:
        wh.drop_table(f"del_{n}")
    rows.extend(bench_scan_overhead(ctx, wh, datas[large], repeat=5 if ctx.full else 11))
    shutil.rmtree(os.path.join(ctx.workdir, "del-wh"), ignore_errors=True)
    return rows

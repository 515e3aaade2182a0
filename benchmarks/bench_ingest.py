"""Streaming ingest (issue 35): many small appends, and reads over what they leave behind.

Table ``ev (id BIGINT, ts TIMESTAMP, k VARCHAR, v DOUBLE)``; row ``i`` is
``(i, 2026-01-01 + i s, 'k' || i % 5, (i % 1000) / 10)`` (:func:`events`).

**Writes** (``flightsrv serve`` in its own process at default settings, the redacted
statement log included, on a local warehouse, so its CPU time can be read from ``/proc``;
each writer its own process with its own ADBC connection, appending for a fixed time):
1 / 4 / 16 writers x appends of 1 / 100 / 10,000 rows, by

- **ingest**: ``cursor.adbc_ingest`` of an Arrow batch (Flight SQL DoPut ingest);
- **INSERT VALUES**: ``INSERT INTO ev VALUES (...), ...`` as text (string literals for the
  timestamps, as BI tools and Kafka sinks write it);
- **executemany**: ``INSERT INTO ev VALUES (?, ?, ?, ?)`` with the rows as one parameter
  batch (one DoPut).

Figures: statements/s, rows/s, p50/p99 latency, the table versions made per second (the
group commit merges concurrent appends into one version), server CPU per row. Baseline:
DuckDB 2.0 in process inserting the same rows into a DuckDB table (INSERT VALUES text for
INSERT VALUES; ``INSERT ... SELECT`` from Arrow for the others), CPU per row.

**Reads after N commits of 10 rows** (N = 100, 1,000; 10,000 at ``--scale full``): the
commits go through the Python API (the same commit as the server's), then through ADBC:
``count(*)``, a 5-group aggregate, a point lookup, and the newest minute; median of 5.
Beside them, in the same run: the same rows in one commit (compacted), DuckLake 1.5.5 in
process (``DATA_INLINING_ROW_LIMIT`` 10 and 0, same rows and commits) and deltalake
(``write_deltalake`` appends, read with its ``QueryBuilder``). Peers run in process, ours
through the server, so the peers have no RPC in their times. Also: the metadata bytes
(chunks, root manifest, pointer) each commit writes, averaged over the last 256 commits
before N (one period of the chunk tree's binary counter).

Writers' time per round: ``FLIGHTSRV_BENCH_SECONDS`` (default 2 small, 5 full). A smaller
matrix: ``FLIGHTSRV_BENCH_METHODS`` (e.g. ``ingest``), ``FLIGHTSRV_BENCH_ROWS`` (``1,100``),
``FLIGHTSRV_BENCH_WRITERS`` (``1,16``), ``FLIGHTSRV_BENCH_INGEST`` (``writes`` or
``reads``).
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import resource
import statistics
import time
import warnings

import pyarrow as pa

from benchmarks.bench_concurrency import _cpu_seconds, _free_port, _serve, _stop
from benchmarks.bench_peers import DuckLake
from benchmarks.harness import Context, Row

NAME = "ingest"
EPOCH = dt.datetime(2026, 1, 1)
SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us")), ("k", pa.string()),
                    ("v", pa.float64())])
DDL = "CREATE TABLE ev (id BIGINT, ts TIMESTAMP, k VARCHAR, v DOUBLE)"
METHODS = ("ingest", "INSERT VALUES", "executemany")


def events(start: int, rows: int) -> pa.Table:
    ids = pa.array(range(start, start + rows), pa.int64())
    ts = pa.array([EPOCH + dt.timedelta(seconds=i) for i in range(start, start + rows)],
                  pa.timestamp("us"))
    return pa.table({"id": ids, "ts": ts, "k": [f"k{i % 5}" for i in range(start, start + rows)],
                     "v": [(i % 1000) / 10 for i in range(start, start + rows)]}, schema=SCHEMA)


def values_sql(start: int, rows: int, table: str = "ev") -> str:
    return f"INSERT INTO {table} VALUES " + ", ".join(
        f"({i}, '{EPOCH + dt.timedelta(seconds=i)}', 'k{i % 5}', {(i % 1000) / 10})"
        for i in range(start, start + rows))


# -- writes ---------------------------------------------------------------------------------


def _writer(target: str, method: str, rows: int, seconds: float, barrier, base: int,
            out) -> None:
    try:
        _write_loop(target, method, rows, seconds, barrier, base, out)
    except BaseException as exc:  # always answer: the parent waits for every writer
        barrier.abort()
        out.put(([], 1, f"{type(exc).__name__}: {str(exc)[:160]}", time.time()))


def _write_loop(target: str, method: str, rows: int, seconds: float, barrier,
                base: int, out) -> None:
    from adbc_driver_flightsql import dbapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn = dbapi.connect(target, autocommit=True)
    cur = conn.cursor()
    lat: list[float] = []
    errors, first_error = 0, ""
    k = 0
    barrier.wait(timeout=300)  # every writer connected: the clock starts for all at once
    deadline = time.perf_counter() + seconds
    while True:
        start = base + k * rows
        k += 1
        if method == "INSERT VALUES":
            payload = values_sql(start, rows)
        else:
            payload = events(start, rows)
        t0 = time.perf_counter()
        try:
            if method == "ingest":
                cur.adbc_ingest("ev", payload, mode="append")
            elif method == "INSERT VALUES":
                cur.execute(payload)
            else:
                cur.executemany("INSERT INTO ev VALUES (?, ?, ?, ?)", payload)
            lat.append(time.perf_counter() - t0)
        except Exception as exc:  # counted: refusals under load are a figure
            errors += 1
            first_error = first_error or f"{type(exc).__name__}: {str(exc)[:160]}"
            cur = conn.cursor()  # a failed ingest leaves its cursor unusable
        if time.perf_counter() >= deadline:
            break
    try:
        cur.close()
        conn.close()
    except Exception:
        pass
    out.put((lat, errors, first_error, time.time()))


def _write_round(target: str, uri: str, server_pid: int, method: str, writers: int, rows: int,
                 seconds: float, base: int) -> dict:
    from flightsrv import Warehouse

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(writers + 1)
    procs = [ctx.Process(target=_writer, args=(target, method, rows, seconds, barrier,
                                               base + w * 10**7, q)) for w in range(writers)]
    for p in procs:
        p.start()
    v0 = Warehouse.open(uri).table("ev").head().version
    barrier.wait(timeout=300)
    t0 = time.time()
    cpu0 = _cpu_seconds(server_pid)
    results = [q.get(timeout=seconds + 300) for _ in procs]
    cpu = _cpu_seconds(server_pid) - cpu0
    elapsed = max(r[3] for r in results) - t0  # to the end of the last append
    for p in procs:
        p.join(timeout=30)
    v1 = Warehouse.open(uri).table("ev").head().version
    lat = sorted(x for r in results for x in r[0])
    done = len(lat)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

    return {"sps": done / elapsed, "rps": done * rows / elapsed, "p50": pct(0.5),
            "p99": pct(0.99), "versions_s": (v1 - v0) / elapsed, "done": done,
            "errors": sum(r[1] for r in results),
            "first_error": next((r[2] for r in results if r[2]), ""),
            "cpu_row_us": cpu / (done * rows) * 1e6 if done else float("nan")}


def _ints(var: str, default: tuple) -> tuple:
    """A comma-separated list of integers from the environment (a smaller matrix)."""
    got = [int(x) for x in os.environ.get(var, "").split(",") if x.strip()]
    return tuple(got) or default


def _duckdb_cpu_per_row(method: str, rows: int) -> float:
    """DuckDB 2.0's own INSERT of the same rows, CPU microseconds per row (median of 3)."""
    import duckdb

    con = duckdb.connect()
    con.execute(DDL)
    out = []
    for k in range(3):
        if method == "INSERT VALUES":
            sql = values_sql(k * rows, rows)
        else:
            con.register("batch", events(k * rows, rows))
            sql = "INSERT INTO ev SELECT * FROM batch"
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        con.execute(sql)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / rows * 1e6)
    con.close()
    return statistics.median(out)


def _writes(ctx: Context, seconds: float) -> list[Row]:
    from flightsrv import Warehouse

    uri = ctx.tempdir("ingest-writes")
    Warehouse.open(uri).sql(DDL)
    port = _free_port()
    log_path = os.path.join(ctx.workdir, "ingest-server.log")
    server = _serve(uri, port, log_path, 1, log_statements=None)  # default: redacted
    target = f"grpc://127.0.0.1:{port}"
    rows_out: list[Row] = []
    found: dict = {}
    ducks: dict = {}  # (method, rows) -> DuckDB CPU per row, measured once
    base = 0
    try:
        _write_round(target, uri, server.pid, "ingest", 1, 1, 0.5, 0)  # warm up
        methods = [m for m in METHODS if m in os.environ.get(
            "FLIGHTSRV_BENCH_METHODS", ",".join(METHODS)).split(",")]
        sizes = _ints("FLIGHTSRV_BENCH_ROWS", (1, 100, 10_000))
        counts = _ints("FLIGHTSRV_BENCH_WRITERS", (1, 4, 16))
        for method in methods:
            for rows in sizes:
                duck = ducks[(method, rows)] = _duckdb_cpu_per_row(method, rows)
                for writers in counts:
                    if rows == 10_000 and writers == 16 and not ctx.full:
                        continue
                    base += 10**8  # ids (and seconds since 2026) of this round
                    r = _write_round(target, uri, server.pid, method, writers, rows, seconds,
                                     base)
                    if server.poll() is not None:
                        tail = open(log_path).read()[-4000:]
                        raise RuntimeError(f"the server exited during {method}: {tail}")
                    found[(method, rows, writers)] = r
                    ratio = r["cpu_row_us"] / duck if duck > 0 else None
                    err = (f"; {r['errors']} errors ({r['first_error']})" if r["errors"]
                           else "")
                    goal, met = "", None
                    if method == "INSERT VALUES" and rows == 10_000 and writers == 1:
                        goal, met = "<= 0.5 s per statement", r["p50"] <= 500
                    elif method == "INSERT VALUES" and rows == 100 and writers == 4:
                        goal, met = ">= 50 statements/s", r["sps"] >= 50
                    rows_out.append(Row(
                        f"{method}, {rows:,} row(s) per append, {writers} writer(s)",
                        f"{seconds:.0f} s, {r['done']} statements",
                        f"{r['sps']:.1f} stmt/s ({r['rps']:,.0f} rows/s), p50 {r['p50']:.0f} "
                        f"ms, p99 {r['p99']:.0f} ms; {r['versions_s']:.1f} versions/s; server "
                        f"CPU {r['cpu_row_us']:.1f} us/row",
                        f"DuckDB 2.0 INSERT in process, CPU {duck:.2f} us/row", ratio, goal, met,
                        "ratio = server CPU per row / DuckDB CPU per row (lower is better)"
                        + err))
        for method in methods:
            if (method, 1, 1) not in found or (method, 1, 16) not in found:
                continue
            one, many = found[(method, 1, 1)], found[(method, 1, 16)]
            ratio = many["sps"] / one["sps"] if one["sps"] else None
            rows_out.append(Row(
                f"group commit: 1-row {method}, 16 writers vs 1", "same run",
                f"{many['sps']:.1f} appends/s in {many['versions_s']:.1f} versions/s, p99 "
                f"{many['p99']:.0f} ms", f"1 writer {one['sps']:.1f} appends/s, p99 "
                f"{one['p99']:.0f} ms", ratio,
                ">= 1.0x, p99 <= 250 ms" if method == "ingest" else "",
                (ratio is not None and ratio >= 1.0 and many["p99"] <= 250)
                if method == "ingest" else None, "ratio = appends/s at 16 / at 1"))
        cpu_goal = found.get(("INSERT VALUES", 10_000, 1))
        duck = ducks.get(("INSERT VALUES", 10_000))
        if cpu_goal is not None and duck:
            # judged against the DuckDB figure of the 10,000-row row above (one measurement)
            ratio = cpu_goal["cpu_row_us"] / duck
            rows_out.append(Row("INSERT VALUES server CPU per row vs DuckDB",
                                "10,000 rows, 1 writer",
                                f"{cpu_goal['cpu_row_us']:.1f} us/row",
                                f"DuckDB {duck:.2f} us/row (the row above)", ratio, "<= 3x",
                                ratio <= 3, "server CPU per row / DuckDB CPU per row"))
    finally:
        _stop(server)
    return rows_out


# -- reads after many small commits ------------------------------------------------------------


class _Counting:
    """Counts bytes put per top-level prefix (chunks, manifest, the pointer)."""

    def __init__(self, inner):
        self._inner = inner
        self.bytes: dict[str, int] = {}

    def put(self, key, data, **kw):
        top = key.split("/", 1)[0]
        self.bytes[top] = self.bytes.get(top, 0) + len(data)
        return self._inner.put(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _queries(n_rows: int) -> dict[str, str]:
    newest = EPOCH + dt.timedelta(seconds=n_rows - 60)
    return {
        "count": "SELECT count(*) FROM {t}",
        "aggregate": "SELECT k, count(*), sum(v), min(ts), max(ts) FROM {t} GROUP BY k "
                     "ORDER BY k",
        "point": f"SELECT * FROM {{t}} WHERE id = {n_rows // 3}",
        "newest minute": f"SELECT count(*), avg(v) FROM {{t}} WHERE ts >= TIMESTAMP "
                         f"'{newest}'",
    }


class _Lake(DuckLake):
    """The streaming-ingest DuckLake worker (``ducklake_ingest_worker.py``) over ``d``."""

    def __init__(self, d: str, inline: int):
        super().__init__("ducklake_ingest_worker.py")
        os.makedirs(d, exist_ok=True)
        self.dir = d
        self.call(cmd="setup", dir=d, inline=inline)


def _median_time(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _reads(ctx: Context) -> list[Row]:
    from flightsrv import Warehouse

    checkpoints = [100, 1_000] + ([10_000] if ctx.full else [])
    uri = ctx.tempdir("ingest-reads")
    wh = Warehouse.open(uri)
    t = wh.create_table("ev", SCHEMA)
    counting = _Counting(t.store)
    t.store = counting
    t.log.store = counting
    t.log.chunks.store = counting
    peers: dict[str, object] = {}
    notes: list[str] = []
    for label, inline in (("DuckLake (inlining 10 rows)", 10), ("DuckLake (no inlining)", 0)):
        try:
            peers[label] = _Lake(ctx.tempdir(f"ingest-lake-{inline}"), inline)
        except Exception as exc:  # noqa: BLE001 - a missing peer is a note, not a failure
            notes.append(f"{label} skipped: {exc}")
    try:
        import deltalake
        from deltalake import write_deltalake

        delta_path = ctx.tempdir("ingest-delta")
    except Exception as exc:  # noqa: BLE001
        deltalake = None
        notes.append(f"deltalake skipped: {exc}")
    rows: list[Row] = []
    done = 0
    write_s: dict[str, float] = {"flightsrv": 0.0, "deltalake": 0.0}
    try:
        for n in checkpoints:
            before = dict(counting.bytes)
            # the bytes a commit writes repeat with a period of 256 commits (the binary
            # counter of PROTOCOL.md §14.2 writes a full leaf every 256th): average over one
            # whole period, not over a window that may or may not hold that leaf
            tail_from = max(done, n - 256)
            for c in range(done, n):
                if c == tail_from:
                    before = dict(counting.bytes)
                batch = events(c * 10, 10)
                t0 = time.perf_counter()
                t.append(batch)
                write_s["flightsrv"] += time.perf_counter() - t0
                if deltalake is not None:
                    t0 = time.perf_counter()
                    write_deltalake(delta_path, batch, mode="append")
                    write_s["deltalake"] += time.perf_counter() - t0
            for label, lake in peers.items():
                ans = lake.call(cmd="commits", n=n - done, rows=10, start=done * 10)
                write_s[label] = write_s.get(label, 0.0) + ans["seconds"]
            meta = {k: counting.bytes.get(k, 0) - before.get(k, 0) for k in counting.bytes}
            per_commit = sum(meta.values()) / (n - tail_from)
            rows.append(Row(f"metadata bytes per 10-row commit, at {n:,} commits",
                            f"last {n - tail_from} commits",
                            f"{per_commit / 1024:.1f} KiB/commit", "-", None, "<= 4 KiB",
                            per_commit <= 4096, "; ".join(
                                f"{k} {v / (n - tail_from) / 1024:.1f} KiB"
                                for k, v in sorted(meta.items()))))
            done = n
            rows.extend(_read_round(ctx, uri, n, peers, delta_path if deltalake else None,
                                    write_s))
    finally:
        for lake in peers.values():
            lake.close()
    for note in notes:
        rows.append(Row("reads after small commits: peer", "-", "skipped", "-", None, note=note))
    return rows


def _read_round(ctx: Context, uri: str, n: int, peers: dict, delta_path: str | None,
                write_s: dict) -> list[Row]:
    from adbc_driver_flightsql import dbapi

    from flightsrv import Warehouse

    n_rows = n * 10
    wh = Warehouse.open(uri)
    name = f"evc{n}"
    wh.create_table(name, SCHEMA).append(events(0, n_rows))  # the same rows, one commit
    port = _free_port()
    server = _serve(uri, port, os.path.join(ctx.workdir, f"ingest-reads-{n}.log"), 1)
    times: dict[str, dict[str, float]] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
        cur = conn.cursor()

        def ours(sql):
            def go():
                cur.execute(sql)
                cur.fetchall()
            return go

        for q, sql in _queries(n_rows).items():
            ours(sql.format(t="ev"))()  # first statement: imports, footers
            times.setdefault("flightsrv", {})[q] = _median_time(ours(sql.format(t="ev")))
            times.setdefault("compacted", {})[q] = _median_time(ours(sql.format(t=name)))
            for label, lake in peers.items():
                times.setdefault(label, {})[q] = lake.call(
                    cmd="time", sql=sql.format(t="lake.ev"), repeat=5)["seconds"]
            if delta_path is not None:
                from deltalake import DeltaTable, QueryBuilder

                dt_ = DeltaTable(delta_path)

                def delta():
                    QueryBuilder().register("ev", dt_).execute(sql.format(t="ev")).read_all()
                times.setdefault("deltalake", {})[q] = _median_time(delta)
        cur.close()
        conn.close()
    finally:
        _stop(server)
    out = []
    for q in _queries(n_rows):
        ours_s, comp = times["flightsrv"][q], times["compacted"][q]
        peer_txt = "; ".join(f"{label} {v[q] * 1000:.1f} ms" for label, v in times.items()
                             if label not in ("flightsrv", "compacted"))
        lake = times.get("DuckLake (inlining 10 rows)", {}).get(q)
        goal, met = "", None
        if q in ("count", "aggregate") and n >= 10_000:
            goal = "<= 2x compacted and <= DuckLake inlined"
            met = ours_s <= 2 * comp and (lake is None or ours_s <= lake)
        out.append(Row(f"{q} after {n:,} commits of 10 rows", f"{n_rows:,} rows",
                       f"{ours_s * 1000:.1f} ms (ADBC)",
                       f"same rows compacted {comp * 1000:.1f} ms",
                       ours_s / comp if comp else None, goal, met,
                       f"ratio = after commits / compacted; in-process peers: {peer_txt}"))
    writes = "; ".join(f"{k} {v / n * 1000:.1f} ms" for k, v in write_s.items())
    out.append(Row(f"10-row commit, mean over {n:,} commits", "1 writer, in process",
                   f"flightsrv {write_s['flightsrv'] / n * 1000:.1f} ms", writes, None,
                   note="Python API Table.append (ours), write_deltalake, DuckLake INSERT"))
    return out


def run(ctx: Context) -> list[Row]:
    seconds = float(os.environ.get("FLIGHTSRV_BENCH_SECONDS", 5 if ctx.full else 2))
    only = os.environ.get("FLIGHTSRV_BENCH_INGEST", "writes,reads").split(",")
    rows: list[Row] = []
    if "writes" in only:
        rows.extend(_writes(ctx, seconds))
    if "reads" in only:
        rows.extend(_reads(ctx))
    return rows

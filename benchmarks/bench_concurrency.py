"""Many clients at once: does the server use the whole machine? (issue 32)

Data: ``bench_peers.make_events`` (``id`` 0..n-1, ``user_id``, ``event_time``, ``value``, a
24-char ``payload``; 1M rows small, 10M full) appended twice to a local warehouse, as ``clean``
and as ``masked``, where 1% of the rows (random ids) are then deleted by deletion vector.

The server is ``flightsrv serve`` in its own process at default settings (so its CPU time can
be read from ``/proc``); each client is its own process with its own ADBC connection and
runs one workload in a loop for a fixed time:

- **point**: ``SELECT * FROM clean WHERE id = ?`` with a random id (ADBC prepares, binds,
  executes, fetches and closes: the full round trip a BI tool makes);
- **aggregate (clean)**: ``SELECT count(*), sum(value) FROM clean``;
- **aggregate (1% deleted)**: the same over ``masked``.

Baseline, in the same run: the same number of client processes, each with its own
in-process DuckDB connection, running the same statements over ``read_parquet`` of the very
same data files (for the masked aggregate: the clean files, i.e. what the query costs with
no deletes at all). Figures per workload and number of clients: queries/s, p50 and p99
latency, errors, and CPU seconds per statement (the server process's for flightsrv, the
client processes' own for DuckDB). Ratio = flightsrv q/s / DuckDB q/s.

Knobs: ``FLIGHTSRV_BENCH_CLIENTS`` (e.g. ``1,4,8``), ``FLIGHTSRV_BENCH_SECONDS`` per round,
``FLIGHTSRV_BENCH_WORKERS`` (``serve --workers N``, default 1; the server's CPU is then the
parent's and all its workers' and fronts') and ``FLIGHTSRV_BENCH_WORKLOADS`` (names from
``WORKLOADS``, comma-separated, e.g. ``point``) and ``FLIGHTSRV_BENCH_SERVE_ARGS`` (more
``flightsrv serve`` options, split by spaces, e.g. ``--threads 2``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
import warnings

import numpy as np

from benchmarks.harness import Context, Row

NAME = "concurrency"
ROW_GROUP_BYTES = 2 << 20
WORKLOADS = {
    "point": ("SELECT * FROM {t} WHERE id = ?", "clean"),
    "aggregate (clean)": ("SELECT count(*), sum(value) FROM {t}", "clean"),
    "aggregate (1% deleted)": ("SELECT count(*), sum(value) FROM {t}", "masked"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, its live descendants (``--workers``) and their reaped
    children, from /proc (Linux)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    tree, ticks = {pid}, 0
    grew = True
    while grew:
        grew = False
        for p, (ppid, _) in stats.items():
            if ppid in tree and p not in tree:
                tree.add(p)
                grew = True
    ticks = sum(stats[p][1] for p in tree if p in stats)
    return ticks / os.sysconf("SC_CLK_TCK")


def _client(kind: str, target: str, sql: str, n_rows: int, seconds: float, start_at: float,
            seed: int, out) -> None:
    """One client process: run ``sql`` until the deadline; report latencies and CPU."""
    rng = random.Random(seed)
    params = "?" in sql
    lat: list[float] = []
    errors = 0
    first_error = ""
    if kind == "flightsrv":
        from adbc_driver_flightsql import dbapi

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            conn = dbapi.connect(target, autocommit=True)
        cur = conn.cursor()

        def run(args):
            cur.execute(sql, args) if args else cur.execute(sql)
            cur.fetch_arrow_table()
    else:
        import duckdb

        conn = duckdb.connect()
        cur = conn

        def run(args):
            # the relation API: a DB-API result's Arrow output copies the rows once more
            (conn.sql(sql, params=list(args)) if args else conn.sql(sql)).to_arrow_table()
    while time.time() < start_at:
        time.sleep(0.005)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        args = (rng.randrange(n_rows),) if params else None
        try:
            run(args)
            lat.append(time.perf_counter() - t0)
        except Exception as exc:  # counted, not fatal: refusals under load are a figure
            errors += 1
            first_error = first_error or f"{type(exc).__name__}: {str(exc)[:160]}"
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    try:
        if cur is not conn:
            cur.close()
        conn.close()
    except Exception:
        pass
    out.put((lat, errors, first_error, cpu))


def _round(kind: str, target: str, sql: str, n_rows: int, clients: int, seconds: float,
           server_pid: int | None) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 2.0 + 0.1 * clients  # every client connected before the clock
    procs = [ctx.Process(target=_client, args=(kind, target, sql, n_rows, seconds, start_at,
                                               1000 * clients + i, q)) for i in range(clients)]
    for p in procs:
        p.start()
    while time.time() < start_at:
        time.sleep(0.01)
    srv0 = _cpu_seconds(server_pid) if server_pid else 0.0
    results = [q.get(timeout=seconds + 120) for _ in procs]
    srv1 = _cpu_seconds(server_pid) if server_pid else 0.0
    for p in procs:
        p.join(timeout=30)
    lat = sorted(x for r in results for x in r[0])
    done = len(lat)
    errors = sum(r[1] for r in results)
    cpu = (srv1 - srv0) if server_pid else sum(r[3] for r in results)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

    return {"qps": done / seconds, "p50": pct(0.50), "p99": pct(0.99), "errors": errors,
            "first_error": next((r[2] for r in results if r[2]), ""),
            "cpu_per_stmt_ms": cpu / done * 1000 if done else float("nan"), "done": done}


def _prepare(ctx: Context, n: int) -> tuple[str, dict[str, list[str]]]:
    from benchmarks.bench_peers import make_events
    from flightsrv import Warehouse

    uri = ctx.tempdir("concurrency")
    wh = Warehouse.open(uri)
    data = make_events(n)
    files: dict[str, list[str]] = {}
    for name in ("clean", "masked"):
        props = {"row_group_bytes": str(ROW_GROUP_BYTES)}
        if os.environ.get("FLIGHTSRV_BENCH_COMPRESSION"):  # the table default otherwise
            props["compression"] = os.environ["FLIGHTSRV_BENCH_COMPRESSION"]
        t = wh.create_table(name, data.schema, props)
        for batch in data.to_batches(max_chunksize=max(1, n // 4)):
            t.append(batch)
        files[name] = [t.store.local_path(f.path) for f in t.head().data_files]
    rng = np.random.default_rng(7)
    gone = rng.choice(n, n // 100, replace=False)
    t = wh.table("masked")
    t.delete(f"id IN ({','.join(str(int(i)) for i in gone)})")
    return uri, files


def _serve(uri: str, port: int, log_path: str, workers: int,
           log_statements: str | None = "off") -> subprocess.Popen:
    """``log_statements``: the ``--log-statements`` mode; None: the server's default."""
    log = open(log_path, "w")
    mode = [] if log_statements is None else ["--log-statements", log_statements]
    mode += os.environ.get("FLIGHTSRV_BENCH_SERVE_ARGS", "").split()
    proc = subprocess.Popen([sys.executable, "-m", "flightsrv.cli", "--warehouse", uri, "serve",
                             "--no-demo", "--port", str(port), *mode,
                             "--workers", str(workers)],
                            stdout=subprocess.DEVNULL, stderr=log, text=True,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # the "serving" line: every worker is up
        if "flightsrv: serving" in open(log_path).read():
            return proc
        if proc.poll() is not None:
            raise RuntimeError("flightsrv serve exited before it listened")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("flightsrv serve did not listen within 120 s")


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server started by :func:`_serve` and its workers (one session)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    server.wait(timeout=60)


def run(ctx: Context) -> list[Row]:
    n = ctx.rows(1_000_000, 10_000_000)
    counts = [int(x) for x in os.environ.get("FLIGHTSRV_BENCH_CLIENTS", "").split(",") if x] or (
        [1, 4, 16, 32] if ctx.full else [1, 4, 8])
    seconds = float(os.environ.get("FLIGHTSRV_BENCH_SECONDS", 10 if ctx.full else 3))
    workers = int(os.environ.get("FLIGHTSRV_BENCH_WORKERS", "1"))
    only = [w for w in os.environ.get("FLIGHTSRV_BENCH_WORKLOADS", "").split(",") if w]
    workloads = {k: v for k, v in WORKLOADS.items() if not only or k in only}
    uri, files = _prepare(ctx, n)
    port = _free_port()
    log_path = os.path.join(ctx.workdir, "concurrency-server.log")
    server = _serve(uri, port, log_path, workers)
    setting = "server at default settings" + (f", --workers {workers}" if workers > 1 else "")
    target = f"grpc://127.0.0.1:{port}"
    rows: list[Row] = []
    found: dict[tuple[str, int], dict] = {}
    try:
        for label, (sql, table) in workloads.items():
            ours_sql = sql.format(t=table)
            file_list = ", ".join(f"'{p}'" for p in files["clean"])
            duck_sql = sql.format(t=f"read_parquet([{file_list}])")
            # warm both once (first statement costs the imports and the footers)
            _round("flightsrv", target, ours_sql, n, 1, 0.5, server.pid)
            for k in counts:
                ours = _round("flightsrv", target, ours_sql, n, k, seconds, server.pid)
                if server.poll() is not None:  # a crash is a result, never a zero
                    tail = open(log_path).read()[-12000:]
                    raise RuntimeError(f"the server exited ({server.returncode}) during "
                                       f"{label} with {k} clients; its log ends:\n{tail}")
                duck = _round("duckdb", "", duck_sql, n, k, seconds, None)
                found[(label, k)] = ours
                ratio = ours["qps"] / duck["qps"] if duck["qps"] else None
                err = (f"; {ours['errors']} errors (first: {ours['first_error']})"
                       if ours["errors"] else "")
                rows.append(Row(
                    f"{label}, {k} client process(es)", f"{n // 1_000_000}M rows x 5 cols, "
                    f"{seconds:.0f} s, {setting}",
                    f"{ours['qps']:.0f} q/s, p50 {ours['p50']:.1f} ms, p99 {ours['p99']:.1f} ms, "
                    f"server CPU {ours['cpu_per_stmt_ms']:.2f} ms/stmt",
                    f"DuckDB in process {duck['qps']:.0f} q/s, p50 {duck['p50']:.1f} ms, "
                    f"CPU {duck['cpu_per_stmt_ms']:.2f} ms/stmt",
                    ratio, note=f"ratio = flightsrv q/s / DuckDB q/s; CPU ratio "
                    f"{ours['cpu_per_stmt_ms'] / duck['cpu_per_stmt_ms']:.2f}x{err}"
                    + (f"; DuckDB errors {duck['errors']} ({duck['first_error']})"
                       if duck["errors"] else "")))
        for k in counts if len(workloads) == len(WORKLOADS) else ():
            clean, masked = found[("aggregate (clean)", k)], found[("aggregate (1% deleted)", k)]
            if clean["qps"]:
                rows.append(Row(f"1%-deleted aggregate vs clean, {k} client(s)", "same run",
                                f"{masked['qps']:.0f} q/s", f"clean {clean['qps']:.0f} q/s",
                                masked["qps"] / clean["qps"], ">= 0.8x" if k >= 16 else "",
                                (masked["qps"] / clean["qps"] >= 0.8) if k >= 16 else None,
                                "ratio = masked q/s / clean q/s"))
        if 1 in counts and len(counts) > 1 and "point" in workloads:
            kmax = max(c for c in counts if c <= 8) if any(c > 1 for c in counts if c <= 8) \
                else max(counts)
            p1, pk = found[("point", 1)], found[("point", kmax)]
            rows.append(Row(f"point queries: scaling from 1 to {kmax} clients", "same run",
                            f"{pk['qps'] / p1['qps']:.2f}x", "-", None,
                            note="q/s at k clients / q/s at 1 client (compare with DuckDB's "
                                 "rows above)"))
    finally:
        _stop(server)
    return rows

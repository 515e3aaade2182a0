"""CPU per point query: the work outside DuckDB for one statement (issue 32).

Not a timed test: a profile to run before and after a change to the statement path.

    python -m benchmarks.profile_statement [--rows 1000000] [--queries 300] [--profile]

Data: ``benchmarks.bench_core.make_data`` (``id`` 0..n-1 sorted, ``x``, ``u``, ``s``) in a
local warehouse with 2 MiB row groups (as ``bench_server``). Each figure is process CPU
seconds (user + system, every thread) per statement, over ``--queries`` statements
``SELECT * FROM t WHERE id = ?`` with random ids, after a warm-up, the best of
``--repeat`` interleaved rounds; DuckDB runs ``--threads`` threads (default 1) everywhere:

- **DuckDB in process**: the same statement on a plain DuckDB connection over the same
  Parquet files (``read_parquet([...]) WHERE id = ?``), fetched as Arrow: the baseline.
- **Engine execute_query**: ``DuckEngine.execute_query(sql, session, params)``, read whole.
- **Engine as ADBC drives it**: ``prepare(sql)`` (CreatePreparedStatement),
  ``prepare(sql, params)`` (GetFlightInfo after the DoPut bind), ``execute_query`` (DoGet).
- **of which outside DuckDB**: the previous line's work up to handing DuckDB its text (two
  prepares, and one execution's parse, bind, pins, plan and guard), without registering the
  views or running anything: the per-statement Python work issue 32 wants under 1 ms.
- **Server through ADBC**: a server in a child process on 127.0.0.1, one ADBC connection
  running ``cursor.execute(sql, parameters=[id])`` + ``fetchall()``; the figure is the
  server process's CPU (``/proc/<pid>/stat``) per statement, wall p50 beside it.

``--profile`` prints the top of a cProfile of the ADBC-shaped engine path.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa

SQL = "SELECT * FROM t WHERE id = ?"
ROW_GROUP_BYTES = 2 << 20


def _params(i: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([int(i)], pa.int64())], names=["0"])


def _cpu_per(fn, ids) -> float:
    t0 = time.process_time()
    for i in ids:
        fn(int(i))
    return (time.process_time() - t0) / len(ids)


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_SERVER = """
import sys
from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.server import start_in_thread
engine = DuckEngine(Warehouse.open(sys.argv[1]), threads=int(sys.argv[2]))
server, port = start_in_thread(engine)
print(port, flush=True)
sys.stdin.read()
server.shutdown()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--threads", type=int, default=1,
                    help="DuckDB threads, for the baseline and the engines alike (1: the "
                         "figures are the statement's work, not idle threads spinning)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds, best kept")
    args = ap.parse_args()

    import duckdb

    from benchmarks.bench_core import data_paths, make_data
    from flightsrv import Warehouse
    from flightsrv.engine import DuckEngine, Session

    n, k = args.rows, args.queries
    rng = np.random.default_rng(7)
    ids = rng.integers(0, n, k)
    with tempfile.TemporaryDirectory() as tmp:
        wh = Warehouse.open(tmp)
        t = wh.create_table("t", make_data(n).schema, {"row_group_bytes": str(ROW_GROUP_BYTES)})
        t.append(make_data(n))
        files = "[" + ",".join(f"'{p}'" for p in data_paths(t)) + "]"

        duck = duckdb.connect()
        duck.execute("SET enable_progress_bar=false")
        duck.execute(f"SET threads={args.threads}")
        base_sql = f"SELECT * FROM read_parquet({files}) WHERE id = ?"

        def baseline(i):
            duck.sql(base_sql, params=[i]).to_arrow_table()

        engine = DuckEngine(wh, threads=args.threads)
        session = Session("profile")

        def execute(i):
            engine.execute_query(SQL, session, _params(i)).reader.read_all()

        def adbc_shaped(i):
            engine.prepare(SQL, session)
            p = _params(i)
            engine.prepare(SQL, session, p)
            engine.execute_query(SQL, session, p).reader.read_all()

        from flightsrv.engine import duck as duckmod
        from flightsrv.sql import plan as sqlplan

        stmt = duckmod._parse(SQL)

        def outside(i):
            """The statement path up to handing DuckDB its text, as an ADBC point query
            takes it: two prepares (answered from the engine's caches) and one execution's
            parse, pins, plan (kept or made) and guard; no registration, no DuckDB run."""
            engine.prepare(SQL, session)
            p = _params(i)
            engine.prepare(SQL, session, p)
            values = engine._param_rows(duckmod._parse(SQL), p)[0]
            pinner = engine._pinner()
            qp = engine._kept_plan(stmt, pinner, values) \
                if hasattr(engine, "_kept_plan") else None
            if qp is None:
                tree = sqlplan.bind_params(stmt.tree, values, SQL, stmt.param_count)
                qp = engine._plan(duckmod._literal_if_lossy(stmt, values), tree, "query",
                                  pinner)
            engine._verify(qp, SQL, {})
            duckmod._native_params(values)

        for fn in (baseline, execute, adbc_shaped, outside):
            for i in ids[:20]:
                fn(int(i))
        rows = {}
        for _ in range(args.repeat):  # interleaved, best kept
            for name, fn in (("DuckDB in process", baseline),
                             ("Engine execute_query", execute),
                             ("Engine prepare+prepare(params)+execute", adbc_shaped),
                             ("  of which outside DuckDB (parse..plan, guard)", outside)):
                rows[name] = min(rows.get(name, 1e9), _cpu_per(fn, ids))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for i in ids:
                adbc_shaped(int(i))
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
        engine.close()

        # the server imports the flightsrv this process imported
        root = os.path.dirname(os.path.dirname(sys.modules["flightsrv"].__file__))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        proc = subprocess.Popen([sys.executable, "-c", _SERVER, tmp, str(args.threads)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env)
        try:
            port = int(proc.stdout.readline())
            from adbc_driver_flightsql import dbapi

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                conn = dbapi.connect(f"grpc://127.0.0.1:{port}")
            with conn.cursor() as cur:
                for i in ids[:20]:
                    cur.execute(SQL, parameters=[int(i)])
                    cur.fetchall()
                lat = []
                server_cpu = 1e9
                for _ in range(args.repeat):
                    c0 = _proc_cpu(proc.pid)
                    for i in ids:
                        t0 = time.perf_counter()
                        cur.execute(SQL, parameters=[int(i)])
                        assert len(cur.fetchall()) == 1
                        lat.append(time.perf_counter() - t0)
                    server_cpu = min(server_cpu, (_proc_cpu(proc.pid) - c0) / k)
            conn.close()
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)

    base = rows["DuckDB in process"]
    print(f"rows={n} queries={k} cores={os.cpu_count()} duckdb threads={args.threads} "
          f"duckdb={duckdb.__version__}")
    print(f"{'path':45s} {'CPU ms/stmt':>12s} {'x DuckDB':>9s}")
    for name, v in rows.items():
        print(f"{name:45s} {v * 1000:12.2f} {v / base:9.2f}")
    print(f"{'Server through ADBC (server process CPU)':45s} {server_cpu * 1000:12.2f} "
          f"{server_cpu / base:9.2f}   wall p50 {statistics.median(lat) * 1000:.1f} ms")


if __name__ == "__main__":
    main()

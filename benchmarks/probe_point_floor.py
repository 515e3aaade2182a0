"""Issue 32, the one-client point p50: where the latency budget of one ADBC execute goes.

``python -m benchmarks.probe_point_floor [--rows N] [--queries Q] [--rounds R] [--workers N]``

The goal compares flightsrv's p50 for ``SELECT * FROM t WHERE id = ?`` (one ADBC client,
prepared once, then bind + execute + fetch per query) with in-process DuckDB's p50 for the
same statement over the same files: ours <= 1.5 x DuckDB's + 2 ms. Part of any Flight SQL
server's p50 is the protocol and the client, which DuckDB in process never pays. This probe
measures that floor beside the real thing, interleaved, on one machine:

- ``floor``: a Flight SQL server that does no work at all (``pyarrow.flight``; it answers
  CreatePreparedStatement, the DoPut bind, GetFlightInfo and DoGet with one constant row of
  the table's schema), driven by the same ADBC client loop: the three RPCs per execute and
  the client's own CPU;
- ``flightsrv trivial``: ``flightsrv serve`` answering ``SELECT CAST(? AS BIGINT)``: the
  server's own per-statement path with next to no DuckDB work;
- ``flightsrv point``: ``flightsrv serve`` answering the point query;
- ``flightsrv point, --no-early-runs``: the same on a server whose prepared queries start at
  their DoGet instead of their bind (docs/SERVER.md, "Early runs");
- ``duckdb point``: in-process DuckDB, the point query over ``read_parquet`` of the very same
  files (the relation API, fetched as Arrow), as ``bench_concurrency`` runs it;
- with ``--workers N``, ``flightsrv point, --workers N``: the point query on a second server
  of N workers behind their relays (the hop ``--workers`` adds to every connection).

Each figure: p50 and p90 wall per query, the client's CPU per query, and the server
process tree's CPU per query (from ``/proc``). The data is ``bench_concurrency``'s: 1M rows x 5
columns in 4 files of 2 MiB row groups. Not a timed test; the numbers go to RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import pyarrow as pa
import pyarrow.flight as fl

from benchmarks.bench_concurrency import _cpu_seconds

PARAM_SCHEMA = pa.schema([("p", pa.int64())])


def _floor_server(schema: pa.Schema) -> fl.FlightServerBase:
    from flightsrv.server import metadata as md
    from flightsrv.server import proto

    row = pa.table({f.name: pa.array([None], f.type) for f in schema}, schema=schema)

    class Floor(fl.FlightServerBase):
        def do_action(self, context, action):
            req = proto.unpack(action.body.to_pybytes())
            if isinstance(req, proto.ActionCreatePreparedStatementRequest):
                res = proto.ActionCreatePreparedStatementResult(
                    prepared_statement_handle=b"h",
                    dataset_schema=schema.serialize().to_pybytes(),
                    parameter_schema=PARAM_SCHEMA.serialize().to_pybytes())
                return [fl.Result(proto.pack(res))]
            return []

        def do_put(self, context, descriptor, reader, writer):
            for _ in reader:
                pass

        def get_flight_info(self, context, descriptor):
            cmd = proto.unpack(descriptor.command)
            if isinstance(cmd, proto.CommandGetSqlInfo):  # the driver asks once at connect
                return fl.FlightInfo(md.SQL_INFO_SCHEMA, descriptor,
                                     [fl.FlightEndpoint(b"info", [])], -1, -1)
            return fl.FlightInfo(schema, descriptor, [fl.FlightEndpoint(b"row", [])], -1, -1)

        def do_get(self, context, ticket):
            if ticket.ticket == b"info":
                return fl.RecordBatchStream(md.SQL_INFO_SCHEMA.empty_table())
            return fl.RecordBatchStream(row)

    return Floor("grpc://127.0.0.1:0")


def _serve_floor(schema_path: str) -> None:
    with open(schema_path, "rb") as f:
        schema = pa.ipc.read_schema(pa.py_buffer(f.read()))
    server = _floor_server(schema)
    print(server.port, flush=True)
    server.serve()


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _adbc_loop(port: int, sql: str, rows: int, n: int, server_pid: int) -> dict:
    from adbc_driver_flightsql import dbapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn = dbapi.connect(f"grpc://127.0.0.1:{port}", autocommit=True)
    cur = conn.cursor()
    rng = random.Random(7)
    for _ in range(max(20, n // 10)):  # warm: prepared once, caches filled
        cur.execute(sql, (rng.randrange(rows),))
        cur.fetch_arrow_table()
    lat = []
    s0, c0 = _cpu_seconds(server_pid), _own_cpu()
    for _ in range(n):
        t0 = time.perf_counter()
        cur.execute(sql, (rng.randrange(rows),))
        cur.fetch_arrow_table()
        lat.append(time.perf_counter() - t0)
    s1, c1 = _cpu_seconds(server_pid), _own_cpu()
    cur.close()
    conn.close()
    return _figures(lat, (c1 - c0) / n, (s1 - s0) / n)


def _duckdb_loop(files: list[str], rows: int, n: int) -> dict:
    import duckdb

    con = duckdb.connect()
    sql = f"SELECT * FROM read_parquet({files!r}) WHERE id = $1"
    rng = random.Random(7)
    for _ in range(max(20, n // 10)):
        con.sql(sql, params=[rng.randrange(rows)]).to_arrow_table()
    lat = []
    c0 = _own_cpu()
    for _ in range(n):
        t0 = time.perf_counter()
        con.sql(sql, params=[rng.randrange(rows)]).to_arrow_table()
        lat.append(time.perf_counter() - t0)
    cpu = (_own_cpu() - c0) / n
    con.close()
    return _figures(lat, cpu, 0.0)


def _figures(lat: list[float], client_cpu: float, server_cpu: float) -> dict:
    lat = sorted(lat)
    return {"p50": lat[len(lat) // 2] * 1000, "p90": lat[int(len(lat) * 0.9)] * 1000,
            "client_cpu": client_cpu * 1000, "server_cpu": server_cpu * 1000}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0,
                    help="also the point query on a second server with --workers N (its "
                         "CPU: the parent, workers and relays together)")
    args = ap.parse_args()

    from benchmarks.bench_concurrency import ROW_GROUP_BYTES, _serve, _stop
    from benchmarks.bench_peers import make_events
    from flightsrv import Warehouse

    work = tempfile.mkdtemp(prefix="point-floor-")
    wh = Warehouse.open(os.path.join(work, "wh"))
    data = make_events(args.rows)
    t = wh.create_table("events", data.schema, {"row_group_bytes": str(ROW_GROUP_BYTES)})
    for batch in data.to_batches(max_chunksize=max(1, args.rows // 4)):
        t.append(batch)
    files = [t.store.local_path(f.path) for f in t.head().data_files]
    schema_path = os.path.join(work, "schema.arrow")
    with open(schema_path, "wb") as f:
        f.write(data.schema.serialize().to_pybytes())

    floor = subprocess.Popen([sys.executable, "-m", "benchmarks.probe_point_floor",
                              "--serve-floor", schema_path], stdout=subprocess.PIPE, text=True)
    floor_port = int(floor.stdout.readline())
    port = _free_port()
    server = _serve(os.path.join(work, "wh"), port, os.path.join(work, "server.log"), 1)
    point = "SELECT * FROM events WHERE id = ?"
    # the same server without early runs (a prepared query then starts at its DoGet)
    late_port = _free_port()
    os.environ["FLIGHTSRV_BENCH_SERVE_ARGS"] = (
        os.environ.get("FLIGHTSRV_BENCH_SERVE_ARGS", "") + " --no-early-runs").strip()
    late = _serve(os.path.join(work, "wh"), late_port, os.path.join(work, "late.log"), 1)
    os.environ["FLIGHTSRV_BENCH_SERVE_ARGS"] = \
        os.environ["FLIGHTSRV_BENCH_SERVE_ARGS"].removesuffix("--no-early-runs").strip()
    runs = {
        "floor (do-nothing Flight SQL server)":
            lambda: _adbc_loop(floor_port, point, args.rows, args.queries, floor.pid),
        "flightsrv trivial (SELECT CAST(? AS BIGINT))":
            lambda: _adbc_loop(port, "SELECT CAST(? AS BIGINT) AS x", args.rows,
                               args.queries, server.pid),
        "flightsrv point":
            lambda: _adbc_loop(port, point, args.rows, args.queries, server.pid),
        "flightsrv point, --no-early-runs":
            lambda: _adbc_loop(late_port, point, args.rows, args.queries, late.pid),
        "duckdb point (in process)":
            lambda: _duckdb_loop(files, args.rows, args.queries),
    }
    multi = None
    if args.workers > 1:
        mport = _free_port()
        multi = _serve(os.path.join(work, "wh"), mport, os.path.join(work, "multi.log"),
                       args.workers)
        runs[f"flightsrv point, --workers {args.workers}"] = \
            lambda: _adbc_loop(mport, point, args.rows, args.queries, multi.pid)
    print(f"rows={args.rows} queries={args.queries} cores={os.cpu_count()} "
          f"load={os.getloadavg()[0]:.1f}")
    try:
        for r in range(args.rounds):
            print(f"round {r + 1}")
            for name, fn in runs.items():
                f = fn()
                print(f"  {name:46s} p50 {f['p50']:6.2f} ms  p90 {f['p90']:6.2f} ms  "
                      f"client CPU {f['client_cpu']:5.2f} ms  server CPU {f['server_cpu']:5.2f} ms")
    finally:
        _stop(server)
        _stop(late)
        if multi is not None:
            _stop(multi)
        floor.kill()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-floor":
        _serve_floor(sys.argv[2])
    else:
        main()

"""Reads after many small commits, with the server's automatic maintenance at its defaults
(issue 35, "Automatic maintenance"; docs/MAINTENANCE.md §Automatic maintenance).

Workload: ``flightsrv serve`` in its own process at default settings (``--no-demo`` only),
on a fresh local warehouse. One ADBC client makes N commits of 10 rows each
(``adbc_ingest`` append of a 10-row table: ``id`` ascending, ``k`` = id % 5, ``x`` a
double, ``ts`` ascending timestamps) into table ``t`` (auto_compact at its default, on) and
the same N commits into ``t_off`` (``auto_compact=false``: what reads cost without any
maintenance), and ``c``: the same rows in one ingest (compacted: one file). No OPTIMIZE
anywhere.

Reads through ADBC on one connection, median of ``REPEAT``, each run of a table followed by
the same query on ``c`` (interleaved, so load drift on a shared machine hits both alike): ``count``
(``SELECT count(*)``), ``aggregate`` (5 groups: ``SELECT k, count(*), sum(x) ... GROUP
BY k``), ``point`` (``WHERE id = <middle>``), ``newest`` (the last 100 rows by ``ts``).

- **right after the last commit**: ``t`` as the writer leaves it (up to one tick's worth of
  small files not compacted yet);
- **after the next tick**: once ``/metrics`` shows the worker's tick after the last commit
  finished (default interval 5 s);
- baseline: ``c``; and ``t_off`` for the decay without maintenance.

Goal (issue 35): reads after 10,000 commits <= 2x the same rows compacted; measured here at
1,000 commits (``--scale small``) or 10,000 (``--scale full``; or FLIGHTSRV_BENCH_COMMITS).
Run alone: ``python -m benchmarks.bench_automaint [commits] [--skip-off]`` (``--skip-off``,
or FLIGHTSRV_BENCH_SKIP_OFF=1 in the runner: no ``t_off``, whose commits slow down as its
files pile up).
"""

from __future__ import annotations

import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import warnings

import pyarrow as pa

from benchmarks.harness import Context, Row

NAME = "automaint"
REPEAT = 15
QUERIES = {
    "count": "SELECT count(*) FROM {t}",
    "aggregate": "SELECT k, count(*), sum(x) FROM {t} GROUP BY k ORDER BY k",
    "point": "SELECT * FROM {t} WHERE id = {mid}",
    "newest": "SELECT * FROM {t} ORDER BY ts DESC LIMIT 100",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(warehouse: str, port: int, metrics_port: int, log_path: str) -> subprocess.Popen:
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "flightsrv.cli", "--warehouse", warehouse,
                             "serve", "--no-demo", "--port", str(port), "--metrics-port",
                             str(metrics_port), "--log-statements", "off"],
                            stdout=subprocess.DEVNULL, stderr=log, text=True,
                            start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("flightsrv serve exited before it listened")
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("flightsrv serve did not listen within 60 s")


def _connect(uri):
    from adbc_driver_flightsql import dbapi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(uri)


def _metric(port: int, name: str, **labels) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    total = 0.0
    for line in body.splitlines():
        m = re.match(rf"^{name}(?:{{([^}}]*)}})? ([0-9.e+-]+)$", line)
        if m and (not labels or ",".join(sorted((m.group(1) or "").split(","))) == want):
            total += float(m.group(2))
    return total


def _batch(i: int) -> pa.Table:
    ids = list(range(i * 10, i * 10 + 10))
    return pa.table({"id": pa.array(ids, pa.int64()), "k": pa.array([j % 5 for j in ids],
                                                                      pa.int64()),
                     "x": pa.array([j * 0.5 for j in ids], pa.float64()),
                     "ts": pa.array([1_700_000_000_000_000 + j * 1000 for j in ids],
                                    pa.timestamp("us"))})


def _commits(conn, table: str, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        with conn.cursor() as cur:
            cur.adbc_ingest(table, _batch(i), mode="append")
    return time.perf_counter() - t0


def _reads(conn, table: str, mid: int, baseline: str = "c") -> dict[str, tuple]:
    """(median of ``table``, median of ``baseline``) per query, runs interleaved so that
    load drift on a shared machine hits both alike."""
    out = {}
    with conn.cursor() as cur:
        for name, sql in QUERIES.items():
            times: dict[str, list] = {table: [], baseline: []}
            for t in (table, baseline):  # warm
                cur.execute(sql.format(t=t, mid=mid))
                cur.fetchall()
            for _ in range(REPEAT):
                for t in (table, baseline):
                    q = sql.format(t=t, mid=mid)
                    t0 = time.perf_counter()
                    cur.execute(q)
                    cur.fetchall()
                    times[t].append(time.perf_counter() - t0)
            out[name] = (statistics.median(times[table]), statistics.median(times[baseline]))
    return out


def _files(conn, table: str) -> int:
    with conn.cursor() as cur:
        cur.execute(f"SELECT files FROM flightsrv_history('{table}') ORDER BY version DESC "
                    "LIMIT 1")
        return int(cur.fetchall()[0][0])


def measure(workdir: str, commits: int, skip_off: bool = False) -> dict:
    wh = os.path.join(workdir, "automaint-wh")
    port, mport = _free_port(), _free_port()
    proc = _serve(wh, port, mport, os.path.join(workdir, "automaint-server.log"))
    res: dict = {"commits": commits}
    try:
        conn = _connect(f"grpc://127.0.0.1:{port}")
        with conn.cursor() as cur:
            for t in ("t", "t_off", "c"):
                cur.execute(f"CREATE TABLE {t} (id BIGINT, k BIGINT, x DOUBLE, ts TIMESTAMP)")
            # the same rows, compacted: one ingest of all of them (one file)
            cur.adbc_ingest("c", pa.concat_tables([_batch(i) for i in range(commits)]),
                            mode="append")
        from flightsrv import Warehouse

        Warehouse.open(wh).table("t_off").set_properties(auto_compact=False)
        res["write_on_s"] = _commits(conn, "t", commits)
        res["files_right_after"] = _files(conn, "t")
        mid = commits * 5
        res["right_after"] = _reads(conn, "t", mid)
        # wait for a tick that began after the last commit
        ticks = _metric(mport, "flightsrv_maintenance_ticks_total")
        deadline = time.time() + 120
        while _metric(mport, "flightsrv_maintenance_ticks_total") < ticks + 2:
            if time.time() > deadline:
                raise RuntimeError("the maintenance worker did not tick within 120 s")
            time.sleep(0.2)
        res["files_after_tick"] = _files(conn, "t")
        res["after_tick"] = _reads(conn, "t", mid)
        res["worker"] = {k: _metric(mport, f"flightsrv_maintenance_{k}_total") for k in (
            "runs", "failures", "files_compacted", "bytes_read", "bytes_written", "seconds",
            "ticks")}
        compared = ["t"]
        if not skip_off:
            res["write_off_s"] = _commits(conn, "t_off", commits)
            res["files_off"] = _files(conn, "t_off")
            res["off"] = _reads(conn, "t_off", mid)
            compared.append("t_off")
        res["files_c"] = _files(conn, "c")
        with conn.cursor() as cur:
            for t in compared:
                cur.execute(f"SELECT count(*), sum(id), sum(x) FROM {t} EXCEPT "
                            "SELECT count(*), sum(id), sum(x) FROM c")
                assert cur.fetchall() == [], f"{t} and c differ"
            cur.execute("SELECT count(*) FROM t")
            assert cur.fetchall()[0][0] == commits * 10
        conn.close()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return res


def _ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def rows_of(res: dict) -> list[Row]:
    n = res["commits"]
    rows = []
    for q in QUERIES:
        for label, key, files_key in (("right after the last commit", "right_after",
                                       "files_right_after"),
                                      ("after the next tick", "after_tick", "files_after_tick"),
                                      ("auto_compact=false", "off", "files_off")):
            if key not in res:
                continue
            ours, base = res[key][q]
            ratio = ours / base
            goal = "<= 2x" if key == "after_tick" else ""
            rows.append(Row(f"{q} after {n:,} commits of 10 rows, {label}",
                            f"{n * 10:,} rows, {res[files_key]} files, ADBC, default settings",
                            _ms(ours), f"same rows compacted ({res['files_c']} file) {_ms(base)}",
                            ratio, goal, (ratio <= 2.0) if goal else None,
                            f"median of {REPEAT}, interleaved; ratio lower is better"))
    w = res["worker"]
    off_s = res.get("write_off_s")
    rows.append(Row(f"writes with the worker on vs off ({n:,} ADBC ingest commits)",
                    "10 rows each, one client", f"{n / res['write_on_s']:.1f} commits/s on",
                    f"{n / off_s:.1f} commits/s off" if off_s else "not measured",
                    off_s / res["write_on_s"] if off_s else None, "", None,
                    f"worker: {int(w['runs'])} runs, {int(w['files_compacted'])} files, "
                    f"{w['bytes_read'] / 1e6:.1f} MB read, {w['bytes_written'] / 1e6:.1f} MB "
                    f"written, {w['seconds']:.1f} s, {int(w['failures'])} failures"))
    return rows


def run(ctx: Context) -> list[Row]:
    commits = int(os.environ.get("FLIGHTSRV_BENCH_COMMITS") or ctx.rows(1_000, 10_000))
    return rows_of(measure(ctx.workdir, commits, skip_off=bool(os.environ.get(
        "FLIGHTSRV_BENCH_SKIP_OFF"))))


if __name__ == "__main__":
    import argparse
    import json
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_automaint",
                                 description="automatic maintenance under small commits")
    ap.add_argument("commits", nargs="?", type=int, default=1000)
    ap.add_argument("--skip-off", action="store_true",
                    help="skip the run with automatic maintenance off")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = measure(d, opts.commits, skip_off=opts.skip_off)
    print(json.dumps(res, indent=1))
    for r in rows_of(res):
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        met = "" if r.met is None else "yes" if r.met else "NO"
        print(f"| {r.benchmark} | {r.workload} | {r.figure} | {r.baseline} | {ratio} | "
              f"{r.goal} | {met} | {r.note} |")

"""DuckLake in process, as the streaming-ingest peer of ``bench_ingest``: run by the DuckDB
1.5.5 virtualenv's python (``flightsrv.testing.interop.duckdb_venv()``), because no DuckLake
extension exists for our DuckDB 2.0. One JSON command per line on stdin, one JSON answer per
line on stdout; every time is measured here, around the DuckDB calls only.

- ``{"cmd": "setup", "dir": D, "inline": N}``: a DuckLake catalog under ``D`` with data
  inlining up to N rows per insert (0: off) and an empty table ``lake.ev``.
- ``{"cmd": "commits", "n": N, "rows": R, "start": S}``: N INSERT statements of R rows each
  (ids from S on, one commit each); answers ``seconds`` (all N) and the per-commit list.
- ``{"cmd": "time", "sql": S, "repeat": K}``: the median of K runs (``seconds``) and the
  first run's rows.
- ``{"cmd": "bytes", "dir": D}``: bytes under ``D`` (catalog and data files).
- ``{"cmd": "quit"}``.

No flightsrv import here: this file runs under another interpreter and DuckDB version.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from ducklake_worker import connect  # beside this file (sys.path[0])


def insert_sql(start: int, rows: int) -> str:
    """The same rows as bench_ingest's ``events(start, rows)``."""
    return ("INSERT INTO lake.ev SELECT i, TIMESTAMP '2026-01-01' + to_seconds(i), "
            f"'k' || (i % 5), (i % 1000) / 10.0 FROM range({start}, {start + rows}) t(i)")


def main() -> None:
    con = connect()
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req["cmd"]
        try:
            if cmd == "quit":
                break
            if cmd == "setup":
                d = req["dir"]
                opts = f"DATA_PATH '{d}/data'"
                opts += f", DATA_INLINING_ROW_LIMIT {int(req['inline'])}"
                con.execute(f"ATTACH 'ducklake:{d}/cat.ducklake' AS lake ({opts})")
                con.execute("CREATE TABLE lake.ev (id BIGINT, ts TIMESTAMP, k VARCHAR, "
                            "v DOUBLE)")
                ans = {"ok": True}
            elif cmd == "commits":
                times = []
                start, rows = req["start"], req["rows"]
                for c in range(req["n"]):
                    sql = insert_sql(start + c * rows, rows)
                    t0 = time.perf_counter()
                    con.execute(sql)
                    times.append(time.perf_counter() - t0)
                ans = {"seconds": sum(times), "each": times}
            elif cmd == "time":
                times, rows = [], None
                for _ in range(req.get("repeat", 5)):
                    t0 = time.perf_counter()
                    got = con.execute(req["sql"]).fetchall()
                    times.append(time.perf_counter() - t0)
                    rows = rows if rows is not None else [list(map(str, r)) for r in got[:3]]
                ans = {"seconds": statistics.median(times), "rows": rows}
            elif cmd == "bytes":
                total = 0
                for root, _, files in os.walk(req["dir"]):
                    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
                ans = {"bytes": total}
            else:
                ans = {"error": f"unknown command {cmd}"}
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            ans = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        out.write(json.dumps(ans) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

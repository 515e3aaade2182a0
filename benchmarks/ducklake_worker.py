"""DuckLake in process, as a peer for ``bench_peers``: run by the DuckDB 1.5.5 virtualenv's
python (``flightsrv.testing.interop.duckdb_venv()``, which also holds the
``duckdb-extension-ducklake`` wheel), because no DuckLake extension exists for our DuckDB 2.0.

Protocol: one JSON command per line on stdin, one JSON answer per line on stdout, so the
caller can interleave DuckLake's runs with its own (a shared, loaded machine hits both alike).
Every time is measured here, around the DuckDB call only (wall seconds, ``perf_counter``).

- ``{"cmd": "setup", "dir": D, "parquet": [paths]}``: a DuckLake catalog ``D/cat.ducklake``
  with data under ``D/data``; ``CREATE TABLE lake.<name> AS SELECT * FROM read_parquet(...)``
  per table in ``tables`` ({name: [paths]}). Answers the snapshot id and file count.
- ``{"cmd": "time", "sql": S, "params": [...] | null, "fetch": "all" | "stream" | "none"}``:
  one run; answers ``seconds`` and ``rows`` (result rows fetched, or the DML count).
- ``{"cmd": "point", "sql": S, "ids": [...]}``: one run per id; answers ``seconds`` (a list).
- ``{"cmd": "quit"}``.

No flightsrv import here: this file runs under another interpreter and DuckDB version.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import duckdb


def _extension(name: str) -> str:
    base = os.path.dirname(os.path.dirname(duckdb.__file__))
    paths = glob.glob(os.path.join(base, f"duckdb_extension_{name}", "extensions", "*",
                                   f"{name}.duckdb_extension"))
    if not paths:
        raise RuntimeError(f"no {name} extension wheel in this virtualenv")
    return paths[0]


def connect():
    """An in-memory DuckDB with the DuckLake extension of this virtualenv loaded (also used
    by ``ducklake_ingest_worker.py``)."""
    con = duckdb.connect()
    con.execute("SET enable_progress_bar=false")
    con.execute(f"LOAD '{_extension('ducklake')}'")
    return con


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
                con.execute(f"ATTACH 'ducklake:{d}/cat.ducklake' AS lake (DATA_PATH '{d}/data')")
                for name, paths in req["tables"].items():
                    con.execute(f"CREATE TABLE lake.{name} AS SELECT * FROM read_parquet(?)",
                                [paths])
                files = len(glob.glob(os.path.join(d, "data", "**", "*.parquet"),
                                      recursive=True))
                ans = {"files": files}
            elif cmd == "time":
                params = req.get("params")
                fetch = req.get("fetch", "all")
                t0 = time.perf_counter()
                if fetch == "stream":
                    rel = con.sql(req["sql"], params=params) if params else con.sql(req["sql"])
                    reader = rel.to_arrow_reader(req.get("batch", 122_880))
                    rows = sum(b.num_rows for b in reader)
                elif fetch == "all":
                    rows = len(con.execute(req["sql"], params).fetchall())
                else:  # DML: DuckDB answers the count
                    rows = int(con.execute(req["sql"], params).fetchall()[0][0])
                ans = {"seconds": time.perf_counter() - t0, "rows": rows}
            elif cmd == "point":
                times = []
                for i in req["ids"]:
                    t0 = time.perf_counter()
                    con.execute(req["sql"], [i]).fetchall()
                    times.append(time.perf_counter() - t0)
                ans = {"seconds": times}
            else:
                ans = {"error": f"unknown command {cmd}"}
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            ans = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        out.write(json.dumps(ans) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

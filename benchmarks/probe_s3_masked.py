"""Issue 33, the S3 item: would reading S3 files with deleted rows into DuckDB (with the
deletion-mask extension) beat the masked Arrow scan they take today?

``python -m benchmarks.probe_s3_masked`` (``N`` rows, default 1M; needs moto and the mask
extension). A moto server on 127.0.0.1, a warehouse on it with ``clean`` and ``masked``
(1% of rows deleted at random; 4 data files of 2 MiB row groups, as ``bench_concurrency``
makes them), and ``SELECT count(*), sum(value)`` timed (wall and this process's CPU, median
of 7, interleaved, three rounds) four ways:

- ``engine clean`` / ``engine masked``: ``DuckEngine`` as the server runs it (clean S3 files
  by pyarrow's dataset scanner, files with deleted rows by the masked Arrow scan);
- ``sparse``: what DuckDB would need: each file's footer and the projected column chunks
  fetched by ranged reads (pyarrow's ``S3FileSystem``, 8 threads) into a sparse local file
  of the object's size (holes elsewhere; DuckDB reads only the footer and those chunks),
  then one ``read_parquet`` of the files with the mask function on ``file_row_number``;
  ``warm footer``: footers and metadata kept from an earlier statement (files are
  write-once, so a cache by key would be valid); ``cold footer``: fetched each time.

moto's CPU is its own process's and is not counted; its requests are serialized (see
FIELD_NOTES), which penalizes parallel ranged reads, so wall times favour fewer requests."""
from __future__ import annotations

import concurrent.futures as cf
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq


def main() -> None:
    from benchmarks.bench_peers import make_events
    from flightsrv import Warehouse
    from flightsrv.engine import maskext
    from flightsrv.engine.api import Session
    from flightsrv.engine.duck import DuckEngine
    from flightsrv.testing.moto_server import MotoProcess

    n = int(os.environ.get("N", "1000000"))
    srv = MotoProcess().start()
    srv.apply_env()
    srv.create_bucket("bench-s3m")
    try:
        wh = Warehouse.open("s3://bench-s3m/w")
        data = make_events(n)
        for name in ("clean", "masked"):
            t = wh.create_table(name, data.schema, {"row_group_bytes": str(2 << 20)})
            for b in data.to_batches(max_chunksize=n // 4):
                t.append(b)
        gone = np.random.default_rng(7).choice(n, n // 100, replace=False)
        wh.table("masked").delete(f"id IN ({','.join(str(int(i)) for i in gone)})")
        eng = DuckEngine(wh, threads=2)
        session = Session("s")
        table = wh.table("masked")
        snap = table.snapshot()
        files = list(snap.files())
        store = table.store
        fs, root = store.arrow_filesystem()
        con, slots = maskext.connect(True)
        if con is None:
            raise SystemExit("the deletion-mask extension is unavailable here")
        con.execute("SET threads=2")
        pool = cf.ThreadPoolExecutor(8)
        tmpd = tempfile.mkdtemp(prefix="probe-s3m-")
        metas: dict = {}

        def engine(name):
            return eng.execute_query(f"SELECT count(*), sum(value) FROM {name}",
                                     session).reader.read_all()

        def sparse(warm: bool):
            if not warm:
                metas.clear()
            paths, masks, jobs, fds = [], [], [], []
            for i, f in enumerate(files):
                if f.path not in metas:
                    tail = store.get_range(f.path, f.size - 8, f.size)
                    flen = int.from_bytes(tail[:4], "little")
                    raw = store.get_range(f.path, f.size - 8 - flen, f.size)
                    md = pq.ParquetFile(fs.open_input_file(f"{root}/{f.path}")).metadata
                    metas[f.path] = (raw, md)
                raw, md = metas[f.path]
                p = os.path.join(tmpd, f"{i}.parquet")
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                os.ftruncate(fd, f.size)
                os.pwrite(fd, b"PAR1", 0)
                os.pwrite(fd, raw, f.size - len(raw))
                for rg in range(md.num_row_groups):
                    g = md.row_group(rg)
                    for c in range(md.num_columns):
                        if md.schema.column(c).name == "value":
                            cc = g.column(c)
                            start = (cc.dictionary_page_offset if cc.has_dictionary_page
                                     and cc.dictionary_page_offset else cc.data_page_offset)
                            jobs.append((fd, f.path, start, cc.total_compressed_size))
                fds.append(fd)
                paths.append(p)
                masks.append(maskext.bitmap_of(md.num_rows, snap.deleted_positions(f), []))
            handles = {key: fs.open_input_file(f"{root}/{key}") for _, key, _, _ in jobs}

            def fetch(job):
                fd, key, start, size = job
                os.pwrite(fd, handles[key].read_at(size, start), start)

            list(pool.map(fetch, jobs))
            for fd in fds:
                os.close(fd)
            slot = slots.acquire(("probe", time.perf_counter()), lambda: masks)
            try:
                lst = ", ".join(f"'{p}'" for p in paths)
                return con.execute(
                    f"SELECT count(*), sum(value) FROM read_parquet([{lst}], "
                    f"file_row_number=true) WHERE {maskext.function(slot)}("
                    "CAST(file_index AS UBIGINT), file_row_number)").fetchall()
            finally:
                slots.drop(slot)

        a = engine("masked").to_pylist()[0]
        b = sparse(True)[0]
        assert a["count_star()"] == b[0] and abs(a['sum("value")'] - b[1]) < 1e-3 * abs(b[1])

        def timed(fn):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            return time.perf_counter() - w0, time.process_time() - c0

        ways = {"engine clean": lambda: engine("clean"),
                "engine masked": lambda: engine("masked"),
                "sparse, warm footer": lambda: sparse(True),
                "sparse, cold footer": lambda: sparse(False)}
        for rnd in range(3):
            got: dict = {k: [] for k in ways}
            for _ in range(7):
                for k, fn in ways.items():
                    got[k].append(timed(fn))
            print(f"round {rnd} (load {os.getloadavg()[0]:.1f}): " + "; ".join(
                f"{k} {statistics.median(w for w, _ in v) * 1000:.0f} ms wall, "
                f"{statistics.median(c for _, c in v) * 1000:.0f} ms CPU"
                for k, v in got.items()), flush=True)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()

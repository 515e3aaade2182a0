"""Hard erasure: a row-group splice delete vs a full copy-on-write rewrite of the same file.

Data: ``benchmarks.bench_core.make_data`` (``id`` sorted, ``x`` random int64, ``u`` uniform
double, ``s`` 4-value string; ~13 bytes/row under ZSTD), one data file of about 256 MiB in ~40
row groups at ``--scale full`` (small: ~32 MiB, ~8 groups).

Each round deletes 100 consecutive ids inside one row group (a different middle group each
time, on the file the previous round left) in two ways, interleaved:

- **splice**: ``Table.delete(pred, mode="splice")``: footer + the edited group downloaded,
  the group re-encoded, every other byte copied inside the store (``copy_file_range`` locally,
  UploadPartCopy on S3), one commit;
- **rewrite** (baseline): the very same call on a second handle of the same warehouse whose
  store declares ``equal_part_sizes`` (R2-like), which makes ``splice_delete`` fall back to
  reading every live row and writing a new file with ``DataFileWriter``: what a copy-on-write
  engine (deltalake, pyiceberg) does for any delete.

Figures come from the erasure report (``PurgeResult.files``): bytes downloaded, uploaded and
copied in-store. The upload budget is one row group + the footer/page-index tail + one
minimum part of padding (S3's 5 MiB rule; 0 locally). Wall times are medians over the rounds;
the time goal (splice <= 0.2x rewrite) applies to the local store. The same runs against a moto
S3 server on loopback (moto copies parts in Python, so its UploadPartCopy is not free as on
S3).
"""

from __future__ import annotations

import statistics
import time

import pyarrow as pa

from benchmarks.harness import Context, Row, mb

NAME = "splice"
BYTES_PER_ROW = 15  # make_data's rows under ZSTD at these sizes, measured
DELETE_ROWS = 100


def make_data(target_bytes: int) -> pa.Table:
    from benchmarks.bench_core import make_data as core_data

    return core_data(target_bytes // BYTES_PER_ROW, seed=5)


def _handles(uri: str, store_cls):
    """(normal table, table whose store forces the copy-on-write fallback) over one table."""
    from flightsrv.warehouse import Warehouse

    return Warehouse.open(uri).table("big"), Warehouse(store_cls(uri)).table("big")


def _local_equal_parts(uri: str):
    from flightsrv.store.local import LocalStore

    store = LocalStore(uri)
    store.equal_part_sizes = True
    return store


def _s3_equal_parts(uri: str):
    from flightsrv.store.s3 import S3Store

    bucket, _, prefix = uri[len("s3://"):].partition("/")
    return S3Store(bucket, prefix, equal_part_sizes=True)


def _round(table, group: int) -> tuple[float, object]:
    f = table.head().data_files[0]
    a = f.row_group_offsets[group] + f.row_group_rows(group) // 2
    t0 = time.perf_counter()
    n = table.delete(f"id >= {a} AND id < {a + DELETE_ROWS}", mode="splice")
    elapsed = time.perf_counter() - t0
    assert n == DELETE_ROWS, n
    return elapsed, n.result.files[0]


def bench_backend(ctx: Context, label: str, uri: str, data: pa.Table, groups: int,
                  eq_store, rounds: int) -> list[Row]:
    from flightsrv.table.scan import open_parquet
    from flightsrv.warehouse import Warehouse

    wh = Warehouse.open(uri)
    row_group_bytes = data.nbytes // groups + 1
    t = wh.create_table("big", data.schema, {"row_group_bytes": row_group_bytes,
                                             "target_file_size": 4 * data.nbytes})
    t.append(data)
    splice_t, cow_t = _handles(uri, eq_store)
    f = splice_t.head().data_files[0]
    size, n_groups = f.size, f.row_groups
    md = open_parquet(splice_t.store, f).metadata
    rg_max = max(sum(md.row_group(i).column(j).total_compressed_size
                     for j in range(md.num_columns)) for i in range(md.num_row_groups))
    min_part = splice_t.store.min_part_size
    budget = rg_max + 64 * 1024 + min_part

    splice_t.delete("id = -1", mode="splice")  # warm-up: self-check, imports; deletes nothing
    st, ct, sr, cr = [], [], [], []
    middle = list(range(1, n_groups - 1)) or [0]
    for r in range(rounds):
        e, rep = _round(splice_t, middle[(2 * r) % len(middle)])
        st.append(e)
        sr.append(rep)
        e, rep = _round(cow_t, middle[(2 * r + 1) % len(middle)])
        ct.append(e)
        cr.append(rep)
    assert all(r.path == "splice" for r in sr), [r.path for r in sr]
    assert all(r.path == "rewrite" for r in cr), [r.path for r in cr]
    s_time, c_time = statistics.median(st), statistics.median(ct)
    up, down, copied = (max(r.bytes_uploaded for r in sr), max(r.bytes_downloaded for r in sr),
                        statistics.median(r.bytes_copied for r in sr))
    c_up, c_down = statistics.median(r.bytes_uploaded for r in cr), \
        statistics.median(r.bytes_downloaded for r in cr)
    work = f"{label}: {mb(size)} file, {n_groups} row groups, {DELETE_ROWS} rows in 1 group"
    note = f"{rounds} rounds; min part {mb(min_part)}; largest row group {mb(rg_max)}"
    rows = [
        Row("splice delete: bytes uploaded", work,
            f"{mb(up)} uploaded, {mb(copied)} copied in-store",
            f"full rewrite uploads {mb(c_up)}", up / c_up if c_up else None,
            f"<= 1 row group + footer + padding ({mb(budget)})", up <= budget,
            note + "; ratio lower is better"),
        Row("splice delete: bytes downloaded", work, f"{mb(down)} downloaded",
            f"full rewrite reads {mb(c_down)}", down / c_down if c_down else None,
            f"<= {mb(budget)}", down <= budget, note + "; ratio lower is better"),
        Row("splice delete: wall time", work, f"{s_time * 1000:.0f} ms",
            f"full rewrite {c_time * 1000:.0f} ms", s_time / c_time,
            "<= 0.2x (256 MiB, 40 groups)" if label == "local" else "",
            (s_time / c_time <= 0.2) if label == "local" and ctx.full else None,
            f"median of {rounds}, end to end incl. plan and commit; ratio lower is better"
            + ("" if ctx.full else "; the goal is judged at --scale full (1 of 8 groups is "
               "re-encoded here, 1 of 40 there)")),
    ]
    return rows


def run(ctx: Context) -> list[Row]:
    target = ctx.rows(32, 256) * 1024 * 1024
    groups = ctx.rows(8, 40)
    rounds = ctx.rows(1, 3)
    data = make_data(target)
    rows = bench_backend(ctx, "local", ctx.tempdir("splice-local"), data, groups,
                         _local_equal_parts, rounds)
    rows += bench_backend(ctx, "moto S3", ctx.s3_uri("splice"), data, groups, _s3_equal_parts,
                          rounds)
    return rows

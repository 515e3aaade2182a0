"""Publishing open-format mirrors (issue 14): a version costs O(changed files).

A table of N data files (N = 1,000 and 10,000 at both scales) is built in one commit from
synthetic data-file entries (publishing reads only manifests, never data files, so the files
need not exist; DVs are real objects). Both mirrors are published once (the whole table:
O(N), shown for reference). Then, per mirror and per kind of version, the publish of ONE
new version is timed (median of ``REPEAT``, each on a fresh commit), and the objects and
bytes it wrote are counted through a counting store wrapper:

- **append**: one new data file;
- **DV delete on 10 files**: ten files get a new (inline) DV;
- **rewrite 10 files**: ten files removed, one added (a compaction's shape).

The ratio is the 10,000-file figure over the 1,000-file one for the bytes written (goal
<= 1.5x: what a version writes does not grow with the table). The time is shown next to the
commit of the same version: it includes diffing the two manifests, an in-memory pass over N
entries that the commit already parsed (about 0.3 us per entry; the commit itself
serializes all N), and excludes the commit. Iceberg rewrites the bucket manifest of each
changed file (at most ``BUCKET_TARGET`` entries each), so the objects written grow with
min(changed files, buckets). Delta checkpoints (every 100 versions, O(N)) are not in these
versions; the checkpoint of the 10,000-file table is timed on its own.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from benchmarks.harness import Context, Row

NAME = "interop"
SIZES = (1_000, 10_000)
REPEAT = 5


class CountingStore:
    """Wraps a table store; counts PUTs and bytes put."""

    def __init__(self, inner):
        self._inner = inner
        self.puts = 0
        self.bytes = 0

    def put(self, key, data, **kw):
        self.puts += 1
        self.bytes += len(data)
        return self._inner.put(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _entry(i: int, version: int):
    from flightsrv.table.manifest import DataFile

    return DataFile(path=f"data/2026/01/01/00/{i:032x}.parquet", size=8_000_000,
                    etag=f"e{i}", rows=100_000, row_group_offsets=(0, 50_000),
                    # statistics are keyed by field id: the table's columns get ids 1..n
                    stats={"1": {"min": i * 100_000, "max": i * 100_000 + 99_999,
                                 "nulls": 0},
                           "2": {"min": "a", "max": "z", "nulls": 3}},
                    added_version=version)


def _table(ctx: Context, n: int):
    import pyarrow as pa

    from flightsrv import Warehouse

    wh = Warehouse.open(ctx.tempdir(f"interop-{n}"))
    t = wh.create_table("t", pa.schema([("id", pa.int64()), ("name", pa.string())]))
    t.commit_files([_entry(i, 1) for i in range(n)])
    return t


def _inline_dv(t, k: int):
    """A small (inline) deletion vector."""
    from pyroaring import BitMap64

    from flightsrv.table.deletes import place

    return place(t, {"f": BitMap64(range(k, 100_000, 997))})["f"]


def _change(t, kind: str, step: int) -> None:
    """Commit one version of ``kind`` (not timed)."""
    if kind == "append":
        t.commit_files([_entry(10_000_000 + step, 0)])
        return

    def mutate(head):
        files = list(head.data_files)
        picks = list(range(step * 10, step * 10 + 10))
        if kind == "dv":
            for i in picks:
                files[i] = dataclasses.replace(files[i], dv=_inline_dv(t, step + 1),
                                               stats_wide=True)
            return dataclasses.replace(head, operation="delete", data_files=tuple(files),
                                       summary={"rows_deleted": 0})
        gone = {files[i].path for i in picks}
        kept = [f for f in files if f.path not in gone]
        kept.append(_entry(20_000_000 + step, head.version + 1))
        return dataclasses.replace(head, operation="compact", data_files=tuple(kept),
                                   summary={})

    t.commit(mutate)


def _measure(t, fmt: str, kind: str) -> dict:
    counting = CountingStore(t.store)
    times, puts, nbytes, commits = [], [], [], []
    for step in range(REPEAT):
        t0 = time.perf_counter()
        _change(t, kind, step + (REPEAT if fmt == "iceberg" else 0))
        commits.append(time.perf_counter() - t0)
        t.store = counting  # the mirrors write through the table's store
        before = (counting.puts, counting.bytes)
        t0 = time.perf_counter()
        t.publish(fmt)
        times.append(time.perf_counter() - t0)
        puts.append(counting.puts - before[0])
        nbytes.append(counting.bytes - before[1])
        t.store = counting._inner
    return {"ms": statistics.median(times) * 1000, "puts": statistics.median(puts),
            "bytes": statistics.median(nbytes), "commit_ms": statistics.median(commits) * 1000}


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    results: dict[tuple, dict] = {}
    firsts: dict[int, float] = {}
    checkpoint_ms = None
    for n in SIZES:
        t = _table(ctx, n)
        t.set_properties(**{"publish.delta.checkpoint_interval": 1_000_000})
        t0 = time.perf_counter()
        t.publish("all")
        firsts[n] = time.perf_counter() - t0
        for fmt in ("delta", "iceberg"):
            for kind in ("append", "dv", "rewrite"):
                results[(n, fmt, kind)] = _measure(t, fmt, kind)
        if n == SIZES[-1]:
            from flightsrv.table.mirror.delta import DeltaMirror

            t0 = time.perf_counter()
            DeltaMirror(t).checkpoint(t.head())
            checkpoint_ms = (time.perf_counter() - t0) * 1000
    small, large = SIZES
    names = {"append": "append 1 file", "dv": "DV delete on 10 files",
             "rewrite": "rewrite 10 files -> 1"}
    for fmt in ("delta", "iceberg"):
        for kind in ("append", "dv", "rewrite"):
            a, b = results[(small, fmt, kind)], results[(large, fmt, kind)]
            ratio = b["bytes"] / a["bytes"] if a["bytes"] else None
            rows.append(Row(
                f"publish one version ({fmt}): {names[kind]}",
                f"{large:,} vs {small:,} data files",
                f"{b['bytes'] / 1024:.1f} KiB in {b['puts']:.0f} objects, {b['ms']:.1f} ms "
                f"at {large:,}",
                f"{a['bytes'] / 1024:.1f} KiB in {a['puts']:.0f} objects, {a['ms']:.1f} ms "
                f"at {small:,}",
                ratio, goal="<= 1.5x", met=ratio is not None and ratio <= 1.5,
                note=f"median of {REPEAT}; ratio = bytes written at {large:,} / at {small:,}; "
                     f"time ratio {b['ms'] / a['ms']:.2f}x; the commit of the version took "
                     f"{b['commit_ms']:.0f} ms at {large:,}, {a['commit_ms']:.0f} ms at "
                     f"{small:,}"))
    rows.append(Row("publish a whole table (first publish, both formats)",
                    f"{large:,} vs {small:,} data files",
                    f"{firsts[large]:.2f} s at {large:,}", f"{firsts[small]:.2f} s at {small:,}",
                    firsts[large] / firsts[small] if firsts[small] else None,
                    note="O(files), once per table; ratio = time at 10k / at 1k"))
    if checkpoint_ms is not None:
        rows.append(Row("Delta checkpoint", f"{large:,} data files", f"{checkpoint_ms:.0f} ms",
                        "-", None, note="O(files); written every "
                        "publish.delta.checkpoint_interval versions (default 100)"))
    return rows

"""Format-2 manifest chunks under many small appends (issue 35).

- What a small append writes does not grow with the run of appends before it: the leaf at
  the end of the file list is a binary counter (PROTOCOL.md §14.2), so an entry is rewritten
  O(log 256) times, not once per append until its leaf holds 64 entries.
- Whether a manifest chunk is skipped never depends on a deleted row's value: a version with
  an overlay (deletes recorded in the root, the chunk and its summary unchanged) reads every
  chunk, as the summary's bounds may be a value deleted since.
"""

from __future__ import annotations

import pyarrow as pa

from flightsrv import Warehouse
from flightsrv.engine.api import Session
from flightsrv.table.manifest import DataFile


class _Counting:
    def __init__(self, inner):
        self._inner = inner
        self.chunk_bytes = 0

    def put(self, key, data, **kw):
        if key.startswith("chunks/"):
            self.chunk_bytes += len(data)
        return self._inner.put(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _entry(i: int) -> DataFile:
    return DataFile(path=f"data/2026/01/01/00/{i:032x}.parquet", size=1800, etag=f"e{i}",
                    rows=10, row_group_offsets=(0,),
                    stats={"1": {"min": i * 10, "max": i * 10 + 9, "nulls": 0},
                           "2": {"min": "a", "max": "z", "nulls": 0}}, added_version=0)


def test_small_appends_rewrite_few_entries(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("t", pa.schema([("id", pa.int64()), ("k", pa.string())]))
    for i in range(64):
        t.commit_files([_entry(i)])
    counting = _Counting(t.store)
    t.log.chunks.store = counting
    n = 128
    for i in range(64, 64 + n):
        t.commit_files([_entry(i)])
    entry_bytes = len(t.log.chunks.store._inner.get(
        t.head().data_files.refs[0].path)[0]) / t.head().data_files.refs[0].files
    # a binary counter rewrites each entry about log2(n) times; the old rule (absorb any
    # leaf under 64 entries) rewrote ~32 entries per append
    assert counting.chunk_bytes / n < 10 * entry_bytes, (counting.chunk_bytes / n, entry_bytes)
    assert [f.path for f in t.head().data_files] == [_entry(i).path for i in range(64 + n)]


def _table(path, secret: int):
    """70 one-file appends of ``v`` in 0..99, one of whose rows is ``secret``; that row is
    then deleted (a deletion vector, recorded in the root's overlay)."""
    wh = Warehouse.open(str(path))
    t = wh.create_table("t", pa.schema([("id", pa.int64()), ("v", pa.int64())]))
    for i in range(70):
        v = [secret if (i == 0 and j == 0) else j * 10 + i % 10 for j in range(10)]
        t.append(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64()),
                           "v": pa.array(v, pa.int64())}))
    assert len(t.head().data_files.refs) >= 2  # more than one chunk to prune
    wh.sql("DELETE FROM t WHERE id = 0")
    assert t.head().data_files.overlay
    return wh


def test_chunk_pruning_does_not_depend_on_a_deleted_value(tmp_path):
    infos = []
    for name, secret in (("right", 1000), ("wrong", 50)):
        wh = _table(tmp_path / name, secret)
        result = wh.engine.execute_query("SELECT count(*) FROM t WHERE v = 1000",
                                          Session("s"))
        assert result.reader.read_all().column(0).to_pylist() == [0]
        info = result.info
        infos.append((info.files_scanned, info.files_pruned, info.chunks_pruned))
    assert infos[0] == infos[1]


def _root_bytes(t) -> int:
    m = t.head()
    return len(t.store.get(f"manifest/v{m.version:020d}.json")[0])


def _leaves_then_appends(tmp_path, name: str, leaves: int) -> tuple[list[int], object]:
    """``leaves`` commits of one full leaf each, then 16 one-file appends; the root's size
    after each of those appends."""
    from flightsrv.table import chunks as C

    wh = Warehouse.open(str(tmp_path / name))
    t = wh.create_table("t", pa.schema([("id", pa.int64()), ("k", pa.string())]))
    n = 0
    for _ in range(leaves):
        t.commit_files([_entry(i) for i in range(n, n + C.LEAF_MAX)])
        n += C.LEAF_MAX
    sizes = []
    for i in range(n, n + 16):
        t.commit_files([_entry(i)])
        sizes.append(_root_bytes(t))
    assert [f.path for f in t.head().data_files] == [_entry(i).path for i in range(n + 16)]
    return sizes, t


def test_root_does_not_grow_with_full_leaves(tmp_path):
    """A stream of small appends fills a full leaf every 256 commits; the root of the next
    commits must not carry a summarised reference per full leaf (the old shape kept up to
    16 of them, ~330 bytes each here, so the root grew for 4,096 commits): full leaves move
    into index chunks and the counter's tail references carry no summaries (§14.2)."""
    from flightsrv.table import chunks as C

    small, _ = _leaves_then_appends(tmp_path, "small", 3)
    big, t = _leaves_then_appends(tmp_path, "big", 20)
    assert max(big) <= max(small) + 64, (small, big)
    refs = t.head().data_files.refs
    assert not any(r.stats or r.parts for r in refs if r.level == 0 and r.files <= C.TAIL_LEAF)
    assert sum(1 for r in refs if r.level == 0 and r.files > C.TAIL_LEAF) <= C.ROOT_SETTLED

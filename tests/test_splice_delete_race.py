"""A splice DELETE racing an UPDATE that moves the same row (found in session 28 across two
server processes): the DELETE planned the row live at its snapshot, the UPDATE committed
the row's new copy in another file meanwhile, and the DELETE's splice committed counting 0
rows, its row's updated copy left live. A planned row deleted since the snapshot now
re-runs the statement, as a deletion vector commit does (docs/PROTOCOL.md §8). The
UPDATE lands from another warehouse handle (its own engine: no in-process turn-taking)
while the DELETE writes its replacement file, before its commit."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.store.local import LocalStore


class BeforeCommit:
    """Runs ``hook`` once, when the first data file of the next write is stored."""

    def __init__(self, inner):
        self.inner = inner
        self.hook = None

    def _fire(self, key):
        if self.hook is not None and "/data/" in key:
            hook, self.hook = self.hook, None
            hook()

    def put(self, key, data, **kw):
        self._fire(key)
        return self.inner.put(key, data, **kw)

    def put_file(self, key, path, **kw):
        self._fire(key)
        return self.inner.put_file(key, path, **kw)

    def create_multipart(self, key, *a, **kw):
        self._fire(key)
        return self.inner.create_multipart(key, *a, **kw)

    def adopt(self, key, *a, **kw):  # a local store's splice output
        self._fire(key)
        return self.inner.adopt(key, *a, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("other", ["update", "delete"])
def test_a_splice_delete_never_misses_a_row_moved_under_it(tmp_path, other):
    root = str(tmp_path / "wh")
    store = BeforeCommit(LocalStore(root))
    mine = Warehouse(store)
    t = mine.create_table("t", pa.schema([("id", pa.int64()), ("v", pa.int64())]))
    t.append(pa.table({"id": pa.array(range(100), pa.int64()),
                       "v": pa.array([0] * 100, pa.int64())}))
    theirs = Warehouse.open(root).table("t")

    def concurrent():
        if other == "update":  # moves row 7 (and 9 others) into a new file
            assert theirs.update({"v": "v + 1"}, "id % 10 = 7") == 10
        else:
            assert int(theirs.delete("id = 7")) == 1

    store.hook = concurrent
    n = int(t.delete("id = 7", mode="splice"))
    assert store.hook is None  # the concurrent write did land in between
    assert n == (1 if other == "update" else 0)
    rows = Warehouse.open(root).table("t").to_table().to_pylist()
    assert 7 not in {r["id"] for r in rows} and len(rows) == 99
    assert sum(r["v"] for r in rows) == (9 if other == "update" else 0)

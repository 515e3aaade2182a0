"""A table's log (pointer and manifests) damaged on storage: a lost pointer, a pointer naming
a missing version, a manifest missing from the middle of the chain, stray names under
``manifest/``. Reads and writes name the damage (table, object, version) instead of serving
an old version or hiding the table, and maintenance never deletes what a version it did not
see references. Real local store; damage is done to its files as an operator's mistake or a
half restore would."""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import CorruptObject, StoreError, TableExists
from flightsrv.store.local import LocalStore
from flightsrv.table.manifest import POINTER_KEY, manifest_key

SCHEMA = pa.schema([("id", pa.int64())])
SHORT = {"vacuum.allow_short_grace": "true"}


def _path(root, table, key):
    return os.path.join(root, table, *key.split("/"))


def _data_files(root, table="t") -> set[str]:
    out = set()
    for d, _, names in os.walk(os.path.join(root, table, "data")):
        out |= {os.path.join(d, n) for n in names}
    return out


def _point_at(root, version, table="t"):
    """Rewrite the pointer to name ``version`` (a lagging or damaged hint)."""
    p = _path(root, table, POINTER_KEY)
    d = json.load(open(p))
    d["version"], d["manifest"] = version, manifest_key(version)
    with open(p, "w") as f:
        f.write(json.dumps(d, separators=(",", ":")))


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "wh")


def test_a_lost_pointer_after_expiry_keeps_the_table_and_its_files(root):
    t = Warehouse.open(root).create_table("t", SCHEMA, properties=SHORT)
    for i in range(4):
        t.append(pa.table({"id": [i]}, schema=SCHEMA))
    t.expire_snapshots(retain_last=2)  # v3 and v4 are left; v0 is gone
    os.remove(_path(root, "t", POINTER_KEY))
    files = _data_files(root)
    wh = Warehouse.open(root)
    assert wh.list_tables() == ["t"]
    assert sorted(wh.table("t").to_table()["id"].to_pylist()) == [0, 1, 2, 3]
    with pytest.raises(TableExists):
        wh.create_table("t", SCHEMA)
    time.sleep(0.05)
    wh.table("t").vacuum(grace=0)
    assert _data_files(root) == files
    assert wh.table("t").head().version == 4


def _gap(root):
    """v0..v3 committed (v3 deletes rows), v2's manifest lost, the pointer lagging at v1."""
    t = Warehouse.open(root).create_table("t", SCHEMA, properties=SHORT)
    t.append(pa.table({"id": list(range(10))}, schema=SCHEMA))
    t.append(pa.table({"id": [100]}, schema=SCHEMA))
    t.delete("id < 5")
    _point_at(root, 1)
    os.remove(_path(root, "t", manifest_key(2)))


def test_a_gap_in_the_version_chain_fails_reads_writes_and_vacuum(root):
    _gap(root)
    missing = f"key=t/{manifest_key(2)} version=2"
    files = _data_files(root)
    wh = Warehouse.open(root)
    with pytest.raises(CorruptObject, match=missing):
        wh.table("t").to_table()
    with pytest.raises(CorruptObject, match=missing):
        wh.handle("t").append(pa.table({"id": [-1]}, schema=SCHEMA))
    time.sleep(0.05)
    with pytest.raises(CorruptObject, match=missing):
        wh.handle("t").vacuum(grace=0)
    assert _data_files(root) == files
    assert not os.path.exists(_path(root, "t", manifest_key(2)))  # no commit filled the gap
    broken = []
    assert wh.list_tables(broken) == [] and broken[0][0] == "t"


def test_time_travel_into_a_gap_names_the_missing_manifest(root):
    """A version missing between retained ones is damage, not an expired version (whose
    message would name an older version as the oldest retained)."""
    t = Warehouse.open(root).create_table("t", SCHEMA)
    for i in range(3):
        t.append(pa.table({"id": [i]}, schema=SCHEMA))
    os.remove(_path(root, "t", manifest_key(1)))
    t = Warehouse.open(root).table("t")
    with pytest.raises(CorruptObject, match=f"key=t/{manifest_key(1)} version=1"):
        t.snapshot(version=1)
    assert t.snapshot(version=2).version == 2  # the others read


def test_vacuum_refuses_a_gap_of_several_versions(root):
    t = Warehouse.open(root).create_table("t", SCHEMA, properties=SHORT)
    for i in range(4):
        t.append(pa.table({"id": [i]}, schema=SCHEMA))
    t.delete("id = 0")  # v5
    _point_at(root, 1)
    for v in (2, 3):  # two versions gone: the head read's probe of v{h+2} does not see v4
        os.remove(_path(root, "t", manifest_key(v)))
    files = _data_files(root)
    time.sleep(0.05)
    with pytest.raises(CorruptObject, match=f"key=t/{manifest_key(2)}"):
        Warehouse.open(root).handle("t").vacuum(grace=0)
    assert _data_files(root) == files


def test_a_pointer_naming_a_missing_version_names_the_pointer(root):
    wh = Warehouse.open(root)
    wh.create_table("t", SCHEMA).append(pa.table({"id": [1]}, schema=SCHEMA))
    wh.create_table("u", SCHEMA)
    _point_at(root, 99)
    wh = Warehouse.open(root)
    expected = f"key=t/{POINTER_KEY} version=99 missing=t/{manifest_key(99)}"
    with pytest.raises(CorruptObject, match=expected):
        wh.table("t")
    with pytest.raises(CorruptObject, match=expected):
        wh.handle("t").append(pa.table({"id": [2]}, schema=SCHEMA))
    broken = []
    assert wh.list_tables(broken) == ["u"]
    assert [n for n, _ in broken] == ["t"]


def test_stray_names_under_manifest_are_not_versions(root):
    t = Warehouse.open(root).create_table("t", SCHEMA)
    for i in range(3):
        t.append(pa.table({"id": [i]}, schema=SCHEMA))
    for name in ("v-1.json", "v9.json", "v+9.json", "v00000000000000000001.json.bak"):
        with open(_path(root, "t", f"manifest/{name}"), "w") as f:
            f.write("junk")
    t = Warehouse.open(root).table("t")
    assert t.log.versions() == [0, 1, 2, 3]
    res = t.expire_snapshots(retain_last=2)
    assert res.expired_versions == [0, 1] and res.oldest_retained == 2
    assert len(os.listdir(_path(root, "t", "manifest"))) == 2 + 4  # the strays stay


class _Listing:
    """The local store, with listings of ``manifest/`` failing (``fail``) or coming back
    empty (a store that answered a listing wrongly)."""

    def __init__(self, inner, fail: bool):
        self.inner, self.fail = inner, fail

    def list(self, prefix=""):
        if "/manifest/" in prefix:
            if self.fail:
                raise StoreError("injected: listing failed", key=prefix)
            return iter([])
        return self.inner.list(prefix)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("fail", [True, False], ids=["fails", "empty"])
def test_vacuum_deletes_nothing_on_a_wrong_manifest_listing(root, fail):
    t = Warehouse.open(root).create_table("t", SCHEMA, properties=SHORT)
    t.append(pa.table({"id": list(range(10))}, schema=SCHEMA))
    t.append(pa.table({"id": [100]}, schema=SCHEMA))
    t.compact()  # v3; v1 and v2 are retained and reference the files compaction replaced
    files = _data_files(root)
    time.sleep(0.05)
    t = Warehouse(_Listing(LocalStore(root), fail)).table("t")
    with pytest.raises(StoreError, match="listing" if fail else "does not show the head"):
        t.vacuum(grace=0)
    assert _data_files(root) == files
    assert t.to_table(version=1).num_rows == 10

"""A head read on a remote store sends its probe for the next version while it reads the
pointer (``TableLog.head``): one round trip when nothing was committed, not two. The store
here is the local one behind a wrapper that says it is remote (no local paths), so each
request can be held and observed; what the reader answers is checked against commits made
by another writer, with and without the pointer moved."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import StoreError
from flightsrv.runtime import Runtime
from flightsrv.store.local import LocalStore
from flightsrv.table.commit import TableLog
from flightsrv.table.manifest import POINTER_KEY, manifest_key

SCHEMA = pa.schema([("id", pa.int64())])


class Remote:
    """The wrapped store as a remote one: no local paths. ``hold_pointer`` makes a read of
    the pointer wait (up to 10 s) until a read of ``hold_until_key`` has started, and
    records whether it did; ``fail_pointer_puts`` makes moving the pointer fail (the
    commit has happened, the pointer lags)."""

    def __init__(self, inner):
        self.inner = inner
        self.hold_pointer = False
        self.hold_until_key: str | None = None
        self.started = threading.Event()
        self.overlapped: list[bool] = []
        self.fail_pointer_puts = False
        self.gets: list[str] = []

    def local_path(self, key):
        return None

    def get(self, key, **kw):
        self.gets.append(key)
        if key == self.hold_until_key:
            self.started.set()
        if key.endswith(POINTER_KEY) and self.hold_pointer:
            self.overlapped.append(self.started.wait(10))
        return self.inner.get(key, **kw)

    def put(self, key, data, **kw):
        if self.fail_pointer_puts and key.endswith(POINTER_KEY):
            raise StoreError("injected: the pointer update failed", key=key)
        return self.inner.put(key, data, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _create(store):
    return Warehouse(store).create_table("t", SCHEMA)


def _table(store, runtime=None):
    return Warehouse(store, runtime).table("t")


@pytest.fixture
def stores(tmp_path):
    root = str(tmp_path / "wh")
    writer = Remote(LocalStore(root))
    reader = Remote(LocalStore(root))
    return writer, reader


def test_the_probe_is_in_flight_while_the_pointer_is_read(stores):
    writer, reader = stores
    w = _create(writer)
    w.append(pa.table({"id": [1]}, schema=SCHEMA))
    r = _table(reader)
    v = r.head().version  # the reader now knows the head
    reader.hold_pointer, reader.hold_until_key = True, f"t/{manifest_key(v + 1)}"
    assert r.head().version == v
    assert reader.overlapped == [True], "the probe had not started while the pointer was read"


def test_a_deterministic_runtime_reads_in_order(stores):
    writer, reader = stores
    _create(writer).append(pa.table({"id": [1]}, schema=SCHEMA))
    r = _table(reader, Runtime.deterministic(7))
    v = r.head().version
    reader.gets.clear()
    assert r.head().version == v
    assert reader.gets == [f"t/{POINTER_KEY}", f"t/{manifest_key(v + 1)}"]


@pytest.mark.parametrize("pointer_moves", [True, False])
def test_a_reader_sees_every_commit_made_before_its_head_read(stores, pointer_moves):
    writer, reader = stores
    w = _create(writer)
    r = _table(reader)
    want = []
    writer.fail_pointer_puts = not pointer_moves  # the pointer lags behind every commit
    for i in range(4):
        w.append(pa.table({"id": [i]}, schema=SCHEMA))
        want.append(i)
        head = r.head()
        assert head.version == w.head().version, (i, pointer_moves)
        assert sorted(r.to_table().column("id").to_pylist()) == want
    # the pointer moves again, past what the reader knows: the reader follows it
    writer.fail_pointer_puts = False
    w.append(pa.table({"id": [9]}, schema=SCHEMA))
    assert r.head().version == w.head().version
    assert r.count_rows() == 5


def test_a_table_dropped_and_created_again_is_not_mixed_with_the_old_one(stores):
    writer, reader = stores
    w = _create(writer)
    for i in range(3):
        w.append(pa.table({"id": [i]}, schema=SCHEMA))
    r = _table(reader)
    old = r.head()
    Warehouse(writer).drop_table("t")
    w2 = _create(writer)
    w2.append(pa.table({"id": [42]}, schema=SCHEMA))
    new = r.head()
    assert new.table_uuid != old.table_uuid and new.table_uuid == w2.head().table_uuid
    assert r.to_table().column("id").to_pylist() == [42]


def test_tablelog_overlaps_only_on_a_remote_store(tmp_path):
    local = LocalStore(str(tmp_path / "wh"))
    assert not TableLog(local, "t", Runtime())._overlap
    assert TableLog(Remote(local), "t", Runtime())._overlap
    assert not TableLog(Remote(local), "t", Runtime.deterministic(1))._overlap

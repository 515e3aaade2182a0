"""``Warehouse.vacuum_orphans`` (``flightsrv warehouse vacuum``) on a local store removes the
temp files killed writers left under ``.flightsrv/tmp/`` once they are older than the grace,
and never a young one (a live writer may be about to install it). A writer is killed for
real (``os._exit`` inside its data-file write, through a wrapping store)."""

from __future__ import annotations

import datetime as dt
import os
import time

import pyarrow as pa

from flightsrv import Warehouse
from flightsrv.store.local import LocalStore
from support import worker_processes

SCHEMA = pa.schema([("id", pa.int64())])


def _killed_append(root):
    """Append, dying once the data file's bytes are in a temp file but not yet installed."""
    store = LocalStore(root)
    install = store._install

    def die(key, tmp, mode, etag):
        if key.endswith(".parquet"):
            os._exit(9)
        return install(key, tmp, mode, etag)

    store._install = die
    Warehouse(store).table("t").append(pa.table({"id": list(range(1000))}, schema=SCHEMA))


def _temp(root):
    d = os.path.join(root, ".flightsrv", "tmp")
    return sorted(os.listdir(d))


def test_warehouse_vacuum_removes_old_temp_files_of_killed_writers(tmp_path):
    root = str(tmp_path / "wh")
    Warehouse.open(root).create_table("t", SCHEMA)
    p = worker_processes().Process(target=_killed_append, args=(root,))
    p.start()
    p.join(60)
    assert p.exitcode == 9
    (left,) = _temp(root)
    hour_ago = time.time() - 3600
    os.utime(os.path.join(root, ".flightsrv", "tmp", left), (hour_ago, hour_ago))
    young = os.path.join(root, ".flightsrv", "tmp", "0" * 32)  # a live writer's
    with open(young, "wb") as f:
        f.write(b"x" * 10)
    wh = Warehouse.open(root)
    dry = wh.vacuum_orphans(grace=dt.timedelta(minutes=30), dry_run=True)
    assert dry.temp_files == 1 and dry.temp_bytes > 0
    assert len(_temp(root)) == 2
    got = wh.vacuum_orphans(grace=dt.timedelta(minutes=30))
    assert (got.temp_files, got.temp_bytes) == (dry.temp_files, dry.temp_bytes)
    assert _temp(root) == ["0" * 32]
    assert wh.table("t").to_table().num_rows == 0

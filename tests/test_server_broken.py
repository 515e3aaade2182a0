"""A broken table never takes the server down (issue 12 item 2): `flightsrv serve` over a
warehouse with one corrupt manifest, one missing data file and one healthy table."""

from __future__ import annotations

import glob
import os

import adbc_driver_manager
import pytest
from _server_harness import make_table
from test_serve_cli import Served, connect, query

from flightsrv import Warehouse

pytestmark = pytest.mark.filterwarnings("ignore:Cannot disable autocommit")


@pytest.fixture
def broken_warehouse(tmp_path):
    root = str(tmp_path / "wh")
    wh = Warehouse.open(root)
    make_table(wh, "good", batches=2, rows=50)
    make_table(wh, "corrupt", batches=2, rows=50)
    make_table(wh, "lost", batches=2, rows=50)
    head = sorted(glob.glob(os.path.join(root, "corrupt", "manifest", "v*.json")))[-1]
    with open(head, "wb") as f:
        f.write(b"{ this is not a manifest")
    data = sorted(glob.glob(os.path.join(root, "lost", "data", "**", "*.parquet"),
                            recursive=True))
    os.remove(data[0])
    return root, os.path.relpath(head, root), os.path.relpath(data[0], root)


def test_server_starts_and_serves_around_broken_tables(broken_warehouse):
    root, manifest_key, data_key = broken_warehouse
    srv = Served(root)  # seeds the demo only into an empty warehouse: not here
    try:
        uri = srv.uri()
        unavailable = [e for e in srv.events if e.get("event") == "table_unavailable"]
        # one line per server, however many workers (worker 0 reports them)
        assert [e["table"] for e in unavailable] == ["corrupt"]  # once, however many workers
        assert unavailable[0]["error_class"] == "CorruptObject"
        assert manifest_key.split("/", 1)[1] in unavailable[0]["check"] + str(
            unavailable[0].get("object"))
        assert not [e for e in srv.events if e.get("msg") == "seeded demo table"]

        assert query(uri, "SELECT count(*), sum(id) FROM good") == [(100, sum(range(100)))]
        with connect(uri) as conn:
            objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
            tables = {t["table_name"]
                      for t in objects[0]["catalog_db_schemas"][0]["db_schema_tables"]}
            assert tables == {"good", "lost"}  # the corrupt one is left out, with a warning
            schema = conn.adbc_get_table_schema("lost")
            assert schema.names == ["id", "v"]
        for table, key, code in (("corrupt", manifest_key, "INTERNAL"),
                                 ("lost", data_key, "INTERNAL")):
            with pytest.raises(adbc_driver_manager.Error) as ei:
                query(uri, f"SELECT count(*) FROM {table}")
            message = str(ei.value)
            assert code in message and table in message
            assert os.path.basename(key) in message, message
            assert root not in message  # names the object, not the server's path
        # still serving, and the healthy table still answers
        assert query(uri, "SELECT count(*) FROM good") == [(100,)]
        later = [e for e in srv.events if e.get("event") == "table_unavailable"]
        assert len(later) > len(unavailable)  # GetTables reported it again
        assert srv.stop() == 0
    finally:
        srv.kill()


def _damage_in_place(path: str) -> None:
    """Break the first ZSTD frame of the file (its magic number), keeping the file's size
    and footer: Parquet has no checksums, so flipped bytes elsewhere may decode silently."""
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(b"\x28\xb5\x2f\xfd", 4)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data[at:at + 4]))


def test_a_damaged_data_file_is_a_clear_error_through_the_server(tmp_path):
    """A data file damaged in place (same size, footer intact) fails a query with the
    table, the object and the version named, no server path, and no decoder class name."""
    root = str(tmp_path / "wh")
    wh = Warehouse.open(root)
    make_table(wh, "good", batches=1, rows=50)
    damaged = {}
    for name in ("damaged", "masked"):
        t = make_table(wh, name, batches=1, rows=5000)
        if name == "masked":  # a deletion vector: read and masked by another path
            t.delete("id % 10 = 3")
        (f,) = t.head().data_files
        _damage_in_place(os.path.join(root, name, f.path))
        damaged[name] = (f.path, t.head().version)
    srv = Served(root)
    try:
        uri = srv.uri()
        for name, (key, version) in damaged.items():
            for sql in (f"SELECT sum(id) FROM {name}", f"SELECT * FROM {name} WHERE id = 7",
                        f"SELECT * FROM {name}"):
                with pytest.raises(adbc_driver_manager.Error) as ei:
                    query(uri, sql)
                message = str(ei.value)
                assert "CorruptObject" in message and f"table={name}" in message, message
                assert key in message and f"version={version}" in message, message
                assert root not in message and "Traceback" not in message, message
        assert query(uri, "SELECT count(*) FROM good") == [(50,)]
        assert srv.stop() == 0
    finally:
        srv.kill()

"""Objects a table's versions reference, damaged or unreadable on storage: errors name the
table, the object (relative to the table) and the version read, never the server's paths.
Real local store; the damage is done to its files."""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import CorruptObject, ObjectNotFound

SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "wh")


def _with_dv_object(root):
    t = Warehouse.open(root).create_table("t", SCHEMA)
    t.append(pa.table({"id": list(range(30000))}, schema=SCHEMA))
    t.delete("id % 3 = 0")  # a DV too large to inline: a tombstone/ object (version 2)
    (dv,) = glob.glob(os.path.join(root, "t", "tombstone", "**", "*.dv"), recursive=True)
    return dv, os.path.relpath(dv, os.path.join(root, "t")).replace(os.sep, "/")


def test_a_missing_deletion_vector_is_named_like_a_missing_data_file(root):
    dv, key = _with_dv_object(root)
    os.remove(dv)
    t = Warehouse.open(root).table("t")
    for read in (t.to_table, t.compact):
        with pytest.raises(ObjectNotFound) as err:
            read()
        msg = str(err.value)
        assert msg.startswith("deletion vector referenced by the manifest is missing")
        assert f"table=t object={key} version=2" in msg
        assert root not in msg and "file://" not in msg


def test_a_damaged_deletion_vector_names_the_table_and_version(root):
    dv, key = _with_dv_object(root)
    os.truncate(dv, 100)
    with pytest.raises(CorruptObject, match=f"object=t/{key}.* table=t version=2") as err:
        Warehouse.open(root).table("t").to_table()
    assert root not in str(err.value)

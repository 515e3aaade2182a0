"""Objects a table's versions reference, damaged or unreadable on storage: errors name the
table, the object (relative to the table) and the version read, never the server's paths.
Real local store; the damage is done to its files."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap
import time

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


def _unprivileged(root, code: str, *args: str) -> subprocess.CompletedProcess:
    """Run python ``code`` (or, with ``args``, the CLI) where file modes apply: as root,
    under ``setpriv`` without the capabilities that override them."""
    cmd = [sys.executable, "-m", "flightsrv", "--warehouse", root, *args] if args else \
        [sys.executable, "-c", textwrap.dedent(code)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file modes do not apply")
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          cwd=os.path.dirname(root))


def _data_files(root, table):
    return sorted(glob.glob(os.path.join(root, table, "data", "**", "*.parquet"),
                            recursive=True))


def test_vacuum_fails_when_the_manifests_cannot_be_listed(root):
    t = Warehouse.open(root).create_table("t", SCHEMA,
                                          properties={"vacuum.allow_short_grace": "true"})
    t.append(pa.table({"id": list(range(10))}, schema=SCHEMA))
    t.append(pa.table({"id": [100]}, schema=SCHEMA))
    t.compact()  # versions 1 and 2 still reference the files compaction replaced
    files = _data_files(root, "t")
    time.sleep(0.05)
    manifests = os.path.join(root, "t", "manifest")
    os.chmod(manifests, 0o300)  # known manifests still read, the listing fails
    try:
        got = _unprivileged(root, f"""
            from flightsrv import Warehouse
            try:
                Warehouse.open({root!r}).table("t").vacuum(grace=0)
            except Exception as exc:
                print(type(exc).__name__, exc)
            """)
    finally:
        os.chmod(manifests, 0o755)
    assert got.stdout.startswith("StoreAccessDenied"), got.stdout + got.stderr
    assert "key=t/manifest/ " in got.stdout and root not in got.stdout
    assert _data_files(root, "t") == files
    assert Warehouse.open(root).table("t").to_table(version=1).num_rows == 10


def test_an_unreadable_table_is_broken_and_the_others_work(root):
    wh = Warehouse.open(root)
    for n in ("good", "locked"):
        wh.create_table(n, SCHEMA).append(pa.table({"id": [1, 2]}, schema=SCHEMA))
    (data,) = _data_files(root, "good")
    os.chmod(os.path.join(root, "locked"), 0)
    os.chmod(data, 0)
    try:
        got = _unprivileged(root, f"""
            from flightsrv import Warehouse
            wh = Warehouse.open({root!r})
            broken = []
            print(wh.list_tables(broken), [(n, type(e).__name__) for n, e in broken])
            for n in ("locked", "good"):
                try:
                    wh.table(n).to_table()
                except Exception as exc:
                    print(type(exc).__name__, exc)
            """)
        sql = _unprivileged(root, "", "sql", "SELECT count(*) FROM good")
        listing = _unprivileged(root, "", "table", "list")
    finally:
        os.chmod(os.path.join(root, "locked"), 0o755)
        os.chmod(data, 0o644)
    out = got.stdout.splitlines()
    assert out[0] == "['good'] [('locked', 'StoreAccessDenied')]", got.stdout + got.stderr
    assert out[1].startswith("StoreAccessDenied") and "key=locked/_latest_manifest" in out[1]
    key = os.path.relpath(data, os.path.join(root, "good"))
    assert out[2].startswith("StoreAccessDenied") and f"table=good object={key}" in out[2]
    assert "StoreAccessDenied" in sql.stderr and f"object={key}" in sql.stderr
    assert "good" in listing.stdout and "broken: StoreAccessDenied" in listing.stdout
    for text in (got.stdout, sql.stderr, listing.stdout + listing.stderr):
        assert root not in text

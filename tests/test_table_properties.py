"""Typed table properties (``flightsrv.table.properties``) and column-name checks, through the
Python API every entry point shares: ``Warehouse.create_table`` and ``Table.set_properties``."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.errors import ConfigurationError
from flightsrv.table import properties as P
from flightsrv.table.writer import DEFAULT_ROW_GROUP_BYTES, DEFAULT_TARGET_FILE_SIZE, WriteOptions

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


@pytest.mark.parametrize("text,n", [
    ("64MB", 64_000_000), ("64mb", 64_000_000), ("1GiB", 1 << 30), ("1 gib", 1 << 30),
    ("4096", 4096), ("512B", 512), ("1.5KiB", 1536), ("2TB", 2 * 10 ** 12), (4096, 4096)])
def test_sizes_parse(text, n):
    assert P.parse_size(text) == n


@pytest.mark.parametrize("text", ["64XB", "MB", "-1MB", "1.5B", "", "1e3", True, "64 M B"])
def test_bad_sizes_refused(text):
    with pytest.raises(ConfigurationError):
        P.parse_size(text)


@given(st.integers(min_value=0, max_value=1 << 50))
def test_format_size_round_trips(n):
    assert P.parse_size(P.format_size(n)) == n


def test_defaults_match_the_code_that_reads_them():
    from flightsrv.engine.maintenance import ALLOW_SHORT_GRACE
    from flightsrv.table import maintenance as M

    assert P.PROPERTIES["target_file_size"].default == DEFAULT_TARGET_FILE_SIZE
    assert P.PROPERTIES["row_group_bytes"].default == DEFAULT_ROW_GROUP_BYTES
    assert P.PROPERTIES["compression"].default == WriteOptions().compression
    assert P.PROPERTIES["compact.min_deleted_fraction"].default == M.DEFAULT_MIN_DELETED_FRACTION
    assert P.PROPERTIES["compact.small_file_fraction"].default == M.DEFAULT_SMALL_FILE_FRACTION
    assert P.PROPERTIES["maintenance.max_versions"].default == M.DEFAULT_MAX_VERSIONS
    assert ALLOW_SHORT_GRACE in P.PROPERTIES


def test_create_stores_canonical_values_and_writes_use_them(local_uri):
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", SCHEMA, {"target_file_size": "64MB", "row_group_bytes": "1KiB",
                                      "vacuum.allow_short_grace": "YES", "sort_key": "id",
                                      "user.owner": "data team", "compression": "SNAPPY"})
    assert t.properties == {"target_file_size": "64000000", "row_group_bytes": "1024",
                            "vacuum.allow_short_grace": "true", "sort_key": "id",
                            "user.owner": "data team", "compression": "snappy"}
    t.append(pa.table({"id": list(range(5000)), "name": ["x"] * 5000}))  # used to fail: int()
    assert t.count_rows() == 5000
    assert WriteOptions.from_properties(t.properties) == WriteOptions(64_000_000, 1024, "snappy")


def _data_pages(path: str, column: int) -> int:
    """Data pages of column ``column`` in row group 0 of the Parquet file at ``path``,
    counted by walking its page headers."""
    import pyarrow.parquet as pq

    from flightsrv.table import parquet_meta as pm

    cc = pq.ParquetFile(path).metadata.row_group(0).column(column)
    start = cc.dictionary_page_offset or cc.data_page_offset
    with open(path, "rb") as fh:
        fh.seek(start)
        chunk = fh.read(cc.total_compressed_size)
    pos, pages = 0, 0
    while pos < len(chunk):
        hdr, end = pm.decode_struct(chunk, pos)
        pages += hdr.get(pm.PH.TYPE) != pm.PAGE_DICTIONARY
        pos = end + hdr.get(pm.PH.COMPRESSED_PAGE_SIZE)
    return pages


@pytest.mark.parametrize("page,expect", [(None, range(3, 6)), ("8KiB", range(40, 60))])
def test_data_page_bytes_sets_the_page_size_of_new_files(local_uri, page, expect):
    # 50,000 distinct int64 ids: 400 kB plain-encoded, so the default 128 KiB pages make
    # three or four (pyarrow checks the size every 1,024 values) and 8 KiB pages about fifty
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", SCHEMA, {"data_page_bytes": page} if page else {})
    assert P.value(t.properties, "data_page_bytes") == (8192 if page else 128 * 1024)
    t.append(pa.table({"id": list(range(50_000)), "name": ["x"] * 50_000}))
    (f,) = t.snapshot().manifest.data_files
    pages = _data_pages(t.store.local_path(f.path), 0)
    assert pages in expect, pages


@pytest.mark.parametrize("props,needle", [
    ({"data_page_bytes": "1KiB"}, "property=data_page_bytes"),
    ({"target_file_size": "64XB"}, "property=target_file_size"),
    ({"target_filesize": "64MB"}, "known="),
    ({"owner": "me"}, "user."),
    ({"delete_mode": "erase"}, "dv|splice"),
    ({"compact.min_deleted_fraction": "1.5"}, "between 0 and 1"),
    ({"maintenance.max_versions": "0"}, "at least 1"),
    ({"sort_key": "nope"}, "missing=nope"),
    ({"vacuum.allow_short_grace": "maybe"}, "true or false"),
])
def test_create_refuses_bad_properties_and_writes_nothing(local_uri, props, needle):
    wh = Warehouse.open(local_uri)
    with pytest.raises(ConfigurationError) as ei:
        wh.create_table("t", SCHEMA, props)
    assert needle in str(ei.value) and "table=t" in str(ei.value)
    assert not wh.is_initialized()  # not even the warehouse was created


def test_set_properties_checks_merges_and_removes(local_uri):
    t = Warehouse.open(local_uri).create_table("t", SCHEMA, {"delete_mode": "splice"})
    v = t.head().version
    with pytest.raises(ConfigurationError, match="property=target_file_size"):
        t.set_properties(target_file_size="lots")
    with pytest.raises(ConfigurationError, match="missing=ts"):
        t.set_properties(sort_key="ts")
    with pytest.raises(ConfigurationError, match="unknown table property"):
        t.set_properties(**{"no_such": None})
    assert t.head().version == v  # nothing committed by the refused calls
    m = t.set_properties(**{"target_file_size": "1GiB", "delete_mode": None})
    assert m.version == v + 1
    assert t.properties == {"target_file_size": str(1 << 30)}
    assert m.summary["removed"] == ["delete_mode"]


def test_values_stored_before_the_registry_still_read():
    assert P.value({"target_file_size": "64MB"}, "target_file_size") == 64_000_000
    assert P.value({}, "row_group_bytes") == DEFAULT_ROW_GROUP_BYTES


@pytest.mark.parametrize("fields,needle", [
    ([("id", pa.int64()), ("id", pa.string())], "duplicate column name"),
    ([("id", pa.int64()), ("ID", pa.string())], "case-insensitive"),
    ([("", pa.int64())], "empty"),
    ([(" id", pa.int64())], "space"),
    ([("a\nb", pa.int64())], "control character"),
    ([("s", pa.struct([("x", pa.int8()), ("X", pa.int8())]))], "parent=s"),
])
def test_bad_column_names_refused(local_uri, fields, needle):
    wh = Warehouse.open(local_uri)
    with pytest.raises(ConfigurationError) as ei:
        wh.create_table("t", pa.schema(fields))
    assert needle in str(ei.value)
    assert not wh.is_initialized()


def test_opening_creates_nothing_and_is_initialized(tmp_path):
    path = tmp_path / "a" / "b"
    wh = Warehouse.open(str(path))
    assert not wh.is_initialized() and wh.list_tables() == []
    assert not (tmp_path / "a").exists()
    wh.create_table("t", SCHEMA)
    assert wh.is_initialized() and Warehouse.open(str(path)).is_initialized()
    inner = Warehouse.open(str(path / "t"))  # a table's own directory is not a warehouse
    assert not inner.is_initialized() and inner.is_table_location()
    assert not (path / "t" / ".flightsrv").exists()
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigurationError, match="is a file"):
        Warehouse.open(str(f)).is_initialized()


def test_s3_warehouse_exists_only_with_a_table(s3_uri):
    wh = Warehouse.open(s3_uri)
    assert not wh.is_initialized()
    wh.create_table("t", SCHEMA)
    assert Warehouse.open(s3_uri).is_initialized()
    Warehouse.open(s3_uri).drop_table("t")
    assert Warehouse.open(s3_uri).is_initialized()  # a dropped table still marks it


def test_s3_missing_bucket_is_a_configuration_error(s3_server):
    with pytest.raises(ConfigurationError, match="no such bucket"):
        Warehouse.open("s3://no-such-bucket-here/wh").list_tables()


def test_setting_what_is_already_set_commits_nothing(local_uri):
    t = Warehouse.open(local_uri).create_table("t", SCHEMA, {"delete_mode": "splice"})
    v = t.head().version
    assert t.set_properties(delete_mode="splice") is None
    assert t.set_properties(target_file_size=None) is None  # removing an absent one
    assert t.head().version == v
    assert t.set_properties(delete_mode="dv").version == v + 1


@pytest.mark.parametrize("page,expect", [(None, range(3, 6)), ("8KiB", range(40, 60))])
def test_a_spliced_row_group_keeps_the_page_size_it_was_written_with(local_uri, page, expect):
    """An erasure re-encodes the row groups it touches; a point read must still decode one
    small page of them, not pyarrow's default 1 MiB."""
    wh = Warehouse.open(local_uri)
    t = wh.create_table("t", SCHEMA, {"data_page_bytes": page} if page else {})
    t.append(pa.table({"id": list(range(50_000)), "name": ["x"] * 50_000}))
    (before,) = t.snapshot().manifest.data_files
    assert t.delete("id IN (7, 25000)", mode="splice") == 2
    (after,) = t.snapshot().manifest.data_files
    assert after.path != before.path or after.etag != before.etag  # the bytes were rewritten
    assert t.count_rows() == 49_998
    pages = _data_pages(t.store.local_path(after.path), 0)
    assert pages in expect, pages

"""Avro schemas of Iceberg v3 manifests and manifest lists, as the spec defines them
(https://iceberg.apache.org/spec/#manifests, #manifest-lists): field names, types and
``field-id`` annotations. The files are encoded by fastavro; nothing here encodes Avro.

The table is unpartitioned, so ``partition`` is an empty record. Maps with non-string keys are
Avro arrays of key/value records with ``logicalType: map``, as the spec requires.
"""

from __future__ import annotations


def _opt(t):
    return ["null", t]


def _map(name: str, key_id: int, value_id: int, value_type: str) -> dict:
    return {"type": "array", "logicalType": "map",
            "items": {"type": "record", "name": name,
                      "fields": [{"name": "key", "type": "int", "field-id": key_id},
                                 {"name": "value", "type": value_type, "field-id": value_id}]}}


def _field(name: str, t, fid: int, *, optional: bool = False) -> dict:
    f = {"name": name, "type": _opt(t) if optional else t, "field-id": fid}
    if optional:
        f["default"] = None
    return f


DATA_FILE_V3 = {
    "type": "record", "name": "r2", "fields": [
        _field("content", "int", 134),
        _field("file_path", "string", 100),
        _field("file_format", "string", 101),
        _field("partition", {"type": "record", "name": "r102", "fields": []}, 102),
        _field("record_count", "long", 103),
        _field("file_size_in_bytes", "long", 104),
        _field("column_sizes", _map("k117_v118", 117, 118, "long"), 108, optional=True),
        _field("value_counts", _map("k119_v120", 119, 120, "long"), 109, optional=True),
        _field("null_value_counts", _map("k121_v122", 121, 122, "long"), 110, optional=True),
        _field("nan_value_counts", _map("k138_v139", 138, 139, "long"), 137, optional=True),
        _field("lower_bounds", _map("k126_v127", 126, 127, "bytes"), 125, optional=True),
        _field("upper_bounds", _map("k129_v130", 129, 130, "bytes"), 128, optional=True),
        _field("key_metadata", "bytes", 131, optional=True),
        _field("split_offsets", {"type": "array", "items": "long", "element-id": 133}, 132,
               optional=True),
        _field("equality_ids", {"type": "array", "items": "int", "element-id": 136}, 135,
               optional=True),
        _field("sort_order_id", "int", 140, optional=True),
        _field("first_row_id", "long", 142, optional=True),
        _field("referenced_data_file", "string", 143, optional=True),
        _field("content_offset", "long", 144, optional=True),
        _field("content_size_in_bytes", "long", 145, optional=True),
    ]}

MANIFEST_ENTRY_V3 = {
    "type": "record", "name": "manifest_entry", "fields": [
        _field("status", "int", 0),
        _field("snapshot_id", "long", 1, optional=True),
        _field("sequence_number", "long", 3, optional=True),
        _field("file_sequence_number", "long", 4, optional=True),
        _field("data_file", DATA_FILE_V3, 2),
    ]}

MANIFEST_FILE_V3 = {
    "type": "record", "name": "manifest_file", "fields": [
        _field("manifest_path", "string", 500),
        _field("manifest_length", "long", 501),
        _field("partition_spec_id", "int", 502),
        _field("content", "int", 517),
        _field("sequence_number", "long", 515),
        _field("min_sequence_number", "long", 516),
        _field("added_snapshot_id", "long", 503),
        _field("added_files_count", "int", 504),
        _field("existing_files_count", "int", 505),
        _field("deleted_files_count", "int", 506),
        _field("added_rows_count", "long", 512),
        _field("existing_rows_count", "long", 513),
        _field("deleted_rows_count", "long", 514),
        _field("partitions", {"type": "array", "element-id": 508, "items": {
            "type": "record", "name": "r508", "fields": [
                _field("contains_null", "boolean", 509),
                _field("contains_nan", "boolean", 518, optional=True),
                _field("lower_bound", "bytes", 510, optional=True),
                _field("upper_bound", "bytes", 511, optional=True)]}}, 507, optional=True),
        _field("key_metadata", "bytes", 519, optional=True),
        _field("first_row_id", "long", 520, optional=True),
    ]}

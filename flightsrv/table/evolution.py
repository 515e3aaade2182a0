"""Metadata-only table changes of format 2: columns added, renamed, dropped or widened,
partition specs, and the upgrade of a format-1 table (docs/PROTOCOL.md §14, §15, §16).

Each change is a function ``change(head, ...) -> Manifest`` used as (part of) a mutator of the
one commit loop, so it is validated against whatever head it is given: on a lost race the
loop calls it again on the new head, and a change that no longer applies (the column was
dropped meanwhile, the new name was taken) raises ``SchemaMismatch`` naming the table and
the column. No data file is read or written.

Schemas: a change makes a new schema with the next ``schema_id``; the previous one moves to
``schemas`` (files written with it keep pointing at it). Field ids are never reused:
``last_column_id`` only grows. A column's *physical* name (its name inside data files) is
fixed when it is added and survives renames; a new column whose name was ever a physical
name in this table gets ``<name>_<id>`` as its physical name, so that a Delta or Iceberg
reader resolving old files by name never mistakes a dropped column for a new one.
"""

from __future__ import annotations

import copy
import dataclasses

import pyarrow as pa

from flightsrv.errors import ConfigurationError, SchemaMismatch
from flightsrv.table import partition as P
from flightsrv.table.manifest import Manifest
from flightsrv.table.schema import (
    check_column_names,
    check_column_types,
    field_by_name,
    field_to_json,
    physical_name,
    schema_from_json,
    type_from_json,
    type_to_json,
    value_from_json,
    value_to_json,
    widening_allowed,
    with_field_ids,
)
from flightsrv.table.stored import widen

UPGRADE_HINT = "upgrade the table to format 2 first (flightsrv table upgrade <t>, or SQL " \
               "ALTER TABLE <t> UPGRADE)"


def require_format2(head: Manifest, table: str, what: str) -> None:
    if head.format_version < 2:
        raise ConfigurationError(f"{what} needs table format 2; {UPGRADE_HINT}", table=table,
                                 format_version=head.format_version)


def _all_schemas(head: Manifest) -> list[dict]:
    return list(head.schemas) + [head.schema]


def _next_schema(head: Manifest, fields: list[dict], last_column_id: int, operation: str,
                 summary: dict, **changes) -> Manifest:
    sid = max(int(s.get("schema_id", 0)) for s in _all_schemas(head)) + 1
    return dataclasses.replace(
        head, operation=operation, summary={"rows_added": 0, "rows_deleted": 0,
                                            "files_added": 0, "files_removed": 0, **summary},
        schema={"schema_id": sid, "fields": fields}, schemas=tuple(_all_schemas(head)),
        last_column_id=last_column_id, **changes)


def _column(head: Manifest, name: str, table: str) -> dict:
    f = field_by_name(head.schema, name)
    if f is None:
        raise SchemaMismatch("no such column", table=table, column=name,
                             version=head.version)
    return f


def _physical_names(head: Manifest) -> set[str]:
    return {physical_name(f).lower() for s in _all_schemas(head) for f in s["fields"]}


def default_json(value, t: pa.DataType, *, table: str, column: str):
    """A default value as stored (the statistics encoding), checked against the type."""
    if value is None:
        return None
    try:
        scalar = value if isinstance(value, pa.Scalar) else pa.scalar(value)
        if scalar.type != t:
            scalar = scalar.cast(t)
        return value_to_json(scalar, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
            ValueError, ConfigurationError) as exc:
        raise ConfigurationError("the default does not fit the column type", table=table,
                                 column=column, type=str(t), error=str(exc)) from None


def add_column(head: Manifest, table: str, name: str, type: pa.DataType, *,
               nullable: bool = True, default=None) -> Manifest:
    """A new column; rows already written read ``default`` (or NULL), and so do rows written
    later without it."""
    require_format2(head, table, "ADD COLUMN")
    if field_by_name(head.schema, name) is not None:
        raise SchemaMismatch("column already exists", table=table, column=name,
                             version=head.version)
    check_column_names(pa.schema(list(schema_from_json(head.schema)) + [pa.field(name, type)]),
                       table)
    check_column_types(pa.schema([pa.field(name, type)]), table)
    if not nullable and default is None:
        raise ConfigurationError("a NOT NULL column added to a table needs a DEFAULT (the "
                                 "rows already written get it)", table=table, column=name)
    if default is not None and (pa.types.is_nested(type) or pa.types.is_dictionary(type)):
        raise ConfigurationError("a default is only supported for columns of a simple type",
                                 table=table, column=name, type=str(type))
    fj = field_to_json(pa.field(name, type, nullable))
    fields, last = with_field_ids(list(head.schema["fields"]) + [fj], head.last_column_id)
    new = fields[-1]
    if name.lower() in _physical_names(head):
        new["physical"] = f"{name}_{new['id']}"
    d = default_json(default, type, table=table, column=name)
    if d is not None:
        new["initial_default"] = d
        new["write_default"] = d
    return _next_schema(head, fields, last, "add_column",
                        {"column": name, "field_id": new["id"]})


def rename_column(head: Manifest, table: str, old: str, new: str) -> Manifest:
    require_format2(head, table, "RENAME COLUMN")
    f = _column(head, old, table)
    clash = field_by_name(head.schema, new)
    if clash is not None and clash is not f:
        raise SchemaMismatch("a column of that name exists", table=table, column=new,
                             version=head.version)
    if f["name"] == new:
        return None  # type: ignore[return-value]
    fields = copy.deepcopy(head.schema["fields"])
    for x in fields:
        if x["id"] == f["id"]:
            x.setdefault("physical", physical_name(x))
            x["name"] = new
            if x["physical"] == new:
                del x["physical"]
    check_column_names(schema_from_json({"fields": fields}), table)
    props = _rename_in_properties(head.properties, f["name"], new)
    return _next_schema(head, fields, head.last_column_id, "rename_column",
                        {"column": f["name"], "to": new, "field_id": f["id"]},
                        properties=props)


def _rename_in_properties(props: dict, old: str, new: str) -> dict:
    """Column-list properties (``sort_key``) follow a rename."""
    from flightsrv.table.properties import PROPERTIES

    out = dict(props)
    for k, v in props.items():
        p = PROPERTIES.get(k)
        if p is not None and p.kind == "columns":
            out[k] = ",".join(new if c == old else c for c in v.split(","))
    return out


def drop_column(head: Manifest, table: str, name: str) -> Manifest:
    require_format2(head, table, "DROP COLUMN")
    from flightsrv.table.properties import PROPERTIES

    f = _column(head, name, table)
    if len(head.schema["fields"]) == 1:
        raise ConfigurationError("cannot drop the only column", table=table, column=name)
    for pf in head.partition_spec["fields"]:
        if pf["source_id"] == f["id"]:
            raise ConfigurationError("the column is a source of the current partition spec; "
                                     "change the partitioning first (ALTER TABLE ... SET "
                                     "PARTITIONED BY)", table=table, column=name,
                                     partition_field=pf["name"])
    for k, v in head.properties.items():
        p = PROPERTIES.get(k)
        if p is not None and p.kind == "columns" and f["name"] in v.split(","):
            raise ConfigurationError(f"the column is named by table property {k}; change it "
                                     "first", table=table, column=name, property=k)
    fields = [copy.deepcopy(x) for x in head.schema["fields"] if x["id"] != f["id"]]
    return _next_schema(head, fields, head.last_column_id, "drop_column",
                        {"column": f["name"], "field_id": f["id"]})


def alter_column_type(head: Manifest, table: str, name: str, type: pa.DataType) -> Manifest:
    """Widen a column's type (see ``schema.widening_allowed``); old files are cast on
    read."""
    require_format2(head, table, "ALTER COLUMN ... TYPE")
    f = _column(head, name, table)
    check_column_types(pa.schema([pa.field(f["name"], type)]), table)
    new_t = type_to_json(type)
    if f["type"] == new_t:
        return None  # type: ignore[return-value]
    if not widening_allowed(f["type"], new_t):
        raise ConfigurationError(
            "only widening type changes are metadata-only: int8->int16->int32->int64, "
            "float32->float64, decimal precision up (same scale), date->timestamp, a "
            "column of type null to any type",
            table=table, column=f["name"], type=str(type_from_json(f["type"])), to=str(type))
    fields = copy.deepcopy(head.schema["fields"])
    for x in fields:
        if x["id"] == f["id"]:
            old_t = type_from_json(x["type"])
            x["type"] = new_t
            for k in ("initial_default", "write_default"):
                if k in x:
                    v = widen(pa.array([value_from_json(x[k], old_t)], old_t), type)[0]
                    x[k] = value_to_json(v, type)
    return _next_schema(head, fields, head.last_column_id, "alter_column_type",
                        {"column": f["name"], "field_id": f["id"], "to": str(type)})


def set_partitioning(head: Manifest, table: str, items: list[tuple[str, str]]) -> Manifest:
    """Make ``items`` ([(transform, column)]) the partition spec of new files; files already
    written keep theirs."""
    require_format2(head, table, "partitioning")
    spec, last = P.make_spec(0, items, head.schema, head.last_partition_id, table=table)
    cur = head.partition_spec
    same = [(f["source_id"], f["transform"]) for f in cur["fields"]] == \
        [(f["source_id"], f["transform"]) for f in spec["fields"]]
    if same:
        return None  # type: ignore[return-value]
    old = list(head.partition_specs) + [cur]
    # a spec seen before keeps its id and field ids (files written with it match it again)
    for s in old:
        if [(f["source_id"], f["transform"]) for f in s["fields"]] == \
                [(f["source_id"], f["transform"]) for f in spec["fields"]]:
            spec, last = s, head.last_partition_id
            break
    else:
        spec = dict(spec, spec_id=max(int(s["spec_id"]) for s in old) + 1)
    return dataclasses.replace(
        head, operation="set_partitioning",
        summary={"rows_added": 0, "rows_deleted": 0, "files_added": 0, "files_removed": 0,
                 "spec_id": spec["spec_id"], "partitioning": P.describe(spec, head.schema)},
        partition_spec=spec,
        partition_specs=tuple(s for s in old if s["spec_id"] != spec["spec_id"]),
        last_partition_id=max(last, head.last_partition_id))


def upgrade(head: Manifest, table: str) -> Manifest | None:
    """The same version as format 2 (None: already format 2). Field ids are the ones the
    format-1 manifest was given on load (top-level 1..n, then nested), the files keep
    schema 0 and no partition; the file list is written as manifest chunks."""
    if head.format_version >= 2:
        return None
    return dataclasses.replace(
        head, format_version=2, operation="upgrade",
        summary={"rows_added": 0, "rows_deleted": 0, "files_added": 0, "files_removed": 0,
                 "from_format": head.format_version, "files": len(head.data_files)},
        data_files=tuple(head.data_files))


__all__ = ["UPGRADE_HINT", "add_column", "alter_column_type", "default_json", "drop_column",
           "rename_column", "require_format2", "set_partitioning", "upgrade"]

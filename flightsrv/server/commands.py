"""Flight SQL metadata commands: one entry per command, its result schema beside its handler.

Spec: https://arrow.apache.org/docs/format/FlightSql.html (each ``CommandGet*`` message's
comment in FlightSql.proto gives its result schema). Like arrow-rs's ``FlightSqlService``
(one method per command behind one ``match``), ``METADATA`` maps a command's message class
to ``Metadata(schema, table)``; GetFlightInfo, GetSchema and DoGet all look the command up
there, so a new command is one new entry and its schema cannot drift from its rows.

Contract:

- ``schema(cmd)`` -> the result schema (no I/O); ``table(ctx, cmd)`` -> the rows, as
  ``pa.Table`` with exactly that schema.
- ``MetadataContext`` gives handlers what they may use: the engine (for table names and
  schemas), the caller's principal, the SqlInfo values, and ``on_broken(name, error)``,
  called for each table that cannot be read (it is left out of GetTables).
- No keys exist in this format: GetPrimaryKeys, GetImportedKeys, GetExportedKeys and
  GetCrossReference answer empty results with the schema the spec asks for (BI tools fail
  on an error, not on an empty answer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from flightsrv import errors
from flightsrv.engine.api import Engine
from flightsrv.server import metadata as md
from flightsrv.server import proto


@dataclass
class MetadataContext:
    engine: Engine
    sql_info: dict[int, object]
    on_broken: Callable[[str, BaseException], None]


@dataclass(frozen=True)
class Metadata:
    schema: Callable[[object], pa.Schema]
    table: Callable[[MetadataContext, object], pa.Table]


def _opt(msg, name: str) -> str | None:
    return getattr(msg, name) if msg.HasField(name) else None


def _catalog_ok(msg, name: str) -> bool:
    """Whether the request's catalog filter admits the one catalog. Unset does not narrow;
    the empty string asks for objects without a catalog, which there are none of (Flight
    SQL's ``GetDbSchemas``/``GetTables``). Catalog and schema names match in any case, as
    in SQL (SqlInfo SQL_IDENTIFIER_CASE), like table names."""
    catalog = _opt(msg, name)
    return catalog is None or catalog.casefold() == md.CATALOG.casefold()


def _schema_ok(msg, name: str) -> bool:
    return md.matches(md.like_pattern(_opt(msg, name), ignore_case=True), md.DB_SCHEMA)


def sql_info(ctx: MetadataContext, cmd) -> pa.Table:
    return md.sql_info_table(ctx.sql_info, list(cmd.info))


def xdbc_type_info(ctx: MetadataContext, cmd) -> pa.Table:
    return md.xdbc_type_info(cmd.data_type if cmd.HasField("data_type") else None)


def catalogs(ctx: MetadataContext, cmd) -> pa.Table:
    return pa.table({"catalog_name": [md.CATALOG]}, schema=md.CATALOGS_SCHEMA)


def db_schemas(ctx: MetadataContext, cmd) -> pa.Table:
    ok = _catalog_ok(cmd, "catalog") and _schema_ok(cmd, "db_schema_filter_pattern")
    rows = [{"catalog_name": md.CATALOG, "db_schema_name": md.DB_SCHEMA}] if ok else []
    return pa.Table.from_pylist(rows, schema=md.DB_SCHEMAS_SCHEMA)


def _tables_schema(cmd) -> pa.Schema:
    return md.TABLES_SCHEMA_WITH_SCHEMA if cmd.include_schema else md.TABLES_SCHEMA


def tables(ctx: MetadataContext, cmd) -> pa.Table:
    """Healthy tables only: a table whose pointer, manifest or schema cannot be read is
    reported through ``ctx.on_broken`` and left out (GetTables has no status column)."""
    schema = _tables_schema(cmd)
    types_ok = not cmd.table_types or any(t in md.TABLE_TYPES for t in cmd.table_types)
    if not (types_ok and _catalog_ok(cmd, "catalog")
            and _schema_ok(cmd, "db_schema_filter_pattern")):
        return schema.empty_table()
    # a name in any case finds its table, as in SQL (SqlInfo SQL_IDENTIFIER_CASE)
    name_like = md.like_pattern(_opt(cmd, "table_name_filter_pattern"), ignore_case=True)
    broken: list = []
    names = ctx.engine.list_tables(broken)
    for name, exc in broken:
        if md.matches(name_like, name):
            ctx.on_broken(name, exc)
    rows = []
    for name in sorted(names):
        if not md.matches(name_like, name):
            continue
        row = {"catalog_name": md.CATALOG, "db_schema_name": md.DB_SCHEMA,
               "table_name": name, "table_type": "TABLE"}  # fmt: skip
        if cmd.include_schema:
            try:
                table_schema = ctx.engine.table_schema(name)
            except errors.TableNotFound:
                continue  # dropped since list_tables
            except errors.TransientError:
                raise
            except errors.FlightsrvError as exc:
                ctx.on_broken(name, exc)
                continue
            row["table_schema"] = md.annotate_table_schema(table_schema, name) \
                .serialize().to_pybytes()
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def table_types(ctx: MetadataContext, cmd) -> pa.Table:
    return pa.table({"table_type": list(md.TABLE_TYPES)}, schema=md.TABLE_TYPES_SCHEMA)


def _empty(schema: pa.Schema) -> Callable[[MetadataContext, object], pa.Table]:
    return lambda ctx, cmd: schema.empty_table()


def _fixed(schema: pa.Schema) -> Callable[[object], pa.Schema]:
    return lambda cmd: schema


METADATA: dict[type, Metadata] = {
    proto.CommandGetSqlInfo: Metadata(_fixed(md.SQL_INFO_SCHEMA), sql_info),
    proto.CommandGetXdbcTypeInfo: Metadata(_fixed(md.XDBC_TYPE_INFO_SCHEMA), xdbc_type_info),
    proto.CommandGetCatalogs: Metadata(_fixed(md.CATALOGS_SCHEMA), catalogs),
    proto.CommandGetDbSchemas: Metadata(_fixed(md.DB_SCHEMAS_SCHEMA), db_schemas),
    proto.CommandGetTables: Metadata(_tables_schema, tables),
    proto.CommandGetTableTypes: Metadata(_fixed(md.TABLE_TYPES_SCHEMA), table_types),
    proto.CommandGetPrimaryKeys: Metadata(_fixed(md.PRIMARY_KEYS_SCHEMA),
                                          _empty(md.PRIMARY_KEYS_SCHEMA)),
    proto.CommandGetExportedKeys: Metadata(_fixed(md.FOREIGN_KEYS_SCHEMA),
                                           _empty(md.FOREIGN_KEYS_SCHEMA)),
    proto.CommandGetImportedKeys: Metadata(_fixed(md.FOREIGN_KEYS_SCHEMA),
                                           _empty(md.FOREIGN_KEYS_SCHEMA)),
    proto.CommandGetCrossReference: Metadata(_fixed(md.FOREIGN_KEYS_SCHEMA),
                                             _empty(md.FOREIGN_KEYS_SCHEMA)),
}

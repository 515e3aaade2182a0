"""Maintenance statements and metadata table functions, as Arrow results.

- :func:`run_maintenance` runs a parsed ``Maintenance`` statement against its table:

  =========================================  ================================================
  ``OPTIMIZE t``                             ``table.compact()``
  ``VACUUM t``                               ``table.vacuum()`` (the table's default grace)
  ``VACUUM t RETAIN n HOURS``                ``table.vacuum(grace=n hours)``; ``n`` below
                                             :data:`MIN_GRACE_HOURS` is refused
                                             (``ConfigurationError``) unless the table
                                             property ``vacuum.allow_short_grace`` is
                                             ``'true'`` (a short grace can delete the files
                                             of a write that has not committed yet)
  ``VACUUM t RETAIN n VERSIONS``             ``table.expire_snapshots(retain_last=n)``, then
                                             vacuum
  ``... DRY RUN``                            both with ``dry_run=True`` (nothing changes)
  ``PURGE t [EXPIRE]``                       ``table.purge(expire=...)`` (erasure)
  ``PUBLISH t [FORMAT delta|iceberg|all]``   ``table.publish(format)`` (open-format mirrors,
                                             docs/INTEROP.md; default all)
  =========================================  ================================================

  and answers with :data:`MAINTENANCE_SCHEMA` rows: one per entry of each result's
  ``to_dict()`` (lists and dicts as JSON text), so the schema is known before the statement
  runs (a prepared statement must announce it).

- :func:`metadata_relation` evaluates ``flightsrv_table_stats('t')`` (one row: the typed
  fields of ``table.stats()``, ``reasons`` as JSON), ``flightsrv_history('t')`` (one row
  per retained version, newest first, :data:`HISTORY_SCHEMA`) and ``flightsrv_erasures('t')``
  (``SHOW ERASURES t``: one row per erasure certificate, oldest first,
  :data:`ERASURES_SCHEMA`, the whole certificate as JSON in ``certificate``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import json
import logging
import math
from typing import Any

import duckdb
import pyarrow as pa

from flightsrv.errors import ConfigurationError
from flightsrv.sql.types import quote_ident
from flightsrv.sql.validate import INFORMATION_SCHEMA_VIEWS
from flightsrv.sql.statements import Maintenance
from flightsrv.table.maintenance.common import duration

log = logging.getLogger("flightsrv.engine")

#: The shortest ``VACUUM ... RETAIN n HOURS`` grace accepted without the table property
#: :data:`ALLOW_SHORT_GRACE` (like Delta's retention duration check).
MIN_GRACE_HOURS = 1
ALLOW_SHORT_GRACE = "vacuum.allow_short_grace"

MAINTENANCE_SCHEMA = pa.schema([
    pa.field("table", pa.string(), nullable=False),
    pa.field("operation", pa.string(), nullable=False),  # compact|expire|vacuum|purge|publish
    pa.field("metric", pa.string(), nullable=False),
    pa.field("value", pa.string()),
])

HISTORY_SCHEMA = pa.schema([
    pa.field("version", pa.int64(), nullable=False),
    pa.field("created_at", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("operation", pa.string(), nullable=False),
    pa.field("rows_added", pa.int64()),
    pa.field("rows_deleted", pa.int64()),
    pa.field("files_added", pa.int64()),
    pa.field("files_removed", pa.int64()),
    pa.field("live_rows", pa.int64()),
    pa.field("files", pa.int64()),
    pa.field("summary", pa.string()),  # the rest of the version's summary, as JSON
])

_HISTORY_FIXED = {f.name for f in HISTORY_SCHEMA} - {"summary"}

ERASURES_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("verified_at", pa.timestamp("ms", tz="UTC")),
    pa.field("operation", pa.string(), nullable=False),
    pa.field("source", pa.string()),
    pa.field("request_fingerprint", pa.string()),
    pa.field("version_before", pa.int64()),
    pa.field("version_after", pa.int64()),
    pa.field("rows_removed", pa.int64()),
    pa.field("objects_rewritten", pa.int64()),
    pa.field("objects_deleted", pa.int64()),
    pa.field("objects_scanned", pa.int64()),
    pa.field("matches", pa.int64()),
    pa.field("status", pa.string(), nullable=False),
    pa.field("certificate", pa.string(), nullable=False),  # the whole record, JSON
])


def _text(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(v, default=str, sort_keys=True)


def _result_rows(table: str, operation: str, result: Any) -> list[dict]:
    if hasattr(result, "to_dict"):
        d = result.to_dict()
    elif isinstance(result, dict):
        d = result
    else:
        d = {"result": result}
    return [{"table": table, "operation": operation, "metric": str(k), "value": _text(v)}
            for k, v in d.items()]


def run_maintenance(table, stmt: Maintenance, read_live=None) -> pa.Table:
    """Run ``stmt`` on ``table`` (a flightsrv Table); the report as MAINTENANCE_SCHEMA rows.
    ``read_live``: the engine's reader of a file's live rows for compaction (see
    :func:`flightsrv.table.maintenance.compact.compact`), or None."""
    rows: list[dict] = []
    if stmt.verb == "optimize":
        kw = {} if read_live is None else {"read_live": read_live}
        rows += _result_rows(table.name, "compact", table.compact(**kw))
    elif stmt.verb == "vacuum":
        props = table.log.head().properties  # (a dropped table keeps its last properties)
        if stmt.retain_hours is not None and stmt.retain_hours < MIN_GRACE_HOURS and \
                str(props.get(ALLOW_SHORT_GRACE, "")).strip().lower() != "true":
            raise ConfigurationError(
                f"VACUUM RETAIN {stmt.retain_hours} HOURS is below the minimum grace of "
                f"{MIN_GRACE_HOURS} hour: it can delete the files of a write that has not "
                f"committed yet; set the table property {ALLOW_SHORT_GRACE} = 'true' to "
                "allow it", table=table.name, retain_hours=stmt.retain_hours,
                minimum_hours=MIN_GRACE_HOURS)
        kw: dict = {"dry_run": stmt.dry_run}
        if stmt.retain_versions is not None:
            expired = table.expire_snapshots(retain_last=stmt.retain_versions,
                                             dry_run=stmt.dry_run)
            rows += _result_rows(table.name, "expire", expired)
            if stmt.dry_run:  # nothing was expired: the vacuum counts them as gone
                kw["expired"] = expired.expired_versions
        if stmt.retain_hours is not None:
            kw["grace"] = duration(stmt.retain_hours * 3600)
        rows += _result_rows(table.name, "vacuum", table.vacuum(**kw))
    elif stmt.verb == "purge":
        rows += _result_rows(table.name, "purge", table.purge(expire=stmt.expire, source="sql"))
    elif stmt.verb == "publish":
        rows += _result_rows(table.name, "publish", table.publish(stmt.formats or "all"))
    else:
        raise ConfigurationError("unknown maintenance statement", verb=stmt.verb,
                                 table=table.name)
    return pa.Table.from_pylist(rows, schema=MAINTENANCE_SCHEMA)


def _stats_table(table) -> pa.Table:
    result = table.stats()
    d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    row = {k: (_text(v) if isinstance(v, (list, dict, tuple)) else v) for k, v in d.items()}
    return pa.Table.from_pylist([row])


def _history_table(table) -> pa.Table:
    rows = []
    for h in table.history():
        created = dt.datetime.fromisoformat(h["created_at"])
        extra = {k: v for k, v in h.items() if k not in _HISTORY_FIXED and k != "created_at"}
        row = {k: h.get(k) for k in _HISTORY_FIXED}
        row["created_at"] = created
        row["summary"] = json.dumps(extra, default=str, sort_keys=True) if extra else None
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=HISTORY_SCHEMA)


def _count(items) -> int | None:
    return None if items is None else len(items)


def _erasures_table(table) -> pa.Table:
    rows = []
    for c in table.erasures():
        ver = c.get("verification") or {}
        ms = c.get("verified_at_ms")
        versions = c.get("versions") or {}  # none in an unreadable one's record
        rows.append({
            "id": c["id"], "operation": c["operation"], "source": c.get("source"),
            "verified_at": dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)
            if ms is not None else None,
            "request_fingerprint": c.get("request_fingerprint"),
            "version_before": versions.get("before"),
            "version_after": versions.get("after"), "rows_removed": c.get("rows_removed"),
            "objects_rewritten": _count(c.get("objects_rewritten")),
            "objects_deleted": _count(c.get("objects_deleted")),
            "objects_scanned": ver.get("objects_scanned"), "matches": ver.get("matches"),
            "status": c["status"], "certificate": json.dumps(c, sort_keys=True)})
    return pa.Table.from_pylist(rows, schema=ERASURES_SCHEMA)


#: ``DESCRIBE t`` / ``SHOW COLUMNS FROM t``: DuckDB's DESCRIBE columns
COLUMNS_SCHEMA = pa.schema([
    pa.field("column_name", pa.string(), nullable=False),
    pa.field("column_type", pa.string(), nullable=False),
    pa.field("null", pa.string(), nullable=False),  # YES | NO
    pa.field("key", pa.string()),
    pa.field("default", pa.string()),
    pa.field("extra", pa.string()),
])

#: ``SHOW TABLES``: DuckDB's column name
TABLES_SCHEMA = pa.schema([pa.field("name", pa.string(), nullable=False)])


def _column_facts(table, con) -> tuple[pa.Schema, list[str], dict[str, str]]:
    """(the table's schema as DuckDB reads its files, DuckDB's name of each column's type,
    each default as a SQL literal DuckDB casts to the column type), all of one version (one
    head read). A table written before such types were widened at creation (a float16 or
    decimal256 column, which DuckDB cannot scan from Arrow) is described, and listed in
    information_schema, as DuckDB reads it (``storable_schema``)."""
    from flightsrv.table.schema import schema_from_json, storable_schema, write_defaults

    head = table.head()
    schema = schema_from_json(head.schema)
    defaults = write_defaults(head.schema, schema)
    # DuckDB names the types and spells the defaults (a literal DuckDB casts to the type)
    schema = storable_schema(schema)
    types = [str(t) for t in con.from_arrow(schema.empty_table()).dtypes]
    spelled = {}
    for name, value in defaults.items():
        if isinstance(value, bool):
            spelled[name] = "true" if value else "false"
        elif isinstance(value, (int, decimal.Decimal)) or (
                isinstance(value, float) and math.isfinite(value)):
            spelled[name] = repr(value) if isinstance(value, float) else str(value)
        else:
            text = con.execute("SELECT CAST($1 AS VARCHAR)", [value]).fetchone()[0]
            spelled[name] = "'" + text.replace("'", "''") + "'"
    return schema, types, spelled


def _columns_table(table) -> pa.Table:
    con = duckdb.connect()
    try:
        schema, types, spelled = _column_facts(table, con)
    finally:
        con.close()
    rows = [{"column_name": f.name, "column_type": t, "null": "YES" if f.nullable else "NO",
             "key": None, "default": spelled.get(f.name), "extra": None}
            for f, t in zip(schema, types)]
    return pa.Table.from_pylist(rows, schema=COLUMNS_SCHEMA)


def _information_schema(warehouse, view: str) -> pa.Table:
    """``information_schema.<view>``: DuckDB's own view, over an empty in-memory catalog
    named like the server's (``flightsrv.main``) that holds each readable table of the
    warehouse with its columns, DuckDB types, NOT NULL and defaults; rows of DuckDB's own
    catalogs are left out. A table that cannot be read is left out, as GetTables does."""
    from flightsrv.errors import FlightsrvError, TransientError
    from flightsrv.sql.validate import CATALOG, SCHEMA

    con = duckdb.connect()
    try:
        entries = []
        for name in sorted(warehouse.list_tables()):
            try:
                entries.append((name, *_column_facts(warehouse.table(name), con)))
            except TransientError:
                raise
            except FlightsrvError:
                continue  # dropped since the listing, or broken
    finally:
        con.close()
    return _information_view((view, CATALOG, SCHEMA, tuple(
        (name, schema.serialize().to_pybytes(), tuple(sorted(spelled.items())))
        for name, schema, _, spelled in entries)))


@functools.lru_cache(maxsize=16)
def _information_view(key) -> pa.Table:
    """The view's rows for the catalog ``key`` describes: (view, catalog, schema, ((table,
    its Arrow schema serialized, its defaults as SQL literals), ...)). The last 16 are kept:
    a dashboard asks the same question again."""
    view, catalog, schema_name, tables = key
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH ':memory:' AS {quote_ident(catalog)}")
        con.execute(f"USE {quote_ident(catalog)}")  # the default catalog, as on the server
        for name, serialized, defaults in tables:
            schema = pa.ipc.read_schema(pa.py_buffer(serialized))
            spelled = dict(defaults)
            target = ".".join(quote_ident(n) for n in (catalog, schema_name, name))
            con.register("src", schema.empty_table())
            con.execute(f"CREATE TABLE {target} AS FROM src")
            con.unregister("src")
            for f in schema:
                column = f"ALTER TABLE {target} ALTER COLUMN {quote_ident(f.name)}"
                if not f.nullable:
                    con.execute(f"{column} SET NOT NULL")
                if f.name in spelled:
                    try:
                        con.execute(f"{column} SET DEFAULT {spelled[f.name]}")
                    except duckdb.Error:  # one table's default never breaks the view
                        log.warning("information_schema: a column default DuckDB does not "
                                    "read", extra={"table": name, "column": f.name})
        catalog_column = INFORMATION_SCHEMA_VIEWS[view]
        where = "" if catalog_column is None else f" WHERE {catalog_column} = $1"
        return con.sql(f"SELECT * FROM information_schema.{view}{where}",
                       params=[catalog] if where else None).to_arrow_table()
    finally:
        con.close()


def _tables_table(warehouse) -> pa.Table:
    return pa.Table.from_pylist([{"name": n} for n in sorted(warehouse.list_tables())],
                                schema=TABLES_SCHEMA)


METADATA_FUNCTIONS = {
    "flightsrv_table_stats": _stats_table,
    "flightsrv_history": _history_table,
    "flightsrv_erasures": _erasures_table,
    "flightsrv_columns": _columns_table,
}


def metadata_relation(warehouse, function: str, table: str | None) -> pa.Table:
    """The Arrow table a metadata table function call stands for (``table`` None: a
    function of the whole warehouse, ``flightsrv_tables()``)."""
    if function == "flightsrv_tables":
        return _tables_table(warehouse)
    if function == "flightsrv_information_schema":
        return _information_schema(warehouse, table)
    return METADATA_FUNCTIONS[function](warehouse.table(table))

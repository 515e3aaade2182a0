"""Refuse SQL constructs that would reach outside the registered table snapshots.

This is the first line of defence; the second is the locked-down DuckDB connection
(``enable_external_access=false``, ``lock_configuration=true``, see
:mod:`flightsrv.engine.connection`). Rules, applied to the whole tree of one statement:

- A table function in FROM must be on :data:`ALLOWED_TABLE_FUNCTIONS` (range,
  generate_series, unnest). ``read_csv('/etc/passwd')``, ``glob('*')``,
  ``duckdb_settings()`` and the like are refused.
- A function whose name is on :data:`DENIED_FUNCTIONS` or starts with one of
  :data:`DENIED_PREFIXES` is refused wherever it appears.
- Qualified table names (``db.t``, ``information_schema.tables``) are refused: a table
  name always means a warehouse table (or a CTE).
- Nested unparsed commands are refused.

Raises :class:`~flightsrv.errors.SqlError` with the statement and position.
"""

from __future__ import annotations

from sqlglot import exp

#: Table functions a query may use in FROM. Everything else is refused.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

#: Functions refused anywhere in a statement.
DENIED_FUNCTIONS = frozenset({
    "glob", "sniff_csv", "query", "query_table", "getenv", "load_extension",
    "parquet_scan", "http_get", "http_post", "st_read", "checkpoint", "force_checkpoint",
    "which_secret", "sql_auto_complete", "test_all_types",
})

#: Function-name prefixes refused anywhere (file readers, catalog and scanner families).
DENIED_PREFIXES = (
    "read_", "write_", "parquet_", "duckdb_", "pragma_", "iceberg_", "delta_", "sqlite_",
    "postgres_", "mysql_", "arrow_scan", "scan_", "from_csv", "from_json_file",
)


def function_name(node: exp.Expression) -> str:
    """The SQL name of a function node, lower case (``read_csv``, ``range``)."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.GenerateSeries):
        return "range" if node.args.get("is_end_exclusive") else "generate_series"
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return type(node).__name__.lower()


def is_denied_function(name: str) -> bool:
    return name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES)


def check_tree(tree: exp.Expression, sql: str) -> None:
    from flightsrv.sql.statements import error  # local: statements imports this module

    for node in tree.walk():
        if isinstance(node, exp.Table):
            inner = node.this
            if isinstance(inner, exp.Identifier):
                if node.args.get("db") or node.args.get("catalog"):
                    raise error("qualified table names are not supported", sql, node,
                                table=node.sql("duckdb"))
                continue
            name = function_name(inner) if inner is not None else "?"
            if name not in ALLOWED_TABLE_FUNCTIONS:
                raise error(f"table function {name}() is not allowed", sql, node,
                            allowed=",".join(sorted(ALLOWED_TABLE_FUNCTIONS)))
        elif isinstance(node, exp.Func):
            name = function_name(node)
            if is_denied_function(name):
                raise error(f"function {name}() is not allowed", sql, node)
        elif isinstance(node, exp.Command) and node is not tree:
            raise error(f"{node.this} is not allowed inside a statement", sql, node)

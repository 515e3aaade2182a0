"""Refuse SQL constructs that would reach outside the registered table snapshots.

This is the first line of defence; the second is the locked-down DuckDB connection
(``enable_external_access=false``, ``lock_configuration=true``, see
:mod:`flightsrv.engine.connection`). Rules, applied to the whole tree of one statement:

- A table function in FROM must be on :data:`ALLOWED_TABLE_FUNCTIONS` (range,
  generate_series, unnest) or be one of flightsrv's :data:`METADATA_FUNCTIONS`
  (``flightsrv_table_stats('t')``, ``flightsrv_history('t')``, ``flightsrv_erasures('t')``).
  ``read_csv('/etc/passwd')``, ``glob('*')``,
  ``duckdb_settings()`` and the like are refused.
- A function whose name is on :data:`DENIED_FUNCTIONS` or starts with one of
  :data:`DENIED_PREFIXES` is refused wherever it appears.
- Qualified table names are accepted only for the one catalog and schema the server
  advertises (GetTables: catalog ``flightsrv``, schema ``main``): ``main.t``,
  ``flightsrv.main.t`` and their quoted forms mean the warehouse table ``t``;
  :func:`normalize_qualified` strips those qualifiers (tables and columns) before anything
  else looks at the tree. Any other qualifier (``information_schema.tables``,
  ``other.main.t``, ``system.t``) is refused: a table name always means a warehouse table
  (or a CTE).
- Nested unparsed commands are refused.

Raises :class:`~flightsrv.errors.SqlError` with the statement and position.
"""

from __future__ import annotations

from sqlglot import exp

#: Table functions a query may use in FROM. Everything else is refused.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

#: flightsrv's own table functions over table metadata, each taking one table name
#: (``'t'``, ``'main.t'``); the planner replaces them with registered Arrow relations.
METADATA_FUNCTIONS = frozenset({"flightsrv_table_stats", "flightsrv_history",
                                "flightsrv_erasures"})

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


#: The catalog and schema the server advertises (flightsrv.server.metadata uses the same).
CATALOG = "flightsrv"
SCHEMA = "main"

#: Identifier meta key: where a stripped ``[catalog.]schema.`` qualifier started in the text.
QUALIFIED_START = "qualified_start"


def _qualifier_error(node: exp.Expression, sql: str):
    from flightsrv.sql.statements import error  # local: statements imports this module

    return error(
        f"qualified name {node.sql('duckdb')!r} names an unknown schema or catalog: only "
        f"{CATALOG}.{SCHEMA} exists (write t, {SCHEMA}.t or {CATALOG}.{SCHEMA}.t)", sql, node,
        table=node.sql("duckdb"))


def _valid_qualifier(catalog: exp.Expression | None, db: exp.Expression | None) -> bool:
    if db is None:
        return catalog is None
    if not isinstance(db, exp.Identifier) or db.name.lower() != SCHEMA:
        return False
    return catalog is None or (isinstance(catalog, exp.Identifier)
                               and catalog.name.lower() == CATALOG)


def normalize_qualified(tree: exp.Expression, sql: str) -> bool:
    """Strip ``main.`` / ``flightsrv.main.`` qualifiers from table references and column
    references in place; refuse any other qualifier. Returns True when a *column* qualifier
    was stripped (the statement text then no longer matches the tree, so the planner must
    not splice the original text)."""
    columns_changed = False
    for node in list(tree.walk()):
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            db, catalog = node.args.get("db"), node.args.get("catalog")
            if db is None and catalog is None:
                continue
            if not _valid_qualifier(catalog, db):
                raise _qualifier_error(node, sql)
            first = catalog if catalog is not None else db
            start = (getattr(first, "_meta", None) or {}).get("start")
            if start is not None:
                node.this.meta[QUALIFIED_START] = start
            node.set("db", None)
            node.set("catalog", None)
        elif isinstance(node, exp.Column):
            db, catalog = node.args.get("db"), node.args.get("catalog")
            if db is None and catalog is None:
                continue
            if not _valid_qualifier(catalog, db):
                raise _qualifier_error(node, sql)
            node.set("db", None)
            node.set("catalog", None)
            columns_changed = True
    return columns_changed


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
            if name in METADATA_FUNCTIONS:
                args = inner.expressions if isinstance(inner, exp.Anonymous) else []
                if len(args) != 1 or not (isinstance(args[0], exp.Literal) and args[0].is_string):
                    raise error(f"{name}() takes one table name as a string, e.g. {name}('t')",
                                sql, node)
                continue
            if name not in ALLOWED_TABLE_FUNCTIONS:
                raise error(f"table function {name}() is not allowed", sql, node,
                            allowed=",".join(sorted(ALLOWED_TABLE_FUNCTIONS)))
        elif isinstance(node, exp.Func):
            name = function_name(node)
            if is_denied_function(name):
                raise error(f"function {name}() is not allowed", sql, node)
        elif isinstance(node, exp.Command) and node is not tree:
            raise error(f"{node.this} is not allowed inside a statement", sql, node)

"""Qualified names: the one catalog and schema the server advertises.

GetTables reports catalog ``flightsrv`` and schema ``main``, so ``main.t``,
``flightsrv.main.t`` and their quoted forms mean the warehouse table ``t``.
:func:`normalize_qualified` strips those qualifiers (tables and columns) before anything else
looks at the tree. ``information_schema.v`` (``v`` one of DuckDB's information_schema views)
becomes the metadata function call ``flightsrv_information_schema('v')``: DuckDB's own view
over a catalog that mirrors the warehouse's tables (:mod:`flightsrv.engine.maintenance`). Any
other qualifier of a table (``other.main.t``, ``system.t``) is refused, so a table name
always means a warehouse table, a CTE or one of those views. A column ``a.b.c`` whose ``a``
is not ``main`` is, as in DuckDB, struct field ``c`` of column ``b`` of relation ``a``.

What a statement may read and call is decided by :mod:`flightsrv.sql.binder` (relations,
with SQL scoping) and :mod:`flightsrv.engine.guard` (DuckDB's own parse of the final text
against the function allow-list in :mod:`flightsrv.sql.allowed_functions`).
"""

from __future__ import annotations

from sqlglot import exp

from flightsrv.sql.diag import error

#: The catalog and schema the server advertises (flightsrv.server.metadata uses the same).
CATALOG = "flightsrv"
SCHEMA = "main"

#: The schema of DuckDB's information_schema views, each served over the warehouse's catalog
#: through the metadata function :data:`INFORMATION_SCHEMA_FUNCTION`.
INFORMATION_SCHEMA = "information_schema"
#: view -> its column naming the catalog of a row (None: the view has none); the server
#: serves the rows of its own catalog only
INFORMATION_SCHEMA_VIEWS: dict[str, str | None] = {
    "character_sets": None, "check_constraints": "constraint_catalog",
    "columns": "table_catalog", "constraint_column_usage": "table_catalog",
    "constraint_table_usage": "table_catalog", "key_column_usage": "constraint_catalog",
    "referential_constraints": "constraint_catalog", "schemata": "catalog_name",
    "tables": "table_catalog", "table_constraints": "table_catalog", "views": "table_catalog"}
INFORMATION_SCHEMA_FUNCTION = "flightsrv_information_schema"
#: Identifier meta key of a rewritten information_schema view: the reference as written.
SHOWN = "shown"

#: Identifier meta key: where a stripped ``[catalog.]schema.`` qualifier started in the text.
QUALIFIED_START = "qualified_start"


def _qualifier_error(node: exp.Expression, sql: str):
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


def _information_schema(db: exp.Expression | None, catalog: exp.Expression | None) -> bool:
    return isinstance(db, exp.Identifier) and db.name.lower() == INFORMATION_SCHEMA and (
        catalog is None or isinstance(catalog, exp.Identifier)
        and catalog.name.lower() == CATALOG)


def _view_call(node: exp.Table, sql: str) -> None:
    """Turn ``information_schema.v`` into ``flightsrv_information_schema('v') AS v``."""
    view = node.name.lower()
    if view not in INFORMATION_SCHEMA_VIEWS:
        raise error(f"information_schema has no view {node.name!r}; it has "
                    f"{', '.join(sorted(INFORMATION_SCHEMA_VIEWS))}", sql, node,
                    table=node.sql("duckdb"))
    if node.args.get("when") is not None:
        raise error("time travel (AT ...) applies to tables, not to information_schema views",
                    sql, node, table=node.sql("duckdb"))
    alias = node.args.get("alias") or exp.TableAlias(
        this=exp.Identifier(this=node.name, quoted=node.this.quoted))
    call = exp.Anonymous(this=INFORMATION_SCHEMA_FUNCTION,
                         expressions=[exp.Literal.string(view)])
    call.meta[SHOWN] = f"{INFORMATION_SCHEMA}.{view}"
    node.set("this", call)
    node.set("db", None)
    node.set("catalog", None)
    node.set("alias", alias)


def normalize_qualified(tree: exp.Expression, sql: str) -> bool:
    """Strip ``main.`` / ``flightsrv.main.`` qualifiers from table references and column
    references in place, turn ``information_schema.v`` into its metadata function call;
    refuse any other qualifier. Returns True when the tree no longer says what the text
    says (a column qualifier stripped, a view rewritten): the planner must then not splice
    the original text."""
    columns_changed = False
    for node in list(tree.walk()):
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            db, catalog = node.args.get("db"), node.args.get("catalog")
            if db is None and catalog is None:
                continue
            if _information_schema(db, catalog):
                _view_call(node, sql)
                columns_changed = True
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
            if _information_schema(db, catalog) and \
                    node.args.get("table") is not None and \
                    node.args["table"].name.lower() in INFORMATION_SCHEMA_VIEWS:
                # information_schema.tables.table_name: the view's column (its alias is
                # the view's name)
                node.set("db", None)
                node.set("catalog", None)
                columns_changed = True
                continue
            if not _valid_qualifier(catalog, db):
                # DuckDB reads a.b.c as schema a, table b, column c only when schema a
                # exists; else as relation a, column b, struct field c (s.st.b). Only
                # main exists here, so it is the field access. A column binds only to a
                # relation of its FROM (which the binder and the guard allow): for any
                # other ``a`` DuckDB's binder refuses it
                parts = [p for p in (catalog, db, node.args.get("table"), node.this)
                         if p is not None]
                if not all(isinstance(p, exp.Identifier) for p in parts):
                    raise _qualifier_error(node, sql)
                field: exp.Expression = exp.Column(this=parts[1], table=parts[0])
                for name in parts[2:]:
                    field = exp.Dot(this=field, expression=name)
                node.replace(field)
                continue
            node.set("db", None)
            node.set("catalog", None)
            columns_changed = True
    return columns_changed

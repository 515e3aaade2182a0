"""Qualified names: the one catalog and schema the server advertises.

GetTables reports catalog ``flightsrv`` and schema ``main``, so ``main.t``,
``flightsrv.main.t`` and their quoted forms mean the warehouse table ``t``.
:func:`normalize_qualified` strips those qualifiers (tables and columns) before anything else
looks at the tree; any other qualifier of a table (``information_schema.tables``,
``other.main.t``, ``system.t``) is refused, so a table name always means a warehouse table
(or a CTE). A column ``a.b.c`` whose ``a`` is not ``main`` is, as in DuckDB, struct field
``c`` of column ``b`` of relation ``a``.

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

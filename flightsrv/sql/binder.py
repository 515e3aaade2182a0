"""Resolve every relation a statement reads, with SQL scoping, and refuse everything else.

This is the first half of the sandbox (the second is :mod:`flightsrv.engine.guard`, which
checks the exact text DuckDB will run against DuckDB's own parse of it). The rule is
structural: a name in a FROM/JOIN/USING position means, in this order,

1. a CTE visible at that point: a ``WITH`` of an enclosing query, where CTE ``i`` of a
   ``WITH`` sees CTEs ``0 .. i-1`` of the same ``WITH`` and, under ``WITH RECURSIVE``, itself
   (DuckDB's rules: a non-recursive CTE does not see itself, nor a later sibling);
2. a relation the caller bound by name (``extra``: e.g. an Arrow table given to the Python
   API's ``merge``);
3. a warehouse table (``t``; ``main.t`` and ``flightsrv.main.t`` were normalised earlier),
   which the planner pins to a snapshot.

Anything else is refused before DuckDB sees the statement: a name that cannot be a table
(a quoted path, a glob) is ``TableNotFound``; a table function other than
:data:`~flightsrv.sql.allowed_functions.TABLE_FUNCTIONS` and flightsrv's metadata
functions is ``SqlError``. CTE names must be plain identifiers, and no identifier may use the
prefix the engine reserves for its own relations and hidden columns (:data:`RESERVED`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot import exp

from flightsrv.errors import SqlError, TableNotFound
from flightsrv.sql.allowed_functions import TABLE_FUNCTIONS
from flightsrv.sql.diag import error
from flightsrv.sql.validate import INFORMATION_SCHEMA_FUNCTION, INFORMATION_SCHEMA_VIEWS

#: Identifier prefix reserved for the engine's relations and hidden columns.
RESERVED = "__fsrv"

#: flightsrv's own table functions over table metadata, each taking one table name.
METADATA_FUNCTIONS = frozenset({"flightsrv_table_stats", "flightsrv_history",
                                "flightsrv_erasures", "flightsrv_columns", "flightsrv_tables",
                                INFORMATION_SCHEMA_FUNCTION})
#: metadata functions that describe the warehouse, not one table: they take no argument
WAREHOUSE_FUNCTIONS = frozenset({"flightsrv_tables"})

_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,127}")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def is_table_name(name: str) -> bool:
    """Whether ``name`` (any case) can name a warehouse table."""
    return _TABLE_NAME.fullmatch(name.lower()) is not None and \
        not name.lower().startswith(RESERVED)


@dataclass
class Binding:
    """What a statement reads. Nodes are the statement tree's own ``exp.Table`` nodes."""

    tables: list[exp.Table] = field(default_factory=list)  # warehouse tables, walk order
    functions: list[exp.Table] = field(default_factory=list)  # metadata function calls
    extras: list[exp.Table] = field(default_factory=list)  # relations bound by the caller


def _err(message: str, sql: str, node: exp.Expression | None = None, **ctx) -> SqlError:
    return error(message, sql, node, **ctx)


def function_name(node: exp.Expression) -> str:
    """The SQL name of a function node, lower case (``read_csv``, ``range``)."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.GenerateSeries):
        return "range" if node.args.get("is_end_exclusive") else "generate_series"
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return type(node).__name__.lower()


def _order(root: exp.Expression):
    index = {id(n): i for i, n in enumerate(root.walk())}
    return lambda node: index.get(id(node), len(index))


def _check_reserved(tree: exp.Expression, sql: str) -> None:
    for node in tree.find_all(exp.Identifier):
        if str(node.this).lower().startswith(RESERVED):
            raise _err(f"identifiers starting with {RESERVED!r} are reserved", sql, node)


class _Binder:
    def __init__(self, sql: str, extra: frozenset[str], skip: set[int]):
        self.sql = sql
        self.extra = extra
        self.skip = skip  # ids of Table nodes the caller handles (a DML target)
        self.out = Binding()

    def visit(self, root: exp.Expression, scope: frozenset[str]) -> None:
        # iterative (an explicit stack): a WHERE of thousands of ANDed terms nests that deep
        stack = [(root, scope)]
        while stack:
            node, scope = stack.pop()
            if type(node) is exp.Literal:  # no child expressions (a 1,000-value IN list)
                continue
            with_ = node.args.get("with_")
            if isinstance(with_, exp.With):
                names: list[str] = []
                recursive = bool(with_.args.get("recursive"))
                for cte in with_.expressions:
                    name = cte.alias_or_name
                    if not _PLAIN.fullmatch(name or ""):
                        raise _err("a CTE name must be a plain identifier (letters, digits, _)",
                                   self.sql, cte, cte=repr(name))
                    own = {name.lower()} if recursive else set()
                    stack.append((cte.this, scope | frozenset(names) | own))
                    names.append(name.lower())
                scope = scope | frozenset(names)
            if isinstance(node, exp.Table):
                stack.extend((c, scope) for c in self.table(node, scope))
                continue
            for key, child in node.args.items():
                if key == "with_":
                    continue
                for c in (child if isinstance(child, list) else [child]):
                    if isinstance(c, exp.Expression):
                        stack.append((c, scope))
        # walk order: callers expect references in the order they appear (one index of the
        # whole walk, built only when a list has two or more references to order)
        lists = [x for x in (self.out.tables, self.out.functions, self.out.extras)
                 if len(x) > 1]
        if lists:
            key = _order(root)
            for x in lists:
                x.sort(key=key)

    def table(self, node: exp.Table, scope: frozenset[str]) -> list[exp.Expression]:
        """Resolve one table reference; returns its children that may hold subqueries."""
        inner = node.this
        if isinstance(inner, exp.Identifier):
            for part in ("db", "catalog"):
                if node.args.get(part) is not None:  # normalize_qualified ran before
                    raise _err("qualified table names are not supported", self.sql, node,
                               table=node.sql("duckdb"))
            if id(node) in self.skip:
                pass
            elif node.name.lower() in scope:
                if node.args.get("when") is not None:
                    raise _err("time travel (AT ...) applies to tables, not to CTEs",
                               self.sql, node, cte=node.name)
            elif node.name in self.extra or node.name.lower() in self.extra:
                self.out.extras.append(node)
            elif not is_table_name(node.name):
                raise TableNotFound("no such table", table=repr(node.name))
            else:
                self.out.tables.append(node)
        elif inner is not None:
            name = function_name(inner)
            if name in METADATA_FUNCTIONS:
                args = inner.expressions if isinstance(inner, exp.Anonymous) else []
                if name in WAREHOUSE_FUNCTIONS:
                    if args:
                        raise _err(f"{name}() takes no argument", self.sql, node)
                elif name == INFORMATION_SCHEMA_FUNCTION:
                    if len(args) != 1 or not (isinstance(args[0], exp.Literal)
                                              and args[0].is_string
                                              and args[0].name in INFORMATION_SCHEMA_VIEWS):
                        raise _err(f"{name}() takes the name of an information_schema view",
                                   self.sql, node,
                                   views=",".join(sorted(INFORMATION_SCHEMA_VIEWS)))
                elif len(args) != 1 or not (isinstance(args[0], exp.Literal)
                                            and args[0].is_string):
                    raise _err(f"{name}() takes one table name as a string, e.g. {name}('t')",
                               self.sql, node)
                self.out.functions.append(node)
            elif name not in TABLE_FUNCTIONS:
                raise _err(f"table function {name}() is not allowed", self.sql, node,
                           allowed=",".join(sorted(TABLE_FUNCTIONS | METADATA_FUNCTIONS)))
        # arguments of table functions, a sample clause, joins: may hold subqueries
        out = []
        for key, child in node.args.items():
            if key in ("this", "db", "catalog", "alias") and isinstance(inner, exp.Identifier):
                continue
            for c in (child if isinstance(child, list) else [child]):
                if isinstance(c, exp.Expression):
                    out.append(c)
        return out


def bind(tree: exp.Expression, sql: str, *, extra: frozenset[str] = frozenset(),
         skip: tuple[exp.Table, ...] = ()) -> Binding:
    """Resolve the relations of ``tree`` (see the module docstring). ``skip``: table nodes
    the caller resolves itself (the target of a DELETE/UPDATE/MERGE)."""
    _check_reserved(tree, sql)
    b = _Binder(sql, extra, {id(t) for t in skip})
    b.visit(tree, frozenset())
    return b.out


__all__ = ["Binding", "METADATA_FUNCTIONS", "RESERVED", "WAREHOUSE_FUNCTIONS", "bind",
           "function_name",
           "is_table_name"]

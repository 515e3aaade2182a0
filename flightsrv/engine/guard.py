"""The second half of the sandbox: check the exact SQL text DuckDB will run, as DuckDB parses
it, before it runs.

:func:`verify` parses a SELECT with DuckDB's own parser (``json_serialize_sql``, which
serialises DuckDB's parse tree without binding or running anything) and walks the tree with
an allow-list at every level:

- query nodes: SELECT, set operations, recursive CTEs;
- table references: a relation the engine registered for this statement (``relations``), a
  CTE visible at that point under DuckDB's scoping (CTE ``i`` of a ``WITH`` sees CTEs
  ``0 .. i-1`` and, when DuckDB made it a recursive CTE, itself), an allowed table function
  (:data:`~flightsrv.sql.allowed_functions.TABLE_FUNCTIONS`), a subquery, a join, a VALUES
  list, a PIVOT; never a schema- or catalog-qualified name, never ``AT (...)``;
- expressions: the expression classes DuckDB uses for scalar SQL; every function call by
  unqualified name from :data:`~flightsrv.sql.allowed_functions.SCALAR_FUNCTIONS`;
- with ``deterministic=True`` (the part of a DML statement that decides which rows
  change): no volatile function (DuckDB's own stability flag) and no sample clause.

Anything not on a list is refused with :class:`~flightsrv.errors.SqlError`. Because the
check runs on DuckDB's parse of the final text, a disagreement between sqlglot (the front
end) and DuckDB about what the text means cannot let a file name through: whatever DuckDB
sees as a table must be one the engine registered.

Results are cached by text (the engine's relation names are deterministic per statement).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading

import duckdb
import orjson

from flightsrv.errors import SqlError
from flightsrv.sql.allowed_functions import SCALAR_FUNCTIONS, TABLE_FUNCTIONS, VOLATILE_FUNCTIONS
from flightsrv.sql.binder import RESERVED
from flightsrv.runtime import text_cache

_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
_TABLE_REFS = frozenset({"BASE_TABLE", "TABLE_FUNCTION", "SUBQUERY", "JOIN", "EMPTY",
                         "EMPTY_FROM", "EXPRESSION_LIST", "PIVOT"})
_EXPRESSIONS = frozenset({
    "CONSTANT", "COLUMN_REF", "FUNCTION", "COMPARISON", "CONJUNCTION", "OPERATOR", "CASE",
    "CAST", "SUBQUERY", "STAR", "WINDOW", "BETWEEN", "COLLATE", "LAMBDA", "LAMBDA_REF",
    "PARAMETER", "POSITIONAL_REFERENCE", "DEFAULT", "TYPE",
})

# json_serialize_sql only parses (no catalog, no files); a cursor per call. The database is
# opened on first use, not at import: a process that imports flightsrv and then forks (a
# pre-forking server, a fork server, the test suite's CLI launcher) would hand its children
# a database whose worker threads they do not have, and closing it there aborts the process
_parser = None
_parser_lock = threading.Lock()


def _forked_child() -> None:
    global _parser, _parser_lock
    if _parser is not None:
        # the parent's database is never closed here, not even at interpreter exit: its
        # destructor would join threads of the parent (one leaked reference keeps it)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_parser))
        _parser = None
    _parser_lock = threading.Lock()


os.register_at_fork(after_in_child=_forked_child)


def _parse(text: str) -> dict:
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:", config={"enable_external_access": "false",
                                                         "threads": "1"})
        cur = _parser.cursor()
    try:
        raw = cur.execute("SELECT json_serialize_sql(?)", [text]).fetchone()[0]
    finally:
        cur.close()
    try:
        # the same objects as json.loads, several times faster (a 1,000-constant IN list
        # serialises to ~150 kB); anything orjson refuses (integers beyond 64 bits, NaN)
        # goes through json.loads as before
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


class _Walk:
    def __init__(self, relations: frozenset[str], columns: frozenset[str],
                 deterministic: bool, sql: str):
        self.relations = relations
        self.columns = columns
        self.deterministic = deterministic
        self.sql = sql

    def refuse(self, message: str, **ctx) -> SqlError:
        from flightsrv.sql.statements import _short

        return SqlError(message, statement=_short(self.sql), **ctx)

    def walk(self, node, scope: frozenset[str]) -> None:
        if isinstance(node, list):
            for x in node:
                self.walk(x, scope)
            return
        if not isinstance(node, dict):
            return
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict) and cte_map.get("map"):
            names: list[str] = []
            for entry in cte_map["map"]:
                name = str(entry.get("key", "")).lower()
                value = entry.get("value") or {}
                qn = value.get("query_node") or {}
                own = {name} if qn.get("type") == "RECURSIVE_CTE_NODE" else set()
                self.walk(value, scope | frozenset(names) | own)
                names.append(name)
            scope = scope | frozenset(names)
        self.check(node, scope)
        for key, value in node.items():
            if key != "cte_map" and isinstance(value, (dict, list)):
                self.walk(value, scope)

    def check(self, node: dict, scope: frozenset[str]) -> None:
        if "class" in node:
            cls = node["class"]
            if cls not in _EXPRESSIONS:
                raise self.refuse(f"expression kind {cls.lower()} is not allowed")
            if cls in ("FUNCTION", "WINDOW"):
                self.function(node)
            elif cls == "TYPE" and (node.get("schema") or node.get("catalog")):
                raise self.refuse("qualified type names are not allowed")
            elif cls == "COLUMN_REF":
                for name in node.get("column_names") or []:
                    n = str(name).lower()
                    if n.startswith(RESERVED) and n not in self.columns \
                            and n not in self.relations:
                        raise self.refuse(f"identifiers starting with {RESERVED!r} are reserved")
            return
        kind = node.get("type")
        if not isinstance(kind, str):
            return
        if kind.endswith("_NODE"):
            if kind not in _NODES:
                raise self.refuse(f"query kind {kind.lower()} is not allowed")
            if self.deterministic and node.get("sample"):
                raise self.refuse("a sample (USING SAMPLE / TABLESAMPLE) cannot decide which "
                                  "rows a statement changes")
            return
        if kind in _TABLE_REFS:
            self.table(node, kind, scope)
            return
        if kind == "SHOW_REF":
            # SUMMARIZE / DESCRIBE of a query: a function of the query's rows (or columns),
            # whose own tree is checked as any subquery; SHOW of a name reads DuckDB's
            # catalog, never
            if node.get("show_type") not in ("SUMMARY", "DESCRIBE") or node.get("table_name") \
                    or not isinstance(node.get("query"), dict):
                raise self.refuse("show_ref is not allowed")
            return
        if kind.endswith("_MODIFIER") or kind.startswith("ORDER_") or kind in (
                "ASCENDING", "DESCENDING"):
            return
        raise self.refuse(f"{kind.lower()} is not allowed")

    def table(self, node: dict, kind: str, scope: frozenset[str]) -> None:
        if self.deterministic and node.get("sample"):
            raise self.refuse("a sample (TABLESAMPLE) cannot decide which rows a statement "
                              "changes")
        if kind == "BASE_TABLE":
            name = str(node.get("table_name", ""))
            if node.get("schema_name") or node.get("catalog_name"):
                raise self.refuse("qualified relation names are not allowed here",
                                  relation=repr(name))
            if node.get("at_clause"):
                raise self.refuse("AT (...) is not allowed here", relation=repr(name))
            low = name.lower()
            if low in scope or low in self.relations:
                return
            raise self.refuse("statement names a relation the server did not bind",
                              relation=repr(name))
        if kind == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            name = str(fn.get("function_name", "")).lower()
            if fn.get("schema") or fn.get("catalog") or name not in TABLE_FUNCTIONS:
                raise self.refuse(f"table function {name}() is not allowed",
                                  allowed=",".join(sorted(TABLE_FUNCTIONS)))

    def function(self, node: dict) -> None:
        name = str(node.get("function_name", "")).lower()
        if node.get("schema") or node.get("catalog"):
            raise self.refuse("qualified function names are not allowed",
                              function=f"{node.get('schema')}.{name}")
        if name not in SCALAR_FUNCTIONS:
            raise self.refuse(f"function {name}() is not allowed")
        if self.deterministic and name in VOLATILE_FUNCTIONS:
            raise self.refuse(f"function {name}() is volatile: its result cannot decide "
                              "which rows a statement changes", function=name)


@text_cache(maxsize=4096)
def _verify_cached(text: str, relations: frozenset[str], columns: frozenset[str],
                   deterministic: bool, sql: str) -> None:
    try:
        tree = _parse(text)
    except duckdb.Error as e:
        err = SqlError.from_engine(str(e).splitlines()[0], statement=sql[:200])
        err.engine_class = type(e).__name__  # the engine explains it on the user's text
        raise err from None
    if tree.get("error") and "Only SELECT" in str(tree.get("error_message")) \
            and not text.lstrip().lower().startswith("select * from ("):
        # PIVOT / UNPIVOT statements: DuckDB parses the same grammar as a subquery
        return _verify_cached(f"SELECT * FROM ({text})", relations, columns, deterministic, sql)
    if tree.get("error"):
        from flightsrv.sql.statements import _short

        msg = str(tree.get("error_message") or "does not parse").splitlines()[0]
        if "Only SELECT" in msg:
            raise SqlError("this query shape cannot be verified (a PIVOT needs an explicit "
                           "IN (...) list)", statement=_short(sql))
        err = SqlError.from_engine(f"syntax error: {msg}", statement=_short(sql))
        err.engine_class = "ParserException"  # the engine explains it on the user's text
        raise err
    statements = tree.get("statements") or []
    if len(statements) != 1:
        raise SqlError("one statement per request", statement=sql[:200])
    _Walk(relations, columns, deterministic, sql).walk(statements[0].get("node"), frozenset())


def verify(text: str, relations, *, sql: str, columns=(), deterministic: bool = False) -> None:
    """Raise :class:`SqlError` unless ``text`` (one SELECT) reads only ``relations`` (names
    the engine registered), visible CTEs and allowed table functions, and calls only
    allowed functions. ``sql`` is the user's statement, for the error message; ``columns``
    are reserved-prefix column names the engine itself uses in ``text``."""
    _verify_cached(text, frozenset(r.lower() for r in relations),
                   frozenset(c.lower() for c in columns), deterministic, sql)


__all__ = ["verify"]

"""Parse one SQL statement (DuckDB dialect, via sqlglot) and classify it into exactly one path.

Contract: :func:`parse_statement` returns one of the ``Statement`` subclasses below or
raises :class:`~flightsrv.errors.SqlError` naming the statement and, where sqlglot gives
one, the position (``line``/``col``). Nothing here touches tables or DuckDB.

Accepted:

=====================  =====================================================================
``Query``              SELECT (WITH, joins, aggregates, windows, set operations, VALUES)
``Delete``             DELETE FROM t [WHERE ...]
``Insert``             INSERT INTO t [(cols)] SELECT ... | VALUES ...
``CreateTable``        CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t (col type, ...)
``CreateTableAs``      CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t AS SELECT ...
``DropTable``          DROP TABLE [IF EXISTS] t
``Maintenance``        VACUUM t, OPTIMIZE t
``SetSession``         SET delete_mode = 'splice' | 'dv'   (a flightsrv session setting)
=====================  =====================================================================

Everything else (ATTACH, COPY, INSTALL/LOAD, PRAGMA, engine SET, EXPORT/IMPORT, UPDATE,
views, macros, ...) and more than one statement is refused with a reason. Table functions
and file-reading functions are checked by :mod:`flightsrv.sql.validate`.

Parameters: ``?`` placeholders are renumbered to ``$1, $2, ...`` in text order before
parsing, so every statement carries numbered placeholders and ``param_count``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from flightsrv.errors import SqlError
from flightsrv.sql import types as sqltypes
from flightsrv.sql import validate

DIALECT = "duckdb"

#: Session settings that ``SET`` may change, with their allowed values.
SESSION_SETTINGS: dict[str, frozenset[str]] = {
    "delete_mode": frozenset({"splice", "dv"}),
}

#: Maintenance verbs; sqlglot parses them as generic Commands.
MAINTENANCE_VERBS = frozenset({"VACUUM", "OPTIMIZE"})

# sqlglot warns on every Command fallback (VACUUM, LOAD, CALL); we classify those ourselves.
logging.getLogger("sqlglot").setLevel(logging.ERROR)


# -- statement types ---------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    sql: str  # the original text
    tree: exp.Expression  # parsed from ``text``; token offsets in node meta refer to it
    param_count: int
    text: str = field(default="", kw_only=True)  # ``sql`` with ? renumbered to $1..$n

    #: True for statements that change tables (a READER may not run them).
    writes: ClassVar[bool] = False


@dataclass(frozen=True)
class Query(Statement):
    pass


@dataclass(frozen=True)
class Delete(Statement):
    table: str = ""
    alias: str | None = None
    where: exp.Expression | None = None  # the WHERE condition, None = delete everything
    writes = True


@dataclass(frozen=True)
class Insert(Statement):
    table: str = ""
    columns: tuple[str, ...] | None = None  # INSERT INTO t (a, b) ...
    source: exp.Expression | None = None  # SELECT / VALUES / set operation
    writes = True


@dataclass(frozen=True)
class CreateTable(Statement):
    table: str = ""
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    if_not_exists: bool = False
    replace: bool = False
    writes = True


@dataclass(frozen=True)
class CreateTableAs(Statement):
    table: str = ""
    query: exp.Expression | None = None
    if_not_exists: bool = False
    replace: bool = False
    writes = True


@dataclass(frozen=True)
class DropTable(Statement):
    table: str = ""
    if_exists: bool = False
    writes = True


@dataclass(frozen=True)
class Maintenance(Statement):
    verb: str = ""  # "vacuum" | "optimize"
    table: str = ""
    options: str = ""  # any text after the table name, unparsed
    writes = True


@dataclass(frozen=True)
class SetSession(Statement):
    name: str = ""
    value: str = ""


# -- errors and positions ------------------------------------------------------------


def position(node: exp.Expression | None) -> tuple[int | None, int | None]:
    """(line, col) of the first token sqlglot recorded under ``node``, else (None, None)."""
    if node is None:
        return None, None
    for n in node.walk():
        meta = getattr(n, "_meta", None) or {}
        if "line" in meta:
            col = meta.get("col")
            if col is not None and "start" in meta and "end" in meta:
                col = col - (meta["end"] - meta["start"])  # sqlglot's col is the token's end
            return meta["line"], col
    return None, None


def error(message: str, sql: str, node: exp.Expression | None = None, **ctx) -> SqlError:
    line, col = position(node)
    return SqlError(message, statement=_short(sql), line=line, col=col, **ctx)


def _short(sql: str, limit: int = 200) -> str:
    s = " ".join(sql.split())
    return repr(s if len(s) <= limit else s[: limit - 3] + "...")


# -- placeholders --------------------------------------------------------------------


def number_placeholders(sql: str) -> tuple[str, int]:
    """Rewrite ``?`` to ``$1, $2, ...`` in text order; return the text and parameter count.

    ``$n`` placeholders are kept. Mixing ``?`` with ``$n`` and named ``$name`` parameters
    are refused.
    """
    try:
        tokens = DuckDB().tokenize(sql)
    except TokenError as e:
        raise SqlError(f"cannot tokenize: {e}", statement=_short(sql)) from None
    out, last, qmarks, numbered = [], 0, 0, 0
    for i, tok in enumerate(tokens):
        if (tok.token_type == TokenType.PLACEHOLDER and tok.text == "?") or (
                tok.token_type == TokenType.QDCOLON and tok.text == "?::"):  # ?::INT
            qmarks += 1
            out.append(sql[last : tok.start])
            out.append(f"${qmarks}" + tok.text[1:])
            last = tok.end + 1
        elif tok.token_type == TokenType.PARAMETER:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if nxt is None or nxt.token_type != TokenType.NUMBER or not nxt.text.isdigit():
                raise SqlError(
                    "named parameters are not supported; use ? or $1",
                    statement=_short(sql), line=tok.line, col=tok.col,
                )
            numbered = max(numbered, int(nxt.text))
    if qmarks and numbered:
        raise SqlError("do not mix ? and $n parameters", statement=_short(sql))
    out.append(sql[last:])
    return "".join(out), qmarks or numbered


# -- parsing ---------------------------------------------------------------------------


def parse_statement(sql: str) -> Statement:
    """Parse and classify exactly one statement; SqlError on anything we do not run."""
    if not sql or not sql.strip():
        raise SqlError("empty statement", statement=_short(sql or ""))
    text, nparams = number_placeholders(sql)
    try:
        trees = [t for t in sqlglot.parse(text, read=DIALECT) if t is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        raise SqlError(
            f"syntax error: {first.get('description', str(e))}",
            statement=_short(sql), line=first.get("line"), col=first.get("col"),
        ) from None
    except TokenError as e:
        raise SqlError(f"cannot tokenize: {e}", statement=_short(sql)) from None
    if not trees:
        raise SqlError("empty statement", statement=_short(sql))
    if len(trees) > 1:
        line, col = position(trees[1])
        raise SqlError(
            f"one statement per request; got {len(trees)}",
            statement=_short(sql), line=line, col=col,
        )
    tree = trees[0]
    stmt = _classify(sql, tree, nparams)
    object.__setattr__(stmt, "text", text)
    validate.check_tree(stmt.tree, sql)
    return stmt


def _table_name(table: exp.Expression, sql: str, what: str) -> str:
    if isinstance(table, exp.Schema):
        table = table.this
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise error(f"{what} needs a plain table name", sql, table)
    if table.args.get("db") or table.args.get("catalog"):
        raise error(f"{what}: qualified table names are not supported", sql, table,
                    table=table.sql(DIALECT))
    return table.name


def _classify(sql: str, tree: exp.Expression, n: int) -> Statement:
    if isinstance(tree, exp.Query):  # Select, Union/Intersect/Except, Values-as-query
        return Query(sql, tree, n)
    if isinstance(tree, exp.Values):
        return Query(sql, tree, n)
    if isinstance(tree, exp.Delete):
        return _delete(sql, tree, n)
    if isinstance(tree, exp.Insert):
        return _insert(sql, tree, n)
    if isinstance(tree, exp.Create):
        return _create(sql, tree, n)
    if isinstance(tree, exp.Drop):
        kind = (tree.args.get("kind") or "").upper()
        if kind != "TABLE":
            raise error(f"DROP {kind or '?'} is not supported; only DROP TABLE", sql, tree)
        tables = tree.args.get("tables") or [tree.this]
        if len(tables) != 1:
            raise error("DROP TABLE takes one table", sql, tree)
        return DropTable(sql, tree, n, table=_table_name(tables[0], sql, "DROP TABLE"),
                         if_exists=bool(tree.args.get("exists")))
    if isinstance(tree, exp.Set):
        return _set(sql, tree, n)
    if isinstance(tree, exp.Command):
        verb = str(tree.this).upper()
        if verb in MAINTENANCE_VERBS:
            return _maintenance(sql, tree, n, verb)
        raise error(f"{verb} statements are not allowed", sql, tree)
    refused = {
        exp.Copy: "COPY is not allowed; query the table and stream the result instead",
        exp.Attach: "ATTACH is not allowed",
        exp.Detach: "DETACH is not allowed",
        exp.Install: "INSTALL is not allowed",
        exp.Pragma: "PRAGMA is not allowed",
        exp.Update: "UPDATE is not supported; use DELETE and INSERT",
        exp.Use: "USE is not allowed",
        exp.Describe: "DESCRIBE is not supported; use the Flight SQL metadata calls",
        exp.Show: "SHOW is not supported; use the Flight SQL metadata calls",
        exp.Merge: "MERGE is not supported",
    }
    for cls, reason in refused.items():
        if isinstance(tree, cls):
            raise error(reason, sql, tree)
    verb = sql.split(None, 1)[0].upper().rstrip(";")
    raise error(f"{verb} statements are not allowed", sql, tree)


def _delete(sql: str, tree: exp.Delete, n: int) -> Delete:
    target = tree.this
    if tree.args.get("using") or tree.args.get("returning"):
        raise error("DELETE ... USING/RETURNING is not supported", sql, tree)
    name = _table_name(target, sql, "DELETE")
    alias = target.alias or None
    where = tree.args.get("where")
    cond = where.this if where is not None else None
    if cond is not None and cond.find(exp.Query, exp.Subquery):
        raise error("DELETE ... WHERE with a subquery is not supported", sql, cond)
    return Delete(sql, tree, n, table=name, alias=alias, where=cond)


def _insert(sql: str, tree: exp.Insert, n: int) -> Insert:
    for flag in ("overwrite", "ignore", "returning", "conflict", "by_name"):
        if tree.args.get(flag):
            raise error(f"INSERT with {flag.upper().replace('_', ' ')} is not supported", sql, tree)
    target = tree.this
    columns = None
    if isinstance(target, exp.Schema):
        columns = tuple(c.name for c in target.expressions)
    name = _table_name(target, sql, "INSERT")
    source = tree.expression
    if not isinstance(source, (exp.Query, exp.Values)):
        raise error("INSERT needs a SELECT or VALUES source", sql, tree)
    return Insert(sql, tree, n, table=name, columns=columns, source=source)


def _create(sql: str, tree: exp.Create, n: int) -> Statement:
    kind = (tree.args.get("kind") or "").upper()
    if kind != "TABLE":
        raise error(f"CREATE {kind or '?'} is not supported; only CREATE TABLE", sql, tree)
    props = tree.args.get("properties")
    if props is not None:
        for p in props.expressions:
            if isinstance(p, exp.TemporaryProperty):
                raise error("temporary tables are not supported", sql, tree)
    replace = bool(tree.args.get("replace"))
    if_not_exists = bool(tree.args.get("exists"))
    query = tree.expression
    if query is not None:
        if isinstance(tree.this, exp.Schema):
            raise error("CREATE TABLE ... (columns) AS SELECT is not supported", sql, tree)
        name = _table_name(tree.this, sql, "CREATE TABLE")
        return CreateTableAs(sql, tree, n, table=name, query=query,
                             if_not_exists=if_not_exists, replace=replace)
    if not isinstance(tree.this, exp.Schema):
        raise error("CREATE TABLE needs column definitions or AS SELECT", sql, tree)
    name = _table_name(tree.this, sql, "CREATE TABLE")
    fields = []
    for col in tree.this.expressions:
        if not isinstance(col, exp.ColumnDef) or col.args.get("kind") is None:
            raise error("table constraints are not supported; give columns with types",
                        sql, col)
        nullable = True
        for c in col.args.get("constraints") or []:
            ck = c.args.get("kind")
            if isinstance(ck, exp.NotNullColumnConstraint):
                nullable = bool(ck.args.get("allow_null"))
            else:
                raise error(f"column constraint {c.sql(DIALECT)} is not supported", sql, c,
                            column=col.name)
        try:
            atype = sqltypes.arrow_type(col.args["kind"])
        except SqlError as e:
            raise error(e.message, sql, col, column=col.name, **e.context) from None
        fields.append(pa.field(col.name, atype, nullable=nullable))
    names = [f.name.lower() for f in fields]
    if len(set(names)) != len(names):
        raise error("duplicate column names", sql, tree)
    return CreateTable(sql, tree, n, table=name, schema=pa.schema(fields),
                       if_not_exists=if_not_exists, replace=replace)


def _set(sql: str, tree: exp.Set, n: int) -> SetSession:
    items = tree.expressions
    if tree.args.get("unset") or len(items) != 1 or not isinstance(items[0], exp.SetItem):
        raise error("engine settings cannot be changed", sql, tree)
    item = items[0]
    eq = item.this
    if item.args.get("kind") or not isinstance(eq, exp.EQ) or not isinstance(eq.this, exp.Column):
        raise error("engine settings cannot be changed", sql, tree)
    name = eq.this.name.lower()
    if name not in SESSION_SETTINGS:
        raise error(f"engine settings cannot be changed: SET {name}", sql, eq,
                    allowed=",".join(sorted(SESSION_SETTINGS)))
    val = eq.expression
    if not isinstance(val, (exp.Literal, exp.Column, exp.Identifier, exp.Var)):
        raise error(f"SET {name} needs a constant", sql, val)
    value = val.name.lower()
    if value not in SESSION_SETTINGS[name]:
        raise error(f"bad value for {name}: {value!r}", sql, val,
                    allowed="|".join(sorted(SESSION_SETTINGS[name])))
    return SetSession(sql, tree, n, name=name, value=value)


def _maintenance(sql: str, tree: exp.Command, n: int, verb: str) -> Maintenance:
    rest = tree.expression.name if tree.expression is not None else ""
    try:
        toks = DuckDB().tokenize(rest)
    except TokenError:
        toks = []
    if not toks or toks[0].token_type not in (TokenType.VAR, TokenType.IDENTIFIER):
        raise error(f"{verb} needs a table name", sql, tree)
    first = toks[0]
    if len(toks) > 1 and toks[1].token_type == TokenType.DOT:
        raise error(f"{verb}: qualified table names are not supported", sql, tree)
    options = rest[toks[1].start :].strip() if len(toks) > 1 else ""
    return Maintenance(sql, tree, n, verb=verb.lower(), table=first.text, options=options)

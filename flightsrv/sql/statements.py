"""Parse one SQL statement (DuckDB dialect, via sqlglot) and classify it into exactly one path.

Contract: :func:`parse_statement` returns one of the ``Statement`` subclasses below or
raises :class:`~flightsrv.errors.SqlError` naming the statement and, where sqlglot gives
one, the position (``line``/``col``). Nothing here touches tables or DuckDB.

Accepted:

=====================  =====================================================================
``Query``              SELECT (WITH, joins, aggregates, windows, set operations, VALUES)
``Delete``             DELETE FROM t [AS a] [USING ...] [WHERE ...]
``Update``             UPDATE t [AS a] SET ... [FROM ...] [WHERE ...]
``Merge``              MERGE INTO t [AS a] USING s ON ... WHEN [NOT] MATCHED ... THEN ...
``Insert``             INSERT INTO t [(cols)] SELECT ... | VALUES ...
``CreateTable``        CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t (col type, ...)
                       [PARTITIONED BY (day(ts), bucket(64, id), ...)]
``CreateTableAs``      CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t
                       [PARTITIONED BY (...)] AS SELECT ...
``DropTable``          DROP TABLE [IF EXISTS] t
``AlterTable``         ALTER TABLE t ADD [COLUMN] [IF NOT EXISTS] c type [DEFAULT constant]
                       | RENAME [COLUMN] a TO b | DROP [COLUMN] [IF EXISTS] c
                       | ALTER [COLUMN] c [SET DATA] TYPE wider_type
                       | SET PARTITIONED BY (...) | UPGRADE   (format 2, metadata only)
                       | SET (name = value, ...) | SET TBLPROPERTIES ('name' = 'value')
``Maintenance``        OPTIMIZE t | VACUUM t [RETAIN n VERSIONS] [RETAIN n HOURS] [DRY RUN]
                       | PURGE t [EXPIRE] | PUBLISH t [FORMAT delta|iceberg|all]
``SetSession``         SET delete_mode = 'splice' | 'dv'   (a flightsrv session setting)
=====================  =====================================================================

``SHOW STATS t``, ``SHOW HISTORY t`` and ``SHOW ERASURES t`` are ``Query``s over the metadata
table functions ``flightsrv_table_stats('t')``, ``flightsrv_history('t')`` and
``flightsrv_erasures('t')`` (see :mod:`.validate`).

Table names may be qualified with the one schema and catalog the server advertises:
``t``, ``main.t`` and ``flightsrv.main.t`` (quoted or not) all mean the table ``t``; any
other qualifier is refused (:func:`flightsrv.sql.validate.normalize_qualified`).

Everything else (ATTACH, COPY, INSTALL/LOAD, PRAGMA, engine SET, EXPORT/IMPORT,
views, macros, ...) and more than one statement is refused with a reason. Table functions
and file-reading functions are checked by :mod:`flightsrv.sql.validate`.

Parameters: ``?`` placeholders are renumbered to ``$1, $2, ...`` in text order before
parsing, so every statement carries numbered placeholders and ``param_count``.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from flightsrv.errors import LimitExceeded, SqlError
from flightsrv.sql import binder, lexer, validate, values
from flightsrv.sql import types as sqltypes
from flightsrv.sql.diag import error, position, short
from flightsrv.runtime import text_cache

DIALECT = "duckdb"

def _one_of(*values: str):
    def check(value: str) -> str:
        v = value.lower()
        if v not in values:
            raise ValueError("|".join(sorted(values)))
        return v

    check.allowed = "|".join(sorted(values))  # type: ignore[attr-defined]
    return check


def parse_duration_ms(value: str) -> int:
    """``'30s'``, ``'500ms'``, ``'5min'``, ``'1h'`` or a bare number of milliseconds
    (PostgreSQL's statement_timeout convention); ``0`` means no limit. Computed exactly
    (a number of any length), and held at :data:`MAX_DURATION_MS`: a timeout only lowers
    the server's limit, so a longer one is the server's limit anyway."""
    import decimal
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|min|m|h)?\s*", value.lower())
    if not m or len(m.group(1)) > 1000:
        raise ValueError("a duration such as 30s, 500ms, 5min or 1h (0 = no limit)")
    scale = {None: 1, "ms": 1, "s": 1000, "sec": 1000, "min": 60_000, "m": 60_000,
             "h": 3_600_000}[m.group(2)]
    ms = decimal.Decimal(m.group(1)) * scale
    if ms > MAX_DURATION_MS:
        return MAX_DURATION_MS
    return 1 if 0 < ms < 1 else int(ms)  # under a millisecond is not "no limit"


#: the longest session duration kept (~285 years): more is no different for a server
MAX_DURATION_MS = 2**53


def _duration(value: str) -> str:
    return str(parse_duration_ms(value))


_duration.allowed = "a duration such as 30s, 500ms, 5min, 1h or 0"  # type: ignore[attr-defined]

#: Session settings that ``SET`` may change: name -> validator returning the normalised
#: value (raises ValueError). ``statement_timeout`` is kept in milliseconds.
SESSION_SETTINGS = {
    "delete_mode": _one_of("splice", "dv"),
    "statement_timeout": _duration,
}

#: Maintenance verbs; parsed here from tokens (sqlglot has no grammar for them).
MAINTENANCE_VERBS = frozenset({"VACUUM", "OPTIMIZE", "PURGE", "PUBLISH"})

#: ``SHOW <what> t`` -> the metadata table function it stands for.
SHOW_FUNCTIONS = {"STATS": "flightsrv_table_stats", "HISTORY": "flightsrv_history",
                  "ERASURES": "flightsrv_erasures"}

# sqlglot warns on every Command fallback (VACUUM, LOAD, CALL); we classify those ourselves.
logging.getLogger("sqlglot").setLevel(logging.ERROR)


# -- statement types ---------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    sql: str  # the original text
    tree: exp.Expression  # parsed from ``text``; token offsets in node meta refer to it
    param_count: int
    text: str = field(default="", kw_only=True)  # ``sql`` with ? renumbered to $1..$n
    #: False when normalisation changed the tree in ways the text does not show (stripped
    #: column qualifiers): the planner must then render the tree instead of splicing text.
    spliceable: bool = field(default=True, kw_only=True)
    #: what ``tree`` reads (:func:`flightsrv.sql.binder.bind` with the written targets
    #: skipped and no relations bound by the caller), resolved once while parsing; read only
    binding: binder.Binding | None = field(default=None, kw_only=True, compare=False,
                                           repr=False)

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
class Update(Statement):
    table: str = ""
    alias: str | None = None
    writes = True


@dataclass(frozen=True)
class Merge(Statement):
    table: str = ""
    alias: str | None = None
    writes = True


@dataclass(frozen=True)
class Insert(Statement):
    table: str = ""
    columns: tuple[str, ...] | None = None  # INSERT INTO t (a, b) ...
    source: exp.Expression | None = None  # SELECT / VALUES / set operation
    #: INSERT INTO t BY NAME SELECT ...: the query's column names are the column list
    by_name: bool = False
    writes = True


@dataclass(frozen=True)
class InsertValues(Insert):
    """``INSERT INTO t [(cols)] VALUES ...`` read by :func:`flightsrv.sql.values.
    scan_insert_values`: no parse tree of the rows (``tree`` is the statement with one
    ``VALUES (NULL)`` row, for what needs the target); the engine hands ``values`` (the rows'
    text, every token on the allow-list) to DuckDB's own INSERT."""

    values: str = ""
    rows: int = 0
    #: per position of a one-row VALUES that holds one parameter alone: its number
    bare: tuple[int, ...] | None = None
    #: (parameter number, position) of every parameter standing alone in a position
    direct: tuple[tuple[int, int], ...] = ()
    defaults: bool = False  # some position says DEFAULT
    nested: frozenset[int] = frozenset()  # parameters used inside an expression
    width: int | None = None  # values per row, when every row has as many
    #: rows of constants only: where ``values`` may be cut into lists of whole rows
    #: (:func:`flightsrv.sql.values.split_rows`)
    splits: tuple[int, ...] = ()


@dataclass(frozen=True)
class CreateTable(Statement):
    table: str = ""
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    if_not_exists: bool = False
    replace: bool = False
    partition_by: tuple = ()  # ((transform, column), ...): PARTITIONED BY
    writes = True


@dataclass(frozen=True)
class CreateTableAs(Statement):
    table: str = ""
    query: exp.Expression | None = None
    if_not_exists: bool = False
    replace: bool = False
    partition_by: tuple = ()
    writes = True


@dataclass(frozen=True)
class DropTable(Statement):
    table: str = ""
    if_exists: bool = False
    writes = True


@dataclass(frozen=True)
class AlterTable(Statement):
    """One metadata-only table change (docs/PROTOCOL.md §14-§16). ``action``:
    ``add_column`` (``column``, ``type``, ``default``: the DEFAULT constant as SQL text or
    None), ``rename_column`` (``column`` -> ``new_name``), ``drop_column`` (``column``),
    ``alter_column_type`` (``column``, ``type``), ``set_partitioning`` (``partition_by``:
    ((transform, column), ...), empty = unpartitioned), ``set_properties``
    (``properties``: ``ALTER TABLE t SET (name = value, ...)`` or ``SET TBLPROPERTIES
    ('name' = 'value', ...)``; a NULL value removes the property) or ``upgrade``."""

    table: str = ""
    action: str = ""
    column: str = ""
    new_name: str = ""
    type: pa.DataType | None = None
    nullable: bool = True
    default: str | None = None
    if_exists: bool = False  # DROP COLUMN IF EXISTS / ADD COLUMN IF NOT EXISTS
    partition_by: tuple = ()
    properties: tuple = ()  # set_properties: ((name, value or None to remove), ...)
    writes = True


@dataclass(frozen=True)
class Maintenance(Statement):
    """``OPTIMIZE t`` -> compact; ``VACUUM t [RETAIN n VERSIONS] [RETAIN n HOURS] [DRY RUN]``
    -> (expire_snapshots(retain_last=n),) vacuum(grace=hours); ``PURGE t [EXPIRE]`` -> purge;
    ``PUBLISH t [FORMAT delta|iceberg|all]`` -> publish the open-format mirrors."""

    verb: str = ""  # "vacuum" | "optimize" | "purge" | "publish"
    table: str = ""
    options: str = ""  # the text after the table name, as written
    retain_versions: int | None = None  # VACUUM ... RETAIN n VERSIONS (expire first)
    retain_hours: int | None = None  # VACUUM ... RETAIN n HOURS (the vacuum grace period)
    dry_run: bool = False  # VACUUM ... DRY RUN
    expire: bool = False  # PURGE ... EXPIRE
    formats: str = ""  # PUBLISH ... FORMAT delta|iceberg|all ("" = all)
    writes = True


@dataclass(frozen=True)
class SetSession(Statement):
    name: str = ""  # "" with value None: RESET ALL
    value: str | None = ""  # None: back to the default (RESET, SET ... = DEFAULT)


# -- errors and positions (kept importable from here) --------------------------------

_short = short


# -- placeholders --------------------------------------------------------------------


#: Deepest nesting of parentheses/brackets a statement may use (DuckDB's own expression depth
#: limit is 1000; the front end's parser needs about 23 Python frames per level).
MAX_NESTING = 250

# room for MAX_NESTING levels in the recursive-descent parser (pure-Python frames)
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))


_OPENERS = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE})
_CLOSERS = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE})


def _check_nesting(types, sql: str) -> None:
    """Refuse a statement whose brackets nest deeper than MAX_NESTING (``types``: its
    tokens' types, in order)."""
    depth = deepest = 0
    for t in types:
        if t in _OPENERS:
            depth += 1
            if depth > deepest:
                deepest = depth
        elif t in _CLOSERS:
            depth -= 1
    if deepest > MAX_NESTING:
        raise LimitExceeded(f"statement nests {deepest} levels deep; the limit is "
                            f"{MAX_NESTING}", statement=_short(sql), limit="max_nesting",
                            value=MAX_NESTING)


@text_cache(maxsize=256)
def _tokenize(text: str) -> tuple:
    """sqlglot's DuckDB tokens of ``text``, cached: classifying, parsing and planning one
    statement read them four times (a 1,000-value IN list costs milliseconds per pass); a
    text too long to cache is still tokenized once per statement (``one_statement``)."""
    return tuple(lexer.tokenize(text))


_PARAMETER_TOKENS = frozenset({TokenType.PLACEHOLDER, TokenType.QDCOLON, TokenType.PARAMETER})


def number_placeholders(sql: str) -> tuple[str, int]:
    """Rewrite ``?`` to ``$1, $2, ...`` in text order; return the text and parameter count.

    ``$n`` placeholders are kept. Mixing ``?`` with ``$n`` and named ``$name`` parameters
    are refused.
    """
    try:
        tokens = _tokenize(sql)
    except TokenError as e:
        raise SqlError(f"cannot tokenize: {e}", statement=_short(sql)) from None
    types = [tok.token_type for tok in tokens]  # (one attribute read per token)
    _check_nesting(types, sql)
    out, last, qmarks, numbered = [], 0, 0, 0
    for i, tt in enumerate(types):
        if tt not in _PARAMETER_TOKENS:
            continue
        tok = tokens[i]
        if (tt == TokenType.PLACEHOLDER and tok.text == "?") or (
                tt == TokenType.QDCOLON and tok.text == "?::"):  # ?::INT
            qmarks += 1
            out.append(sql[last : tok.start])
            out.append(f"${qmarks}" + tok.text[1:])
            last = tok.end + 1
        elif tt == TokenType.PARAMETER:
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


def parse_statement(sql: str, fast: bool = True) -> Statement:
    """Parse and classify exactly one statement; SqlError on anything we do not run.
    ``fast=False``: no :class:`InsertValues` (the engine's fallback when it cannot take
    the fast path with the parameters it was given)."""
    if not sql or not sql.strip():
        raise SqlError("empty statement", statement=_short(sql or ""))
    try:
        return _parse_statement(sql, fast)
    except RecursionError:
        raise LimitExceeded("statement is too deeply nested to plan", statement=_short(sql),
                            limit="max_nesting", value=MAX_NESTING) from None


_TOKEN_REPR = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: \d+, "
                         r"col: \d+, start: \d+, end: \d+, comments: \[.*?\]>")
_MISSING_ARG = re.compile(r"Required keyword: '(\w+)' missing for "
                          r"<class 'sqlglot\.expressions\.(?:\w+\.)*(\w+)'>")


def _plain_description(text: str) -> str:
    """The parser's description of a syntax error in the words of SQL, not of the parser's
    own objects (its tokens and expression classes)."""
    text = _TOKEN_REPR.sub(
        lambda m: "the end of the statement" if m.group(1) == "SENTINEL" else repr(m.group(2)),
        text)
    return _MISSING_ARG.sub(lambda m: _CLAUSES.get(m.group(2), "an incomplete expression"),
                            text)


_CLAUSES = {"Where": "an incomplete WHERE clause", "Having": "an incomplete HAVING clause",
            "Order": "an incomplete ORDER BY clause", "Group": "an incomplete GROUP BY clause",
            "Limit": "an incomplete LIMIT clause", "Offset": "an incomplete OFFSET clause",
            "Join": "an incomplete JOIN", "Qualify": "an incomplete QUALIFY clause"}


#: words between CREATE/DROP and what it creates or drops
_MODIFIERS = frozenset({"OR", "REPLACE", "PERSISTENT", "TEMPORARY", "TEMP", "IF", "NOT",
                        "EXISTS"})
_SECRET = re.compile(r"\s*CREATE\s+(OR\s+REPLACE\s+)?((PERSISTENT|TEMPORARY|TEMP)\s+)?"
                     r"SECRET\b", re.IGNORECASE)
_NESTED_SHOW = re.compile(r"\(\s*SHOW\s", re.IGNORECASE)
_SHOW_NESTED = ("SHOW inside a statement is not supported; run SHOW on its own, or query "
                "information_schema (tables, columns) or DESCRIBE SELECT * FROM t")


def _insert_values(sql: str) -> InsertValues | None:
    """The fast path of a plain INSERT ... VALUES (:mod:`flightsrv.sql.values`), or None."""
    scan = values.scan_insert_values(sql, MAX_NESTING)
    if scan is None:
        return None
    q = sqltypes.quote_ident
    cols = f" ({', '.join(map(q, scan.columns))})" if scan.columns is not None else ""
    stub = sqlglot.parse_one(f"INSERT INTO {q(scan.table)}{cols} VALUES (NULL)",
                             read=DIALECT)
    return InsertValues(sql, stub, scan.params, text=sql, spliceable=False, table=scan.table,
                        columns=scan.columns, source=stub.expression, values=scan.values,
                        rows=scan.rows, bare=scan.bare, direct=scan.direct,
                        defaults=scan.defaults, nested=scan.nested,
                        width=scan.width, splits=scan.splits)


#: statements longer than this (characters) are parsed one at a time in the process: the
#: general parse costs about 300 bytes of memory per character of text (its tokens and
#: tree: a 0.9 MB IN list peaked at 160 MB) and seconds of CPU, so four at once took a
#: server past its memory cap. Shorter statements and the INSERT ... VALUES fast path are
#: not held back.
LARGE_STATEMENT_CHARS = 64 << 10
#: how long a large statement waits for the one before it (seconds) before it is refused
LARGE_PARSE_WAIT_S = 30.0
_large_parses = threading.RLock()  # (reentrant: SUMMARIZE of a long query parses again)


def _parse_statement(sql: str, fast: bool = True) -> Statement:
    if fast:
        found = _insert_values(sql)
        if found is not None:
            return found
    if len(sql) <= LARGE_STATEMENT_CHARS:
        return _parse_general(sql)
    if not _large_parses.acquire(timeout=LARGE_PARSE_WAIT_S):
        raise LimitExceeded(
            f"the server is parsing other statements over {LARGE_STATEMENT_CHARS // 1024} "
            "KiB (one at a time); try again, or bind long lists as parameters",
            statement=_short(sql), limit="large_statement_parses", value=1)
    try:
        return _parse_general(sql)
    finally:
        _large_parses.release()


def _parse_general(sql: str) -> Statement:
    text, nparams = number_placeholders(sql)
    special = _parse_special(sql, text)
    if special is not None:
        return special
    try:
        # the parser reads the tokens number_placeholders already made (cached by text)
        trees = [t for t in DuckDB().parser().parse(list(_tokenize(text)), text)
                 if t is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        verb = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
        if verb in ("EXPORT", "IMPORT"):  # DuckDB statements sqlglot cannot parse
            raise SqlError(f"{verb} DATABASE is not allowed; query the tables and stream "
                           "the results instead", statement=_short(sql)) from None
        what = _plain_description(first.get('description', str(e)))
        if verb == "MERGE" and what == "Unknown option ERROR":
            what = ("MERGE ... THEN ERROR is not supported; find the rows first (SELECT ... "
                    "FROM t JOIN source ...), or let a WHEN clause skip them (DO NOTHING)")
        if verb == "CREATE" and _SECRET.match(text):  # CREATE SECRET (TYPE s3): unnamed
            raise _refused("CREATE SECRET statements are not allowed", sql)
        if _NESTED_SHOW.search(text):  # (SHOW ALL TABLES): sqlglot reads no SHOW there
            raise SqlError(_SHOW_NESTED, statement=_short(sql), line=first.get("line"),
                           col=first.get("col")) from None
        if what == "Expecting >":  # the parser read "name <" as a type's parameter list
            what += ("; a column named like a type (range, map, struct, ...) compared "
                      "with < must be quoted (\"range\") or qualified (t.range)")
        raise SqlError(
            f"syntax error: {what}",
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
    for node in tree.find_all(exp.Table):
        ident = node.this
        if isinstance(node.parent, exp.Subquery) and isinstance(ident, exp.Identifier) and \
                not ident.quoted and ident.name.upper() == "SHOW":  # (SHOW TABLES) as "show"
            raise error(_SHOW_NESTED, sql, node)
    for node in tree.find_all(exp.Summarize, exp.Describe):
        if node is not tree and not isinstance(node.this, exp.Query):  # (SUMMARIZE t) nested
            verb = "SUMMARIZE" if isinstance(node, exp.Summarize) else "DESCRIBE"
            raise error(f"{verb} of a table inside a statement is not supported; write "
                        f"{verb} SELECT * FROM t there (or {verb} t on its own)", sql, node)
    _keyword_names(tree, _tokenize(text))
    columns_changed = validate.normalize_qualified(tree, sql)
    stmt = _classify(sql, tree, nparams)
    object.__setattr__(stmt, "text", text)
    object.__setattr__(stmt, "spliceable", not columns_changed)
    # refuse what no plan could read; the engine's DML planner reuses the binding
    object.__setattr__(stmt, "binding", binder.bind(stmt.tree, sql, skip=_targets(stmt)))
    return stmt


#: the keywords sqlglot reads as a call without parentheses (CURRENT_USER, CURRENT_DATE,
#: LOCALTIME, ...): node class -> the token types that make it
KEYWORD_FUNCTIONS: dict[type, frozenset] = {}
for _token, _node in DuckDB.Parser.NO_PAREN_FUNCTIONS.items():
    KEYWORD_FUNCTIONS[_node] = KEYWORD_FUNCTIONS.get(_node, frozenset()) | {_token}


#: node class -> the keywords (lower case) sqlglot reads as that call: the column names
#: a bare one may stand for (``plan._projections`` and the DML planner keep such columns)
KEYWORD_NAMES: dict[type, frozenset[str]] = {
    cls: frozenset(t.name.lower() for t in kinds) for cls, kinds in KEYWORD_FUNCTIONS.items()}


def _name_positions(tree: exp.Expression) -> list[tuple[exp.Expression, bool]]:
    """The nodes where DuckDB reads a column *name*, each with whether a name there is a
    Column node (else a bare Identifier)."""
    out: list[tuple[exp.Expression | None, bool]] = []
    for node in tree.walk(bfs=False):
        if isinstance(node, (exp.ColumnDef, exp.AlterColumn)):
            out.append((node.this, False))
        elif isinstance(node, exp.RenameColumn):
            out += [(node.this, True), (node.args.get("to"), True)]
        elif isinstance(node, exp.Drop) and (node.args.get("kind") or "").upper() == "COLUMN":
            out += [(t, True) for t in node.args.get("tables") or []]
        elif isinstance(node, exp.Insert) and isinstance(node.this, (exp.Schema, exp.Tuple)):
            bare = isinstance(node.this, exp.Schema)  # INSERT INTO t (a, b) / MERGE's (a, b)
            out += [(c, not bare) for c in node.this.expressions]
        elif isinstance(node, exp.Update):
            out += [(eq.this, True) for eq in node.expressions if isinstance(eq, exp.EQ)]
    return [(n, column) for n, column in out if n is not None]


def _keyword_names(tree: exp.Expression, tokens) -> None:
    """Where DuckDB reads a column name (a column definition, an ALTER's, INSERT's or
    RENAME's column, an UPDATE's SET target), a keyword such as ``current_user`` is that
    name, but sqlglot made a call of it: put the name back, spelled as written (DuckDB keeps
    a name's case). In expressions the call stays; there DuckDB decides between a column
    of that name and the function (:func:`flightsrv.sql.plan._projections` keeps such
    columns in the relation)."""
    nodes = [n for n in tree.find_all(*KEYWORD_FUNCTIONS, bfs=False) if not n.args]
    if not nodes:
        return
    positions = [(n, column) for n, column in _name_positions(tree)
                 if type(n) in KEYWORD_FUNCTIONS and not n.args]
    if not positions:
        return
    # the k-th node of a class in tree order is the k-th token of its kinds in the text;
    # where they do not pair up (not seen), the name in lower case
    spelled: dict[type, list[str]] = {cls: [] for cls in KEYWORD_FUNCTIONS}
    for tok in tokens:
        for cls, kinds in KEYWORD_FUNCTIONS.items():
            if tok.token_type in kinds:
                spelled[cls].append(tok.text)
    text: dict[int, str] = {}
    for cls in KEYWORD_FUNCTIONS:
        of_cls = [n for n in nodes if type(n) is cls]
        paired = len(of_cls) == len(spelled[cls])
        for k, n in enumerate(of_cls):
            text[id(n)] = spelled[cls][k] if paired else min(KEYWORD_NAMES[cls])
    for node, column in positions:
        ident = exp.Identifier(this=text[id(node)], quoted=True)
        node.replace(exp.Column(this=ident) if column else ident)


def _targets(stmt: Statement) -> tuple[exp.Table, ...]:
    """The table nodes a statement writes (resolved by the engine, not read as relations)."""
    tree = stmt.tree
    if isinstance(stmt, (Query, SetSession, Maintenance, AlterTable)):
        return ()
    if isinstance(tree, exp.Drop):
        return tuple(t for t in tree.args.get("tables") or [tree.this]
                     if isinstance(t, exp.Table))
    target = tree.this
    if isinstance(target, exp.Schema):
        target = target.this
    return (target,) if isinstance(target, exp.Table) else ()


def _significant_tokens(sql: str, text: str):
    try:
        toks = list(_tokenize(text))
        if toks and toks[0].token_type == TokenType.COMMAND:
            # VACUUM (a sqlglot command keyword) swallows the rest as one string: tokenize
            # the rest on its own, with offsets kept by blanking the verb
            head = toks[0].end + 1
            toks = [toks[0]] + lexer.tokenize(" " * head + text[head:])
    except TokenError as e:
        raise SqlError(f"cannot tokenize: {e}", statement=_short(sql)) from None
    while toks and toks[-1].token_type == TokenType.SEMICOLON:
        toks = toks[:-1]
    return toks


def _parse_special(sql: str, text: str) -> Statement | None:
    """Statements sqlglot has no grammar for: maintenance verbs and SHOW STATS/HISTORY."""
    toks = _significant_tokens(sql, text)
    if not toks:
        return None
    verb = toks[0].text.upper()
    words = [t.text.upper() for t in toks[:3]]
    if words == ["SHOW", "TABLES"] and len(toks) == 2:
        return _metadata_query(sql, "SELECT * FROM flightsrv_tables()")
    if words == ["SHOW", "ALL", "TABLES"] and len(toks) == 3:
        # DuckDB's columns: every table of every schema with its columns' names and types
        stmt = _parse_statement(
            "SELECT table_catalog AS database, table_schema AS schema, table_name AS name,"
            " list(column_name ORDER BY ordinal_position) AS column_names,"
            " list(data_type ORDER BY ordinal_position) AS column_types, false AS temporary"
            " FROM information_schema.columns GROUP BY ALL ORDER BY name")
        object.__setattr__(stmt, "sql", sql)
        return stmt
    if len(toks) == 2 and words in (["SHOW", "SCHEMAS"], ["SHOW", "DATABASES"]):
        # DuckDB's keyword forms (never a table named schemas): the one catalog and schema
        return _metadata_query(
            sql, "SELECT 'flightsrv' AS database_name"
            + (", 'main' AS schema_name, true AS current" if words[1] == "SCHEMAS" else ""))
    if verb in ("SUMMARIZE", "DESCRIBE", "DESC") and len(toks) >= 3 and words[1] == "TABLE":
        toks = [toks[0], *toks[2:]]  # DESCRIBE TABLE t, SUMMARIZE TABLE t: the same as without
        words = [t.text.upper() for t in toks[:3]]
    if verb in ("SUMMARIZE", "DESCRIBE", "DESC") and len(toks) >= 2:
        # DuckDB's SUMMARIZE (of a table or a query) and DESCRIBE of a query: the query
        # over DuckDB's own SHOW_REF they stand for, so a table in them is bound, pinned
        # and masked like any query's (the guard admits SUMMARIZE/DESCRIBE of a query only)
        rest = text[toks[1].start:toks[-1].end + 1]
        query = toks[1].token_type == TokenType.L_PAREN or \
            toks[1].text.upper() in ("SELECT", "WITH", "FROM", "VALUES")
        if query or verb == "SUMMARIZE":
            if not query:  # SUMMARIZE t [AT (...)]: its rows
                rest = f"SELECT * FROM {rest}"
            keyword = "SUMMARIZE" if verb == "SUMMARIZE" else "DESCRIBE"
            stmt = _parse_statement(f"SELECT * FROM ({keyword} {rest})")
            object.__setattr__(stmt, "sql", sql)
            return stmt
    if verb == "SHOW" and len(toks) >= 2 and words[1] not in ("TABLES", "ALL") \
            and toks[1].text.upper() not in SHOW_FUNCTIONS \
            and _after_table(toks, 1) == len(toks):
        verb, words, toks = "DESCRIBE", ["DESCRIBE", *words[1:]], toks  # SHOW t is DESCRIBE t
    describe = 1 if verb in ("DESCRIBE", "DESC") and len(toks) >= 2 else \
        3 if words[:2] == ["SHOW", "COLUMNS"] and len(toks) >= 4 and words[2] in ("FROM", "IN") \
        else None
    if describe is not None and toks[describe].token_type != TokenType.L_PAREN \
            and toks[describe].text.upper() not in ("SELECT", "WITH", "FROM", "TABLE"):
        name = _token_table(sql, text, toks, describe, verb)
        if _after_table(toks, describe) != len(toks):
            raise SqlError(f"{verb} takes one table name (DESCRIBE t, SHOW COLUMNS FROM t)",
                           statement=_short(sql))
        quoted = "'" + name.replace("'", "''") + "'"
        return _metadata_query(sql, f"SELECT * FROM flightsrv_columns({quoted})")
    if verb == "TRUNCATE" and toks[0].token_type != TokenType.STRING:
        i = 2 if words[1:2] == ["TABLE"] else 1
        name = _token_table(sql, text, toks, i, "TRUNCATE")
        if _after_table(toks, i) != len(toks):
            raise SqlError("TRUNCATE takes one table name (TRUNCATE [TABLE] t)",
                           statement=_short(sql))
        # TRUNCATE t is DELETE FROM t: a deletion-vector (or splice) commit like any DELETE
        stmt = _parse_statement('DELETE FROM "' + name.replace('"', '""') + '"')
        object.__setattr__(stmt, "sql", sql)
        return stmt
    if verb == "SHOW" and len(toks) >= 3 and toks[1].text.upper() in SHOW_FUNCTIONS:
        name = _token_table(sql, text, toks, 2, f"SHOW {toks[1].text.upper()}")
        fn = SHOW_FUNCTIONS[toks[1].text.upper()]
        quoted = "'" + name.replace("'", "''") + "'"
        query = f"SELECT * FROM {fn}({quoted})"
        stmt = Query(sql, sqlglot.parse_one(query, read=DIALECT), 0)
        object.__setattr__(stmt, "text", query)
        return stmt
    after = _after_table(toks, 2) if verb == "ALTER" and len(toks) >= 4 and \
        toks[1].text.upper() == "TABLE" else len(toks)
    if after < len(toks) and toks[after].text.upper() == "UPGRADE":
        table = _token_table(sql, text, toks, 2, "ALTER TABLE")
        if after + 1 != len(toks):
            raise SqlError("unexpected text after ALTER TABLE t UPGRADE",
                           statement=_short(sql), table=table)
        tree = exp.Command(this="ALTER", expression=exp.Literal.string(text[toks[1].start:]))
        return AlterTable(sql, tree, 0, table=table, action="upgrade", text=text)
    if verb not in MAINTENANCE_VERBS or toks[0].token_type == TokenType.STRING:
        return None
    if any(t.token_type == TokenType.SEMICOLON for t in toks):
        raise SqlError("one statement per request", statement=_short(sql))
    table = _token_table(sql, text, toks, 1, verb)
    i = _after_table(toks, 1)
    options = text[toks[i].start:].strip().rstrip(";").strip() if i < len(toks) else ""
    words = [t.text.upper() for t in toks[i:]]
    kw: dict = {}
    if verb == "VACUUM":
        while words[:1] == ["RETAIN"]:
            unit = words[2] if len(words) >= 3 else ""
            key = {"VERSIONS": "retain_versions", "HOURS": "retain_hours"}.get(unit)
            if key is None or not words[1].isdigit() or key in kw:
                raise SqlError("VACUUM t RETAIN n VERSIONS | RETAIN n HOURS needs a whole "
                               "number n and each clause at most once", statement=_short(sql))
            kw[key] = int(words[1])
            if key == "retain_versions" and kw[key] < 1:
                raise SqlError("VACUUM ... RETAIN n VERSIONS needs n >= 1",
                               statement=_short(sql))
            words = words[3:]
        if words[:2] == ["DRY", "RUN"]:
            kw["dry_run"] = True
            words = words[2:]
    elif verb == "PURGE" and words[:1] == ["EXPIRE"]:
        kw["expire"] = True
        words = words[1:]
    elif verb == "PUBLISH" and words[:1] == ["FORMAT"] and len(words) >= 2 and \
            words[1] in ("DELTA", "ICEBERG", "ALL"):
        kw["formats"] = words[1].lower()
        words = words[2:]
    if words:
        grammar = {"VACUUM": "VACUUM t [RETAIN n VERSIONS] [RETAIN n HOURS] [DRY RUN]",
                   "OPTIMIZE": "OPTIMIZE t",
                   "PURGE": "PURGE t [EXPIRE]",
                   "PUBLISH": "PUBLISH t [FORMAT delta|iceberg|all]"}[verb]
        extra = text[toks[len(toks) - len(words)].start:].strip().rstrip(";").strip()
        extra = extra if len(extra) <= 80 else extra[:77] + "..."
        raise SqlError(f"unexpected {extra!r} after {verb} {table}; "
                       f"the form is {grammar}", statement=_short(sql))
    tree = exp.Command(this=verb, expression=exp.Literal.string(text[toks[1].start:]))
    return Maintenance(sql, tree, 0, verb=verb.lower(), table=table, options=options,
                       text=text, **kw)


def _after_table(toks, i: int) -> int:
    """Index of the first token after a (possibly dotted) table name starting at ``i``."""
    i += 1
    while i + 1 < len(toks) and toks[i].token_type == TokenType.DOT:
        i += 2
    return i


def _metadata_query(sql: str, query: str) -> Statement:
    """A SHOW/DESCRIBE statement as the query over a metadata table function it stands for."""
    stmt = Query(sql, sqlglot.parse_one(query, read=DIALECT), 0)
    object.__setattr__(stmt, "text", query)
    return stmt


def _token_table(sql: str, text: str, toks, i: int, what: str) -> str:
    if i >= len(toks) or toks[i].token_type not in (TokenType.VAR, TokenType.IDENTIFIER) \
            and not toks[i].text.isidentifier():
        raise SqlError(f"{what} needs a table name", statement=_short(sql))
    j = _after_table(toks, i)
    if any(toks[k].token_type != TokenType.DOT for k in range(i + 1, j, 2)):
        raise SqlError(f"{what} needs a table name", statement=_short(sql))
    parts = [toks[k] for k in range(i, j, 2)]
    if len(parts) > 3:
        raise SqlError(f"{what}: bad table name", statement=_short(sql))
    names = [t.text for t in parts]
    if len(names) >= 2 and names[-2].lower() != validate.SCHEMA or \
            len(names) == 3 and names[0].lower() != validate.CATALOG:
        raise SqlError(f"qualified name {'.'.join(names)!r} names an unknown schema or "
                       f"catalog: only {validate.CATALOG}.{validate.SCHEMA} exists",
                       statement=_short(sql))
    return names[-1]


def _table_name(table: exp.Expression, sql: str, what: str) -> str:
    if isinstance(table, exp.Schema):
        table = table.this
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise error(f"{what} needs a plain table name", sql, table)
    if table.args.get("db") or table.args.get("catalog"):
        raise error(f"{what}: qualified table names are not supported", sql, table,
                    table=table.sql(DIALECT))
    if table.args.get("when") is not None:  # t AT (VERSION => n): reads only
        raise error(f"the target of {what} is always the latest version; AT (...) is not "
                    "allowed there", sql, table, table=table.name)
    return table.name


def _classify(sql: str, tree: exp.Expression, n: int) -> Statement:
    if isinstance(tree, exp.Query):  # Select, Union/Intersect/Except, Values-as-query
        return Query(sql, tree, n)
    if isinstance(tree, exp.Values):
        return Query(sql, tree, n)
    if isinstance(tree, exp.Delete):
        return _delete(sql, tree, n)
    if isinstance(tree, exp.Update):
        return _dml_target(Update, sql, tree, n, "UPDATE")
    if isinstance(tree, exp.Merge):
        return _dml_target(Merge, sql, tree, n, "MERGE")
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
    if isinstance(tree, exp.Alter):
        return _alter(sql, tree, n)
    if isinstance(tree, exp.Command) and str(tree.this).upper() == "RESET":
        return _reset(sql, tree, n)
    if isinstance(tree, exp.Command):
        verb = str(tree.this).upper()
        what = [w for w in str(tree.args.get("expression") or "").upper().split()[:4]
                if w not in _MODIFIERS]
        if verb in ("CREATE", "DROP") and what and what[0].isalpha():  # DROP SECRET s
            verb = f"{verb} {what[0]}"
        raise _refused(f"{verb} statements are not allowed", sql)
    refused = {
        exp.Copy: "COPY is not allowed; query the table and stream the result instead",
        exp.Attach: "ATTACH is not allowed",
        exp.Detach: "DETACH is not allowed",
        exp.Install: "INSTALL is not allowed",
        exp.Pragma: "PRAGMA is not allowed",
        exp.Use: "USE is not allowed",
        exp.Describe: "DESCRIBE takes one table name (DESCRIBE t); for a query's columns use "
                      "the Flight SQL metadata calls (GetSchema)",
        exp.Show: "SHOW supports TABLES, COLUMNS FROM t, STATS t, HISTORY t, ERASURES t",
    }
    for cls, reason in refused.items():
        if isinstance(tree, cls):
            raise _refused(reason, sql)
    verb = sql.split(None, 1)[0].upper().rstrip(";")
    if isinstance(tree, exp.Pivot):  # DuckDB's statement form of PIVOT / UNPIVOT
        raise _refused(f"the {verb} statement form is not supported; write it as a query: "
                       f"SELECT * FROM ({verb} ... ), with an explicit IN (...) list for PIVOT",
                       sql)
    raise _refused(f"{verb} statements are not allowed", sql)


def _refused(message: str, sql: str) -> SqlError:
    """The error refusing a whole statement by its kind, its position the statement's first
    keyword (a sqlglot tree of such a statement carries its last token's position)."""
    try:
        toks = lexer.tokenize(sql)
    except Exception:  # noqa: BLE001 - no position then
        toks = []
    if not toks:
        return SqlError(message, statement=short(sql))
    start = toks[0].start
    line = sql.count("\n", 0, start) + 1
    return SqlError(message, statement=short(sql), line=line,
                    col=start - (sql.rfind("\n", 0, start) + 1) + 1)


def _no_with(sql: str, tree: exp.Expression, what: str) -> None:
    if tree.args.get("with_") is not None:
        raise error(f"WITH ... {what} is not supported; use a subquery", sql, tree)


def _delete(sql: str, tree: exp.Delete, n: int) -> Delete:
    target = tree.this
    if not isinstance(target, exp.Table):  # "DELETE t": sqlglot keeps t elsewhere
        raise error("syntax error: DELETE needs FROM (DELETE FROM t WHERE ...)", sql, tree)
    _no_with(sql, tree, "DELETE")
    if tree.args.get("returning"):
        raise error("DELETE ... RETURNING is not supported", sql, tree)
    name = _table_name(target, sql, "DELETE")
    alias = target.alias or None
    where = tree.args.get("where")
    cond = where.this if where is not None else None
    return Delete(sql, tree, n, table=name, alias=alias, where=cond)


def _dml_target(cls, sql: str, tree: exp.Expression, n: int, what: str):
    _no_with(sql, tree, what)
    if tree.args.get("returning"):
        raise error(f"{what} ... RETURNING is not supported", sql, tree)
    target = tree.this
    name = _table_name(target, sql, what)
    return cls(sql, tree, n, table=name, alias=target.alias or None)


def _insert(sql: str, tree: exp.Insert, n: int) -> Insert:
    # only a plain INSERT INTO t [(cols)] SELECT/VALUES or INSERT INTO t BY NAME SELECT:
    # every other clause sqlglot knows of (OR REPLACE / OR IGNORE, ON CONFLICT, OVERWRITE,
    # RETURNING, ...) is refused
    for flag, value in tree.args.items():
        if flag not in ("this", "expression", "by_name") and value:
            if flag == "with_":
                raise _refused("WITH ... INSERT is not supported; put the WITH inside the "
                               "INSERT: INSERT INTO t WITH x AS (...) SELECT ... FROM x", sql)
            what = f"OR {value}" if flag == "alternative" and isinstance(value, str) \
                else flag.upper().replace("_", " ").strip()
            raise error(f"INSERT with {what} is not supported", sql, tree)
    target = tree.this
    columns = None
    if isinstance(target, exp.Schema):
        columns = tuple(c.name for c in target.expressions)
    name = _table_name(target, sql, "INSERT")
    source = tree.expression
    if not isinstance(source, (exp.Query, exp.Values)):
        raise error("INSERT needs a SELECT or VALUES source", sql, tree)
    by_name = bool(tree.args.get("by_name"))
    if by_name and not isinstance(source, exp.Query) or \
            by_name and isinstance(source, exp.Subquery) and \
            isinstance(source.unnest(), exp.Values):
        raise error("INSERT BY NAME needs a SELECT source (its column names are the column "
                    "list)", sql, tree)
    return Insert(sql, tree, n, table=name, columns=columns, source=source, by_name=by_name)


def _create(sql: str, tree: exp.Create, n: int) -> Statement:
    kind = (tree.args.get("kind") or "").upper()
    if kind != "TABLE":
        raise error(f"CREATE {kind or '?'} is not supported; only CREATE TABLE", sql, tree)
    props = tree.args.get("properties")
    if props is not None:
        for p in props.expressions:
            if isinstance(p, exp.TemporaryProperty):
                raise error("temporary tables are not supported", sql, tree)
    partition_by: tuple = ()
    if props is not None:
        for p in props.expressions:
            if isinstance(p, exp.PartitionedByProperty):
                partition_by = _partition_items(sql, p, "CREATE TABLE")
            elif not isinstance(p, exp.TemporaryProperty):
                raise error(f"table property {p.sql(DIALECT)} is not supported", sql, p)
    replace = bool(tree.args.get("replace"))
    if_not_exists = bool(tree.args.get("exists"))
    if replace and if_not_exists:  # as DuckDB: the two contradict each other
        raise error("cannot give both OR REPLACE and IF NOT EXISTS", sql, tree)
    query = tree.expression
    if query is not None:
        if isinstance(tree.this, exp.Schema):
            raise error("CREATE TABLE ... (columns) AS SELECT is not supported", sql, tree)
        name = _table_name(tree.this, sql, "CREATE TABLE")
        return CreateTableAs(sql, tree, n, table=name, query=query,
                             if_not_exists=if_not_exists, replace=replace,
                             partition_by=partition_by)
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
            raise error(e.message, sql, col, table=name, column=col.name, **e.context) from None
        fields.append(pa.field(col.name, atype, nullable=nullable))
    names = [f.name.lower() for f in fields]
    if len(set(names)) != len(names):
        raise error("duplicate column names", sql, tree)
    return CreateTable(sql, tree, n, table=name, schema=pa.schema(fields),
                       if_not_exists=if_not_exists, replace=replace, partition_by=partition_by)


#: sqlglot's nodes for the time transforms of PARTITIONED BY
_TIME_TRANSFORMS = {exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.Hour: "hour"}
_PARTITION_FORMS = ("col, identity(col), year(col), month(col), day(col), hour(col), "
                    "bucket(N, col) or truncate(W, col)")


def _partition_column(sql: str, node, what: str) -> str:
    if isinstance(node, exp.Column) and not node.table:
        return node.name
    if isinstance(node, exp.Identifier):
        return node.name
    raise error(f"{what} PARTITIONED BY: a transform names one column", sql, node)


def _partition_width(sql: str, node, what: str) -> int:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() \
            and int(node.this) > 0:
        return int(node.this)
    raise error(f"{what} PARTITIONED BY: bucket/truncate need a positive whole number",
                sql, node)


def _partition_items(sql: str, prop: exp.PartitionedByProperty, what: str) -> tuple:
    """``PARTITIONED BY (...)`` as ((transform, column), ...) (docs/PROTOCOL.md §15)."""
    spec = prop.this
    items = spec.expressions if isinstance(spec, (exp.Schema, exp.Tuple)) else [spec]
    out = []
    for node in items:
        if isinstance(node, (exp.Column, exp.Identifier)):
            out.append(("identity", _partition_column(sql, node, what)))
        elif type(node) in _TIME_TRANSFORMS:
            out.append((_TIME_TRANSFORMS[type(node)], _partition_column(sql, node.this, what)))
        elif isinstance(node, exp.PartitionedByBucket):
            n = _partition_width(sql, node.expression, what)
            out.append((f"bucket[{n}]", _partition_column(sql, node.this, what)))
        elif isinstance(node, exp.PartitionByTruncate):
            n = _partition_width(sql, node.expression, what)
            out.append((f"truncate[{n}]", _partition_column(sql, node.this, what)))
        elif isinstance(node, exp.Anonymous) and len(node.expressions) == 1 and \
                node.name.lower() in ("identity", "years", "months", "days", "hours"):
            fn = node.name.lower().rstrip("s") if node.name.lower() != "identity" \
                else "identity"
            out.append((fn, _partition_column(sql, node.expressions[0], what)))
        else:
            raise error(f"{what} PARTITIONED BY: unknown partition transform "
                        f"{node.sql(DIALECT)}; use {_PARTITION_FORMS}", sql, node)
    return tuple(out)


def _property_item(sql: str, p: exp.Expression, table: str) -> tuple[str, object]:
    """(name, value) of one ``name = value`` of ``ALTER TABLE t SET (...)``: the name a
    (dotted) identifier or a string, the value a literal (NULL: remove the property). The
    table layer checks name and value against the property registry."""
    key, value = (p.this, p.expression) if isinstance(p, exp.EQ) else (p.this, p.args["value"])
    if isinstance(key, exp.Column):
        name = ".".join(part.name for part in key.parts)
    elif isinstance(key, (exp.Literal, exp.Identifier)):
        name = key.name
    else:
        raise error("a table property name must be a name or a string", sql, p, table=table)
    if isinstance(value, exp.Null):
        return name, None
    if isinstance(value, exp.Boolean):
        return name, bool(value.this)
    if isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal):
        return name, "-" + value.this.name
    if isinstance(value, exp.Literal):
        return name, value.name
    raise error("a table property value must be a literal", sql, p, table=table,
                property=name)


def _alter(sql: str, tree: exp.Alter, n: int) -> AlterTable:
    kind = (tree.args.get("kind") or "").upper()
    if kind != "TABLE":
        raise error(f"ALTER {kind or '?'} is not supported; only ALTER TABLE", sql, tree)
    name = _table_name(tree.this, sql, "ALTER TABLE")
    if tree.args.get("exists"):
        raise error("ALTER TABLE IF EXISTS is not supported", sql, tree, table=name)
    actions = tree.args.get("actions") or []
    if len(actions) != 1:
        raise error("ALTER TABLE takes one change per statement", sql, tree, table=name)
    act = actions[0]
    cmd = exp.Command(this="ALTER", expression=exp.Literal.string(sql))
    base = {"table": name}
    if isinstance(act, exp.ColumnDef):
        if act.args.get("kind") is None:
            raise error("ALTER TABLE ADD COLUMN needs a type", sql, act, table=name,
                        column=act.name)
        try:
            atype = sqltypes.arrow_type(act.args["kind"])
        except SqlError as e:
            raise error(e.message, sql, act, table=name, column=act.name,
                        **e.context) from None
        default, nullable = None, True
        for c in act.args.get("constraints") or []:
            ck = c.args.get("kind")
            if isinstance(ck, exp.DefaultColumnConstraint):
                default = _constant_sql(sql, ck.this, name, act.name)
            elif isinstance(ck, exp.NotNullColumnConstraint):
                nullable = bool(ck.args.get("allow_null"))
            else:
                raise error(f"column constraint {c.sql(DIALECT)} is not supported", sql, c,
                            table=name, column=act.name)
        return AlterTable(sql, cmd, n, action="add_column", column=act.name, type=atype,
                          default=default, nullable=nullable,
                          if_exists=bool(act.args.get("exists")), **base)
    if isinstance(act, exp.RenameColumn):
        return AlterTable(sql, cmd, n, action="rename_column", column=act.this.name,
                          new_name=act.args["to"].name, **base)
    if isinstance(act, exp.Drop) and (act.args.get("kind") or "").upper() == "COLUMN":
        cols = act.args.get("tables") or []
        if len(cols) != 1:
            raise error("ALTER TABLE DROP COLUMN takes one column", sql, act, table=name)
        return AlterTable(sql, cmd, n, action="drop_column", column=cols[0].name,
                          if_exists=bool(act.args.get("exists")), **base)
    if isinstance(act, exp.AlterColumn):
        dtype = act.args.get("dtype")
        others = [k for k in ("default", "drop", "comment", "allow_null", "visible", "using",
                              "collate") if act.args.get(k)]
        if dtype is None or others:
            raise error("ALTER TABLE ALTER COLUMN supports only [SET DATA] TYPE (widening)",
                        sql, act, table=name, column=act.name)
        try:
            atype = sqltypes.arrow_type(dtype)
        except SqlError as e:
            raise error(e.message, sql, act, table=name, column=act.name,
                        **e.context) from None
        return AlterTable(sql, cmd, n, action="alter_column_type", column=act.name,
                          type=atype, **base)
    if isinstance(act, exp.AlterSet):
        props = [p for x in act.expressions for p in
                 (x.expressions if isinstance(x, exp.Properties) else [x])]
        if len(props) == 1 and isinstance(props[0], exp.PartitionedByProperty):
            return AlterTable(sql, cmd, n, action="set_partitioning",
                              partition_by=_partition_items(sql, props[0], "ALTER TABLE"),
                              **base)
        if props and all(isinstance(p, (exp.EQ, exp.Property)) for p in props):
            return AlterTable(sql, cmd, n, action="set_properties",
                              properties=tuple(_property_item(sql, p, name) for p in props),
                              **base)
    raise error(f"ALTER TABLE {act.sql(DIALECT)} is not supported; the forms are ADD COLUMN, "
                "RENAME COLUMN, DROP COLUMN, ALTER COLUMN ... TYPE, SET PARTITIONED BY (...), "
                "SET (property = value, ...) and UPGRADE", sql, act, table=name)


def _constant_sql(sql: str, node: exp.Expression, table: str, column: str) -> str:
    """A DEFAULT as SQL text: a constant only (literals, signs, casts of literals, and
    list, struct and map literals of those: ``[1, 2]``, ``{'a': 1}``, ``MAP {'k': 1}``)."""
    for x in node.walk():
        if isinstance(x, exp.Identifier) and isinstance(x.parent, exp.PropertyEQ) \
                and x.arg_key == "this":
            continue  # a struct literal's field name
        if not isinstance(x, (exp.Literal, exp.Neg, exp.Boolean, exp.Null, exp.Cast,
                              exp.DataType, exp.DataTypeParam, exp.Paren, exp.Var,
                              exp.Array, exp.Struct, exp.PropertyEQ, exp.ToMap)):
            raise error("ADD COLUMN ... DEFAULT needs a constant", sql, node, table=table,
                        column=column)
    return node.sql(DIALECT)


def _reset(sql: str, tree: exp.Command, n: int) -> SetSession:
    """``RESET name`` (a session setting back to its default) and ``RESET ALL``."""
    words = str(getattr(tree.expression, "name", "") or "").split()
    if len(words) == 1 and words[0].upper() == "ALL":
        return SetSession(sql, tree, n, name="", value=None)
    name = words[0].lower() if len(words) == 1 else ""
    if name not in SESSION_SETTINGS:
        raise error(f"engine settings cannot be changed: RESET {' '.join(words) or '?'}",
                    sql, tree, allowed=",".join(sorted(SESSION_SETTINGS)))
    return SetSession(sql, tree, n, name=name, value=None)


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
    if isinstance(val, exp.Var) and val.name.upper() == "DEFAULT":
        return SetSession(sql, tree, n, name=name, value=None)
    check = SESSION_SETTINGS[name]
    try:
        value = check(val.name)
    except ValueError:
        raise error(f"bad value for {name}: {val.name!r}", sql, val,
                    allowed=check.allowed) from None
    return SetSession(sql, tree, n, name=name, value=value)

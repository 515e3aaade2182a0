"""The fast path for ``INSERT INTO t [(cols)] VALUES (...), (...)``: recognise the statement
with one cheap pass over its text, without building a parse tree of the VALUES list (a
10,000-row list is ~200,000 tokens: sqlglot's parse, copies and rendering of it took
seconds, the guard's DuckDB parse tree of it megabytes of JSON).

:func:`scan_insert_values` returns an :class:`~flightsrv.sql.statements.InsertValues` only
when every token of the statement is on a short allow-list, so the VALUES text can be handed
to DuckDB's own INSERT unchanged (DuckDB decides every type, cast, NULL and DEFAULT):

- the head ``INSERT INTO name [(column, ...)] VALUES``, names plain or double-quoted,
  unqualified;
- after it only parenthesised rows separated by commas, holding: numbers, single-quoted
  strings, parameters (``?``, ``$n``), brackets ``( ) [ ] { }``, ``,`` ``:``, arithmetic,
  comparison and concatenation operators, ``::``, the words in :data:`KEYWORDS` and
  :data:`TYPE_WORDS`, and a word followed by ``(`` only when it names a function on the
  same allow-list a SELECT is checked against
  (:data:`~flightsrv.sql.allowed_functions.SCALAR_FUNCTIONS`), ``CAST``/``TRY_CAST``, or a
  parameterised type right after ``AS`` / ``::``;
- an optional final ``;``.

Anything else (a subquery, a column or relation name, a quoted identifier, a comment, a
dotted name, ``ON CONFLICT``, ``RETURNING``, dollar-quoted or E'' strings, ...) returns
None and the statement takes the general path, which parses it and checks it in full.
So the fast path can only ever run constants, casts, operators and allowed functions.

Rows of plain constants only (numbers, strings, ``NULL``/``TRUE``/``FALSE``, typed string
literals such as ``TIMESTAMP '...'``), as BI tools, sinks and ORMs write them, are
recognised by one regular expression per row (:func:`_scan_constants`) instead of the
token walk: the same answer (a subset of what the walk accepts, read the same way; a test
compares the two), several times faster (a 10,000-row list: ~12 ms against ~65–120 ms on
the loaded 2-core machine). Only this reading records :attr:`ValuesScan.splits`.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from flightsrv.sql.allowed_functions import SCALAR_FUNCTIONS

#: bare words a VALUES expression may hold (besides type names)
KEYWORDS = frozenset({
    "NULL", "TRUE", "FALSE", "DEFAULT", "AS", "INTERVAL", "AND", "OR", "NOT", "IS", "IN",
    "BETWEEN", "LIKE", "ILIKE", "CASE", "WHEN", "THEN", "ELSE", "END",
    # interval units
    "YEAR", "YEARS", "MONTH", "MONTHS", "DAY", "DAYS", "HOUR", "HOURS", "MINUTE", "MINUTES",
    "SECOND", "SECONDS", "MILLISECOND", "MILLISECONDS", "MICROSECOND", "MICROSECONDS",
    "WEEK", "WEEKS",
})
#: type names (typed literals ``DATE '2026-01-01'``, ``CAST(x AS t)``, ``x::t``)
TYPE_WORDS = frozenset({
    "BOOLEAN", "BOOL", "TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "HUGEINT",
    "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "INT1", "INT2", "INT4",
    "INT8", "FLOAT", "REAL", "DOUBLE", "DECIMAL", "NUMERIC", "VARCHAR", "TEXT", "STRING",
    "CHAR", "BLOB", "BYTEA", "DATE", "TIME", "TIMESTAMP", "TIMESTAMPTZ", "TIMESTAMP_S",
    "TIMESTAMP_MS", "TIMESTAMP_NS", "UUID", "WITH", "ZONE", "PRECISION",
})
#: words that may be followed by ``(`` without being a function call
_CALL_KEYWORDS = frozenset({"CAST", "TRY_CAST"})
_PARAMETRISED_TYPES = frozenset({"DECIMAL", "NUMERIC", "VARCHAR", "CHAR"})

_NAME = r'[A-Za-z_][A-Za-z0-9_]*|"(?:[^"]|"")+"'
_HEAD = re.compile(rf"\s*INSERT\s+INTO\s+({_NAME})\s*"
                   rf"(\(\s*(?:{_NAME})(?:\s*,\s*(?:{_NAME}))*\s*\))?"
                   r"\s*VALUES\s*(?=\()", re.IGNORECASE | re.ASCII)
_NAMES = re.compile(_NAME, re.ASCII)
#: one token per match (whitespace is skipped; anything else unknown is one character)
_TOKEN = re.compile(r"""'(?:[^']|'')*'|--|/\*|\*/"""
                    r"""|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?![\w.])"""
                    r"""|[A-Za-z_]\w*|\$\d+|::|\|\||<=|>=|<>|!=|\S""", re.ASCII)
#: whitespace DuckDB might not treat as such
_ODD_SPACE = re.compile(r"[^\S \t\r\n\f\v]")
_OPS = frozenset({"-", "+", "*", "/", "%", "<", ">", "=", "::", "||", "<=", ">=", "<>", "!=",
                  ":"})
_OPEN = frozenset({"(", "[", "{"})
_CLOSE = frozenset({")", "]", "}"})
_QMARK = re.compile(r"'(?:[^']|'')*'|\?")


def _name(tok: str) -> str:
    """A plain or double-quoted identifier's name (plain ones as spelled: the engine
    matches table and column names case-insensitively)."""
    if tok.startswith('"'):
        return tok[1:-1].replace('""', '"')
    return tok


class ValuesScan(NamedTuple):
    table: str
    columns: tuple[str, ...] | None  # INSERT INTO t (a, b): as spelled
    values: str  # the rows' text, "(...), (...)", with ? renumbered to $1..$n
    rows: int
    params: int  # the statement's parameter count
    #: for a one-row VALUES whose every position is one parameter alone: the 1-based
    #: parameter number per position; else None
    bare: tuple[int, ...] | None
    #: (parameter number, position) for every position of any row that holds one parameter
    #: alone (the parameter then takes the target column's type)
    direct: tuple[tuple[int, int], ...] = ()
    defaults: bool = False  # some position says DEFAULT
    nested: frozenset[int] = frozenset()  # parameters used inside an expression
    width: int | None = None  # values per row, when every row has as many
    #: rows of constants only: the offsets in ``values`` of the comma before row
    #: SPLIT_ROWS, 2 * SPLIT_ROWS, ... (where the list may be cut into lists of whole rows)
    splits: tuple[int, ...] = ()


#: one constant of a row of constants only (what :func:`_scan_constants` reads): a string,
#: a number with an optional sign, a string typed by a type word, or NULL/TRUE/FALSE (at
#: most one of them matches at any place: their first characters differ, or the word does;
#: the most frequent first, which makes a 10,000-row scan ~30% quicker)
_CONSTANT = (r"""'[^']*(?:''[^']*)*'"""
             r"""|[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"""
             r"""|(?:DATE|TIME|TIMESTAMP|TIMESTAMPTZ)\s+'[^']*(?:''[^']*)*'"""
             r"""|(?:NULL|TRUE|FALSE)(?!\w)""")
_CONSTANT_ROW = re.compile(rf"\(\s*(?:{_CONSTANT})(?:\s*,\s*(?:{_CONSTANT}))*\s*\)",
                           re.IGNORECASE | re.ASCII)
_CONSTANTS = re.compile(_CONSTANT, re.IGNORECASE | re.ASCII)


@functools.lru_cache(maxsize=64)
def _row_of(width: int) -> re.Pattern:
    """A row of ``width`` constants, after the first row: the separating comma included."""
    one = rf"\s*(?:{_CONSTANT})\s*"
    return re.compile(rf"\s*,\s*\({one}(?:,{one}){{{width - 1}}}\)",
                      re.IGNORECASE | re.ASCII)


#: rows between the offsets of :attr:`ValuesScan.splits`
SPLIT_ROWS = 256


def _scan_constants(body: str) -> tuple[int, int, tuple[int, ...]] | None:
    """(rows, values per row, split offsets) when ``body`` is rows of constants only, each
    as wide as the first (see :data:`_CONSTANT`); else None (the token walk reads it)."""
    first = _CONSTANT_ROW.match(body)
    if first is None:
        return None
    width = len(_CONSTANTS.findall(first.group(0)))
    # the further rows: matches that do not overlap and, together, are as long as the
    # rest of the text cover all of it, one after the other
    rest = _row_of(width).findall(body, first.end())
    if sum(map(len, rest)) != len(body.rstrip()) - first.end():
        return None
    splits, pos = [], first.end()
    for i, text in enumerate(rest, 2):  # row i starts where the text before it ends
        if i % SPLIT_ROWS == 1:
            splits.append(pos)
        pos += len(text)
    return 1 + len(rest), width, tuple(splits)


def constant_rows_span(sql: str) -> tuple[int, int] | None:
    """Where the rows of an INSERT ... VALUES of rows of constants only (each as wide as the
    first: what :func:`scan_insert_values` reads by its regular expression) lie in ``sql``:
    ``(start, end)`` with ``sql[:start]`` the head (``INSERT INTO t [(cols)] VALUES`` and
    the space after it), ``sql[start:end]`` the rows, ``sql[end:]`` whitespace and at most
    one ``;``. None for any other text. (The statement log's redaction reads such a list
    by the same expression instead of tokenizing 200,000 constants.)"""
    m = _HEAD.match(sql)
    if m is None or _ODD_SPACE.search(sql):
        return None
    body = sql[m.end():].rstrip()
    if body.endswith(";"):
        body = body[:-1]
    if _scan_constants(body) is None:
        return None
    return m.end(), m.end() + len(body.rstrip())


def split_rows(values: str, rows: int, cuts: tuple[int, ...], parts: int) -> list[str]:
    """``values`` (a scan's :attr:`~ValuesScan.values` of ``rows`` rows) cut at some of
    its ``cuts`` (:attr:`~ValuesScan.splits`) into at most ``parts`` lists of whole rows
    of about equal length, in order, each as it would follow ``VALUES`` (one list when it
    has no cuts)."""
    if parts < 2 or not cuts:
        return [values]
    # cut j comes before row (j + 1) * SPLIT_ROWS: take the one nearest to each k/parts
    chosen = {cuts[min(len(cuts), max(1, round(k * rows / parts / SPLIT_ROWS))) - 1]
              for k in range(1, parts)}
    bounds = [0, *sorted(chosen), len(values)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        text = values[a:b].lstrip()
        out.append(text[1:].lstrip() if a else text)  # the separating comma
    return out


def scan_insert_values(sql: str, max_depth: int = 250) -> ValuesScan | None:
    """The fast-path reading of an INSERT ... VALUES (see the module doc), or None when the
    statement is anything else or holds anything off the allow-list. ``?`` and ``$n`` must
    not be mixed, nor brackets nest deeper than ``max_depth`` (None: the general path
    explains why)."""
    return _scan(sql, max_depth, constants=True)


def _scan(sql: str, max_depth: int, constants: bool) -> ValuesScan | None:
    """:func:`scan_insert_values`; ``constants=False``: always by the token walk (tests
    compare the two readings)."""
    m = _HEAD.match(sql)
    if m is None or _ODD_SPACE.search(sql):
        return None
    table = _name(m.group(1))
    columns = None if m.group(2) is None else tuple(
        _name(c) for c in _NAMES.findall(m.group(2)))
    body = sql[m.end():].rstrip()
    if body.endswith(";"):
        body = body[:-1]
    if constants:
        found = _scan_constants(body)
        if found is not None:
            return ValuesScan(table, columns, body, found[0], 0, None, (), False,
                              frozenset(), found[1], found[2])
    toks = _TOKEN.findall(body)
    depth = 0
    rows = 0
    qmarks, numbered = 0, 0
    prev = ""
    # per position of each row: how many tokens it holds and the parameter among them
    position, position_tokens, position_param = 0, 0, 0
    direct: list[tuple[int, int]] = []  # (parameter number, position) of a lone parameter
    widths: list[int] = []  # positions per row
    defaults = False
    nested: set[int] = set()  # parameters inside an expression
    n = len(toks)
    for i, text in enumerate(toks):
        if depth == 0:
            # between rows: "(" opens one, "," separates them; nothing else
            if text == "(":
                rows += 1
                depth = 1
                position, position_tokens, position_param = 0, 0, 0
            elif text != "," or prev != ")" or i + 1 >= n or toks[i + 1] != "(":
                return None
            prev = text
            continue
        c = text[0]
        if c == "'":
            if len(text) < 2:  # an unterminated string
                return None
        elif "0" <= c <= "9" or (c == "." and len(text) > 1):
            pass
        elif "a" <= c.lower() <= "z" or c == "_":
            up = text.upper()
            if i + 1 < n and toks[i + 1] == "(":
                if not (up in _CALL_KEYWORDS or text.lower() in SCALAR_FUNCTIONS
                        or (up in _PARAMETRISED_TYPES and prev.upper() in ("AS", "::"))):
                    return None
            elif up not in KEYWORDS and up not in TYPE_WORDS:
                return None
            elif up == "DEFAULT":
                defaults = True
        elif c == "?" or (c == "$" and len(text) > 1):
            if c == "?":
                qmarks += 1
                position_param = qmarks
            else:
                position_param = int(text[1:])
                numbered = max(numbered, position_param)
            if position_tokens or depth > 1:
                nested.add(position_param)
        elif text in _OPEN:
            depth += 1
            if depth > max_depth:
                return None
        elif text in _CLOSE:
            depth -= 1
        elif text != "," and text not in _OPS:
            return None  # a comment, a quoted name, ";", ".", anything unknown
        if depth == 0 or (depth == 1 and text == ","):  # a position ends
            if position_tokens == 1 and position_param:
                direct.append((position_param, position))
            elif position_param:
                nested.add(position_param)
            position += 1
            position_tokens, position_param = 0, 0
            if depth == 0:
                widths.append(position)
        else:
            position_tokens += 1
        prev = text
    if depth != 0 or rows == 0 or prev != ")":
        return None
    if qmarks and numbered:
        return None
    bare = tuple(p for p, _ in direct) if rows == 1 and len(direct) == widths[0] else None
    if qmarks:
        counter = iter(range(1, qmarks + 1))
        body = _QMARK.sub(lambda m: m.group(0) if m.group(0) != "?" else f"${next(counter)}",
                          body)
    return ValuesScan(table, None if columns is None else tuple(columns), body,
                      rows, qmarks or numbered, bare, tuple(direct), defaults,
                      frozenset(nested), widths[0] if len(set(widths)) == 1 else None)


__all__ = ["KEYWORDS", "SPLIT_ROWS", "TYPE_WORDS", "ValuesScan", "constant_rows_span",
           "scan_insert_values", "split_rows"]

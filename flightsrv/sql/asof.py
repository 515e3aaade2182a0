"""Time travel as Delta, Iceberg, Spark and Trino spell it, read as DuckDB's ``AT`` clause.

Contract: :func:`canonical` returns ``text`` with each table reference's

- ``[FOR] VERSION AS OF n`` / ``[FOR] SYSTEM_VERSION AS OF n`` (``n`` an integer literal)
  spelled ``AT (VERSION => n)``, and
- ``[FOR] TIMESTAMP AS OF 'ts'`` / ``[FOR] SYSTEM_TIME AS OF 'ts'`` (a string literal, or
  ``TIMESTAMP 'ts'`` / ``TIMESTAMPTZ 'ts'``) spelled ``AT (TIMESTAMP => 'ts')``,

and nothing else changed: the rest of the text keeps its bytes, so what DuckDB and the
planner read is the statement the user wrote with one spelling of time travel. A clause
is recognised only right after a name (the table's, or its alias) and with a literal after
``OF``, so ``SELECT version AS of FROM t`` (a column aliased ``of``) is left alone; an
``AS OF`` with anything else after it (an expression) is left for DuckDB to refuse.
Strings, quoted names and comments are never looked into (DuckDB's own tokens). Text
without ``AS OF`` is returned at once.

It also spells DuckDB's ``TABLE t`` query (a statement, subquery, CTE body or set
operation operand) ``SELECT * FROM t``, its meaning in DuckDB: the table reference is then
one the engine pins and rewrites like any other; and it leaves out an INSERT's ``BY
POSITION`` (DuckDB's default order).
"""

from __future__ import annotations

import re

from sqlglot.tokens import TokenType

from flightsrv.runtime import text_cache
from flightsrv.sql.lexer import tokenize

_AS_OF = re.compile(r"\bAS\s+OF\b", re.IGNORECASE)

#: the word before AS OF -> the AT clause's kind
_KINDS = {"VERSION": "VERSION", "SYSTEM_VERSION": "VERSION",
          "TIMESTAMP": "TIMESTAMP", "SYSTEM_TIME": "TIMESTAMP"}

#: tokens a table reference (or its alias) ends with
_NAME_END = {TokenType.VAR, TokenType.IDENTIFIER}


def canonical(text: str) -> str:
    """``text`` with Delta/Iceberg/Spark/Trino time travel spelled ``AT (...)`` and the
    ``TABLE t`` query spelled ``SELECT * FROM t``."""
    if not _AS_OF.search(text) and not _TABLE.search(text) and not _BY_POSITION.search(text):
        return text
    return _canonical(text)


_TABLE = re.compile(r"\bTABLE\b", re.IGNORECASE)
_BY_POSITION = re.compile(r"\bBY\s+POSITION\b", re.IGNORECASE)


def _by_position(tokens: list, i: int):
    """(start, end, replacement, next token) of ``BY POSITION`` at token ``i`` right after
    an INSERT's target (its name or column list): DuckDB's default order, so it is left
    out (sqlglot reads ``BY NAME`` only); else None."""
    if i < 3 or i + 2 >= len(tokens) or tokens[0].token_type != TokenType.INSERT or \
            tokens[i].text.upper() != "BY" or tokens[i + 1].text.upper() != "POSITION" or \
            tokens[i - 1].token_type not in _NAME_END | {TokenType.R_PAREN}:
        return None
    return tokens[i].start, tokens[i + 1].end + 1, "", i + 2

#: tokens a ``TABLE t`` query may follow: the statement's start, a parenthesis (a
#: subquery, a CTE's body, or the main query after the CTEs), ``AS`` (``CREATE TABLE x AS
#: TABLE t``), a set operation
_QUERY_BEFORE = {TokenType.L_PAREN, TokenType.R_PAREN, TokenType.ALIAS, TokenType.UNION,
                 TokenType.EXCEPT, TokenType.INTERSECT, TokenType.ALL, TokenType.DISTINCT}


def _table_query(tokens: list, i: int):
    """(start, end, replacement, next token) of ``TABLE`` at token ``i`` when it starts
    DuckDB's (and PostgreSQL's) ``TABLE t`` query, which is ``SELECT * FROM t``; else None.
    ``CREATE TABLE``, ``DROP TABLE``, ``SUMMARIZE TABLE`` etc. follow other words."""
    tok = tokens[i]
    if tok.token_type != TokenType.TABLE or i + 1 >= len(tokens) or \
            tokens[i + 1].token_type not in _NAME_END or \
            (i > 0 and tokens[i - 1].token_type not in _QUERY_BEFORE):
        return None
    return tok.start, tok.end + 1, "SELECT * FROM", i + 1


@text_cache(maxsize=1024)
def _canonical(text: str) -> str:
    try:
        tokens = tokenize(text)
    except Exception:  # noqa: BLE001 - text DuckDB cannot read: DuckDB's error, unchanged
        return text
    edits = []
    i = 0
    while i < len(tokens):
        table = _table_query(tokens, i) or _by_position(tokens, i)
        if table is not None:
            start, end, repl, i = table
            edits.append((start, end, repl))
            continue
        found = _clause(text, tokens, i)
        if found is None:
            i += 1
            continue
        start, end, kind, value, i = found
        edits.append((start, end, f"AT ({kind} => {value})"))
    if not edits:
        return text
    out, pos = [], 0
    for start, end, repl in edits:
        out.append(text[pos:start])
        out.append(repl)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _clause(text: str, tokens: list, i: int):
    """(start, end, kind, value, next token) of a time travel clause starting at token
    ``i``, or None."""
    j = i
    if tokens[j].text.upper() == "FOR":
        j += 1
    if j + 3 >= len(tokens) or i == 0 or tokens[i - 1].token_type not in _NAME_END:
        return None
    kind = _KINDS.get(tokens[j].text.upper())
    if kind is None or tokens[j + 1].token_type != TokenType.ALIAS \
            or tokens[j + 2].text.upper() != "OF":
        return None
    k = j + 3
    tok = tokens[k]
    if kind == "TIMESTAMP" and tok.text.upper() in ("TIMESTAMP", "TIMESTAMPTZ") and \
            k + 1 < len(tokens) and tokens[k + 1].token_type == TokenType.STRING:
        k += 1
        tok = tokens[k]
    if kind == "VERSION" and tok.token_type == TokenType.NUMBER and tok.text.isdigit():
        value = tok.text
    elif kind == "TIMESTAMP" and tok.token_type == TokenType.STRING:
        value = text[tok.start:tok.end + 1]  # the literal as written, quotes and all
    else:
        return None
    return tokens[i].start, tok.end + 1, kind, value, k + 1

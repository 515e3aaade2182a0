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
    """``text`` with Delta/Iceberg/Spark/Trino time travel spelled ``AT (...)``."""
    if not _AS_OF.search(text):
        return text
    return _canonical(text)


@text_cache(maxsize=1024)
def _canonical(text: str) -> str:
    try:
        tokens = tokenize(text)
    except Exception:  # noqa: BLE001 - text DuckDB cannot read: DuckDB's error, unchanged
        return text
    edits = []
    i = 0
    while i < len(tokens):
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

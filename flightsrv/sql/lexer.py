"""sqlglot's DuckDB tokens of a statement, with positional parameters ``$n`` read as DuckDB
reads them.

Contract: :func:`tokenize` returns what ``DuckDB().tokenize`` returns (same token types,
texts and offsets), except that ``$`` followed by a digit at the start of a token is always
a ``PARAMETER`` token followed by a ``NUMBER``, and raises ``TokenError`` on the same
malformed text (an open string, quoted name or comment).

Why: sqlglot reads ``$`` as the start of a dollar-quoted string ``$tag$...$tag$`` and takes
everything up to the next ``$`` as the tag, so ``$1,$2`` is an unterminated string with the
tag ``1,`` ("cannot tokenize ... '$1,$'"); it falls back to a parameter only when the tag is
all digits or has a space. DuckDB (PostgreSQL's lexer) allows a tag only of identifier
characters not starting with a digit (``dolq_start``), so ``$<digit>`` is always a
parameter: https://www.postgresql.org/docs/current/sql-syntax-lexical.html#SQL-SYNTAX-DOLLAR-QUOTING
"""

from __future__ import annotations

import re

from sqlglot.dialects.duckdb import DuckDB
from sqlglot.tokens import Token, TokenType

# a ``$`` then a digit, not inside a word (``a$1`` is one identifier, ``$tag$1`` closes a tag)
_POSITIONAL = re.compile(r"(?<![\w$])\$(?=[0-9])")


def tokenize(text: str) -> list[Token]:
    """DuckDB-dialect tokens of ``text`` (see the module docstring)."""
    if "$" not in text:
        return DuckDB().tokenize(text)
    marks = [m.start() for m in _POSITIONAL.finditer(text)]
    if not marks:
        return DuckDB().tokenize(text)
    # Spell each candidate as "?" (same length, so offsets hold) and tokenize: a candidate
    # that starts a PLACEHOLDER token is a parameter; one inside a string, quoted name or
    # comment is not, and is put back before tokenizing again.
    tokens = DuckDB().tokenize(_spell(text, marks))
    starts = {t.start for t in tokens if t.token_type == TokenType.PLACEHOLDER}
    params = [p for p in marks if p in starts]
    if len(params) != len(marks):
        tokens = DuckDB().tokenize(_spell(text, params))
    for tok in tokens:
        if tok.token_type == TokenType.PLACEHOLDER and text[tok.start] == "$":
            tok.token_type = TokenType.PARAMETER
            tok.text = "$"
    return tokens


def _spell(text: str, positions: list[int]) -> str:
    chars = list(text)
    for p in positions:
        chars[p] = "?"
    return "".join(chars)

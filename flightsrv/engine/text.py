"""Statement text, cut and edited along DuckDB's own tokens.

The engine runs the user's own text wherever it can (so DuckDB, not a re-rendering, decides
what it means) and only cuts it into clauses and replaces table references. Cutting uses
DuckDB's tokenizer (``duckdb.tokenize``), so a keyword inside a string literal, a quoted
identifier or a comment is never taken for a clause boundary. Comments are blanked in every
slice, so a trailing ``-- ...`` can never swallow text the engine appends.
"""

from __future__ import annotations

from typing import NamedTuple

import duckdb

from flightsrv.errors import SqlError


class Tok(NamedTuple):
    """One token (a named tuple: a 1,000-literal statement makes ~2,000 of them)."""

    start: int  # character offsets in the text
    end: int
    kind: str  # keyword | identifier | operator | numeric_const | string_const | comment
    upper: str  # the token's text, upper case


#: DuckDB's token kind -> its name (``token_type.numeric_const`` -> ``numeric_const``)
_KIND_NAMES: dict = {}


def _kind_name(kind) -> str:
    name = _KIND_NAMES.get(kind)
    if name is None:
        name = _KIND_NAMES[kind] = str(kind).rsplit(".", 1)[-1]
    return name


def tokenize(text: str) -> list[Tok]:
    """DuckDB's tokens of ``text`` with character (not byte) offsets."""
    raw = text.encode("utf-8")
    try:
        found = duckdb.tokenize(text)
    except duckdb.Error as e:
        raise SqlError.from_engine(f"cannot tokenize: {str(e).splitlines()[0]}") from None
    # byte offset -> character offset (the same for ASCII text; else counted once, in order)
    if len(raw) == len(text):
        starts = [p for p, _ in found]
    else:
        starts, chars, prev = [], 0, 0
        for p, _ in found:
            chars += len(raw[prev:p].decode("utf-8", "replace"))
            prev = p
            starts.append(chars)
    # a token runs to the next one's start (or the end), trailing whitespace dropped
    ends = starts[1:] + [len(text)]
    out = []
    append = out.append
    for a, b, (_, kind) in zip(starts, ends, found):
        piece = text[a:b].rstrip()
        append(Tok(a, a + len(piece), _kind_name(kind), piece.upper()))
    return out


def clause_starts(toks: list[Tok], words: set[str], lo: int = 0,
                  hi: int | None = None) -> list[tuple[str, int]]:
    """(WORD, token index) of keywords in ``words`` at depth 0 between token indices ``lo``
    and ``hi``: outside parentheses, brackets and ``CASE ... END``, and not the ``FROM`` of
    ``IS [NOT] DISTINCT FROM``."""
    hi = len(toks) if hi is None else hi
    depth, out = 0, []
    for i in range(lo, hi):
        t = toks[i]
        if t.kind == "operator":
            depth += t.upper.count("(") + t.upper.count("[") - t.upper.count(")") \
                - t.upper.count("]")
        elif t.kind == "keyword" and t.upper == "CASE":
            depth += 1
        elif t.kind == "keyword" and t.upper == "END" and depth > 0:
            depth -= 1
        elif depth == 0 and t.kind == "keyword" and t.upper in words:
            if t.upper == "FROM" and i > 0 and toks[i - 1].upper == "DISTINCT":
                continue
            out.append((t.upper, i))
    return out


def render(text: str, toks: list[Tok], a: int, b: int,
           edits: list[tuple[int, int, str]] = ()) -> str:
    """``text[a:b]`` with ``edits`` (char start, char end, replacement) applied and every
    comment blanked."""
    changes = sorted([e for e in edits if a <= e[0] < b]
                     + [(t.start, t.end, " ") for t in toks
                        if t.kind == "comment" and a <= t.start < b])
    out, pos = [], a
    for s, e, repl in changes:
        if s < pos:
            raise SqlError("overlapping edits while planning the statement")
        out.append(text[pos:s])
        out.append(repl)
        pos = e
    out.append(text[pos:b])
    return "".join(out).strip()


def parameter_edits(toks: list[Tok], literals: list[str]) -> list[tuple[int, int, str]]:
    """Edits replacing each ``$n`` by the SQL literal of parameter ``n``."""
    edits = []
    for i, t in enumerate(toks[:-1]):
        nxt = toks[i + 1]
        if t.kind == "operator" and t.upper == "$" and nxt.kind == "numeric_const" \
                and nxt.start == t.end and nxt.upper.isdigit():
            n = int(nxt.upper)
            if not 1 <= n <= len(literals):
                raise SqlError(f"parameter ${n} has no value")
            edits.append((t.start, nxt.end, literals[n - 1]))
    return edits


__all__ = ["Tok", "clause_starts", "parameter_edits", "render", "tokenize"]

"""Error construction for the SQL front end: a :class:`~flightsrv.errors.SqlError` that names
the statement (shortened) and, where sqlglot recorded one, the position of the offending node;
:func:`caret_block` points at a position the way DuckDB does (``LINE n:`` and carets).
"""

from __future__ import annotations

from sqlglot import exp

from flightsrv.errors import SqlError


def position(node: exp.Expression | None) -> tuple[int | None, int | None]:
    """(line, col) of the first token sqlglot recorded under ``node``, else (None, None)."""
    if not isinstance(node, exp.Expression):  # None, or a flag sqlglot left in its place
        return None, None
    for n in node.walk():
        meta = getattr(n, "_meta", None) or {}
        if "line" in meta:
            col = meta.get("col")
            if col is not None and "start" in meta and "end" in meta:
                col = col - (meta["end"] - meta["start"])  # sqlglot's col is the token's end
            return meta["line"], col
    return None, None


def short(sql: str, limit: int = 200) -> str:
    """The statement on one line, at most ``limit`` characters, quoted."""
    s = " ".join(sql.split())
    return repr(s if len(s) <= limit else s[: limit - 3] + "...")


#: the widest line :func:`caret_block` shows whole; a longer one is cut around the position
MAX_LINE = 120


def caret_block(text: str, line: int, col: int, width: int = 1) -> str | None:
    """``LINE n: <line n of text>`` and, below it, ``width`` carets under 1-based column
    ``col``, as DuckDB prints an error's position (a line longer than :data:`MAX_LINE` is
    cut to the part around the position, marked ``...``); None for a position outside."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines) or col < 1 or col > len(lines[line - 1]) + 1:
        return None
    shown, at = lines[line - 1].rstrip("\r"), col - 1
    if len(shown) > MAX_LINE:
        start = max(0, at - MAX_LINE // 2)
        end = min(len(shown), start + MAX_LINE)
        prefix, suffix = ("..." if start else ""), ("..." if end < len(shown) else "")
        shown, at = prefix + shown[start:end] + suffix, at - start + len(prefix)
    head = f"LINE {line}: "
    return f"{head}{shown}\n{' ' * (len(head) + at)}{'^' * max(1, width)}"


def error(message: str, sql: str, node: exp.Expression | None = None, **ctx) -> SqlError:
    line, col = position(node)
    return SqlError(message, statement=short(sql), line=line, col=col, **ctx)


__all__ = ["caret_block", "error", "position", "short"]

"""Error construction for the SQL front end: a :class:`~flightsrv.errors.SqlError` that names
the statement (shortened) and, where sqlglot recorded one, the position of the offending node.
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


def error(message: str, sql: str, node: exp.Expression | None = None, **ctx) -> SqlError:
    line, col = position(node)
    return SqlError(message, statement=short(sql), line=line, col=col, **ctx)

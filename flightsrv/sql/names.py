"""User-facing names: the relation names flightsrv substitutes for table references
(``__fsrv_r0``, its Arrow streams ``__fsrv_r0_a0``, metadata functions' ``__fsrv_rf0``) turned
back into what the user wrote, in result column names and in error messages.

DuckDB names a result column after its expression as DuckDB prints it, so
``SELECT (SELECT count(*) FROM t)`` is named ``(SELECT count_star() FROM t)``; flightsrv runs
``... FROM __fsrv_r0 AS t`` and DuckDB prints that. :class:`PublicNames` undoes exactly the
substitution: ``__fsrv_r0 AS t`` becomes ``t`` when the user wrote no alias (the table's name,
printed by DuckDB as the alias, is how DuckDB prints the table's name too), else the table's
name printed as DuckDB prints identifiers (quoted only when it is a keyword or not a plain
identifier).
"""

from __future__ import annotations

import functools
import re

import duckdb

from flightsrv.sql.binder import RESERVED

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: any internal relation name flightsrv registers (a scan, its parts, a metadata function)
_INTERNAL = re.compile(re.escape(RESERVED) + r"[A-Za-z0-9_]*")


@functools.lru_cache(maxsize=1)
def _keywords() -> frozenset[str]:
    con = duckdb.connect(":memory:")
    try:
        return frozenset(k for (k,) in con.execute(
            "SELECT keyword_name FROM duckdb_keywords()").fetchall())
    finally:
        con.close()


def printed(name: str) -> str:
    """``name`` as DuckDB prints an identifier in an expression's text."""
    if _PLAIN.fullmatch(name) and name.lower() not in _keywords():
        return name
    return '"' + name.replace('"', '""') + '"'


class PublicNames:
    """Undo the relation names of one statement. ``entries``: (relation, the table
    reference as the user wrote it without alias (qualifier included, printed), whether it
    had an alias)."""

    def __init__(self, entries=()):
        self._by_relation: dict[str, tuple[str, bool]] = {r: (shown, aliased)
                                                           for r, shown, aliased in entries}
        if self._by_relation:
            names = "|".join(sorted(map(re.escape, self._by_relation), key=len, reverse=True))
            self._ref = re.compile(rf"\b({names})(?![A-Za-z0-9_]) AS ((?:\"(?:[^\"]|\"\")*\"|"
                                   r"[A-Za-z0-9_]+))")
        else:
            self._ref = None

    @property
    def entries(self) -> list[tuple[str, str, bool]]:
        return [(r, shown, aliased) for r, (shown, aliased) in self._by_relation.items()]

    def _undo_ref(self, m: re.Match) -> str:
        shown, aliased = self._by_relation[m.group(1)]
        return f"{shown} AS {m.group(2)}" if aliased else shown

    def column(self, name: str) -> str:
        """A result column's name as DuckDB names it for the user's own statement."""
        if RESERVED not in name or self._ref is None:
            return name
        return self._ref.sub(self._undo_ref, name)

    def _table_of(self, internal: str) -> str | None:
        best = None
        for r, (shown, _) in self._by_relation.items():
            if (internal == r or internal.startswith(r + "_")) and \
                    (best is None or len(r) > len(best[0])):
                best = (r, shown)
        return best[1] if best else None

    def message(self, text: str) -> str:
        """An error message with no internal relation name: a reference becomes what the
        user wrote, a stream or part of one becomes its table's name."""
        if RESERVED not in text:
            return text
        if self._ref is not None:
            text = self._ref.sub(self._undo_ref, text)
        text = re.sub(r"the stream registered as '([^']*)'",
                      lambda m: f"table '{self._table_of(m.group(1)) or 'of the statement'}'",
                      text)
        return _INTERNAL.sub(lambda m: self._table_of(m.group(0)) or "(internal)", text)

    def schema(self, schema):
        """``schema`` (a pyarrow schema) with its field names made public."""
        names = [self.column(n) for n in schema.names]
        if names == schema.names:
            return schema
        import pyarrow as pa

        return pa.schema([f.with_name(n) for f, n in zip(schema, names)],
                         metadata=schema.metadata)


__all__ = ["PublicNames", "printed"]

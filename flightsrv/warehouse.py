"""The public Python API: ``flightsrv.Warehouse`` and ``flightsrv.Table``.

They extend the format-level classes (:mod:`flightsrv.table.warehouse`,
:mod:`flightsrv.table.table`) with everything that needs SQL, and route all of it through
the one engine (:class:`~flightsrv.engine.duck.DuckEngine`) that the Flight SQL server uses,
so a filter, a DELETE, an UPDATE or a MERGE means exactly what the same SQL means over
Flight: DuckDB decides which rows match.

- ``Table.scan(columns, filter=..., version=..., as_of=...)`` / ``to_table`` /
  ``count_rows``: ``SELECT cols FROM t [AT (...)] WHERE <filter>``;
- ``Table.delete(where, mode="dv"|"splice", expire=...)``: ``DELETE FROM t WHERE <where>``;
- ``Table.update({"col": "sql expression"}, where=...)``: ``UPDATE t SET ... WHERE ...``;
- ``Table.merge(source, on=..., ...)``: ``MERGE INTO t USING <source> AS s ON ...``, where
  ``source`` is another table's name or an Arrow table / record batch reader;
- ``Warehouse.sql(statement)``: any statement the server accepts.

``filter``/``where``/``on`` and SET expressions are SQL expressions over the table's
columns, in DuckDB's dialect; each must be one expression (no statement separators, no
query clauses).
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa

from flightsrv.errors import SqlError
from flightsrv.runtime import Runtime
from flightsrv.table.table import Table as _FormatTable
from flightsrv.table.warehouse import Warehouse as _FormatWarehouse
from flightsrv.table.warehouse import check_name

__all__ = ["Table", "Warehouse", "check_name"]

_CLAUSE_WORDS = {"SELECT", "FROM", "UNION", "EXCEPT", "INTERSECT", "ORDER", "LIMIT", "GROUP",
                 "HAVING", "WINDOW", "QUALIFY", "OFFSET", "RETURNING", "WHEN", "SET", "USING"}
_SOURCE = "_merge_source"  # bound for one MERGE statement; shadows a table of that name


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _expression(text: str, what: str) -> str:
    """``text`` if it is one SQL expression (checked on DuckDB's tokens), else SqlError.
    Text holding a ``--`` comment comes on a line of its own, so the comment ends before
    the rest of the statement (the closing parenthesis) does."""
    from flightsrv.engine.text import clause_starts, tokenize

    if not isinstance(text, str) or not text.strip():
        raise SqlError(f"{what} must be a SQL expression", statement=repr(text))
    toks = tokenize(text)
    depth = 0
    for t in toks:
        if t.kind == "operator":
            depth += t.upper.count("(") - t.upper.count(")")
            if depth < 0 or ";" in t.upper:
                break
    else:
        if depth == 0 and not clause_starts(toks, _CLAUSE_WORDS):
            return text.strip() if "--" not in text else f"\n{text.strip()}\n"
    raise SqlError(f"{what} must be one SQL expression (no query clauses or ';')",
                   statement=repr(" ".join(text.split())[:200]))


class Table(_FormatTable):
    """A table of a :class:`Warehouse`, with SQL-backed reads and changes."""

    def __init__(self, warehouse: "Warehouse", name: str):
        super().__init__(warehouse.home, name)
        self.warehouse = warehouse  # its engine runs this table's SQL

    def _at(self, version=None, as_of=None) -> str:
        if version is not None and as_of is not None:
            raise SqlError("give version or as_of, not both", table=self.name)
        if version is not None:
            return f" AT (VERSION => {int(version)})"
        if as_of is not None:
            from flightsrv.table.timestamps import parse_timestamp_ms
            import datetime as dt

            ms = parse_timestamp_ms(as_of)
            ts = dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)
            return f" AT (TIMESTAMP => '{ts.isoformat()}')"
        return ""

    def scan(self, columns=None, filter=None, *, version=None, as_of=None
             ) -> pa.RecordBatchReader:
        """Live rows of a version; with ``filter``, those DuckDB says it is TRUE for."""
        if filter is None:
            return super().scan(columns, version=version, as_of=as_of)
        none = columns is not None and not columns
        cols = "*" if columns is None else ("1 AS x" if none else
                                            ", ".join(_ident(c) for c in columns))
        sql = (f"SELECT {cols} FROM {_ident(self.name)}{self._at(version, as_of)} "
               f"WHERE ({_expression(filter, 'filter')})")
        reader = self.warehouse.engine.execute_query(sql, self.warehouse._session()).reader
        if not none:
            return reader
        empty = pa.schema([])
        return pa.RecordBatchReader.from_batches(empty, (b.select([]) for b in reader))

    def to_table(self, columns=None, filter=None, *, version=None, as_of=None) -> pa.Table:
        return self.scan(columns, filter, version=version, as_of=as_of).read_all()

    def count_rows(self, filter=None, *, version=None, as_of=None) -> int:
        if filter is None:
            return super().count_rows(version=version, as_of=as_of)
        sql = (f"SELECT count(*) FROM {_ident(self.name)}{self._at(version, as_of)} "
               f"WHERE ({_expression(filter, 'filter')})")
        return int(self.warehouse.engine.execute_query(
            sql, self.warehouse._session()).reader.read_all().column(0)[0].as_py())

    def delete(self, where: str = "TRUE", *, mode: str | None = None, expire: bool = False,
               grace=None, progress=None, certificate: bool | None = None,
               source: str = "python") -> int:
        """``DELETE FROM t WHERE <where>``: the rows deleted. ``mode`` "dv" (deletion
        vectors) or "splice" (erase the bytes; the result's ``.result`` is the erasure
        report, with ``expire``/``certificate`` as for
        :func:`flightsrv.table.erase.splice_positions`); default: the table property
        ``delete_mode``, else "dv"."""
        sql = f"DELETE FROM {_ident(self.name)} WHERE ({_expression(where, 'where')})"
        return self.warehouse.engine.delete_statement(
            sql, self.warehouse._session(), mode=mode, expire=expire, grace=grace,
            progress=progress, certificate=certificate, source=source)

    def update(self, set: dict[str, str], where: str | None = None) -> int:
        """``UPDATE t SET col = <expr>, ... [WHERE <where>]``: the rows updated."""
        if not set:
            raise SqlError("update needs at least one column to set", table=self.name)
        sets = ", ".join(f"{_ident(c)} = ({_expression(e, 'set ' + c)})" for c, e in set.items())
        sql = f"UPDATE {_ident(self.name)} SET {sets}"
        if where is not None:
            sql += f" WHERE ({_expression(where, 'where')})"
        return self.warehouse.engine.execute_update(sql, self.warehouse._session())

    def merge(self, source, on: str, *, when_matched_update: dict[str, str] | str | None = None,
              when_matched_delete: bool | str = False,
              when_not_matched_insert: dict[str, str] | str | None = None,
              source_alias: str = "s") -> int:
        """``MERGE INTO t USING <source> AS <source_alias> ON <on> WHEN ...``.

        ``source``: a table name of this warehouse, or Arrow data (bound for this statement
        only). ``when_matched_update``: ``"*"`` or ``{col: expr}``; ``when_matched_delete``:
        True or a condition; ``when_not_matched_insert``: ``"*"`` or ``{col: expr}``.
        Clauses apply in the order delete, update, insert (DuckDB's first-match rule).
        Returns the rows inserted, updated and deleted."""
        extra: dict[str, Any] = {}
        if isinstance(source, str):
            src = _ident(check_name(source))
        else:
            if isinstance(source, pa.RecordBatchReader):
                source = source.read_all()
            elif isinstance(source, pa.RecordBatch):
                source = pa.Table.from_batches([source])
            if not isinstance(source, pa.Table):
                raise SqlError("merge source must be a table name or Arrow data",
                               got=type(source).__name__)
            extra[_SOURCE] = source
            src = _SOURCE
        alias = _ident(source_alias)
        clauses = []
        if when_matched_delete:
            cond = "" if when_matched_delete is True else \
                f" AND ({_expression(when_matched_delete, 'when_matched_delete')})"
            clauses.append(f"WHEN MATCHED{cond} THEN DELETE")
        if when_matched_update is not None:
            if when_matched_update == "*":
                clauses.append("WHEN MATCHED THEN UPDATE SET *")
            else:
                sets = ", ".join(f"{_ident(c)} = ({_expression(e, 'update ' + c)})"
                                 for c, e in when_matched_update.items())
                clauses.append(f"WHEN MATCHED THEN UPDATE SET {sets}")
        if when_not_matched_insert is not None:
            if when_not_matched_insert == "*":
                clauses.append("WHEN NOT MATCHED THEN INSERT *")
            else:
                cols = ", ".join(_ident(c) for c in when_not_matched_insert)
                vals = ", ".join(f"({_expression(e, 'insert ' + c)})"
                                 for c, e in when_not_matched_insert.items())
                clauses.append(f"WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({vals})")
        if not clauses:
            raise SqlError("merge needs at least one WHEN clause", table=self.name)
        sql = (f"MERGE INTO {_ident(self.name)} USING {src} AS {alias} "
               f"ON ({_expression(on, 'on')}) " + " ".join(clauses))
        return self.warehouse.engine.execute_update(sql, self.warehouse._session(),
                                                    extra=extra)


class Warehouse(_FormatWarehouse):
    """A warehouse whose tables speak SQL (see the module docstring)."""

    def _new_table(self, name: str) -> Table:
        return Table(self, name)

    def __init__(self, store, runtime: Runtime | None = None):
        from flightsrv.runtime import DEFAULT_RUNTIME

        super().__init__(store, runtime or DEFAULT_RUNTIME)
        self._engine = None
        self._engine_lock = threading.Lock()

    @property
    def engine(self):
        """The DuckDB engine for this warehouse (created on first use)."""
        with self._engine_lock:
            if self._engine is None:
                from flightsrv.engine.duck import DuckEngine

                self._engine = DuckEngine(self, group_commit=False)
            return self._engine

    def _session(self):
        from flightsrv.engine.api import Role, Session

        return Session(session_id="python-api", user="python-api", role=Role.WRITER)

    def sql(self, statement: str, params: list | None = None):
        """Run one statement: a query returns a ``pyarrow.Table``, anything else the number
        of rows it affected."""
        engine = self.engine
        session = self._session()
        batch = None
        if params:
            batch = pa.RecordBatch.from_arrays([pa.array([v]) for v in params],
                                               names=[str(i) for i in range(len(params))])
        prepared = engine.prepare(statement, session)
        from flightsrv.engine.api import StatementKind

        if prepared.kind == StatementKind.QUERY:
            return engine.execute_query(statement, session, batch).reader.read_all()
        return engine.execute_update(statement, session, batch)

"""What every phase of one statement shares, below the engine that runs it.

- :class:`StatementContext`: who runs a statement, how to stop it, what it did (the
  per-execution state the plan, register, execute and stream phases fill in);
- :func:`table_pinner`: the :class:`~flightsrv.sql.plan.Pinner` of one statement over a
  warehouse (each referenced table pinned once, at the head unless the statement time
  travels);
- :class:`QueryRunner`: the part of the engine the writing statements
  (:mod:`flightsrv.engine.writes`) use, so they depend on this module and not on
  :mod:`flightsrv.engine.duck` (which depends on them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import pyarrow as pa
from sqlglot import exp

from flightsrv.engine.api import Cancel, ExecInfo, Session
from flightsrv.engine.connection import session_values
from flightsrv.errors import ConfigurationError, TableNotFound
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st
from flightsrv.sql.names import PublicNames


@dataclass
class StatementContext:
    """One statement's execution: who runs it, how to stop it, what it did."""

    session: Session
    cancel: Cancel | None = None
    info: ExecInfo = field(default_factory=ExecInfo)
    extra: dict[str, pa.Table] = field(default_factory=dict)  # relations bound by name
    failures: list = field(default_factory=list)  # raised inside scans while DuckDB pulls
    natives: dict = field(default_factory=dict)  # local path -> (table, key, version) read
    #: what result names and messages show for the relations the statement registered
    names: PublicNames = field(default_factory=PublicNames)
    #: mask slots (:mod:`flightsrv.engine.maskext`) pinned until the statement's cursor closes
    mask_slots: list = field(default_factory=list)

    def check(self, sql: str) -> None:
        if self.cancel is not None:
            self.cancel.check(statement=st._short(sql))

    def session_values(self, cur, sql: str) -> None:
        """Let ``current_user`` and ``current_role`` in ``sql`` (the user's statement, or
        a phase's text made from it), about to run on the DuckDB cursor ``cur``, answer for
        this statement's principal (:func:`~flightsrv.engine.connection.session_values`)."""
        session_values(cur, sql, self.session.user, self.session.role.value)


def table_pinner(warehouse, instant: Callable[[str, str], int] | None = None,
                 versions: dict[str, int] | None = None) -> sqlplan.Pinner:
    """A fresh pinner over ``warehouse``: one per statement execution, so a statement reads
    each table's head as of its own start (``TableNotFound`` for a name that is not even a
    valid table name). ``instant(text, table)``: the epoch milliseconds of an
    ``AT (TIMESTAMP => 'text')``, as the engine's DuckDB reads the text (a time without an
    offset is in the engine's time zone); without it, the table layer's reading (ISO 8601,
    naive = UTC). ``versions``: a reference without ``AT`` to a table named there reads
    that version instead of the head (``VersionNotFound`` when it is gone, or belongs to
    a table since dropped or replaced)."""
    tables: dict[str, Any] = {}

    def resolve(name: str, version: int | None, as_of: str | None):
        if name not in tables:
            try:
                tables[name] = warehouse.handle(name)
            except ConfigurationError as e:  # not even a valid name (e.g. a file path)
                raise TableNotFound("no such table", table=name, reason=e.message) from None
        if version is None and as_of is None:
            if versions is not None and name in versions:
                return tables[name].snapshot(version=versions[name])
            return tables[name].snapshot()
        if as_of is not None and instant is not None:
            as_of = instant(as_of, name)
        return tables[name].snapshot(version=version, as_of=as_of)

    return sqlplan.Pinner(resolve)


class QueryRunner(Protocol):
    """What :class:`~flightsrv.engine.writes.Writes` needs of its engine."""

    warehouse: Any
    batch_size: int
    committer: Any  # a GroupCommitter, or None (append directly)
    _sandbox: Any  # CursorSource of the database that can open no file

    def _table(self, name: str) -> Any: ...

    def _pinner(self) -> sqlplan.Pinner: ...

    def _run_query(self, stmt: st.Statement, bound: exp.Expression, part: str,
                   pinner: sqlplan.Pinner, values: list[pa.Scalar], ctx: StatementContext,
                   *, check_types: Callable | None = None) -> pa.RecordBatchReader: ...

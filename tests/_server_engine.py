"""A small, real Engine for the server tests: in-memory DuckDB behind the Engine protocol.

It is not the product engine (flightsrv.engine): no table format, no object store. It runs
real SQL on real DuckDB tables so that the Flight SQL server can be tested end to end with
real clients. Tables live in the attached database ``flightsrv``, schema ``main``.
"""

from __future__ import annotations

import re
import threading

import duckdb
import pyarrow as pa

from flightsrv import errors
from flightsrv.engine.api import (
    Cancel,
    ExecInfo,
    IngestMode,
    Prepared,
    QueryResult,
    Role,
    Session,
    StatementKind,
)

_QUERY_TYPES = {"SELECT", "EXPLAIN", "PRAGMA", "RELATION", "CALL"}
_MISSING_TABLE = re.compile(r"Table with name (\w+) does not exist", re.IGNORECASE)


class DuckDBTestEngine:
    def __init__(self, batch_rows: int = 10_000):
        self._con = duckdb.connect()
        self._con.execute("SET enable_progress_bar=false")
        self._con.execute("ATTACH ':memory:' AS flightsrv")
        self._con.execute("USE flightsrv")
        self._batch_rows = batch_rows
        self._lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []  # (method, sql/table), for assertions

    def _cursor(self):
        with self._lock:
            cur = self._con.cursor()
        cur.execute("USE flightsrv")
        return cur

    @staticmethod
    def _translate(exc: Exception, sql: str | None = None, table: str | None = None):
        msg = str(exc).splitlines()[0]
        m = _MISSING_TABLE.search(str(exc))
        if isinstance(exc, duckdb.CatalogException) and m:
            return errors.TableNotFound(msg, table=table or m.group(1))
        if isinstance(exc, duckdb.CatalogException) and "already exists" in msg:
            return errors.TableExists(msg, table=table)
        if isinstance(exc, duckdb.Error):
            return errors.SqlError(msg, statement=sql)
        return exc

    def prepare(self, sql: str, session: Session, params=None, *, cancel=None) -> Prepared:
        self.calls.append(("prepare", sql))
        try:
            statements = duckdb.extract_statements(sql)
        except duckdb.Error as exc:
            raise self._translate(exc, sql) from None
        if len(statements) != 1:
            raise errors.SqlError("expected exactly one statement", statement=sql,
                                  count=len(statements))  # fmt: skip
        st = statements[0]
        kind = StatementKind.QUERY if st.type.name in _QUERY_TYPES else StatementKind.UPDATE
        n_params = len(st.named_parameters)
        param_schema = pa.schema([pa.field(str(i), pa.null()) for i in range(n_params)])
        schema = pa.schema([])
        if kind == StatementKind.QUERY:
            try:
                cur = self._cursor()
                if n_params:
                    # bind the values (else NULLs) just to learn the result columns
                    values = self._rows(params)[0] if params is not None else []
                    rel = cur.sql(f"SELECT * FROM ({sql}) LIMIT 0",
                                  params=values or [None] * n_params)
                else:
                    rel = cur.sql(sql).limit(0)
                schema = rel.to_arrow_table().schema
            except duckdb.Error as exc:
                raise self._translate(exc, sql) from None
        effects = kind == StatementKind.UPDATE
        return Prepared(sql=sql, kind=kind, dataset_schema=schema, parameter_schema=param_schema,
                        effects=effects, statement_kind=st.type.name.lower())

    @staticmethod
    def _rows(params: pa.RecordBatch | None) -> list[list]:
        if params is None or params.num_columns == 0:
            return [[]]
        cols = [c.to_pylist() for c in params.columns]
        return [list(r) for r in zip(*cols)]

    @staticmethod
    def _interruptible(cur, cancel: Cancel | None):
        if cancel is None:
            return lambda: None
        return cancel.on_cancel(cur.interrupt)

    def execute_query(self, sql, session, params=None, *, cancel: Cancel | None = None,
                      versions: dict | None = None) -> QueryResult:  # (no versions here)
        self.calls.append(("query", sql))
        rows = self._rows(params)
        try:
            cur = self._cursor()
            self._interruptible(cur, cancel)
            if len(rows) == 1:
                rel = cur.sql(sql, params=rows[0] or None)
                reader = rel.to_arrow_reader(self._batch_rows)
                return QueryResult(reader.schema, reader)
            tables = [cur.sql(sql, params=r).to_arrow_table() for r in rows]
            table = pa.concat_tables(tables)
            return QueryResult(table.schema, pa.RecordBatchReader.from_batches(
                table.schema, table.to_batches()))  # fmt: skip
        except duckdb.Error as exc:
            if cancel is not None:
                cancel.check(statement=sql)
            raise self._translate(exc, sql) from None

    def execute_update(self, sql, session, params=None, *, cancel: Cancel | None = None,
                       info: ExecInfo | None = None) -> int:
        self.calls.append(("update", sql))
        if session.role != Role.WRITER:
            raise errors.PermissionDenied("role reader may not modify data",
                                          user=session.user, statement=sql)  # fmt: skip
        total = 0
        try:
            cur = self._cursor()
            self._interruptible(cur, cancel)
            cur.execute("BEGIN")
            for row in self._rows(params):
                cur.execute(sql, row or None)
                got = cur.fetchall()
                if got and len(got[0]) == 1 and isinstance(got[0][0], int):
                    total += got[0][0]
            cur.execute("COMMIT")
        except duckdb.Error as exc:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass
            if cancel is not None:
                cancel.check(statement=sql)
            raise self._translate(exc, sql) from None
        if info is not None:
            info.rows = total
        return total

    def ingest(self, table, mode, data, session, *, cancel: Cancel | None = None) -> int:
        self.calls.append(("ingest", table))
        if session.role != Role.WRITER:
            raise errors.PermissionDenied("role reader may not ingest", table=table)
        exists = table in self.list_tables()
        if mode == IngestMode.CREATE and exists:
            raise errors.TableExists("table already exists", table=table)
        if mode == IngestMode.APPEND and not exists:
            raise errors.TableNotFound("table does not exist", table=table)
        data_table = data.read_all()  # test engine: small data
        cur = self._cursor()
        cur.register("_ingest_src", data_table)
        quoted = '"' + table.replace('"', '""') + '"'
        try:
            if mode == IngestMode.REPLACE or not exists:
                cur.execute(f"CREATE OR REPLACE TABLE {quoted} AS SELECT * FROM _ingest_src")
            else:
                have = self.table_schema(table).names
                if have != data_table.schema.names:
                    raise errors.SchemaMismatch("columns differ", table=table,
                                                expected=have, got=data_table.schema.names)
                cur.execute(f"INSERT INTO {quoted} SELECT * FROM _ingest_src")
        except duckdb.Error as exc:
            raise self._translate(exc, table=table) from None
        finally:
            cur.unregister("_ingest_src")
        return data_table.num_rows

    def list_tables(self, broken: list | None = None) -> list[str]:
        rows = self._cursor().execute(
            "SELECT table_name FROM duckdb_tables() "
            "WHERE database_name='flightsrv' AND schema_name='main' ORDER BY 1"
        ).fetchall()
        return [r[0] for r in rows]

    def table_schema(self, table: str) -> pa.Schema:
        quoted = '"' + table.replace('"', '""') + '"'
        try:
            return self._cursor().sql(f"SELECT * FROM {quoted} LIMIT 0").to_arrow_table().schema
        except duckdb.Error as exc:
            raise self._translate(exc, table=table) from None


def start_test_server(**kwargs):
    """A FlightSqlServer on a free loopback port over a fresh DuckDBTestEngine.
    Returns (server, engine, uri); call ``server.shutdown()`` when done."""
    from flightsrv.server.app import start_in_thread

    engine = kwargs.pop("engine", None) or DuckDBTestEngine()
    server, port = start_in_thread(engine, "127.0.0.1", 0, **kwargs)
    scheme = "grpc+tls" if kwargs.get("tls") else "grpc"
    host = "localhost" if kwargs.get("tls") else "127.0.0.1"
    return server, engine, f"{scheme}://{host}:{port}"

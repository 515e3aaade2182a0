"""``DuckEngine``: the :class:`~flightsrv.engine.api.Engine` over a warehouse, run by DuckDB.

Per request: parse and classify (:mod:`flightsrv.sql`), check the role, bind parameters,
pin every referenced table snapshot once at statement start, then

- SELECT: on a fresh cursor of the locked connection, give each table reference a unique
  relation name. On a local warehouse that relation is a temporary view reading the pinned
  snapshot's clean data files with DuckDB's own ``read_parquet``, ``UNION ALL`` flightsrv's
  masked scan of the files with deletion vectors (:mod:`flightsrv.engine.native`); on S3 it
  is the masked, projected, pre-filtered ``snap.scan(...)`` registered as an Arrow reader.
  Then run the rewritten query and stream ``to_arrow_reader(batch_size)``; nothing is
  materialised whole.
- DELETE: ``table.delete(predicate, mode=...)`` with the WHERE clause as SQL text.
- INSERT / CTAS: evaluate the source in DuckDB over pinned snapshots and stream it into
  ``table.append``.
- CREATE TABLE / DROP TABLE / SET delete_mode.
- OPTIMIZE / VACUUM / PURGE (:mod:`flightsrv.engine.maintenance`): run as a query they
  answer with a report (``MAINTENANCE_SCHEMA``), as an update with 0. Writers only.
- ``flightsrv_table_stats('t')`` / ``flightsrv_history('t')`` in FROM: registered as Arrow
  tables computed at statement start.

INSERT and ingest appends go through a :class:`~flightsrv.engine.group_commit.GroupCommitter`
so concurrent appends to one table share commits. Results are coalesced into batches of at
least ``min_batch_rows`` rows (a selective filter otherwise yields many tiny batches).

Errors: DuckDB errors become ``SqlError`` naming the statement; table errors
(``TableNotFound``, ``VersionNotFound``, ``SchemaMismatch``, ...) pass through unchanged,
including those raised inside a scan while DuckDB pulls from it (e.g. ``CorruptObject``
naming a damaged deletion vector), which DuckDB would otherwise report as its own error.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa
from sqlglot import exp

from flightsrv.engine import maintenance as mx
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
from flightsrv.engine.connection import CursorSource, open_locked
from flightsrv.engine.group_commit import GroupCommitter
from flightsrv.engine.native import is_native, native_failure, native_root, plan_native
from flightsrv.errors import (
    ConfigurationError,
    FlightsrvError,
    PermissionDenied,
    PredicateError,
    SchemaMismatch,
    SqlError,
    TableExists,
    TableNotFound,
)
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st

DEFAULT_BATCH_SIZE = 122_880  # DuckDB's row-group size; a multiple of its 2048-row vectors
DEFAULT_MIN_BATCH_ROWS = 65_536  # coalesce smaller result batches up to this many rows
MAX_COALESCE_BYTES = 8 << 20  # ... or this many bytes, whichever comes first
PREPARED_CACHE = 1024  # result schemas of prepared queries kept, by text and table schemas
COUNT_SCHEMA = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])


#: Parsed statements by text. Parsing is pure, and every path copies a statement's tree
#: before changing it (bind_params, plan_query, delete_predicate), so entries are shared.
_parse = functools.lru_cache(maxsize=4096)(st.parse_statement)


def _sql_error(e: Exception, sql: str) -> SqlError:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return SqlError(msg, statement=st._short(sql))


class DuckEngine:
    """Implements :class:`flightsrv.engine.api.Engine` for one warehouse."""

    def __init__(self, warehouse, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 min_batch_rows: int = DEFAULT_MIN_BATCH_ROWS,
                 threads: int | None = None, memory_limit: str | None = None,
                 temp_directory: str | None = None,
                 group_commit: bool = True, native_scans: bool = True):
        self.warehouse = warehouse
        self.batch_size = batch_size
        self.min_batch_rows = min(min_batch_rows, batch_size)
        self.committer = GroupCommitter() if group_commit else None
        #: the local warehouse directory DuckDB reads natively, or None (S3, or disabled)
        self.native_root = native_root(warehouse) if native_scans else None
        self._cursors = CursorSource(open_locked(threads=threads, memory_limit=memory_limit,
                                                 allowed_directory=self.native_root,
                                                 temp_directory=temp_directory))
        #: (sql, signature of the referenced tables' schemas) -> result schema; a query's
        #: result types depend only on its text and those schemas
        self._schemas: OrderedDict = OrderedDict()
        self._schemas_lock = threading.Lock()

    def close(self) -> None:
        self._cursors.close()

    # -- Engine: metadata ----------------------------------------------------------------

    def list_tables(self, broken: list | None = None) -> list[str]:
        return list(self.warehouse.list_tables(broken))

    def table_schema(self, table: str) -> pa.Schema:
        return self.warehouse.table(table).snapshot().schema

    # -- Engine: prepare -------------------------------------------------------------------

    def prepare(self, sql: str, session: Session) -> Prepared:
        stmt = _parse(sql)
        param_schema = _parameter_schema(stmt, self.warehouse)
        if isinstance(stmt, st.Maintenance):
            return Prepared(sql, StatementKind.QUERY, mx.MAINTENANCE_SCHEMA, param_schema,
                            effects=True, statement_kind="maintenance")
        if not isinstance(stmt, st.Query):
            return Prepared(sql, StatementKind.UPDATE, pa.schema([]), param_schema,
                            effects=True, statement_kind=_kind_name(stmt))
        # Bind every parameter as NULL and run the query with LIMIT 0 over the pinned
        # relations: types come from DuckDB, no data is read. Cached by the text and the
        # referenced tables' schemas (ADBC prepares every statement it executes).
        pinner = self._pinner()
        key = _schema_key(stmt, pinner)
        if key is not None:
            with self._schemas_lock:
                schema = self._schemas.get(key)
                if schema is not None:
                    self._schemas.move_to_end(key)
            if schema is not None:
                return Prepared(sql, StatementKind.QUERY, schema, param_schema)
        nulls = [pa.scalar(None)] * stmt.param_count
        tree = sqlplan.bind_params(stmt.tree, nulls, sql, stmt.param_count)
        qp = self._plan(stmt, tree, "query", pinner)
        params = [None] * stmt.param_count if qp.needs_params and stmt.param_count else None
        cur = self._cursors.cursor()
        try:
            natives: dict = {}
            for fn in qp.functions:
                cur.register(fn.relation, self._function_relation(fn))
            try:
                for scan in qp.scans:
                    self._register_scan(cur, scan, [], natives, data=False)
                rel = cur.sql(qp.sql, params=params)
                schema = rel.limit(0).to_arrow_table().schema
            except duckdb.Error as e:
                raise native_failure(e, natives) or _sql_error(e, sql) from None
        finally:
            cur.close()
        if key is not None:
            with self._schemas_lock:
                self._schemas[key] = schema
                while len(self._schemas) > PREPARED_CACHE:
                    self._schemas.popitem(last=False)
        return Prepared(sql, StatementKind.QUERY, schema, param_schema)

    # -- Engine: queries ---------------------------------------------------------------------

    def execute_query(self, sql: str, session: Session,
                      params: pa.RecordBatch | None = None, *,
                      cancel: Cancel | None = None) -> QueryResult:
        stmt = _parse(sql)
        if isinstance(stmt, st.Maintenance):
            self._check_role(stmt, session)
            table = mx.run_maintenance(self._table(stmt.table), stmt)
            return QueryResult(table.schema, table.to_reader())
        if not isinstance(stmt, st.Query):
            # A client that prepares everything (ADBC) may send DML down the query path:
            # run it and answer with its row count.
            n = self.execute_update(sql, session, params)
            batch = pa.record_batch([pa.array([n], pa.int64())], schema=COUNT_SCHEMA)
            return QueryResult(COUNT_SCHEMA, pa.RecordBatchReader.from_batches(COUNT_SCHEMA, [batch]))
        rows = self._param_rows(stmt, params)
        if len(rows) > 1:
            raise SqlError("a query binds exactly one row of parameters",
                           statement=st._short(sql), rows=len(rows))
        tree = sqlplan.bind_params(stmt.tree, rows[0], sql, stmt.param_count)
        reader = self._run_query(stmt, tree, "query", self._pinner(), rows[0], cancel)
        return QueryResult(reader.schema, reader)

    def _plan(self, stmt: st.Statement, bound: exp.Expression, part: str,
              pinner: sqlplan.Pinner) -> sqlplan.QueryPlan:
        """Plan the query part of ``stmt`` (``part``: query | ctas | insert)."""
        query = bound if part == "query" else bound.expression
        original = stmt.tree if part == "query" else stmt.tree.expression
        source = sqlplan.query_source(stmt.text, stmt.tree, part) if stmt.spliceable else None
        if source is not None and stmt.param_count:
            # native parameters only when the spliced text uses exactly $1..$n
            used = {str(p.this) for p in original.find_all(exp.Placeholder)
                    if p.find_ancestor(exp.HistoricalData) is None}
            if used != {str(i) for i in range(1, stmt.param_count + 1)}:
                source = None
        return sqlplan.plan_query(query, pinner, stmt.sql, source)

    def _run_query(self, stmt: st.Statement, bound: exp.Expression, part: str,
                   pinner: sqlplan.Pinner, values: list[pa.Scalar],
                   cancel: Cancel | None = None) -> pa.RecordBatchReader:
        """Plan, register and start a query; the returned reader owns the cursor.
        ``cancel`` interrupts DuckDB (``interrupt()``) while the query runs or streams."""
        sql = stmt.sql
        qp = self._plan(stmt, bound, part, pinner)
        params = [v.as_py() for v in values] if qp.needs_params and values else None
        cur = self._cursors.cursor()
        unhook = cancel.on_cancel(cur.interrupt) if cancel is not None else (lambda: None)
        failures: list[BaseException] = []  # raised inside scans while DuckDB pulls
        natives: dict = {}  # local path -> (table, key) of files DuckDB reads itself
        try:
            for fn in qp.functions:
                cur.register(fn.relation, self._function_relation(fn))
            try:
                for scan in qp.scans:
                    self._register_scan(cur, scan, failures, natives)
                inner = cur.sql(qp.sql, params=params).to_arrow_reader(self.batch_size)
            except duckdb.Error as e:
                if cancel is not None:
                    cancel.check(statement=st._short(sql))
                raise (_scan_failure(failures) or native_failure(e, natives)
                       or _sql_error(e, sql)) from None
        except BaseException:
            unhook()
            cur.close()
            raise
        batches = _stream(inner, cur, sql, failures, natives, cancel, unhook)
        if self.min_batch_rows > 1:
            batches = _coalesce(batches, self.min_batch_rows, MAX_COALESCE_BYTES)
        return pa.RecordBatchReader.from_batches(inner.schema, batches)

    def _function_relation(self, fn: sqlplan.FunctionScan) -> pa.Table:
        try:
            return mx.metadata_relation(self.warehouse, fn.function, fn.table)
        except ConfigurationError as e:
            if isinstance(e, TableNotFound):
                raise
            raise TableNotFound("no such table", table=fn.table, reason=e.message) from None

    def _table(self, name: str):
        try:
            return self.warehouse.table(name)
        except TableNotFound:
            raise
        except ConfigurationError as e:  # not even a valid name
            raise TableNotFound("no such table", table=name, reason=e.message) from None

    @staticmethod
    def _check_role(stmt: st.Statement, session: Session) -> None:
        if stmt.writes and session.role == Role.READER:
            raise PermissionDenied("read-only session may not run this statement",
                                   user=session.user, statement=st._short(stmt.sql))

    def _scan_columns(self, scan: sqlplan.Scan) -> list[str] | None:
        if scan.columns is None:
            return None
        if scan.columns:
            return scan.columns
        # Nothing referenced (count(*)): read one column so batches still carry row counts;
        # prefer a fixed-width one.
        schema = scan.snapshot.schema
        for f in schema:
            if pa.types.is_primitive(f.type):
                return [f.name]
        return [schema.names[0]] if schema.names else []

    def _register_scan(self, cur: duckdb.DuckDBPyConnection, scan: sqlplan.Scan,
                       failures: list, natives: dict, *, data: bool = True) -> None:
        """Make ``scan.relation`` readable on ``cur``: a native view on a local warehouse,
        else the Arrow scan. ``data=False``: only the types matter (prepare), so dirty files'
        scans are replaced by empty tables (clean files are only bound, never read)."""
        if self.native_root is not None and is_native(scan.snapshot):
            columns = self._scan_columns(scan)
            plan = plan_native(scan.snapshot, columns, scan.filter, scan.relation,
                               open_scans=data)
            natives.update(plan.files)
            for name, obj in plan.readers.items():
                if isinstance(obj, pa.RecordBatchReader):
                    obj = _guarded(obj, failures)
                cur.register(name, obj)
            cur.execute(f"CREATE TEMP VIEW {scan.relation} AS {plan.body}")
            return
        if not data:
            schema = scan.snapshot.schema
            if scan.columns is not None:
                schema = pa.schema([schema.field(c) for c in self._scan_columns(scan)])
            cur.register(scan.relation, schema.empty_table())
            return
        cur.register(scan.relation, _guarded(self._open_scan(scan), failures))

    def _open_scan(self, scan: sqlplan.Scan) -> pa.RecordBatchReader:
        snap = scan.snapshot
        columns = self._scan_columns(scan)
        flt: Any = scan.filter
        if flt is not None and hasattr(snap, "predicate"):
            try:  # parse up front: the scan parses lazily, and a bad hint must not fail a query
                flt = snap.predicate(flt)
            except (PredicateError, ConfigurationError):
                flt = None
        try:
            return snap.scan(columns=columns, filter=flt)
        except (PredicateError, ConfigurationError):
            if flt is None:
                raise
            return snap.scan(columns=columns, filter=None)

    # -- Engine: updates -------------------------------------------------------------------------

    def execute_update(self, sql: str, session: Session,
                       params: pa.RecordBatch | None = None, *,
                       cancel: Cancel | None = None, info: ExecInfo | None = None) -> int:
        stmt = _parse(sql)
        self._check_role(stmt, session)
        if isinstance(stmt, st.Query):
            raise SqlError("a query returns rows; run it as a query, not an update",
                           statement=st._short(sql))
        total = 0
        for values in self._param_rows(stmt, params):
            tree = sqlplan.bind_params(stmt.tree, values, sql, stmt.param_count)
            total += self._run_update(stmt, tree, session, values, cancel)
        return total

    def _run_update(self, stmt: st.Statement, tree: exp.Expression, session: Session,
                    values: list[pa.Scalar], cancel: Cancel | None = None) -> int:
        sql = stmt.sql
        if isinstance(stmt, st.SetSession):
            session.settings[stmt.name] = stmt.value
            return 0
        if isinstance(stmt, st.Delete):
            table = self._table(stmt.table)
            cond = tree.args["where"].this if tree.args.get("where") is not None else None
            pred = sqlplan.delete_predicate(cond, stmt.table, stmt.alias, sql)
            # the session setting wins; else Table.delete uses the table property
            # delete_mode (default "dv")
            return int(table.delete(pred, mode=session.settings.get("delete_mode")))
        if isinstance(stmt, st.Insert):
            return self._insert(stmt, tree, values, cancel)
        if isinstance(stmt, st.CreateTable):
            return self._create(stmt)
        if isinstance(stmt, st.CreateTableAs):
            return self._ctas(stmt, tree, values, cancel)
        if isinstance(stmt, st.DropTable):
            try:
                self.warehouse.drop_table(stmt.table)
            except TableNotFound:
                if not stmt.if_exists:
                    raise
            return 0
        if isinstance(stmt, st.Maintenance):
            mx.run_maintenance(self._table(stmt.table), stmt)
            return 0
        raise SqlError("statement kind not handled", statement=st._short(sql),
                       kind=type(stmt).__name__)

    def _insert(self, stmt: st.Insert, tree: exp.Expression, values: list[pa.Scalar],
                cancel: Cancel | None = None) -> int:
        table = self._table(stmt.table)
        pinner = self._pinner()
        target = pinner.pin(stmt.table).schema
        columns = list(stmt.columns) if stmt.columns is not None else list(target.names)
        by_lower = {n.lower(): n for n in target.names}
        resolved = []
        for c in columns:
            if c.lower() not in by_lower:
                raise SqlError("INSERT names a column the table does not have",
                               statement=st._short(stmt.sql), table=stmt.table, column=c)
            resolved.append(by_lower[c.lower()])
        if len({c.lower() for c in resolved}) != len(resolved):
            raise SqlError("INSERT names a column twice", statement=st._short(stmt.sql))
        reader = self._run_query(stmt, tree, "insert", pinner, values, cancel)
        if len(reader.schema) != len(resolved):
            reader.close()
            raise SqlError("INSERT has a different number of values than columns",
                           statement=st._short(stmt.sql), table=stmt.table,
                           columns=len(resolved), values=len(reader.schema))
        counter = _Counter()
        shaped = _shape_for_insert(reader, resolved, target, counter)
        self._append(table, shaped)
        return counter.rows

    def _append(self, table, data) -> None:
        if self.committer is None:
            table.append(data)
        else:
            self.committer.append(table, data)

    def _create(self, stmt: st.CreateTable) -> int:
        if stmt.replace:
            self.warehouse.drop_table(stmt.table, missing_ok=True)
        try:
            self.warehouse.create_table(stmt.table, stmt.schema)
        except TableExists:
            if not stmt.if_not_exists:
                raise
        return 0

    def _ctas(self, stmt: st.CreateTableAs, tree: exp.Expression,
              values: list[pa.Scalar], cancel: Cancel | None = None) -> int:
        if stmt.if_not_exists and stmt.table in self.warehouse.list_tables():
            return 0
        reader = self._run_query(stmt, tree, "ctas", self._pinner(), values, cancel)
        schema = pa.schema([f.with_nullable(True) for f in reader.schema])
        if stmt.replace:
            self.warehouse.drop_table(stmt.table, missing_ok=True)
        try:
            table = self.warehouse.create_table(stmt.table, schema)
        except BaseException:
            reader.close()
            raise
        counter = _Counter()
        try:
            self._append(table, pa.RecordBatchReader.from_batches(
                schema, counter.count(reader, schema)))
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: no half-made table
                self.warehouse.drop_table(stmt.table)
            raise
        return counter.rows

    # -- Engine: ingest ---------------------------------------------------------------------------

    def ingest(self, table: str, mode: IngestMode, data: pa.RecordBatchReader,
               session: Session, *, cancel: Cancel | None = None) -> int:
        if session.role == Role.READER:
            raise PermissionDenied("read-only session may not ingest", user=session.user,
                                   table=table)
        wh = self.warehouse
        if mode == IngestMode.REPLACE:
            try:
                wh.drop_table(table)
            except TableNotFound:
                pass
        if mode in (IngestMode.CREATE, IngestMode.REPLACE):
            t = wh.create_table(table, data.schema)
        elif mode == IngestMode.APPEND:
            t = wh.table(table)
        else:
            try:
                t = wh.table(table)
            except TableNotFound:
                try:
                    t = wh.create_table(table, data.schema)
                except TableExists:
                    t = wh.table(table)
        counter = _Counter()
        self._append(t, pa.RecordBatchReader.from_batches(data.schema, counter.count(data)))
        return counter.rows

    # -- helpers -----------------------------------------------------------------------------------

    def _pinner(self) -> sqlplan.Pinner:
        tables: dict[str, Any] = {}

        def resolve(name: str, version: int | None, as_of: str | None):
            if name not in tables:
                try:
                    tables[name] = self.warehouse.table(name)
                except TableNotFound:
                    raise
                except ConfigurationError as e:  # not even a valid name (e.g. a file path)
                    raise TableNotFound("no such table", table=name, reason=e.message) from None
            if version is None and as_of is None:
                return tables[name].snapshot()
            return tables[name].snapshot(version=version, as_of=as_of)

        return sqlplan.Pinner(resolve)

    @staticmethod
    def _param_rows(stmt: st.Statement, params: pa.RecordBatch | None) -> list[list[pa.Scalar]]:
        if params is not None and isinstance(params, pa.Table):
            params = params.combine_chunks().to_batches()[0] if params.num_rows else None
        if stmt.param_count == 0:
            return [[]]
        if params is None or params.num_rows == 0:
            raise SqlError("statement has parameters but none were bound",
                           statement=st._short(stmt.sql), expected=stmt.param_count)
        if params.num_columns < stmt.param_count:
            raise SqlError("too few parameters", statement=st._short(stmt.sql),
                           expected=stmt.param_count, got=params.num_columns)
        return [sqlplan.params_from_batch(params, r) for r in range(params.num_rows)]


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def _parameter_schema(stmt: st.Statement, warehouse) -> pa.Schema:
    """The parameters' Arrow types where a statement fixes them, else null: a parameter
    compared with (``=``, ``<``, ``IN``, ``BETWEEN``) a column of a referenced table takes
    that column's type; ``INSERT INTO t [(cols)] VALUES (?, ...)`` takes the target
    columns' types. DuckDB 2.0 reports every parameter of a prepared statement as UNKNOWN,
    and clients that build typed parameter vectors (the Flight SQL JDBC driver) cannot
    bind a value to a null-typed field. The type is only how the client encodes the value;
    DuckDB still binds and casts it."""
    types: list[pa.DataType] = [pa.null()] * stmt.param_count
    if not stmt.param_count:
        return pa.schema([])
    try:
        columns: dict[str, pa.DataType | None] = {}
        for ref in sqlplan.table_references(stmt.tree):
            try:
                schema = warehouse.table(ref.name).snapshot().schema
            except Exception:  # noqa: BLE001 - unknown table: prepare reports it
                continue
            for f in schema:
                key = f.name.lower()
                columns[key] = f.type if columns.get(key, f.type) == f.type else None
        target = None
        if isinstance(stmt, st.Insert) and isinstance(stmt.tree.expression, exp.Values):
            schema = warehouse.table(stmt.table).snapshot().schema
            names = list(stmt.columns) if stmt.columns is not None else schema.names
            by_lower = {f.name.lower(): f.type for f in schema}
            target = [by_lower.get(n.lower()) for n in names]
        for p in stmt.tree.find_all(exp.Placeholder):
            try:
                k = int(str(p.this)) - 1
            except ValueError:
                continue
            if not 0 <= k < len(types):
                continue
            parent, other = p.parent, None
            if isinstance(parent, _COMPARISONS):
                other = parent.left if parent.right is p else parent.right
            elif isinstance(parent, (exp.In, exp.Between)) and parent.this is not p:
                other = parent.this
            elif target is not None and isinstance(parent, exp.Tuple) \
                    and isinstance(parent.parent, exp.Values):
                pos = parent.expressions.index(p)
                if pos < len(target) and target[pos] is not None:
                    types[k] = target[pos]
                continue
            if isinstance(other, exp.Column):
                t = columns.get(other.name.lower())
                if t is not None:
                    types[k] = t
    except Exception:  # noqa: BLE001 - a hint only: never fail a prepare over it
        pass
    # the JDBC driver (18.x) writes milliseconds into timestamp/time parameter vectors
    # whatever their unit, so announce those in ms (ADBC sends its own types anyway)
    types = [pa.timestamp("ms", t.tz) if pa.types.is_timestamp(t)
             else pa.time32("ms") if pa.types.is_time(t) else t for t in types]
    return pa.schema([pa.field(str(i), t) for i, t in enumerate(types)])


def _kind_name(stmt: st.Statement) -> str:
    return {st.Delete: "delete", st.Insert: "insert", st.CreateTable: "create",
            st.CreateTableAs: "create", st.DropTable: "drop", st.SetSession: "set",
            st.Maintenance: "maintenance"}.get(type(stmt), "select")


def _schema_key(stmt: st.Statement, pinner: sqlplan.Pinner) -> tuple | None:
    """(text, (table, uuid, schema JSON) per reference) for a query whose result schema
    depends on nothing else; pins the references on ``pinner`` (the plan reuses the pins).
    None when unsure (metadata functions, parameters in AT, any error: the caller then
    takes the uncached path, which reports errors properly)."""
    try:
        tree = stmt.tree
        if any(True for _ in tree.find_all(exp.HistoricalData)
               for p in _.find_all(exp.Placeholder)):
            return None
        parts = []
        for ref in sqlplan.table_references(tree):
            version, as_of = sqlplan._time_travel(ref, stmt.sql)
            snap = pinner.pin(ref.name, version, as_of)
            m = snap.manifest
            parts.append((ref.name, m.table_uuid, json.dumps(m.schema, sort_keys=True)))
        if any(True for _ in sqlplan._metadata_calls(tree)):
            return None
        return stmt.sql, tuple(parts)
    except Exception:  # noqa: BLE001 - see docstring
        return None


# -- streaming helpers ---------------------------------------------------------------------------


def _guarded(reader: pa.RecordBatchReader, failures: list) -> pa.RecordBatchReader:
    """``reader``, recording any exception it raises into ``failures`` before DuckDB turns
    it into a generic error of its own."""

    def gen():
        try:
            yield from reader
        except BaseException as exc:
            failures.append(exc)
            raise

    return pa.RecordBatchReader.from_batches(reader.schema, gen())


def _scan_failure(failures: list) -> BaseException | None:
    """The first flightsrv error a scan raised (it explains a DuckDB failure better)."""
    for exc in failures:
        if isinstance(exc, FlightsrvError):
            return exc
    return None


def _stream(inner: pa.RecordBatchReader, cur: duckdb.DuckDBPyConnection,
            sql: str, failures: list, natives: dict, cancel: Cancel | None = None,
            unhook=lambda: None) -> Iterator[pa.RecordBatch]:
    """Batches of ``inner``; keeps ``cur`` (and its registered scans) alive until done."""
    try:
        while True:
            if cancel is not None:
                cancel.check(statement=st._short(sql))
            try:
                batch = inner.read_next_batch()
            except StopIteration:
                return
            except (duckdb.Error, pa.ArrowException, OSError) as e:
                if cancel is not None:
                    cancel.check(statement=st._short(sql))
                cause = _scan_failure(failures) or native_failure(e, natives)
                if cause is not None:
                    raise cause from None
                if isinstance(e, duckdb.Error):
                    raise _sql_error(e, sql) from None
                raise
            yield batch
    finally:
        unhook()
        try:
            inner.close()
        finally:
            cur.close()


def _coalesce(batches: Iterator[pa.RecordBatch], min_rows: int,
              max_bytes: int) -> Iterator[pa.RecordBatch]:
    """Merge consecutive small batches until one holds ``min_rows`` rows or ``max_bytes``
    bytes; batches already that large pass through untouched (no copy)."""
    pending: list[pa.RecordBatch] = []
    rows = nbytes = 0
    for b in batches:
        if not pending and (b.num_rows >= min_rows or b.nbytes >= max_bytes):
            yield b
            continue
        if b.num_rows:
            pending.append(b)
            rows += b.num_rows
            nbytes += b.nbytes
        if rows >= min_rows or nbytes >= max_bytes:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, rows, nbytes = [], 0, 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


class _Counter:
    def __init__(self) -> None:
        self.rows = 0

    def count(self, reader: pa.RecordBatchReader,
              schema: pa.Schema | None = None) -> Iterator[pa.RecordBatch]:
        for b in reader:
            self.rows += b.num_rows
            if schema is not None and b.schema != schema:
                b = pa.RecordBatch.from_arrays(b.columns, schema=schema)
            yield b


def _shape_for_insert(reader: pa.RecordBatchReader, columns: list[str], target: pa.Schema,
                      counter: _Counter) -> pa.RecordBatchReader:
    """Name the source columns after the target columns (by position) and add NULL columns
    for target columns the INSERT does not list; the table casts types."""
    src_types = {c: t for c, t in zip(columns, reader.schema.types)}
    out_fields = []
    for f in target:
        if f.name in src_types:
            t = src_types[f.name]
            out_fields.append(pa.field(f.name, f.type if pa.types.is_null(t) else t))
        else:
            if not f.nullable:
                raise SchemaMismatch("INSERT leaves a NOT NULL column without values",
                                     column=f.name)
            out_fields.append(pa.field(f.name, f.type))
    out_schema = pa.schema(out_fields)
    pos = {c: i for i, c in enumerate(columns)}

    def gen():
        for b in reader:
            arrays = []
            for f in out_schema:
                if f.name in pos:
                    col = b.column(pos[f.name])
                    if pa.types.is_null(col.type):
                        col = pa.nulls(b.num_rows, f.type)
                    arrays.append(col)
                else:
                    arrays.append(pa.nulls(b.num_rows, f.type))
            counter.rows += b.num_rows
            yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)

    return pa.RecordBatchReader.from_batches(out_schema, gen())


__all__ = ["DuckEngine"]

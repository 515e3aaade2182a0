"""``DuckEngine``: the :class:`~flightsrv.engine.api.Engine` over a warehouse, run by DuckDB.

One rule: **DuckDB decides** what a statement means (which rows a WHERE matches, NULL
logic, casts, time zones); flightsrv pins versions, hands DuckDB the pinned rows, and
records the decisions as commits. Per request:

1. parse and classify (:mod:`flightsrv.sql.statements`), check the role, bind parameters;
2. resolve every relation with SQL scoping (:mod:`flightsrv.sql.binder`) and pin every
   referenced table once at statement start (:class:`~flightsrv.sql.plan.Pinner`);
3. check the exact text DuckDB will run against DuckDB's own parse of it
   (:mod:`flightsrv.engine.guard`): it may read only relations registered here, visible CTEs
   and allowed table functions, and call only allowed functions;
4. register each table reference as a per-cursor view over its pinned snapshot
   (:mod:`flightsrv.engine.relations`: DuckDB's Parquet reader for clean local files, the
   masked Arrow scan otherwise; statistics pruning through :mod:`flightsrv.engine.prune`);
5. run:

   - SELECT: the user's own text with only the table references replaced, streamed with
     ``to_arrow_reader(batch_size)``; nothing is materialised whole;
   - DELETE / UPDATE / MERGE: :mod:`flightsrv.engine.dml` (DuckDB finds the rows through
     hidden file/position columns; the commit records them);
   - INSERT / CTAS: the source query as above, cast to the table's types by DuckDB, streamed
     into ``table.append`` through a :class:`~flightsrv.engine.group_commit.GroupCommitter`;
   - CREATE TABLE / DROP TABLE / SET (session settings);
   - OPTIMIZE / VACUUM / PURGE (:mod:`flightsrv.engine.maintenance`), writers only;
   - ``flightsrv_table_stats('t')`` / ``flightsrv_history('t')`` in FROM: Arrow tables.

The DuckDB database that reads the warehouse (:func:`~flightsrv.engine.connection.open_locked`)
is locked down (no external access but the warehouse directory, no Python replacement
scans, frozen configuration); the second phase of UPDATE/MERGE runs in a second database
that can open no file at all.

Errors: DuckDB errors become ``SqlError`` naming the statement; table errors
(``TableNotFound``, ``VersionNotFound``, ``CorruptObject`` raised inside a scan while DuckDB
pulls from it, ...) pass through unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from cachetools import LRUCache
from sqlglot import exp

from flightsrv.engine import guard
from flightsrv.engine import maintenance as mx
from flightsrv.engine import relations as rels
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
from flightsrv.engine.dml import Dml
from flightsrv.engine.group_commit import GroupCommitter
from flightsrv.engine.prune import Pruner
from flightsrv.engine.relations import native_failure, native_root
from flightsrv.errors import (
    ConfigurationError,
    FlightsrvError,
    PermissionDenied,
    SqlError,
    TableExists,
    TableNotFound,
)
from flightsrv.sql import binder
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st
from flightsrv.table.schema import write_defaults

DEFAULT_BATCH_SIZE = 122_880  # DuckDB's row-group size; a multiple of its 2048-row vectors
DEFAULT_MIN_BATCH_ROWS = 65_536  # coalesce smaller result batches up to this many rows
MAX_COALESCE_BYTES = 8 << 20  # ... or this many bytes, whichever comes first
PREPARED_CACHE = 1024  # result schemas of prepared queries kept, by text and table schemas
COUNT_SCHEMA = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])


#: Parsed statements by text. Parsing is pure, and every path copies a statement's tree
#: before changing it (bind_params, plan_query), so entries are shared.
_parse = functools.lru_cache(maxsize=4096)(st.parse_statement)


def _sql_error(e: Exception, sql: str) -> SqlError:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return SqlError(msg, statement=st._short(sql))


@dataclass
class _Ctx:
    """One statement's execution: who runs it, how to stop it, what it did."""

    session: Session
    cancel: Cancel | None = None
    info: ExecInfo = field(default_factory=ExecInfo)
    extra: dict[str, pa.Table] = field(default_factory=dict)  # relations bound by name
    failures: list = field(default_factory=list)  # raised inside scans while DuckDB pulls
    natives: dict = field(default_factory=dict)  # local path -> (table, key) DuckDB reads

    def check(self, sql: str) -> None:
        if self.cancel is not None:
            self.cancel.check(statement=st._short(sql))


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
        #: phase 2 of UPDATE/MERGE: a database that can open no file at all
        self._sandbox = CursorSource(open_locked(threads=threads, memory_limit=memory_limit,
                                                 temp_directory=temp_directory))
        self._dml = Dml(self)
        #: (sql, signature of the referenced tables' schemas) -> result schema; a query's
        #: result types depend only on its text and those schemas
        self._schemas: LRUCache = LRUCache(maxsize=PREPARED_CACHE)
        self._schemas_lock = threading.Lock()

    def close(self) -> None:
        self._cursors.close()
        self._sandbox.close()

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
        # Bind every parameter as NULL and run the query with LIMIT 0 over empty stand-ins
        # of the pinned relations: types come from DuckDB, no data is read. Cached by the
        # text and the referenced tables' schemas (ADBC prepares every statement it runs).
        pinner = self._pinner()
        key = _schema_key(stmt, pinner)
        if key is not None:
            with self._schemas_lock:
                schema = self._schemas.get(key)
            if schema is not None:
                return Prepared(sql, StatementKind.QUERY, schema, param_schema,
                                statement_kind="select")
        nulls = [pa.scalar(None)] * stmt.param_count
        tree = sqlplan.bind_params(stmt.tree, nulls, sql, stmt.param_count)
        qp = self._plan(stmt, tree, "query", pinner)
        self._verify(qp, sql, {})
        params = [None] * stmt.param_count if qp.needs_params and stmt.param_count else None
        ctx = _Ctx(session)
        with self._statement_cursor(ctx) as cur:
            for fn in qp.functions:
                cur.register(fn.relation, self._function_relation(fn))
            try:
                for scan in qp.scans:
                    self._register(cur, ctx, scan, data=False)
                rel = cur.sql(qp.sql, params=params)
                schema = rel.limit(0).to_arrow_table().schema
            except duckdb.Error as e:
                raise native_failure(e, ctx.natives) or _sql_error(e, sql) from None
        if key is not None:
            with self._schemas_lock:
                self._schemas[key] = schema  # evicts the least recently used
        return Prepared(sql, StatementKind.QUERY, schema, param_schema, statement_kind="select")

    # -- Engine: queries ---------------------------------------------------------------------

    def execute_query(self, sql: str, session: Session,
                      params: pa.RecordBatch | None = None, *,
                      cancel: Cancel | None = None,
                      extra: dict[str, pa.Table] | None = None) -> QueryResult:
        """Run a statement that returns rows. ``extra``: relations bound by name for this
        statement only (the Python API's Arrow sources; the server never passes any)."""
        stmt = _parse(sql)
        if isinstance(stmt, st.Maintenance):
            self._check_role(stmt, session)
            table = mx.run_maintenance(self._maintenance_table(stmt), stmt)
            info = ExecInfo(kind="maintenance", rows=table.num_rows)
            return QueryResult(table.schema, table.to_reader(), info)
        if not isinstance(stmt, st.Query):
            # A client that prepares everything (ADBC) may send DML down the query path:
            # run it and answer with its row count.
            info = ExecInfo(kind=_kind_name(stmt))
            n = self.execute_update(sql, session, params, cancel=cancel, info=info,
                                    extra=extra)
            batch = pa.record_batch([pa.array([n], pa.int64())], schema=COUNT_SCHEMA)
            return QueryResult(COUNT_SCHEMA,
                               pa.RecordBatchReader.from_batches(COUNT_SCHEMA, [batch]), info)
        rows = self._param_rows(stmt, params)
        if len(rows) > 1:
            raise SqlError("a query binds exactly one row of parameters",
                           statement=st._short(sql), rows=len(rows))
        tree = sqlplan.bind_params(stmt.tree, rows[0], sql, stmt.param_count)
        ctx = _Ctx(session, cancel, ExecInfo(kind="select"), dict(extra or {}))
        reader = self._run_query(stmt, tree, "query", self._pinner(), rows[0], ctx)
        return QueryResult(reader.schema, reader, ctx.info)

    def _plan(self, stmt: st.Statement, bound: exp.Expression, part: str,
              pinner: sqlplan.Pinner, extra: frozenset[str] = frozenset()) -> sqlplan.QueryPlan:
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
        return sqlplan.plan_query(query, pinner, stmt.sql, source, extra=extra)

    @staticmethod
    def _verify(qp: sqlplan.QueryPlan, sql: str, extra: dict) -> None:
        relations = [s.relation for s in qp.scans] + [f.relation for f in qp.functions] \
            + list(extra)
        guard.verify(qp.sql, relations, sql=sql)

    def _run_query(self, stmt: st.Statement, bound: exp.Expression, part: str,
                   pinner: sqlplan.Pinner, values: list[pa.Scalar],
                   ctx: _Ctx) -> pa.RecordBatchReader:
        """Plan, verify, register and start a query; the returned reader owns the cursor.
        ``ctx.cancel`` interrupts DuckDB (``interrupt()``) while the query runs or streams."""
        sql = stmt.sql
        qp = self._plan(stmt, bound, part, pinner, frozenset(ctx.extra))
        self._verify(qp, sql, ctx.extra)
        params = [v.as_py() for v in values] if qp.needs_params and values else None
        cur = self._cursors.cursor()
        unhook = ctx.cancel.on_cancel(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            for name, obj in ctx.extra.items():
                cur.register(name, obj)
            for fn in qp.functions:
                cur.register(fn.relation, self._function_relation(fn))
            try:
                for scan in qp.scans:
                    self._register(cur, ctx, scan)
                inner = cur.sql(qp.sql, params=params).to_arrow_reader(self.batch_size)
            except duckdb.Error as e:
                ctx.check(sql)
                raise (_scan_failure(ctx.failures) or native_failure(e, ctx.natives)
                       or _sql_error(e, sql)) from None
        except BaseException:
            unhook()
            cur.close()
            raise
        batches = _stream(inner, cur, sql, ctx.failures, ctx.natives, ctx.cancel, unhook,
                          ctx.info)
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

    def _maintenance_table(self, stmt: st.Maintenance):
        """The table a maintenance verb runs on; VACUUM also cleans up after a DROP."""
        if stmt.verb == "vacuum":
            try:
                return self.warehouse.table(stmt.table, dropped_ok=True)
            except ConfigurationError as e:
                if isinstance(e, TableNotFound):
                    raise
                raise TableNotFound("no such table", table=stmt.table, reason=e.message) from None
        return self._table(stmt.table)

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
        # prefer a fixed-width one (cheapest to decode)
        schema = scan.snapshot.schema
        for f in schema:
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or \
                    pa.types.is_boolean(f.type) or pa.types.is_temporal(f.type):
                return [f.name]
        return [schema.names[0]]

    # -- registration and execution helpers (also used by engine.dml) ----------------------

    def _register(self, cur: duckdb.DuckDBPyConnection, ctx: _Ctx, scan: sqlplan.Scan, *,
                  hidden: bool = False, physical: bool = False, data: bool = True) -> tuple:
        """Make ``scan.relation`` readable on ``cur`` as a view over its pinned snapshot.
        ``hidden``: add the file/position columns; ``physical``: every stored row, deleted
        or not (a splice erases those too); ``data=False``: only the types matter
        (prepare), so Arrow scans are replaced by empty tables. Returns the file list the
        hidden file column indexes."""
        snap = scan.snapshot
        if physical:
            from flightsrv.table.scan import Snapshot

            snap = Snapshot(snap.table, snap.manifest, physical=True)
        pruner = Pruner(cur, scan.prune, snap.schema, snap.manifest) if scan.prune else None
        native = self.native_root is not None and rels.is_native(snap)
        rel = rels.build(snap, self._scan_columns(scan), scan.relation, pruner=pruner,
                         hidden=hidden, native=native, open_scans=data)
        ctx.natives.update(rel.files)
        for name, obj in rel.readers.items():
            if isinstance(obj, pa.RecordBatchReader):
                obj = _guarded(obj, ctx.failures)
            cur.register(name, obj)
        cur.execute(f"CREATE TEMP VIEW {scan.relation} AS {rel.body}")
        info = ctx.info
        info.tables.setdefault(scan.table, snap.version)
        info.files_scanned += rel.files_scanned
        info.files_pruned += rel.files_pruned
        info.rows_masked += rel.rows_masked
        if pruner is not None:
            info.row_groups_pruned += pruner.row_groups_pruned
            info.chunks_pruned += pruner.chunks_pruned
        return rel.file_list

    @contextlib.contextmanager
    def _statement_cursor(self, ctx: _Ctx):
        """A fresh cursor of the warehouse database, interrupted when ``ctx`` is cancelled."""
        cur = self._cursors.cursor()
        unhook = ctx.cancel.on_cancel(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            for name, obj in ctx.extra.items():
                cur.register(name, obj)
            yield cur
        finally:
            unhook()
            cur.close()

    def _fetch(self, cur, ctx: _Ctx, text: str, sql: str) -> pa.Table:
        """Run ``text`` (already verified) on ``cur`` and return the whole result."""
        try:
            return cur.sql(text).to_arrow_table()
        except duckdb.Error as e:
            ctx.check(sql)
            raise (_scan_failure(ctx.failures) or native_failure(e, ctx.natives)
                   or _sql_error(e, sql)) from None

    def _sandbox_run(self, ctx: _Ctx, text: str, rows: pa.Table, schema: pa.Schema,
                     others: dict[str, pa.Table], sql: str, returning: str = ""):
        """Phase 2 of UPDATE/MERGE: run the user's statement ``text`` against a plain DuckDB
        table ``__fsrv_candidates`` holding ``rows`` (typed and constrained like the
        table), with ``others`` registered by name, in the database that can open no file.
        Returns (rows affected, the table's final contents, RETURNING rows or None)."""
        from flightsrv.engine.dml import CANDIDATES

        cur = self._sandbox.cursor()
        unhook = ctx.cancel.on_cancel(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            cur.register("__fsrv_rows", rows)
            cur.execute(f"CREATE TEMP TABLE {CANDIDATES} AS SELECT * FROM __fsrv_rows LIMIT 0")
            for f in schema:
                if not f.nullable:
                    cur.execute(f"ALTER TABLE {CANDIDATES} ALTER COLUMN "
                                f"{rels._ident(f.name)} SET NOT NULL")
            cur.execute(f"INSERT INTO {CANDIDATES} SELECT * FROM __fsrv_rows")
            cur.unregister("__fsrv_rows")
            for name, table in {**ctx.extra, **others}.items():
                cur.register(name, table)
            try:
                if returning:
                    returned = cur.sql(text + returning).to_arrow_table()
                    count = returned.num_rows
                else:
                    returned = None
                    count = int(cur.execute(text).fetchone()[0])
                final = cur.sql(f"SELECT * FROM {CANDIDATES}").to_arrow_table()
            except duckdb.Error as e:
                ctx.check(sql)
                raise _sql_error(e, sql) from None
        finally:
            unhook()
            with contextlib.suppress(Exception):
                cur.execute(f"DROP TABLE IF EXISTS {CANDIDATES}")
            cur.close()
        actions = None
        if returned is not None:
            actions = returned.column(0).to_pylist()
            returned = returned.drop_columns([returned.column_names[0]])
            if set(actions) <= {"INSERT"}:
                final = returned
        return count, final, actions

    @staticmethod
    def _summary(stmt: st.Statement, fingerprint: str | None = None) -> dict:
        """What a DML commit records about its statement: its kind and its keyed fingerprint
        (equal requests match), never its text (the text may hold the very value being
        erased)."""
        out = {"statement": _kind_name(stmt)}
        if fingerprint:
            out["request_fingerprint"] = fingerprint
        return out

    def _fingerprint(self, stmt: st.Statement, tree: exp.Expression) -> str | None:
        """The keyed fingerprint (:mod:`flightsrv.table.fingerprint`) of what a DML
        statement decides on: a DELETE's or UPDATE's WHERE (canonical form), else the
        statement."""
        from flightsrv.table.fingerprint import (
            canonical_predicate_tree,
            fingerprint,
            fingerprint_canonical,
        )

        where = tree.args.get("where")
        if isinstance(stmt, (st.Delete, st.Update)) and where is not None \
                and not tree.args.get("using") and not tree.args.get("from_"):
            cond = where.this
            while isinstance(cond, exp.Paren):
                cond = cond.this
            return fingerprint_canonical(self.warehouse, canonical_predicate_tree(cond))
        return fingerprint(self.warehouse, tree.sql(st.DIALECT), kind="statement")

    # -- Engine: updates -------------------------------------------------------------------------

    def execute_update(self, sql: str, session: Session,
                       params: pa.RecordBatch | None = None, *,
                       cancel: Cancel | None = None, info: ExecInfo | None = None,
                       extra: dict[str, pa.Table] | None = None) -> int:
        stmt = _parse(sql)
        self._check_role(stmt, session)
        if isinstance(stmt, st.Query):
            raise SqlError("a query returns rows; run it as a query, not an update",
                           statement=st._short(sql))
        ctx = _Ctx(session, cancel, info if info is not None else ExecInfo(
            kind=_kind_name(stmt)), dict(extra or {}))
        ctx.info.kind = _kind_name(stmt)
        total = 0
        for values in self._param_rows(stmt, params):
            tree = sqlplan.bind_params(stmt.tree, values, sql, stmt.param_count)
            total += self._run_update(stmt, tree, values, ctx)
        ctx.info.rows = total
        return total

    def delete_statement(self, sql: str, session: Session, *, mode: str | None = None,
                         expire: bool = False, grace=None, progress=None,
                         certificate: bool | None = None, source: str = "python") -> int:
        """Run one DELETE (Python API): ``mode`` overrides the session and table setting;
        a splice's count carries its report (``.result``); ``expire`` expires the versions
        that still reach the erased bytes."""
        stmt = _parse(sql)
        if not isinstance(stmt, st.Delete):
            raise SqlError("not a DELETE statement", statement=st._short(sql))
        self._check_role(stmt, session)
        ctx = _Ctx(session, info=ExecInfo(kind="delete"))
        tree = sqlplan.bind_params(stmt.tree, [], sql, stmt.param_count)
        mode = mode or session.settings.get("delete_mode") or \
            self._table(stmt.table).head().properties.get("delete_mode", "dv")
        if mode not in ("dv", "splice"):
            raise SqlError("unknown delete mode (use 'dv' or 'splice')", mode=mode)
        return self._dml.delete(ctx, stmt, tree, [], mode, splice_options={
            "expire": expire, "grace": grace, "progress": progress,
            "certificate": certificate, "source": source})

    def _run_update(self, stmt: st.Statement, tree: exp.Expression,
                    values: list[pa.Scalar], ctx: _Ctx) -> int:
        sql = stmt.sql
        session = ctx.session
        if isinstance(stmt, st.SetSession):
            session.settings[stmt.name] = stmt.value
            return 0
        if isinstance(stmt, st.Delete):
            table = self._table(stmt.table)
            # the session setting wins; else the table property delete_mode (default dv)
            mode = session.settings.get("delete_mode") or \
                table.head().properties.get("delete_mode", "dv")
            return self._dml.delete(ctx, stmt, tree, values, mode)
        if isinstance(stmt, st.Update):
            return self._dml.update(ctx, stmt, tree, values)
        if isinstance(stmt, st.Merge):
            return self._dml.merge(ctx, stmt, tree, values)
        if isinstance(stmt, st.Insert):
            return self._insert(stmt, tree, values, ctx)
        if isinstance(stmt, st.CreateTable):
            return self._create(stmt)
        if isinstance(stmt, st.CreateTableAs):
            return self._ctas(stmt, tree, values, ctx)
        if isinstance(stmt, st.DropTable):
            try:
                self.warehouse.drop_table(stmt.table)
            except TableNotFound:
                if not stmt.if_exists:
                    raise
            return 0
        if isinstance(stmt, st.Maintenance):
            mx.run_maintenance(self._maintenance_table(stmt), stmt)
            return 0
        if isinstance(stmt, st.AlterTable):
            return self._alter(stmt)
        raise SqlError("statement kind not handled", statement=st._short(sql),
                       kind=type(stmt).__name__)

    def _insert(self, stmt: st.Insert, tree: exp.Expression, values: list[pa.Scalar],
                ctx: _Ctx) -> int:
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
        reader = self._run_query(stmt, tree, "insert", pinner, values, ctx)
        if len(reader.schema) != len(resolved):
            reader.close()
            raise SqlError("INSERT has a different number of values than columns",
                           statement=st._short(stmt.sql), table=stmt.table,
                           columns=len(resolved), values=len(reader.schema))
        counter = _Counter()
        defaults = write_defaults(pinner.pin(stmt.table).manifest.schema, target)
        shaped = self._cast_for_insert(reader, resolved, target, stmt, ctx, defaults)
        self._append(table, pa.RecordBatchReader.from_batches(
            shaped.schema, counter.count(shaped)))
        return counter.rows

    def _cast_for_insert(self, reader: pa.RecordBatchReader, columns: list[str],
                         target: pa.Schema, stmt: st.Statement, ctx: _Ctx,
                         defaults: dict | None = None) -> pa.RecordBatchReader:
        """The INSERT's rows in the table's column order and types, cast by DuckDB (as an
        INSERT into a DuckDB table would: ``'5'`` into an integer is 5, 2.5 rounds to 3, a
        string that does not parse is an error), with the column's write default (``ADD
        COLUMN ... DEFAULT v``; else NULL) for the columns the INSERT does not list and
        DuckDB's error for a NULL in a NOT NULL column. Streams through the database that
        can open no file."""
        from flightsrv.sql.types import duckdb_type

        # the source columns take the names of the target columns they go to (DuckDB's
        # errors then name them), in the statement's order
        src_schema = pa.schema([pa.field(n, t) for n, t in zip(columns, reader.schema.types)])
        source = pa.RecordBatchReader.from_batches(src_schema, (
            pa.RecordBatch.from_arrays(b.columns, schema=src_schema) for b in reader))
        pos = {c: i for i, c in enumerate(columns)}
        select, params = [], []
        for f in target:
            typ = duckdb_type(f.type)  # None: no DuckDB spelling, passed through
            if f.name in pos:
                expr = rels._ident(f.name)
            elif defaults and f.name in defaults:
                params.append(defaults[f.name])
                expr = f"${len(params)}"
            else:
                expr = "NULL"
            if typ is not None:
                expr = f"CAST({expr} AS {typ})"
            if not f.nullable:
                msg = f"NOT NULL constraint failed: {stmt.table}.{f.name}".replace("'", "''")
                expr = f"CASE WHEN {expr} IS NULL THEN error('{msg}') ELSE {expr} END"
            select.append(f"{expr} AS {rels._ident(f.name)}")
        cur = self._sandbox.cursor()
        unhook = ctx.cancel.on_cancel(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            cur.register("__fsrv_insert", source)
            inner = cur.sql(f"SELECT {', '.join(select)} FROM __fsrv_insert",
                            params=params or None).to_arrow_reader(self.batch_size)
        except duckdb.Error as e:
            unhook()
            cur.close()
            raise _sql_error(e, stmt.sql) from None
        except BaseException:
            unhook()
            cur.close()
            raise
        return pa.RecordBatchReader.from_batches(
            inner.schema, _stream(inner, cur, stmt.sql, ctx.failures, ctx.natives, ctx.cancel,
                                  unhook))

    def _append(self, table, data) -> None:
        if self.committer is None:
            table.append(data)
        else:
            self.committer.append(table, data)

    def _create(self, stmt: st.CreateTable) -> int:
        if stmt.replace:
            self.warehouse.drop_table(stmt.table, missing_ok=True)
        try:
            self.warehouse.create_table(stmt.table, stmt.schema,
                                        partition_by=list(stmt.partition_by))
        except TableExists:
            if not stmt.if_not_exists:
                raise
        return 0

    def _ctas(self, stmt: st.CreateTableAs, tree: exp.Expression,
              values: list[pa.Scalar], ctx: _Ctx) -> int:
        if stmt.if_not_exists and stmt.table in self.warehouse.list_tables():
            return 0
        reader = self._run_query(stmt, tree, "ctas", self._pinner(), values, ctx)
        schema = pa.schema([f.with_nullable(True) for f in reader.schema])
        if stmt.replace:
            self.warehouse.drop_table(stmt.table, missing_ok=True)
        try:
            table = self.warehouse.create_table(stmt.table, schema,
                                                partition_by=list(stmt.partition_by))
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

    def _alter(self, stmt: st.AlterTable) -> int:
        """One metadata-only change (flightsrv.table.evolution) in one commit; a DEFAULT is
        evaluated by DuckDB, cast to the column's type."""
        table = self._table(stmt.table)
        try:
            return self._alter_table(table, stmt)
        except TableNotFound:
            raise
        except ConfigurationError as e:  # name the statement too (SchemaMismatch, ...)
            if "statement" in e.context:
                raise
            raise type(e)(e.message, statement=st._short(stmt.sql), **e.context) from None

    def _alter_table(self, table, stmt: st.AlterTable) -> int:
        action = stmt.action
        if action == "add_column":
            if stmt.if_exists and stmt.column.lower() in \
                    {n.lower() for n in table.snapshot().schema.names}:
                return 0
            default = None
            if stmt.default is not None:
                default = self._constant(stmt.default, stmt.type, stmt, stmt.column)
            table.add_column(stmt.column, stmt.type, nullable=stmt.nullable, default=default)
        elif action == "rename_column":
            table.rename_column(stmt.column, stmt.new_name)
        elif action == "drop_column":
            if stmt.if_exists and stmt.column.lower() not in \
                    {n.lower() for n in table.snapshot().schema.names}:
                return 0
            table.drop_column(stmt.column)
        elif action == "alter_column_type":
            table.alter_column_type(stmt.column, stmt.type)
        elif action == "set_partitioning":
            table.set_partitioning(list(stmt.partition_by))
        elif action == "upgrade":
            table.upgrade()
        else:
            raise SqlError("ALTER TABLE action not handled", statement=st._short(stmt.sql),
                           table=stmt.table, action=action)
        return 0

    def _constant(self, text: str, t: pa.DataType, stmt: st.Statement, column: str):
        """The value of a constant SQL expression cast to ``t``, computed by DuckDB in the
        database that can open no file."""
        from flightsrv.sql.types import duckdb_type

        typ = duckdb_type(t)
        expr = text if typ is None else f"CAST({text} AS {typ})"
        cur = self._sandbox.cursor()
        try:
            got = cur.sql(f"SELECT {expr} AS v").to_arrow_table()
        except duckdb.Error as e:
            raise SqlError(f"bad DEFAULT for column {column}: "
                           f"{str(e).strip().splitlines()[0]}", statement=st._short(stmt.sql),
                           column=column) from None
        finally:
            cur.close()
        value = got.column(0)[0]
        if value.type != t:
            try:
                value = value.cast(t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise SqlError("DEFAULT does not fit the column's type",
                               statement=st._short(stmt.sql), column=column,
                               type=str(t)) from None
        return value.as_py()

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
        tree = stmt.tree.copy()
        skip: tuple = ()
        if not isinstance(stmt, st.Query):
            target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
            skip = (target,) if isinstance(target, exp.Table) else ()
        for ref in list(skip) + binder.bind(tree, stmt.sql, skip=skip).tables:
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
    return {st.Delete: "delete", st.Update: "update", st.Merge: "merge", st.Insert: "insert",
            st.CreateTable: "create", st.CreateTableAs: "create", st.DropTable: "drop",
            st.SetSession: "set", st.Maintenance: "maintenance",
            st.AlterTable: "alter"}.get(type(stmt), "select")


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
        bound = binder.bind(tree.copy(), stmt.sql)
        if bound.functions or bound.extras:
            return None
        parts = []
        for ref in bound.tables:
            version, as_of = sqlplan._time_travel(ref, stmt.sql)
            snap = pinner.pin(ref.name, version, as_of)
            m = snap.manifest
            parts.append((ref.name, m.table_uuid, json.dumps(m.schema, sort_keys=True)))
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
            unhook=lambda: None, info: ExecInfo | None = None) -> Iterator[pa.RecordBatch]:
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
            if info is not None:
                info.rows += batch.num_rows
                info.bytes += batch.nbytes
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


__all__ = ["DuckEngine"]


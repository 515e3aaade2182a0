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
   (:mod:`flightsrv.engine.relations`: DuckDB's Parquet reader for clean local files and,
   per ``masked_scans``, for local files with deleted rows (removed inside DuckDB, by
   default when the reference has a prunable filter); the masked Arrow scan otherwise;
   statistics pruning through :mod:`flightsrv.engine.prune`); a view over data files read
   by path alone is kept on its cursor between queries and not created again while its
   body text is the same (:class:`~flightsrv.engine.connection.ViewCursors`);
5. run:

   - SELECT: the user's own text with only the table references replaced, bound once with
     its values and streamed (``run_to_arrow``); nothing is materialised whole;
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
import dataclasses
import functools
import re

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

from flightsrv.engine import diagnose, guard
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
from flightsrv.engine import maskext
from flightsrv.engine.connection import (
    DEFAULT_TIME_ZONE,
    CursorSource,
    ViewCursors,
    open_locked,
    run_to_arrow,
)
from flightsrv.engine.context import StatementContext, table_pinner
from flightsrv.engine.binds import _binds_natively, _native_params
from flightsrv.engine.dml import Dml
from flightsrv.engine.group_commit import GroupCommitter
from flightsrv.engine.params import (
    announced, duckdb_parameter_types, kind_name, parameter_schema, references, schema_key,
    text_parameter_types,
)
from flightsrv.engine.plancache import StatementCache
from flightsrv.engine.stream import (
    coalesce,
    decoded,
    guarded,
    plain_schema,
    scan_failure,
    sql_error,
    stream_batches,
)
from flightsrv.engine.writes import Writes
from flightsrv.engine.prune import ConstantCache, Pruner
from flightsrv.engine.relations import native_failure, native_root
from flightsrv.errors import (
    ConfigurationError,
    CorruptObject,
    FlightsrvError,
    ObjectNotFound,
    PermissionDenied,
    SqlError,
    TableNotFound,
)
from flightsrv.sql import asof
from flightsrv.sql import binder
from flightsrv.sql import plan as sqlplan
from flightsrv.sql import statements as st
from flightsrv.sql import types as sqltypes
from flightsrv.sql import names
from flightsrv.sql.diag import caret_block
from flightsrv.table.types import cast_table
from flightsrv.sql.names import PublicNames
from flightsrv.runtime import one_statement, text_cache

DEFAULT_BATCH_SIZE = 122_880  # DuckDB's row-group size; a multiple of its 2048-row vectors
#: default read path of local files with deleted rows (see DuckEngine.masked_scans):
#: "prefetch" reads a selective file (statistics keep at most MASKED_MAX_GROUPS row groups)
#: by DuckDB ahead of the statement with engine SQL only, drops the deleted positions and
#: hands the statement the live rows as an Arrow table; every other such file is read by
#: DuckDB with its mask from the deletion-mask extension (below relations.BARRIER) or, when
#: the extension is off or unavailable, by the masked Arrow scan. No expression of a
#: statement ever sees a deleted row ("filtered"/"duckdb" rely on the same barrier: opt-in).
MASKED_SCANS = "prefetch"
#: "filtered": a file with deleted rows is read by DuckDB (anti join) only when statistics
#: keep at most this many of its row groups (and not all): a selective filter. Measured on
#: 10M rows, 1% deleted: a point query 0.63x the Arrow scan, a 20% range (17 of 84 groups
#: kept) 1.48x, because the anti join probes every row that passes the filter.
MASKED_MAX_GROUPS = 2
DEFAULT_MIN_BATCH_ROWS = 65_536  # coalesce smaller result batches up to this many rows
MAX_COALESCE_BYTES = 8 << 20  # ... or this many bytes, whichever comes first
#: bytes of prepared-query descriptions (result schema, parameter types) kept, by text and
#: the referenced tables' schemas, and of the tables each query text references
PREPARED_CACHE_BYTES = 16 << 20
REFERENCES_CACHE_BYTES = 4 << 20
#: bytes of query plans kept, by text, pinned versions and parameter types
PLAN_CACHE_BYTES = 16 << 20
COUNT_SCHEMA = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])


#: Parsed statements by text. Parsing is pure, and every path copies a statement's tree
#: before changing it (bind_params, plan_query), so entries are shared.
_parse = text_cache(maxsize=4096)(st.parse_statement)


#: one statement's execution state (the name engine.dml uses)
_Ctx = StatementContext


#: a statement text that may take a WITH clause in front of it (no comment, no WITH of its
#: own, not parenthesised)
_STARTS_SELECT = re.compile(r"\s*SELECT\b", re.IGNORECASE)


def _with_relations(inline: list[tuple[str, str]], text: str) -> str:
    """``text`` (a statement starting with SELECT) with the relations ``inline`` ((name,
    body) pairs) bound in a WITH clause in front of it: DuckDB binds each body where the
    statement references it, exactly as it binds a view (``NOT MATERIALIZED``: inlined, as a
    view is), and nothing is created in the catalog. The names are reserved
    (:data:`flightsrv.sql.binder.RESERVED`): no CTE of the statement can shadow one."""
    if not inline:
        return text
    ctes = ", ".join(f"{name} AS NOT MATERIALIZED ({body})" for name, body in inline)
    return f"WITH {ctes} {text}"


def _prefetch(cur: duckdb.DuckDBPyConnection, text: str, tables: dict[str, pa.Table]
              ) -> pa.Table:
    """Run engine SQL ``text`` on ``cur`` with ``tables`` registered for it."""
    for name, table in tables.items():
        cur.register(name, table)
    try:
        return run_to_arrow(cur, text, batch_size=DEFAULT_BATCH_SIZE, stream=False)
    finally:
        for name in tables:
            cur.unregister(name)


# UPDATE/MERGE's read by position and compaction's read of files with deletes through
# DuckDB with the mask extension (False: Snapshot.take and the Arrow reader, as without it)
MASKED_POSITION_READS = True
#: UPDATE/MERGE's read by position reads consecutive files of one written schema in one
#: DuckDB statement while their rows add up to at most this many (one-off masks of
#: rows / 8 bytes each, in one slot)
TAKE_GROUP_ROWS = 64_000_000
#: with the deletion-mask extension, a table reference whose WHERE lists the values it wants
#: (``id = ?``, a short ``IN``) reads its local files with deleted rows inside the statement
#: (``relations.build``'s ``"cmask"``, all of them in one ``read_parquet``, the conditions
#: pushed below the barrier) rather than by the prefetch. Measured on 10M rows, 1% deleted,
#: 4 files, a point query in process: 1.15-1.23x the table without deletes against the
#: prefetch's 1.41-1.49x (benchmarks/RESULTS.md, fourteenth session)
LISTED_IN_SCAN = True
#: ... while the reference's candidate files with deleted rows hold at most this many rows
#: (their mask in one slot: 4 MiB, rebuilt in ~2 ms when one of the files gains deletes);
#: a larger table's point read keeps the prefetch, one read_parquet that masks only the
#: rows it found
LISTED_IN_SCAN_ROWS = 32_000_000

class DuckEngine:
    """Implements :class:`flightsrv.engine.api.Engine` for one warehouse."""

    def __init__(self, warehouse, *, batch_size: int = DEFAULT_BATCH_SIZE,
                 min_batch_rows: int = DEFAULT_MIN_BATCH_ROWS,
                 threads: int | None = None, memory_limit: str | None = None,
                 temp_directory: str | None = None,
                 group_commit: bool = True, native_scans: bool = True,
                 masked_scans: str = MASKED_SCANS, mask_extension: bool | None = None,
                 time_zone: str | None = DEFAULT_TIME_ZONE):
        self.warehouse = warehouse
        self.batch_size = batch_size
        self.min_batch_rows = min(min_batch_rows, batch_size)
        self.committer = GroupCommitter() if group_commit else None
        #: the local warehouse directory DuckDB reads natively, or None (S3, or disabled)
        self.native_root = native_root(warehouse) if native_scans else None
        if masked_scans not in ("arrow", "prefetch", "duckdb", "filtered"):
            raise ValueError("masked_scans must be arrow, prefetch, duckdb or filtered: "
                             f"{masked_scans!r}")
        #: how local files with deleted rows are read (see ``relations.build``):
        #: "arrow" (flightsrv's masked Arrow scan); "prefetch" (a file whose statistics keep
        #: at most MASKED_MAX_GROUPS row groups, not all, under a prunable filter is read by
        #: DuckDB ahead of the statement and its live rows registered as Arrow; else the
        #: Arrow scan); "filtered" (the same files read by DuckDB inside the statement, the
        #: deleted positions anti-joined below a barrier); "duckdb" (the anti join
        #: always). Only local warehouses are read by DuckDB's reader; S3 files take the
        #: Arrow scan.
        self.masked_scans = masked_scans
        #: the deletion-mask extension's slots (files with deleted rows read by DuckDB with
        #: their mask, :mod:`flightsrv.engine.maskext`), or None: it is off (``mask_extension``
        #: False or FLIGHTSRV_MASK_EXTENSION=off), unavailable (logged once), or the
        #: warehouse is not local
        self.mask_slots = None
        con = None
        if self.native_root is not None and masked_scans != "arrow":
            con, self.mask_slots = maskext.connect(mask_extension)
        self._cursors = CursorSource(open_locked(threads=threads, memory_limit=memory_limit,
                                                 allowed_directory=self.native_root,
                                                 temp_directory=temp_directory, con=con,
                                                 time_zone=time_zone))
        #: cursors kept between queries with their views over pinned data files
        self._views = ViewCursors(self._cursors)
        self._constants = ConstantCache()  # pruning constants cast by this engine's DuckDB
        #: phase 2 of UPDATE/MERGE: a database that can open no file at all
        self._sandbox = CursorSource(open_locked(threads=threads, memory_limit=memory_limit,
                                                 temp_directory=temp_directory,
                                                 time_zone=time_zone))
        #: where an error of the user's statement is asked again, against its own text
        self._scratch = diagnose.Scratch()
        self._dml = Dml(self)
        self._writes = Writes(self)
        #: (sql, signature of the referenced tables' schemas) -> (result schema, parameter
        #: schema): a query's result and parameter types depend only on its text and those
        #: schemas (ADBC prepares every statement it runs, twice with parameters)
        self._prepared = StatementCache(PREPARED_CACHE_BYTES)
        #: (sql, pinned versions, parameter types) -> a query's plan (see _keep_plan)
        self._plans = StatementCache(PLAN_CACHE_BYTES)
        #: sql -> the (table, version, as_of) it references (params.references), or None
        self._references = StatementCache(REFERENCES_CACHE_BYTES)

    def close(self) -> None:
        self._writes.close()
        self._views.close()
        self._cursors.close()
        self._sandbox.close()
        self._scratch.close()

    # -- Engine: metadata ----------------------------------------------------------------

    def list_tables(self, broken: list | None = None) -> list[str]:
        return list(self.warehouse.list_tables(broken))

    def table_schema(self, table: str) -> pa.Schema:
        """The schema ``SELECT * FROM table`` streams (as DuckDB types it: a stored
        ``fixed_size_list`` reads as a list, a dictionary as its values), so what
        GetTables announces is what a query of the table returns."""
        stored = self.warehouse.handle(table).snapshot().schema  # or why it cannot be read
        try:
            described = self.prepare(f"SELECT * FROM {sqltypes.quote_ident(table)}",
                                     Session("metadata", role=Role.READER)).dataset_schema
        except (SqlError, ObjectNotFound, CorruptObject):
            # its metadata reads but a data file does not: the query says why, the listing
            # shows the table's stored shape
            return stored
        if described.names != stored.names:
            # the statement pinned a later version (a column added or dropped in between):
            # the stored shape of the version read first, rather than a mix of the two
            return stored
        # DuckDB's types; the table's own NOT NULL and field metadata
        return pa.schema([f.with_type(d.type) for f, d in zip(stored, described, strict=True)],
                         metadata=stored.metadata)

    # -- Engine: prepare -------------------------------------------------------------------

    def prepare(self, sql: str, session: Session,
                params: pa.RecordBatch | None = None, *,
                cancel: Cancel | None = None) -> Prepared:
        sql = asof.canonical(sql)  # VERSION AS OF n -> AT (VERSION => n)
        try:
            with one_statement():  # each pass over the text once, even when none is cached
                return self._prepare(sql, session, params, cancel=cancel)
        except ConfigurationError as e:  # bad input: named with the statement
            raise self._helped(e, sql) from None

    def _write_parameter_schema(self, stmt: st.Statement, sql: str, pinner) -> pa.Schema:
        """A write's parameter types: where the text fixes one (compared with a column, a
        VALUES position, SET c = ?), that column's type; the others as DuckDB types them
        in the same statement planned over empty tables of the same columns (the scratch
        database: ``SET v = v + ?``, ``INSERT ... SELECT ?``, a MERGE's ``USING (SELECT ?
        AS id)``); still untyped ones as VARCHAR."""
        types = text_parameter_types(stmt, lambda name: pinner.pin(name).schema)
        if None in types and isinstance(stmt, (st.Delete, st.Update, st.Merge, st.Insert,
                                               st.InsertValues)):
            try:
                # INSERT ... VALUES (the fast path binds no names) writes its target only
                got = ({stmt.table.lower(): pinner.pin(stmt.table).schema}, None, {}) \
                    if isinstance(stmt, st.InsertValues) else self._tables_of(stmt, sql)
            except FlightsrvError:
                got = None
            if got is not None and got[1] is None and not got[2]:
                more = self._scratch.parameter_types(stmt.text, got[0], stmt.param_count)
                if more is not None:
                    types = [t if t is not None else m for t, m in zip(types, more)]
        return announced(types)

    def _prepare(self, sql: str, session: Session, params: pa.RecordBatch | None,
                 *, cancel: Cancel | None, with_values: bool = False) -> Prepared:
        stmt = _parse(sql)
        # one pin per table for the whole prepare (parameter types and the result schema)
        pinner = self._pinner()
        if isinstance(stmt, st.Maintenance):
            return Prepared(sql, StatementKind.QUERY, mx.MAINTENANCE_SCHEMA,
                            parameter_schema(stmt, lambda name: pinner.pin(name).schema),
                            effects=True, statement_kind="maintenance")
        if not isinstance(stmt, st.Query):
            return Prepared(sql, StatementKind.UPDATE, pa.schema([]),
                            self._write_parameter_schema(stmt, sql, pinner),
                            effects=True, statement_kind=kind_name(stmt))
        # Bind every parameter as NULL and run the query with LIMIT 0 over empty stand-ins
        # of the pinned relations: types come from DuckDB, no data is read. Cached, with
        # the parameter types, by the text and the referenced tables' schemas (ADBC
        # prepares every statement it runs). With ``params`` (the first row, as
        # execute_query binds it) the schema is the one those values give (``SELECT ? AS
        # v``): a function of their types and of how each reaches DuckDB (bound whole, or as
        # a typed literal), which the key then holds too, so a statement executed again
        # with new values of the same types is not described again.
        bound = self._param_rows(stmt, params)[0] \
            if params is not None and stmt.param_count and (
                with_values or _params_type_results_of(sql)) else None
        key = schema_key(stmt, pinner, self._query_references(stmt))
        if key is not None and bound is not None:
            key = key + (tuple((str(v.type), _binds_natively(v)) for v in bound),)
        if key is not None:
            hit = self._prepared.get(key)
            if hit is not None:
                return Prepared(sql, StatementKind.QUERY, hit[0], hit[1],
                                statement_kind="select", versions=_head_versions(pinner))
        values = bound if bound is not None else [pa.scalar(None)] * stmt.param_count
        ctx = _Ctx(session, cancel)  # cancel interrupts the bind and DuckDB's (it may fold calls)
        tree = sqlplan.bind_params(stmt.tree, values, sql, stmt.param_count,
                                   check=lambda: ctx.check(sql))
        query, stmt = stmt, _literal_if_lossy(stmt, values)
        qp = self._plan(stmt, tree, "query", pinner, owned=stmt.param_count > 0)
        self._verify(qp, sql, {})
        # the parameter types are DuckDB's: the query with its $n parameters, planned over
        # the same relations (the text the plan keeps when it binds them natively)
        probe = None
        if query.param_count:
            probe = qp if qp.needs_params else self._plan(query, query.tree, "query", pinner)
            if [s.relation for s in probe.scans] != [s.relation for s in qp.scans] or \
                    [f.relation for f in probe.functions] != [f.relation for f in qp.functions]:
                probe = None
            else:
                self._verify(probe, sql, {})
        native = _native_params(values) if qp.needs_params and stmt.param_count else None
        ctx.check(sql)
        with self._statement_cursor(ctx, sql) as cur:
            for fn in qp.functions:
                cur.register(fn.relation, self._function_relation(fn))
            try:
                for scan in qp.scans:
                    self._register(cur, ctx, scan, data=False)
                param_schema = pa.schema([])
                if query.param_count:
                    # DuckDB's types; where it leaves one untyped, the text's hint (a
                    # column it is compared with, added to or named after), else VARCHAR
                    types = duckdb_parameter_types(
                        cur, probe.sql, query.param_count,
                        tuple(s.relation for s in qp.scans)
                        + tuple(f.relation for f in qp.functions)) \
                        if probe is not None else [None] * query.param_count
                    if None in types:
                        text = text_parameter_types(query,
                                                    lambda name: pinner.pin(name).schema)
                        types = [d if d is not None else t for d, t in zip(types, text)]
                    param_schema = announced(types)
                rel = cur.sql(qp.sql, params=native)
                # LIMIT 0 wraps the query in a subquery, which renames duplicate result
                # names (x, x -> x, x_1); the statement itself streams them as they are
                shape = rel.limit(0).to_arrow_table().schema
                names = PublicNames(qp.names)
                schema = plain_schema(pa.schema(
                    [f.with_name(names.column(n))
                     for f, n in zip(shape, rel.columns, strict=True)],
                    metadata=shape.metadata))
            except duckdb.Error as e:
                if not (bound is None and probe is not None
                        and isinstance(e, duckdb.BinderException)
                        and _prepares_untyped(cur, probe.sql)):
                    raise native_failure(e, ctx.natives) or \
                        sql_error(e, sql, PublicNames(qp.names)) from None
                # DuckDB cannot type the result with every parameter NULL (``? - INTERVAL
                # 1 DAY``: which ``-``?) but prepares it, deferring to the values: with
                # values at hand, describe with them; without, the schema is announced
                # when they are bound (GetFlightInfo describes again)
                if params is not None:
                    return self._prepare(sql, session, params, cancel=cancel,
                                         with_values=True)
                # not cached: a later call with values must describe with them
                return Prepared(sql, StatementKind.QUERY, pa.schema([]), param_schema,
                                statement_kind="select")
        if bound is not None:  # as execute_query names them (see _parameter_names)
            names = self._parameter_names(query, sql, session, bound, cancel)
            if names is not None and len(names) == len(schema):
                schema = pa.schema([f.with_name(n) for f, n in zip(schema, names)],
                                   metadata=schema.metadata)
        if key is not None:
            size = sum(len(p[2]) for p in key[1]) + schema.serialize().size \
                + param_schema.serialize().size
            self._prepared.put(key, (schema, param_schema), sql, size)
        return Prepared(sql, StatementKind.QUERY, schema, param_schema, statement_kind="select",
                        versions=_head_versions(pinner))

    def _query_references(self, stmt: st.Statement) -> tuple | None:
        """:func:`~flightsrv.engine.params.references` of ``stmt``, cached by its text
        (a pure function of it); None is cached as ``()`` marked uncachable."""
        hit = self._references.get(stmt.sql)
        if hit is not None:
            return hit[0]
        refs = references(stmt)
        self._references.put(stmt.sql, (refs,), stmt.sql,
                             sum(len(r[0]) + len(r[2] or "") + 64 for r in refs or ()))
        return refs

    def _read_refs(self, sql: str) -> tuple | None:
        try:
            stmt = _parse(sql)
        except Exception:  # noqa: BLE001 - the statement's own run reports it
            return None
        return self._query_references(stmt) if isinstance(stmt, st.Query) else None

    def knows_reads(self, sql: str) -> bool:
        """Whether the text of ``sql`` names every table it reads (a query without metadata
        functions): its runs then report their ``ExecInfo.read_set``. From caches."""
        return self._read_refs(asof.canonical(sql)) is not None

    def since_described(self, versions: dict[str, int], read: tuple | None = None) -> str:
        """How the tables of ``versions`` (name -> version, ``Prepared.versions``) changed
        between those versions and the ones a run read (``read``: its
        ``ExecInfo.read_set``; else the heads now): ``"same"``, every table has the
        columns it had; ``"columns"``, some table's columns changed (an ALTER TABLE) and no
        commit in between deleted or updated a row, so the described versions hold no row
        deleted since; ``"rows"``, columns changed and rows were deleted or updated in
        between too (or that cannot be told: a version gone, a table dropped or replaced)."""
        seen = {name: version for name, _uuid, version in read or ()}
        state = "same"
        for name, version in versions.items():
            try:
                table = self.warehouse.handle(name)
                now = table.snapshot(version=seen[name]) if name in seen else table.snapshot()
                if now.schema.equals(table.snapshot(version=version).schema,
                                     check_metadata=True):
                    continue
                state = "columns"
                for v in range(version + 1, now.version + 1):
                    if table.log.load(v).summary.get("rows_deleted", 0):
                        return "rows"
            except FlightsrvError:
                return "rows"
        return state

    def read_set(self, sql: str) -> tuple | None:
        """The versions the query ``sql`` would read if it ran now: ``(name, table uuid,
        version)`` per table it references (time travel resolved), or None when its text
        does not tell them all (not a query, metadata functions, a table that cannot be
        pinned). Equal to a run's ``ExecInfo.read_set``: that run read what a run now
        would (no table it reads changed in between)."""
        pins = _pinned(self._read_refs(asof.canonical(sql)), self._pinner())
        return None if pins is None else _read_set(pins)

    # -- Engine: queries ---------------------------------------------------------------------

    def execute_query(self, sql: str, session: Session,
                      params: pa.RecordBatch | None = None, *,
                      cancel: Cancel | None = None,
                      extra: dict[str, pa.Table] | None = None,
                      versions: dict[str, int] | None = None) -> QueryResult:
        """Run a statement that returns rows. ``extra``: relations bound by name for this
        statement only (the Python API's Arrow sources; the server never passes any).
        ``versions``: a query's table referenced without ``AT`` is read at the version
        given for its name (``Prepared.versions``), not at its head."""
        sql = asof.canonical(sql)
        try:
            with one_statement():  # each pass over the text once, even when none is cached
                return self._execute_query(sql, session, params, cancel=cancel, extra=extra,
                                           versions=versions)
        except ConfigurationError as e:  # bad input: named with the statement
            raise self._helped(e, sql, extra) from None

    def _execute_query(self, sql: str, session: Session, params: pa.RecordBatch | None,
                       *, cancel: Cancel | None, extra: dict[str, pa.Table] | None,
                       versions: dict[str, int] | None = None) -> QueryResult:
        stmt = _parse(sql)
        if isinstance(stmt, st.Maintenance):
            self._check_role(stmt, session)
            table = mx.run_maintenance(self._maintenance_table(stmt), stmt,
                                       read_live=self._compaction_reader())
            info = ExecInfo(kind="maintenance", rows=table.num_rows)
            return QueryResult(table.schema, table.to_reader(), info)
        if not isinstance(stmt, st.Query):
            # A client that prepares everything (ADBC) may send DML down the query path:
            # run it and answer with its row count.
            info = ExecInfo(kind=kind_name(stmt))
            n = self.execute_update(sql, session, params, cancel=cancel, info=info,
                                    extra=extra)
            batch = pa.record_batch([pa.array([n], pa.int64())], schema=COUNT_SCHEMA)
            return QueryResult(COUNT_SCHEMA,
                               pa.RecordBatchReader.from_batches(COUNT_SCHEMA, [batch]), info)
        rows = self._param_rows(stmt, params)
        if len(rows) > 1:
            raise SqlError("a query binds exactly one row of parameters",
                           statement=st._short(sql), rows=len(rows))
        ctx = _Ctx(session, cancel, ExecInfo(kind="select"), dict(extra or {}))
        pinner = self._pinner(versions)
        # the same text over the same pinned versions, parameters of the same types: the
        # kept plan with this execution's pins and values (checked and run as any other)
        key = self._plan_key(stmt, pinner, rows[0]) if not ctx.extra else None
        if key is not None:
            ctx.info.read_set = _read_set(key[2])
        qp = self._kept_plan(key, pinner, rows[0])
        if qp is not None:
            reader = self._start(sql, qp, rows[0], ctx)
        else:
            tree = sqlplan.bind_params(stmt.tree, rows[0], sql, stmt.param_count,
                                       check=lambda: ctx.check(sql))
            # bind_params copied the tree when it bound values: plan that copy in place
            reader = self._run_query(stmt, tree, "query", pinner, rows[0], ctx,
                                     owned=stmt.param_count > 0, keep=key)
        names = self._parameter_names(stmt, sql, session, rows[0], cancel)
        if names is not None:
            reader = _renamed_reader(reader, names)
        return QueryResult(reader.schema, reader, ctx.info)

    def _parameter_names(self, stmt: st.Statement, sql: str, session: Session,
                         values: list[pa.Scalar], cancel: Cancel | None) -> list[str] | None:
        """DuckDB's own names of the result columns when some bound value reached DuckDB as
        a typed literal (:func:`_binds_natively`): an unaliased expression is then named after
        its text, which held the literal (``(CAST(5 AS BIGINT) + 1)``) where DuckDB names it
        after the parameter (``($1 + 1)``), whatever the values. None when every value binds
        natively (DuckDB named the columns itself) or the names cannot be known without
        values."""
        if not stmt.param_count or all(map(_binds_natively, values)) or \
                not _names_hold_parameters(stmt.tree):
            return None
        try:
            names = self._prepare(sql, session, None, cancel=cancel).dataset_schema.names
        except FlightsrvError:
            return None
        return names or None

    # -- the plan cache: (text, pinned versions, parameter types) -> plan ----------------------

    def _plan_key(self, stmt: st.Statement, pinner: sqlplan.Pinner,
                  values: list[pa.Scalar]) -> tuple | None:
        """The key of a query's kept plan: its text, whether its text runs (not its
        rewritten tree, :func:`_literal_if_lossy`), each reference pinned now (table
        uuid and version: a new head is a new key) and each parameter's type and
        validity (a NULL makes no pruning hint). None when the query cannot be kept
        (metadata functions, parameters in ``AT``, a reference that does not pin: the
        planner then reports why)."""
        pins = _pinned(self._query_references(stmt), pinner)
        if pins is None:
            return None
        lossy = _literal_if_lossy(stmt, values).spliceable
        return (stmt.sql, lossy, tuple(pins),
                tuple((str(v.type), v.is_valid) for v in values))

    def _kept_plan(self, key: tuple | None, pinner: sqlplan.Pinner,
                   values: list[pa.Scalar]) -> sqlplan.QueryPlan | None:
        """The plan kept under ``key`` (:meth:`_plan_key`, None: none), rebuilt with this
        execution's snapshots and values (pruning hints rebound), or None."""
        kept = self._plans.get(key) if key is not None else None
        if kept is None:
            return None
        text, scans, names_ = kept
        out = []
        for relation, table, pin, columns, terms in scans:
            snap = pinner.pin(*pin)
            prune = []
            for term in terms:
                term = sqlplan.rebind_term(term, values, snap.schema)
                if term is not None:
                    prune.append(term)
            out.append(sqlplan.Scan(relation, table, snap,
                                    None if columns is None else list(columns), tuple(prune)))
        # the names too: result columns and messages show what the user wrote, not the
        # relations (``(SELECT max(d) FROM t)``, never ``... FROM __fsrv_r1 AS t``)
        return sqlplan.QueryPlan(None, out, text, names=list(names_))

    def _keep_plan(self, stmt: st.Statement, pinner: sqlplan.Pinner, key: tuple,
                   qp: sqlplan.QueryPlan) -> None:
        """Keep ``qp`` (just planned for ``stmt`` on ``pinner``) under ``key`` (its
        :meth:`_plan_key`, computed before planning) when it is a function of the plan key
        alone: the user's text with the references spliced (so the text DuckDB runs binds
        the values natively and does not hold them), no metadata functions, every pruning
        hint's parameter operands known, and pins that are exactly the key's."""
        if qp.text is None or qp.functions:
            return
        pins = {id(snap): pin for pin, snap in pinner.pins.items()}
        if set(pinner.pins) != {p[:3] for p in key[2]}:
            return
        scans = []
        size = len(qp.text)
        for scan in qp.scans:
            pin = pins.get(id(scan.snapshot))
            if pin is None or any(t.params is None for t in scan.prune):
                return
            scans.append((scan.relation, scan.table, pin,
                          None if scan.columns is None else tuple(scan.columns), scan.prune))
            size += 128 + sum(len(c) for c in scan.columns or ()) \
                + sum(sum(map(len, t.operands + (t.bounds or ()))) + 64 for t in scan.prune)
        size += sum(len(r) + len(shown) + 16 for r, shown, _ in qp.names)
        self._plans.put(key, (qp.text, tuple(scans), tuple(qp.names)), stmt.sql, size)

    def _plan(self, stmt: st.Statement, bound: exp.Expression, part: str,
              pinner: sqlplan.Pinner, extra: frozenset[str] = frozenset(), *,
              owned: bool = False) -> sqlplan.QueryPlan:
        """Plan the query part of ``stmt`` (``part``: query | ctas | insert). ``owned``:
        ``bound`` is this statement's own copy (``bind_params`` made it), planned in place
        rather than copied again."""
        query = bound if part == "query" else bound.expression
        original = stmt.tree if part == "query" else stmt.tree.expression
        source = sqlplan.query_source(stmt.text, stmt.tree, part) if stmt.spliceable else None
        if source is not None and stmt.param_count:
            # native parameters only when the spliced text uses exactly $1..$n
            used = {str(p.this) for p in original.find_all(exp.Placeholder)
                    if p.find_ancestor(exp.HistoricalData) is None}
            if used != {str(i) for i in range(1, stmt.param_count + 1)}:
                source = None
        return sqlplan.plan_query(query, pinner, stmt.sql, source, extra=extra, copy=not owned)

    @staticmethod
    def _verify(qp: sqlplan.QueryPlan, sql: str, extra: dict) -> None:
        relations = [s.relation for s in qp.scans] + [f.relation for f in qp.functions] \
            + list(extra)
        guard.verify(qp.sql, relations, sql=sql)

    def _run_query(self, stmt: st.Statement, bound: exp.Expression, part: str,
                   pinner: sqlplan.Pinner, values: list[pa.Scalar],
                   ctx: _Ctx, *, check_types=None, owned: bool = False,
                   keep: tuple | None = None) -> pa.RecordBatchReader:
        """Plan, verify, register and start a query; the returned reader owns the cursor.
        ``ctx.cancel`` interrupts DuckDB (``interrupt()``) while the query runs or streams.
        ``owned``: see :meth:`_plan`; ``keep``: the plan key (:meth:`_plan_key`) to keep
        the plan under (:meth:`_keep_plan`), None: not kept."""
        sql = stmt.sql
        qp = self._plan(_literal_if_lossy(stmt, values), bound, part, pinner,
                        frozenset(ctx.extra), owned=owned)
        if keep is not None:
            self._keep_plan(stmt, pinner, keep, qp)
        return self._start(sql, qp, values, ctx, check_types=check_types)

    def _start(self, sql: str, qp: sqlplan.QueryPlan, values: list[pa.Scalar], ctx: _Ctx,
               *, check_types=None) -> pa.RecordBatchReader:
        """Verify ``qp`` (every time: the guard), register its relations and start it."""
        ctx.names = PublicNames(qp.names)
        self._verify(qp, sql, ctx.extra)
        params = _native_params(values) if qp.needs_params and values else None
        # a query with only table references runs on a kept cursor, one that still holds
        # views of the same bodies when there is one (ViewCursors); anything else on a
        # fresh cursor, closed after it
        first = self._views.take() if not ctx.extra and not qp.functions \
            and check_types is None else None
        cur = first.cur if first is not None else self._cursors.cursor()
        running = [cur]  # every cursor this statement holds: a cancel interrupts them all
        unhook = ctx.cancel.interrupt_with(
            lambda: [c.interrupt() for c in list(running)]) \
            if ctx.cancel is not None else (lambda: None)
        kept = None
        text = qp.sql  # what DuckDB runs
        try:
            for name, obj in ctx.extra.items():
                cur.register(name, obj)
            for fn in qp.functions:
                cur.register(fn.relation, self._function_relation(fn))
            try:
                if first is None:
                    for scan in qp.scans:
                        self._register(cur, ctx, scan)
                else:
                    built = [(scan.relation, *self._relation(cur, ctx, scan))
                             for scan in qp.scans]
                    # a relation whose body holds nothing but text (a mask function's
                    # name, pinned for this statement) is bound in the statement's own
                    # text (:func:`_with_relations`) rather than as a view created for it
                    inline = [(name, rel.body) for name, rel, pure in built
                              if not pure and rel.direct is None and not rel.readers] \
                        if _STARTS_SELECT.match(text) else []
                    bound = {name for name, _ in inline}
                    rest = [b for b in built if b[0] not in bound]
                    if all(pure for _, _, pure in rest):
                        views = tuple((name, rel.body) for name, rel, _ in rest)
                        kept = self._views.choose(first, views)
                        if kept is not first:
                            running.append(kept.cur)
                            cur = kept.cur
                        for name, body in views:
                            kept.view(name, body)
                    else:  # this cursor is closed after the statement, never kept
                        for name, rel, _ in rest:
                            first.forget(name)
                            self._install(cur, ctx, name, rel)
                    text = _with_relations(inline, text)
                ctx.session_values(cur, sql)
                if check_types is not None:  # the result's DuckDB types, before it runs
                    rel = cur.sql(text, params=params)
                    check_types(rel.columns, rel.types)
                    inner = rel.to_arrow_reader(self.batch_size)
                else:  # one bind, not cur.sql's two (describe, then run)
                    inner = run_to_arrow(cur, text, batch_size=self.batch_size,
                                         stream=True, values=params)
            except duckdb.Error as e:
                ctx.check(sql)
                raise (scan_failure(ctx.failures) or native_failure(e, ctx.natives)
                       or sql_error(e, sql, ctx.names)) from None
            except pa.ArrowInvalid as e:  # a result Arrow cannot take (a type nested too deep)
                raise SqlError("the result cannot be sent as Arrow: " + str(e).splitlines()[0],
                               statement=st._short(sql)) from None
        except BaseException:
            unhook()
            for c in running:
                c.close()
            self._release_masks(ctx)
            raise
        finish = None
        if first is not None:
            views_ = self._views

            def finish(clean: bool) -> None:
                for k in {id(first): first, id(kept): kept}.values():
                    if k is None:
                        continue
                    if clean:
                        views_.put(k)
                    else:
                        k.cur.close()

        batches = stream_batches(inner, cur, sql, ctx.failures, ctx.natives, ctx.cancel, unhook,
                                 ctx.info, ctx.names,
                                 release=functools.partial(self._release_masks, ctx),
                                 finish=finish)
        if self.min_batch_rows > 1:
            batches = coalesce(batches, self.min_batch_rows, MAX_COALESCE_BYTES)
        raw = inner.schema
        schema = plain_schema(raw)
        if schema is not raw:  # an ENUM column: its values, not a dictionary
            batches = decoded(batches, schema)
        public = ctx.names.schema(schema)
        if public is not schema:  # DuckDB's names for the user's own statement
            batches = (pa.RecordBatch.from_arrays(b.columns, schema=public) for b in batches)
        return pa.RecordBatchReader.from_batches(public, batches)

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
                  hidden: bool = False, data: bool = True) -> tuple:
        """Make ``scan.relation`` readable on ``cur`` as a view over the live rows of its
        pinned snapshot (never a row a deletion vector hides: no user expression is
        evaluated over one). ``hidden``: add the file/position columns; ``data=False``: only
        the types matter (prepare), so Arrow scans are replaced by empty tables. Returns the
        file list the hidden file column indexes."""
        rel, _ = self._relation(cur, ctx, scan, hidden=hidden, data=data)
        self._install(cur, ctx, scan.relation, rel)
        return rel.file_list

    def _relation(self, cur: duckdb.DuckDBPyConnection, ctx: _Ctx, scan: sqlplan.Scan, *,
                  hidden: bool = False, data: bool = True) -> tuple[rels.Relation, bool]:
        """The relation of ``scan`` over its pinned snapshot (``rels.build``; statistics and
        prefetch queries run on ``cur``, which keeps nothing of them), and whether it is
        *pure*: a view body over data files read by path and nothing else (no registered
        Arrow object, no mask function), so that body text alone says which rows it reads
        and a view of it may be kept across statements (:class:`ViewCursors`)."""
        slots = len(ctx.mask_slots)
        snap = scan.snapshot
        pruner = Pruner(cur, scan.prune, snap.schema, snap.manifest, snapshot=snap,
                        constants=self._constants) if scan.prune else None
        native = self.native_root is not None and rels.is_native(snap)
        selective = self.masked_scans in ("filtered", "prefetch")
        masks = self.mask_slots is not None and data and native
        # with the mask extension, a reference that lists the values it wants (``col = c``,
        # a short IN) reads its files with deleted rows inside the statement: all of them
        # in one read_parquet with their masks, the listed conditions pushed below the
        # barrier (one DuckDB run; the prefetch runs two), while they hold at most
        # :data:`LISTED_IN_SCAN_ROWS` rows (:data:`LISTED_IN_SCAN`)
        listed = masks and LISTED_IN_SCAN and self.masked_scans == "prefetch" and \
            rels.point_set(pruner) and rels.pushable(pruner)
        masked_native = self.masked_scans == "duckdb" or (selective and rels.pushable(pruner)) \
            or (self.masked_scans == "prefetch" and rels.point_set(pruner))
        rel = rels.build(snap, self._scan_columns(scan), scan.relation, pruner=pruner,
                         hidden=hidden, native=native, open_scans=data,
                         masked_native=masked_native,
                         masked_max_groups=MASKED_MAX_GROUPS if selective else None,
                         prefetch=functools.partial(_prefetch, cur)
                         if self.masked_scans == "prefetch" else None,
                         masks=functools.partial(self._mask_function, ctx) if masks else None,
                         listed_in_scan=LISTED_IN_SCAN_ROWS if listed else None,
                         masks_in_reader=bool(masks) and self.mask_slots.kind == "scan")
        ctx.natives.update(rel.files)
        info = ctx.info
        info.tables.setdefault(scan.table, snap.version)
        info.files_scanned += rel.files_scanned
        info.files_pruned += rel.files_pruned
        info.rows_masked += rel.rows_masked
        if pruner is not None:
            info.row_groups_pruned += pruner.row_groups_pruned
            info.chunks_pruned += pruner.chunks_pruned
            info.files_pruned += pruner.chunk_files_pruned
        pure = rel.direct is None and not rel.readers and len(ctx.mask_slots) == slots
        return rel, pure

    @staticmethod
    def _install(cur: duckdb.DuckDBPyConnection, ctx: _Ctx, relation: str,
                 rel: rels.Relation) -> None:
        """Register ``rel`` on ``cur`` as ``relation`` for this statement only."""
        if rel.direct is not None:  # one prefetched table: it is the relation, no view
            cur.register(relation, rel.readers[rel.direct])
            return
        for name, obj in rel.readers.items():
            if isinstance(obj, pa.RecordBatchReader):
                obj = guarded(obj, ctx.failures)
            cur.register(name, obj)
        try:
            cur.execute(f"CREATE TEMP VIEW {relation} AS {rel.body}")
        except duckdb.Error as e:  # binding the view opens the data files it reads natively
            failure = native_failure(e, rel.files)
            if failure is not None:
                raise failure from None
            raise

    def _mask_function(self, ctx: _Ctx, snap, files) -> maskext.Mask | None:
        """The mask of data files ``files`` of ``snap`` (one file list: one file's mask, or
        several indexed by their place in the list), its slot pinned for ``ctx``'s
        statement; None when no slot is free (the files are then read by the Arrow scan)."""
        slot = self._acquire_mask(snap, files[0]) if len(files) == 1 else \
            self.mask_slots.acquire(tuple(self._mask_key(snap, f) for f in files),
                                    lambda: [self._bitmap(snap, f) for f in files])
        if slot is None:
            return None
        ctx.mask_slots.append(slot)
        return self._mask(slot)

    def _mask(self, slot: int) -> maskext.Mask:
        return maskext.Mask(slot, self.mask_slots.kind == "scan")

    @staticmethod
    def _mask_key(snap, f) -> tuple:
        """The identity of data file ``f``'s deletion state (it never changes for a key)."""
        dv = f.dv
        return (snap.store.uri, f.path, f.rows, tuple(f.deleted_row_groups),
                None if dv is None else (dv.storage, dv.path, dv.offset, dv.length, dv.data,
                                         dv.cardinality))

    @staticmethod
    def _bitmap(snap, f):
        """Data file ``f``'s deletion mask: (bitmap of deleted positions, rows)."""
        ranges = [(f.row_group_offsets[g], f.row_group_rows(g)) for g in f.deleted_row_groups]
        return maskext.bitmap_of(f.rows, snap.deleted_positions(f), ranges)

    def _acquire_mask(self, snap, f) -> int | None:
        """A pinned slot holding the deletion mask of data file ``f`` of ``snap`` (deletion
        vector and deleted row groups), or None when none is free."""
        return self.mask_slots.acquire(self._mask_key(snap, f),
                                       lambda: self._bitmap(snap, f))

    def _compaction_reader(self):
        """Compaction's reader of a file's live rows (``compact(read_live=...)``), or None
        without the deletion-mask extension."""
        return self._read_live if self.mask_slots is not None and MASKED_POSITION_READS \
            else None

    def _read_live(self, snap, f):
        """The live rows of data file ``f`` of ``snap`` for compaction, every column under
        the current schema in position order, read by DuckDB's Parquet reader with the
        file's deletion mask, streamed as Arrow tables; None (compaction reads it itself)
        for a file without deleted rows, on S3, when no slot is free or DuckDB cannot read
        the file so. No statement expression runs here: only the mask sees the rows."""
        if not rels.is_native(snap) or rels._is_clean(f) or f.inline is not None:
            return None
        if _has_ns_duration(snap.schema):
            return None  # DuckDB's INTERVAL holds microseconds: compaction copies exactly
        slot = self._acquire_mask(snap, f)
        if slot is None:
            return None
        names_ = list(snap.schema.names)
        try:
            text = rels.take_sql(snap, f, names_, self._mask(slot))
        except BaseException:
            self.mask_slots.release([slot])
            raise
        if text is None:
            self.mask_slots.release([slot])
            return None
        schema = pa.schema([snap.schema.field(c) for c in names_])
        natives = {snap.store.local_path(f.path): (snap.table.name, f.path, snap.version)}

        def tables():
            cur = self._cursors.cursor()
            try:
                reader = run_to_arrow(cur, text, batch_size=self.batch_size, stream=True)
                for batch in reader:
                    t = pa.Table.from_batches([batch])
                    yield cast_table(t, schema)
            except duckdb.Error as e:
                raise native_failure(e, natives) or CorruptObject(
                    "compaction could not read a data file", table=snap.table.name,
                    object=f.path, version=snap.version) from None
            finally:
                cur.close()
                self.mask_slots.release([slot])

        return tables()

    def _release_masks(self, ctx: _Ctx) -> None:
        slots, ctx.mask_slots = ctx.mask_slots, []
        if slots:
            self.mask_slots.release(slots)

    def takes_in_duckdb(self, snap) -> bool:
        """Whether :meth:`_take` reads ``snap``'s rows by position with DuckDB (the mask
        extension loaded, a local table)."""
        return self.mask_slots is not None and rels.is_native(snap) and MASKED_POSITION_READS \
            and not _has_ns_duration(snap.schema)

    def _take(self, cur, ctx: _Ctx, snap, positions: dict, files, sql: str) -> pa.Table:
        """UPDATE/MERGE's read by position: the whole rows (every column, current schema) at
        ``positions`` (sorted int64 per data file path; live rows DuckDB found through the
        masked view), in ``files`` order and position order, as
        :meth:`~flightsrv.table.scan.Snapshot.take` returns them. With the deletion-mask
        extension loaded and a local table, consecutive files of one written schema are read
        by one DuckDB statement (:meth:`_take_run`) whose Parquet reader applies one-off
        masks keeping only those positions (pushed into the scan: the other columns are
        decoded only around kept rows, and the files in parallel); else, or for a file
        DuckDB cannot read so or when no slot is free, by ``Snapshot.take``."""
        if not self.takes_in_duckdb(snap):
            return snap.take(positions, files=files)
        names_ = list(snap.schema.names)
        schema = pa.schema([snap.schema.field(c) for c in names_])
        wanted = [f for f in files if positions.get(f.path) is not None
                  and len(positions[f.path])]
        parts = []
        run: list = []
        rows = 0
        for f in wanted + [None]:
            if run and (f is None or f.schema_id != run[0].schema_id
                        or rows + f.rows > TAKE_GROUP_ROWS):
                parts += self._take_run(cur, ctx, snap, run, positions, names_, sql)
                run, rows = [], 0
            if f is not None:
                run.append(f)
                rows += f.rows
        parts = [cast_table(p, schema) for p in parts]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _take_run(self, cur, ctx: _Ctx, snap, run: list, positions: dict, names_: list,
                  sql: str) -> list[pa.Table]:
        """The rows at ``positions`` of the files of ``run`` (consecutive files of one written
        schema), in file and position order: one DuckDB read of all of them with a one-off
        mask per file in one slot (the two-argument mask function), so that DuckDB reads
        the files in parallel; one read per file when they are one, when no slot is free or
        DuckDB cannot read them so."""
        def keep_only(f):
            dropped = np.ones(f.rows, dtype=bool)
            dropped[positions[f.path]] = False
            return np.packbits(dropped, bitorder="little"), f.rows

        if len(run) > 1:
            # the slots are the process's, shared by every engine: a one-off mask's key is
            # unique in the process (a per-engine counter made two engines share one)
            slot = self.mask_slots.acquire(("take", object()),
                                           lambda: [keep_only(f) for f in run])
            if slot is not None:
                try:
                    text = rels.take_group_sql(snap, run, names_, self._mask(slot))
                    if text is not None:
                        for f in run:
                            ctx.natives[snap.store.local_path(f.path)] = (
                                snap.table.name, f.path, snap.version)
                        return [self._took(snap, run, positions,
                                           self._fetch(cur, ctx, text, sql))]
                finally:
                    self.mask_slots.drop(slot)
        parts = []
        for f in run:
            pos = positions[f.path]
            slot = self.mask_slots.acquire(("take", object()), lambda f=f: keep_only(f))
            try:
                text = None if slot is None else \
                    rels.take_sql(snap, f, names_, self._mask(slot))
                if text is None:
                    part = snap.take({f.path: pos}, files=[f])
                else:
                    ctx.natives[snap.store.local_path(f.path)] = (snap.table.name, f.path,
                                                                 snap.version)
                    part = self._fetch(cur, ctx, text, sql)
                    if part.num_rows != len(pos):  # the positions came from this snapshot
                        raise CorruptObject("a read by position found other rows than the "
                                            "statement matched", table=snap.table.name,
                                            object=f.path, version=snap.version,
                                            expected=len(pos), actual=part.num_rows)
            finally:
                if slot is not None:
                    self.mask_slots.drop(slot)
            parts.append(part)
        return parts

    @staticmethod
    def _took(snap, run: list, positions: dict, part: pa.Table) -> pa.Table:
        """The rows of a grouped read by position (:meth:`_take_run`) in file and position
        order, without the file index and position columns, after checking that each file
        gave as many rows as it was asked for."""
        part, fi, _ = rels.file_position_order(part, "__fsrv_fi", "__fsrv_fr")
        counts = np.bincount(fi, minlength=len(run))
        for f, got in zip(run, counts[:len(run)]):
            if got != len(positions[f.path]):  # the positions came from this snapshot
                raise CorruptObject("a read by position found other rows than the statement "
                                    "matched", table=snap.table.name, object=f.path,
                                    version=snap.version, expected=len(positions[f.path]),
                                    actual=int(got))
        if len(counts) > len(run):
            raise CorruptObject("a read by position found rows of no file it read",
                                table=snap.table.name, version=snap.version)
        return part.drop_columns(["__fsrv_fi", "__fsrv_fr"])

    @contextlib.contextmanager
    def _statement_cursor(self, ctx: _Ctx, sql: str):
        """A fresh cursor of the warehouse database for the statement ``sql``, interrupted
        when ``ctx`` is cancelled."""
        cur = self._cursors.cursor()
        unhook = ctx.cancel.interrupt_with(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            ctx.session_values(cur, sql)
            for name, obj in ctx.extra.items():
                cur.register(name, obj)
            yield cur
        finally:
            unhook()
            cur.close()
            self._release_masks(ctx)

    def _fetch(self, cur, ctx: _Ctx, text: str, sql: str, *, numpy: bool = False):
        """Run ``text`` (already verified) on ``cur`` and return the whole result: an Arrow
        table, or with ``numpy`` (a DML find) its columns as NumPy arrays by a plain
        execute, because ``cur.sql(text)`` parses and binds the text once to describe the
        relation and again to run it, ~7 ms more for a find carrying 1,000 literals."""
        try:
            if numpy:
                return cur.execute(text).fetchnumpy()
            return run_to_arrow(cur, text, batch_size=self.batch_size, stream=False)
        except duckdb.Error as e:
            ctx.check(sql)
            raise (scan_failure(ctx.failures) or native_failure(e, ctx.natives)
                   or sql_error(e, sql, ctx.names)) from None

    def _sandbox_run(self, ctx: _Ctx, text: str, rows: pa.Table, schema: pa.Schema,
                     others: dict[str, pa.Table], sql: str, returning: str = "",
                     target: str = "target", defaults: dict | None = None):
        """Phase 2 of UPDATE/MERGE: run the user's statement ``text`` against a plain DuckDB
        table ``__fsrv_candidates`` holding ``rows`` (typed and constrained like the
        table, with its columns' write ``defaults`` as DuckDB defaults, so ``INSERT (id)``,
        ``INSERT DEFAULT VALUES`` and ``SET c = DEFAULT`` take them), with ``others``
        registered by name, in the database that can open no file. Returns (rows affected,
        the table's final contents, RETURNING rows or None)."""
        from flightsrv.engine.dml import CANDIDATES

        cur = self._sandbox.cursor()
        unhook = ctx.cancel.interrupt_with(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            ctx.session_values(cur, sql)
            cur.register("__fsrv_rows", rows)
            # one statement creates and fills it (a temp table of this cursor: closing the
            # cursor drops it); the rows came from the table, so its constraints hold
            cur.execute(f"CREATE TEMP TABLE {CANDIDATES} AS SELECT * FROM __fsrv_rows")
            for f in schema:
                if not f.nullable:
                    cur.execute(f"ALTER TABLE {CANDIDATES} ALTER COLUMN "
                                f"{rels._ident(f.name)} SET NOT NULL")
                if defaults and f.name in defaults:
                    value = sqltypes.literal_sql(pa.scalar(defaults[f.name], f.type))
                    cur.execute(f"ALTER TABLE {CANDIDATES} ALTER COLUMN "
                                f"{rels._ident(f.name)} SET DEFAULT {value}")
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
                # DuckDB names the stand-in table ("NOT NULL constraint failed:
                # __fsrv_candidates.a"); the user knows it as the statement's target
                raise sql_error(e, sql, PublicNames(
                    [(CANDIDATES, names.printed(target), False), *ctx.names.entries])) \
                    from None
        finally:
            unhook()
            cur.close()  # and its temp table with it
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
        out = {"statement": kind_name(stmt)}
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
        sql = asof.canonical(sql)
        try:
            with one_statement():  # each pass over the text once, even when none is cached
                return self._execute_update(sql, session, params, cancel=cancel, info=info,
                                            extra=extra)
        except ConfigurationError as e:  # bad input: named with the statement
            raise self._helped(e, sql, extra) from None

    def _execute_update(self, sql: str, session: Session, params: pa.RecordBatch | None,
                        *, cancel: Cancel | None, info: ExecInfo | None,
                        extra: dict[str, pa.Table] | None) -> int:
        stmt = _parse(sql)
        self._check_role(stmt, session)
        if isinstance(stmt, st.Query):
            raise SqlError("a query returns rows; run it as a query, not an update",
                           statement=st._short(sql))
        ctx = _Ctx(session, cancel, info if info is not None else ExecInfo(
            kind=kind_name(stmt)), dict(extra or {}))
        ctx.info.kind = kind_name(stmt)
        if isinstance(stmt, st.InsertValues):
            if isinstance(params, pa.Table):
                params = params.combine_chunks().to_batches()[0] if params.num_rows else None
            n = self._writes.insert_values(stmt, params, ctx)
            if n is not None:
                ctx.info.rows = n
                return n
            stmt = st.parse_statement(sql, fast=False)  # the general path binds these
        total = 0
        for values in self._param_rows(stmt, params):
            tree = sqlplan.bind_params(stmt.tree, values, sql, stmt.param_count,
                                       check=lambda: ctx.check(sql))
            total += self._run_update(stmt, tree, values, ctx)
        ctx.info.rows = total
        return total

    def delete_statement(self, sql: str, session: Session, *, mode: str | None = None,
                         expire: bool = False, grace=None, progress=None,
                         certificate: bool | None = None, source: str = "python") -> int:
        """Run one DELETE (Python API): ``mode`` overrides the session and table setting;
        a splice's count carries its report (``.result``); ``expire`` expires the versions
        that still reach the erased bytes."""
        sql = asof.canonical(sql)
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
            if stmt.value is not None:
                session.settings[stmt.name] = stmt.value
            elif stmt.name:  # RESET name, SET name = DEFAULT
                session.settings.pop(stmt.name, None)
            else:  # RESET ALL
                for name in st.SESSION_SETTINGS:
                    session.settings.pop(name, None)
            return 0
        if isinstance(stmt, st.Delete):
            table = self._table(stmt.table)
            # the session setting wins; else the table property delete_mode (default dv)
            mode = session.settings.get("delete_mode") or \
                table.head().properties.get("delete_mode", "dv")
            return self._dml.delete(ctx, stmt, tree, values, mode,
                                    splice_options={"source": "sql"})
        if isinstance(stmt, st.Update):
            return self._dml.update(ctx, stmt, tree, values)
        if isinstance(stmt, st.Merge):
            return self._dml.merge(ctx, stmt, tree, values)
        if isinstance(stmt, st.Insert):
            return self._writes.insert(stmt, tree, values, ctx)
        if isinstance(stmt, st.CreateTable):
            return self._writes.create(stmt)
        if isinstance(stmt, st.CreateTableAs):
            return self._writes.ctas(stmt, tree, values, ctx)
        if isinstance(stmt, st.DropTable):
            if not binder.is_table_name(stmt.table.lower()):  # no table can have that name
                if stmt.if_exists:
                    return 0
                raise TableNotFound("no such table", table=stmt.table)
            try:
                self.warehouse.drop_table(stmt.table)
            except TableNotFound:
                if not stmt.if_exists:
                    raise
            return 0
        if isinstance(stmt, st.Maintenance):
            mx.run_maintenance(self._maintenance_table(stmt), stmt,
                               read_live=self._compaction_reader())
            return 0
        if isinstance(stmt, st.AlterTable):
            return self._writes.alter(stmt)
        raise SqlError("statement kind not handled", statement=st._short(sql),
                       kind=type(stmt).__name__)

    # -- Engine: ingest ---------------------------------------------------------------------------

    def ingest(self, table: str, mode: IngestMode, data: pa.RecordBatchReader,
               session: Session, *, cancel: Cancel | None = None) -> int:
        return self._writes.ingest(table, mode, data, session, cancel=cancel)


    # -- DuckDB's help against the user's own text ------------------------------------------------

    def _helped(self, exc: FlightsrvError, sql: str, extra: dict | None = None
                ) -> FlightsrvError:
        """``exc`` with DuckDB's help against the statement as the user typed it (see
        :mod:`flightsrv.engine.diagnose`): for an error of binding (DuckDB's binder or
        catalog error, an unknown table) DuckDB's own message, hints ("Candidate
        bindings", "Did you mean") and caret for the user's text over a catalog of the
        statement's tables and the tables the caller may see; for a syntax error DuckDB's
        parser's; for flightsrv's own error at a known position, a caret there. Unchanged
        when there is no better answer (or anything goes wrong finding one)."""
        if getattr(exc, "helped", False) or extra:
            return exc
        try:
            found = self._help(exc, sql)
        except Exception:  # noqa: BLE001 - help is a courtesy: the error itself stands
            found = None
        found = found or exc
        found.helped = True
        return found.with_context(statement=st._short(sql))

    def _help(self, exc: FlightsrvError, sql: str) -> FlightsrvError | None:
        if isinstance(exc, TableNotFound):
            return self._help_missing(exc, sql)
        if not isinstance(exc, SqlError):
            return None
        if exc.engine_class == "ParserException" or (not exc.engine_text and exc.message
                                                     .startswith(("syntax error",
                                                                  "cannot tokenize"))):
            # DuckDB's parser on the user's text: where it fails too, its words and caret
            found = self._scratch.parse_error(sql)
            if found is not None:
                err = SqlError.from_engine(found.first, statement=st._short(sql))
                err.engine_class = found.kind
                return err.with_detail(found.detail)
        if exc.engine_class in _BIND_ERRORS:
            found = self._explain(sql, exc)
            if found is None:
                return None
            err = SqlError.from_engine(found.first, **exc.context)
            err.engine_class = found.kind
            return err.with_detail(found.detail)
        if exc.engine_text or exc.detail:
            return None
        line, col = exc.context.get("line"), exc.context.get("col")
        if isinstance(line, int) and isinstance(col, int) and \
                st.number_placeholders(sql)[0] == sql:  # positions are of the text as sent
            lines = sql.split("\n")
            if 1 <= line <= len(lines):
                offset = sum(len(x) + 1 for x in lines[:line - 1]) + col - 1
                block = caret_block(sql, line, col, diagnose.token_width(sql, offset))
                if block is not None:
                    return exc.with_detail("\n" + block)
        return None

    def _tables_of(self, stmt: st.Statement, sql: str) -> tuple[
            dict[str, pa.Schema], str | None, dict[str, tuple[int, pa.Schema]]] | None:
        """(name -> schema of the version read, for each table ``stmt`` reads or writes;
        the first name that is no table; each metadata function it calls -> (its number of
        arguments, its result's schema)), or None when the statement reads relations bound
        by name."""
        binding = stmt.binding
        if binding is None or binding.extras:
            return None
        pinner = self._pinner()
        tables: dict[str, pa.Schema] = {}
        missing = None
        functions: dict[str, tuple[int, pa.Schema]] = {}
        for node in binding.functions:
            name = binder.function_name(node.this)
            if name in binder.WAREHOUSE_FUNCTIONS:
                functions.setdefault(name, (0, mx.TABLES_SCHEMA))
                continue
            table = sqlplan.metadata_table_name(node.this.expressions[0].name, sql)
            if name not in functions:
                try:
                    functions[name] = (1, mx.metadata_relation(self.warehouse, name,
                                                               table).schema)
                except TableNotFound:
                    missing = missing or table
        refs = [(ref.name, *sqlplan._time_travel(ref, sql)) for ref in binding.tables]
        if getattr(stmt, "table", "") and not isinstance(stmt, (st.CreateTable,
                                                                 st.CreateTableAs)):
            refs.insert(0, (stmt.table, None, None))  # the target of DML, INSERT, DROP ...
        for name, version, as_of in refs:
            try:
                schema = pinner.pin(name, version, as_of).schema
            except TableNotFound:
                missing = missing or name
                continue
            tables.setdefault(name.lower(), schema)
        return tables, missing, functions

    def _explain(self, sql: str, exc: SqlError) -> diagnose.Help | None:
        """DuckDB's error for ``sql`` as the user typed it, when it explains ``exc``."""
        stmt = _parse(sql)
        got = self._tables_of(stmt, sql)
        if got is None or got[1] is not None:
            return None
        found = self._scratch.explain(sql, got[0], functions=got[2])
        if found is None or not diagnose.accepts(exc.engine_class, exc.message, found):
            return None
        return found

    def _help_missing(self, exc: TableNotFound, sql: str) -> TableNotFound | None:
        """An unknown table: DuckDB's "Did you mean" among the tables the caller may see
        (:meth:`list_tables`: every principal may list every table, the server has no
        per-table grants) and, for a statement DuckDB can bind, its caret."""
        missing = exc.context.get("table")
        if not isinstance(missing, str) or not binder.is_table_name(missing):
            return None
        context = {**exc.context, "statement": st._short(sql)}
        try:
            got = self._tables_of(_parse(sql), sql)
        except FlightsrvError:
            got = None
        if got is not None and got[1] == missing and not got[2]:
            found = self._scratch.explain(sql, got[0], self.list_tables(), missing=missing)
            if found is not None and found.kind == "CatalogException" and \
                    missing.lower() in found.first.lower():
                return TableNotFound(exc.message, **context).with_detail(found.detail)
        hint = self._scratch.suggestion(missing, self.list_tables())
        if hint is None:  # nothing to offer: the error still names the statement
            return TableNotFound(exc.message, **context)
        return TableNotFound(exc.message, **context).with_detail(hint)

    # -- helpers -----------------------------------------------------------------------------------

    def _pinner(self, versions: dict[str, int] | None = None) -> sqlplan.Pinner:
        return table_pinner(self.warehouse, self._instant_ms, versions)

    def _instant_ms(self, text: str, table: str) -> int:
        """Epoch milliseconds of ``AT (TIMESTAMP => 'text')`` on ``table``: DuckDB decides
        what the text means (``CAST(text AS TIMESTAMPTZ)`` in this engine's time zone,
        where a time without an offset is local, as in every other statement)."""
        cur = self._sandbox.cursor()
        try:
            (ms,) = cur.execute("SELECT epoch_ms(CAST(? AS TIMESTAMPTZ))", [text]).fetchone()
        except duckdb.Error as e:
            raise SqlError("AT (TIMESTAMP => ...) is not a time DuckDB reads", table=table,
                           timestamp=text, reason=str(e).split("\n", 1)[0]) from None
        finally:
            cur.close()
        if ms is None:  # 'infinity', '-infinity'
            raise SqlError("AT (TIMESTAMP => ...) needs a finite time", table=table,
                           timestamp=text)
        return ms

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


def _pinned(refs: tuple | None, pinner: sqlplan.Pinner) -> list[tuple] | None:
    """``(name, version, as_of, table uuid, version pinned)`` per reference of ``refs``
    (:func:`~flightsrv.engine.params.references`), pinned on ``pinner``; None when ``refs``
    is or a reference does not pin (the uncached path reports why)."""
    if refs is None:
        return None
    try:
        pins = []
        for ref in refs:
            m = pinner.pin(*ref).manifest
            pins.append((*ref, m.table_uuid, m.version))
    except Exception:  # noqa: BLE001 - see docstring
        return None
    return pins


def _read_set(pins) -> tuple:
    """A read set (``ExecInfo.read_set``) from :func:`_pinned`'s pins."""
    return tuple((name, uuid, version) for name, _, _, uuid, version in pins)


def _has_ns_duration(schema: pa.Schema) -> bool:
    """Whether a column is a ``duration[ns]``, which DuckDB reads to microseconds: its rows
    are read by position exactly (pyarrow), not through DuckDB."""
    return any(pa.types.is_duration(t) and t.unit == "ns" for t in schema.types)


def _prepares_untyped(cur, text: str) -> bool:
    """Whether DuckDB prepares ``text`` with its parameters untyped (it binds their types
    when values come): a statement that fails only with every parameter NULL."""
    try:
        cur.execute(f"PREPARE {_DESCRIBE} AS {text}")
    except duckdb.Error:
        return False
    try:
        cur.execute(f"DEALLOCATE {_DESCRIBE}")
    except duckdb.Error:
        pass
    return True


_DESCRIBE = "__fsrv_describe"

__all__ = ["DuckEngine"]

#: DuckDB's errors of binding a statement (names, types, the catalog): they depend on the
#: statement and the schemas it reads, never on a row
_BIND_ERRORS = frozenset({"BinderException", "CatalogException", "ParserException"})


#: clauses whose expressions only choose rows: a parameter there cannot type a result column
_FILTER_CLAUSES = (exp.Where, exp.Having, exp.Qualify, exp.Limit, exp.Offset, exp.Order)


def _params_type_results(tree: exp.Expression) -> bool:
    """Whether a bound value may change the result's schema: some parameter sits outside
    the clauses that only choose rows (WHERE, HAVING, QUALIFY, LIMIT, OFFSET, ORDER BY, a
    JOIN's ON), e.g. ``SELECT ? AS v``. When none does, the schema prepared with the
    parameters as NULL is the schema of every execution."""
    for node in tree.find_all(exp.Placeholder, exp.Parameter):
        child, parent = node, node.parent
        while parent is not None:
            if isinstance(parent, _FILTER_CLAUSES) or (
                    isinstance(parent, exp.Join) and child is parent.args.get("on")):
                break
            child, parent = parent, parent.parent
        else:
            return True
    return False


#: :func:`_params_type_results` of a statement text's parsed tree (a pure function of it;
#: GetFlightInfo asks it of every bound prepared query)
_params_type_results_of = text_cache(maxsize=4096)(
    lambda sql: _params_type_results(_parse(sql).tree))


def _literal_if_lossy(stmt: st.Statement, values: list[pa.Scalar]) -> st.Statement:
    """``stmt``, run from its rewritten tree (parameters as typed literals, as DML binds
    them) when a bound value cannot reach DuckDB whole and with its type as a Python object
    (see :func:`_binds_natively`), so a query and a DELETE with the same value see the same
    value of the same type."""
    if values and stmt.spliceable and not all(map(_binds_natively, values)):
        return dataclasses.replace(stmt, spliceable=False)
    return stmt


def _head_versions(pinner: sqlplan.Pinner) -> dict[str, int]:
    """The version of each table ``pinner`` pinned for a reference without ``AT``."""
    return {name: snap.version for (name, version, as_of), snap in pinner.pins.items()
            if version is None and as_of is None}


def _renamed_reader(reader: pa.RecordBatchReader, names: list[str]) -> pa.RecordBatchReader:
    """``reader`` with its columns named ``names`` (same count, else unchanged); closing the
    new reader's stream closes ``reader``."""
    schema = reader.schema
    if len(names) != len(schema) or list(names) == schema.names:
        return reader
    renamed = pa.schema([f.with_name(n) for f, n in zip(schema, names)], metadata=schema.metadata)

    def batches():
        try:
            for b in reader:
                yield pa.RecordBatch.from_arrays(b.columns, schema=renamed)
        finally:
            reader.close()

    return pa.RecordBatchReader.from_batches(renamed, batches())


def _names_hold_parameters(tree) -> bool:
    """Whether a result column of the query is named after an expression holding a
    parameter (an unaliased select item with a ``?``/``$n`` in it)."""
    selects = getattr(tree, "selects", None) or []
    return any(not isinstance(e, exp.Alias) and any(True for _ in e.find_all(exp.Placeholder))
               for e in selects)

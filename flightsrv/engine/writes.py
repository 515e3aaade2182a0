"""Statements that write rows or change tables, other than DELETE/UPDATE/MERGE
(:mod:`flightsrv.engine.dml`): INSERT (rows cast to the table's types by DuckDB), CREATE
TABLE [AS], ALTER TABLE, and Flight SQL bulk ingest. Appends go through the engine's group
committer."""

from __future__ import annotations

import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from flightsrv.engine import guard
from flightsrv.engine import relations as rels
from flightsrv.engine.binds import _binds_natively, _native_params
from flightsrv.engine.api import Cancel, IngestMode, Role, Session
from flightsrv.engine.context import QueryRunner, StatementContext
from flightsrv.engine.stream import RowCounter, sql_error, stream_batches
from flightsrv.errors import (
    ConfigurationError,
    PermissionDenied,
    SqlError,
    TableExists,
    TableNotFound,
)
from flightsrv.sql import names
from flightsrv.sql import statements as st
from flightsrv.sql.names import PublicNames
from flightsrv.sql.values import split_rows
from flightsrv.table.schema import write_defaults
from flightsrv.table.types import fit_sql_rows, has_fixed_binary

#: a VALUES list of rows of constants is run in at most this many parts at once, one per
#: core, each of at least VALUES_PART_ROWS rows (below that, a part's own statements cost
#: more than the core saves)
VALUES_PARTS = 4
VALUES_PART_ROWS = 512
#: each part runs as INSERTs of about this many rows, one after the other on its cursor:
#: DuckDB's CPU for one VALUES list grows faster than its rows (2.0.1, 10,000 rows of 4
#: constants: one INSERT took 16-27% more CPU than ten of 1,000)
VALUES_CHUNK_ROWS = 1024


class Writes:
    """The writing statements of one engine (:class:`~flightsrv.engine.duck.DuckEngine`,
    seen through :class:`~flightsrv.engine.context.QueryRunner`)."""

    def __init__(self, engine: QueryRunner):
        self.engine = engine
        #: threads for the parts of a long VALUES list (:meth:`_in_parts`), made on first use
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    @staticmethod
    def _resolve_columns(stmt: st.Insert, target: pa.Schema) -> list[str]:
        """The INSERT's target columns as the table spells them."""
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
        return resolved

    def insert(self, stmt: st.Insert, tree: exp.Expression, values: list[pa.Scalar],
                ctx: StatementContext) -> int:
        table = self.engine._table(stmt.table)
        pinner = self.engine._pinner()
        target = pinner.pin(stmt.table).schema
        resolved = self._resolve_columns(stmt, target)
        defaults = write_defaults(pinner.pin(stmt.table).manifest.schema, target)
        if isinstance(tree.expression, exp.Values):
            # as DuckDB's own INSERT: each VALUES expression is cast to its column's type
            # (run as a query, the list would first be typed across its rows: 1.5 and 'NaN'
            # -> DECIMAL, an error). The tree then differs from the text: run the tree.
            tree = self.cast_values(tree, [target.field(c) for c in resolved], defaults)
            stmt = dataclasses.replace(stmt, spliceable=False)
        reader = self.engine._run_query(stmt, tree, "insert", pinner, values, ctx)
        if stmt.by_name:  # the query's column names, matched as DuckDB matches names
            try:
                resolved = self._resolve_columns(
                    dataclasses.replace(stmt, columns=tuple(reader.schema.names)), target)
            except BaseException:
                reader.close()
                raise
        if len(reader.schema) != len(resolved):
            reader.close()
            raise SqlError("INSERT has a different number of values than columns",
                           statement=st._short(stmt.sql), table=stmt.table,
                           columns=len(resolved), values=len(reader.schema))
        counter = RowCounter()
        shaped = self.cast_for_insert(reader, resolved, target, stmt, ctx, defaults)
        pinned = pinner.pin(stmt.table).manifest
        self.append(table, pa.RecordBatchReader.from_batches(
            shaped.schema, counter.count(shaped)),
            expected_uuid=pinned.table_uuid, written_for=pinned)
        return counter.rows

    def insert_values(self, stmt: st.InsertValues, params: pa.RecordBatch | None,
                      ctx: StatementContext) -> int | None:
        """The fast path of ``INSERT INTO t [(cols)] VALUES ...`` (every parameter row of
        ``params``): DuckDB's own INSERT of the statement's VALUES text (every token on the
        allow-list of :mod:`flightsrv.sql.values`) into a temporary table typed, constrained
        and defaulted like ``t``, in the database that can open no file; its rows are then
        appended in one commit. So DuckDB alone decides each value's type, cast, NULL and
        DEFAULT, exactly as its INSERT would. Parameters bind natively (one parameter row),
        or as the columns of ``params`` scanned by ``INSERT ... SELECT`` (a one-row VALUES
        without DEFAULT: one statement for every parameter row), or one execution per
        parameter row. None when none of these carries the parameters exactly as the
        general path would bind them (the caller then runs the general path)."""
        from flightsrv.sql.plan import params_from_batch
        from flightsrv.sql.types import duckdb_type, literal_sql, quote_ident

        nparams = stmt.param_count
        n_rows = 0 if not nparams else (params.num_rows if params is not None else 0)
        if nparams and not n_rows:
            raise SqlError("statement has parameters but none were bound",
                           statement=st._short(stmt.sql), expected=nparams)
        if nparams and params.num_columns < nparams:
            raise SqlError("too few parameters", statement=st._short(stmt.sql),
                           expected=nparams, got=params.num_columns)
        table = self.engine._table(stmt.table)
        snap = self.engine._pinner().pin(stmt.table)
        target = snap.schema
        resolved = self._resolve_columns(stmt, target)
        if stmt.width is not None and stmt.width != len(resolved):
            raise SqlError("INSERT has a different number of values than columns",
                           statement=st._short(stmt.sql), table=stmt.table,
                           columns=len(resolved), values=stmt.width)
        types = [duckdb_type(f.type) for f in target]
        if any(t is None for t in types):
            return None  # a type DuckDB cannot spell: the general path passes it through
        defaults = write_defaults(snap.manifest.schema, target)
        cols = [quote_ident(c) for c in resolved]
        # how the parameters reach DuckDB (see the docstring)
        columns_route = nparams and stmt.rows == 1 and not stmt.defaults and not any(
            pa.types.is_union(t) for t in params.schema.types[:nparams])
        rows: list[list] = []
        if nparams and not (columns_route and n_rows > 1):
            rows = [params_from_batch(params, r) for r in range(n_rows)]
            # a NULL of a type binds as an untyped NULL where the parameter is a whole
            # VALUES position (the column's type decides); inside an expression it must
            # keep its type, which only the columns route carries
            if all(_binds_natively(v) or (not v.is_valid and k + 1 not in stmt.nested)
                   for row in rows for k, v in enumerate(row[:nparams])):
                rows = [_native_params([v if v.is_valid else pa.scalar(None)
                                        for v in row[:nparams]]) for row in rows]
                columns_route = False
            elif not columns_route:
                return None
        temp = "__fsrv_insert"
        spec = []
        for f, typ in zip(target, types):
            col = f"{quote_ident(f.name)} {typ}"
            if not f.nullable:
                col += " NOT NULL"
            if f.name in defaults:
                col += " DEFAULT " + literal_sql(pa.scalar(defaults[f.name], f.type))
            spec.append(col)
        into = f"INSERT INTO {temp} ({', '.join(cols)}) "
        create = f"CREATE TEMP TABLE {temp} ({', '.join(spec)})"
        public = PublicNames([(temp, names.printed(stmt.table), False)])

        def into_temp(run) -> pa.Table:
            """``run(cursor)`` inserts into a new temporary table; its rows."""
            cur = self.engine._sandbox.cursor()
            unhook = ctx.cancel.interrupt_with(cur.interrupt) if ctx.cancel is not None \
                else (lambda: None)
            try:
                ctx.session_values(cur, stmt.sql)
                cur.execute(create)
                try:
                    run(cur)
                    return cur.sql(f"SELECT * FROM {temp}").to_arrow_table()
                except duckdb.Error as e:
                    ctx.check(stmt.sql)
                    raise sql_error(e, stmt.sql, public) from None
            finally:
                unhook()
                try:
                    cur.execute(f"DROP TABLE IF EXISTS {temp}")
                except duckdb.Error:
                    pass
                cur.close()

        if not nparams:
            # lists of whole rows, in order: about VALUES_CHUNK_ROWS rows each, as many
            # consecutive ones per part as the parts share
            parts = max(1, min(VALUES_PARTS, os.cpu_count() or 1,
                               stmt.rows // VALUES_PART_ROWS))
            chunks = split_rows(stmt.values, stmt.rows, stmt.splits,
                                -(-stmt.rows // VALUES_CHUNK_ROWS))
            parts = min(parts, len(chunks))
            share, extra = divmod(len(chunks), parts)
            bounds = [k * share + min(k, extra) for k in range(parts + 1)]

            def run_chunks(cur, texts):
                for text in texts:
                    ctx.check(stmt.sql)
                    cur.execute(into + "VALUES " + text)
            result = self._in_parts([
                lambda cur, texts=chunks[a:b]: run_chunks(cur, texts)
                for a, b in zip(bounds, bounds[1:])], into_temp)
        elif columns_route:
            source = pa.RecordBatch.from_arrays(
                params.columns[:nparams],
                names=[f"__fsrv_p{k}" for k in range(1, nparams + 1)])
            exprs = _values_as_columns(stmt.values, nparams)

            def by_columns(cur):
                cur.register("__fsrv_params", source)
                cur.execute(into + f"SELECT {exprs} FROM __fsrv_params")
            result = into_temp(by_columns)
        else:
            def by_rows(cur):
                for row in rows:
                    ctx.check(stmt.sql)
                    cur.execute(into + "VALUES " + stmt.values, row)
            result = into_temp(by_rows)
        ctx.check(stmt.sql)
        result = fit_sql_rows(result, target, table=stmt.table)
        self.append(table, result, expected_uuid=snap.manifest.table_uuid,
                    written_for=snap.manifest)
        return result.num_rows

    def _in_parts(self, runs: list, into_temp) -> pa.Table:
        """The rows of ``into_temp(run)`` for each of ``runs`` (each INSERTs consecutive
        lists of whole rows of one VALUES, in order), in order: the first on this thread,
        the others on the engine's small pool, each on its own cursor (DuckDB parses and
        binds one statement on one core; two halves can use two free cores). A part the
        pool has not started by the time this thread wants it runs here; after a part fails, the
        parts after it that have not started never run. The error raised is the one of
        the first part that failed, as one statement would have raised it."""
        if len(runs) == 1:
            return into_temp(runs[0])
        pool = self._values_pool()
        futures = [pool.submit(into_temp, run) for run in runs[1:]]
        results: list = [None] * len(runs)
        failures: list = [None] * len(runs)
        for i, run in enumerate(runs):
            try:
                if i == 0:
                    results[0] = into_temp(run)
                elif futures[i - 1].cancel():  # not started: here, unless one failed
                    if not any(failures[:i]):
                        results[i] = into_temp(run)
                else:
                    results[i] = futures[i - 1].result()
            except BaseException as exc:  # noqa: BLE001 - the first one is raised below
                failures[i] = exc
        first = next((e for e in failures if e is not None), None)
        if first is not None:
            raise first
        return pa.concat_tables(results)

    def _values_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=VALUES_PARTS - 1,
                                                thread_name_prefix="flightsrv-values")
            return self._pool

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def cast_values(tree: exp.Insert, fields: list[pa.Field], defaults: dict) -> exp.Insert:
        """A copy of ``tree`` (INSERT ... VALUES) with the i-th expression of every row cast
        to ``fields[i]``'s DuckDB type, as DuckDB's INSERT casts it; a ``DEFAULT`` there is
        the column's write default (``defaults``), else NULL. Extra values and types DuckDB
        cannot spell are left as they are."""
        from flightsrv.sql.types import duckdb_type, literal_sql

        # the type as DuckDB spells it, rendered verbatim (as cast_for_insert does)
        types = [duckdb_type(f.type) for f in fields]
        tree = tree.copy()
        for row in tree.expression.expressions:
            if not isinstance(row, exp.Tuple):
                continue
            for value, f, to in zip(list(row.expressions), fields, types):
                if isinstance(value, exp.Var) and value.name.upper() == "DEFAULT":
                    text = literal_sql(pa.scalar(defaults[f.name], f.type)) \
                        if f.name in defaults else "NULL"
                    value = value.replace(sqlglot.parse_one(text, read=st.DIALECT))
                if to is not None:
                    cast = exp.Cast(to=exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=to))
                    value.replace(cast)
                    cast.set("this", value)
        return tree

    def cast_for_insert(self, reader: pa.RecordBatchReader, columns: list[str],
                         target: pa.Schema, stmt: st.Statement, ctx: StatementContext,
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
        cur = self.engine._sandbox.cursor()
        unhook = ctx.cancel.interrupt_with(cur.interrupt) if ctx.cancel is not None \
            else (lambda: None)
        try:
            cur.register("__fsrv_insert", source)
            inner = cur.sql(f"SELECT {', '.join(select)} FROM __fsrv_insert",
                            params=params or None).to_arrow_reader(self.engine.batch_size)
        except duckdb.Error as e:
            unhook()
            cur.close()
            raise sql_error(e, stmt.sql) from None
        except BaseException:
            unhook()
            cur.close()
            raise
        batches = stream_batches(inner, cur, stmt.sql, ctx.failures, ctx.natives, ctx.cancel,
                                 unhook)
        out_schema = inner.schema
        if has_fixed_binary(target):
            # DuckDB's BLOBs into a fixed_size_binary column (any depth), length checked
            batches = (fit_sql_rows(b, target, table=stmt.table) for b in batches)
            out_schema = fit_sql_rows(inner.schema.empty_table(), target).schema
        return pa.RecordBatchReader.from_batches(out_schema, batches)

    def append(self, table, data, expected_uuid: str | None = None,
               written_for=None) -> None:
        """Append ``data``; ``expected_uuid``: the table the rows were computed for (the
        version an INSERT pinned); a table replaced since takes none of them.
        ``written_for``: that version's manifest, whose columns the rows have (a column
        changed since does not refuse them: they commit under its schema)."""
        if self.engine.committer is None:
            table.append(data, expected_uuid=expected_uuid, written_for=written_for)
        else:
            self.engine.committer.append(table, data, expected_uuid=expected_uuid,
                                         written_for=written_for)

    def create(self, stmt: st.CreateTable) -> int:
        """CREATE [OR REPLACE] TABLE: one commit (a replace swaps the whole table at once)."""
        try:
            self.engine.warehouse.create_table(stmt.table, stmt.schema, replace=stmt.replace,
                                               partition_by=list(stmt.partition_by))
        except TableExists:
            if not stmt.if_not_exists:
                raise
        return 0

    def ctas(self, stmt: st.CreateTableAs, tree: exp.Expression,
              values: list[pa.Scalar], ctx: StatementContext) -> int:
        """CREATE [OR REPLACE] TABLE ... AS: the query's rows are written first and committed
        with the new table in one commit; a query that fails (or a cancel) commits nothing
        and, for OR REPLACE, leaves the old table as it was."""
        wh = self.engine.warehouse
        if not stmt.replace and wh.exists(stmt.table):
            if stmt.if_not_exists:
                return 0
            raise TableExists("table already exists", table=stmt.table)
        _refuse_collations(stmt)

        def check(columns, types):
            for name, t in zip(columns, types):
                refused = _unstorable(t)
                if refused is not None:
                    raise SqlError(f"column {name!r} has type {refused}, which a table cannot "
                                   "store as it is; CAST it in the query (to a DECIMAL, "
                                   "VARCHAR, BLOB, ...)", statement=st._short(stmt.sql),
                                   table=stmt.table, column=name, type=str(t))

        reader = self.engine._run_query(stmt, tree, "ctas", self.engine._pinner(), values, ctx,
                                        check_types=check)
        names = _table_names(reader.schema.names)
        schema = pa.schema([f.with_nullable(True).with_name(n)
                            for f, n in zip(reader.schema, names, strict=True)])
        counter = RowCounter()
        try:
            wh.create_table(stmt.table, schema, replace=stmt.replace,
                            partition_by=list(stmt.partition_by),
                            data=pa.RecordBatchReader.from_batches(
                                schema, counter.count(reader, schema)))
        except TableExists:
            if not stmt.if_not_exists:
                raise
            return 0
        finally:
            reader.close()
        return counter.rows

    def alter(self, stmt: st.AlterTable) -> int:
        """One metadata-only change (flightsrv.table.evolution) in one commit; a DEFAULT is
        evaluated by DuckDB, cast to the column's type."""
        table = self.engine._table(stmt.table)
        try:
            return self.alter_table(table, stmt)
        except TableNotFound:
            raise
        except ConfigurationError as e:  # name the statement too (SchemaMismatch, ...)
            if "statement" in e.context:
                raise
            raise type(e)(e.message, statement=st._short(stmt.sql), **e.context) from None

    def alter_table(self, table, stmt: st.AlterTable) -> int:
        action = stmt.action
        if action == "add_column":
            if stmt.if_exists and stmt.column.lower() in \
                    {n.lower() for n in table.snapshot().schema.names}:
                return 0
            default = None
            if stmt.default is not None:
                default = self.constant(stmt.default, stmt.type, stmt, stmt.column)
            table.add_column(stmt.column, stmt.type, nullable=stmt.nullable, default=default)
        elif action == "rename_column":
            table.rename_column(stmt.column, stmt.new_name)
        elif action == "drop_column":
            if stmt.if_exists and stmt.column.lower() not in \
                    {n.lower() for n in table.snapshot().schema.names}:
                return 0
            table.drop_column(stmt.column)
        elif action == "alter_column_type":
            table.alter_column_type(stmt.column, stmt.type,
                                    check=self._widening_check(table, stmt))
        elif action == "set_partitioning":
            table.set_partitioning(list(stmt.partition_by))
        elif action == "set_properties":
            table.set_properties(**dict(stmt.properties))
        elif action == "upgrade":
            table.upgrade()
        else:
            raise SqlError("ALTER TABLE action not handled", statement=st._short(stmt.sql),
                           table=stmt.table, action=action)
        return 0

    def _widening_check(self, table, stmt: st.AlterTable):
        """The check an ALTER COLUMN ... TYPE runs against each head it commits on: every
        value stored in the column, live or deleted (a read casts every stored row), must
        take the new type as DuckDB casts it (a DATE past TIMESTAMP's range cannot). A
        file's statistics decide when both bounds are finite and cast; else the column is
        read. Files are checked once across re-tries. Nothing names a value (it may be a
        deleted row's)."""
        from flightsrv.sql.types import duckdb_type, sql_type_name
        from flightsrv.table.scan import open_parquet, read_row_group
        from flightsrv.table.schema import physical_name, type_from_json, value_from_json

        target = duckdb_type(stmt.type) or sql_type_name(stmt.type)
        checked: set[str] = set()

        def bad(cur, values: pa.Array, *, bounds: bool = False) -> bool:
            """Some value does not cast; for ``bounds``, also: a bound is infinite (an
            infinity casts, the finite values between it and the other bound may not)."""
            finite = " OR NOT isfinite(v)" if bounds and (
                pa.types.is_date(values.type) or pa.types.is_timestamp(values.type)) else ""
            cur.register("__fsrv_values", pa.table({"v": values}))
            try:
                return bool(cur.execute(
                    f"SELECT count(*) FROM __fsrv_values WHERE v IS NOT NULL AND "
                    f"(TRY_CAST(v AS {target}) IS NULL{finite})").fetchall()[0][0])
            finally:
                cur.unregister("__fsrv_values")

        def check(head) -> None:
            field = next(f for f in head.schema["fields"]
                         if f["name"].lower() == stmt.column.lower())
            cur = self.engine._sandbox.cursor()
            try:
                for f in head.data_files:
                    if f.path in checked:
                        continue
                    old = next((x for x in head.schema_by_id(f.schema_id)["fields"]
                                if x["id"] == field["id"]), None)
                    if old is None:  # the file predates the column: its default is checked
                        checked.add(f.path)
                        continue
                    old_t = type_from_json(old["type"])
                    bounds = (f.stats or {}).get(str(field["id"])) or {}
                    if "min" in bounds and "max" in bounds:
                        lo_hi = pa.array([value_from_json(bounds["min"], old_t),
                                          value_from_json(bounds["max"], old_t)], old_t)
                        # a cast's domain is a range: finite bounds that cast decide it
                        if not bad(cur, lo_hi, bounds=True):
                            checked.add(f.path)
                            continue
                    pf = open_parquet(table.store, f, table=table.name, version=head.version)
                    for rg in range(pf.metadata.num_row_groups):
                        col = read_row_group(pf, f, rg, [physical_name(old)], table=table.name,
                                             version=head.version).column(0)
                        if bad(cur, col.combine_chunks() if col.num_chunks != 1
                               else col.chunk(0)):
                            raise SqlError(
                                f"ALTER COLUMN {field['name']} TYPE {target}: a value stored "
                                "in the column (live or deleted) cannot be cast to the new "
                                "type; nothing changed", statement=st._short(stmt.sql),
                                table=table.name, column=field["name"])
                    checked.add(f.path)
            finally:
                cur.close()

        return check

    def constant(self, text: str, t: pa.DataType, stmt: st.Statement, column: str):
        """The value of a constant SQL expression cast to ``t``, computed by DuckDB in the
        database that can open no file."""
        from flightsrv.sql.types import duckdb_type

        typ = duckdb_type(t)
        expr = text if typ is None else f"CAST({text} AS {typ})"
        # the same guard and function allow-list as every other statement (the front end
        # already admits constants only; this checks DuckDB's own parse of what runs)
        guard.verify(f"SELECT {expr} AS v", [], sql=stmt.sql)
        cur = self.engine._sandbox.cursor()
        try:
            got = cur.sql(f"SELECT {expr} AS v").to_arrow_table()
        except duckdb.Error as e:
            raise SqlError.from_engine(f"bad DEFAULT for column {column}: "
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
        try:
            value.as_py()  # rows written later take it as a Python value
        except (OverflowError, ValueError):
            raise SqlError(f"DEFAULT {text} is not supported for "
                           f"column {column}: a default must be a finite date or timestamp "
                           "within the years 1-9999 (add the column without DEFAULT and set "
                           "it with UPDATE)", statement=st._short(stmt.sql),
                           column=column, type=str(t)) from None
        # the Arrow scalar, typed: a UBIGINT past int64 is stored from its own type
        return value if value.is_valid else None


    def ingest(self, table: str, mode: IngestMode, data: pa.RecordBatchReader,
               session: Session, *, cancel: Cancel | None = None) -> int:
        if session.role == Role.READER:
            raise PermissionDenied("read-only session may not ingest", user=session.user,
                                   table=table)
        wh = self.engine.warehouse
        counter = RowCounter()
        stream = pa.RecordBatchReader.from_batches(data.schema, counter.count(data))
        if mode == IngestMode.APPEND or (mode == IngestMode.CREATE_APPEND
                                         and wh.exists(table)):
            self.append(wh.table(table), stream)
        else:
            # a new table takes its rows in its creating commit: an upload that fails or is
            # cancelled part way commits nothing (and a REPLACE leaves the old table whole)
            wh.create_table(table, data.schema, replace=mode == IngestMode.REPLACE,
                            data=stream)
        return counter.rows


#: DuckDB types whose values a table column would change (CREATE TABLE refuses them too):
#: Arrow carries UHUGEINT as DECIMAL(38,0) (values from 2^127 on wrap negative), TIME WITH
#: TIME ZONE without its offset, BIT as its bytes, BIGNUM as bytes. (HUGEINT, a sum of
#: integers, is stored as DECIMAL(38,0), which holds every HUGEINT value; JSON and UUID as
#: their text; ENUM as VARCHAR; a fixed-size ARRAY as a list: docs/TYPES.md.)
_UNSTORABLE = frozenset({"UHUGEINT", "TIME WITH TIME ZONE", "BIT", "BIGNUM", "VARINT"})


def _values_as_columns(values: str, nparams: int) -> str:
    """The one row of a fast-path VALUES text (``($1, $2 + 1)``) as a select list over the
    parameter columns (``"__fsrv_p1", "__fsrv_p2" + 1``): every ``$n`` outside a string
    becomes its column (the text was scanned by :mod:`flightsrv.sql.values`, so a ``$``
    outside a string is always a parameter)."""
    import re

    inner = values.strip()[1:-1]
    return re.sub(r"'(?:[^']|'')*'|\$(\d+)",
                  lambda m: m.group(0) if m.group(1) is None
                  else f'"__fsrv_p{int(m.group(1))}"', inner)


#: clauses whose COLLATE decides a comparison only: what they compute is no result column
_COMPARING_CLAUSES = frozenset({"where", "order", "group", "having", "qualify", "on",
                                "using"})


def _refuse_collations(stmt: st.CreateTableAs) -> None:
    """Refuse a CREATE TABLE ... AS whose query may give a column a collation (a COLLATE
    outside WHERE, ORDER BY, GROUP BY, HAVING, QUALIFY and join conditions): DuckDB's table
    keeps it (``s = 'ABC'`` then matches 'abc'), a flightsrv table stores none, so reads
    would answer differently; CREATE TABLE refuses COLLATE too."""
    for node in stmt.tree.find_all(exp.Collate):
        up, keys = node, []
        while up is not None:
            keys.append(up.arg_key)
            up = up.parent
        if not _COMPARING_CLAUSES.intersection(keys):
            raise SqlError("a column with a collation (COLLATE) cannot be stored: a table "
                           "keeps no collation; apply COLLATE in the queries that read it",
                           statement=st._short(stmt.sql), table=stmt.table,
                           collate=node.sql(dialect="duckdb"))


def _unstorable(t) -> str | None:
    """The first DuckDB type in ``t`` (a ``DuckDBPyType``, nested fields included) that a
    table cannot store as it is, or None."""
    if t.id in ("struct", "list", "array", "map", "union"):
        for _, child in t.children:
            if not isinstance(child, int):
                found = _unstorable(child)
                if found is not None:
                    return found
        return None
    name = str(t)
    return name if name in _UNSTORABLE else None


def _table_names(names: list[str]) -> list[str]:
    """The column names a table created from a result with these names gets: DuckDB's, which
    renames a repeated name (``x, X, x`` -> ``x, X_1, x_2``; a join's ``SELECT *``), as it
    does for a subquery's columns, so asked of DuckDB that way."""
    if len({n.lower() for n in names}) == len(names):
        return list(names)
    import duckdb

    cols = ", ".join(f'NULL AS "{n.replace(chr(34), chr(34) * 2)}"' for n in names)
    with duckdb.connect(":memory:") as con:
        return con.sql(f"SELECT * FROM (SELECT {cols})").columns

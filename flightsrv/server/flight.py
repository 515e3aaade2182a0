"""The Flight SQL server: wire protocol in, ``Engine`` calls out.

Spec: https://arrow.apache.org/docs/format/FlightSql.html. The server knows nothing of
tables or SQL; it decodes commands (``proto``), asks the ``Engine`` (flightsrv.engine.api)
and streams the answer. Behaviour worth knowing:

- **Tickets are self-contained**: a query ticket carries the SQL (and bound parameters as
  Arrow IPC); a metadata ticket is the command itself. Any server instance can serve any
  ticket, and nothing is kept between GetFlightInfo and DoGet.
- **Prepared statements** live in a bounded, expiring table (``max_prepared``,
  ``prepared_ttl_s`` idle time); an unknown or expired handle is NOT_FOUND.
- **DML through a query path** (ADBC prepares every statement and then calls
  GetFlightInfo(CommandPreparedStatementQuery)): when the engine classifies the statement
  as an UPDATE it runs during GetFlightInfo, the row count goes into
  ``FlightInfo.total_records``, and the ticket's DoGet returns an empty result.
- **Results stream** batch by batch from the engine's RecordBatchReader through a
  ``GeneratorStream``; the stream stops early when the client goes away or the FlightInfo
  is cancelled (CancelFlightInfo, best effort).
- **Sessions** (``api.Session``) are per gRPC connection (peer address) and user, held in a
  bounded, expiring table; CloseSession drops them.
- **Errors** are mapped by ``status.to_flight_error``; the server stays up after any error.
- One catalog (``flightsrv``) with one schema (``main``); transactions are unsupported.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

import pyarrow as pa
from pyarrow import flight

from flightsrv import errors
from flightsrv.engine.api import Engine, IngestMode, Prepared, Role, Session, StatementKind
from flightsrv.runtime import Runtime
from flightsrv.server import metadata as md
from flightsrv.server import proto
from flightsrv.server.auth import (
    MIDDLEWARE_KEY,
    AuthConfig,
    AuthMiddlewareFactory,
    HandshakeHandler,
    principal_of,
)
from flightsrv.server.status import (
    invalid,
    not_found,
    short_sql,
    to_flight_error,
    unimplemented,
)

log = logging.getLogger("flightsrv.server")
log.addHandler(logging.NullHandler())

SERVER_VERSION = "0.1.0"
EMPTY_SCHEMA = pa.schema([])
_TICKET_MAGIC = b"FSQT1"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ExpiringTable(Generic[K, V]):
    """A thread-safe LRU map whose entries also expire after ``ttl_ms`` without use."""

    def __init__(self, max_entries: int, ttl_ms: int, now_ms: Callable[[], int]):
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._max, self._ttl, self._now = max_entries, ttl_ms, now_ms
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        now = self._now()
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            if hit[1] + self._ttl < now:
                del self._data[key]
                return None
            self._data[key] = (hit[0], now)
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V) -> None:
        now = self._now()
        with self._lock:
            self._data[key] = (value, now)
            self._data.move_to_end(key)
            while len(self._data) > self._max:
                self._data.popitem(last=False)
            # drop expired entries from the cold end
            while self._data:
                oldest = next(iter(self._data.values()))
                if oldest[1] + self._ttl >= now:
                    break
                self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            hit = self._data.pop(key, None)
            return hit[0] if hit else None

    def pop_where(self, pred: Callable[[K], bool]) -> int:
        with self._lock:
            doomed = [k for k in self._data if pred(k)]
            for k in doomed:
                del self._data[k]
            return len(doomed)

    def __len__(self) -> int:
        return len(self._data)


@dataclass
class _PreparedEntry:
    prepared: Prepared
    user: str
    params: pa.RecordBatch | None = None


@dataclass
class TlsConfig:
    cert_path: str
    key_path: str


@dataclass
class _Call:
    method: str
    peer: str
    user: str
    statement: str | None = None
    table: str | None = None
    command: str | None = None


def _rpc(method: str):
    """Wrap a handler: log it, and raise failures as deliberate Flight errors."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(self: FlightSqlServer, context, *args):
            call = _Call(method, context.peer(), principal_of(context).user)
            self._local.call = call
            start = time.perf_counter()
            try:
                result = fn(self, context, *args)
            except BaseException as exc:  # noqa: BLE001 - mapped below
                err = to_flight_error(exc, statement=call.statement, table=call.table)
                self._log_call(call, start, error=err)
                raise err.with_traceback(None) from None
            self._log_call(call, start)
            return result

        return wrapper

    return deco


class FlightSqlServer(flight.FlightServerBase):
    """Arrow Flight SQL over an ``Engine``. Serving starts on construction."""

    def __init__(
        self,
        engine: Engine,
        location: str = "grpc://127.0.0.1:0",
        *,
        auth: AuthConfig | None = None,
        tls: TlsConfig | None = None,
        runtime: Runtime | None = None,
        read_only: bool = False,
        max_prepared: int = 10_000,
        prepared_ttl_s: int = 3600,
        max_sessions: int = 10_000,
        session_ttl_s: int = 8 * 3600,
        **kwargs,
    ):
        self._engine = engine
        self._runtime = runtime or Runtime()
        clock = self._runtime.clock
        middleware = {MIDDLEWARE_KEY: AuthMiddlewareFactory(auth, clock)} if auth else {}
        tls_certificates = []
        if tls is not None:
            with open(tls.cert_path, "rb") as c, open(tls.key_path, "rb") as k:
                tls_certificates = [(c.read(), k.read())]
            if location.startswith(("grpc://", "grpc+tcp://")):
                location = "grpc+tls://" + location.split("://", 1)[1]
        self._local = threading.local()
        self._prepared: ExpiringTable[bytes, _PreparedEntry] = ExpiringTable(
            max_prepared, prepared_ttl_s * 1000, clock.now_ms
        )
        self._sessions: ExpiringTable[tuple[str, str], Session] = ExpiringTable(
            max_sessions, session_ttl_s * 1000, clock.now_ms
        )
        self._sessions_lock = threading.Lock()
        # tickets being streamed -> cancel event; tickets cancelled before their DoGet
        self._streams: dict[bytes, threading.Event] = {}
        self._streams_lock = threading.Lock()
        self._cancelled: ExpiringTable[bytes, bool] = ExpiringTable(
            10_000, 3600 * 1000, clock.now_ms
        )
        self._sql_info = md.sql_info_values(SERVER_VERSION, read_only=read_only)
        if auth is not None:
            kwargs.setdefault("auth_handler", HandshakeHandler())
        super().__init__(
            location, middleware=middleware, tls_certificates=tls_certificates, **kwargs
        )

    # -- plumbing ----------------------------------------------------------------------

    def _log_call(self, call: _Call, start: float, error: BaseException | None = None):
        fields = {
            "event": "rpc",
            "method": call.method,
            "command": call.command,
            "peer": call.peer,
            "user": call.user,
            "statement": short_sql(call.statement),
            "table": call.table,
            "duration_ms": round((time.perf_counter() - start) * 1000, 3),
        }
        if error is None:
            log.info("rpc ok", extra={"fields": fields})
        else:
            fields["error"] = f"{type(error).__name__}: {error}"
            log.warning("rpc failed", extra={"fields": fields})

    def _note(self, **fields) -> None:
        call = getattr(self._local, "call", None)
        if call is not None:
            for k, v in fields.items():
                setattr(call, k, v)

    def _session(self, context) -> Session:
        principal = principal_of(context)
        key = (context.peer(), principal.user)
        with self._sessions_lock:
            session = self._sessions.get(key)
            if session is None:
                session = Session(
                    session_id=self._runtime.ids.new_id(),
                    user=principal.user,
                    role=principal.role,
                )
                self._sessions.put(key, session)
        session.role = principal.role
        return session

    def _command(self, descriptor: flight.FlightDescriptor):
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise invalid("flightsrv only serves Flight SQL command descriptors",
                          path=descriptor.path)  # fmt: skip
        cmd = proto.unpack(descriptor.command)
        self._note(command=proto.arrow_name(cmd))
        return cmd

    def _lookup(self, handle: bytes, context) -> _PreparedEntry:
        entry = self._prepared.get(handle)
        if entry is None or entry.user != principal_of(context).user:
            raise not_found("unknown or expired prepared statement handle",
                            handle=handle.hex()[:16])  # fmt: skip
        self._note(statement=entry.prepared.sql)
        return entry

    @staticmethod
    def _no_transaction(msg) -> None:
        if msg.HasField("transaction_id"):
            raise invalid("transactions are not supported", transaction_id=msg.transaction_id)

    # -- tickets -----------------------------------------------------------------------

    @staticmethod
    def _query_ticket(sql: str, params: pa.RecordBatch | None) -> bytes:
        payload = {"k": "query", "sql": sql}
        if params is not None:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, params.schema) as w:
                w.write_batch(params)
            payload["params"] = base64.b64encode(sink.getvalue().to_pybytes()).decode()
        handle = _TICKET_MAGIC + json.dumps(payload).encode()
        return proto.pack(proto.TicketStatementQuery(statement_handle=handle))

    @staticmethod
    def _count_ticket(count: int) -> bytes:
        handle = _TICKET_MAGIC + json.dumps({"k": "count", "n": count}).encode()
        return proto.pack(proto.TicketStatementQuery(statement_handle=handle))

    @staticmethod
    def _decode_ticket(handle: bytes) -> dict:
        if not handle.startswith(_TICKET_MAGIC):
            raise invalid("ticket was not issued by flightsrv")
        try:
            payload = json.loads(handle[len(_TICKET_MAGIC) :])
            if "params" in payload:
                raw = base64.b64decode(payload["params"])
                payload["params"] = pa.ipc.open_stream(raw).read_next_batch()
            return payload
        except (ValueError, pa.ArrowException) as exc:
            raise invalid(f"malformed ticket: {exc}") from None

    def _info(self, descriptor, schema: pa.Schema, ticket: bytes, total_records: int = -1):
        endpoint = flight.FlightEndpoint(flight.Ticket(ticket), [])
        return flight.FlightInfo(schema, descriptor, [endpoint], total_records, -1)

    # -- GetFlightInfo / GetSchema -----------------------------------------------------

    @_rpc("GetFlightInfo")
    def get_flight_info(self, context, descriptor):
        cmd = self._command(descriptor)
        session = self._session(context)
        if isinstance(cmd, proto.CommandStatementQuery):
            self._no_transaction(cmd)
            self._note(statement=cmd.query)
            prepared = self._engine.prepare(cmd.query, session)
            return self._query_info(descriptor, prepared, None, session)
        if isinstance(cmd, proto.CommandPreparedStatementQuery):
            entry = self._lookup(cmd.prepared_statement_handle, context)
            return self._query_info(descriptor, entry.prepared, entry.params, session)
        schema = self._metadata_schema(cmd)
        return self._info(descriptor, schema, descriptor.command)

    def _query_info(self, descriptor, prepared: Prepared, params, session: Session):
        if prepared.kind == StatementKind.UPDATE:
            count = self._run_update(prepared.sql, session, params)
            return self._info(descriptor, EMPTY_SCHEMA, self._count_ticket(count), count)
        ticket = self._query_ticket(prepared.sql, params)
        return self._info(descriptor, prepared.dataset_schema, ticket)

    def _run_update(self, sql: str, session: Session, params: pa.RecordBatch | None) -> int:
        if params is not None and params.num_rows == 0:
            return 0  # executemany over no rows
        count = self._engine.execute_update(sql, session, params)
        return -1 if count is None else int(count)

    @_rpc("GetSchema")
    def get_schema(self, context, descriptor):
        cmd = self._command(descriptor)
        if isinstance(cmd, proto.CommandStatementQuery):
            self._no_transaction(cmd)
            self._note(statement=cmd.query)
            prepared = self._engine.prepare(cmd.query, self._session(context))
            return flight.SchemaResult(prepared.dataset_schema)
        if isinstance(cmd, proto.CommandPreparedStatementQuery):
            entry = self._lookup(cmd.prepared_statement_handle, context)
            return flight.SchemaResult(entry.prepared.dataset_schema)
        return flight.SchemaResult(self._metadata_schema(cmd))

    def _metadata_schema(self, cmd) -> pa.Schema:
        if isinstance(cmd, proto.CommandGetSqlInfo):
            return md.SQL_INFO_SCHEMA
        if isinstance(cmd, proto.CommandGetXdbcTypeInfo):
            return md.XDBC_TYPE_INFO_SCHEMA
        if isinstance(cmd, proto.CommandGetCatalogs):
            return md.CATALOGS_SCHEMA
        if isinstance(cmd, proto.CommandGetDbSchemas):
            return md.DB_SCHEMAS_SCHEMA
        if isinstance(cmd, proto.CommandGetTables):
            return md.TABLES_SCHEMA_WITH_SCHEMA if cmd.include_schema else md.TABLES_SCHEMA
        if isinstance(cmd, proto.CommandGetTableTypes):
            return md.TABLE_TYPES_SCHEMA
        if isinstance(cmd, proto.CommandGetPrimaryKeys):
            return md.PRIMARY_KEYS_SCHEMA
        if isinstance(cmd, (proto.CommandGetExportedKeys, proto.CommandGetImportedKeys,
                            proto.CommandGetCrossReference)):  # fmt: skip
            return md.FOREIGN_KEYS_SCHEMA
        if isinstance(cmd, proto.CommandStatementSubstraitPlan):
            raise unimplemented("Substrait plans are not supported")
        raise invalid(f"{proto.arrow_name(cmd)} is not valid for GetFlightInfo/GetSchema "
                      "(updates and ingest go through DoPut)")  # fmt: skip

    # -- DoGet -------------------------------------------------------------------------

    @_rpc("DoGet")
    def do_get(self, context, ticket):
        raw = ticket.ticket
        cmd = proto.unpack(raw)
        self._note(command=proto.arrow_name(cmd))
        if isinstance(cmd, proto.TicketStatementQuery):
            payload = self._decode_ticket(cmd.statement_handle)
            if payload.get("k") == "count":
                return flight.RecordBatchStream(EMPTY_SCHEMA.empty_table())
            sql = payload["sql"]
            self._note(statement=sql)
            if self._cancelled.pop(raw):
                raise flight.FlightCancelledError(f"query was cancelled (statement={sql!r})")
            result = self._engine.execute_query(sql, self._session(context),
                                                payload.get("params"))  # fmt: skip
            return flight.GeneratorStream(result.schema,
                                          self._stream(result.reader, context, raw, sql))  # fmt: skip
        table = self._metadata_table(cmd)
        return flight.RecordBatchStream(table)

    def _stream(self, reader: pa.RecordBatchReader, context, ticket: bytes, sql: str):
        cancel = threading.Event()
        with self._streams_lock:
            self._streams[ticket] = cancel
        rows = batches = 0
        try:
            while True:
                if cancel.is_set() or context.is_cancelled():
                    log.info("stream stopped", extra={"fields": {
                        "event": "stream_stopped", "statement": short_sql(sql),
                        "rows": rows, "batches": batches}})  # fmt: skip
                    return
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except Exception as exc:  # noqa: BLE001 - mapped for the client
                    raise to_flight_error(exc, statement=sql).with_traceback(None) from None
                rows += batch.num_rows
                batches += 1
                yield batch
        finally:
            with self._streams_lock:
                self._streams.pop(ticket, None)
            try:
                reader.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.debug("closing a result reader failed: %s", exc)

    def _metadata_table(self, cmd) -> pa.Table:
        if isinstance(cmd, proto.CommandGetSqlInfo):
            return md.sql_info_table(self._sql_info, list(cmd.info))
        if isinstance(cmd, proto.CommandGetXdbcTypeInfo):
            return md.xdbc_type_info(cmd.data_type if cmd.HasField("data_type") else None)
        if isinstance(cmd, proto.CommandGetCatalogs):
            return pa.table({"catalog_name": [md.CATALOG]}, schema=md.CATALOGS_SCHEMA)
        if isinstance(cmd, proto.CommandGetDbSchemas):
            ok = self._catalog_ok(cmd, "catalog") and md.matches(
                md.like_to_regex(self._opt(cmd, "db_schema_filter_pattern")), md.DB_SCHEMA
            )
            rows = [{"catalog_name": md.CATALOG, "db_schema_name": md.DB_SCHEMA}] if ok else []
            return pa.Table.from_pylist(rows, schema=md.DB_SCHEMAS_SCHEMA)
        if isinstance(cmd, proto.CommandGetTables):
            return self._tables(cmd)
        if isinstance(cmd, proto.CommandGetTableTypes):
            return pa.table({"table_type": list(md.TABLE_TYPES)}, schema=md.TABLE_TYPES_SCHEMA)
        # No keys exist in this format: empty results with the schema the spec asks for.
        return self._metadata_schema(cmd).empty_table()

    @staticmethod
    def _opt(msg, name: str) -> str | None:
        return getattr(msg, name) if msg.HasField(name) else None

    def _catalog_ok(self, msg, name: str) -> bool:
        catalog = self._opt(msg, name)
        return catalog is None or catalog == md.CATALOG

    def _tables(self, cmd) -> pa.Table:
        schema = md.TABLES_SCHEMA_WITH_SCHEMA if cmd.include_schema else md.TABLES_SCHEMA
        types_ok = not cmd.table_types or any(t in md.TABLE_TYPES for t in cmd.table_types)
        schema_ok = md.matches(
            md.like_to_regex(self._opt(cmd, "db_schema_filter_pattern")), md.DB_SCHEMA
        )
        if not (types_ok and schema_ok and self._catalog_ok(cmd, "catalog")):
            return schema.empty_table()
        name_re = md.like_to_regex(self._opt(cmd, "table_name_filter_pattern"))
        rows = []
        for name in sorted(self._engine.list_tables()):
            if not md.matches(name_re, name):
                continue
            row = {"catalog_name": md.CATALOG, "db_schema_name": md.DB_SCHEMA,
                   "table_name": name, "table_type": "TABLE"}  # fmt: skip
            if cmd.include_schema:
                try:
                    table_schema = self._engine.table_schema(name)
                except errors.TableNotFound:
                    continue  # dropped since list_tables
                annotated = md.annotate_table_schema(table_schema, name)
                row["table_schema"] = annotated.serialize().to_pybytes()
            rows.append(row)
        return pa.Table.from_pylist(rows, schema=schema)

    # -- DoPut -------------------------------------------------------------------------

    @_rpc("DoPut")
    def do_put(self, context, descriptor, reader, writer):
        cmd = self._command(descriptor)
        session = self._session(context)
        if isinstance(cmd, proto.CommandStatementUpdate):
            self._no_transaction(cmd)
            self._note(statement=cmd.query)
            count = self._run_update(cmd.query, session, None)
            self._write_count(writer, count)
        elif isinstance(cmd, proto.CommandPreparedStatementQuery):
            entry = self._lookup(cmd.prepared_statement_handle, context)
            entry.params = self._read_params(reader)
        elif isinstance(cmd, proto.CommandPreparedStatementUpdate):
            entry = self._lookup(cmd.prepared_statement_handle, context)
            params = self._read_params(reader)
            if params is None:
                params = entry.params
            count = self._run_update(entry.prepared.sql, session, params)
            self._write_count(writer, count)
        elif isinstance(cmd, proto.CommandStatementIngest):
            self._write_count(writer, self._ingest(cmd, session, reader))
        else:
            raise invalid(f"{proto.arrow_name(cmd)} is not valid for DoPut")

    @staticmethod
    def _write_count(writer, count: int) -> None:
        result = proto.DoPutUpdateResult(record_count=count).SerializeToString()
        writer.write(pa.py_buffer(result))

    @staticmethod
    def _read_params(reader) -> pa.RecordBatch | None:
        """Bound parameters as one batch; union columns (flightsql-dbapi) made plain."""
        table = reader.read_all()
        if table.num_columns == 0:
            return None
        columns = []
        for column in table.columns:
            if pa.types.is_union(column.type):
                column = pa.array(column.to_pylist())
            else:
                column = column.combine_chunks()
            columns.append(column)
        return pa.RecordBatch.from_arrays(columns, names=table.column_names)

    def _ingest(self, cmd, session: Session, reader) -> int:
        table = cmd.table
        self._note(table=table)
        if not table:
            raise invalid("ingest needs a table name")
        self._no_transaction(cmd)
        if cmd.temporary:
            raise unimplemented("temporary tables are not supported", table=table)
        for field_name, expected in (("catalog", md.CATALOG), ("schema", md.DB_SCHEMA)):
            given = self._opt(cmd, field_name)
            if given not in (None, "", expected):
                raise invalid(f"unknown {field_name} (only {expected!r} exists)",
                              **{field_name: given}, table=table)  # fmt: skip
        if session.role != Role.WRITER:
            raise flight.FlightUnauthorizedError(
                f"role {session.role.value} may not ingest (user={session.user} table={table})"
            )
        mode = self._ingest_mode(cmd, table)
        return int(self._engine.ingest(table, mode, reader.to_reader(), session))

    def _ingest_mode(self, cmd, table: str) -> IngestMode:
        opts = cmd.table_definition_options
        not_exist = proto.TableNotExistOption(opts.if_not_exist)
        exists = proto.TableExistsOption(opts.if_exists)
        N, E = proto.TableNotExistOption, proto.TableExistsOption
        table_known = None
        if not_exist == N.CREATE and exists == E.FAIL:
            return IngestMode.CREATE
        if not_exist == N.FAIL and exists == E.APPEND:
            return IngestMode.APPEND
        if not_exist == N.CREATE and exists == E.APPEND:
            return IngestMode.CREATE_APPEND
        if exists == E.REPLACE and not_exist in (N.CREATE, N.FAIL):
            if not_exist == N.FAIL:
                table_known = table in self._engine.list_tables()
                if not table_known:
                    raise errors.TableNotFound("ingest with if_not_exist=FAIL", table=table)
            return IngestMode.REPLACE
        raise invalid("unsupported ingest table_definition_options",
                      if_not_exist=not_exist.name, if_exists=exists.name, table=table)  # fmt: skip

    # -- DoAction ----------------------------------------------------------------------

    _ACTIONS: ClassVar[dict[str, str]] = {
        "CreatePreparedStatement": "Create a prepared statement (ActionCreatePreparedStatement"
        "Request -> ActionCreatePreparedStatementResult)",
        "ClosePreparedStatement": "Close a prepared statement",
        "CancelFlightInfo": "Cancel a query's streams (best effort)",
        "CancelQuery": "Cancel a query (deprecated; same as CancelFlightInfo)",
        "CloseSession": "Close this connection's session",
    }

    def list_actions(self, context):
        return list(self._ACTIONS.items())

    @_rpc("DoAction")
    def do_action(self, context, action):
        kind = action.type
        self._note(command=kind)
        body = action.body.to_pybytes() if action.body is not None else b""
        if kind == "CreatePreparedStatement":
            req = proto.unpack(body)
            if not isinstance(req, proto.ActionCreatePreparedStatementRequest):
                raise invalid(f"CreatePreparedStatement got {proto.arrow_name(req)}")
            self._no_transaction(req)
            self._note(statement=req.query)
            return [flight.Result(self._create_prepared(req.query, context))]
        if kind == "ClosePreparedStatement":
            req = proto.unpack(body)
            if not isinstance(req, proto.ActionClosePreparedStatementRequest):
                raise invalid(f"ClosePreparedStatement got {proto.arrow_name(req)}")
            self._prepared.pop(req.prepared_statement_handle)
            return []
        if kind == "CancelFlightInfo":
            req = proto.parse(proto.CancelFlightInfoRequest, body)
            status = self._cancel(req.info)
            return [flight.Result(proto.CancelFlightInfoResult(status=status).SerializeToString())]
        if kind == "CancelQuery":
            req = proto.unpack(body)
            status = self._cancel(req.info)
            return [flight.Result(proto.pack(proto.ActionCancelQueryResult(result=status)))]
        if kind == "CloseSession":
            peer = context.peer()
            self._sessions.pop_where(lambda key: key[0] == peer)
            result = proto.CloseSessionResult(status=proto.CloseSessionStatus.CLOSED)
            return [flight.Result(result.SerializeToString())]
        if kind in ("BeginTransaction", "EndTransaction", "BeginSavepoint", "EndSavepoint"):
            raise unimplemented("transactions are not supported", action=kind)
        raise unimplemented("unknown action", action=kind)

    def _create_prepared(self, sql: str, context) -> bytes:
        prepared = self._engine.prepare(sql, self._session(context))
        handle = self._runtime.ids.new_id().encode()
        self._prepared.put(handle, _PreparedEntry(prepared, principal_of(context).user))
        dataset = prepared.dataset_schema if prepared.kind == StatementKind.QUERY else EMPTY_SCHEMA
        params = prepared.parameter_schema
        result = proto.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle,
            dataset_schema=dataset.serialize().to_pybytes(),
            parameter_schema=params.serialize().to_pybytes() if len(params) else b"",
        )
        return proto.pack(result)

    def _cancel(self, info_bytes: bytes) -> int:
        try:
            info = flight.FlightInfo.deserialize(info_bytes)
        except Exception:  # noqa: BLE001 - any parse failure is a bad request
            raise invalid("CancelFlightInfo needs a serialized FlightInfo") from None
        status = proto.CancelStatus.NOT_CANCELLABLE
        for endpoint in info.endpoints:
            raw = endpoint.ticket.ticket
            with self._streams_lock:
                event = self._streams.get(raw)
            if event is not None:
                event.set()
            else:
                self._cancelled.put(raw, True)
            status = proto.CancelStatus.CANCELLED
        return int(status)

"""The Flight SQL server: wire protocol in, ``Engine`` calls out.

Spec: https://arrow.apache.org/docs/format/FlightSql.html. The server knows nothing of
tables or SQL; it decodes commands (``proto``), asks the ``Engine`` (flightsrv.engine.api)
and streams the answer. The guarantees it keeps:

- **Side effects happen exactly once, at the request that carries them.** A statement the
  engine marks ``Prepared.effects`` (DML, DDL, maintenance, SET) runs during GetFlightInfo
  (CommandStatementQuery / CommandPreparedStatementQuery) or DoPut (CommandStatementUpdate,
  CommandPreparedStatementUpdate, ingest), never in DoGet. An update's row count is
  ``FlightInfo.total_records`` and its ticket yields an empty result; a statement that
  returns a table (OPTIMIZE, VACUUM, PURGE) has it kept server-side behind a single-use
  ticket that expires (``result_ttl_s``): redeeming it again is NOT_FOUND, never a second
  run. GetSchema only prepares. Pure SELECTs run lazily in DoGet and stream.
- **Tickets** are HMAC-signed and bound to the principal and an expiry (``tickets``).
- **Per-principal state** (prepared statements, sessions, kept results) lives in separate
  bounded tables per principal (``limits``); nobody can see, close or evict another's.
  Sessions are per (principal, gRPC connection) and are only kept for connections that
  ran SET; CloseSession drops the caller's own; a session whose connection closed is
  released when its principal's table is full, and any idle one after ``session_ttl_s``.
- **Admission**: every statement, and every prepare, holds one of its principal's
  ``max_concurrent_queries`` slots, waiting for one in a FIFO queue (``limits``) within
  its deadline; a principal holds at most ``max_open_puts`` DoPut streams open, and a
  stream over that waits for one to close in the same kind of FIFO queue (within the
  statement deadline, ``max_queued_queries`` waiting at most).
- **Every statement** gets a ``Cancel`` (``calls``): tripped at ``--query-timeout`` or the
  session's ``statement_timeout`` (DEADLINE_EXCEEDED), when the client cancels the call or
  goes away, or by CancelFlightInfo / CancelQuery of its ticket (CANCELLED).
- **Errors** are mapped by ``status.to_flight_error`` and reach the client with no stack
  trace (``status.frameless_tracebacks``; the entry points re-raise from a neutral frame
  as well); the server stays up after any error.
- One catalog (``flightsrv``) with one schema (``main``); transactions are unsupported.

Dispatch is by table: ``commands.METADATA`` for metadata commands, ``_STATEMENT_INFO`` for
the statement commands of GetFlightInfo, ``_PUT`` for DoPut and ``_ACTIONS`` for DoAction.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
from cachetools import TTLCache
from pyarrow import flight

from flightsrv import errors
from flightsrv.engine.api import (
    Cancel,
    Engine,
    ExecInfo,
    Prepared,
    QueryResult,
    Role,
    Session,
    StatementKind,
)
from flightsrv.runtime import Runtime
from flightsrv.server import broker, commands, ingest, proto
from flightsrv.server.busy import BusyBoard, CountedSlots
from flightsrv.server import metadata as md
from flightsrv.server.auth import (
    MIDDLEWARE_KEY,
    AuthConfig,
    AuthMiddlewareFactory,
    HandshakeHandler,
    Principal,
    TokenIssuer,
    principal_of,
)
from flightsrv.server.calls import Call, CallTracker, client_gone, connection_open
from flightsrv.server.early import EarlyRun
from flightsrv.server.config import ServerConfig
from flightsrv.server.limits import Concurrency, PerPrincipal
from flightsrv.server.logs import StatementText
from flightsrv.server.metrics import Metrics
from flightsrv.server.relay import client_peer
from flightsrv.server.status import (
    Draining,
    NotFound,
    Scrubber,
    frameless_tracebacks,
    grpc_status_name,
    invalid,
    neutral_entry,
    neutral_stream,
    to_flight_error,
    unimplemented,
)
from flightsrv.sql.statements import SESSION_SETTINGS
from flightsrv.server.tickets import (ForeignTicket, TicketCodec, derive_key, schema_digest,
                                     seal, unseal)

log = logging.getLogger("flightsrv.server")
log.addHandler(logging.NullHandler())

SERVER_VERSION = "0.1.0"
EMPTY_SCHEMA = pa.schema([])


#: the largest record batch sent as one gRPC message: clients refuse bigger messages by
#: default (ADBC's Go driver and grpc-java at 16 MiB), so DuckDB's 122,880-row batches of
#: wide rows are sent in slices (zero-copy; the IPC writer sends only the sliced bytes)
MAX_SEND_BATCH_BYTES = 8 * 1024 * 1024

#: a query result up to this size is read whole before DoGet answers (one table for
#: pyarrow to send); a larger one streams as DuckDB produces it, from its first batches on
EAGER_RESULT_BYTES = 1024 * 1024

#: a prepared query run early (from its DoPut bind, ``server/early.py``) that no DoGet has
#: claimed within this many seconds is dropped: its slot, cursor and first batches go back
#: (ADBC and JDBC send the bind, GetFlightInfo and DoGet back to back)
EARLY_CLAIM_S = 5.0


def sized(batch: pa.RecordBatch, limit: int = MAX_SEND_BATCH_BYTES) -> Iterator[pa.RecordBatch]:
    """``batch`` as slices of at most about ``limit`` bytes each (by its average row size;
    a single row larger than the limit is sent alone)."""
    size = batch.nbytes
    if size <= limit or batch.num_rows <= 1:
        yield batch
        return
    pieces = -(-size // limit)
    rows = max(1, -(-batch.num_rows // pieces))
    for start in range(0, batch.num_rows, rows):
        piece = batch.slice(start, rows)
        if piece.nbytes > limit and piece.num_rows > 1:  # skewed rows: split further
            yield from sized(piece, limit)
        else:
            yield piece


def _sized_table(table: pa.Table) -> pa.Table:
    """``table`` re-chunked so no batch exceeds :data:`MAX_SEND_BATCH_BYTES` (zero-copy)."""
    if all(b.nbytes <= MAX_SEND_BATCH_BYTES for b in table.to_batches()):
        return table
    return pa.Table.from_batches([p for b in table.to_batches() for p in sized(b)],
                                 schema=table.schema)


@dataclass
class TlsConfig:
    cert_path: str
    key_path: str


#: prepared handles behind ``--workers`` name their statement up to this many characters
#: (a longer one gets a plain handle, valid on its worker only)
_PORTABLE_SQL = 16 << 10
_HANDLE_MAGIC = b"FSQH1"


#: Flight session options every session has: ADBC reads its current catalog and schema
#: from them (``adbc_current_catalog``), and may set them to these values only
_FIXED_SESSION_OPTIONS = {"catalog": "flightsrv", "schema": "main"}


def _option_text(value) -> tuple[str | None, str | None]:
    """A ``SessionOptionValue`` as the text ``SET`` would read, and which kind it is (None,
    None: valueless, i.e. unset; None for a list, which no option takes)."""
    for kind in ("string_value", "bool_value", "int64_value", "double_value"):
        if value.HasField(kind):
            v = getattr(value, kind)
            return (str(v).lower() if kind == "bool_value" else str(v)), kind
    if value.HasField("string_list_value"):
        return None, "string_list_value"
    return None, None


def _digest(handle: bytes) -> str:
    """A prepared handle's name in a notice to the other workers."""
    return hashlib.blake2b(handle, digest_size=16).hexdigest()


@dataclass
class _PreparedEntry:
    prepared: Prepared
    params: pa.RecordBatch | None = None
    early: EarlyRun | None = None  # the run of ``params`` started at their bind


def _query(sql: str) -> Prepared:
    """A query run by ticket: only its text is needed (for logs and errors)."""
    return Prepared(sql, StatementKind.QUERY, EMPTY_SCHEMA, EMPTY_SCHEMA,
                    statement_kind="select")


@dataclass
class _Rpc:
    """What one RPC is doing, for its log line."""

    method: str
    peer: str
    principal: Principal
    command: str | None = None
    statement: str | None = None
    params: pa.RecordBatch | None = None  # bound values: redacted from a logged error
    table: str | None = None


@dataclass
class _Statement:
    """One statement's run: its slot, its Cancel, and what it did (for logs/metrics)."""

    rpc: str
    principal: Principal
    prepared: Prepared
    call: Call
    params: pa.RecordBatch | None = None  # bound values: redacted from a logged error
    info: ExecInfo = field(default_factory=ExecInfo)
    start: float = field(default_factory=time.perf_counter)
    rows_returned: int = 0
    bytes_returned: int = 0
    affected: int = 0
    done: bool = False
    streaming: bool = False
    slot_released: bool = False

    @property
    def cancel(self) -> Cancel:
        return self.call.cancel


PEER_KEY = "flightsrv_peer"


@dataclass(frozen=True)
class Forwarded:
    """A worker behind a relay or a front (``flightsrv serve --workers N``): calls arrive on
    a private socket, the client's connection is named as ``via`` says, connections are
    counted on ``public_port``, and bearer tokens are signed with ``token_key``, shared by
    all workers of one server."""

    public_port: int
    token_key: bytes
    index: int = 0  # which worker: every log line carries it as "worker"
    #: ``relay`` (``server/relay.py``): connections are relayed byte for byte and the
    #: client's connection is named by the relayed socket's own address, no header is read;
    #: ``front`` (``server/front.py``, TLS): by the front's ``x-flightsrv-peer`` header
    via: str = "front"
    #: the parent's slot broker (``server/broker.py``): per-principal statement and DoPut
    #: slots counted for the whole server, not per worker
    slots_socket: str | None = None


class _PeerMiddleware(flight.ServerMiddleware):
    def __init__(self, peer: str | None):
        self.peer = peer


class _PeerMiddlewareFactory(flight.ServerMiddlewareFactory):
    def start_call(self, info, headers):
        values = headers.get("x-flightsrv-peer") or []
        return _PeerMiddleware(values[0] if values else None)


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
        config: ServerConfig | None = None,
        read_only: bool = False,
        ticket_key: bytes | None = None,
        scrub_paths: tuple[tuple[str, str], ...] = (),
        forwarded: Forwarded | None = None,
        **kwargs,
    ):
        self._engine = engine
        self._forwarded = forwarded
        self.config = cfg = config or ServerConfig()
        self._runtime = runtime or Runtime()
        clock = self._runtime.clock
        if ticket_key is None and forwarded is not None:
            # every worker of one server signs tickets with the same key (derived from the
            # key the parent handed them all), so a ticket redeems on whichever worker a
            # connection reaches, as on one server (a kept result's lives where it was made)
            ticket_key = derive_key(forwarded.token_key, b"flightsrv tickets")
        self._codec = TicketCodec(self._runtime, cfg.ticket_ttl_s, ticket_key)
        #: behind ``serve --workers N``: prepared handles name their statement, signed with
        #: one key for all workers, so a connection that reaches another worker (a client
        #: that reconnected) can still use them (``_revive``)
        self._handle_key = None if forwarded is None else derive_key(
            forwarded.token_key, b"flightsrv prepared handles")
        # behind ``serve --workers N`` the slots, and the counts of prepared statements and
        # sessions, are the whole server's, kept by the parent (server/broker.py)
        link = broker.connect(forwarded.slots_socket if forwarded else None)

        def shared(pool: str):
            return None if link is None else broker.SharedHolds(link, pool)

        holds = {"prepared": shared("prepared"), "sessions": shared("sessions")}
        self._prepared: PerPrincipal[bytes, _PreparedEntry] = PerPrincipal(
            "prepared statements", "max_prepared_statements", cfg.max_prepared_statements,
            cfg.prepared_ttl_s, clock, shared=holds["prepared"])
        # a session belongs to a connection: one whose connection closed is released when
        # its principal's table is full (pyarrow tells no one about a closed connection)
        self._sessions: PerPrincipal[str, Session] = PerPrincipal(
            "sessions", "max_sessions", cfg.max_sessions, cfg.session_ttl_s, clock,
            gone=lambda peer: not connection_open(
                peer, forwarded.public_port if forwarded else self.port),
            shared=holds["sessions"])
        # kept results are this process's: a full table evicts its oldest, never refuses
        self._results: PerPrincipal[str, pa.Table] = PerPrincipal(
            "results", "max_results", cfg.max_results, cfg.result_ttl_s, clock, on_full="evict")

        def limit(pool: str, *args, **kwargs):
            if link is None:
                return Concurrency(*args, **kwargs)
            return broker.SharedConcurrency(link, pool, *args, **kwargs)

        self._slots = limit("queries", cfg.max_concurrent_queries, cfg.max_queued_queries,
                            on_wait=lambda s: self.metrics.queue_wait.observe(s))
        #: behind ``--workers``: each worker's running statements, for worker 0's maintenance
        #: to yield to the whole server (``server/busy.py``)
        self._busy = None
        if forwarded is not None and forwarded.slots_socket is not None:
            self._busy = BusyBoard(os.path.dirname(forwarded.slots_socket), forwarded.index)
            self._slots = CountedSlots(self._slots, self._busy)
        # a DoPut stream over max_open_puts waits for one of its principal's to close
        # (executemany from many writers queues like their statements do), within the
        # statement deadline
        self._puts = limit("puts", cfg.max_open_puts, cfg.max_queued_queries,
                           what="DoPut stream", limit_name="max_open_puts", busy="open")
        self._calls = CallTracker()
        #: early runs (``server/early.py``): one process only (behind ``--workers`` a slot
        #: is leased from the broker, a round trip a bind would wait for); the threads that
        #: run them are bounded, and a bind finding them all busy runs nothing early
        self._early_pool = None
        if link is None and cfg.early_runs and hasattr(engine, "knows_reads") and \
                hasattr(engine, "read_set"):
            threads = max(4, min(64, 2 * (os.cpu_count() or 2)))
            self._early_pool = ThreadPoolExecutor(threads, thread_name_prefix="flightsrv-early")
            self._early_permits = threading.BoundedSemaphore(threads)
            #: an early run gains time only where a core is idle while the client asks
            #: for the result: none starts while this many other RPCs and streams are in
            #: progress (one per DuckDB thread)
            self._early_busy = cfg.effective_threads
        #: early runs GetFlightInfo issued a ticket for, by (principal, ticket nonce)
        self._early: dict[tuple[str, str], EarlyRun] = {}
        #: each principal's early runs not yet claimed or dropped: at most its
        #: max_concurrent_queries (each holds its first batches, up to EAGER_RESULT_BYTES)
        self._early_held: collections.Counter = collections.Counter()
        self._early_lock = threading.Lock()
        #: the parent's broker link behind ``--workers``: what one server does to a
        #: principal's calls and handles reaches every worker (``_tell_workers``)
        self._link = link
        #: behind ``--workers`` with auth: the issuer of bearer tokens for a call to another
        #: worker on behalf of a principal (a kept result fetched where it lives); the auth
        #: middleware's own, whose key every worker shares (set below)
        self._internal_tokens: TokenIssuer | None = None
        #: digests of prepared handles closed on some worker: never re-created here
        self._closed_handles: TTLCache = TTLCache(100_000, cfg.prepared_ttl_s)
        #: digests of handles made here and re-created on another worker: a close here
        #: closes them everywhere
        self._closed_lock = threading.Lock()
        if link is not None:
            link.on_notice("cancel", self._calls.cancel_ticket)
            link.on_notice("close", self._closed_elsewhere)
        self._active = 0  # RPCs and streams in progress (for draining)
        self._active_lock = threading.Condition()
        self._draining = threading.Event()
        self._read_only = read_only
        self._text = StatementText(cfg.log_statements)
        self._scrub = Scrubber(scrub_paths)
        # the RPC each handler thread is serving, by thread id; never a threading.local:
        # pyarrow runs handlers on gRPC's own threads, whose Python thread state is made and
        # cleared around every call, and freeing a thread-local's objects while that state is
        # cleared crashed the server (SIGSEGV in PyGILState_Release, 32 concurrent clients)
        self._rpcs: dict[int, _Rpc] = {}
        #: the background maintenance worker (``app.start_maintenance``), or None
        self.maintenance = None
        self.metrics = Metrics(gauges={
            "sessions": lambda: self._sessions.count(),
            "prepared_statements": lambda: self._prepared.count(),
            "queries_in_flight": lambda: self._slots.count(),
            "queries_queued": lambda: self._slots.queued(),
            "puts_open": lambda: self._puts.count(),
            "puts_queued": lambda: self._puts.queued(),
        }, started_s=clock.now_ms() / 1000.0)
        middleware = {}
        if auth is not None:
            # behind --workers: password checks counted, and failed logins backed off, for
            # the whole server (one server's bounds, whichever worker a login reaches)
            logins = None if link is None else broker.SharedConcurrency(
                link, "logins", auth.max_concurrent_logins, broker.LOGINS_QUEUED, what="login",
                limit_name="max_concurrent_logins", queue_limit_name="max_concurrent_logins",
                busy="being checked")

            def told(user: str, proof: bytes | None) -> None:
                # a failure is known everywhere before it is answered (the next guess, on
                # a new connection, may reach any worker); a success need not wait
                self._tell_workers("login", user, proof.hex() if proof else "",
                                   wait=proof is None)

            factory = middleware[MIDDLEWARE_KEY] = AuthMiddlewareFactory(
                auth, clock, on_failure=lambda reason: self.metrics.auth_failures.inc(),
                token_key=forwarded.token_key if forwarded else None, logins=logins,
                on_login=told if link is not None else None)
            if link is not None:
                link.on_notice("login", lambda user, proof: factory.remote_login(
                    user, bytes.fromhex(proof) if proof else None))
            if forwarded is not None:
                self._internal_tokens = factory.issuer
        if forwarded is not None and forwarded.via == "front":
            middleware[PEER_KEY] = _PeerMiddlewareFactory()
        # Handshake is answered even without auth: JDBC tools that send a user name by
        # default (DBeaver) then connect as anonymous instead of failing UNIMPLEMENTED
        kwargs.setdefault("auth_handler", HandshakeHandler())
        tls_certificates = []
        if tls is not None:
            with open(tls.cert_path, "rb") as c, open(tls.key_path, "rb") as k:
                tls_certificates = [(c.read(), k.read())]
            if location.startswith(("grpc://", "grpc+tcp://")):
                location = "grpc+tls://" + location.split("://", 1)[1]
        super().__init__(location, middleware=middleware, tls_certificates=tls_certificates,
                         **kwargs)
        frameless_tracebacks(True)  # no traceback in a status detail (status.py)
        self._frameless = True

    # == entry points (neutral tracebacks: see status.py) ===================================

    get_flight_info = neutral_entry("get_flight_info", "_rpc_get_flight_info")
    get_schema = neutral_entry("get_schema", "_rpc_get_schema")
    do_get = neutral_entry("do_get", "_rpc_do_get")
    do_put = neutral_entry("do_put", "_rpc_do_put")
    do_action = neutral_entry("do_action", "_rpc_do_action")
    list_flights = neutral_entry("list_flights", "_rpc_list_flights")
    do_exchange = neutral_entry("do_exchange", "_rpc_do_exchange")

    def _rpc_get_flight_info(self, context, descriptor):
        return self._serve("GetFlightInfo", context, self._get_flight_info, descriptor)

    def _rpc_get_schema(self, context, descriptor):
        return self._serve("GetSchema", context, self._get_schema, descriptor)

    def _rpc_do_get(self, context, ticket):
        return self._serve("DoGet", context, self._do_get, ticket)

    def _rpc_do_put(self, context, descriptor, reader, writer):
        return self._serve("DoPut", context, self._do_put, descriptor, reader, writer)

    def _rpc_do_action(self, context, action):
        return self._serve("DoAction", context, self._do_action, action)

    def _rpc_list_flights(self, context, criteria):
        return self._serve("ListFlights", context, self._unimplemented_rpc, criteria)

    def _rpc_do_exchange(self, context, descriptor, reader, writer):
        return self._serve("DoExchange", context, self._unimplemented_rpc, descriptor)

    def _unimplemented_rpc(self, context, *args):
        raise unimplemented("this Flight RPC is not part of Flight SQL")

    def list_actions(self, context):
        return [(name, doc) for name, (doc, _) in self._ACTIONS.items()]

    # == plumbing ============================================================================

    def _peer(self, context) -> str:
        """The caller's connection: its own peer address; behind a relay (``--workers``) the
        client's, from the name the relay gave the relayed socket; behind a front (TLS) the
        one the front forwarded in ``x-flightsrv-peer`` (the front drops a caller's own)."""
        fwd = self._forwarded
        if fwd is not None:
            if fwd.via == "relay":
                own = context.peer()
                return client_peer(own) or own
            mw = context.get_middleware(PEER_KEY)
            if mw is not None and mw.peer:
                return mw.peer
        return context.peer()

    def _serve(self, method: str, context, fn, *args):
        """Run one RPC: draining check, log line, metrics, error mapping."""
        rec = _Rpc(method, self._peer(context), principal_of(context))
        me = threading.get_ident()
        self._rpcs[me] = rec
        start = time.perf_counter()
        self._enter()
        try:
            if self._draining.is_set():
                raise Draining("server is shutting down; retry")
            result = fn(context, *args)
        except BaseException as exc:  # noqa: BLE001 - mapped below
            err = self._map(exc, rec.statement, rec.table)
            self._log_rpc(rec, start, err, exc)
            raise err from None
        finally:
            self._rpcs.pop(me, None)
            self._leave()
        self._log_rpc(rec, start, None)
        return result

    def _map(self, exc: BaseException, statement: str | None, table: str | None) -> Exception:
        return to_flight_error(exc, statement=statement, table=table, scrub=self._scrub)

    def _enter(self) -> None:
        with self._active_lock:
            self._active += 1

    def _leave(self) -> None:
        with self._active_lock:
            self._active -= 1
            self._active_lock.notify_all()

    def _log_rpc(self, rec: _Rpc, start: float, error: BaseException | None,
                 raised: BaseException | None = None) -> None:
        status = grpc_status_name(error)
        self.metrics.rpc(rec.method, status)
        if not log.isEnabledFor(logging.INFO if error is None else logging.WARNING):
            return  # a disabled log line costs nothing but the counter above
        fields = {
            "event": "rpc", "method": rec.method, "command": rec.command, "peer": rec.peer,
            "user": rec.principal.user, "status": status, "table": rec.table,
            "statement": self._text(rec.statement),
            "duration_ms": round((time.perf_counter() - start) * 1000, 3),
        }
        if error is None:
            log.info("rpc ok", extra={"fields": fields})
        else:
            fields["error"] = self._text.error_text(
                raised or error, f"{type(error).__name__}: {error}", rec.statement, rec.params)
            log.warning("rpc failed", extra={"fields": fields})

    def _note(self, **fields) -> None:
        rec = self._rpcs.get(threading.get_ident())
        if rec is not None:
            for k, v in fields.items():
                setattr(rec, k, v)

    def _command(self, descriptor: flight.FlightDescriptor):
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise invalid("flightsrv only serves Flight SQL command descriptors")
        if len(descriptor.command) > self.config.max_message_bytes:
            raise errors.LimitExceeded("command larger than the server accepts",
                                       limit="max_message_bytes",
                                       value=self.config.max_message_bytes)
        cmd = proto.unpack(descriptor.command)
        self._note(command=proto.arrow_name(cmd))
        return cmd

    def _check_sql(self, sql: str) -> str:
        self._note(statement=sql)
        size = len(sql.encode("utf-8", "surrogatepass"))
        if size > self.config.max_statement_bytes:
            self._note(statement=None)
            raise errors.LimitExceeded("statement longer than the server accepts",
                                       limit="max_statement_bytes",
                                       value=self.config.max_statement_bytes, bytes=size)
        return sql

    @staticmethod
    def _no_transaction(msg) -> None:
        if msg.HasField("transaction_id"):
            raise unimplemented("transactions are not supported (transaction_id given)")

    def _session(self, context, principal: Principal, keep: bool = False) -> Session:
        """The caller's session on this connection. Only sessions that hold state (SET)
        are kept; others are fresh per call and count against no limit."""
        key = self._peer(context)
        session = self._sessions.get(principal.user, key)
        if session is None:
            session = Session(session_id=self._runtime.ids.new_id(), user=principal.user,
                              role=principal.role)
            if keep:
                self._sessions.add(principal.user, key, session)
        session.role = principal.role
        return session

    def _check_writable(self, principal: Principal, prepared: Prepared) -> None:
        if self._read_only and prepared.effects and prepared.statement_kind != "set":
            raise errors.PermissionDenied("the server is read-only", user=principal.user,
                                          kind=prepared.statement_kind)

    def _timeout_s(self, session: Session) -> float | None:
        limit = self.config.query_timeout_s or None
        raw = session.settings.get("statement_timeout")
        if raw not in (None, "", "0"):
            try:
                own = int(raw) / 1000.0
            except ValueError:
                own = None
            if own and own > 0:
                limit = own if limit is None else min(limit, own)
        return limit

    def _lookup(self, context, principal: Principal, handle: bytes) -> _PreparedEntry:
        entry = self._prepared.get(principal.user, handle)
        if entry is None:
            entry = self._revive(context, principal, handle)
        if entry is None:
            raise NotFound("unknown or expired prepared statement handle",
                           handle=handle.hex()[:16])
        self._note(statement=entry.prepared.sql)
        return entry

    # -- prepared handles of ``serve --workers N`` ------------------------------------------

    def _new_handle(self, user: str, sql: str) -> bytes:
        """A new prepared statement's handle: a random id; behind ``--workers`` also the
        worker, the principal and the statement text (up to ``_PORTABLE_SQL``), signed."""
        base = self._runtime.ids.new_id().encode()
        if self._handle_key is None or len(sql) > _PORTABLE_SQL:
            return base
        return seal(self._handle_key, _HANDLE_MAGIC,
                    {"i": base.decode(), "w": self._forwarded.index, "u": user, "s": sql})

    def _sealed(self, user: str, handle: bytes) -> dict | None:
        fields = None if self._handle_key is None else \
            unseal(self._handle_key, _HANDLE_MAGIC, handle)
        if fields is None or fields.get("u") != user:
            return None
        return fields

    def _made_by(self, principal: Principal, handle: bytes) -> int | None:
        """The worker that made a genuine handle of ``principal``'s, else None."""
        fields = self._sealed(principal.user, handle)
        return None if fields is None else int(fields.get("w", -1))

    def _portable(self, principal: Principal, handle: bytes) -> str | None:
        """The statement of a genuine handle of ``principal``'s made by another worker and
        not closed, else None (not signed by this server, another principal's, closed on
        some worker, or this worker's own: then it was closed or expired here, NOT_FOUND
        as on one server)."""
        fields = self._sealed(principal.user, handle)
        if fields is None or fields.get("w") == self._forwarded.index:
            return None
        with self._closed_lock:
            if _digest(handle) in self._closed_handles:
                return None
        return str(fields.get("s", ""))

    def _revive(self, context, principal: Principal, handle: bytes) -> _PreparedEntry | None:
        """A handle another worker made, used on a connection that reached this one:
        prepare its statement here (as its creator did) under the same handle. Parameters
        bound on the other worker stay there: bind again. A close on any worker tells every
        other one, so the copy goes with it."""
        sql = self._portable(principal, handle)
        if sql is None:
            return None
        entry = _PreparedEntry(self._prepare(context, principal, self._check_sql(sql)))
        # its maker holds its count for the whole server: the copy here takes none
        self._prepared.add(principal.user, handle, entry, held=False)
        log.info("prepared statement re-created", extra={"fields": {
            "event": "prepared_revived", "user": principal.user}})
        return entry

    def _held(self, user: str, digest: str) -> bytes | None:
        """The handle of ``user``'s held here whose digest is ``digest`` (a notice names a
        handle by its digest: a handle may be larger than a broker message)."""
        for handle in self._prepared.keys(user):
            if _digest(handle) == digest:
                return handle
        return None

    def _closed_elsewhere(self, user: str, digest: str) -> None:
        """A ``close`` notice: another worker closed this handle of ``user``'s."""
        with self._closed_lock:
            self._closed_handles[digest] = True
        handle = self._held(user, digest)
        if handle is not None:
            self._prepared.pop(user, handle)

    def _tell_workers(self, kind: str, user: str, value: str, wait: bool = True) -> None:
        """Behind ``--workers``: tell every other worker (``broker.BrokerLink.notify``).
        A worker that does not answer within the broker's wait is logged, not waited for."""
        if self._link is None:
            return
        if not self._link.notify(kind, user, value, wait=wait) and wait:
            log.warning("a notice did not reach every worker", extra={"fields": {
                "event": "notice_unanswered", "kind": kind, "user": user}})

    def _sql_info(self, principal: Principal) -> dict[int, object]:
        read_only = self._read_only or principal.role == Role.READER
        return md.sql_info_values(SERVER_VERSION, read_only=read_only, config=self.config)

    def _metadata_context(self, principal: Principal) -> commands.MetadataContext:
        return commands.MetadataContext(self._engine, self._sql_info(principal),
                                        self._report_broken)

    def _report_broken(self, table: str, exc: BaseException) -> None:
        ctx = getattr(exc, "context", {}) or {}
        obj = ctx.get("key") or ctx.get("object")
        log.warning("table unavailable", extra={"fields": {
            "event": "table_unavailable", "table": table, "object": obj,
            "check": getattr(exc, "message", None) or str(exc),
            "error_class": type(exc).__name__,
            "error": self._scrub(str(exc))}})

    # == statements ==========================================================================

    def _admit(self, context, principal: Principal, session: Session,
               deadline: bool = True, nonce: str | None = None) -> Call:
        """A concurrency slot (waiting in the principal's queue) and a registered ``Call``
        with the statement's deadline; the wait counts against the deadline. The caller
        releases the slot and finishes the call."""
        timeout = self._timeout_s(session) if deadline else None
        until = time.monotonic() + timeout if timeout else None
        self._slots.acquire(principal.user, until, gone=lambda: client_gone(context))
        try:
            left = None if until is None else max(until - time.monotonic(), 1e-3)
            return self._calls.start(principal.user, left, context, nonce)
        except BaseException:
            self._slots.release(principal.user)
            raise

    def _prepare(self, context, principal: Principal, sql: str,
                 params: pa.RecordBatch | None = None, *,
                 running: bool = False) -> Prepared:
        """``engine.prepare`` as a statement: it holds a slot, runs under the statement's
        deadline and is interrupted by a cancel (DuckDB's bind may evaluate functions).
        ``running``: the statement already holds a slot (its early run): described from
        the engine's caches without taking a second one, which a principal at its limit
        would wait for until the run is dropped."""
        session = self._session(context, principal)
        if running:
            return self._engine.prepare(sql, session, params)
        call = self._admit(context, principal, session)
        try:
            return self._engine.prepare(sql, session, params, cancel=call.cancel)
        except BaseException as exc:
            if call.cancel.cancelled and not isinstance(exc, errors.QueryCancelled):
                raise errors.QueryCancelled(
                    "statement timed out while being prepared" if call.cancel.reason ==
                    "timeout" else "statement was cancelled while being prepared",
                    reason=call.cancel.reason) from None
            raise
        finally:
            self._calls.finish(call)
            self._slots.release(principal.user)

    def _begin(self, rpc: str, context, principal: Principal, session: Session,
               prepared: Prepared, nonce: str | None = None, deadline: bool = True,
               params: pa.RecordBatch | None = None) -> _Statement:
        call = self._admit(context, principal, session, deadline, nonce)
        st = _Statement(rpc, principal, prepared, call, params)
        # a cancelled statement gives its slot back at once, even if its stream waits for
        # a client that is not reading
        call.cancel.on_cancel(lambda: self._release_slot(st))
        return st

    def _release_slot(self, st: _Statement) -> None:
        with self._active_lock:
            if st.slot_released:
                return
            st.slot_released = True
        self._slots.release(st.principal.user)

    def _end(self, st: _Statement, error: BaseException | None = None,
             discard: bool = False) -> None:
        """The statement is over: its call and slot go; its log line and metrics, unless
        ``discard`` (an early run no DoGet delivers: its DoGet, if any, runs the statement
        and reports that; ``flightsrv_early_runs_total`` counts it)."""
        if st.done:
            return
        st.done = True
        self._calls.finish(st.call)
        self._release_slot(st)
        if discard:
            log.debug("early run discarded", extra={"fields": {
                "event": "early_run", "principal": st.principal.user,
                "statement": self._text(st.prepared.sql),
                "reason": None if error is None else type(error).__name__}})
            return
        seconds = time.perf_counter() - st.start
        mapped = None if error is None else self._map(error, st.prepared.sql, None)
        status = grpc_status_name(mapped)
        kind = st.prepared.statement_kind
        info = st.info
        self.metrics.statement(kind, status, seconds, info, st.rows_returned,
                               st.bytes_returned, st.affected)
        if not log.isEnabledFor(logging.INFO if error is None else logging.WARNING):
            return
        fields = {
            "event": "statement", "rpc": st.rpc, "principal": st.principal.user,
            "role": st.principal.role.value, "kind": kind,
            "statement": self._text(st.prepared.sql),
            "tables": dict(info.tables) or None,
            "commits": [list(c) for c in info.commits] or None,
            "rows": st.rows_returned if st.prepared.kind == StatementKind.QUERY else st.affected,
            "bytes": st.bytes_returned,
            "duration_ms": round(seconds * 1000, 3),
            "files_scanned": info.files_scanned, "files_pruned": info.files_pruned,
            "row_groups_scanned": info.row_groups_scanned,
            "row_groups_pruned": info.row_groups_pruned, "rows_masked": info.rows_masked,
            "status": status,
        }
        if error is not None:
            fields["error_class"] = type(error).__name__
            fields["error"] = self._text.error_text(error, str(mapped), st.prepared.sql,
                                                    st.params)
            log.warning("statement failed", extra={"fields": fields})
        else:
            log.info("statement", extra={"fields": fields})

    def _run(self, st: _Statement, fn, *args, **kwargs):
        """``fn(...)`` for statement ``st``; ends ``st`` on failure."""
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            if st.cancel.cancelled and not isinstance(exc, errors.QueryCancelled):
                exc = errors.QueryCancelled(
                    "statement timed out" if st.cancel.reason == "timeout"
                    else "statement was cancelled", reason=st.cancel.reason)
            self._end(st, exc)
            raise exc from None

    def _statement_info(self, context, principal: Principal, prepared: Prepared,
                        params: pa.RecordBatch | None,
                        descriptor: flight.FlightDescriptor, *, fresh: bool,
                        early: EarlyRun | None = None) -> flight.FlightInfo:
        """GetFlightInfo for a statement: run it now if it has effects, else a ticket (which
        the early run of these very parameters, if one started at their bind, answers)."""
        user = principal.user
        self._note(params=params)
        if not prepared.effects:
            described = self._described(context, principal, prepared, params, fresh=fresh,
                                        running=early is not None)
            schema = md.annotate_result_schema(described.dataset_schema)
            nonce = self._runtime.ids.new_id()
            ticket = self._codec.issue("query", user, sql=prepared.sql, params=params,
                                       nonce=nonce, versions=described.versions,
                                       schema=schema)
            if early is None and params is None and not len(prepared.parameter_schema):
                # a query without parameters starts here, while its ticket travels
                early = self._start_early(context, principal, prepared, None)
            if early is not None:
                self._link_early(user, early, nonce)
            return flight.FlightInfo(schema, descriptor,
                                     [flight.FlightEndpoint(ticket, [])], -1, -1)
        self._check_writable(principal, prepared)
        session = self._session(context, principal, keep=prepared.statement_kind == "set")
        st = self._begin("GetFlightInfo", context, principal, session, prepared,
                         params=params)
        if prepared.kind != StatementKind.QUERY:
            n = self._run(st, self._engine.execute_update, prepared.sql, session, params,
                          cancel=st.cancel, info=st.info)
            st.affected = int(n)
            self._end(st)
            ticket = self._codec.issue("count", user)
            return flight.FlightInfo(EMPTY_SCHEMA, descriptor,
                                     [flight.FlightEndpoint(ticket, [])], int(n), -1)
        result = self._run(st, self._engine.execute_query, prepared.sql, session, params,
                           cancel=st.cancel)
        st.info = result.info
        # the statement has run and committed (OPTIMIZE, PURGE, ...): its report is kept
        # whatever the deadline does now, or the client would be told that work which did
        # happen timed out
        table = self._run(st, self._drain_reader, result.reader, None)
        st.affected = table.num_rows
        self._end(st)
        result_id = self._runtime.ids.new_id()
        if self._forwarded is not None:  # its worker: a DoGet elsewhere fetches it here
            result_id = f"{self._forwarded.index}.{result_id}"
        self._results.add(user, result_id, table)
        ticket = self._codec.issue("result", user, result_id=result_id,
                                   ttl_ms=int(self.config.result_ttl_s * 1000))
        return flight.FlightInfo(table.schema, descriptor, [flight.FlightEndpoint(ticket, [])],
                                 table.num_rows, table.nbytes)

    def _bound_schema(self, context, principal: Principal, prepared: Prepared,
                      params: pa.RecordBatch | None, *, fresh: bool,
                      running: bool = False) -> pa.Schema:
        """The schema a query's result has now, with ``params`` bound (see
        :meth:`_described`)."""
        return md.annotate_result_schema(self._described(
            context, principal, prepared, params, fresh=fresh, running=running).dataset_schema)

    def _described(self, context, principal: Principal, prepared: Prepared,
                   params: pa.RecordBatch | None, *, fresh: bool,
                   running: bool = False) -> Prepared:
        """A query described now, with ``params`` bound: it is described again (prepared,
        never run), because a parameter may type a result column (``SELECT ? AS v``) and
        the tables it reads may have changed since it was prepared (``ALTER TABLE``,
        ``CREATE OR REPLACE``): its schema is the one DoGet will stream, and its versions
        the ones it was described over. The engine answers from its schema cache while the
        tables' schemas are unchanged."""
        if params is None or not len(prepared.parameter_schema):
            if fresh:  # prepared by this very request: nothing can have changed
                return prepared
            params = None
        return self._prepare(context, principal, prepared.sql, params, running=running)

    @staticmethod
    def _drain_reader(reader: pa.RecordBatchReader, cancel: Cancel | None) -> pa.Table:
        batches = []
        for batch in reader:
            if cancel is not None:
                cancel.check()
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)

    def _update(self, rpc: str, context, principal: Principal, prepared: Prepared,
                params: pa.RecordBatch | None) -> int:
        """An update through DoPut: run now, return the row count."""
        self._note(params=params)
        self._check_writable(principal, prepared)
        session = self._session(context, principal, keep=prepared.statement_kind == "set")
        st = self._begin(rpc, context, principal, session, prepared, params=params)
        n = self._run(st, self._engine.execute_update, prepared.sql, session, params,
                      cancel=st.cancel, info=st.info)
        st.affected = int(n)
        self._end(st)
        return int(n)

    # == GetFlightInfo / GetSchema ===========================================================

    def _get_flight_info(self, context, descriptor):
        cmd = self._command(descriptor)
        principal = principal_of(context)
        statement = self._STATEMENTS.get(type(cmd))
        if statement is not None:
            prepared, params = statement(self, context, principal, cmd)
            early = self._take_early(principal, cmd, params)
            try:
                return self._statement_info(context, principal, prepared, params,
                                            descriptor, early=early,
                                            fresh=isinstance(cmd, proto.CommandStatementQuery))
            except BaseException:
                if early is not None and early.nonce is None:
                    early.st.cancel.cancel("cancelled")  # its ticket was never issued
                raise
        meta = self._metadata_command(cmd)
        ticket = self._codec.issue("metadata", principal.user, command=descriptor.command)
        return flight.FlightInfo(meta.schema(cmd), descriptor,
                                 [flight.FlightEndpoint(ticket, [])], -1, -1)

    def _get_schema(self, context, descriptor):
        """Never executes anything: statements are only prepared."""
        cmd = self._command(descriptor)
        principal = principal_of(context)
        statement = self._STATEMENTS.get(type(cmd))
        if statement is not None:
            prepared, params = statement(self, context, principal, cmd)
            self._note(params=params)
            if prepared.effects:
                return flight.SchemaResult(prepared.dataset_schema)
            return flight.SchemaResult(self._bound_schema(
                context, principal, prepared, params,
                fresh=isinstance(cmd, proto.CommandStatementQuery)))
        return flight.SchemaResult(self._metadata_command(cmd).schema(cmd))

    # statement commands: each resolves to a prepared statement (its schema is the result's)
    # and the parameters bound to it; GetFlightInfo runs it later by ticket, GetSchema only
    # reads its schema

    def _statement_query(self, context, principal, cmd):
        self._no_transaction(cmd)
        sql = self._check_sql(cmd.query)
        return self._prepare(context, principal, sql), None

    def _prepared_query(self, context, principal, cmd):
        entry = self._lookup(context, principal, cmd.prepared_statement_handle)
        return entry.prepared, entry.params

    def _substrait_plan(self, context, principal, cmd):
        raise unimplemented("Substrait plans are not supported")

    _STATEMENTS = {
        proto.CommandStatementQuery: _statement_query,
        proto.CommandPreparedStatementQuery: _prepared_query,
        proto.CommandStatementSubstraitPlan: _substrait_plan,
    }

    @staticmethod
    def _metadata_command(cmd) -> commands.Metadata:
        """The metadata command's entry in ``commands.METADATA`` (its schema and handler)."""
        meta = commands.METADATA.get(type(cmd))
        if meta is None:
            raise invalid(f"{proto.arrow_name(cmd)} is not valid for GetFlightInfo/GetSchema "
                          "(updates and ingest go through DoPut)")
        return meta

    # == DoGet ===============================================================================

    def _do_get(self, context, ticket):
        principal = principal_of(context)
        t = self._codec.open(ticket.ticket, principal.user)
        self._note(command=f"ticket:{t.kind}")
        return self._GET[t.kind](self, context, principal, t)

    def _get_metadata(self, context, principal: Principal, t) -> flight.RecordBatchStream:
        cmd = proto.unpack(t.command)
        meta = commands.METADATA[type(cmd)]
        return flight.RecordBatchStream(_sized_table(meta.table(self._metadata_context(principal),
                                                                cmd)))

    def _get_count(self, context, principal: Principal, t) -> flight.RecordBatchStream:
        return flight.RecordBatchStream(EMPTY_SCHEMA.empty_table())

    def _get_result(self, context, principal: Principal, t) -> flight.RecordBatchStream:
        table = self._results.pop(principal.user, t.result_id)
        if table is None:
            owner = self._result_owner(t.result_id)
            if owner is not None:
                table = self._result_from(owner, principal, t)
        if table is None:
            raise NotFound("result already fetched or expired; the statement that "
                           "produced it is not run again", ticket=t.nonce[:12])
        return flight.RecordBatchStream(_sized_table(table))

    def _result_owner(self, result_id: str | None) -> int | None:
        """Behind ``--workers``: the other worker that keeps a result, else None."""
        fwd = self._forwarded
        if fwd is None or not fwd.slots_socket or not result_id or "." not in result_id:
            return None
        head = result_id.split(".", 1)[0]
        if not head.isdigit() or int(head) == fwd.index:
            return None
        return int(head)

    def _result_from(self, owner: int, principal: Principal, t) -> pa.Table | None:
        """A kept result of worker ``owner``'s, fetched (and so taken: it is fetched once)
        from it over its private socket as ``principal``; None if it is not there."""
        path = os.path.join(os.path.dirname(self._forwarded.slots_socket), f"w{owner}.sock")
        headers = []
        if self._internal_tokens is not None:
            token = self._internal_tokens.issue(principal)
            headers.append((b"authorization", f"Bearer {token}".encode()))
        ticket = self._codec.issue("result", principal.user, result_id=t.result_id,
                                   ttl_ms=60_000)
        timeout = self.config.query_timeout_s or 300.0
        client = flight.FlightClient(f"grpc+unix://{path}")
        try:
            return client.do_get(flight.Ticket(ticket), flight.FlightCallOptions(
                headers=headers, timeout=timeout)).read_all()
        except pa.ArrowKeyError:  # NOT_FOUND there: fetched already, or expired
            return None
        except (flight.FlightUnavailableError, OSError):  # the worker is gone or restarted
            return None
        finally:
            client.close()

    def _stream_query(self, context, principal: Principal, t) -> flight.GeneratorStream:
        self._note(statement=t.sql, params=t.params)
        if self._calls.was_cancelled(principal.user, t.nonce):
            raise errors.QueryCancelled("query was cancelled (CancelFlightInfo)",
                                        reason="cancelled")
        early = self._claim_early(context, principal, t.nonce, t.schema)
        if early is not None:
            return self._deliver_early(early)
        session = self._session(context, principal)
        st = self._begin("DoGet", context, principal, session, _query(t.sql), nonce=t.nonce,
                         params=t.params)
        result, schema = self._run(st, self._announced_result, t, session, st.cancel)
        st.info = result.info
        self._enter()  # the stream outlives this call; draining waits for it
        st.streaming = True
        try:
            head, exhausted = self._read_head(st, result.reader)
        except BaseException as exc:  # noqa: BLE001 - this call's error
            exc = self._cause(st, exc)
            self._close_stream(st, result.reader, exc)
            raise exc from None
        return self._deliver(st, schema, head, result.reader, exhausted)

    def _announced_result(self, t, session: Session,
                          cancel: Cancel) -> tuple[QueryResult, pa.Schema]:
        """The query of ticket ``t`` run for its DoGet, with the columns its GetFlightInfo
        announced. A client holds the stream to that schema (ADBC fails an "inconsistent
        schema"), so when a table the query reads changed its columns in between (ALTER
        TABLE, CREATE OR REPLACE), and the run at the heads has other columns or no longer
        binds (a renamed column), the query runs over the versions GetFlightInfo described
        it over. SchemaChanged (UNAVAILABLE: planning again succeeds) when those are
        gone. Returns the result and its schema as streamed (annotated once here)."""
        try:
            result = self._engine.execute_query(t.sql, session, t.params, cancel=cancel)
        except errors.SqlError as exc:
            state = self._since_described(t)
            if state == "same":
                raise
            result = self._as_planned(t, session, cancel, exc, state)
            return result, md.annotate_result_schema(result.schema)
        schema = md.annotate_result_schema(result.schema)
        if t.schema is not None and schema_digest(schema) != t.schema:
            state = self._since_described(t, result.info.read_set)
            if state != "same":
                result.reader.close()
                result = self._as_planned(t, session, cancel, None, state)
                schema = md.annotate_result_schema(result.schema)
        return result, schema

    def _since_described(self, t, read: tuple | None = None) -> str:
        """How the tables the ticket's query was described over changed up to the versions
        a run read (``read``; else now): "same", "columns" or "rows"
        (``DuckEngine.since_described``). Only a change of columns sends DoGet to the
        described versions, and only when they hold no row deleted since."""
        since = getattr(self._engine, "since_described", None)
        if not t.versions or since is None:
            return "same"
        return since(t.versions, read)

    def _as_planned(self, t, session: Session, cancel: Cancel,
                    failed: BaseException | None, state: str) -> QueryResult:
        """The query of ticket ``t`` over the versions it was described over (see
        :meth:`_announced_result`); ``failed``: the run at the heads' error, raised again
        when this run does not give the announced columns either. ``state`` "rows": those
        versions hold rows deleted or updated since, which a plain query must not show:
        SchemaChanged instead."""
        if state == "rows":
            raise errors.SchemaChanged(
                "a table the query reads changed its columns since GetFlightInfo, and rows "
                "were deleted or updated since; call GetFlightInfo again") from None
        try:
            result = self._engine.execute_query(t.sql, session, t.params, cancel=cancel,
                                                versions=t.versions)
        except (errors.VersionNotFound, errors.TableNotFound, errors.SqlError):
            if failed is not None:
                raise failed from None
            raise errors.SchemaChanged(
                "a table the query reads changed its columns since GetFlightInfo, and the "
                "versions it was described over are gone; call GetFlightInfo again"
            ) from None
        if failed is not None and \
                schema_digest(md.annotate_result_schema(result.schema)) != t.schema:
            result.reader.close()
            raise failed
        self.metrics.as_planned.inc()
        return result

    def _read_head(self, st: _Statement,
                   reader: pa.RecordBatchReader) -> tuple[list[pa.RecordBatch], bool]:
        """A result's first batches, up to about ``EAGER_RESULT_BYTES``, and whether they
        are all of it. A small result is read whole before DoGet answers: pyarrow then sends
        a table without calling back into Python once per batch and once more to learn that
        the stream ended (a point query's result is one batch)."""
        head: list[pa.RecordBatch] = []
        size = 0
        while size <= EAGER_RESULT_BYTES:
            st.cancel.check(statement=None)
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return head, True
            st.rows_returned += batch.num_rows
            st.bytes_returned += batch.nbytes
            head.extend(sized(batch))
            size += batch.nbytes
        return head, False

    def _deliver(self, st: _Statement, schema: pa.Schema, head: list[pa.RecordBatch],
                 reader: pa.RecordBatchReader, exhausted: bool):
        """DoGet's answer for a running statement whose first batches are ``head``."""
        if exhausted:  # the statement is over
            self._close_stream(st, reader, None)
            return flight.RecordBatchStream(pa.Table.from_batches(head, schema))
        stream = neutral_stream(itertools.chain(head, self._batches(st, reader)))
        # a stream the client never starts reading runs no ``finally``: clean up when
        # pyarrow drops it
        weakref.finalize(stream, self._close_stream, st, reader, None)
        return flight.GeneratorStream(schema, stream)

    #: ticket kind -> what DoGet streams for it (tickets.KINDS lists the kinds)
    _GET = {"metadata": _get_metadata, "count": _get_count, "result": _get_result,
            "query": _stream_query}
    def _close_stream(self, st: _Statement, reader, error: BaseException | None,
                      discard: bool = False) -> None:
        if not st.streaming:
            return
        st.streaming = False
        try:
            reader.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort
            log.debug("closing a result reader failed: %s", exc)
        self._end(st, error, discard)
        self._leave()

    def _batches(self, st: _Statement, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        error: BaseException | None = None
        try:
            while True:
                st.cancel.check(statement=None)
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                st.rows_returned += batch.num_rows
                st.bytes_returned += batch.nbytes
                yield from sized(batch)
        except GeneratorExit:  # the client stopped reading
            raise
        except BaseException as exc:  # noqa: BLE001 - mapped for the client
            error = self._cause(st, exc)
            raise self._map(error, st.prepared.sql, None) from None
        finally:
            self._close_stream(st, reader, error)

    @staticmethod
    def _cause(st: _Statement, exc: BaseException) -> BaseException:
        """What failed a statement's stream: an interrupted DuckDB reader fails with its own
        error, reported as the cancel that interrupted it."""
        if st.cancel.cancelled and not isinstance(exc, errors.QueryCancelled):
            return errors.QueryCancelled(
                "statement timed out" if st.cancel.reason == "timeout"
                else "statement was cancelled", reason=st.cancel.reason)
        return exc

    # == early runs: a prepared query run from its bind (server/early.py) ===================

    def _start_early(self, context, principal: Principal, prepared: Prepared,
                     params: pa.RecordBatch | None) -> EarlyRun | None:
        """Start running the query ``prepared`` with the values just bound (None: it has no
        parameters; GetFlightInfo starts it), if it has no effects, one row of values is
        bound, one of the principal's slots is free now with none of its statements
        waiting, and a thread is free; else None (the DoGet runs it, as any ticket)."""
        if self._early_pool is None or prepared.effects or \
                prepared.kind != StatementKind.QUERY or \
                (params.num_rows != 1 if params is not None
                 else len(prepared.parameter_schema) > 0) or \
                self._draining.is_set() or not self._engine.knows_reads(prepared.sql):
            return None
        if self._active > self._early_busy:
            return None  # other calls keep the cores busy: starting sooner gains nothing
        user = principal.user
        with self._early_lock:
            if self._early_held[user] >= self.config.max_concurrent_queries:
                return None
            self._early_held[user] += 1
        if not self._early_permits.acquire(blocking=False):
            self._early_unhold(user)
            return None
        if not self._slots.try_acquire(user):
            self._early_permits.release()
            self._early_unhold(user)
            return None
        call = entered = None
        try:
            session = self._session(context, principal)
            timeout = self._timeout_s(session)
            now = time.monotonic()
            claim = EARLY_CLAIM_S if not timeout else min(timeout, EARLY_CLAIM_S)
            call = self._calls.start(user, claim)  # no context: the bind's RPC ends now
            # logged when its DoGet delivers it, as any query ("rpc": "DoGet")
            st = _Statement("DoGet", principal, _query(prepared.sql), call, params)
            early = EarlyRun(params, st, now + timeout if timeout else None)
            early.settings = dict(session.settings)
            self._enter()  # draining waits for it
            entered = True
            self._early_pool.submit(self._run_early, early, session)
        except Exception as exc:  # noqa: BLE001 - nothing runs early; the DoGet runs it
            log.debug("early run not started: %s", exc)
            self._early_permits.release()
            self._early_unhold(user)
            if call is not None:
                self._calls.finish(call)
            self._slots.release(user)
            if entered:
                self._leave()
            return None
        call.cancel.on_cancel(lambda: self._release_slot(st))
        call.cancel.on_cancel(lambda: self._drop_early(early))
        self.metrics.early_runs.labels("started").inc()
        return early

    def _run_early(self, early: EarlyRun, session: Session) -> None:
        """The running side of an early run (a pool thread): run, read the first batches.
        It never ends the statement: its delivery does, or its discard (``_finish_early``);
        the slot goes back as soon as DuckDB is done with it."""
        st = early.st
        try:
            try:
                result = self._engine.execute_query(st.prepared.sql, session, early.params,
                                                    cancel=st.cancel)
                st.info = result.info
            except BaseException as exc:  # noqa: BLE001 - DoGet reports it
                self._release_slot(st)
                if not early.fail(self._cause(st, exc)):  # dropped meanwhile
                    self._finish_early(early, discard=True)
                return
            try:
                head, exhausted = self._read_head(st, result.reader)
            except BaseException as exc:  # noqa: BLE001 - DoGet reports it
                try:
                    result.reader.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
                self._release_slot(st)
                if not early.fail(self._cause(st, exc)):
                    self._finish_early(early, discard=True)
                return
            if exhausted:  # DuckDB is done: only the batches read wait for the DoGet
                self._release_slot(st)
            st.streaming = True  # from here ``_close_stream`` ends it
            schema = md.annotate_result_schema(result.schema)
            if not early.ready(schema, head, result.reader, exhausted):  # dropped meanwhile
                self._finish_early(early, discard=True)
        except BaseException as exc:  # noqa: BLE001 - never leave a DoGet waiting
            log.error("early run failed", exc_info=True)
            if not early.fail(exc):
                self._finish_early(early, discard=True)
        finally:
            self._early_permits.release()

    def _finish_early(self, early: EarlyRun, discard: bool) -> None:
        """End an early run's statement: delivered as its error, or discarded."""
        st = early.st
        if st.streaming:
            self._close_stream(st, early.reader, early.error, discard)
        elif not st.done:
            self._end(st, early.error, discard)
            self._leave()

    def _forget_early(self, entry: _PreparedEntry) -> None:
        """Drop the run of ``entry``'s last bind if no GetFlightInfo took it."""
        early, entry.early = entry.early, None
        if early is not None:
            early.st.cancel.cancel("cancelled")  # -> _drop_early

    def _take_early(self, principal: Principal, cmd, params) -> EarlyRun | None:
        """GetFlightInfo of a prepared query: the early run of its bound values, taken
        from the handle (one ticket answers one run)."""
        if params is None or not isinstance(cmd, proto.CommandPreparedStatementQuery):
            return None
        entry = self._prepared.get(principal.user, cmd.prepared_statement_handle)
        early = None if entry is None else entry.early
        if early is None or early.params is not params:
            return None
        entry.early = None
        return early

    def _link_early(self, user: str, early: EarlyRun, nonce: str) -> None:
        """``early`` answers the ticket ``nonce``: a DoGet of it claims the run, and a
        CancelFlightInfo of it cancels the run (its call now carries the nonce)."""
        with self._early_lock:
            early.nonce = nonce
            early.st.call.nonce = nonce
            if early.state in ("running", "ready"):
                self._early[(user, nonce)] = early

    def _claim_early(self, context, principal: Principal, nonce: str,
                     announced: str | None = None) -> EarlyRun | None:
        """The early run answering the ticket ``nonce``, claimed, if it read what this
        DoGet would (see ``server/early.py``) and has the columns GetFlightInfo announced
        (``announced``: their schema's digest; the run started after a table's columns
        changed); else None (discarded if it was claimed)."""
        with self._early_lock:
            early = self._early.pop((principal.user, nonce), None)
        if early is None or not early.claim():
            return None
        self._early_unhold(principal.user)
        call = early.st.call
        call.deadline = early.deadline  # the statement's own, no longer the claim's
        call.context = context  # the watchdog sees this client go away
        now_reads = self._engine.read_set(early.st.prepared.sql)  # while the run runs
        early.wait()  # (the watchdog cancels it at its deadline or when the client goes)
        if early.error is not None and early.st.cancel.cancelled:
            self.metrics.early_runs.labels("claimed").inc()
            return early  # cancelled (CancelFlightInfo, deadline, client gone): so is this DoGet
        ran = early.st.info.read_set
        kept = self._sessions.get(principal.user, self._peer(context))
        if ran is None or ran != now_reads or \
                early.settings != (kept.settings if kept is not None else {}) or (
                    announced is not None and early.error is None and
                    early.schema is not None and schema_digest(early.schema) != announced):
            self.metrics.early_runs.labels("stale").inc()
            self._finish_early(early, discard=True)  # this DoGet runs it itself
            return None
        self.metrics.early_runs.labels("claimed").inc()
        return early

    def _drop_early(self, early: EarlyRun) -> None:
        """``early``'s call was cancelled before a DoGet claimed it (claim deadline,
        statement deadline, CancelFlightInfo, a new bind, a closed handle, shutdown)."""
        with self._early_lock:
            if early.nonce is not None:
                self._early.pop((early.st.principal.user, early.nonce), None)
        close = early.drop()
        if early.state != "dropped":
            return  # claimed: the DoGet reports the cancel
        self._early_unhold(early.st.principal.user)
        self.metrics.early_runs.labels("dropped").inc()
        if close:  # it had ended (READY): nobody else will finish it
            self._finish_early(early, discard=True)

    def _early_unhold(self, user: str) -> None:
        with self._early_lock:
            self._early_held[user] -= 1
            if self._early_held[user] <= 0:
                del self._early_held[user]

    def _deliver_early(self, early: EarlyRun):
        """DoGet of a ticket whose query ran early: its result or its error."""
        if early.error is not None:
            self._finish_early(early, discard=False)
            raise early.error
        return self._deliver(early.st, early.schema, early.head, early.reader,
                             early.exhausted)

    # == DoPut ===============================================================================

    def _do_put(self, context, descriptor, reader, writer):
        cmd = self._command(descriptor)
        principal = principal_of(context)
        handler = self._PUT.get(type(cmd))
        if handler is None:
            raise invalid(f"{proto.arrow_name(cmd)} is not valid for DoPut")
        # an open stream holds a server thread while the client sends (or idles): one over
        # the principal's max_open_puts waits for another to close, up to the deadline
        timeout = self._timeout_s(self._session(context, principal))
        until = time.monotonic() + timeout if timeout else None
        self._puts.acquire(principal.user, until, gone=lambda: client_gone(context))
        try:
            handler(self, context, principal, cmd, reader, writer)
        finally:
            self._puts.release(principal.user)

    def _put_statement_update(self, context, principal, cmd, reader, writer):
        self._no_transaction(cmd)
        sql = self._check_sql(cmd.query)
        if ingest.carries_rows(reader, self.config.max_message_bytes):
            raise invalid("CommandStatementUpdate takes no parameters; prepare the statement "
                          "(CreatePreparedStatement) and bind the rows to its handle",
                          statement=sql)
        prepared = self._prepare(context, principal, sql)
        self._write_count(writer, self._update("DoPut", context, principal, prepared, None))

    def _put_bind(self, context, principal, cmd, reader, writer):
        entry = self._lookup(context, principal, cmd.prepared_statement_handle)
        params = ingest.read_params(reader, self.config.max_message_bytes)
        self._forget_early(entry)  # a new bind: the run of the last one is not wanted
        entry.params = params
        entry.early = self._start_early(context, principal, entry.prepared, params)

    def _put_prepared_update(self, context, principal, cmd, reader, writer):
        entry = self._lookup(context, principal, cmd.prepared_statement_handle)
        params = ingest.read_params(reader, self.config.max_message_bytes)
        if params is None:
            params = entry.params
        n = self._update("DoPut", context, principal, entry.prepared, params)
        self._write_count(writer, n)

    def _put_ingest(self, context, principal, cmd, reader, writer):
        table = ingest.check_target(cmd)
        self._note(table=table)
        if principal.role != Role.WRITER or self._read_only:
            raise errors.PermissionDenied(f"role {principal.role.value} may not ingest",
                                          user=principal.user, table=table)
        mode = ingest.ingest_mode(cmd, lambda: table in self._engine.list_tables())
        session = self._session(context, principal)
        prepared = Prepared(f"-- ingest {mode.value} into {table}", StatementKind.UPDATE,
                            EMPTY_SCHEMA, EMPTY_SCHEMA, effects=True, statement_kind="ingest")
        # an upload runs as long as the client sends (no statement deadline); cancelling
        # the call still stops it
        st = self._begin("DoPut", context, principal, session, prepared, deadline=False)
        data = ingest.limited(reader, self.config.max_message_bytes, st.cancel,
                              gone=lambda: client_gone(context))
        n = self._run(st, self._engine.ingest, table, mode, data, session, cancel=st.cancel)
        st.affected = int(n)
        self._end(st)
        self._write_count(writer, int(n))

    _PUT = {
        proto.CommandStatementUpdate: _put_statement_update,
        proto.CommandPreparedStatementQuery: _put_bind,
        proto.CommandPreparedStatementUpdate: _put_prepared_update,
        proto.CommandStatementIngest: _put_ingest,
    }

    @staticmethod
    def _write_count(writer, count: int) -> None:
        result = proto.DoPutUpdateResult(record_count=count).SerializeToString()
        writer.write(pa.py_buffer(result))

    # == DoAction ============================================================================

    def _do_action(self, context, action):
        kind = action.type
        self._note(command=kind)
        entry = self._ACTIONS.get(kind)
        if entry is None:
            raise unimplemented("unknown action", action=kind[:64])
        body = action.body.to_pybytes() if action.body is not None else b""
        if len(body) > self.config.max_message_bytes:
            raise errors.LimitExceeded("action body larger than the server accepts",
                                       limit="max_message_bytes",
                                       value=self.config.max_message_bytes)
        return entry[1](self, context, principal_of(context), body)

    def _act_create_prepared(self, context, principal, body):
        req = proto.unpack(body)
        if not isinstance(req, proto.ActionCreatePreparedStatementRequest):
            raise invalid(f"CreatePreparedStatement got {proto.arrow_name(req)}")
        self._no_transaction(req)
        sql = self._check_sql(req.query)
        prepared = self._prepare(context, principal, sql)
        handle = self._new_handle(principal.user, sql)
        self._prepared.add(principal.user, handle, _PreparedEntry(prepared))
        dataset = md.annotate_result_schema(prepared.dataset_schema) \
            if prepared.kind == StatementKind.QUERY else EMPTY_SCHEMA
        params = prepared.parameter_schema
        result = proto.ActionCreatePreparedStatementResult(
            prepared_statement_handle=handle,
            dataset_schema=dataset.serialize().to_pybytes(),
            parameter_schema=params.serialize().to_pybytes() if len(params) else b"",
        )
        return [flight.Result(proto.pack(result))]

    def _act_close_prepared(self, context, principal, body):
        req = proto.unpack(body)
        if not isinstance(req, proto.ActionClosePreparedStatementRequest):
            raise invalid(f"ClosePreparedStatement got {proto.arrow_name(req)}")
        handle = req.prepared_statement_handle
        entry = self._prepared.pop(principal.user, handle)
        here = entry is not None
        if here:
            self._forget_early(entry)
        made = self._made_by(principal, handle)  # None: one process, or not a handle here
        if made is None:
            if not here:
                raise NotFound("unknown or expired prepared statement handle",
                               handle=handle.hex()[:16])
            return []
        digest = _digest(handle)
        with self._closed_lock:
            closed = digest in self._closed_handles
        if not here and (made == self._forwarded.index or closed):
            # closed or expired already: on its own worker, or on any after a close (as
            # one server answers a second close)
            raise NotFound("unknown or expired prepared statement handle",
                           handle=handle.hex()[:16])
        # closed everywhere, as on one server: each worker holding it gives back its count,
        # and none re-creates it later (a close on the worker that made it, of a handle no
        # other worker had used yet, told nobody: another worker still ran it)
        with self._closed_lock:
            self._closed_handles[digest] = True
        self._tell_workers("close", principal.user, digest)
        return []

    def _act_cancel_flight_info(self, context, principal, body):
        req = proto.parse(proto.CancelFlightInfoRequest, body)
        status = self._cancel(principal, req.info)
        return [flight.Result(proto.CancelFlightInfoResult(status=status).SerializeToString())]

    def _act_cancel_query(self, context, principal, body):
        req = proto.unpack(body)
        if not isinstance(req, proto.ActionCancelQueryRequest):
            raise invalid(f"CancelQuery got {proto.arrow_name(req)}")
        status = self._cancel(principal, req.info)
        return [flight.Result(proto.pack(proto.ActionCancelQueryResult(result=status)))]

    def _act_close_session(self, context, principal, body):
        self._sessions.pop(principal.user, self._peer(context))
        result = proto.CloseSessionResult(status=proto.CloseSessionStatus.CLOSED)
        return [flight.Result(result.SerializeToString())]

    def _act_get_session_options(self, context, principal, body):
        proto.parse(proto.GetSessionOptionsRequest, body)
        session = self._session(context, principal)
        result = proto.GetSessionOptionsResult()
        for name, value in {**_FIXED_SESSION_OPTIONS, **session.settings}.items():
            result.session_options[name].string_value = str(value)
        return [flight.Result(result.SerializeToString())]

    def _act_set_session_options(self, context, principal, body):
        """Flight's session options: ``catalog`` and ``schema`` (ADBC's current catalog
        and schema) may be set to the one catalog and schema there are; the session
        settings ``SET`` changes (``delete_mode``, ``statement_timeout``) are set as by
        ``SET``, and unset (a valueless option) back to their defaults. Every other name
        is INVALID_NAME; a value that ``SET`` would refuse is INVALID_VALUE."""
        req = proto.parse(proto.SetSessionOptionsRequest, body)
        errs: dict[str, proto.SessionOptionError] = {}
        changes: dict[str, str | None] = {}
        for name, value in req.session_options.items():
            key = name.lower()
            raw, kind = _option_text(value)
            if key in _FIXED_SESSION_OPTIONS:
                if raw is None or raw.lower() != _FIXED_SESSION_OPTIONS[key]:
                    errs[name] = proto.SessionOptionError.INVALID_VALUE
            elif key in SESSION_SETTINGS:
                if kind is None:
                    changes[key] = None  # unset: back to the default
                    continue
                try:
                    if raw is None:
                        raise ValueError("a list")
                    changes[key] = SESSION_SETTINGS[key](raw)
                except ValueError:
                    errs[name] = proto.SessionOptionError.INVALID_VALUE
            else:
                errs[name] = proto.SessionOptionError.INVALID_NAME
        if changes:  # the others are set even when one was refused, as the spec has it
            session = self._session(context, principal, keep=True)
            for key, v in changes.items():
                if v is None:
                    session.settings.pop(key, None)
                else:
                    session.settings[key] = v
        result = proto.SetSessionOptionsResult()
        for name, code in errs.items():
            result.errors[name].value = int(code)
        return [flight.Result(result.SerializeToString())]

    def _act_transaction(self, context, principal, body):
        raise unimplemented("transactions are not supported")

    _ACTIONS = {
        "CreatePreparedStatement": ("Create a prepared statement (ActionCreatePrepared"
                                    "StatementRequest -> ActionCreatePreparedStatementResult)",
                                    _act_create_prepared),
        "ClosePreparedStatement": ("Close one of your prepared statements",
                                   _act_close_prepared),
        "CancelFlightInfo": ("Cancel your query: interrupts it if running, else its "
                             "DoGet fails with CANCELLED", _act_cancel_flight_info),
        "CancelQuery": ("Cancel your query (deprecated; same as CancelFlightInfo)",
                        _act_cancel_query),
        "CloseSession": ("Close your session on this connection (drops its SET values)",
                         _act_close_session),
        "GetSessionOptions": ("Your session's options: catalog, schema and its SET values",
                              _act_get_session_options),
        "SetSessionOptions": ("Set session options: the SET values (delete_mode, "
                              "statement_timeout); catalog and schema name the only ones",
                              _act_set_session_options),
        "BeginTransaction": ("Unsupported: transactions", _act_transaction),
        "EndTransaction": ("Unsupported: transactions", _act_transaction),
        "BeginSavepoint": ("Unsupported: transactions", _act_transaction),
        "EndSavepoint": ("Unsupported: transactions", _act_transaction),
    }

    def _cancel(self, principal: Principal, info_bytes: bytes) -> int:
        try:
            info = flight.FlightInfo.deserialize(info_bytes)
        except Exception:  # noqa: BLE001 - any parse failure is a bad request
            raise invalid("CancelFlightInfo needs a serialized FlightInfo") from None
        status = proto.CancelStatus.NOT_CANCELLABLE
        for endpoint in info.endpoints:
            t = self._codec.verify(endpoint.ticket.ticket)
            if t.user != principal.user:
                raise ForeignTicket("ticket was issued to another principal",
                                    user=principal.user)
            if t.kind in ("query", "metadata"):
                self._calls.cancel_ticket(principal.user, t.nonce)
                # its stream may run, or start, on another worker: cancelled there too
                self._tell_workers("cancel", principal.user, t.nonce)
                status = proto.CancelStatus.CANCELLED
        return int(status)

    # == lifecycle ===========================================================================

    def begin_drain(self) -> None:
        """Refuse new calls (UNAVAILABLE); calls and streams in progress go on."""
        self._draining.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call or stream is in progress; False if ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        with self._active_lock:
            while self._active > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._active_lock.wait(left)
        return True

    def cancel_all(self, reason: str = "cancelled") -> int:
        return self._calls.cancel_all(reason)

    def statements_running(self) -> int:
        """Statements holding a concurrency slot now (all principals) in this process."""
        return self._slots.count()

    def server_busy(self) -> bool:
        """Whether any statement is running on the server: in this process, or behind
        ``--workers`` in any worker (as each last published it)."""
        return self._slots.count() > 0 or (self._busy is not None and self._busy.others() > 0)

    def shutdown(self):
        self._draining.set()
        if self.maintenance is not None:
            self.maintenance.stop(timeout=5.0)  # a run in progress finishes on its own
        self._calls.cancel_all("cancelled")
        super().shutdown()
        if self._early_pool is not None:  # their calls are cancelled: they end now
            self._early_pool.shutdown(wait=True, cancel_futures=True)
        self._calls.close()
        self.metrics.close()
        if self._busy is not None:
            self._busy.close()
        if getattr(self, "_frameless", False):
            self._frameless = False
            frameless_tracebacks(False)

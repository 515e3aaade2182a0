"""The contract between the Flight SQL front end (``flightsrv.server``) and the SQL engine
(``flightsrv.engine`` + ``flightsrv.sql``).

The server speaks the wire protocol and knows nothing of tables; the engine knows tables,
SQL and DuckDB and nothing of Flight. Dependencies point one way: server -> engine.

Errors raised by the engine are ``flightsrv.errors`` classes; the server maps them to Flight
status codes (SqlError/SchemaMismatch/ConfigurationError -> INVALID_ARGUMENT,
TableNotFound/VersionNotFound -> NOT_FOUND, TableExists -> ALREADY_EXISTS,
CommitConflict -> ABORTED, PermissionDenied -> UNAUTHORIZED, CorruptObject -> INTERNAL).
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

import pyarrow as pa

from flightsrv.errors import QueryCancelled


class Role(enum.Enum):
    READER = "reader"  # SELECT and metadata only
    WRITER = "writer"  # everything


@dataclass
class Session:
    """Per-connection state. ``settings`` holds session settings such as delete_mode."""

    session_id: str
    user: str = "anonymous"
    role: Role = Role.WRITER
    settings: dict[str, str] = field(default_factory=dict)


class StatementKind(enum.Enum):
    QUERY = "query"  # returns rows
    UPDATE = "update"  # returns a row count (DELETE, INSERT, CREATE, DROP, maintenance)


@dataclass
class Prepared:
    """What the engine knows about a statement before running it."""

    sql: str
    kind: StatementKind
    dataset_schema: pa.Schema  # empty schema for UPDATE
    parameter_schema: pa.Schema  # empty when the statement has no ``?`` / ``$n`` parameters
    #: True when running the statement changes state (DML, DDL, maintenance, SET). Such a
    #: statement must run exactly once, at the request that carries it (GetFlightInfo /
    #: DoPut), never when a result is fetched; a QUERY with effects (OPTIMIZE, VACUUM,
    #: PURGE) has its result kept by the caller and handed out once.
    effects: bool = False
    #: what the statement is, for logs and metrics: select | delete | update | merge |
    #: insert | create | drop | maintenance | set | show ...
    statement_kind: str = "select"
    #: a query's: the version of each table it references without ``AT`` that
    #: ``dataset_schema`` was described over (``execute_query(versions=...)`` reads them);
    #: None when not known
    versions: dict[str, int] | None = None


class Cancel:
    """A cancellation token for one call.

    The server trips it (the client cancelled, the deadline passed, the server drains);
    the engine registers callbacks that interrupt the running work (DuckDB's
    ``interrupt()``) and calls :meth:`check` between steps. Once tripped it stays tripped.
    ``reason`` is "cancelled" or "timeout".

    DuckDB forgets an ``interrupt()`` that reaches a connection before its query starts
    (the query clears the flag when it begins), so a cancel landing between the engine's
    last :meth:`check` and DuckDB's start would be lost, and the query would run to its
    end, past its deadline too. An interrupt registered with :meth:`interrupt_with` is
    therefore run again by :meth:`reinterrupt` (the server's watchdog calls it every
    0.1 s for each tripped call still running) until it is unregistered.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._interrupts: list[Callable[[], None]] = []
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self.reason is not None

    def cancel(self, reason: str = "cancelled") -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            callbacks, self._callbacks = self._callbacks, []
            callbacks = list(self._interrupts) + callbacks
        _run_all(callbacks)

    def on_cancel(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Run ``fn`` when cancelled (now, if already cancelled). Returns an unregister
        function; call it when the work that ``fn`` interrupts has finished."""
        with self._lock:
            if self.reason is None:
                self._callbacks.append(fn)
                return lambda: self._discard(self._callbacks, fn)
        fn()
        return lambda: None

    def interrupt_with(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Run ``fn`` (an idempotent interrupt) when cancelled, now if already cancelled,
        and again at each :meth:`reinterrupt` until the returned function unregisters
        it (when the work it interrupts has finished)."""
        with self._lock:
            self._interrupts.append(fn)
            now = self.reason is not None
        if now:
            _run_all([fn])
        return lambda: self._discard(self._interrupts, fn)

    def reinterrupt(self) -> None:
        """Run the registered interrupts again, if cancelled."""
        with self._lock:
            if self.reason is None:
                return
            fns = list(self._interrupts)
        _run_all(fns)

    def _discard(self, fns: list, fn) -> None:
        with self._lock:
            try:
                fns.remove(fn)
            except ValueError:
                pass

    def check(self, **context) -> None:
        """Raise :class:`~flightsrv.errors.QueryCancelled` if cancelled."""
        if self.reason is not None:
            what = "timed out" if self.reason == "timeout" else "was cancelled"
            raise QueryCancelled(f"statement {what}",
                                 reason=self.reason, **context)


def _run_all(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        try:
            fn()
        except Exception:  # noqa: BLE001 - an interrupt is best effort
            pass


@dataclass
class ExecInfo:
    """What a statement did, for the one log line per statement and for metrics. The engine
    fills it while it runs (a streamed query keeps updating ``rows``/``bytes``)."""

    kind: str = "select"
    tables: dict[str, int] = field(default_factory=dict)  # table -> version read
    rows: int = 0  # rows returned (queries) or affected (updates)
    bytes: int = 0  # result bytes returned
    files_scanned: int = 0
    files_pruned: int = 0
    row_groups_scanned: int = 0
    row_groups_pruned: int = 0
    rows_masked: int = 0  # rows hidden by deletion vectors in the files read
    chunks_pruned: int = 0  # manifest chunks skipped by their summaries (never read)
    commits: list[tuple[str, int]] = field(default_factory=list)  # (table, version) written
    #: a query's read set: (table, table uuid, version) per table its text references, as
    #: pinned (``DuckEngine.read_set`` spells the same for now); None: not known
    read_set: tuple | None = None


@dataclass
class QueryResult:
    schema: pa.Schema
    reader: pa.RecordBatchReader  # streamed batch by batch; never materialised whole
    info: ExecInfo = field(default_factory=ExecInfo)


class IngestMode(enum.Enum):
    CREATE = "create"  # fail if the table exists
    APPEND = "append"  # fail if it does not
    REPLACE = "replace"  # drop and create
    CREATE_APPEND = "create_append"


class Engine(Protocol):
    """``cancel`` (optional everywhere) interrupts the call; a cancelled call raises
    :class:`~flightsrv.errors.QueryCancelled` and commits nothing it had not committed."""

    def prepare(self, sql: str, session: Session,
                params: pa.RecordBatch | None = None, *,
                cancel: Cancel | None = None) -> Prepared:
        """``params``: the values a query is about to run with; its ``dataset_schema`` is
        then the one they give (a result column typed by a parameter), else the schema with
        every parameter NULL. ``cancel`` interrupts DuckDB's binding of the statement."""
        ...

    def execute_query(
        self, sql: str, session: Session, params: pa.RecordBatch | None = None, *,
        cancel: Cancel | None = None, versions: dict[str, int] | None = None,
    ) -> QueryResult:
        """``versions``: a table referenced without ``AT`` is read at the version given
        for its name (``Prepared.versions``), not at its head."""
        ...

    def execute_update(
        self, sql: str, session: Session, params: pa.RecordBatch | None = None, *,
        cancel: Cancel | None = None, info: ExecInfo | None = None,
    ) -> int: ...

    def ingest(
        self, table: str, mode: IngestMode, data: pa.RecordBatchReader, session: Session, *,
        cancel: Cancel | None = None,
    ) -> int: ...

    def list_tables(self, broken: list | None = None) -> list[str]:
        """Live tables; unreadable ones are left out and, if ``broken`` is a list, appended
        to it as ``(name, error)``."""
        ...

    def table_schema(self, table: str) -> pa.Schema: ...

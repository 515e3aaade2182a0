"""The contract between the Flight SQL front end (``flightsrv.server``) and the SQL engine
(``flightsrv.engine`` + ``flightsrv.sql``).

The server speaks the wire protocol and knows nothing of tables; the engine knows tables,
SQL and DuckDB and nothing of Flight. Dependencies point one way: server -> engine.

Errors raised by the engine are ``flightsrv.errors`` classes; the server maps them to Flight
status codes (SqlError/PredicateError/SchemaMismatch/ConfigurationError -> INVALID_ARGUMENT,
TableNotFound/VersionNotFound -> NOT_FOUND, TableExists -> ALREADY_EXISTS,
CommitConflict -> ABORTED, PermissionDenied -> UNAUTHORIZED, CorruptObject -> INTERNAL).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa


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


@dataclass
class QueryResult:
    schema: pa.Schema
    reader: pa.RecordBatchReader  # streamed batch by batch; never materialised whole


class IngestMode(enum.Enum):
    CREATE = "create"  # fail if the table exists
    APPEND = "append"  # fail if it does not
    REPLACE = "replace"  # drop and create
    CREATE_APPEND = "create_append"


class Engine(Protocol):
    def prepare(self, sql: str, session: Session) -> Prepared: ...

    def execute_query(
        self, sql: str, session: Session, params: pa.RecordBatch | None = None
    ) -> QueryResult: ...

    def execute_update(
        self, sql: str, session: Session, params: pa.RecordBatch | None = None
    ) -> int: ...

    def ingest(
        self, table: str, mode: IngestMode, data: pa.RecordBatchReader, session: Session
    ) -> int: ...

    def list_tables(self) -> list[str]: ...

    def table_schema(self, table: str) -> pa.Schema: ...

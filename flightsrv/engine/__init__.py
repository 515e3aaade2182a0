"""The SQL engine: DuckDB sessions over pinned table snapshots.

- :mod:`.api`         the Engine contract the Flight SQL server calls
- :mod:`.connection`  the locked-down DuckDB connection and per-request cursors
- :mod:`.duck`        ``DuckEngine``: register snapshots, execute, stream, DML/DDL
"""

from flightsrv.engine.api import (
    Engine,
    IngestMode,
    Prepared,
    QueryResult,
    Role,
    Session,
    StatementKind,
)


def __getattr__(name):  # DuckEngine imports duckdb; load it only when asked for
    if name == "DuckEngine":
        from flightsrv.engine.duck import DuckEngine

        return DuckEngine
    raise AttributeError(name)


__all__ = ["DuckEngine", "Engine", "IngestMode", "Prepared", "QueryResult", "Role", "Session",
           "StatementKind"]

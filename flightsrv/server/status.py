"""Map exceptions to Flight/gRPC status codes.

pyarrow turns an arbitrary Python exception into gRPC UNKNOWN, so every handler funnels its
failures through ``to_flight_error``, which picks the exception class pyarrow maps to the
wanted code:

==================================================  ==================  ======================
flightsrv error                                     raised as           gRPC status
==================================================  ==================  ======================
SqlError, PredicateError, SchemaMismatch,           pa.ArrowInvalid     INVALID_ARGUMENT
ConfigurationError, a malformed request
TableNotFound, VersionNotFound, unknown handle      pa.ArrowKeyError    NOT_FOUND
TableExists                                         pa.ArrowInvalid     INVALID_ARGUMENT (*)
CommitConflict, other TransientError                FlightUnavailable   UNAVAILABLE (*)
PermissionDenied                                    FlightUnauthorized  PERMISSION_DENIED
CorruptObject, ObjectNotFound (a data or deletion-  FlightInternal      INTERNAL
vector object a manifest names is missing), other
PersistentStateError, anything else
unsupported feature                                 ArrowNotImplemented UNIMPLEMENTED
==================================================  ==================  ======================

(*) pyarrow can raise neither ALREADY_EXISTS nor ABORTED from Python (its Arrow-status ->
gRPC table has no entry reachable from a Python exception), so the contract's
``TableExists -> ALREADY_EXISTS`` and ``CommitConflict -> ABORTED`` become the nearest
codes with the same advice: "fix the request" and "retry". The message keeps the class name
(``TableExists: ...``) so a client can still tell them apart.

Messages carry the statement and table as ``key=value`` context. Unexpected exceptions are
logged with their traceback here and reach the client as INTERNAL without it.
"""

from __future__ import annotations

import logging

import pyarrow as pa
from pyarrow import flight

from flightsrv import errors
from flightsrv.server.proto import ProtocolError

log = logging.getLogger("flightsrv.server")

_MAX_SQL_IN_MESSAGE = 200

# DuckDB exception class names that mean "the statement is wrong" should an engine let one
# escape; matched by name so that the server does not import duckdb.
_DUCKDB_USER_ERRORS = {
    "ParserException",
    "BinderException",
    "CatalogException",
    "ConversionException",
    "InvalidInputException",
    "ConstraintException",
    "TypeMismatchException",
    "SyntaxException",
    "NotImplementedException",
    "OutOfRangeException",
    "DependencyException",
}

# A DuckDB error that surfaces while an Arrow reader is being drained arrives as an
# OSError/ArrowIOError carrying DuckDB's message; these prefixes mean a user error.
_DUCKDB_USER_MESSAGES = (
    "Invalid Input Error", "Conversion Error", "Binder Error", "Parser Error",
    "Catalog Error", "Out of Range Error", "Constraint Error", "Type Mismatch Error",
    "Not implemented Error", "Dependency Error",
)  # fmt: skip


def short_sql(sql: str | None) -> str | None:
    if sql is None:
        return None
    one_line = " ".join(sql.split())
    if len(one_line) > _MAX_SQL_IN_MESSAGE:
        one_line = one_line[: _MAX_SQL_IN_MESSAGE - 3] + "..."
    return one_line


def _with_context(message: str, **context) -> str:
    parts = [f"{k}={v!r}" if k == "statement" else f"{k}={v}"
             for k, v in context.items() if v is not None and f"{k}=" not in message]  # fmt: skip
    return f"{message} ({' '.join(parts)})" if parts else message


def to_flight_error(exc: BaseException, *, statement: str | None = None,
                    table: str | None = None) -> Exception:  # fmt: skip
    """The exception to raise towards the client for ``exc``."""
    if isinstance(exc, flight.FlightError) and not isinstance(exc, flight.FlightServerError):
        return exc  # already a deliberate Flight status
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowNotImplementedError)):
        return exc
    ctx = {"statement": short_sql(statement), "table": table}
    name = type(exc).__name__
    msg = _with_context(f"{name}: {exc}", **ctx)
    if isinstance(exc, errors.PermissionDenied):
        return flight.FlightUnauthorizedError(msg)
    if isinstance(exc, (errors.TableNotFound, errors.VersionNotFound)):
        return pa.ArrowKeyError(msg)
    if isinstance(exc, errors.ConfigurationError):  # incl. TableExists, SqlError, ...
        return pa.ArrowInvalid(msg)
    if isinstance(exc, errors.TransientError):  # incl. CommitConflict
        return flight.FlightUnavailableError(msg)
    if isinstance(exc, errors.PersistentStateError):
        log.error("persistent state error: %s", msg)
        return flight.FlightInternalError(msg)
    if isinstance(exc, ProtocolError):
        return pa.ArrowInvalid(msg)
    if isinstance(exc, NotImplementedError):
        return pa.ArrowNotImplementedError(msg)
    if type(exc).__module__.split(".")[0].lstrip("_") == "duckdb" and name in _DUCKDB_USER_ERRORS:
        return pa.ArrowInvalid(msg)
    if isinstance(exc, OSError) and str(exc).startswith(_DUCKDB_USER_MESSAGES):
        return pa.ArrowInvalid(msg)
    if isinstance(exc, flight.FlightServerError):
        return exc
    log.exception("unexpected error: %s", msg, exc_info=exc)
    return flight.FlightInternalError(msg)


def invalid(message: str, **context) -> pa.ArrowInvalid:
    return pa.ArrowInvalid(_with_context(message, **context))


def not_found(message: str, **context) -> pa.ArrowKeyError:
    return pa.ArrowKeyError(_with_context(message, **context))


def unimplemented(message: str, **context) -> pa.ArrowNotImplementedError:
    return pa.ArrowNotImplementedError(_with_context(message, **context))

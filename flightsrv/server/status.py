"""Exceptions -> Flight/gRPC status codes, with messages safe to show a client.

pyarrow turns an arbitrary Python exception into gRPC UNKNOWN, so every failure goes
through ``to_flight_error``, which picks the exception class pyarrow maps to the wanted
code:

==============================================  ===================  ==================
cause                                           raised as            gRPC status
==============================================  ===================  ==================
SqlError, SchemaMismatch,                       pa.ArrowInvalid      INVALID_ARGUMENT
ConfigurationError, TableExists (*),
LimitExceeded (statement size, nesting),
a malformed request or ticket
TableNotFound, VersionNotFound, unknown or      pa.ArrowKeyError     NOT_FOUND
expired prepared statement / result / ticket
forged ticket, bad credentials                  FlightUnauthenticated UNAUTHENTICATED
PermissionDenied (role, another's ticket)       FlightUnauthorized   PERMISSION_DENIED
QueryCancelled reason=cancelled                 FlightCancelled      CANCELLED
QueryCancelled reason=timeout                   FlightTimedOut       DEADLINE_EXCEEDED
CommitConflict, TransientError (*),             FlightUnavailable    UNAVAILABLE
ResourceLimit (per-principal limits), draining
CorruptObject, ObjectNotFound, other            FlightInternal       INTERNAL
PersistentStateError, CommitOutcomeUnknown
unsupported feature                             ArrowNotImplemented  UNIMPLEMENTED
anything else (a bug)                           FlightInternal       INTERNAL, no detail
==============================================  ===================  ==================

(*) pyarrow can raise neither ALREADY_EXISTS, ABORTED nor RESOURCE_EXHAUSTED from Python,
so TableExists, CommitConflict and the per-principal limits take the nearest code with the
same advice; the message starts with the class name so clients can tell them apart.

What reaches the client:

- the message of a flightsrv error (class name, text, ``key=value`` context), with server
  paths (warehouse root, spill directory, the package's install directory, the home
  directory) replaced by ``<warehouse>``, ``<temp>``, ``<install>``, ``<home>``, except a
  path the statement itself contains (echoed back as written: no guessing oracle);
- for an unexpected exception only its class name and an incident id (the traceback goes
  to the server log under that id);
- no stack trace. pyarrow builds INVALID_ARGUMENT, NOT_FOUND and UNIMPLEMENTED from a
  Python exception and appends ``Detail: Python exception: ...`` to their message, formatted
  by ``traceback.format_exception`` with no limit, so by default that is a whole traceback
  (pyarrow's ``_flight.pyx`` frame and the handler's). While a server runs, its process's
  ``sys.tracebacklimit`` is 0 (:func:`frameless_tracebacks`), and the detail shrinks to
  ``Python exception: pyarrow.lib.ArrowInvalid: <the message again>``. flightsrv's own log
  formatter and ``--debug`` pass an explicit limit, so the server log keeps whole
  tracebacks. As a second line of defence the Flight entry points are compiled under the
  file name ``<flightsrv>`` and re-raise a fresh exception (``neutral_entry``), so a trace
  formatted in spite of the limit names no server path and no source line. FlightError
  statuses carry no detail at all.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable

import pyarrow as pa
from pyarrow import flight

from flightsrv import errors
from flightsrv.server.proto import ProtocolError

log = logging.getLogger("flightsrv.server")

_MAX_SQL_IN_MESSAGE = 200


# -- server-side error classes ------------------------------------------------------------


class NotFound(errors.ConfigurationError):
    """An unknown, expired or already redeemed handle, result or ticket (NOT_FOUND)."""


class Unauthenticated(errors.FlightsrvError):
    """Credentials or a ticket signature that do not check out (UNAUTHENTICATED)."""


class ResourceLimit(errors.LimitExceeded):
    """A per-principal limit (prepared statements, sessions, concurrent queries): retry
    once something was closed or finished (UNAVAILABLE)."""


class Draining(errors.TransientError):
    """The server is shutting down and takes no new calls (UNAVAILABLE)."""


# -- DuckDB errors by name (the server does not import duckdb) ----------------------------

_DUCKDB_USER_ERRORS = {
    "ParserException", "BinderException", "CatalogException", "ConversionException",
    "InvalidInputException", "ConstraintException", "TypeMismatchException",
    "SyntaxException", "NotImplementedException", "OutOfRangeException",
    "DependencyException",
}  # fmt: skip
_DUCKDB_USER_MESSAGES = (
    "Invalid Input Error", "Conversion Error", "Binder Error", "Parser Error",
    "Catalog Error", "Out of Range Error", "Constraint Error", "Type Mismatch Error",
    "Not implemented Error", "Dependency Error",
)  # fmt: skip
_OOM_MESSAGES = ("Out of Memory Error", "OutOfMemoryException")


def short_sql(sql: str | None) -> str | None:
    if sql is None:
        return None
    one_line = " ".join(sql.split())
    if len(one_line) > _MAX_SQL_IN_MESSAGE:
        one_line = one_line[: _MAX_SQL_IN_MESSAGE - 3] + "..."
    return one_line


def _with_context(message: str, **context) -> str:
    """``message`` with ``context`` it does not name yet, on its first line (the lines after
    it are DuckDB's hints and caret, :attr:`~flightsrv.errors.FlightsrvError.detail`)."""
    first, nl, detail = message.partition("\n")
    parts = [f"{k}={v!r}" if k == "statement" else f"{k}={v}"
             for k, v in context.items() if v is not None and f"{k}=" not in first]  # fmt: skip
    return (f"{first} ({' '.join(parts)})" if parts else first) + nl + detail


class Scrubber:
    """Replaces server paths in client-bound messages by placeholders."""

    def __init__(self, paths: Iterable[tuple[str, str]] = ()):
        import flightsrv

        base = [(os.path.dirname(os.path.dirname(os.path.abspath(flightsrv.__file__))),
                 "<install>"), (os.path.dirname(os.path.abspath(pa.__file__)), "<install>")]
        home = os.path.expanduser("~")
        items = [(p, label) for p, label in [*paths, *base] if p]
        # longest first, so a warehouse inside the home directory keeps its own label
        self._paths = sorted({(os.path.abspath(p), label) for p, label in items},
                             key=lambda x: -len(x[0]))
        if home not in ("/", "~", ""):
            self._paths.append((home, "<home>"))

    def __call__(self, text: str, keep: str | None = None) -> str:
        """``text`` with the server paths replaced, except those ``keep`` (the statement the
        message is about) contains: a path the client wrote comes back as written, so
        echoing a guess (``SELECT error('/srv/lake')``) reads the same whether it is a
        server path or not (a replaced guess confirmed it), and the client's own text is
        never rewritten (``/rooty`` stays, not ``<home>y``)."""
        for path, label in self._paths:
            if path and path in text and not (keep and path in keep):
                text = text.replace(path, label)
        return text


_DEFAULT_SCRUB = Scrubber()


def to_flight_error(exc: BaseException, *, statement: str | None = None,
                    table: str | None = None, scrub: Callable[[str], str] = _DEFAULT_SCRUB,
                    incident: str | None = None) -> Exception:  # fmt: skip
    """The exception to raise towards the client for ``exc``."""
    ctx = {"statement": short_sql(statement), "table": table}
    name = type(exc).__name__
    if isinstance(scrub, Scrubber) and statement:
        scrub = functools.partial(scrub, keep=statement)
    if isinstance(exc, flight.FlightError):  # already a deliberate Flight status
        return type(exc)(scrub(str(exc))) if type(exc) is not flight.FlightError else \
            flight.FlightInternalError(scrub(str(exc)))
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowKeyError, pa.ArrowNotImplementedError)):
        return type(exc)(scrub(str(exc)))
    msg = scrub(_with_context(f"{name}: {exc}", **ctx))
    if "\n" in msg:  # the caret line ends the message, whatever a client appends after it
        msg += "\n"
    if isinstance(exc, errors.QueryCancelled):
        if exc.context.get("reason") == "timeout":
            return flight.FlightTimedOutError(msg)
        return flight.FlightCancelledError(msg)
    if isinstance(exc, Unauthenticated):
        return flight.FlightUnauthenticatedError(msg)
    if isinstance(exc, errors.PermissionDenied):
        return flight.FlightUnauthorizedError(msg)
    if isinstance(exc, (ResourceLimit, Draining)):
        return flight.FlightUnavailableError(msg)
    # the error's own message, never text the statement supplied (a literal, a name):
    # DuckDB's Out of Memory starts it (a SqlError carries DuckDB's message as its own)
    text = str(exc)
    head = exc.message if isinstance(exc, errors.FlightsrvError) else text
    if isinstance(exc, MemoryError) or head.startswith(_OOM_MESSAGES):
        # DuckDB's own (SqlError wraps it too), or the process's cap refused Python an
        # allocation: a limit, not a mistake in the statement
        return flight.FlightUnavailableError(_with_context(
            "LimitExceeded: the statement needs more memory than the server allows "
            "(--memory-limit, and the process cap --memory-headroom above it) "
            "(limit=memory_limit)", **ctx))
    if isinstance(exc, (errors.TableNotFound, errors.VersionNotFound, NotFound)):
        return pa.ArrowKeyError(msg)
    if isinstance(exc, errors.ConfigurationError):  # incl. TableExists, SqlError, ...
        return pa.ArrowInvalid(msg)
    if isinstance(exc, errors.TransientError):  # incl. CommitConflict
        return flight.FlightUnavailableError(msg)
    if isinstance(exc, errors.PersistentStateError):
        log.error("persistent state error: %s", msg)
        return flight.FlightInternalError(msg)
    if isinstance(exc, errors.CommitOutcomeUnknown):  # not UNAVAILABLE: a retry may repeat it
        log.error("commit outcome unknown: %s", msg)
        return flight.FlightInternalError(msg)
    if isinstance(exc, ProtocolError):
        return pa.ArrowInvalid(msg)
    if isinstance(exc, RecursionError):
        return pa.ArrowInvalid(_with_context(
            "LimitExceeded: statement nests too deeply for the server", **ctx))
    if isinstance(exc, NotImplementedError):
        return pa.ArrowNotImplementedError(msg)
    if type(exc).__module__.split(".")[0].lstrip("_") == "duckdb" and name in _DUCKDB_USER_ERRORS:
        return pa.ArrowInvalid(msg)
    if isinstance(exc, OSError) and text.startswith(_DUCKDB_USER_MESSAGES):
        return pa.ArrowInvalid(msg)
    incident = incident or os.urandom(6).hex()
    log.error("unexpected error", exc_info=exc, extra={"fields": {
        "event": "internal_error", "incident": incident, "error_class": name}})
    return flight.FlightInternalError(_with_context(
        f"internal error: unexpected {name}; the server log has the details", **ctx,
        incident=incident))


def invalid(message: str, **context) -> pa.ArrowInvalid:
    return pa.ArrowInvalid(_with_context(message, **context))


def not_found(message: str, **context) -> NotFound:
    return NotFound(message, **context)


def unimplemented(message: str, **context) -> pa.ArrowNotImplementedError:
    return pa.ArrowNotImplementedError(_with_context(message, **context))


def grpc_status_name(exc: BaseException | None) -> str:
    """The gRPC status a mapped exception becomes (for metrics and logs)."""
    if exc is None:
        return "OK"
    for cls, name in _STATUS_NAMES:
        if isinstance(exc, cls):
            return name
    return "UNKNOWN"


_STATUS_NAMES = (
    (flight.FlightUnauthenticatedError, "UNAUTHENTICATED"),
    (flight.FlightUnauthorizedError, "PERMISSION_DENIED"),
    (flight.FlightCancelledError, "CANCELLED"),
    (flight.FlightTimedOutError, "DEADLINE_EXCEEDED"),
    (flight.FlightUnavailableError, "UNAVAILABLE"),
    (flight.FlightInternalError, "INTERNAL"),
    (pa.ArrowKeyError, "NOT_FOUND"),
    (pa.ArrowNotImplementedError, "UNIMPLEMENTED"),
    (pa.ArrowInvalid, "INVALID_ARGUMENT"),
)


# -- no traceback in a client's status ---------------------------------------------------

_frameless_lock = threading.Lock()
_frameless_users = 0
_frameless_saved: list = []  # the process's own setting while servers run


def frameless_tracebacks(on: bool) -> None:
    """Count a server in (``on``) or out. While at least one runs, ``sys.tracebacklimit`` is 0:
    the ``traceback.format_exception`` call with which pyarrow details a status built from a
    Python exception then formats no frame, only ``Type: message``. The setting the process
    had is restored when the last server stops."""
    global _frameless_users
    with _frameless_lock:
        if on:
            if _frameless_users == 0:
                _frameless_saved[:] = [getattr(sys, "tracebacklimit", _UNSET)]
                sys.tracebacklimit = 0
            _frameless_users += 1
            return
        if _frameless_users == 0:
            return
        _frameless_users -= 1
        if _frameless_users == 0:
            saved = _frameless_saved.pop() if _frameless_saved else _UNSET
            if saved is _UNSET:
                try:
                    del sys.tracebacklimit
                except AttributeError:
                    pass
            else:
                sys.tracebacklimit = saved


_UNSET = object()


# -- entry points with a neutral traceback --------------------------------------------------

_ENTRY = '''
def {name}(self, context, *args):
    try:
        return self.{impl}(context, *args)
    except BaseException as e:
        exc = e
    exc.__context__ = None
    exc.__cause__ = None
    raise exc.with_traceback(None)
'''

_STREAM = '''
def stream(batches):
    try:
        yield from batches
        return
    except GeneratorExit:
        raise
    except BaseException as e:
        exc = e
    exc.__context__ = None
    exc.__cause__ = None
    raise exc.with_traceback(None)
'''


def neutral_entry(name: str, impl: str) -> Callable:
    """A method ``name(self, context, *args)`` that calls ``self.<impl>`` and re-raises its
    (already mapped) exception from a frame whose file is ``<flightsrv>``; see the module
    docstring for why."""
    namespace: dict = {}
    exec(compile(_ENTRY.format(name=name, impl=impl), "<flightsrv>", "exec"), namespace)
    return namespace[name]


_ns: dict = {}
exec(compile(_STREAM, "<flightsrv>", "exec"), _ns)
#: ``neutral_stream(generator)``: the same for a DoGet stream's batches
neutral_stream = _ns["stream"]

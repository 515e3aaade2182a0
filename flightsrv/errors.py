"""The flightsrv error hierarchy, grouped by what the caller should do.

Every error carries its context as ``key=value`` pairs in the message so that a
log line or a client-side error names the table, object and version involved.

- ``ConfigurationError``   fix the call or the configuration; retrying won't help.
- ``TransientError``       retry later (throttling, timeouts, lost races).
- ``PersistentStateError`` the stored state is not what it must be (corrupt or
                           missing objects); an operator must look.
- ``PermissionDenied``     the caller may not do this.
"""

from __future__ import annotations


def _fmt(message: str, context: dict) -> str:
    if not context:
        return message
    ctx = " ".join(f"{k}={v}" for k, v in context.items() if v is not None)
    return f"{message} ({ctx})" if ctx else message


class FlightsrvError(Exception):
    """Base class. ``context`` holds the key=value pairs shown in the message.

    ``detail``: lines shown after the one-line message and its context (DuckDB's hints and
    its ``LINE n:`` with the caret under the statement, :meth:`with_detail`); empty for
    most errors."""

    detail = ""

    def __init__(self, message: str, **context):
        self.message = message
        self.context = context
        super().__init__(_fmt(message, context))

    def with_detail(self, detail: str) -> "FlightsrvError":
        """This error with ``detail`` shown on the lines after its message."""
        self.detail = detail
        self.args = (_fmt(self.message, self.context) + ("\n" + detail if detail else ""),)
        return self

    def with_context(self, **context) -> "FlightsrvError":
        """This error naming also ``context``'s pairs it does not name yet."""
        added = {k: v for k, v in context.items() if k not in self.context}
        if added:
            self.context = {**self.context, **added}
            self.with_detail(self.detail)
        return self


class ConfigurationError(FlightsrvError):
    """Bad input or configuration: fix the request, do not retry."""


class TransientError(FlightsrvError):
    """A retry may succeed."""


class PersistentStateError(FlightsrvError):
    """Stored state is broken or missing."""


class PermissionDenied(FlightsrvError):
    """The caller lacks the role for this operation."""


class QueryCancelled(FlightsrvError):
    """The call was interrupted: the client cancelled it (``reason=cancelled``) or its
    deadline passed (``reason=timeout``). Nothing it had not committed is committed."""


class LimitExceeded(ConfigurationError):
    """A configured limit was reached (statement size, nesting, open statements, ...);
    the message names the limit and its value."""


# -- store level ---------------------------------------------------------------


class ObjectNotFound(PersistentStateError):
    """The key does not exist (HTTP 404)."""


class PreconditionFailed(TransientError):
    """A conditional request lost: If-None-Match on an existing key, or a stale If-Match
    (HTTP 412, or S3's 409 ConditionalRequestConflict)."""


class StoreUnsupported(ConfigurationError):
    """The store does not enforce the preconditions the commit protocol needs."""


class OperationUnsupported(ConfigurationError):
    """The store does not offer this operation (its ``capabilities`` say so): the caller
    should have taken the portable path."""


class StoreError(TransientError):
    """An I/O failure talking to the store that may succeed on retry."""


class StoreAccessDenied(PersistentStateError):
    """The store refused access to an object or prefix (a local file or directory whose
    permissions the server's user lacks; S3's 403): an operator must grant it, a retry
    won't help."""


class CorruptObject(PersistentStateError):
    """An object failed a validity check (magic, CRC, size, JSON, Parquet footer)."""


# -- table level ---------------------------------------------------------------


class CommitConflict(TransientError):
    """The commit loop ran out of retries against concurrent commits."""


class SchemaChanged(TransientError):
    """A table a query reads changed its columns between the query's planning (the schema
    GetFlightInfo announced) and its run, and the versions it was planned at are gone:
    planning it again answers with the new columns."""


class CommitOutcomeUnknown(FlightsrvError):
    """A commit's manifest may or may not have landed, and the store did not answer the
    check (its commit id at that version): not a failure to retry blindly (a retry could
    apply the write twice). The table's history tells (``SHOW HISTORY t``)."""


class TableNotFound(ConfigurationError):
    """No table of that name in the warehouse."""


class TableExists(ConfigurationError):
    """CREATE of a table that already exists."""


class SchemaMismatch(ConfigurationError):
    """Appended data does not match the table schema."""


class VersionNotFound(ConfigurationError):
    """Time travel to a version that never existed or was expired."""



class SqlError(ConfigurationError):
    """A SQL statement that cannot be run; names the statement and position.

    ``engine_text``: the message is DuckDB's own text, which may quote any value DuckDB
    read (a row's, a literal's); the client that sent the statement sees it, a redacted
    log never does (:mod:`flightsrv.server.logs`). ``engine_class``: DuckDB's exception
    class when the message is DuckDB's (``BinderException``)."""

    engine_text = False
    engine_class: str | None = None

    @classmethod
    def from_engine(cls, message: str, **context) -> "SqlError":
        """A SqlError whose message is DuckDB's text (``engine_text``)."""
        err = cls(message, **context)
        err.engine_text = True
        return err

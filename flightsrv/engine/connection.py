"""The one locked-down DuckDB connection the engine serves from.

Lock-down, in this order (FIELD_NOTES, DuckDB 2.0 section):

1. ``SET enable_progress_bar=false`` (rejected inside ``connect(config=...)``);
   for a local warehouse, ``SET allowed_directories=[<warehouse root>/]`` and
   ``SET GLOBAL parquet_metadata_cache=true`` (data files are write-once under unique keys, so a
   cached footer never goes stale): the engine's own ``read_parquet`` of pinned data files
   (:mod:`flightsrv.engine.native`) keeps working after step 2, and nothing outside that
   directory is readable. User SQL never reaches files: the SQL front end refuses every file
   function (``read_*``, ``glob``, ``parquet_*``), COPY, ATTACH and EXPORT;
2. ``SET GLOBAL python_enable_replacements=false`` (an unknown table name never reads a Python
   variable), then ``SET enable_external_access=false``: no file, network or extension access, so
   ``read_csv``, ``read_text``, ``glob``, ``COPY ... TO``, ``ATTACH``, ``INSTALL`` and
   ``read_parquet`` of any path all fail; registered Arrow objects still work;
3. ``SET lock_configuration=true``: no later ``SET`` can undo the above.

DuckDB's SQL value functions (``current_user``, ``current_catalog``, ``current_schema()``,
...) would answer for DuckDB's own in-memory catalog and user ``duckdb``. Each connection
shadows them with macros of the same names (:data:`SESSION_MACROS`; DuckDB resolves a macro
of the connection's schema first, for the bare name as for the call) answering for the
server: the principal running the statement and its role (a DuckDB variable of the
statement's cursor, set by :func:`session_values` when the statement's text names one of
them), the catalog ``flightsrv`` and the schema ``main`` that GetCatalogs and GetDbSchemas
report. A column of that name still wins, as in DuckDB.

Requests each take a ``cursor()`` (a connection to the same in-memory database with its own
registrations and its own open result), so there is no global lock around queries.
"""

from __future__ import annotations

import collections
import os
import re
import threading

import duckdb

from flightsrv.errors import ConfigurationError
from flightsrv.sql import validate
from flightsrv.sql.allowed_functions import SESSION_FUNCTIONS

LOCKDOWN = (
    "SET enable_progress_bar=false",
    # a table name that is not a registered relation must never resolve to a Python
    # variable of the calling frame (DuckDB's Python replacement scan)
    "SET GLOBAL python_enable_replacements=false",  # for every cursor, not this session
    "SET enable_external_access=false",
    "SET lock_configuration=true",
)


#: the DuckDB variable holding who runs the statement on a cursor: a struct ``{user, role}``
SESSION_VARIABLE = "flightsrv_session"

#: DuckDB's SQL value functions, each a macro answering for the server: the name -> its
#: body. The principal and role come from :data:`SESSION_VARIABLE`; a cursor that runs a
#: statement without it set (a column DEFAULT computed once, when the table is created)
#: fails with a clear error rather than answer NULL or DuckDB's user.
SESSION_MACROS = {
    **{name: f"coalesce(CAST(getvariable('{SESSION_VARIABLE}').{field} AS VARCHAR), "
             f"error('{name} is not available here: only a statement run by a principal "
             f"has one'))"
       for name, field in (("current_user", "user"), ("session_user", "user"),
                           ("user", "user"), ("current_role", "role"))},
    "current_catalog": f"'{validate.CATALOG}'", "current_database": f"'{validate.CATALOG}'",
    "current_schema": f"'{validate.SCHEMA}'",
}
assert set(SESSION_MACROS) == SESSION_FUNCTIONS

#: a statement text that may call a macro reading :data:`SESSION_VARIABLE` (a superset:
#: the name quoted, in a string or a comment, or a column of that name, match too)
_NAMES_PRINCIPAL = re.compile(
    r"(?<![\w$])(?:" + "|".join(n for n, body in SESSION_MACROS.items()
                               if SESSION_VARIABLE in body) + r")(?![\w$])", re.I)
#: characters of a statement text searched for those names before setting the variable
#: anyway costs less than the search
_SCAN_LIMIT = 4096


def _session_macros(con: duckdb.DuckDBPyConnection) -> None:
    for name, body in SESSION_MACROS.items():
        con.execute(f"CREATE MACRO {name}() AS {body}")


def session_values(cur: duckdb.DuckDBPyConnection, text: str, user: str, role: str) -> None:
    """Make ``current_user`` (``user``, ``session_user``) and ``current_role`` answer
    ``user`` and ``role`` for the statement ``text`` about to run on ``cur``, when the
    text names one of them: one ``SET VARIABLE`` on the cursor (a variable is the cursor's
    own, and every statement that names them sets it again, so a kept cursor never answers
    for an earlier statement's principal). A text longer than :data:`_SCAN_LIMIT` is not
    searched (a 500 kB INSERT VALUES takes ~20 ms to search, the SET ~0.3 ms): it sets the
    variable whatever it names."""
    if len(text) > _SCAN_LIMIT or _NAMES_PRINCIPAL.search(text):
        cur.execute(f"SET VARIABLE {SESSION_VARIABLE} = {{'user': $1, 'role': $2}}",
                    [user, role])


#: the time zone statements run in unless configured (``serve --time-zone``): None, DuckDB's
#: own default (the host's zone), as plain DuckDB on the same host answers
DEFAULT_TIME_ZONE = None


def _set_time_zone(con: duckdb.DuckDBPyConnection, name: str) -> None:
    try:
        # GLOBAL: every cursor is a session of its own, which a plain SET would not reach
        con.execute("SET GLOBAL TimeZone=?", [name])
    except duckdb.Error as e:
        raise ConfigurationError(f"unknown time zone {name!r}: give an IANA name such as "
                                 "UTC or Europe/Berlin", time_zone=name,
                                 error=str(e).splitlines()[0]) from None


def check_time_zone(name: str) -> None:
    """ConfigurationError unless DuckDB knows the time zone ``name`` (checked before a
    server changes anything)."""
    with duckdb.connect(":memory:") as con:
        _set_time_zone(con, name)


def open_locked(threads: int | None = None, memory_limit: str | None = None,
                allowed_directory: str | None = None,
                temp_directory: str | None = None,
                con: duckdb.DuckDBPyConnection | None = None,
                time_zone: str | None = DEFAULT_TIME_ZONE) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with external access disabled and settings frozen;
    ``allowed_directory`` (an absolute path) stays readable; ``temp_directory`` is where
    DuckDB spills (its default is ``.tmp`` in the working directory). ``con``: a fresh
    connection to lock instead of a new one (the deletion-mask extension's, which loaded
    that one file before it is locked: :mod:`flightsrv.engine.maskext`). ``time_zone``: the
    IANA name DuckDB's ``TimeZone`` is set to for every cursor (what a ``TIMESTAMPTZ`` is
    shown, cast to a date or truncated in); ConfigurationError naming it if DuckDB knows no
    such zone."""
    if con is None:
        con = duckdb.connect(":memory:")
    if time_zone is not None:
        try:
            _set_time_zone(con, time_zone)
        except ConfigurationError:
            con.close()
            raise
    if threads is not None:
        con.execute(f"SET threads={int(threads)}")
    if memory_limit is not None:
        con.execute("SET memory_limit=?", [memory_limit])
    if temp_directory is not None:
        con.execute("SET temp_directory=?", [os.path.abspath(temp_directory)])
    if allowed_directory is not None:
        root = os.path.join(os.path.abspath(allowed_directory), "")  # trailing "/": no siblings
        con.execute("SET allowed_directories=?", [[root]])
        # GLOBAL: a plain SET is the root connection's session alone, and every statement
        # runs on a cursor (a session of its own), which would re-read each footer
        con.execute("SET GLOBAL parquet_metadata_cache=true")
        # local files: read the pages a query needs rather than prefetching every projected
        # column chunk whole (measured on 10M rows: a point query 4.2 -> 2.3 ms, SELECT *
        # 503 -> 440 ms, the aggregate 17.7 -> 16.2 ms; benchmarks/RESULTS.md). GLOBAL, as
        # above: a plain SET reached only the root connection's session, never the cursors
        # statements run on (measured there: an aggregate over 10M rows 27.6 -> 19.8 ms, a
        # point query 4.1 -> 3.1 ms)
        con.execute("SET GLOBAL disable_parquet_prefetching=true")
    _session_macros(con)
    for stmt in LOCKDOWN:
        con.execute(stmt)
    return con


class CursorSource:
    """Hands out cursors of one locked connection; safe to call from many threads."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self._con = con
        self._lock = threading.Lock()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        with self._lock:  # only cursor creation is serialised, never query execution
            return self._con.cursor()

    def close(self) -> None:
        """Close the connection and drop it: a server that failed to start may keep this
        object alive until exit, and a live DuckDB object then makes nanobind report leaks."""
        con, self._con = self._con, None
        if con is not None:
            con.close()


#: idle cursors a :class:`ViewCursors` keeps (each with the views its last statements made)
VIEW_CURSORS = 16
#: bytes of view text one kept cursor may hold (a view over many files is long); a cursor
#: whose statement left more is closed rather than kept
VIEW_BYTES_PER_CURSOR = 256 << 10


class KeptCursor:
    """A cursor of the warehouse database and the views on it that outlive a statement:
    ``views`` maps a view name to the exact body it was created with. Only *pure* views are
    kept: a body over data files read by path and nothing else (no registered Arrow object,
    no mask function), so the same body text reads the same rows on any later statement
    (data files are write-once under unique keys). ``keep`` turns False as soon as a
    statement registers anything else on it; the cursor is then closed, not kept."""

    __slots__ = ("cur", "views", "keep")

    def __init__(self, cur: duckdb.DuckDBPyConnection):
        self.cur = cur
        self.views: dict[str, str] = {}
        self.keep = True

    def holds(self, views: tuple[tuple[str, str], ...]) -> bool:
        """Whether every (name, body) of ``views`` is a view kept on this cursor."""
        return all(self.views.get(name) == body for name, body in views)

    def view(self, name: str, body: str) -> None:
        """Make ``name`` the view ``body`` on this cursor; nothing to do when it already is."""
        if self.views.get(name) == body:
            return
        self.views.pop(name, None)  # never a stale entry, should CREATE fail
        self.cur.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {body}")
        self.views[name] = body

    def forget(self, name: str) -> None:
        """Drop a kept view ``name`` (something other than a pure view takes the name now)
        and stop keeping this cursor."""
        self.keep = False
        if self.views.pop(name, None) is not None:
            self.cur.execute(f"DROP VIEW IF EXISTS {name}")

    @property
    def size(self) -> int:
        return sum(len(k) + len(v) for k, v in self.views.items())


class ViewCursors:
    """Cursors kept between statements with their views (:class:`KeptCursor`), so a
    statement over the same pinned files as an earlier one does not register its views
    again (for a point query ``CREATE TEMP VIEW ... read_parquet(...)`` is about a fifth of
    DuckDB's work). At most :data:`VIEW_CURSORS` idle cursors, each holding at most
    :data:`VIEW_BYTES_PER_CURSOR` bytes of view text. A cursor is kept only after a
    statement that ran to its end without error or cancellation (:meth:`put`).

    The idle cursors are a deque (atomic appends and pops, no lock): :meth:`put` runs where
    a result stream ends, which may be a garbage collector's finaliser on any thread."""

    def __init__(self, source: CursorSource, max_cursors: int = VIEW_CURSORS,
                 max_bytes: int = VIEW_BYTES_PER_CURSOR):
        self._source = source
        self._idle: collections.deque[KeptCursor] = collections.deque()
        self.max_cursors = max_cursors
        self.max_bytes = max_bytes
        self._closed = False

    def take(self) -> KeptCursor:
        """The most recently kept idle cursor (its views the likeliest to match), or a new
        one."""
        try:
            return self._idle.pop()
        except IndexError:
            return KeptCursor(self._source.cursor())

    def choose(self, first: KeptCursor, views: tuple[tuple[str, str], ...]) -> KeptCursor:
        """The cursor to run a statement whose relations are the pure ``views`` on:
        ``first`` (taken for it) when it holds them; else an idle cursor that does; else a
        new one while there is room for it (``first`` keeps its views for a later
        statement); else the longest idle one, its views replaced. The caller holds both
        ``first`` and the returned one until the statement ends."""
        if first.holds(views):
            return first
        try:
            idle = list(self._idle)
        except RuntimeError:  # a put ran (a finaliser) while it was copied: no match
            idle = []
        for other in idle:
            if other.holds(views):
                try:
                    self._idle.remove(other)
                except ValueError:  # another statement took it meanwhile
                    continue
                return other
        if len(self._idle) + 2 <= self.max_cursors:
            return KeptCursor(self._source.cursor())
        try:
            return self._idle.popleft()
        except IndexError:
            return first

    def put(self, kept: KeptCursor) -> None:
        """Keep ``kept`` for a later statement when it holds only pure views within the byte
        bound and there is room; else close it."""
        if not kept.keep or self._closed or self.max_cursors <= 0 or \
                kept.size > self.max_bytes or len(self._idle) >= self.max_cursors:
            kept.cur.close()
            return
        self._idle.append(kept)
        while len(self._idle) > self.max_cursors:  # two puts raced past the bound
            try:
                self._idle.popleft().cur.close()
            except IndexError:
                break

    def close(self) -> None:
        """Close the idle cursors; one that a running statement hands back later is closed
        then."""
        self._closed = True
        while True:
            try:
                self._idle.pop().cur.close()
            except IndexError:
                return


def run_to_arrow(cur: duckdb.DuckDBPyConnection, text: str, *, batch_size: int,
                 stream: bool, values: list | None = None):
    """Run one statement ``text`` on ``cur`` with its parameter ``values`` (DuckDB values
    for ``$1``..``$n``, or None): an Arrow table, or with ``stream`` a ``RecordBatchReader``
    that DuckDB fills as it is read.

    DuckDB 2.0's ``cur.sql(text)`` binds a statement twice, once to describe the relation
    and once to run it (for a ``read_parquet`` that is twice the footer and file checks:
    about 1 ms of a point query's prefetch). Its own one-pass seam ``_submit``, where
    ``to_arrow_table``/``to_arrow_reader`` end up, runs it once, with the same results and
    errors (it refuses more than one statement, which the engine never sends). A DuckDB
    without that seam takes the public path."""
    submit = getattr(cur, "_submit", None)
    if submit is not None:
        result = submit(text, values or None, "stream" if stream else "arrow",
                        int(batch_size))
        return result.arrow_reader() if stream else result.arrow_table()
    rel = cur.sql(text, params=values) if values else cur.sql(text)
    return rel.to_arrow_reader(batch_size) if stream else rel.to_arrow_table()

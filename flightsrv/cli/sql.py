"""``flightsrv sql``: run SQL against the warehouse in process, or against a server.

- ``flightsrv sql "SELECT ..."`` runs the statement(s) and prints the result;
- ``flightsrv sql -f FILE`` or SQL on stdin runs a script, statement by statement, stopping
  at the first error;
- ``flightsrv sql`` on a terminal opens a shell: history (``~/.flightsrv_history``, or
  ``$FLIGHTSRV_HISTORY``), multi-line input (a statement ends with ``;``), dot commands
  (``.help``).

In process, statements run through the same engine as the server
(``flightsrv.engine.duck.DuckEngine``) as a writer; a location without a warehouse is refused
unless the statement writes (``CREATE TABLE`` makes the warehouse). With ``--server
grpc://HOST:PORT`` (or ``grpc+tls://``) they go through ADBC's Flight SQL driver. A
statement that changes data answers with one row, ``rows_affected``, in both cases.
"""

from __future__ import annotations

import getpass
import logging
import os
import sys
import threading
from dataclasses import dataclass, field

import pyarrow as pa

from flightsrv.cli import output
from flightsrv.cli.common import (
    PlainError,
    NoWarehouse,
    UsageError,
    one_line,
    open_warehouse,
    read_secret_file,
    require_file,
)
from flightsrv.errors import ConfigurationError, FlightsrvError, QueryCancelled

SQL_HELP = """\
Run SQL in process on the warehouse (the server's engine, as a writer), or on a Flight SQL
server with --server. With SQL as an argument, run it; with -f FILE or SQL on stdin, run the
statements one by one and stop at the first error; with neither, on a terminal, open a shell
(history in ~/.flightsrv_history, statements end with ';', .help lists dot commands).
Statements that change data print one row, rows_affected.

examples:
  flightsrv sql "SELECT event_type, count(*) FROM demo_events GROUP BY ALL"
  flightsrv sql "SELECT * FROM demo_events" --format parquet --output events.parquet
  flightsrv sql --server grpc://127.0.0.1:31337 --token-file token.txt"""

log = logging.getLogger(__name__)
AFFECTED = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])
HISTORY_FILE = "~/.flightsrv_history"
PROMPT, CONTINUATION = "flightsrv> ", "      ...> "


def add_parser(sub, command) -> None:
    p = command(sub, "sql", "run SQL: one statement, a script, or an interactive shell", cmd_sql,
                description=SQL_HELP)
    p.add_argument("statement", nargs="?", metavar="SQL",
                   help="statement(s) to run (default: a shell on a terminal, else stdin)")
    p.add_argument("-f", "--file", metavar="FILE", help="run the statements in FILE")
    r = p.add_argument_group("server (default: the warehouse, in process)")
    r.add_argument("--server", metavar="URI",
                   default=os.environ.get("FLIGHTSRV_SERVER"),
                   help="a Flight SQL server, grpc://HOST:PORT or grpc+tls://HOST:PORT "
                        "(default: $FLIGHTSRV_SERVER, else in process)")
    r.add_argument("--token", help="bearer token (default: $FLIGHTSRV_TOKEN); prefer "
                   "--token-file, the command line is visible to other users")
    r.add_argument("--token-file", metavar="FILE", default=os.environ.get("FLIGHTSRV_TOKEN_FILE"),
                   help="read the bearer token from FILE (default: $FLIGHTSRV_TOKEN_FILE)")
    r.add_argument("--user", help="basic auth user; the password comes from "
                   "$FLIGHTSRV_PASSWORD, else a prompt")
    r.add_argument("--tls-root-certs", metavar="FILE",
                   help="PEM file of CA certificates to trust (a self-signed server)")
    output.add_output_options(p)


# -- statements ------------------------------------------------------------------------


def split_statements(text: str) -> list[str]:
    """Split on ``;`` outside strings, identifiers and comments (sqlglot's DuckDB tokenizer).
    Text that does not tokenize comes back whole, for the engine to report."""
    from sqlglot.errors import TokenError

    from flightsrv.sql import lexer
    from sqlglot.tokens import TokenType

    try:
        tokens = lexer.tokenize(text)
    except TokenError:
        return [text.strip()] if text.strip() else []
    out, start = [], 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            piece = text[start:tok.start].strip()
            if piece:
                out.append(piece)
            start = tok.end + 1
    rest = text[start:].strip()
    if rest and any(t.start >= start for t in tokens):
        out.append(rest)
    return out


def is_complete(text: str) -> bool:
    """Whether shell input is ready to run: a dot command, or SQL whose last token is ``;``."""
    from sqlglot.errors import TokenError

    from flightsrv.sql import lexer
    from sqlglot.tokens import TokenType

    stripped = text.strip()
    if not stripped or stripped.startswith("."):
        return True
    try:
        tokens = lexer.tokenize(text)
    except TokenError:
        return False  # an open string or quoted name: keep reading
    return bool(tokens) and tokens[-1].token_type == TokenType.SEMICOLON


# -- where statements run ----------------------------------------------------------------


@dataclass
class LocalRunner:
    """Statements through DuckEngine over the warehouse, as a writer."""

    args: object
    _cancel: object = field(default=None, init=False)
    busy: bool = field(default=False, init=False)  # a statement that did not stop in time

    def __post_init__(self):
        from flightsrv.engine.api import Role, Session
        from flightsrv.engine.duck import DuckEngine

        self.warehouse = open_warehouse(self.args, must_exist=False)
        self._exists = self.warehouse.is_initialized()
        self.engine = DuckEngine(self.warehouse)
        self.session = Session(session_id="cli", user=_user(), role=Role.WRITER)
        self.where = self.warehouse.uri

    def _no_warehouse(self) -> NoWarehouse:
        return NoWarehouse(f"no warehouse at {self.args.warehouse} (create one with "
                           "`flightsrv table create NAME --schema ...` or a CREATE TABLE "
                           "statement)")

    def run(self, sql: str) -> pa.RecordBatchReader:
        from flightsrv.engine.api import Cancel, StatementKind

        cancel = self._cancel = Cancel()
        if not self._exists:
            self._exists = self.warehouse.is_initialized()
        try:
            prepared = self.engine.prepare(sql, self.session)
        except FlightsrvError:
            if not self._exists:
                raise self._no_warehouse() from None
            raise
        if not self._exists and not prepared.effects:
            raise self._no_warehouse()
        cancel.check()  # Ctrl-C while preparing: DuckDB's interrupt() finds nothing running
        if prepared.kind is StatementKind.QUERY:
            return self.engine.execute_query(sql, self.session, cancel=cancel).reader
        n = self.engine.execute_update(sql, self.session, cancel=cancel)
        self._exists = True
        return _affected(n)

    def interrupt(self) -> None:
        """Interrupt the statement running now (DuckDB's ``interrupt()``); any thread."""
        if self._cancel is not None:
            self._cancel.cancel()

    def tables(self) -> list[str]:
        return self.engine.list_tables() if self.warehouse.is_initialized() else []

    def close(self) -> None:
        if not self.busy:
            self.engine.close()


@dataclass
class RemoteRunner:
    """Statements through ADBC's Flight SQL driver (autocommit: every statement commits)."""

    args: object
    _cursor: object = field(default=None, init=False)
    busy: bool = field(default=False, init=False)  # a statement that did not stop in time

    def __post_init__(self):
        import warnings

        from adbc_driver_flightsql import DatabaseOptions, dbapi

        uri = self.args.server
        if not uri.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
            raise UsageError(f"--server {uri}: use grpc://HOST:PORT or grpc+tls://HOST:PORT")
        kw: dict[str, str] = {}
        token = self.args.token or os.environ.get("FLIGHTSRV_TOKEN")
        if self.args.token_file:
            token = read_secret_file(self.args.token_file, "--token-file")
        if token and self.args.user:
            raise UsageError("give a token or --user, not both")
        if token:
            kw[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
        if self.args.user:
            password = os.environ.get("FLIGHTSRV_PASSWORD")
            if password is None:
                if not sys.stdin.isatty():
                    raise UsageError("--user needs $FLIGHTSRV_PASSWORD (no terminal to ask on)")
                password = getpass.getpass(f"password for {self.args.user}: ")
            kw["username"], kw["password"] = self.args.user, password
        if self.args.tls_root_certs:
            require_file(self.args.tls_root_certs, "--tls-root-certs")
            with open(self.args.tls_root_certs, encoding="utf-8") as f:
                kw[DatabaseOptions.TLS_ROOT_CERTS.value] = f.read()
        self.where = uri
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.conn = dbapi.connect(uri, db_kwargs=kw or None, autocommit=True)
        except Exception as exc:  # noqa: BLE001 - ADBC raises its own hierarchy
            raise _remote_error(exc, uri) from None

    def run(self, sql: str) -> pa.RecordBatchReader:
        cur = self._cursor = self.conn.cursor()
        try:
            cur.execute(sql)
            if not cur.description:  # a statement without a result (DML through ADBC)
                n = cur.rowcount
                cur.close()
                return _affected(max(n, 0))
            reader = cur.fetch_record_batch()
        except Exception as exc:  # noqa: BLE001
            cur.close()
            raise _remote_error(exc, self.where) from None

        def batches():
            try:
                yield from reader
            except Exception as exc:  # noqa: BLE001
                raise _remote_error(exc, self.where) from None
            finally:
                cur.close()

        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    def interrupt(self) -> None:
        """Cancel the call in flight (ADBC's StatementCancel: the gRPC call is cancelled, and
        the server interrupts DuckDB); any thread."""
        cur = self._cursor
        if cur is not None:
            try:
                cur.adbc_cancel()
            except Exception:  # noqa: BLE001 - a cursor already closed has nothing to cancel
                pass

    def tables(self) -> list[str]:
        reader = self.run("SHOW TABLES")
        return [r[reader.schema.names[0]] for r in reader.read_all().to_pylist()]

    def close(self) -> None:
        if self.busy:
            return
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass


class RemoteError(PlainError):
    """The server (or the connection to it) reported an error."""


def _remote_error(exc: Exception, uri: str) -> RemoteError:
    text = str(exc)
    # ADBC prefixes the gRPC status: "INVALID_ARGUMENT: [FlightSQL] SqlError: ... (...)"
    for marker in ("[FlightSQL] ",):
        if marker in text:
            head, _, tail = text.partition(marker)
            text = f"{head.strip()} {tail}"
    text = text.split(". Detail:")[0].split("Detail: Python exception")[0]
    return RemoteError(one_line(text), server=uri)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        return "cli"


def _affected(n: int) -> pa.RecordBatchReader:
    batch = pa.record_batch([pa.array([int(n)], pa.int64())], schema=AFFECTED)
    return pa.RecordBatchReader.from_batches(AFFECTED, [batch])


def make_runner(args):
    return RemoteRunner(args) if args.server else LocalRunner(args)


#: how long Ctrl-C waits for the interrupted statement to stop before giving up on it
STOP_WAIT_S = 5.0


def run_statement(runner, sql: str, args) -> None:
    """Run ``sql`` and write its result, interruptibly: the work runs in a worker thread
    while the main thread (the one Python delivers SIGINT to) waits. Ctrl-C interrupts the
    statement (``runner.interrupt()``: DuckDB's interrupt in process, a cancelled call on a
    server), waits for the worker to stop (at most ``STOP_WAIT_S``) and raises
    KeyboardInterrupt; whatever the interrupted work raised is dropped. Without this the
    signal reaches Python only when DuckDB or the Flight client returns, which can be the
    end of the query."""
    done = threading.Event()
    box: dict[str, BaseException] = {}

    def work():
        try:
            log.debug("running statement", extra={"fields": {"where": runner.where}})
            output.write_result(runner.run(sql), args)
            sys.stdout.flush()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=work, name="flightsrv-statement", daemon=True).start()
    try:
        while not done.wait(0.1):
            pass
    except KeyboardInterrupt:
        runner.interrupt()
        _wait_ignoring_interrupts(done, STOP_WAIT_S)
        if not done.is_set():  # still running: closing its connection would fail or hang
            runner.busy = True
        raise KeyboardInterrupt from None
    if "error" in box:
        raise box["error"]


def _wait_ignoring_interrupts(done: threading.Event, seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while not done.is_set() and time.monotonic() < end:
        try:
            done.wait(min(0.1, max(end - time.monotonic(), 0)))
        except KeyboardInterrupt:  # pressed again: already stopping
            pass


# -- the command -----------------------------------------------------------------------


def cmd_sql(args) -> int:
    if args.statement is not None and args.file:
        raise UsageError("give SQL or --file, not both")
    if not args.server and (args.token or args.token_file or args.user or args.tls_root_certs):
        raise UsageError("--token, --token-file, --user and --tls-root-certs need --server")
    if args.file:
        require_file(args.file, "--file")
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    elif args.statement is not None:
        text = args.statement
    elif sys.stdin.isatty():
        if args.output:
            raise UsageError("--output needs a statement (the shell prints to the terminal)")
        return shell(args)
    else:
        text = sys.stdin.read()
    statements = split_statements(text)
    if not statements:
        raise UsageError("no SQL statement given")
    if args.output and len(statements) > 1:
        raise UsageError("--output takes the result of one statement; got "
                         f"{len(statements)}")
    runner = make_runner(args)
    try:
        for sql in statements:
            run_statement(runner, sql, args)
    finally:
        runner.close()
    return 0


# -- the shell -------------------------------------------------------------------------

SHELL_HELP = """\
Statements end with ';' and may span lines. Dot commands:
  .tables            list the tables
  .format FORMAT     table | csv | jsonl (now: {fmt})
  .maxrows N         rows shown by the table format, 0 for all (now: {maxrows})
  .help              this text
  .quit / .exit      leave (or Ctrl-D); Ctrl-C clears the input or stops a running query
"""


def shell(args, *, input=None, output_stream=None) -> int:  # noqa: A002 (prompt_toolkit's name)
    """The interactive shell. ``input``/``output_stream`` are prompt_toolkit Input/Output
    objects (tests pass a pipe)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    history_path = os.path.expanduser(os.environ.get("FLIGHTSRV_HISTORY", HISTORY_FILE))
    try:
        history = FileHistory(history_path)
    except OSError:
        history = InMemoryHistory()
    keys = KeyBindings()

    @keys.add("enter")
    def _(event):
        buf = event.current_buffer
        if is_complete(buf.text):
            buf.validate_and_handle()
        else:
            buf.insert_text("\n")

    session = PromptSession(history=history, multiline=True, key_bindings=keys,
                            prompt_continuation=lambda width, line, wrap: CONTINUATION,
                            input=input, output=output_stream)
    runner = make_runner(args)
    err = sys.stderr
    err.write(f"flightsrv sql on {runner.where}; statements end with ';', .help for help\n")
    try:
        while True:
            try:
                text = session.prompt(PROMPT)
            except KeyboardInterrupt:
                continue
            except EOFError:
                break
            text = text.strip()
            if not text:
                continue
            if text.startswith("."):
                if _dot_command(text, args, runner, err) == "quit":
                    break
                continue
            for sql in split_statements(text):
                try:
                    run_statement(runner, sql, args)
                except KeyboardInterrupt:
                    err.write("flightsrv: query interrupted\n")
                    break
                except QueryCancelled:
                    err.write("flightsrv: query cancelled\n")
                except (FlightsrvError, pa.ArrowException, OSError) as exc:
                    err.write(f"flightsrv: error: {_message(exc)}\n")
                    break
    finally:
        runner.close()
    return 0


def _message(exc: BaseException) -> str:
    from flightsrv.cli.common import error_text

    return error_text(exc)


def _dot_command(text: str, args, runner, err) -> str | None:
    word, _, rest = text.partition(" ")
    rest = rest.strip()
    if word in (".quit", ".exit", ".q"):
        return "quit"
    if word == ".help":
        err.write(SHELL_HELP.format(fmt=args.format, maxrows=args.max_rows))
    elif word == ".tables":
        try:
            names = runner.tables()
        except (FlightsrvError, ConfigurationError) as exc:
            err.write(f"flightsrv: error: {_message(exc)}\n")
            return None
        sys.stdout.write("\n".join(names) + ("\n" if names else "(no tables)\n"))
    elif word == ".format" and rest in ("table", "csv", "jsonl"):
        args.format = rest
    elif word == ".maxrows" and rest.isdigit():
        args.max_rows = int(rest)
    else:
        err.write(f"flightsrv: unknown or incomplete command {text!r} (.help lists them)\n")
    return None

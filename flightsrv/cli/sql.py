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
    CTRL_C,
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

    def arm(self) -> None:
        """A fresh Cancel for the next statement, made before its worker starts, so a Ctrl-C
        that comes before :meth:`run` reaches DuckDB still stops it."""
        from flightsrv.engine.api import Cancel

        self._cancel = Cancel()

    def run(self, sql: str) -> pa.RecordBatchReader:
        from flightsrv.engine.api import StatementKind

        if self._cancel is None:
            self.arm()
        cancel = self._cancel
        cancel.check()  # Ctrl-C before the statement started
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

    def columns(self, table: str) -> list[str]:
        return list(self.warehouse.table(table).schema.names)

    def close(self) -> None:
        if self.busy:
            return
        try:
            self.engine.close()
        except Exception as exc:  # noqa: BLE001 - the process is ending either way
            # DuckDB here is in-memory scratch (the warehouse is in its store): a cursor that
            # an interrupted statement is still giving back makes close() refuse, nothing more
            log.debug("closing the engine failed: %s", exc)


@dataclass
class RemoteRunner:
    """Statements through ADBC's Flight SQL driver (autocommit: every statement commits)."""

    args: object
    _cursor: object = field(default=None, init=False)
    _interrupted: bool = field(default=False, init=False)
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

    def arm(self) -> None:
        """Forget an earlier statement's Ctrl-C; made before the next statement's worker
        starts, so a Ctrl-C that comes before the call is sent still stops it."""
        self._interrupted = False

    def run(self, sql: str) -> pa.RecordBatchReader:
        cur = self._cursor = self.conn.cursor()
        try:
            if self._interrupted:  # Ctrl-C before the call was sent
                raise QueryCancelled("query cancelled before it was sent")
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
        self._interrupted = True
        cur = self._cursor
        if cur is not None:
            try:
                cur.adbc_cancel()
            except Exception:  # noqa: BLE001 - a cursor already closed has nothing to cancel
                pass

    def tables(self) -> list[str]:
        reader = self.run("SHOW TABLES")
        return [r[reader.schema.names[0]] for r in reader.read_all().to_pylist()]

    def columns(self, table: str) -> list[str]:
        return list(self.conn.adbc_get_table_schema(table).names)

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
    # the lines after the first: DuckDB's hints and caret under the user's statement
    first, _, detail = text.strip().partition("\n")
    return RemoteError(one_line(first), server=uri).with_detail(detail.rstrip())


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
            reader = runner.run(sql)
            try:
                output.write_result(reader, args)
            finally:  # an interrupted stream gives its cursor back now, not when collected
                reader.close()
            sys.stdout.flush()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            box["error"] = exc
        finally:
            done.set()

    runner.arm()  # before the worker: a Ctrl-C from now on stops this statement
    worker = threading.Thread(target=work, name="flightsrv-statement", daemon=True)
    worker.start()
    try:
        while not done.wait(0.1):
            pass
        # let the worker end before anything closes or exits: a daemon thread still tearing
        # down a DuckDB or Flight client object while the interpreter finalizes aborted the
        # process at exit ("terminate called without an active exception", exit -6)
        worker.join()
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
    except KeyboardInterrupt:
        if runner.busy:
            sys.stderr.write("flightsrv: interrupted\n")
            _leave_now(130)
        raise
    finally:
        runner.close()
    return 0


def _leave_now(code: int) -> None:
    """Exit at once: a statement that did not stop within ``STOP_WAIT_S`` of Ctrl-C still runs
    in DuckDB (or in a Flight call), and the interpreter's shutdown would wait for it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- the shell -------------------------------------------------------------------------

SHELL_HELP = """\
Statements end with ';' and may span lines; Tab completes keywords, tables and columns.
Commands (psql's spelling in brackets):
  .tables             list the tables                                      [\\dt]
  .mode MODE          table | line | csv | json | jsonl (now: {fmt}); also .format [\\x: line]
  .wide auto|off      a table wider than the terminal is shown as lines (now: {wide})
  .maxrows N          rows shown by table/line, 0 for all (now: {maxrows})
  .timer on|off       print each statement's run time (now: {timer})        [\\timing]
  .help               this text                                             [\\?]
  .quit / .exit       leave (or Ctrl-D, \\q, exit, quit); Ctrl-C clears the input or stops
                      a running query
"""

#: words that end the shell, typed alone (with or without ';')
QUIT_WORDS = {".quit", ".exit", ".q", "\\q", "exit", "quit"}
MODES = ("table", "line", "csv", "json", "jsonl")
KEYWORDS = (
    "SELECT FROM WHERE GROUP BY ORDER HAVING LIMIT OFFSET JOIN LEFT RIGHT FULL INNER OUTER "
    "CROSS ON USING AS AND OR NOT NULL IS IN LIKE ILIKE BETWEEN CASE WHEN THEN ELSE END "
    "DISTINCT UNION ALL EXCEPT INTERSECT WITH INSERT INTO VALUES UPDATE SET DELETE MERGE "
    "MATCHED CREATE TABLE DROP ALTER SHOW TABLES DESCRIBE EXPLAIN ANALYZE COUNT SUM AVG MIN "
    "MAX CAST TRUE FALSE ASC DESC OPTIMIZE VACUUM RETAIN HOURS AT VERSION TIMESTAMP DATE "
    "INTEGER BIGINT VARCHAR DOUBLE BOOLEAN DECIMAL").split()


class SqlCompleter:
    """prompt_toolkit completions for the word under the cursor: SQL keywords (upper case
    when the word is), the warehouse's tables, and the columns of the tables the input
    names. Table and column names are read from ``runner`` once and again after every
    statement (``refresh()``)."""

    def __init__(self, runner):
        self.runner = runner
        self._tables: list[str] | None = None
        self._columns: dict[str, list[str]] = {}

    def refresh(self) -> None:
        self._tables, self._columns = None, {}

    def tables(self) -> list[str]:
        if self._tables is None:
            try:
                self._tables = list(self.runner.tables())
            except Exception:  # noqa: BLE001 - completion never fails the shell
                self._tables = []
        return self._tables

    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            try:
                self._columns[table] = list(self.runner.columns(table))
            except Exception:  # noqa: BLE001
                self._columns[table] = []
        return self._columns[table]

    def candidates(self, text: str, word: str) -> list[str]:
        import re

        tables = self.tables()
        low = {t.lower(): t for t in tables}
        named = [low[w.lower()] for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)
                 if w.lower() in low]
        columns = [c for t in dict.fromkeys(named) for c in self.columns(t)]
        upper = word[:1].isupper() or not word
        words = [k if upper else k.lower() for k in KEYWORDS]
        out = []
        for cand in [*columns, *tables, *words]:
            if cand.lower().startswith(word.lower()) and cand != word and cand not in out:
                out.append(cand)
        return out

    def as_prompt_toolkit(self):
        from prompt_toolkit.completion import Completer, Completion

        me = self

        class _C(Completer):
            def get_completions(self, document, complete_event):
                word = document.get_word_before_cursor(WORD=False)
                if not word.replace("_", "a").isalnum():
                    word = ""
                if not word and not complete_event.completion_requested:
                    return
                for cand in me.candidates(document.text_before_cursor, word):
                    yield Completion(cand, start_position=-len(word))

        return _C()


def shell(args, *, input=None, output_stream=None) -> int:  # noqa: A002 (prompt_toolkit's name)
    """The interactive shell. ``input``/``output_stream`` are prompt_toolkit Input/Output
    objects (tests pass a pipe)."""
    import shutil
    import time

    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    # the footer of a cut table names the shell's own commands
    args.more_hint = ".maxrows 0 for all, or .mode csv"
    history_path = os.path.expanduser(os.environ.get("FLIGHTSRV_HISTORY", HISTORY_FILE))
    try:
        history = FileHistory(history_path)
    except OSError:
        history = InMemoryHistory()
    keys = KeyBindings()

    @keys.add("enter")
    def _(event):
        buf = event.current_buffer
        if is_complete(buf.text) or buf.text.strip().rstrip(";").strip() in QUIT_WORDS \
                or buf.text.strip().startswith("\\"):
            buf.validate_and_handle()
        else:
            buf.insert_text("\n")

    runner = make_runner(args)
    completer = SqlCompleter(runner)
    session = PromptSession(history=history, multiline=True, key_bindings=keys,
                            prompt_continuation=lambda width, line, wrap: CONTINUATION,
                            completer=completer.as_prompt_toolkit(), complete_while_typing=False,
                            input=input, output=output_stream)
    args.wide, args.timer = "auto", False
    err = sys.stderr
    err.write(f"flightsrv sql on {runner.where}; statements end with ';', .help for help\n")
    try:
        while True:
            try:
                text = session.prompt(PROMPT)
            except KeyboardInterrupt:
                CTRL_C.clear()
                continue
            except EOFError:
                break
            text = text.strip()
            if not text:
                continue
            if text.rstrip(";").strip() in QUIT_WORDS:
                break
            if text.startswith((".", "\\")):
                _dot_command(text, args, runner, err)
                continue
            for sql in split_statements(text):
                args.max_width = shutil.get_terminal_size().columns \
                    if args.wide == "auto" else None
                started = time.perf_counter()
                try:
                    run_statement(runner, sql, args)
                except KeyboardInterrupt:
                    CTRL_C.clear()  # handled here: the shell goes on
                    err.write("flightsrv: query interrupted\n")
                    break
                except QueryCancelled:
                    err.write("flightsrv: query cancelled\n")
                except (FlightsrvError, pa.ArrowException, OSError) as exc:
                    err.write(f"flightsrv: error: {_message(exc)}\n")
                    break
                finally:
                    completer.refresh()  # a statement may have created or changed a table
                if args.timer:
                    err.write(f"Run Time: {time.perf_counter() - started:.3f} s\n")
    finally:
        runner.close()
    if runner.busy:
        _leave_now(0)
    return 0


def _message(exc: BaseException) -> str:
    from flightsrv.cli.common import error_text

    return error_text(exc)


def _dot_command(text: str, args, runner, err) -> None:
    word, _, rest = text.partition(" ")
    word, rest = word.rstrip(";"), rest.strip().rstrip(";").strip()
    if word in (".help", "\\?", "\\h"):
        err.write(SHELL_HELP.format(fmt=args.format, maxrows=args.max_rows, wide=args.wide,
                                    timer="on" if args.timer else "off"))
    elif word in (".tables", "\\dt", "\\d") and not rest:
        try:
            names = runner.tables()
        except (FlightsrvError, ConfigurationError) as exc:
            err.write(f"flightsrv: error: {_message(exc)}\n")
            return
        sys.stdout.write("\n".join(names) + ("\n" if names else "(no tables)\n"))
    elif word in (".format", ".mode") and rest in MODES:
        args.format = rest
    elif word == "\\x" and rest in ("", "on", "off", "auto"):
        if rest == "auto":
            args.wide, args.format = "auto", "table"
        else:
            on = args.format != "line" if not rest else rest == "on"
            args.format = "line" if on else "table"
            err.write(f"Expanded display is {'on' if on else 'off'}.\n")
    elif word == ".wide" and rest in ("auto", "off"):
        args.wide = rest
    elif word == ".maxrows" and rest.isdigit():
        args.max_rows = int(rest)
    elif (word == ".timer" and rest in ("on", "off")) or (word == "\\timing" and rest in (
            "", "on", "off")):
        args.timer = (not args.timer) if not rest else rest == "on"
        if word == "\\timing":
            err.write(f"Timing is {'on' if args.timer else 'off'}.\n")
    else:
        err.write(f"flightsrv: unknown or incomplete command {text!r} (.help lists them)\n")

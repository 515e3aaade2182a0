"""The ``flightsrv`` entry point: parser assembly and the error boundary.

Every error leaves as one line on stderr, ``flightsrv: error: ...``, with exit code 2 when
the command line is wrong and 1 when the command failed; ``--debug`` prints the traceback
instead. A closed stdout (``flightsrv table scan t | head``) ends the command quietly.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback

from flightsrv.cli import output, serve, sql, store, table, tools, warehouse
from flightsrv.cli.common import (
    CTRL_C,
    error_text,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    UsageError,
    add_global_options,
    global_defaults,
)

DESCRIPTION = """\
flightsrv: lakehouse tables on object storage with constant-time deletes, served over
Arrow Flight SQL by DuckDB.

  flightsrv serve                  run the Flight SQL server (seeds a demo table on first start)
  flightsrv sql ["SELECT ..."]     run SQL here or on a server (--server), or open a shell
  flightsrv table COMMAND ...      list | create | append | scan | head | delete | history |
                                   describe | set-property | drop | stats | compact | flush |
                                   expire | vacuum | purge | publish | erasures |
                                   erasure-status | upgrade
  flightsrv warehouse vacuum       delete files of failed creates (prefixes with no table)
  flightsrv store check [S3 URI]   can flightsrv commit safely on this store? (exit 0 yes, 1 no)
  flightsrv demo                   the table format in one minute
  flightsrv user hash NAME         a users-file line for basic auth
  flightsrv pipeline ...           the Spark example pipeline (needs pyspark)

Global options go before or after the command. Exit codes: 0 ok, 1 the command failed,
2 the command line is wrong, 130 interrupted.
"""

_GLOBAL_WITH_VALUE = ("--warehouse", "--log-level")


def _log_frames() -> int:
    # imported here: the server package is heavy, and only --debug tracebacks need it
    from flightsrv.server.logs import LOG_FRAMES

    return LOG_FRAMES


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("flightsrv")
    except Exception:  # noqa: BLE001 - not installed: the source tree's version
        from flightsrv import __version__

        return __version__


def build_parser() -> Parser:
    p = Parser(prog="flightsrv", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"flightsrv {_version()}",
                   help="print the version and exit")
    add_global_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    made: list = []

    def command(subparsers, name, helptext, func, description=None):
        leaf = subparsers.add_parser(name, help=helptext, description=description or helptext)
        leaf.set_defaults(func=func)
        made.append(leaf)
        return leaf

    serve.add_parser(sub, command)
    sql.add_parser(sub, command)
    table.add_parser(sub, command)
    warehouse.add_parser(sub, command)
    store.add_parser(sub, command)
    tools.add_parsers(sub, command)
    # global options on every parser below the top (listed last in each help)
    for parser in _all_parsers(p):
        if parser is not p and parser.prog != "flightsrv pipeline":
            add_global_options(parser, top=False)
    return p


def _all_parsers(p):
    import argparse

    out = [p]
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _all_parsers(child)
    return out


def _command_index(argv: list[str]) -> int | None:
    """Position of the command word in ``argv`` (skipping global options and values)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return i + 1 if i + 1 < len(argv) else None
        if a in _GLOBAL_WITH_VALUE:
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        return i
    return None


def parse_args(argv: list[str]):
    """Parse ``argv``; everything after ``pipeline`` goes to the pipeline's own parser, except
    the global options, which are taken out wherever they are."""
    import argparse

    i = _command_index(argv)
    rest = None
    if i is not None and argv[i] == "pipeline":
        argv, rest = argv[:i + 1], argv[i + 1:]
    args, extra = build_parser().parse_known_args(argv)
    if extra:  # argparse's own message, with the help of the command they were given to
        raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see "
                         f"`{getattr(args, 'command_prog', 'flightsrv')} --help`)")
    if rest is not None:
        g = Parser(prog="flightsrv pipeline", add_help=False)
        add_global_options(g, top=False)
        known, args.rest = g.parse_known_args(rest, argparse.Namespace())
        for k, v in vars(known).items():
            setattr(args, k, v)
    return global_defaults(args)


class _LogfmtFormatter(logging.Formatter):
    """``level logger: message key=value ...`` for the commands' logs (serve logs JSON)."""

    def format(self, record):
        from flightsrv.server.logs import RECORD_ATTRS

        extra = {k: v for k, v in record.__dict__.items() if k not in RECORD_ATTRS}
        fields = record.__dict__.get("fields")
        if isinstance(fields, dict):
            extra.update(fields)
        kv = " ".join(f"{k}={v}" for k, v in extra.items() if v is not None)
        return f"flightsrv: {record.levelname.lower()} {record.name}: {record.getMessage()}" + (
            f" {kv}" if kv else "")


def configure_logging(level_name: str | None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogfmtFormatter())
    root = logging.getLogger("flightsrv")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, (level_name or "warning").upper()))
    root.propagate = False


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _suggest_table(exc: BaseException, args) -> None:
    """A table command's unknown table (``table describe evnts``) gets DuckDB's "Did you
    mean" over the warehouse's tables, as the same name in a SQL statement does; nothing
    when DuckDB suggests nothing, the error already has a hint, or the tables cannot be
    listed."""
    from flightsrv.errors import TableNotFound

    name = getattr(exc, "context", {}).get("table") if isinstance(exc, TableNotFound) else None
    if not name or exc.detail or getattr(args, "warehouse", None) is None:
        return
    try:
        from flightsrv.engine.diagnose import Scratch
        from flightsrv.warehouse import Warehouse

        names = Warehouse.open(args.warehouse).list_tables()
        scratch = Scratch()
        try:
            hint = scratch.suggestion(str(name), names) if names else None
        finally:
            scratch.close()
    except Exception:  # noqa: BLE001 - a hint is a courtesy: the error stands without it
        return
    if hint:
        exc.with_detail(hint)


def main(argv: list[str] | None = None) -> int:
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler \
            and threading.current_thread() is threading.main_thread() \
            and getattr(signal.getsignal(signal.SIGINT), "__module__", "") == "flightsrv.cli":
        signal.signal(signal.SIGINT, signal.default_int_handler)  # see flightsrv/cli/__init__
    CTRL_C.clear()
    previous = None
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous = signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        return _run(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _on_ctrl_c(signum, frame):
    CTRL_C.set()
    raise KeyboardInterrupt


def _run(argv: list[str] | None) -> int:
    """``main``'s body: every error becomes one line and an exit code; one raised after
    Ctrl-C exits 130 like the interrupt (``common.CTRL_C``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = parse_args(argv)
        debug = args.debug
        if args.func is not serve.cmd_serve:
            configure_logging(args.log_level)
        if getattr(args, "format", None) in output.FORMATS and hasattr(args, "output"):
            output.check_output_args(args)
        return args.func(args) or EXIT_OK
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc(limit=_log_frames())
        sys.stderr.write("flightsrv: interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes one line
        if debug:
            traceback.print_exc(limit=_log_frames())
        if CTRL_C.is_set():
            sys.stderr.write("flightsrv: interrupted\n")
            return EXIT_INTERRUPTED
        _suggest_table(exc, locals().get("args"))
        try:
            text = error_text(exc)
            if debug:  # the traceback is above
                text = text.replace(" (run with --debug for the traceback)", "")
            sys.stderr.write(f"flightsrv: error: {text}\n")
        except BrokenPipeError:
            pass
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED

"""The smaller commands: ``demo`` (the format in one minute), ``user hash`` (a users-file line)
and ``pipeline`` (the Spark example pipeline, whose options its own parser owns)."""

from __future__ import annotations

import os
import sys

from flightsrv.cli.common import UsageError, open_warehouse


def cmd_demo(args) -> int:
    from flightsrv.demo import walkthrough

    wh = open_warehouse(args, must_exist=False)
    wh.is_initialized()  # a file in the way fails here, in one line
    walkthrough(wh)
    return 0


def cmd_user_hash(args) -> int:
    import getpass

    from flightsrv.server.auth import hash_password

    pw = args.password or os.environ.get("FLIGHTSRV_PASSWORD")
    if pw is None:
        if not sys.stdin.isatty():
            raise UsageError("no password: give --password, $FLIGHTSRV_PASSWORD, or run on a "
                             "terminal to be asked")
        pw = getpass.getpass("password: ")
        if getpass.getpass("again: ") != pw:
            raise UsageError("the passwords differ")
    if not pw:
        raise UsageError("the password is empty")
    user = args.user
    # what a users file line can hold as its first field, read back as given: the loader
    # splits lines, cuts comments at '#', fields at ':', and strips the line
    if not user or user != user.strip() or any(c in user for c in ":#") or \
            not user.isprintable():
        raise UsageError("a user name must be non-empty, printable, without ':' or '#', and "
                         "without leading or trailing spaces (a users file line could not "
                         "hold it)")
    print(f"{args.user}:{hash_password(pw)}:{args.role}")
    return 0


def cmd_pipeline(args) -> int:
    rest = list(args.rest)
    wants_help = "-h" in rest or "--help" in rest
    try:
        from flightsrv.spark.pipeline import main as pipeline_main

        if not wants_help:  # flightsrv.spark imports PySpark only when a session starts
            import pyspark  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"flightsrv pipeline needs PySpark ({exc.name} is missing): "
                         "pip install 'flightsrv[spark]'") from None
    if not wants_help:
        rest += ["--warehouse", args.warehouse]  # the global option, wherever it was given
    return pipeline_main(rest)


def add_parsers(sub, command) -> None:
    command(sub, "demo", "walk through create, append, delete, scan and history", cmd_demo)

    u = sub.add_parser("user", help="users-file helpers")
    us = u.add_subparsers(dest="user_command", required=True, metavar="COMMAND")
    p = command(us, "hash", "print a users-file line (user:hash:role) for basic auth",
                cmd_user_hash)
    p.add_argument("user", help="user name")
    p.add_argument("--role", choices=["reader", "writer"], default="reader",
                   help="what the user may do")
    p.add_argument("--password", help="the password (default: $FLIGHTSRV_PASSWORD, else asked "
                   "on the terminal); the command line is visible to other users")

    # The pipeline's own parser reads everything after `pipeline` (main() splits it off),
    # so `flightsrv pipeline --generate N` and `flightsrv pipeline run --generate N` both work.
    p = sub.add_parser("pipeline", add_help=False,
                       help="the Spark example pipeline (`flightsrv pipeline --help`)")
    p.set_defaults(func=cmd_pipeline, rest=[])

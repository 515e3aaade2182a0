"""``flightsrv serve``: the Flight SQL server over the warehouse.

Everything that can be checked before the server starts is checked first, each failure one
line: tokens and their files, the users file, the TLS files, the warehouse location and the
port. ``flightsrv: serving ...`` is printed once the port is bound, with the real port (also
for ``--port 0``). Serving beyond loopback without auth is allowed but warned about.

Secrets need not be on the command line (where ``ps`` shows them): ``--auth-token-file FILE``
or ``$FLIGHTSRV_AUTH_TOKEN_FILE`` (one ``TOKEN[:reader|writer]`` per line) and
``$FLIGHTSRV_AUTH_TOKEN`` (one ``TOKEN[:reader|writer]``) add to ``--auth-token``. A source
that is given but yields no credential (an empty variable, a file of comments, a users file
without users) is an error, never a server without auth.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys

from flightsrv.cli.common import (
    PlainError,
    UsageError,
    one_line,
    open_warehouse,
    require_file,
    secret_lines,
    warn,
)
from flightsrv.errors import ConfigurationError, FlightsrvError



SERVE_HELP = """\
Run the Arrow Flight SQL server over the warehouse (ADBC, JDBC, BI tools). The first start
on an empty local warehouse seeds the demo table demo_events. Options are checked before
anything starts; "flightsrv: serving ..." is printed once the port is bound (the real port
for --port 0). Logs are JSON lines on stderr. Ctrl-C or SIGTERM stop it cleanly.

Secrets stay off the command line with --auth-token-file / $FLIGHTSRV_AUTH_TOKEN_FILE (one
TOKEN[:reader|writer] per line), $FLIGHTSRV_AUTH_TOKEN (one more token) and
$FLIGHTSRV_USERS_FILE."""


class ServerStartError(PlainError):
    """The server could not start listening (port taken, address not local)."""


def add_parser(sub, command) -> None:
    from flightsrv.server.config import add_serve_arguments

    s = command(sub, "serve", "run the Flight SQL server", cmd_serve, description=SERVE_HELP)
    add_serve_arguments(s)  # every server option, with its default (flightsrv.server.config)
    a = s.add_argument_group("secrets kept off the command line")
    a.add_argument("--auth-token-file", metavar="FILE",
                   default=os.environ.get("FLIGHTSRV_AUTH_TOKEN_FILE"),
                   help="accept the tokens in FILE, one TOKEN[:reader|writer] per line "
                        "(default: $FLIGHTSRV_AUTH_TOKEN_FILE; $FLIGHTSRV_AUTH_TOKEN adds one "
                        "more); prefer it to --auth-token, whose value other users can see")
    s.set_defaults(users_file=os.environ.get("FLIGHTSRV_USERS_FILE"))


def _token_specs(args) -> list[tuple[str, str]]:
    """(spec, where it came from) for every token source. A source that is given but holds
    no token (an empty $FLIGHTSRV_AUTH_TOKEN, a token file of comments) is a UsageError:
    it must never leave the server without auth."""
    specs = [(spec, "--auth-token") for spec in args.auth_tokens or []]
    env = os.environ.get("FLIGHTSRV_AUTH_TOKEN")
    if env is not None:
        if not env.strip():
            raise UsageError("$FLIGHTSRV_AUTH_TOKEN is set but empty (unset it to serve "
                             "without this token)")
        specs.append((env.strip(), "$FLIGHTSRV_AUTH_TOKEN"))
    path = args.auth_token_file
    if path is not None:
        if not path.strip():
            raise UsageError("--auth-token-file (or $FLIGHTSRV_AUTH_TOKEN_FILE) is empty: "
                             "name a file of tokens, or unset it")
        lines = secret_lines(path, "--auth-token-file")
        if not lines:
            raise UsageError(f"--auth-token-file {path} holds no token (only blank or "
                             "comment lines)")
        specs += [(line, f"--auth-token-file {path}") for line in lines]
    return specs


def resolve_auth(args):
    """The AuthConfig from tokens and the users file, or None when no credential option is
    given at all (no auth). UsageError for a bad or conflicting token spec, a missing file,
    or a given credential source that yields no credential."""
    from flightsrv.server.auth import AuthConfig, static_tokens

    try:
        tokens = static_tokens(_token_specs(args))
        if args.users_file is not None:
            if not args.users_file.strip():
                raise UsageError("--users-file (or $FLIGHTSRV_USERS_FILE) is empty: name a "
                                 "users file, or unset it")
            require_file(args.users_file, "--users-file")
            try:
                return AuthConfig.from_users_file(args.users_file, tokens=tokens)
            except ConfigurationError as exc:
                raise UsageError(f"--users-file: {exc}") from None
        return AuthConfig(tokens=tokens) if tokens else None
    except UsageError:
        raise
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None


def resolve_tls(args):
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("TLS needs both --tls-cert and --tls-key")
    if not args.tls_cert:
        return None
    require_file(args.tls_cert, "--tls-cert")
    require_file(args.tls_key, "--tls-key")
    from flightsrv.server.flight import TlsConfig

    return TlsConfig(cert_path=args.tls_cert, key_path=args.tls_key)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Fail early, in one line, when ``host:port`` cannot be listened on. gRPC's own failure
    is an opaque "Server did not start properly" plus native log lines."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port number (0-65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ServerStartError(f"cannot listen on {host}: {exc.strerror}", host=host) from None
    if port == 0:
        return
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno in (98, 48):  # EADDRINUSE (Linux, macOS)
                raise ServerStartError(
                    f"port {port} on {host} is already in use (stop the other server, or pick "
                    "another with --port, or --port 0 for a free one)") from None
            raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def cmd_serve(args) -> int:
    import dataclasses

    from flightsrv.server.app import run
    from flightsrv.server.config import ServerConfig

    auth = resolve_auth(args)
    resolve_tls(args)
    worker = getattr(args, "worker_socket", None)
    if worker is not None:
        from flightsrv.server.signals import follow_parent

        follow_parent()  # a worker ends (drains) with its parent, however that dies
    if worker is None:
        check_port(args.host, args.port)
    try:
        cfg = ServerConfig.from_args(args)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    cfg = dataclasses.replace(cfg, auth_tokens=tuple(spec for spec, _ in _token_specs(args)))
    level = getattr(logging, (args.log_level or "info").upper())
    if level > logging.DEBUG:
        # gRPC's own log lines are unstructured and, for a bind failure, precede our one
        # line; --log-level debug (or setting GRPC_VERBOSITY yourself) keeps them
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    wh = open_warehouse(args, must_exist=False)
    if cfg.temp_dir is not None:  # a bad value: exit 2 before anything is read or written
        from flightsrv.engine.relations import native_root
        from flightsrv.server.config import check_temp_dir

        try:
            check_temp_dir(os.path.abspath(cfg.temp_dir), native_root(wh))
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
    wh.is_initialized()  # a file where the warehouse should be fails here, in one line
    scheme = "grpc+tls" if args.tls_cert else "grpc"

    def started(port: int, tables: list[str]) -> None:
        if worker is not None:
            # the parent prints the line once every worker is up (each writes its socket's
            # ".ready" file when it serves everything, its metrics endpoint included)
            return
        workers = f"{cfg.workers} workers; " if cfg.workers > 1 else ""
        sys.stderr.write(f"flightsrv: serving {wh.uri} on {scheme}://{args.host}:{port} "
                         f"(tables: {', '.join(tables) or '-'}; {workers}Ctrl-C stops)\n")
        if auth is None and not is_loopback(args.host):
            warn(f"serving on {args.host} without --auth-token or --users-file: anyone who "
                 f"can reach port {port} can read and change every table")
        sys.stderr.flush()

    try:
        if cfg.workers > 1:
            return _supervise(cfg, level, wh, started, auth)
        if worker is not None:
            return run(cfg, args.warehouse, level, warehouse=wh, auth=auth, on_start=started,
                       worker=(worker, _forwarded(args)))
        return run(cfg, args.warehouse, level, warehouse=wh, auth=auth, on_start=started)
    except FlightsrvError:
        raise
    except Exception as exc:
        if not _out_of_memory(exc):
            raise ServerStartError(f"the server did not start on {args.host}:{args.port} "
                                   f"({one_line(exc)}); is the port in use or the address "
                                   "not one of this machine's?") from None
        raise ServerStartError(
            f"the server did not start: out of memory under its cap ({one_line(exc)}); "
            "raise --memory-headroom (or --memory-limit), or turn the cap off with "
            "--memory-headroom off") from None


def _out_of_memory(exc: BaseException) -> bool:
    """Whether starting failed for want of memory under the process cap (Python's
    MemoryError, DuckDB's Out of Memory, a thread whose stack could not be mapped), not
    for the address (gRPC's failure to bind is an opaque ArrowException)."""
    text = str(exc)
    return isinstance(exc, MemoryError) or "Out of Memory" in text or \
        "can't start new thread" in text


def _forwarded(args):
    """A worker's Forwarded: the public port, and the token key its parent wrote on stdin."""
    from flightsrv.server.flight import Forwarded

    try:
        key = bytes.fromhex(sys.stdin.readline().strip())
    except ValueError:
        key = b""
    if len(key) != 32:
        raise UsageError("--worker-socket is for workers that flightsrv serve --workers "
                         "starts (no token key on stdin)")
    # the parent relays plain connections and puts a front before TLS (server/workers.py)
    return Forwarded(public_port=args.public_port or 0, token_key=key,
                     index=getattr(args, "worker_index", 0) or 0,
                     via="front" if args.tls_cert else "relay",
                     slots_socket=getattr(args, "slots_socket", None))


def _supervise(cfg, level, wh, started, auth) -> int:
    """``--workers N``: worker/front pairs under this process (server/workers.py)."""
    from flightsrv.server.logs import configure_json_logging
    from flightsrv.server.workers import supervise

    configure_json_logging(level)
    # the tables once every worker is up: worker 0 may have seeded the demo table
    return supervise(sys.argv[1:], cfg, lambda port: started(
        port, wh.list_tables() if wh.is_initialized() else []), auth=auth is not None)

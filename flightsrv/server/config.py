"""Every ``flightsrv serve`` option in one place: ``ServerConfig`` and the argparse options.

Contract:

- ``add_serve_arguments(parser)`` adds the serve options to an argparse (sub)parser;
  ``ServerConfig.from_args(namespace)`` turns the parsed options into a config. The CLI
  (``flightsrv.cli``) only calls these two and ``flightsrv.server.app.run``.
- ``ServerConfig()`` holds the defaults used by ``start_in_thread`` in tests and by
  ``serve``; every limit is per principal (the authenticated user, or ``anonymous`` when
  auth is off: then everyone shares one set of limits).
- ``resolve_temp_dir`` / ``check_temp_dir`` keep DuckDB's spill directory outside the
  warehouse (a ``ConfigurationError`` names both paths otherwise).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass, fields

from flightsrv.errors import ConfigurationError

MiB = 1 << 20


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 31337
    auth_tokens: tuple[str, ...] = ()  # TOKEN[:reader|writer]
    users_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    demo: bool = False  # seed the demo table even on S3
    no_demo: bool = False  # never seed it
    # statements and resources
    query_timeout_s: float = 300.0  # 0 = none; SET statement_timeout can only lower it
    memory_limit: str = "50%"  # DuckDB memory_limit (of RAM, or of the cgroup limit)
    # serve caps the process's data memory (RLIMIT_DATA) at memory_limit + this, so that
    # one value DuckDB builds outside its buffer manager (repeat(), string_agg()) fails
    # its statement with Out of Memory instead of growing the process; "off" = no cap
    memory_headroom: str = "1GiB"
    threads: int | None = None  # DuckDB threads (each worker's); None = CPU count
    # the time zone statements run in (DuckDB's TimeZone): a TIMESTAMPTZ shown, cast to a
    # date or truncated; None = DuckDB's default, the host's (servers of one warehouse on
    # hosts of different zones should all set it)
    time_zone: str | None = None
    # server processes sharing the port (server/workers.py); 1 = one process, as before
    workers: int = 1
    temp_dir: str | None = None  # DuckDB spill directory; None = a private temp dir
    max_statement_bytes: int = 1 * MiB
    max_message_bytes: int = 64 * MiB  # one DoPut message (record batch, parameters)
    # per-principal limits
    max_prepared_statements: int = 256
    max_sessions: int = 64
    max_concurrent_queries: int = 16  # more wait in a FIFO queue until a slot or deadline
    max_queued_queries: int = 256  # statements waiting for a slot; beyond: refused at once
    max_open_puts: int = 16  # DoPut streams open at once (each holds a server thread)
    max_results: int = 64  # unfetched results of side-effect statements kept per principal
    # a prepared query starts running at its parameters' bind (DoPut), if a slot is free,
    # instead of at DoGet (docs/SERVER.md, "Early runs"); one process only
    early_runs: bool = True
    # lifetimes (seconds)
    prepared_ttl_s: int = 3600  # idle time before a prepared statement handle expires
    # idle time before a session (its SET values) expires: a dropped connection's session
    # is not noticed otherwise, and holds one of max_sessions until then
    session_ttl_s: int = 900
    ticket_ttl_s: int = 3600  # a query ticket is redeemable this long after GetFlightInfo
    result_ttl_s: int = 600  # a side-effect statement's result waits this long for DoGet
    token_ttl_s: int = 12 * 3600  # bearer tokens issued by the basic-auth handshake
    # auth failures: after ``auth_free_failures`` failures a peer waits
    # ``auth_backoff_base_s * 2**(n - free)`` seconds (at most ``auth_backoff_max_s``)
    auth_free_failures: int = 5
    auth_backoff_base_s: float = 1.0
    auth_backoff_max_s: float = 300.0
    # password hashes (PBKDF2) checked at once, server-wide
    max_concurrent_logins: int = max(1, (os.cpu_count() or 2) // 2)
    # operability
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_auth: bool = False  # /metrics needs one of the server's bearer tokens
    log_statements: str = "redacted"  # full | redacted | off
    drain_timeout_s: float = 30.0
    # automatic maintenance (docs/MAINTENANCE.md §Automatic maintenance): one background
    # worker compacts tables whose properties ask for it (auto_compact, on by default)
    auto_maintenance: bool = True
    maintenance_interval_s: float = 5.0  # seconds between the worker's ticks
    maintenance_rate: str = "32MiB"  # bytes read + written per second, on average
    maintenance_yield_s: float = 10.0  # longest wait for no statement running, per task
    maintenance_wake_commits: int = 16  # commits to one table that wake the worker early

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerConfig:
        values = {}
        for f in fields(cls):
            if not hasattr(args, f.name):
                continue
            v = getattr(args, f.name)
            if v is None and f.name not in _NULLABLE:
                continue
            values[f.name] = tuple(v) if f.name == "auth_tokens" else v
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigurationError("TLS needs both --tls-cert and --tls-key",
                                     tls_cert=self.tls_cert, tls_key=self.tls_key)
        if self.users_file is not None and not self.users_file.strip():
            raise ConfigurationError("--users-file is empty: name a users file, or none")
        if self.log_statements not in ("full", "redacted", "off"):
            raise ConfigurationError("--log-statements is full|redacted|off",
                                     value=self.log_statements)
        for name in ("workers", "max_statement_bytes", "max_message_bytes",
                     "max_prepared_statements", "max_sessions", "max_concurrent_queries",
                     "max_results",
                     "max_queued_queries", "max_open_puts", "session_ttl_s",
                     "max_concurrent_logins"):
            if getattr(self, name) < 1:
                raise ConfigurationError("limit must be at least 1", limit=name,
                                         value=getattr(self, name))
        self.process_memory_cap  # noqa: B018 - raises ConfigurationError for a bad size
        if self.maintenance_interval_s <= 0 or self.maintenance_yield_s < 0:
            raise ConfigurationError("--maintenance-interval must be > 0 and "
                                     "--maintenance-yield >= 0",
                                     interval=self.maintenance_interval_s,
                                     yield_s=self.maintenance_yield_s)
        if self.maintenance_wake_commits < 0:
            raise ConfigurationError("--maintenance-wake-commits must be >= 0 (0: never)",
                                     value=self.maintenance_wake_commits)
        if self.maintenance_bytes_per_s < 1:
            raise ConfigurationError("--maintenance-rate must be at least 1 byte per second",
                                     value=self.maintenance_rate)
        if self.query_timeout_s < 0:
            raise ConfigurationError("--query-timeout must be >= 0 (0: none)",
                                     value=self.query_timeout_s)
        from flightsrv.engine.connection import check_time_zone

        try:
            if self.time_zone is not None:
                check_time_zone(self.time_zone)
        except ConfigurationError as e:
            raise ConfigurationError("--time-zone: " + e.message, **e.context) from None

    @property
    def process_memory_cap(self) -> int | None:
        """Bytes of data memory (RLIMIT_DATA) ``serve`` allows itself; None = no cap."""
        if self.memory_headroom.strip().lower() in ("off", "none", "0"):
            return None
        return memory_bytes(self.memory_limit) + memory_bytes(self.memory_headroom)

    @property
    def maintenance_bytes_per_s(self) -> int:
        return memory_bytes(self.maintenance_rate)

    @property
    def effective_threads(self) -> int:
        return self.threads or os.cpu_count() or 1


_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def memory_bytes(text: str) -> int:
    """``64MB``, ``8GiB`` or ``50%`` (of physical memory) as bytes, as DuckDB reads them."""
    t = text.strip().lower().replace(" ", "")
    try:
        if t.endswith("%"):
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return int(total * float(t[:-1]) / 100)
        digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
        return int(float(digits) * _UNITS[t[len(digits):]])
    except (ValueError, KeyError, OSError):
        raise ConfigurationError("not a memory size (e.g. 64MB, 8GiB, 50%)",
                                 value=text) from None


_NULLABLE = {"users_file", "tls_cert", "tls_key", "temp_dir", "metrics_port", "threads"}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask: taskset, cpusets)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _workers(text: str) -> int:
    """``--workers``: a count, or ``auto`` for one worker per usable core."""
    if text.strip().lower() == "auto":
        return usable_cores()
    try:
        return _positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a number of processes, or auto (one per "
                                         "core)") from None


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` options; defaults come from ``ServerConfig``."""
    d = ServerConfig()
    net = p.add_argument_group("listening")
    net.add_argument("--host", default=d.host, help="listen address (default: %(default)s)")
    net.add_argument("--port", type=int, default=d.port,
                     help="listen port, 0 = any free one (default: %(default)s)")
    net.add_argument("--tls-cert", help="PEM certificate chain: serve grpc+tls")
    net.add_argument("--tls-key", help="PEM private key for --tls-cert")
    auth = p.add_argument_group("authentication")
    auth.add_argument("--auth-token", dest="auth_tokens", action="append", default=[],
                      metavar="TOKEN[:reader|writer]",
                      help="accept this bearer token (repeatable; role defaults to writer)")
    auth.add_argument("--users-file", help="user:hash:role lines (see `flightsrv user hash`)")
    auth.add_argument("--max-concurrent-logins", type=_positive_int,
                      default=d.max_concurrent_logins,
                      help="password checks run at once, server-wide (default: half the "
                           "cores)")
    res = p.add_argument_group("statements and resources")
    res.add_argument("--query-timeout", dest="query_timeout_s", type=float,
                     default=d.query_timeout_s, metavar="SECONDS",
                     help="interrupt any statement running longer (0: never; "
                          "default: %(default)s)")
    res.add_argument("--memory-limit", default=d.memory_limit,
                     help="DuckDB memory limit, e.g. 8GiB or 50%% (default: %(default)s)")
    res.add_argument("--memory-headroom", default=d.memory_headroom,
                     help="cap the process's data memory at --memory-limit plus this, so "
                          "no single value can outgrow the limit ('off': no cap; "
                          "default: %(default)s)")
    res.add_argument("--threads", type=_positive_int, default=None,
                     help="DuckDB worker threads (default: CPU count)")
    res.add_argument("--time-zone", default=d.time_zone, metavar="NAME",
                     help="IANA time zone statements run in: how a TIMESTAMPTZ is shown, "
                          "cast to a date or truncated (default: the host's, as DuckDB's; "
                          "set it where servers of one warehouse run on hosts of different "
                          "zones)")
    res.add_argument("--workers", type=_workers, default=d.workers, metavar="N|auto",
                     help="server processes sharing the port, each with its own DuckDB; "
                          "auto: one per usable core (default: %(default)s; more is "
                          "opt-in: docs/SERVER.md, \"Several worker processes\")")
    # one worker of --workers N, started by the parent (server/workers.py); not for users
    res.add_argument("--worker-socket", default=None, help=argparse.SUPPRESS)
    res.add_argument("--public-port", type=int, default=None, help=argparse.SUPPRESS)
    res.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    res.add_argument("--slots-socket", default=None, help=argparse.SUPPRESS)
    res.add_argument("--temp-dir", default=None,
                     help="DuckDB spill directory, outside the warehouse (default: a private "
                          "directory under the system temp dir, removed on exit)")
    res.add_argument("--max-statement-bytes", type=_positive_int, default=d.max_statement_bytes,
                     help="longest SQL text accepted (default: %(default)s)")
    res.add_argument("--max-message-bytes", type=_positive_int, default=d.max_message_bytes,
                     help="largest DoPut message (record batch) accepted (default: "
                          "%(default)s)")
    lim = p.add_argument_group("per-principal limits")
    lim.add_argument("--max-prepared-statements", type=_positive_int,
                     default=d.max_prepared_statements,
                     help="open prepared statements per principal (in the whole server, "
                          "with --workers N too; default: %(default)s)")
    lim.add_argument("--max-sessions", type=_positive_int, default=d.max_sessions,
                     help="sessions (connections holding SET values) per principal "
                          "(in the whole server, with --workers N too; default: %(default)s)")
    lim.add_argument("--max-concurrent-queries", type=_positive_int,
                     default=d.max_concurrent_queries,
                     help="statements running at once per principal (in the whole server, "
                          "with --workers N too); more wait in a fair queue until a slot "
                          "frees or their deadline passes (default: %(default)s)")
    lim.add_argument("--max-queued-queries", type=_positive_int,
                     default=d.max_queued_queries,
                     help="statements waiting for a slot per principal; more are refused "
                          "(default: %(default)s)")
    lim.add_argument("--max-results", type=_positive_int, default=d.max_results,
                     help="reports of maintenance statements (OPTIMIZE, VACUUM, PURGE) kept "
                          "unfetched per principal; a full table drops its oldest (per "
                          "worker with --workers N; default: %(default)s)")
    lim.add_argument("--max-open-puts", type=_positive_int, default=d.max_open_puts,
                     help="DoPut streams (uploads, parameter streams) open at once per "
                          "principal; more wait in a queue until one closes or their "
                          "deadline passes (default: %(default)s)")
    lim.add_argument("--early-runs", action=argparse.BooleanOptionalAction,
                     default=d.early_runs,
                     help="start a prepared query when its parameters are bound, if one of "
                          "the principal's slots is free, so DuckDB works while the client "
                          "asks for the result (default: on; one process only)")
    lim.add_argument("--session-ttl", dest="session_ttl_s", type=_positive_int,
                     default=d.session_ttl_s, metavar="SECONDS",
                     help="idle time after which a session's SET values are dropped "
                          "(default: %(default)s)")
    ops = p.add_argument_group("operability")
    ops.add_argument("--metrics-port", type=int, default=None,
                     help="serve /healthz, /readyz and /metrics (Prometheus) on this port")
    ops.add_argument("--metrics-host", default=d.metrics_host,
                     help="address of the metrics endpoint (default: %(default)s)")
    ops.add_argument("--metrics-auth", action="store_true", default=None,
                     help="/metrics answers only requests with Authorization: Bearer <one "
                          "of the server's --auth-token tokens>")
    ops.add_argument("--log-statements", choices=["full", "redacted", "off"],
                     default=d.log_statements,
                     help="statement text in logs: literals replaced by ? when redacted "
                          "(default: %(default)s)")
    ops.add_argument("--drain-timeout", dest="drain_timeout_s", type=float,
                     default=d.drain_timeout_s, metavar="SECONDS",
                     help="on SIGTERM, how long running calls may finish (default: %(default)s)")
    mnt = p.add_argument_group("automatic maintenance (docs/MAINTENANCE.md)")
    mnt.add_argument("--no-auto-maintenance", dest="auto_maintenance", action="store_false",
                     default=d.auto_maintenance,
                     help="do not run the background worker that compacts small files of "
                          "tables with auto_compact on (default: the worker runs)")
    mnt.add_argument("--maintenance-interval", dest="maintenance_interval_s", type=float,
                     default=d.maintenance_interval_s, metavar="SECONDS",
                     help="seconds between the worker's looks at recently written tables "
                          "(default: %(default)s)")
    mnt.add_argument("--maintenance-rate", default=d.maintenance_rate, metavar="BYTES",
                     help="bytes per second the worker reads and writes, on average "
                          "(default: %(default)s)")
    mnt.add_argument("--maintenance-yield", dest="maintenance_yield_s", type=float,
                     default=d.maintenance_yield_s, metavar="SECONDS",
                     help="how long a maintenance task waits for no statement to be "
                          "running before it runs anyway (default: %(default)s)")
    mnt.add_argument("--maintenance-wake-commits", dest="maintenance_wake_commits", type=int,
                     default=d.maintenance_wake_commits, metavar="N",
                     help="a table that received N commits wakes the worker before the "
                          "interval ends, at most five times a second; 0: only the interval "
                          "(default: %(default)s)")
    demo = p.add_argument_group("demo table")
    demo.add_argument("--no-demo", action="store_true", help="do not seed the demo table")
    demo.add_argument("--demo", action="store_true", help="seed the demo table even on S3")


def resolve_temp_dir(cfg: ServerConfig, warehouse_root: str | None) -> tuple[str, bool]:
    """DuckDB's spill directory and whether the server created it (and removes it).
    ``warehouse_root`` is the local warehouse directory, or None on S3."""
    if cfg.temp_dir is None:
        return tempfile.mkdtemp(prefix="flightsrv-spill-"), True
    path = os.path.abspath(cfg.temp_dir)
    check_temp_dir(path, warehouse_root)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path, False


def check_temp_dir(path: str, warehouse_root: str | None) -> None:
    if warehouse_root is None:
        return
    root = os.path.realpath(warehouse_root)
    real = os.path.realpath(path)
    if real == root or real.startswith(os.path.join(root, "")) or root.startswith(
            os.path.join(real, "")):
        raise ConfigurationError("--temp-dir must be outside the warehouse", temp_dir=path,
                                 warehouse=warehouse_root)

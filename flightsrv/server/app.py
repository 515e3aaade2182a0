"""Run the Flight SQL server: ``run`` for ``flightsrv serve``, ``serve`` for an engine you
built, ``start_in_thread`` for tests.

Contract:

- ``run(cfg, warehouse_uri)`` opens the warehouse, reports every table that cannot be read
  (one ``table_unavailable`` warning each, naming the object and the failed check) and
  keeps going, seeds the demo table when asked (a failure there is a warning too), builds
  ``DuckEngine`` with the configured threads, memory limit and spill directory (outside
  the warehouse), then ``serve``s. Returns the process exit status.
- ``serve`` logs one JSON object per line and blocks until SIGINT or SIGTERM, then drains:
  new calls get UNAVAILABLE, calls and result streams in progress may finish for
  ``drain_timeout_s``, whatever still runs is cancelled, and it returns (exit status 0).
  With ``metrics_port`` it also serves ``/healthz``, ``/readyz`` and ``/metrics``;
  ``/readyz`` answers 503 while draining or when the warehouse cannot be listed or has not
  proven its conditional-write preconditions.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qs

from flightsrv.server.signals import StopOnSignals
from flightsrv.engine.api import Engine
from flightsrv.errors import ConfigurationError, FlightsrvError
from flightsrv.server.auth import AuthConfig, static_tokens
from flightsrv.server.config import ServerConfig, resolve_temp_dir
from flightsrv.server.flight import FlightSqlServer, Forwarded, TlsConfig
from flightsrv.server.logs import JsonFormatter, configure_json_logging  # noqa: F401
from flightsrv.server.metrics import (
    CounterCarry,
    MetricsHttpServer,
    bearer_check,
    merge_workers,
    unix_get,
)

log = logging.getLogger("flightsrv.server")


def _location(host: str, port: int, tls: TlsConfig | None) -> str:
    scheme = "grpc+tls" if tls else "grpc+tcp"
    return f"{scheme}://{host}:{port}"


def start_in_thread(engine: Engine, host: str = "127.0.0.1", port: int = 0, *,
                    auth: AuthConfig | None = None, tls: TlsConfig | None = None,
                    auto_maintenance: bool = False,
                    **kwargs) -> tuple[FlightSqlServer, int]:  # fmt: skip
    """Start a server (gRPC serves on its own threads) and return it with its port.
    Stop it with ``server.shutdown()``. ``auto_maintenance``: also start the background
    maintenance worker, as ``serve`` does unless ``--no-auto-maintenance`` (off here, so
    that tests of other things see only their own commits)."""
    server = FlightSqlServer(engine, _location(host, port, tls), auth=auth, tls=tls, **kwargs)
    if auto_maintenance:
        start_maintenance(server, engine, server.config)
    return server, server.port


def start_maintenance(server: FlightSqlServer, engine: Engine, cfg: ServerConfig):
    """Start the background maintenance worker of ``server`` (docs/MAINTENANCE.md
    §Automatic maintenance): over the engine's warehouse, yielding to running statements,
    counted in the server's metrics, stopped by ``server.shutdown()``. None when the
    engine has no warehouse."""
    from flightsrv.table.maintenance.scheduler import MaintenanceScheduler

    warehouse = getattr(engine, "warehouse", None)
    if warehouse is None:
        return None
    scheduler = MaintenanceScheduler(
        warehouse, interval_s=cfg.maintenance_interval_s,
        bytes_per_s=cfg.maintenance_bytes_per_s, yield_s=cfg.maintenance_yield_s,
        wake_commits=cfg.maintenance_wake_commits,
        busy=server.server_busy, on_run=server.metrics.maintenance_run,
        on_tick=server.metrics.maintenance_tick)
    server.maintenance = scheduler.start()
    return scheduler


def auth_from_config(cfg: ServerConfig) -> AuthConfig | None:
    """The AuthConfig of ``cfg``'s tokens and users file, or None when it names neither.
    ``ConfigurationError`` for a bad or conflicting token spec or an empty users file."""
    tokens = static_tokens((spec, "--auth-token") for spec in cfg.auth_tokens)
    common = dict(token_ttl_s=cfg.token_ttl_s, free_failures=cfg.auth_free_failures,
                  backoff_base_s=cfg.auth_backoff_base_s, backoff_max_s=cfg.auth_backoff_max_s,
                  max_concurrent_logins=cfg.max_concurrent_logins)
    if cfg.users_file is not None:
        auth = AuthConfig.from_users_file(cfg.users_file, tokens=tokens,
                                          token_ttl_s=cfg.token_ttl_s)
        auth.free_failures = cfg.auth_free_failures
        auth.backoff_base_s = cfg.auth_backoff_base_s
        auth.backoff_max_s = cfg.auth_backoff_max_s
        auth.max_concurrent_logins = cfg.max_concurrent_logins
        return auth
    if tokens:
        return AuthConfig(tokens=tokens, **common)
    return None


#: a worker's exit status when its drain deadline passed with statements still running
WORKER_NOT_DRAINED = 75


def report_tables(engine, quiet: bool = False) -> list[str]:
    """List the warehouse's tables, logging each one that cannot be read (unless quiet)."""
    broken: list = []
    names = engine.list_tables(broken)
    if quiet:
        return names
    for name, exc in broken:
        ctx = getattr(exc, "context", {}) or {}
        log.warning("table unavailable", extra={"fields": {
            "event": "table_unavailable", "table": name,
            "object": ctx.get("key") or ctx.get("object"),
            "check": getattr(exc, "message", None) or str(exc),
            "error_class": type(exc).__name__}})
    return names


def run(cfg: ServerConfig, warehouse_uri: str, log_level: int = logging.INFO, *,
        warehouse=None, auth: AuthConfig | None = None,
        on_start: Callable[[int, list[str]], None] | None = None,
        worker: tuple[str, Forwarded] | None = None) -> int:
    """``flightsrv serve``: see the module docstring. ``warehouse`` / ``auth``: already
    opened / resolved by the caller (the CLI); ``on_start(port, tables)`` runs once the port
    is bound (default: print the "serving" line). ``worker``: (unix socket path, Forwarded)
    for one worker of ``--workers N`` (server/workers.py): it listens on that socket without
    TLS, behind its front."""
    from flightsrv import Warehouse
    from flightsrv.demo import DEMO_TABLE, seed_demo
    from flightsrv.engine.duck import DuckEngine
    from flightsrv.engine.relations import native_root

    configure_json_logging(log_level, static=None if worker is None
                           else {"worker": worker[1].index})
    wh = warehouse if warehouse is not None else Warehouse.open(warehouse_uri)
    root = native_root(wh)
    if auth is None:
        auth = auth_from_config(cfg)
    elif auth.max_concurrent_logins != cfg.max_concurrent_logins:
        auth.max_concurrent_logins = cfg.max_concurrent_logins  # the CLI builds its own
    tls = TlsConfig(cfg.tls_cert, cfg.tls_key) if cfg.tls_cert and worker is None else None
    seed = cfg.demo or (not cfg.no_demo and not warehouse_uri.startswith("s3://"))
    if seed:
        try:
            skipped = seed_demo(wh)
            if skipped is None:
                log.info("seeded demo table", extra={"fields": {"table": DEMO_TABLE,
                                                                "warehouse": wh.uri}})
            else:  # a warning when --demo asked for it, else a note
                (log.warning if cfg.demo else log.info)(
                    f"demo table not seeded: {skipped}", extra={"fields": {
                        "event": "demo_not_seeded", "table": DEMO_TABLE,
                        "warehouse": wh.uri}})
        except FlightsrvError as exc:
            log.warning("demo table not seeded", extra={"fields": {
                "event": "demo_not_seeded", "error_class": type(exc).__name__,
                "error": str(exc)}})
    temp_dir, own_temp = resolve_temp_dir(cfg, root)
    cap_process_memory(cfg.process_memory_cap)
    try:
        engine = DuckEngine(wh, threads=cfg.effective_threads, memory_limit=cfg.memory_limit,
                            temp_directory=temp_dir, time_zone=cfg.time_zone)
        # one server logs each unreadable table once: behind --workers N, worker 0 does
        names = report_tables(engine, quiet=worker is not None and worker[1].index > 0)

        def started(port: int) -> None:
            if on_start is not None:
                on_start(port, names)
                return
            sys.stderr.write(f"flightsrv: serving {wh.uri} on grpc{'+tls' if tls else ''}://"
                             f"{cfg.host}:{port} (tables: {', '.join(names) or '-'})\n")

        paths = [(temp_dir, "<temp>")]
        if root:
            paths.append((root, "<warehouse>"))
        extra = {}
        if worker is not None:
            extra = dict(location=f"grpc+unix://{worker[0]}", forwarded=worker[1])
        drained = serve(engine, cfg.host, cfg.port, auth=auth, tls=tls, config=cfg,
                        ready=_readiness(wh), scrub_paths=tuple(paths), log_level=log_level,
                        on_start=started, **extra)
    finally:
        if own_temp:
            shutil.rmtree(temp_dir, ignore_errors=True)
    # a worker tells its parent whether it drained (the parent logs the server's "stopped")
    return 0 if drained or worker is None else WORKER_NOT_DRAINED


def _data_bytes() -> int:
    """The process's data memory now (VmData: what RLIMIT_DATA counts), 0 if unknown. A
    server holds much of it before its first statement: gRPC's and DuckDB's thread stacks
    are reserved address space."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cap_process_memory(cap: int | None) -> None:
    """Lower RLIMIT_DATA (brk and private writable mappings) to ``cap`` bytes more than
    the process holds now (a fixed cap below a server's baseline, its reserved thread
    stacks, refused its first allocations: it did not start). DuckDB's
    memory_limit governs its buffer manager, not one value's allocation: repeat('x',
    1500000000) peaked at 3.1 GB under --memory-limit 64MB. Under the cap such an
    allocation fails (DuckDB turns bad_alloc into its Out of Memory error, which the
    server reports naming --memory-limit) and the process keeps serving."""
    if cap is None:
        return
    import resource

    held = _data_bytes()
    cap += held  # on top of what the process already holds (thread stacks, the runtime)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        return
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    log.info("process memory capped", extra={"fields": {
        "event": "memory_cap", "rlimit_data_bytes": cap, "held_bytes": held,
        # DuckDB's allocator must give freed address space back under the cap (cli/__init__)
        "allocator_conf": os.environ.get("DUCKDB_JE_MALLOC_CONF")}})


def _readiness(wh) -> Callable[[], tuple[bool, str]]:
    state = {"at": 0.0, "answer": (False, "not checked yet")}
    lock = threading.Lock()

    def ready() -> tuple[bool, str]:
        with lock:
            if time.monotonic() - state["at"] < 2.0:
                return state["answer"]
            try:
                wh.store.list_prefixes("")
                wh.ensure_writable()
                answer = (True, f"ready: warehouse {wh.uri} reachable, preconditions proven")
            except Exception as exc:  # noqa: BLE001 - not ready, and why
                answer = (False, f"not ready: {type(exc).__name__}: {exc}")
            state["at"], state["answer"] = time.monotonic(), answer
            return answer

    return ready


def serve(engine: Engine, host: str = "0.0.0.0", port: int = 31337, *,
          auth: AuthConfig | None = None, tls: TlsConfig | None = None,
          config: ServerConfig | None = None,
          ready: Callable[[], tuple[bool, str]] | None = None,
          log_level: int = logging.INFO, on_start: Callable[[int], None] | None = None,
          location: str | None = None, **kwargs) -> bool:  # fmt: skip
    """Serve until SIGINT/SIGTERM, then drain; True when every call ended within the drain
    deadline. Must run in the main thread (signals).
    ``on_start(port)`` runs once the port is bound (the real port when ``port`` is 0).
    ``location``: listen there instead of ``host:port`` (a worker's unix socket)."""
    cfg = config or ServerConfig()
    authorize = None
    if cfg.metrics_auth:
        tokens = list(auth.tokens) if auth is not None else []
        if not tokens:
            raise ConfigurationError("--metrics-auth needs at least one --auth-token "
                                     "(/metrics accepts the server's bearer tokens)")
        authorize = bearer_check(tokens)
    fwd = kwargs.get("forwarded")
    configure_json_logging(log_level, static=None if fwd is None else {"worker": fwd.index})
    server = FlightSqlServer(engine, location or _location(host, port, tls), auth=auth,
                             tls=tls, config=cfg, **kwargs)
    if cfg.auto_maintenance:
        start_maintenance(server, engine, cfg)
    metrics_http = None
    if cfg.metrics_port is not None:
        base_ready = ready or (lambda: (True, "ready"))

        def ready_now() -> tuple[bool, str]:
            if server.draining:
                return False, "not ready: draining"
            return base_ready()

        if fwd is None:
            metrics_http = MetricsHttpServer(server.metrics, ready_now, cfg.metrics_port,
                                             cfg.metrics_host, authorize)
        else:
            metrics_http = _worker_metrics(server, fwd, location, cfg, ready_now, authorize)
    signals = StopOnSignals()
    stop, received = signals.stop, signals.received
    # a worker listens on a unix socket (no port of its own): its line names the socket and
    # the port its clients reach, the front's
    # (its events are worker_* ones: the parent logs the server's start, stop and stopped)
    where = {"host": host, "port": server.port, "workers": 1} if fwd is None else \
        {"socket": (location or "").split("://", 1)[-1], "port": fwd.public_port}
    event = "" if fwd is None else "worker_"
    log.info("serving", extra={"fields": {
        "event": event + "start", **where, "tls": tls is not None,
        "auth": auth is not None, "pid": os.getpid(),
        "metrics_port": metrics_http.port if metrics_http else None}})  # fmt: skip
    if fwd is not None:
        _mark_ready(where["socket"], metrics_http.port if metrics_http else None)
    if on_start is not None:
        on_start(server.port)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        log.info("shutting down", extra={"fields": {
            "event": event + "stop", "signal": ",".join(received),
            "drain_timeout_s": cfg.drain_timeout_s}})
        server.begin_drain()
        if server.maintenance is not None:  # a run in progress may finish its commit
            server.maintenance.stop(timeout=cfg.drain_timeout_s)
        drained = server.wait_idle(cfg.drain_timeout_s)
        if not drained:
            n = server.cancel_all("cancelled")
            log.warning("drain deadline passed; cancelled running statements",
                        extra={"fields": {"event": "drain_timeout", "cancelled": n}})
        _shutdown_within(server, 10.0)
        if metrics_http is not None:
            metrics_http.close()
        close = getattr(engine, "close", None)
        if callable(close):
            close()
        signals.restore()
        log.info("stopped", extra={"fields": {"event": event + "stopped", "drained": drained}})
    return drained


def _mark_ready(socket_path: str, metrics_port: int | None) -> None:
    """Tell the parent of ``serve --workers N`` that this worker serves everything: its
    socket and (worker 0) the metrics port, which the parent's start line names."""
    tmp = socket_path + ".ready.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "metrics_port": metrics_port}, f)
    os.replace(tmp, socket_path + ".ready")


def _worker_metrics(server: FlightSqlServer, fwd: Forwarded, location: str | None, cfg,
                    ready_now: Callable[[], tuple[bool, str]], authorize):
    """A worker's metrics endpoint (``serve --workers N --metrics-port P``): worker 0 serves
    the port and answers for every worker (the samples summed as one server's, or with
    ``?by=worker`` each labelled ``worker``; ``/readyz`` is
    ready when every worker is), the others serve ``m<index>.sock`` beside their own socket
    for worker 0 to read."""
    sockdir = os.path.dirname((location or "").split("://", 1)[-1])
    if fwd.index > 0:
        return MetricsHttpServer(server.metrics, ready_now, 0,
                                 unix_path=os.path.join(sockdir, f"m{fwd.index}.sock"))

    def peers() -> list[tuple[str, str]]:
        found = []
        for name in os.listdir(sockdir):
            if name.startswith("m") and name.endswith(".sock") and name[1:-5].isdigit():
                found.append((name[1:-5], os.path.join(sockdir, name)))
        return sorted(found, key=lambda p: int(p[0]))

    carry = CounterCarry()  # the summed counters stay monotonic across worker restarts

    def render(query: str) -> bytes:
        texts = [("0", server.metrics.render())]
        for index, path in peers():
            try:
                status, body = unix_get(path, "/metrics")
            except OSError:  # restarting: its samples return with it
                continue
            if status == 200:
                texts.append((index, body))
        reporting = ("# HELP flightsrv_workers_reporting workers whose samples this "
                     "scrape holds\n# TYPE flightsrv_workers_reporting gauge\n"
                     f"flightsrv_workers_reporting {len(texts)}\n").encode()
        by_worker = "worker" in parse_qs(query).get("by", [])
        return merge_workers(texts, by_worker=by_worker, carry=carry) + reporting

    def ready_all() -> tuple[bool, str]:
        ok, detail = ready_now()
        if not ok:
            return ok, f"worker 0 {detail}"
        for index, path in peers():
            try:
                status, body = unix_get(path, "/readyz")
            except OSError as exc:
                return False, f"not ready: worker {index} does not answer ({exc})"
            if status != 200:
                return False, f"worker {index} {body.decode(errors='replace').strip()}"
        return True, detail

    return MetricsHttpServer(server.metrics, ready_all, cfg.metrics_port, cfg.metrics_host,
                             authorize, render=render)


def _shutdown_within(server: FlightSqlServer, seconds: float) -> None:
    """``server.shutdown()``, which waits for every call; a stream blocked on a client
    that stopped reading must not keep the process alive forever."""
    t = threading.Thread(target=server.shutdown, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        log.warning("shutdown did not finish; exiting anyway",
                    extra={"fields": {"event": "shutdown_timeout"}})
        for h in logging.getLogger("flightsrv").handlers:
            h.flush()
        os._exit(0)

"""Run the Flight SQL server: ``serve`` for a process, ``start_in_thread`` for tests.

``serve`` logs one JSON object per line (``JsonFormatter``), blocks until SIGINT or SIGTERM
and then shuts down cleanly: new calls are refused, in-flight calls finish, and the engine's
``close()`` (if it has one) runs.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import signal
import sys
import threading
from typing import Callable

from flightsrv.engine.api import Engine
from flightsrv.server.auth import AuthConfig
from flightsrv.server.flight import FlightSqlServer, TlsConfig

log = logging.getLogger("flightsrv.server")


_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "fields", "message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...fields}`` on one line; ``extra={"fields": {}}``
    or any other ``extra=`` keys add structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": _dt.datetime.fromtimestamp(record.created, tz=_dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if v is not None})
        for k, v in record.__dict__.items():  # plain ``extra={...}`` (e.g. the commit log)
            if k not in _RECORD_ATTRS and k not in out and v is not None:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_json_logging(level: int = logging.INFO, stream=None) -> logging.Handler:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("flightsrv")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return handler


def _location(host: str, port: int, tls: TlsConfig | None) -> str:
    scheme = "grpc+tls" if tls else "grpc+tcp"
    return f"{scheme}://{host}:{port}"


def start_in_thread(engine: Engine, host: str = "127.0.0.1", port: int = 0, *,
                    auth: AuthConfig | None = None, tls: TlsConfig | None = None,
                    **kwargs) -> tuple[FlightSqlServer, int]:  # fmt: skip
    """Start a server (gRPC serves on its own threads) and return it with its port.
    Stop it with ``server.shutdown()``."""
    server = FlightSqlServer(engine, _location(host, port, tls), auth=auth, tls=tls, **kwargs)
    return server, server.port


def serve(engine: Engine, host: str = "0.0.0.0", port: int = 31337, *,
          auth: AuthConfig | None = None, tls: TlsConfig | None = None,
          log_level: int = logging.INFO, on_start: Callable[[int], None] | None = None,
          **kwargs) -> None:  # fmt: skip
    """Serve until SIGINT/SIGTERM. Must run in the main thread (signal handlers).
    ``on_start(port)`` runs once the port is bound (the real port when ``port`` is 0)."""
    configure_json_logging(log_level)
    server = FlightSqlServer(engine, _location(host, port, tls), auth=auth, tls=tls, **kwargs)
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    log.info("serving", extra={"fields": {
        "event": "start", "host": host, "port": server.port, "tls": tls is not None,
        "auth": auth is not None}})  # fmt: skip
    if on_start is not None:
        on_start(server.port)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        log.info("shutting down", extra={"fields": {"event": "stop", "signal": ",".join(received)}})
        server.shutdown()
        close = getattr(engine, "close", None)
        if callable(close):
            close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        log.info("stopped", extra={"fields": {"event": "stopped"}})

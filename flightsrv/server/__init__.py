"""The Arrow Flight SQL front end. It speaks the wire protocol and delegates to an ``Engine``
(flightsrv.engine.api); it knows nothing of tables, SQL or storage.

- ``flight``    ``FlightSqlServer``: RPC entry points, statements, DoPut, actions
- ``commands``  metadata commands: one entry per command, schema beside handler
- ``tickets``   HMAC-signed tickets bound to a principal and an expiry
- ``limits``    per-principal prepared statements, sessions, results, concurrency
- ``calls``     statements in flight: Cancel tokens, deadlines, client cancellation
- ``ingest``    DoPut payloads: bulk ingest options, parameter batches, message limit
- ``metadata``  result schemas, SqlInfo answers, XDBC type info (data, not logic)
- ``status``    exception -> Flight/gRPC status mapping, client-safe messages
- ``auth``      basic/bearer authentication middleware, users file, roles, back-off
- ``metrics``   Prometheus metrics, /healthz /readyz /metrics endpoint
- ``logs``      JSON log lines, statement redaction
- ``config``    ``ServerConfig`` and the ``serve`` options
- ``app``       ``run`` (flightsrv serve), ``serve`` (signals, drain), ``start_in_thread``
- ``signals``   SIGINT/SIGTERM as a stop request (``app.serve`` and ``workers.supervise``)
"""

import importlib

# Imported on first use (PEP 562): ``flightsrv.server.config`` alone, which every CLI start
# needs for the ``serve`` options, does not load the Flight server, gRPC and the engine
_EXPORTS = {
    "run": "app", "serve": "app", "start_in_thread": "app",
    "AuthConfig": "auth", "Principal": "auth", "hash_password": "auth",
    "ServerConfig": "config", "add_serve_arguments": "config",
    "FlightSqlServer": "flight", "TlsConfig": "flight",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

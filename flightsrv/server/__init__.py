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

from flightsrv.server.app import run, serve, start_in_thread
from flightsrv.server.auth import AuthConfig, Principal, hash_password
from flightsrv.server.config import ServerConfig, add_serve_arguments
from flightsrv.server.flight import FlightSqlServer, TlsConfig

__all__ = [
    "AuthConfig",
    "FlightSqlServer",
    "Principal",
    "ServerConfig",
    "TlsConfig",
    "add_serve_arguments",
    "hash_password",
    "run",
    "serve",
    "start_in_thread",
]

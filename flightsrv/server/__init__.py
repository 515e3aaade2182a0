"""The Arrow Flight SQL front end. It speaks the wire protocol and delegates to an ``Engine``
(flightsrv.engine.api); it knows nothing of tables, SQL or storage.

- ``proto``     Flight SQL protobuf messages, built at runtime under a private package
- ``flight``    ``FlightSqlServer``: commands, prepared statements, DoPut, actions, tickets
- ``metadata``  result schemas, SqlInfo answers, XDBC type info (data, not logic)
- ``status``    exception -> Flight/gRPC status code mapping
- ``auth``      basic/bearer authentication middleware, users file, roles
- ``app``       ``serve`` (signals, JSON logs) and ``start_in_thread`` for tests
"""

from flightsrv.server.app import serve, start_in_thread
from flightsrv.server.auth import AuthConfig, Principal, hash_password
from flightsrv.server.flight import FlightSqlServer, TlsConfig

__all__ = [
    "AuthConfig",
    "FlightSqlServer",
    "Principal",
    "TlsConfig",
    "hash_password",
    "serve",
    "start_in_thread",
]

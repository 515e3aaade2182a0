"""Shared pieces for the server tests that run the product engine (DuckEngine) over a real
warehouse, with two principals: a reader and a writer.

- ``Counting``: the real engine, counting how often each statement is executed (so an
  exactly-once test can see a second execution, not only its effect).
- ``start(tmp_path, **config)``: a FlightSqlServer with static tokens ``w-token`` (writer)
  and ``r-token`` (reader) and the given ``ServerConfig`` fields.
- raw ``pyarrow.flight`` helpers: ``desc``, ``fetch``, ``update``, ``action``, ``opts``.
"""

from __future__ import annotations

import collections
import threading
import warnings

import pyarrow as pa
from pyarrow import flight

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine
from flightsrv.engine.api import Role
from flightsrv.server import proto
from flightsrv.server.app import start_in_thread
from flightsrv.server.auth import AuthConfig, Principal
from flightsrv.server.config import ServerConfig

WRITER, READER = "w-token", "r-token"
TOKEN_HEADER = "adbc.flight.sql.authorization_header"


class Counting:
    """DuckEngine with a count of executions per statement text."""

    def __init__(self, engine):
        self.engine = engine
        self.executed: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def _count(self, sql):
        with self._lock:
            self.executed[" ".join(sql.split())] += 1

    def execute_query(self, sql, *args, **kwargs):
        self._count(sql)
        return self.engine.execute_query(sql, *args, **kwargs)

    def execute_update(self, sql, *args, **kwargs):
        self._count(sql)
        return self.engine.execute_update(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def auth() -> AuthConfig:
    return AuthConfig(tokens={WRITER: Principal("writer", Role.WRITER),
                              READER: Principal("reader", Role.READER)})


def start(tmp_path, *, with_auth: bool = True, runtime=None, **config):
    """(server, counting engine, warehouse, uri) over a fresh local warehouse."""
    wh = Warehouse.open(str(tmp_path / "wh"))
    engine = Counting(DuckEngine(wh))
    kwargs = {"config": ServerConfig(**config)}
    if runtime is not None:
        kwargs["runtime"] = runtime
    server, port = start_in_thread(engine, auth=auth() if with_auth else None, **kwargs)
    return server, engine, wh, f"grpc://127.0.0.1:{port}"


def opts(token: str | None, timeout: float | None = None) -> flight.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(headers=headers, timeout=timeout)


def desc(msg) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(proto.pack(msg))


def query(sql: str) -> flight.FlightDescriptor:
    return desc(proto.CommandStatementQuery(query=sql))


def fetch(client, descriptor, token=None) -> tuple[flight.FlightInfo, pa.Table]:
    info = client.get_flight_info(descriptor, opts(token))
    tables = [client.do_get(ep.ticket, opts(token)).read_all() for ep in info.endpoints]
    return info, pa.concat_tables(tables)


def update(client, sql: str, token=None) -> int:
    writer, reader = client.do_put(desc(proto.CommandStatementUpdate(query=sql)),
                                   pa.schema([]), opts(token))
    writer.done_writing()
    buf = reader.read()
    writer.close()
    return proto.parse(proto.DoPutUpdateResult, buf.to_pybytes()).record_count


def action(client, kind: str, body: bytes = b"", token=None) -> list[bytes]:
    return [r.body.to_pybytes() for r in client.do_action(flight.Action(kind, body),
                                                          opts(token))]


def prepare(client, sql: str, token=None) -> bytes:
    (raw,) = action(client, "CreatePreparedStatement", proto.pack(
        proto.ActionCreatePreparedStatementRequest(query=sql)), token)
    return proto.unpack(raw).prepared_statement_handle


def cancel(client, info: flight.FlightInfo, token=None) -> int:
    req = proto.CancelFlightInfoRequest(info=info.serialize())
    (raw,) = action(client, "CancelFlightInfo", req.SerializeToString(), token)
    return proto.parse(proto.CancelFlightInfoResult, raw).status


def adbc(uri: str, token: str | None = None, **db_kwargs):
    from adbc_driver_flightsql import dbapi

    if token:
        db_kwargs[TOKEN_HEADER] = f"Bearer {token}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dbapi.connect(uri, db_kwargs=db_kwargs or None)


def make_table(wh, name: str, batches: int = 4, rows: int = 1000):
    """A table of ``batches`` appends (so small files for OPTIMIZE)."""
    t = wh.create_table(name, pa.schema([("id", pa.int64()), ("v", pa.string())]))
    for b in range(batches):
        ids = list(range(b * rows, (b + 1) * rows))
        t.append(pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]}))
    return t

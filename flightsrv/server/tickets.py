"""Tickets: what GetFlightInfo hands out and DoGet redeems, signed by the server.

Contract:

- A ticket is ``Any(TicketStatementQuery{statement_handle})`` (the Flight SQL shape) whose
  handle is ``MAGIC | body | HMAC-SHA256(key, MAGIC | body)``. ``key`` is 32 random bytes
  per server (or injected: the workers of ``serve --workers N`` share one, derived from
  their parent's key), so a ticket is valid only on the server that issued it and only
  until it restarts.
- The body (JSON) binds the ticket to the principal that obtained it (``u``), to an expiry
  (``x``, ms since the epoch) and carries a random nonce (``n``), so two identical
  queries get distinct tickets and cancelling one never touches the other.
- ``Ticket.kind``: ``query`` (``sql`` + ``params``, run lazily by DoGet; redeemable until
  it expires; one row of parameters of plain scalar types is carried as JSON values with
  their Arrow type names, which read back to the very same batch, anything else as an
  Arrow IPC stream; with the versions of the tables GetFlightInfo described it over and
  a digest of the schema it announced), ``result`` (the id of a result kept server-side
  by ``results.ResultStore``, single use), ``count`` (an update already executed: an
  empty result), ``metadata`` (a packed metadata command).
- ``TicketCodec.open(raw, user)`` checks, in this order, and raises:
  framing or JSON wrong -> ``MalformedTicket`` (INVALID_ARGUMENT); signature wrong ->
  ``status.Unauthenticated`` (UNAUTHENTICATED); another principal's -> ``ForeignTicket``
  (PERMISSION_DENIED: the ticket is genuine, the caller is not its holder; we say so
  rather than NOT_FOUND because a signed ticket proves nothing new to its finder);
  expired -> ``status.NotFound`` (NOT_FOUND). Nothing of the body is trusted before the
  signature checks out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
from dataclasses import dataclass

import pyarrow as pa

from flightsrv import errors
from flightsrv.runtime import Runtime
from flightsrv.server import proto
from flightsrv.server.status import NotFound, Unauthenticated

MAGIC = b"FSQT2"
_SIG = 32
KINDS = {"q": "query", "r": "result", "c": "count", "m": "metadata"}
_CODES = {v: k for k, v in KINDS.items()}


#: the parameter types a ticket carries as JSON values (:func:`_plain_values`): each reads
#: back exactly (an integer as itself, a float by its shortest round-tripping repr)
_PLAIN_TYPES = {str(t): t for t in (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
    pa.uint64(), pa.float32(), pa.float64(), pa.bool_(), pa.string(), pa.large_string(),
    pa.null())}


def _plain_values(params: pa.RecordBatch) -> list | None:
    """``[[name, type, value], ...]`` of a one-row batch whose columns are all of
    :data:`_PLAIN_TYPES` (nullable, no metadata, finite floats), which
    ``pa.record_batch([pa.array([value], type)], names=...)`` rebuilds equal to it; None
    for any other batch (it travels as Arrow IPC). Encoding one scalar as IPC and reading
    it back cost more than the rest of the ticket."""
    if params.num_rows != 1 or params.schema.metadata:
        return None
    out = []
    for f, column in zip(params.schema, params.columns):
        name = str(f.type)
        if name not in _PLAIN_TYPES or not f.nullable or f.metadata:
            return None
        v = column[0].as_py()
        if isinstance(v, float) and not math.isfinite(v):
            return None
        out.append([f.name, name, v])
    return out


class MalformedTicket(errors.ConfigurationError):
    """Bytes that are not a ticket of this server's format."""


class ForeignTicket(errors.PermissionDenied):
    """A genuine ticket obtained by another principal."""


@dataclass(frozen=True)
class Ticket:
    kind: str
    user: str
    expires_ms: int
    nonce: str
    sql: str | None = None
    params: pa.RecordBatch | None = None
    result_id: str | None = None
    command: bytes | None = None  # packed metadata command
    #: a query's: the versions of the tables GetFlightInfo described it over (table ->
    #: version) and the digest of the schema it announced (:func:`schema_digest`), or None
    versions: dict[str, int] | None = None
    schema: str | None = None

    @property
    def digest(self) -> str:
        """A short stable id for logs and cancel bookkeeping."""
        return self.nonce


def schema_digest(schema: pa.Schema) -> str:
    """A short digest of ``schema`` (names, types, nullability, metadata: what a client
    compares a stream's schema with the announced one by)."""
    return hashlib.sha256(schema.serialize().to_pybytes()).hexdigest()[:16]


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def derive_key(key: bytes, label: bytes) -> bytes:
    """A key for one use (``label``) from a server's shared secret: the workers of ``serve
    --workers N`` derive their ticket and prepared-handle keys from the parent's."""
    return _mac(key, label)


def seal(key: bytes, magic: bytes, body: dict) -> bytes:
    """``magic | JSON(body) | HMAC-SHA256(key, magic | JSON(body))``: a ticket's handle, and
    a prepared statement handle behind ``--workers``."""
    data = magic + json.dumps(body, separators=(",", ":")).encode()
    return data + _mac(key, data)


def unseal(key: bytes, magic: bytes, raw: bytes) -> dict | None:
    """The body of what ``seal(key, magic, ...)`` made, or None: other framing, another
    key's signature, or not a JSON object."""
    if len(raw) <= len(magic) + _SIG or not raw.startswith(magic):
        return None
    data, sig = raw[:-_SIG], raw[-_SIG:]
    if not hmac.compare_digest(sig, _mac(key, data)):
        return None
    try:
        body = json.loads(data[len(magic):])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class TicketCodec:
    def __init__(self, runtime: Runtime, ttl_s: int, key: bytes | None = None):
        self._runtime = runtime
        self._ttl_ms = int(ttl_s * 1000)
        self._key = key if key is not None else os.urandom(32)

    def _sign(self, data: bytes) -> bytes:
        return _mac(self._key, data)

    def issue(self, kind: str, user: str, *, sql: str | None = None,
              params: pa.RecordBatch | None = None, result_id: str | None = None,
              command: bytes | None = None, ttl_ms: int | None = None,
              nonce: str | None = None, versions: dict[str, int] | None = None,
              schema: pa.Schema | None = None) -> bytes:
        """A packed Flight SQL ticket (the bytes of ``flight.Ticket``); ``nonce``: its id
        (a new one if None)."""
        body = {"k": _CODES[kind], "u": user,
                "n": nonce if nonce is not None else self._runtime.ids.new_id(),
                "x": self._runtime.clock.now_ms() + (ttl_ms if ttl_ms is not None
                                                     else self._ttl_ms)}
        if sql is not None:
            body["s"] = sql
        if params is not None and params.num_columns:
            values = _plain_values(params)
            if values is not None:
                body["v"] = values
            else:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, params.schema) as w:
                    w.write_batch(params)
                body["p"] = base64.b64encode(sink.getvalue().to_pybytes()).decode()
        if versions:
            body["w"] = versions
        if schema is not None:
            body["h"] = schema_digest(schema)
        if result_id is not None:
            body["r"] = result_id
        if command is not None:
            body["c"] = base64.b64encode(command).decode()
        return proto.pack(proto.TicketStatementQuery(
            statement_handle=seal(self._key, MAGIC, body)))

    def open(self, raw: bytes, user: str) -> Ticket:
        """The ticket in ``raw`` if ``user`` may redeem it now; see the module docstring."""
        ticket = self.verify(raw)
        if not hmac.compare_digest(ticket.user.encode(), user.encode()):
            raise ForeignTicket("ticket was issued to another principal", user=user)
        if ticket.expires_ms < self._runtime.clock.now_ms():
            raise NotFound("ticket expired; call GetFlightInfo again",
                           ticket=ticket.digest[:12])
        return ticket

    def verify(self, raw: bytes) -> Ticket:
        """The ticket, checked for framing and signature only (no principal, no expiry)."""
        try:
            msg = proto.unpack(raw)
        except proto.ProtocolError:
            raise MalformedTicket("ticket is not a Flight SQL ticket of this server",
                                  bytes=len(raw)) from None
        if not isinstance(msg, proto.TicketStatementQuery):
            raise MalformedTicket("ticket is not a TicketStatementQuery",
                                  type=proto.arrow_name(msg))
        handle = msg.statement_handle
        if len(handle) <= len(MAGIC) + _SIG or not handle.startswith(MAGIC):
            raise MalformedTicket("ticket was not issued by this server", bytes=len(handle))
        data, sig = handle[:-_SIG], handle[-_SIG:]
        if not hmac.compare_digest(sig, self._sign(data)):
            raise Unauthenticated("ticket signature does not match (forged, altered, or "
                                  "issued by another server or before a restart)")
        try:
            body = json.loads(data[len(MAGIC):])
            kind = KINDS[body["k"]]
            params = None
            if "v" in body:
                params = pa.record_batch(
                    [pa.array([v], _PLAIN_TYPES[t]) for _, t, v in body["v"]],
                    names=[str(n) for n, _, _ in body["v"]])
            elif "p" in body:
                reader = pa.ipc.open_stream(base64.b64decode(body["p"]))
                params = reader.read_next_batch()
            command = base64.b64decode(body["c"]) if "c" in body else None
            return Ticket(kind, str(body["u"]), int(body["x"]), str(body["n"]),
                          sql=body.get("s"), params=params, result_id=body.get("r"),
                          command=command,
                          versions={str(k): int(v) for k, v in body["w"].items()}
                          if "w" in body else None,
                          schema=str(body["h"]) if "h" in body else None)
        except (ValueError, KeyError, TypeError, pa.ArrowException, StopIteration):
            # signed by us, so only a server bug gets here; still a clean error
            raise MalformedTicket("ticket body is not readable") from None

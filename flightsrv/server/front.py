"""The TLS front of one worker (``flightsrv serve --workers N --tls-cert ...``): a gRPC server
on the public port that ends TLS and passes every Flight call, undecoded, to its own worker
and the answer back. Without TLS the workers sit behind relays instead (``relay.py``: bytes,
not calls, at a tenth of a front's CPU per statement).

Why it exists: Arrow Flight's gRPC server turns ``SO_REUSEPORT`` off, so two Flight servers
cannot share a port; grpcio's server turns it on (Linux). N fronts therefore share the public
port, the kernel hands each new *connection* to one of them, and each front forwards to one
worker (a complete ``FlightSqlServer`` on a private unix socket). A client connection thus
always reaches the same worker, so its tickets, prepared handles and session stay valid
without shared state (docs/ARCHITECTURE.md, "Using every core").

Contract:

- Only methods of ``arrow.flight.protocol.FlightService`` are forwarded; any other method is
  UNIMPLEMENTED. Messages are never decoded: Handshake, DoPut and DoExchange are forwarded
  as byte streams both ways, the methods that take one request as one request and a stream
  of answers (a unary answer is a stream of one message on the wire).
- The caller's metadata (``authorization``, cookies, Flight SQL headers) goes to the worker
  as sent, less gRPC's own headers; the worker's initial and trailing metadata (the bearer
  token a Handshake issues) and its status code and details come back as sent.
- ``x-flightsrv-peer`` is set by the front to the caller's own peer address (one the caller
  sent is dropped), so that the worker keys sessions by the client's connection and not by
  the front's one channel.
- The caller's deadline is the forwarded call's deadline; a caller that cancels (or goes
  away) cancels the forwarded call.
- While the worker is not reachable (starting, restarting), a call waits up to 5 s (within
  its deadline) for it, then fails UNAVAILABLE; the front tries to reach the worker again
  at most a second apart.
- TLS, when configured, ends here; the worker's socket is a private unix socket.
- At most ``max_calls`` calls are handled at once (threads), ``max_calls * 4`` are accepted
  (the rest wait for a thread); beyond that gRPC answers RESOURCE_EXHAUSTED.
- SIGTERM/SIGINT: stop accepting, let calls in progress finish for ``--drain-timeout``
  seconds, cancel the rest, exit 0.

Run as ``python -m flightsrv.server.front --listen HOST:PORT --worker unix:PATH``; it prints
``port N`` on stdout once bound (the real port for port 0).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures

from flightsrv.server.signals import StopFlag, follow_parent

SERVICE = "/arrow.flight.protocol.FlightService/"
PEER_HEADER = "x-flightsrv-peer"
# headers gRPC itself sets on each hop; forwarding them would duplicate or contradict them
_HOP_HEADERS = frozenset({"content-type", "user-agent", "te", "grpc-timeout", "grpc-encoding",
                          "grpc-accept-encoding", "grpc-status", "grpc-message",
                          "grpc-status-details-bin", PEER_HEADER})
# methods whose caller sends one message: forwarded as unary-stream, which spares grpcio's
# client a thread per call to feed the request stream (Handshake, DoPut, DoExchange stream)
_ONE_REQUEST = frozenset({"GetFlightInfo", "PollFlightInfo", "GetSchema", "DoGet", "DoAction",
                          "ListFlights", "ListActions"})
_NO_DEADLINE_S = 1e7  # grpcio's time_remaining() for a call without a deadline is huge
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# a restarted worker is reached within a second of binding its socket (gRPC's default
# reconnect back-off grows to 120 s while the worker is down)
_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
              ("grpc.max_reconnect_backoff_ms", 1000)]


def forwardable(metadata) -> list[tuple[str, str | bytes]]:
    """``metadata`` less pseudo-headers and the headers gRPC sets per hop."""
    return [(k, v) for k, v in (metadata or ())
            if not k.startswith(":") and k.lower() not in _HOP_HEADERS]


#: how long a call waits for the worker's socket to accept (a worker starting or restarting)
WORKER_WAIT_S = 5.0


class _Reachable:
    """Whether the channel to the worker is connected, as gRPC reports it (a callback,
    not a per-call probe)."""

    def __init__(self, channel, grpc):
        self._ready = threading.Event()
        c = grpc.ChannelConnectivity
        # an idle channel connects on the next call; connecting keeps the last answer
        self._up, self._down = (c.READY, c.IDLE), (c.TRANSIENT_FAILURE, c.SHUTDOWN)
        self._channel = channel
        channel.subscribe(self._changed, try_to_connect=True)

    def close(self) -> None:
        """Unsubscribe (grpcio's channel finalizer can hang at exit on a subscription)."""
        self._channel.unsubscribe(self._changed)

    def _changed(self, state) -> None:
        if state in self._up:
            self._ready.set()
        elif state in self._down:
            self._ready.clear()

    def wait(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)


class Forwarder:
    """A grpcio generic handler forwarding FlightService calls to ``channel``."""

    def __init__(self, channel):
        import grpc

        self._grpc = grpc
        self._channel = channel
        self._reachable = _Reachable(channel, grpc)

    def close(self) -> None:
        self._reachable.close()
        self._channel.close()

    def service(self, details):
        method = details.method
        if not method.startswith(SERVICE):
            return None  # UNIMPLEMENTED
        if method[len(SERVICE):] in _ONE_REQUEST:
            return self._grpc.unary_stream_rpc_method_handler(
                lambda request, context: self._forward(
                    self._channel.unary_stream(method), request, context))
        return self._grpc.stream_stream_rpc_method_handler(
            lambda requests, context: self._forward(
                self._channel.stream_stream(method), requests, context))

    def _forward(self, stub, request, context):
        grpc = self._grpc
        metadata = forwardable(context.invocation_metadata())
        metadata.append((PEER_HEADER, context.peer()))
        remaining = context.time_remaining()
        timeout = None if remaining is None or remaining > _NO_DEADLINE_S else remaining
        # a worker still starting (the server's start line follows every worker's ready
        # file, but the channel may be in its reconnect back-off) or restarting: wait a
        # little for it within the call's deadline, then the call waits in gRPC's connect
        self._reachable.wait(min(WORKER_WAIT_S, timeout if timeout is not None else 1e9))
        call = stub(request, metadata=metadata, timeout=timeout, wait_for_ready=False)
        context.add_callback(call.cancel)
        try:
            context.send_initial_metadata(forwardable(call.initial_metadata()))
            yield from call
            context.set_trailing_metadata(forwardable(call.trailing_metadata()))
        except grpc.RpcError as exc:
            context.set_trailing_metadata(forwardable(exc.trailing_metadata()))
            context.set_code(exc.code())
            context.set_details(exc.details() or "")


def start(listen: str, worker: str, *, tls: tuple[bytes, bytes] | None = None,
          max_calls: int = 128):
    """Start a front on ``listen`` (``host:port``) forwarding to ``worker`` (a grpcio target,
    ``unix:PATH``). Returns ``(server, port)``; stop it with ``server.stop(grace)``, then
    ``server.forwarder.close()``."""
    import grpc

    channel = grpc.insecure_channel(worker, options=_UNLIMITED + _RECONNECT)
    forwarder = Forwarder(channel)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_calls,
                                                    thread_name_prefix="front"),
                         handlers=[forwarder],
                         maximum_concurrent_rpcs=max_calls * 4,
                         options=_UNLIMITED + [("grpc.so_reuseport", 1)])
    if tls is not None:
        cert, key = tls
        port = server.add_secure_port(listen, grpc.ssl_server_credentials([(key, cert)]))
    else:
        port = server.add_insecure_port(listen)
    server.start()
    server.forwarder = forwarder  # closed after the server stops (main)
    return server, port


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flightsrv.server.front")
    p.add_argument("--listen", required=True, help="HOST:PORT to share (SO_REUSEPORT)")
    p.add_argument("--worker", required=True, help="grpcio target of the worker (unix:PATH)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--max-calls", type=int, default=128)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    tls = None
    if args.tls_cert:
        with open(args.tls_cert, "rb") as c, open(args.tls_key, "rb") as k:
            tls = (c.read(), k.read())
    stop = StopFlag()  # set from a signal handler: never a threading.Event (signals.py)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    follow_parent()  # SIGTERM (so: drain) if the parent dies
    try:
        server, port = start(args.listen, args.worker, tls=tls, max_calls=args.max_calls)
    except RuntimeError as exc:  # grpcio: "Failed to bind to address ..."
        sys.stderr.write(f"flightsrv: front cannot listen on {args.listen}: {exc}\n")
        return 2
    sys.stdout.write(f"port {port}\n")
    sys.stdout.flush()
    while not stop.wait(0.5):
        pass
    server.stop(args.drain_timeout).wait(args.drain_timeout + 5)
    server.forwarder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The relays of ``flightsrv serve --workers N`` without TLS: the public port's TCP
connections passed, byte for byte, to the workers' private unix sockets.

Why it exists: Arrow Flight's gRPC server turns ``SO_REUSEPORT`` off, so two Flight servers
cannot share a port. N relays share the public port instead, the kernel hands each new
*connection* to one of them, and the relay joins it to a new connection to one worker (a
complete ``FlightSqlServer`` on a unix socket in a 0700 directory): the one with the fewest
relayed connections (``Loads``), since the kernel's choice of relay is a hash that spreads
a few connections unevenly. A client connection thus always reaches the same worker, so
its tickets, prepared handles and session stay valid without shared state
(docs/ARCHITECTURE.md, "Using every core"). Nothing is decoded: gRPC's
HTTP/2 stream runs end to end between the client and the worker, so a relay costs a few
system calls per TCP segment instead of a gRPC server and client per call (``front.py``,
which the workers still use when TLS is configured, since TLS ends in the front).

Contract:

- Each relayed connection's unix socket is bound, before it connects, to the abstract name
  ``flightsrv/<tag>/<seq>/<peer>``: ``peer`` is the client's address as gRPC spells a peer
  (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``), ``seq`` makes the name unique. The worker
  reads it from its own side of the connection (``context.peer()``: ``unix-abstract:...``,
  :func:`client_peer`), so sessions are keyed by the client's connection and logs name the
  client; a client cannot choose it (no header is trusted). Only processes of the server's
  user can connect to the worker's socket at all. A peer too long for a socket name (an
  IPv6 address with a long scope) is left out: the connection is still its own session,
  named by the sequence number.
- ``--worker`` is repeated, once per worker in order; with ``--loads`` (a file of N x N
  int32, ``Loads.create``) and ``--index i`` each new connection goes to the worker with
  the fewest connections from all relays (relay ``i``'s own worker first among equals);
  without it, to the first. A worker that refuses (down, restarting) is skipped; with all
  down a new connection is closed at once (the client sees UNAVAILABLE and reconnects);
  an open one ends when its worker's end closes.
- At most ``max_connections`` connections are relayed at once; one more is closed at once.
  At most ``CHUNK`` bytes wait per direction of a connection: a side that does not read
  stops the relay reading the other side (TCP's own flow control then holds the sender).
- An unexpected error on one connection closes that connection (one JSON log line on
  stderr, ``event: relay_error``); the relay goes on.
- SIGTERM/SIGINT: drain for at most ``--drain-timeout`` seconds, then exit 0: open
  connections keep relaying and new ones are still relayed while a worker accepts them
  (the workers drain too: a new call gets UNAVAILABLE "shutting down", as from one
  server); the relay exits once it relays nothing and no worker accepts.

Run as ``python -m flightsrv.server.relay --listen HOST:PORT --worker PATH [--worker PATH
...] [--index I --loads PATH] --tag TAG``; it
prints ``port N`` on stdout once bound (the real port for port 0).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import selectors
import signal
import socket
import sys
import time

from flightsrv.server.signals import follow_parent

log = logging.getLogger("flightsrv.server.relay")

PREFIX = "flightsrv/"
CHUNK = 256 * 1024
_MAX_NAME = 107  # sun_path holds 108 bytes, the first of an abstract name is NUL
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


def grpc_peer(addr) -> str:
    """A TCP peer address as gRPC names it in ``context.peer()``."""
    host, port = addr[0], addr[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def client_peer(peer: str) -> str | None:
    """The client's peer address in a worker's ``context.peer()`` of a relayed connection
    (``unix-abstract:flightsrv/<tag>/<seq>/<peer>``), else None."""
    head = "unix-abstract:" + PREFIX
    if not peer.startswith(head):
        return None
    parts = peer[len(head):].split("/", 2)
    return parts[2] if len(parts) == 3 and parts[2] else None


class _Pipe:
    """One direction of a relayed connection: bytes read from ``src`` wait in ``pending``
    until ``dst`` takes them."""

    __slots__ = ("src", "dst", "pending", "eof", "shut")

    def __init__(self, src: socket.socket, dst: socket.socket):
        self.src, self.dst = src, dst
        self.pending: bytes | memoryview = b""
        self.eof = False  # src said EOF
        self.shut = False  # EOF passed on to dst


class _Conn:
    __slots__ = ("client", "worker", "up", "down", "target")

    def __init__(self, client: socket.socket, worker: socket.socket, target: int):
        self.client, self.worker = client, worker
        self.target = target  # which worker
        self.up = _Pipe(client, worker)  # client -> worker
        self.down = _Pipe(worker, client)  # worker -> client


class Loads:
    """How many connections each relay of a server holds to each worker: an N x N table of
    int32 in a file every relay maps (``path``, made by :meth:`create`). Row ``row`` is this
    relay's and only it writes there (so no lock; another relay's row may be read while it
    changes, which only makes a choice slightly stale). A relay (re)starting zeroes its row:
    its earlier connections died with it."""

    def __init__(self, path: str, n: int, row: int):
        import mmap

        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, n * n * 4)
        finally:
            os.close(fd)
        self._a = memoryview(self._mm).cast("i")
        self.n, self.row = n, row
        for w in range(n):
            self._a[row * n + w] = 0

    @staticmethod
    def create(path: str, n: int) -> None:
        with open(path, "wb") as f:
            f.write(bytes(n * n * 4))

    def add(self, worker: int, delta: int) -> None:
        self._a[self.row * self.n + worker] += delta

    def order(self, draining: bool = False) -> list[int]:
        """The workers, fewest relayed connections first (this relay's own first among
        equals); ``draining`` (the server is stopping): most first, since a worker with
        nothing to finish exits first and one still finishing calls answers new ones
        UNAVAILABLE "shutting down" until it is done."""
        n, a = self.n, self._a
        totals = [sum(a[r * n + w] for r in range(n)) for w in range(n)]
        sign = -1 if draining else 1
        return sorted(range(n), key=lambda w: (sign * totals[w], w != self.row, w))


class Relay:
    """A selector loop relaying every accepted connection to one of ``workers`` (unix
    sockets): the one with the fewest connections from all relays (``loads``), or the only
    one."""

    def __init__(self, listener: socket.socket, workers: str | list[str], tag: str,
                 max_connections: int, loads: Loads | None = None):
        self.listener = listener
        self.workers = [workers] if isinstance(workers, str) else list(workers)
        self.loads = loads
        self.tag = tag
        self.max_connections = max_connections
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, _Conn] = {}  # by client fd
        self._seq = 0
        self._want: dict[socket.socket, int] = {}  # registered events per socket
        self._paused_until: float | None = None  # accepting paused (out of descriptors)
        self._stop = [False]  # run()'s stop flag: set, the server drains
        self.sel.register(listener, _READ, None)

    # -- events ---------------------------------------------------------------------------

    def _set(self, sock: socket.socket, events: int, conn: _Conn) -> None:
        had = self._want.get(sock, 0)
        if events == had:
            return
        if not had:
            self.sel.register(sock, events, conn)
        elif not events:
            self.sel.unregister(sock)
        else:
            self.sel.modify(sock, events, conn)
        if events:
            self._want[sock] = events
        else:
            self._want.pop(sock, None)

    def _update(self, conn: _Conn) -> None:
        """Register what each socket waits for: readable while the other direction's bytes
        went out and it has not said EOF; writable while bytes wait for it."""
        for sock, reading, writing in ((conn.client, conn.up, conn.down),
                                       (conn.worker, conn.down, conn.up)):
            ev = 0
            if not reading.eof and not reading.pending:
                ev |= _READ
            if writing.pending:
                ev |= _WRITE
            self._set(sock, ev, conn)

    # -- accepting --------------------------------------------------------------------------

    def accept(self) -> None:
        try:
            client, addr = self.listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # out of descriptors or memory: stop accepting for a moment
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self.sel.unregister(self.listener)
                self._paused_until = time.monotonic() + 0.1
            return
        if len(self.conns) >= self.max_connections:
            client.close()
            return
        order = self.loads.order(self._stop[0]) if self.loads is not None \
            else range(len(self.workers))
        for target in order:
            worker = self._connect(target, addr)
            if worker is not None:
                break
        else:
            client.close()  # every worker is down: the client reconnects
            return
        for s in (client, worker):
            s.setblocking(False)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(client, worker, target)
        self.conns[client.fileno()] = conn
        if self.loads is not None:
            self.loads.add(target, 1)
        self._update(conn)

    def _connect(self, target: int, addr) -> socket.socket | None:
        """A new connection to worker ``target`` named for the client at ``addr``, or None
        when that worker is down (restarting)."""
        worker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._seq += 1
            name = f"{PREFIX}{self.tag}/{self._seq}/{grpc_peer(addr)}".encode()
            if len(name) > _MAX_NAME:  # a long IPv6 scope: named by the sequence alone
                name = f"{PREFIX}{self.tag}/{self._seq}/".encode()
            worker.bind(b"\0" + name)
            worker.setblocking(False)
            worker.connect(self.workers[target])  # a unix socket: done at once, or refused
        except OSError:
            worker.close()
            return None
        return worker

    # -- relaying ---------------------------------------------------------------------------

    def _read(self, pipe: _Pipe) -> None:
        try:
            data = pipe.src.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""  # reset: treat as EOF, the other side gets it passed on
        if not data:
            pipe.eof = True
            return
        pipe.pending = memoryview(data)  # a partial send keeps the rest without a copy
        self._write(pipe)

    def _write(self, pipe: _Pipe) -> None:
        try:
            n = pipe.dst.send(pipe.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the other side is gone: nothing more can be delivered
            pipe.pending = b""
            pipe.eof = True
            return
        pipe.pending = pipe.pending[n:]

    def _finish(self, pipe: _Pipe) -> None:
        if pipe.eof and not pipe.pending and not pipe.shut:
            pipe.shut = True
            try:
                pipe.dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _close(self, conn: _Conn) -> None:
        for s in (conn.client, conn.worker):
            self._set(s, 0, conn)
        if self.conns.pop(conn.client.fileno(), None) is not None and self.loads is not None:
            self.loads.add(conn.target, -1)
        conn.client.close()
        conn.worker.close()

    def handle(self, conn: _Conn, sock: socket.socket, events: int) -> None:
        reading = conn.up if sock is conn.client else conn.down
        writing = conn.down if sock is conn.client else conn.up
        if events & _WRITE and writing.pending:
            self._write(writing)
        if events & _READ and not reading.pending and not reading.eof:
            self._read(reading)
        for pipe in (conn.up, conn.down):
            self._finish(pipe)
        if conn.up.shut and conn.down.shut:
            self._close(conn)
        else:
            self._update(conn)

    def run(self, stop: list[bool], drain_timeout_s: float) -> None:
        self._stop = stop
        deadline = None
        while True:
            if stop[0] and deadline is None:
                # draining: open connections go on, and new ones still reach the workers,
                # which drain too and answer new calls UNAVAILABLE "shutting down", as
                # one server does, until they are gone
                deadline = time.monotonic() + drain_timeout_s
            if self._paused_until is not None and time.monotonic() >= self._paused_until:
                self._paused_until = None
                self.sel.register(self.listener, _READ, None)
            if deadline is not None and (time.monotonic() >= deadline or (
                    not self.conns and not self._any_worker())):
                break
            for key, events in self.sel.select(0.1 if self._paused_until else 0.5):
                if key.data is None:
                    self.accept()
                    continue
                conn = key.data
                if conn.client.fileno() not in self.conns:
                    continue  # closed by an earlier event of this round
                try:
                    self.handle(conn, key.fileobj, events)
                except Exception as exc:  # noqa: BLE001 - one connection, not the relay
                    log.error("relayed connection failed", extra={"fields": {
                        "event": "relay_error", "error_class": type(exc).__name__,
                        "error": str(exc)}})
                    self._close(conn)
        self.listener.close()
        for conn in list(self.conns.values()):
            self._close(conn)

    def _any_worker(self) -> bool:
        """Whether some worker still accepts connections (draining, not yet gone)."""
        for path in self.workers:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                return True
            except OSError:
                continue
            finally:
                probe.close()
        return False


def connection_limit(wanted: int) -> int:
    """``wanted``, or fewer if this process cannot open two descriptors for each (its soft
    limit is raised to the hard one first)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, (soft - 32) // 2))


def listen(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` with ``SO_REUSEPORT``."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(addr)
        s.listen(backlog)
    except BaseException:
        s.close()
        raise
    s.setblocking(False)
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flightsrv.server.relay")
    p.add_argument("--listen", required=True, help="HOST:PORT to share (SO_REUSEPORT)")
    p.add_argument("--worker", required=True, action="append",
                   help="a worker's unix socket path (repeated: every worker, in order)")
    p.add_argument("--index", type=int, default=0,
                   help="this relay's row in --loads (and its worker among equals)")
    p.add_argument("--loads", default=None,
                   help="the file of connections per relay and worker (Loads.create)")
    p.add_argument("--tag", required=True, help="names this server's relayed connections")
    p.add_argument("--max-connections", type=int, default=4096)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    from flightsrv.server.logs import configure_json_logging

    configure_json_logging(logging.WARNING)  # the server's JSON lines on stderr
    host, _, port = args.listen.rpartition(":")
    host = host.strip("[]")
    stop = [False]
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.__setitem__(0, True))
    follow_parent()  # SIGTERM (so: drain) if the parent dies
    try:
        listener = listen(host, int(port))
    except OSError as exc:
        sys.stderr.write(f"flightsrv: relay cannot listen on {args.listen}: {exc}\n")
        return 2
    sys.stdout.write(f"port {listener.getsockname()[1]}\n")
    sys.stdout.flush()
    loads = Loads(args.loads, len(args.worker), args.index) if args.loads else None
    Relay(listener, args.worker, args.tag, connection_limit(args.max_connections),
          loads).run(stop, args.drain_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

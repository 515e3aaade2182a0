"""``server/relay.py``: the byte relay between the public port and one worker's unix socket
(``flightsrv serve --workers N`` without TLS), driven in process over real sockets: a TCP
client on one side, a unix-socket echo server standing in for the worker on the other."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from flightsrv.server.relay import Relay, client_peer, connection_limit, grpc_peer, listen


class Echo:
    """A unix-socket server that sends back what it reads and records each connection's
    peer name (what gRPC reports as ``context.peer()``)."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.peers: list[bytes] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.peers.append(c.getpeername())
            self.conns.append(c)
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    @staticmethod
    def _echo(c):
        with c:
            while data := c.recv(65536):
                c.sendall(data)


@pytest.fixture
def relay(tmp_path):
    """(relay, its port, the worker socket path, stop flag); the loop runs in a thread."""
    path = str(tmp_path / "w.sock")
    lst = listen("127.0.0.1", 0)
    r = Relay(lst, path, "tag.0", max_connections=2)
    stop = [False]
    t = threading.Thread(target=r.run, args=(stop, 5.0), daemon=True)
    t.start()
    yield r, lst.getsockname()[1], path, stop
    stop[0] = True
    t.join(10)
    assert not t.is_alive()


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _recv_exactly(c: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = c.recv(min(1 << 20, n - len(buf)))
        assert chunk, "connection closed early"
        buf += chunk
    return bytes(buf)


def test_bytes_pass_both_ways_and_the_worker_learns_the_clients_address(relay):
    r, port, path, _ = relay
    echo = Echo(path)
    payload = os.urandom(5 << 20)  # larger than any socket buffer: the relay must wait
    with socket.create_connection(("127.0.0.1", port)) as c:
        sender = threading.Thread(target=c.sendall, args=(payload,))
        sender.start()
        assert _recv_exactly(c, len(payload)) == payload
        sender.join()
        name = echo.peers[0]
        assert name.startswith(b"\0flightsrv/tag.0/1/")
        # what the worker reads back from gRPC's peer string: the client's own address
        assert client_peer("unix-abstract:" + name[1:].decode()) == \
            grpc_peer(c.getsockname()) == f"ipv4:127.0.0.1:{c.getsockname()[1]}"
    _wait(lambda: not r.conns)  # the client closed: both ends closed, nothing kept


def test_a_closed_worker_end_closes_the_client(relay):
    r, port, path, _ = relay
    echo = Echo(path)
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"x")
        assert c.recv(1) == b"x"
        echo.conns[0].shutdown(socket.SHUT_RDWR)
        c.settimeout(10)
        assert c.recv(1) == b""  # EOF passed on
    _wait(lambda: not r.conns)


def test_without_a_worker_a_connection_is_closed_at_once(relay):
    r, port, _, _ = relay  # nothing listens on the worker's path
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.settimeout(10)
        assert c.recv(1) == b""
    assert not r.conns


def test_connections_beyond_the_limit_are_closed(relay):
    r, port, path, _ = relay
    Echo(path)
    kept = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        for c in kept:
            c.sendall(b"y")
            assert c.recv(1) == b"y"
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(10)
            assert extra.recv(1) == b""
        assert len(r.conns) == 2
    finally:
        for c in kept:
            c.close()
    _wait(lambda: not r.conns)


def test_stop_drains_then_returns_once_the_worker_is_gone(tmp_path):
    path = str(tmp_path / "w.sock")
    echo = Echo(path)
    lst = listen("127.0.0.1", 0)
    port = lst.getsockname()[1]
    r = Relay(lst, path, "t", max_connections=8)
    stop = [False]
    t = threading.Thread(target=r.run, args=(stop, 30.0), daemon=True)
    t.start()
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(b"a")
    assert c.recv(1) == b"a"
    stop[0] = True
    time.sleep(0.7)  # draining: the open connection still relays, and while the worker
    c.sendall(b"b")  # accepts, so does a new one (the worker says it is shutting down)
    assert c.recv(1) == b"b"
    with socket.create_connection(("127.0.0.1", port), timeout=2) as d:
        d.sendall(b"c")
        assert d.recv(1) == b"c"
    echo.sock.close()  # the worker is gone: new connections are refused
    c.close()
    t.join(10)
    assert not t.is_alive()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).recv(1)


def test_peer_names():
    assert grpc_peer(("10.0.0.1", 5)) == "ipv4:10.0.0.1:5"
    assert grpc_peer(("::1", 7, 0, 0)) == "ipv6:[::1]:7"
    assert client_peer("unix-abstract:flightsrv/ab.1/9/ipv6:[::1]:7") == "ipv6:[::1]:7"
    for other in ("unix:", "unix:/tmp/w.sock", "ipv4:1.2.3.4:5",
                  "unix-abstract:other/ab/1/ipv4:1.2.3.4:5", "unix-abstract:flightsrv/ab/1"):
        assert client_peer(other) is None
    assert 1 <= connection_limit(10) <= 10


def test_a_peer_too_long_for_a_socket_name_is_left_out(relay, monkeypatch):
    """An address that does not fit an abstract socket name (108 bytes; a long IPv6 scope)
    still gets its own connection, named by the sequence number alone."""
    import flightsrv.server.relay as relay_mod

    r, port, path, _ = relay
    echo = Echo(path)
    monkeypatch.setattr(relay_mod, "grpc_peer", lambda addr: "ipv6:[" + "f" * 120 + "]:1")
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"z")
        assert c.recv(1) == b"z"
        assert echo.peers[0] == b"\0flightsrv/tag.0/1/"
        assert client_peer("unix-abstract:" + echo.peers[0][1:].decode()) is None


def test_loads_send_each_connection_to_the_least_loaded_worker(tmp_path):
    """Relays share a table of their connections per worker: the next connection goes to
    the worker with the fewest from all relays (the relay's own first among equals), and
    a restarted relay starts its row from zero (its connections died with it)."""
    from flightsrv.server.relay import Loads

    path = str(tmp_path / "loads")
    Loads.create(path, 3)
    r0, r1 = Loads(path, 3, 0), Loads(path, 3, 1)
    assert r0.order() == [0, 1, 2] and r1.order() == [1, 0, 2]
    r0.add(0, 1)
    assert r1.order() == [1, 2, 0]
    r1.add(1, 2)
    r0.add(2, 1)
    assert r0.order() == [0, 2, 1]  # 1, 1, 2 connections: its own among the two equal
    r0.add(0, -1)
    assert r0.order() == [0, 2, 1]  # 0, 2, 1
    Loads(path, 3, 1)  # relay 1 restarted: 0, 0, 1
    assert r0.order() == [0, 1, 2] and r1.order() == [1, 0, 2]
    # draining, the busiest first: a worker with calls to finish is up the longest
    assert r0.order(draining=True) == [2, 0, 1]

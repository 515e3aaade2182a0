"""Per-principal slots shared by the worker processes of ``flightsrv serve --workers N``.

One server's limits on statements in flight (``--max-concurrent-queries``, with its queue
``--max-queued-queries``) and on open DoPut streams (``--max-open-puts``) hold for the
whole server, whichever worker a connection reaches: the parent process keeps the slots
(``SlotBroker``) and each worker *leases* them (``SharedConcurrency``, the same interface
as ``limits.Concurrency``), over one unix socket per worker in the server's private 0700
directory. So do the counts of open prepared statements and sessions
(``--max-prepared-statements``, ``--max-sessions``): *holds* (``SharedHolds``).

Contract:

- ``SlotBroker(path, pools)``: ``pools`` maps a pool name (``queries``, ``puts``,
  ``logins``: password checks, one key ``*`` for the whole server) to its
  (limit, max_queued). ``start()`` listens on ``path`` and serves in a thread; ``stop()``
  closes it. Each principal's slots and FIFO queue are one ``limits.SlotTable`` per pool:
  a slot is leased to one worker at a time, the slots leased to all workers never exceed
  the limit, a request beyond it waits in the principal's queue (more than ``max_queued``
  waiting is refused), and a returned slot goes to the oldest waiter, on whichever worker.
  A worker whose connection closes (it exited or was killed) returns every slot it leased
  and leaves every queue it waited in.
- A worker keeps a slot it leased when its statement ends, and the next statement of the
  same principal on that worker takes it without a message (a point query takes two or
  three slots one after the other; each a round trip to the parent cost more than the
  statement's own work). When a request of that principal has to wait, the broker
  *recalls*: every worker holding its slots returns the idle ones at once and every
  other one as its statement ends, until that principal's queue is empty again (then the
  broker says so and leases are kept again). While a recall is on its way a worker may
  reuse an idle slot of its own before an older waiter elsewhere gets one: FIFO across
  workers holds up to that one message's delay.
- ``BrokerLink(path)``: a worker's connection (one per process, shared by its pools; a
  thread reads the broker's messages). ``SharedConcurrency(link, pool, limit, max_queued,
  ...)``: ``acquire(user, deadline, gone)`` takes a leased slot or asks the broker and
  waits for its grant with the same deadline, cancellation and errors as ``Concurrency``;
  ``release(user)``; ``count()`` and ``queued()`` are this worker's own (worker 0's
  ``/metrics`` sums them over the workers). A request given up while its grant is on the way returns
  that slot at once.
- ``SlotBroker(..., holds={pool: limit})``: pools without a queue, for entries that live
  in one worker (``prepared``, ``sessions``): a hold is granted or refused at once and
  goes back as soon as its entry goes (never kept idle). A request that finds its
  principal's count full makes the broker ask every other worker holding some of that
  principal's holds to *sweep* (drop expired entries and sessions of closed connections,
  giving their holds back), and decides when all have answered or after ``SWEEP_WAIT_S``.
  ``SharedHolds(link, pool)`` is the worker's side, for ``limits.PerPrincipal(shared=...)``
  (which attaches itself as the sweeper); the sweep runs on the link's own thread.
- If the broker cannot be reached (the parent is gone), a worker falls back to its own
  ``Concurrency`` with the same limits and logs ``slot_broker_lost`` once.
- Messages are JSON lines of at most ``MAX_LINE`` bytes. Worker -> broker: ``{"a": id,
  "p": pool, "u": user}`` (lease one more), ``{"r": pool, "u": user, "n": k}`` (return
  k), ``{"x": id}`` (give a request up). Broker -> worker: ``{"g": id, "c": 0|1}``
  (granted; ``c``: the principal still has waiters, so return slots as they end),
  ``{"f": id}`` (its queue is full), ``{"x": id}`` (the give-up was read: no grant follows
  it), ``{"c": pool, "u": user}`` (recall), ``{"k": pool, "u": user}`` (keep leases
  again), ``{"s": pool, "u": user, "i": id}`` (sweep), answered by the worker's
  ``{"sd": id}`` after its returns. Notices: ``{"b": kind, "u": user, "v": value, "i": id}``
  (worker -> broker: tell every other worker), forwarded as ``{"n": kind, "u": user, "v":
  value, "i": id}`` and answered by each ``{"nd": id}`` once handled; the sender gets
  ``{"bd": id, "ok": 1}`` when all have answered (``"ok": 0`` after ``SWEEP_WAIT_S``).
  A broker closes a connection that sends anything else.
- Notices (``BrokerLink.notify(kind, user, value)``, handled by what ``on_notice(kind,
  fn)`` registered, on the link's own thread) carry what one server does to all of a
  principal's calls and entries whichever worker holds them: ``cancel`` (a ticket's nonce:
  CancelFlightInfo reaching another worker than the stream's), ``close`` (a prepared
  handle's digest: closed on some worker, so closed on every one) and
  ``login`` (a basic login checked: empty when it failed, else the verified credential's
  HMAC), so that the back-off of failed logins is the whole server's.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import queue
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

from flightsrv.server.limits import FULL, GRANTED, QUEUED, Concurrency, SlotTable

log = logging.getLogger("flightsrv.server")

#: the longest message either side sends (a user name is the only free text)
MAX_LINE = 16 << 10
#: a worker gives up on a broker that has not taken its message for this long
SEND_TIMEOUT_S = 5
#: how long a hold request waits for the other workers' sweeps before it is decided
SWEEP_WAIT_S = 2.0
#: logins waiting for a password check (pool ``logins``, the whole server's; one process
#: waits on its semaphore): each waiter holds a gRPC thread for at most ``login_wait_s``
LOGINS_QUEUED = 256


def _line(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


class _Peer:
    """One worker's connection, as the broker sees it."""

    __slots__ = ("sock", "inbuf", "outbuf", "held", "waiting")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.held: Counter = Counter()  # (pool, user) -> slots leased to this worker
        self.waiting: dict[int, tuple[str, str]] = {}  # request id -> (pool, user)


class _Sweep:
    """A hold request found its principal's count full: the workers holding some were
    asked to drop their expired and dead entries; it is answered once all have said so.
    Also a notice on its way to the other workers (``key`` is then None)."""

    __slots__ = ("peer", "rid", "key", "left", "until")

    def __init__(self, peer: _Peer, rid: int, key: tuple[str, str] | None, left: set,
                 until: float):
        self.peer, self.rid, self.key, self.left, self.until = peer, rid, key, left, until


class SlotBroker:
    def __init__(self, path: str, pools: dict[str, tuple[int, int]],
                 holds: dict[str, int] | None = None):
        self.path = path
        self._pools = {name: SlotTable(limit, queued) for name, (limit, queued)
                       in pools.items()}
        # counts without a queue: a request is granted or refused at once (after a sweep)
        for name, limit in (holds or {}).items():
            self._pools[name] = SlotTable(limit, 0)
        self._holds = set(holds or ())
        self._sweeps: dict[int, _Sweep] = {}
        self._sweep_ids = itertools.count(1)
        self._peers: set[_Peer] = set()
        #: (pool, user) with waiters -> the workers told to return their slots
        self._recalled: dict[tuple[str, str], set[_Peer]] = {}
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="slot-broker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(5)

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                timeout = SWEEP_WAIT_S / 2 if self._sweeps else None
                for key, events in self._sel.select(timeout):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:
                        self._io(key.data, events)
                now = time.monotonic()
                for sid, sweep in list(self._sweeps.items()):
                    if now >= sweep.until:  # a worker that does not answer: decide now
                        self._end_sweep(sid)
        finally:
            for key in list(self._sel.get_map().values()):
                key.fileobj.close()
            self._sel.close()
            self._wake_w.close()

    def _accept(self) -> bool:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:  # EMFILE and the like: the worker retries its connect
            log.warning("slot broker could not accept", extra={"fields": {
                "event": "slot_broker_error", "error": exc.strerror}})
            return False
        sock.setblocking(False)
        peer = _Peer(sock)
        self._peers.add(peer)
        self._sel.register(sock, selectors.EVENT_READ, peer)
        return True

    def _accept_waiting(self) -> None:
        """Accept the connections waiting in the listener's backlog now: a worker whose
        connect returned before a notice was sent is one of those the notice reaches."""
        for _ in range(64):  # the backlog's length
            if not self._accept():
                return

    def _io(self, peer: _Peer, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._flush(peer)
            if events & selectors.EVENT_READ:
                data = peer.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                peer.inbuf += data
                while True:
                    end = peer.inbuf.find(b"\n")
                    if end < 0:
                        if len(peer.inbuf) > MAX_LINE:
                            raise ValueError("message too long")
                        break
                    raw = bytes(peer.inbuf[:end])
                    del peer.inbuf[: end + 1]
                    self._handle(peer, json.loads(raw))
                self._flush(peer)
        except (BlockingIOError, InterruptedError):
            pass
        except Exception as exc:  # noqa: BLE001 - one worker's connection, never the loop
            if not isinstance(exc, ConnectionError):
                log.warning("slot broker dropped a worker's connection", extra={"fields": {
                    "event": "slot_broker_error", "error": f"{type(exc).__name__}: {exc}"}})
            self._drop(peer)

    def _handle(self, peer: _Peer, msg: dict) -> None:
        if "a" in msg:
            rid, key = int(msg["a"]), (str(msg["p"]), str(msg["u"]))
            taken = self._pools[key[0]].take(key[1], (peer, rid))
            if taken == GRANTED:  # nobody waits: no recall is on
                peer.held[key] += 1
                self._send(peer, {"g": rid, "c": 0})
            elif taken == FULL and key[0] in self._holds:
                self._sweep(peer, rid, key)
            elif taken == FULL:
                self._send(peer, {"f": rid})
            else:
                assert taken == QUEUED
                peer.waiting[rid] = key
                if key not in self._recalled:
                    self._recall(key)
        elif "r" in msg:
            key, n = (str(msg["r"]), str(msg["u"])), int(msg.get("n", 1))
            if n < 1 or peer.held[key] < n:
                raise ValueError(f"return of a slot not leased ({key[0]})")
            for _ in range(n):
                self._give_back(peer, key)
        elif "sd" in msg or "nd" in msg:
            sid = int(msg.get("sd") or msg.get("nd"))
            sweep = self._sweeps.get(sid)
            if sweep is not None:
                sweep.left.discard(peer)
                if not sweep.left:
                    self._end_sweep(sid)
        elif "b" in msg:
            self._notice(peer, int(msg["i"]), str(msg["b"]), str(msg["u"]), str(msg["v"]))
        elif "x" in msg:
            rid = int(msg["x"])
            for sid, sweep in list(self._sweeps.items()):
                if sweep.peer is peer and sweep.rid == rid:
                    del self._sweeps[sid]
            key = peer.waiting.pop(rid, None)
            if key is not None:
                self._pools[key[0]].withdraw(key[1], (peer, rid))
                self._settled(key)
            self._send(peer, {"x": rid})
        else:
            raise ValueError("unknown message")

    def _sweep(self, peer: _Peer, rid: int, key: tuple[str, str]) -> None:
        """A hold of a full principal: ask the other workers holding its entries to drop
        their expired and dead ones (one server drops its own before refusing), then
        decide."""
        others = {p for p in self._peers if p is not peer and p.held.get(key)}
        if not others:
            self._send(peer, {"f": rid})
            return
        sid = next(self._sweep_ids)
        self._sweeps[sid] = _Sweep(peer, rid, key, others, time.monotonic() + SWEEP_WAIT_S)
        for other in others:
            self._send(other, {"s": key[0], "u": key[1], "i": sid})
            self._flush(other)

    def _notice(self, peer: _Peer, rid: int, kind: str, user: str, value: str) -> None:
        """Tell every other worker; the sender hears when all have handled it."""
        self._accept_waiting()
        others = {p for p in self._peers if p is not peer}
        if not others:
            self._send(peer, {"bd": rid, "ok": 1})
            return
        sid = next(self._sweep_ids)
        self._sweeps[sid] = _Sweep(peer, rid, None, others, time.monotonic() + SWEEP_WAIT_S)
        for other in others:
            self._send(other, {"n": kind, "u": user, "v": value, "i": sid})
            self._flush(other)

    def _end_sweep(self, sid: int) -> None:
        sweep = self._sweeps.pop(sid)
        peer, key = sweep.peer, sweep.key
        if peer not in self._peers:
            return
        if key is None:  # a notice: every other worker handled it, or some did not answer
            self._send(peer, {"bd": sweep.rid, "ok": int(not sweep.left)})
            self._flush(peer)
            return
        if self._pools[key[0]].take(key[1], (peer, sweep.rid)) == GRANTED:
            peer.held[key] += 1
            self._send(peer, {"g": sweep.rid, "c": 0})
        else:
            self._send(peer, {"f": sweep.rid})
        self._flush(peer)

    def _recall(self, key: tuple[str, str]) -> None:
        """A request of ``key``'s principal waits: every worker leasing its slots returns
        them as soon as they are idle, until its queue is empty."""
        told = self._recalled[key] = set()
        for peer in self._peers:
            if peer.held.get(key):
                told.add(peer)
                self._send(peer, {"c": key[0], "u": key[1]})
                self._flush(peer)

    def _settled(self, key: tuple[str, str]) -> None:
        """``key``'s queue is empty again: the recalled workers may keep leases."""
        if key in self._recalled and not self._pools[key[0]].waiting(key[1]):
            for peer in self._recalled.pop(key):
                if peer in self._peers:
                    self._send(peer, {"k": key[0], "u": key[1]})
                    self._flush(peer)

    def _give_back(self, peer: _Peer, key: tuple[str, str]) -> None:
        peer.held[key] -= 1
        if peer.held[key] <= 0:
            del peer.held[key]
        pool, user = key
        waiter = self._pools[pool].give_back(user)
        if waiter is not None:
            other, rid = waiter
            other.waiting.pop(rid, None)
            other.held[key] += 1
            contended = bool(self._pools[pool].waiting(user))
            self._send(other, {"g": rid, "c": int(contended)})
            if contended:
                self._recalled.setdefault(key, set()).add(other)
            if other is not peer:
                self._flush(other)
        self._settled(key)

    def _send(self, peer: _Peer, msg: dict) -> None:
        peer.outbuf += _line(msg)

    def _flush(self, peer: _Peer) -> None:
        if peer.sock.fileno() < 0:
            return
        try:
            while peer.outbuf:
                n = peer.sock.send(peer.outbuf)
                del peer.outbuf[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return  # its read side sees the close and drops it
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbuf else 0)
        self._sel.modify(peer.sock, want, peer)

    def _drop(self, peer: _Peer) -> None:
        """A worker left: its queued requests go, its slots go to the next waiters."""
        try:
            self._sel.unregister(peer.sock)
        except (KeyError, ValueError):
            return
        peer.sock.close()
        self._peers.discard(peer)
        for told in self._recalled.values():
            told.discard(peer)
        for sid, sweep in list(self._sweeps.items()):
            if sweep.peer is peer:
                del self._sweeps[sid]
            else:
                sweep.left.discard(peer)
                if not sweep.left:
                    self._end_sweep(sid)
        for rid, key in list(peer.waiting.items()):
            self._pools[key[0]].withdraw(key[1], (peer, rid))
            self._settled(key)
        peer.waiting.clear()
        for key, n in list(peer.held.items()):
            for _ in range(n):
                self._give_back(peer, key)

    # -- for tests ------------------------------------------------------------------------

    def counts(self, pool: str) -> tuple[int, int]:
        """(slots leased, requests waiting) in ``pool``: only read it while the loop is
        quiet (tests)."""
        table = self._pools[pool]
        return table.count(), table.queued()


class _Lease:
    """One principal's slots of one pool, as a worker holds them."""

    __slots__ = ("leased", "busy", "recalled")

    def __init__(self):
        self.leased = 0  # slots the broker leased to this worker
        self.busy = 0  # of which statements here hold (the others are idle)
        self.recalled = False  # return slots as they become idle


class _Request:
    __slots__ = ("rid", "key", "event", "answer")

    def __init__(self, rid: int, key: tuple[str, str]):
        self.rid, self.key = rid, key
        self.event = threading.Event()
        self.answer: str | None = None  # "g" granted, "f" queue full, "lost" no broker


class BrokerLink:
    """A worker's one connection to the parent's ``SlotBroker``."""

    def __init__(self, path: str, connect_timeout_s: float = 10.0):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        deadline = time.monotonic() + connect_timeout_s
        while True:  # the broker starts before the workers; a restart may race its accept
            try:
                self._sock.connect(path)
                break
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN) \
                        or time.monotonic() > deadline:
                    self._sock.close()
                    raise
                time.sleep(0.05)
        # a broker that stops reading must not hold this worker's threads for long
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                              struct.pack("ll", SEND_TIMEOUT_S, 0))
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._leases: dict[tuple[str, str], _Lease] = {}
        self._pending: dict[int, _Request] = {}
        self._abandoned: dict[int, _Request] = {}
        #: pools whose slots go back as soon as released (holds), and who sweeps them
        self._sweepers: dict[str, Callable[[str], None]] = {}
        #: notice kind -> its handler (user, value), run on the sweep thread
        self._noticed: dict[str, Callable[[str, str], None]] = {}
        self._notices: dict[int, _Request] = {}
        self._sweep_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sweeper: threading.Thread | None = None
        self.lost = False
        self._reader = threading.Thread(target=self._read, name="slot-broker-link",
                                        daemon=True)
        self._reader.start()

    def take(self, pool: str, user: str) -> _Request | None:
        """An idle slot this worker leases (None), or a request to wait for."""
        key = (pool, user)
        with self._lock:
            lease = self._leases.get(key)
            if lease is not None and lease.busy < lease.leased:
                lease.busy += 1
                return None
            req = _Request(next(self._ids), key)
            if self.lost:
                req.answer = "lost"
                req.event.set()
                return req
            self._pending[req.rid] = req
            self._send_locked({"a": req.rid, "p": pool, "u": user})
        return req

    def on_sweep(self, pool: str, sweep: Callable[[str], None]) -> None:
        """``pool`` holds entries (``SharedHolds``): a slot goes back as soon as it is
        released, and ``sweep(user)`` drops that principal's expired and dead entries when
        the broker asks (another worker found the server's count full)."""
        with self._lock:
            self._sweepers[pool] = sweep
            self._start_sweeper_locked()

    def on_notice(self, kind: str, handle: Callable[[str, str], None]) -> None:
        """Run ``handle(user, value)`` for every ``kind`` notice another worker sends."""
        with self._lock:
            self._noticed[kind] = handle
            self._start_sweeper_locked()

    def notify(self, kind: str, user: str, value: str, wait: bool = True) -> bool:
        """Tell every other worker (``on_notice``). With ``wait``: return once all have
        handled it (True), or False after ``SWEEP_WAIT_S`` and a little more, or at once
        without a broker."""
        with self._lock:
            if self.lost:
                return False
            rid = next(self._ids)
            done = _Request(rid, (kind, user))
            if wait:
                self._notices[rid] = done
            self._send_locked({"b": kind, "u": user, "v": value, "i": rid})
        if not wait:
            return True
        done.event.wait(SWEEP_WAIT_S + 1.0)
        with self._lock:
            self._notices.pop(rid, None)
        return done.answer == "ok"

    def _start_sweeper_locked(self) -> None:
        if self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep_loop,
                                             name="slot-broker-sweep", daemon=True)
            self._sweeper.start()

    def _sweep_loop(self) -> None:
        while True:
            item = self._sweep_queue.get()
            try:
                if item[0] == "n":
                    _, kind, user, value, sid = item
                    handle = self._noticed.get(kind)
                    if handle is not None:
                        handle(user, value)
                else:
                    _, pool, user, sid = item
                    self._sweepers[pool](user)  # gives its holds back (messages before ours)
            except Exception as exc:  # noqa: BLE001 - the broker decides without it
                log.warning("sweep failed", extra={"fields": {
                    "event": "slot_broker_error", "error": f"{type(exc).__name__}: {exc}"}})
            with self._lock:
                self._send_locked({"nd" if item[0] == "n" else "sd": sid})

    def give_up(self, req: _Request) -> bool:
        """Withdraw ``req``; True when it had been granted already (the caller then holds
        the slot and must release it)."""
        with self._lock:
            if req.answer is not None:
                return req.answer == "g"
            self._pending.pop(req.rid, None)
            self._abandoned[req.rid] = req
            self._send_locked({"x": req.rid})
            return False

    def release(self, pool: str, user: str) -> bool:
        """A statement ended: its leased slot is idle (returned to the broker if recalled).
        False when this worker holds no such slot (the caller's own ``Concurrency`` does)."""
        key = (pool, user)
        with self._lock:
            lease = self._leases.get(key)
            if lease is None or lease.busy <= 0:
                return False
            lease.busy -= 1
            if lease.recalled or self.lost or pool in self._sweepers:
                lease.leased -= 1
                self._send_locked({"r": pool, "u": user, "n": 1})
            if not lease.leased:
                del self._leases[key]
            return True

    def busy(self, pool: str) -> int:
        with self._lock:
            return sum(lease.busy for (p, _), lease in self._leases.items() if p == pool)

    def close(self) -> None:
        with self._lock:
            self.lost = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _send_locked(self, msg: dict) -> None:
        if self.lost:
            return
        try:
            self._sock.sendall(_line(msg))
        except OSError:
            self._lose_locked()

    def _lose_locked(self) -> None:
        if not self.lost:
            log.warning("slot broker lost: this worker's limits now count its own "
                        "statements only", extra={"fields": {"event": "slot_broker_lost"}})
        self.lost = True
        for req in self._pending.values():
            req.answer = "lost"
            req.event.set()
        self._pending.clear()
        self._abandoned.clear()
        for done in self._notices.values():
            done.answer = "lost"
            done.event.set()
        for lease in self._leases.values():  # idle slots are gone; held ones end here
            lease.leased = lease.busy

    def _read(self) -> None:
        buf = bytearray()
        try:
            while True:
                data = self._sock.recv(65536)
                if not data:
                    break
                buf += data
                while (end := buf.find(b"\n")) >= 0:
                    msg = json.loads(bytes(buf[:end]))
                    del buf[: end + 1]
                    with self._lock:
                        self._answer(msg)
                if len(buf) > MAX_LINE:  # not the broker's protocol: stop trusting it
                    break
        except (OSError, ValueError):
            pass
        with self._lock:
            self._lose_locked()

    def _answer(self, msg: dict) -> None:
        if "g" in msg:
            rid = msg["g"]
            req = self._pending.pop(rid, None) or self._abandoned.get(rid)
            if req is None:
                return
            lease = self._leases.setdefault(req.key, _Lease())
            lease.leased += 1
            lease.recalled = bool(msg.get("c"))
            if req.answer is None and rid not in self._abandoned:
                lease.busy += 1
                req.answer = "g"
                req.event.set()
            self._return_idle(req.key, lease)  # a given-up grant is idle
        elif "f" in msg:
            req = self._pending.pop(msg["f"], None)
            if req is not None:
                req.answer = "f"
                req.event.set()
        elif "x" in msg:
            self._abandoned.pop(msg["x"], None)
        elif "s" in msg:  # not here: the sweep takes its registry's lock
            self._sweep_queue.put(("s", str(msg["s"]), str(msg["u"]), int(msg["i"])))
        elif "n" in msg:  # nor a notice: it takes its own locks
            self._start_sweeper_locked()  # answered even with no handler for its kind
            self._sweep_queue.put(("n", str(msg["n"]), str(msg["u"]), str(msg["v"]),
                                   int(msg["i"])))
        elif "bd" in msg:
            done = self._notices.get(msg["bd"])
            if done is not None:
                done.answer = "ok" if msg.get("ok") else "late"
                done.event.set()
        elif "c" in msg or "k" in msg:
            key = (msg.get("c") or msg.get("k"), msg["u"])
            lease = self._leases.get(key)
            if lease is not None:
                lease.recalled = "c" in msg
                self._return_idle(key, lease)

    def _return_idle(self, key: tuple[str, str], lease: _Lease) -> None:
        idle = lease.leased - lease.busy
        if lease.recalled and idle > 0:
            lease.leased -= idle
            self._send_locked({"r": key[0], "u": key[1], "n": idle})
        if not lease.leased:
            del self._leases[key]


class SharedConcurrency:
    """``limits.Concurrency``'s interface over a ``BrokerLink`` (see the module
    docstring); falls back to its own ``Concurrency`` once the broker is lost."""

    def __init__(self, link: BrokerLink, pool: str, limit: int, max_queued: int = 256,
                 poll_s: float = 0.1, on_wait: Callable[[float], None] | None = None,
                 **names):
        self._link, self._pool = link, pool
        self._local = Concurrency(limit, max_queued, poll_s, on_wait, **names)
        self._lock = threading.Lock()
        self._waiting = 0

    def acquire(self, user: str, deadline: float | None = None,
                gone: Callable[[], bool] = lambda: False) -> float:
        local = self._local
        req = self._link.take(self._pool, user)
        if req is None:
            return local.waited(0.0)
        start = time.monotonic()
        if not req.event.is_set():
            with self._lock:
                self._waiting += 1
            try:
                local.wait(req.event.wait, user, deadline, gone, start)
            except BaseException:
                if self._link.give_up(req):
                    self.release(user)
                local.waited(time.monotonic() - start)
                raise
            finally:
                with self._lock:
                    self._waiting -= 1
        if req.answer == "f":
            raise local.queue_full(user)
        if req.answer == "lost":
            return local.acquire(user, deadline, gone)
        return local.waited(time.monotonic() - start)

    def release(self, user: str) -> None:
        if not self._link.release(self._pool, user):
            self._local.release(user)

    def count(self) -> int:
        return self._link.busy(self._pool) + self._local.count()

    def queued(self) -> int:
        with self._lock:
            waiting = self._waiting
        return waiting + self._local.queued()


class SharedHolds:
    """The whole server's count of a principal's entries of one kind (``pool``:
    ``prepared``, ``sessions``), for ``limits.PerPrincipal(shared=...)``: ``take(user)``
    is True (one more is allowed), False (the server holds the limit, after every worker
    dropped its expired and dead entries) or None (the broker is gone: count this worker's
    own); ``give_back(user)`` when an entry goes."""

    def __init__(self, link: BrokerLink, pool: str, wait_s: float = 10.0):
        self._link, self._pool, self._wait_s = link, pool, wait_s

    def attach(self, registry) -> SharedHolds:
        self._link.on_sweep(self._pool, registry.sweep)
        return self

    def take(self, user: str) -> bool | None:
        req = self._link.take(self._pool, user)
        if req is None:
            return True
        if not req.event.wait(self._wait_s):
            if self._link.give_up(req):
                return True
            return False
        if req.answer == "lost":
            return None
        return req.answer == "g"

    def give_back(self, user: str) -> None:
        self._link.release(self._pool, user)


def connect(path: str | None) -> BrokerLink | None:
    """The worker's link to its parent's broker at ``path``, or None (logged) when there
    is none to reach: the worker then counts its own statements only."""
    if not path:
        return None
    try:
        return BrokerLink(path)
    except OSError as exc:
        log.warning("slot broker unreachable: this worker's limits count its own "
                    "statements only", extra={"fields": {
                        "event": "slot_broker_lost", "error": os.strerror(exc.errno or 0)}})
        return None

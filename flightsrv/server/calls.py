"""Statements in flight: one ``Cancel`` token per call, deadlines, client cancellation.

Contract:

- ``CallTracker.start(user, timeout_s, context, ticket)`` registers a running statement
  and returns its ``Call`` (``call.cancel`` is the ``flightsrv.engine.api.Cancel`` handed
  to the engine); ``finish(call)`` unregisters it. Use ``with tracker.running(...)``.
- A watchdog thread (every ``poll_s``, 0.1 s by default) trips ``cancel("timeout")`` on a
  call past its deadline and ``cancel("cancelled")`` on a call whose client went away or
  cancelled the RPC (``context.is_cancelled()``); the engine then interrupts DuckDB. So a
  GetFlightInfo that runs a statement is interrupted when its client gives up, and any
  statement stops within ``poll_s`` of its deadline. A tripped call still running has its
  interrupts run again at every poll (``Cancel.reinterrupt``): DuckDB forgets an interrupt
  that reaches a connection before its query starts.
- ``cancel_ticket(user, nonce)`` trips every running stream of that ticket owned by
  ``user`` (callers have verified the ticket's principal) and remembers the nonce, so a
  DoGet that starts later fails with CANCELLED; it returns how many calls it tripped.
- ``cancel_all(reason)`` trips everything (drain deadline, shutdown).
- ``connection_open(peer, server_port)``: whether a gRPC peer's TCP connection to us is
  still established (Linux /proc/net; anything it cannot check counts as open).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from cachetools import TTLCache

from flightsrv.engine.api import Cancel


@dataclass(eq=False)
class Call:
    user: str
    cancel: Cancel
    deadline: float | None  # time.monotonic() seconds
    context: object | None = None  # pyarrow ServerCallContext
    nonce: str | None = None  # the ticket being served, if any
    started: float = field(default_factory=time.monotonic)


class CallTracker:
    def __init__(self, poll_s: float = 0.1, remember_cancelled: int = 100_000,
                 cancelled_ttl_s: float = 24 * 3600):
        self._calls: set[Call] = set()
        self._lock = threading.Lock()
        self._cancelled: TTLCache = TTLCache(remember_cancelled, cancelled_ttl_s)
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="flightsrv-watchdog",
                                        daemon=True)
        self._thread.start()

    # -- registration ---------------------------------------------------------------

    def start(self, user: str, timeout_s: float | None, context=None,
              nonce: str | None = None) -> Call:
        deadline = time.monotonic() + timeout_s if timeout_s else None
        call = Call(user, Cancel(), deadline, context, nonce)
        with self._lock:
            if nonce is not None and self._cancelled.get(nonce) == user:
                call.cancel.cancel("cancelled")
            self._calls.add(call)
        return call

    def finish(self, call: Call) -> None:
        with self._lock:
            self._calls.discard(call)
            call.context = None  # never touched again once the RPC may be over

    @contextlib.contextmanager
    def running(self, user: str, timeout_s: float | None, context=None,
                nonce: str | None = None) -> Iterator[Call]:
        call = self.start(user, timeout_s, context, nonce)
        try:
            yield call
        finally:
            self.finish(call)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._calls)

    # -- cancelling -----------------------------------------------------------------

    def was_cancelled(self, user: str, nonce: str) -> bool:
        with self._lock:
            return self._cancelled.get(nonce) == user

    def cancel_ticket(self, user: str, nonce: str) -> int:
        with self._lock:
            self._cancelled[nonce] = user
            hits = [c for c in self._calls if c.nonce == nonce and c.user == user]
        for c in hits:
            c.cancel.cancel("cancelled")
        return len(hits)

    def cancel_all(self, reason: str = "cancelled") -> int:
        with self._lock:
            calls = list(self._calls)
        for c in calls:
            c.cancel.cancel(reason)
        return len(calls)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)

    # -- watchdog -------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            now = time.monotonic()
            trip = []
            again = []
            with self._lock:
                for c in self._calls:
                    if c.cancel.cancelled:
                        again.append(c)
                        continue
                    if c.deadline is not None and now >= c.deadline:
                        trip.append((c, "timeout"))
                    elif c.context is not None and client_gone(c.context):
                        trip.append((c, "cancelled"))
            for c, reason in trip:  # outside the lock: callbacks interrupt DuckDB
                c.cancel.cancel(reason)
            for c in again:  # an interrupt that came before DuckDB's query began is lost
                c.cancel.reinterrupt()


def client_gone(context) -> bool:
    try:
        return bool(context.is_cancelled())
    except Exception:  # noqa: BLE001 - a context that cannot answer is not cancelled
        return False


def _proc_net_key(ip: str, port: int) -> str | None:
    """``ip:port`` as /proc/net/tcp{,6} spell an address (hex, 32-bit words in host order)."""
    import socket
    import sys

    try:
        if ":" in ip:
            raw = socket.inet_pton(socket.AF_INET6, ip)
        else:
            raw = socket.inet_aton(ip)
    except OSError:
        return None
    words = [raw[i:i + 4] for i in range(0, len(raw), 4)]
    if sys.byteorder == "little":
        words = [w[::-1] for w in words]
    return f"{b''.join(words).hex().upper()}:{port:04X}"


def connection_open(peer: str, server_port: int) -> bool:
    """Whether gRPC peer ``peer`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``) still has an
    ESTABLISHED connection to ``server_port``, from Linux's /proc/net/tcp{,6}. Anything
    that cannot be checked (another OS, a unix socket, an odd peer string) counts as open,
    so only a connection seen closed releases what it held."""
    from urllib.parse import unquote

    kind, _, rest = unquote(peer).partition(":")
    if kind not in ("ipv4", "ipv6"):
        return True
    host, _, port_text = rest.rpartition(":")
    try:
        remote = _proc_net_key(host.strip("[]"), int(port_text))
    except ValueError:
        return True
    if remote is None:
        return True
    remotes = {remote}
    if ":" not in host:  # on a dual-stack socket the peer shows as ::ffff:a.b.c.d
        mapped = _proc_net_key("::ffff:" + host, int(port_text))
        if mapped is not None:
            remotes.add(mapped)
    local_port = f":{server_port:04X}"
    seen_table = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        seen_table = True
        for line in lines:
            cols = line.split()
            if len(cols) > 3 and cols[2] in remotes and cols[1].endswith(local_port) \
                    and cols[3] == "01":  # 01: ESTABLISHED
                return True
    return not seen_table

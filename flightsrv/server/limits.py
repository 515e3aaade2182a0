"""Per-principal registries and limits: prepared statements, sessions, kept results and
statements in flight.

Contract:

- ``PerPrincipal``: each principal (user name) owns a separate table of entries with an
  idle lifetime (``ttl_s``; reading an entry renews it; the clock is injected). Lookups
  are always scoped to the caller, so a principal can neither see, close nor evict another
  principal's entries: another's handle is simply NOT_FOUND for it.
- When a principal's table is full, ``add`` raises ``status.ResourceLimit`` naming the
  limit and its value (``on_full="raise"``), or drops that principal's own least recently
  used entry (``on_full="evict"``, used for results nobody fetched). Expired entries are
  dropped first in both cases, and so are entries ``gone(key)`` says are dead (a session
  whose connection closed).
- ``Concurrency`` is admission control: each principal has ``limit`` statement slots.
  ``acquire(user, deadline)`` takes a free one, or WAITS for one in that principal's FIFO
  queue (at most ``max_queued`` waiting; more is ``ResourceLimit`` naming
  ``max_queued_queries``) until a slot is handed to it, its ``deadline`` (monotonic
  seconds) passes (``QueryCancelled`` with ``reason=timeout`` naming
  ``max_concurrent_queries``) or ``gone()`` says its client left (``reason=cancelled``).
  A released slot goes straight to the head of the same principal's queue. Principals
  never share slots or queues, so one principal's flood delays nobody else; there is no
  cross-principal pool to schedule. ``slot(user)`` is the context-manager form.
  ``Concurrency(..., what=..., limit_name=...)`` names another thing (the server's open
  DoPut streams, ``max_open_puts``: a stream over the limit waits in the same way, so
  ``executemany`` from many writers of one principal queues instead of being refused).
- All methods are thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from cachetools import TTLCache

from flightsrv.errors import QueryCancelled
from flightsrv.runtime import Clock
from flightsrv.server.status import ResourceLimit

K = TypeVar("K")
V = TypeVar("V")


class PerPrincipal(Generic[K, V]):
    def __init__(self, what: str, limit_name: str, limit: int, ttl_s: float, clock: Clock,
                 on_full: str = "raise", gone: Callable[[K], bool] | None = None):
        self._what, self._limit_name, self._limit = what, limit_name, limit
        self._gone = gone
        self._ttl = ttl_s
        self._timer = lambda: clock.now_ms() / 1000.0
        self._on_full = on_full
        self._tables: dict[str, TTLCache] = {}
        self._lock = threading.Lock()

    def _table(self, user: str, create: bool) -> TTLCache | None:
        table = self._tables.get(user)
        if table is None and create:
            # one more slot than the limit, so that TTLCache itself never evicts silently
            table = self._tables[user] = TTLCache(self._limit + 1, self._ttl, timer=self._timer)
        return table

    def add(self, user: str, key: K, value: V) -> None:
        with self._lock:
            table = self._table(user, create=True)
            table.expire()
            if key not in table and len(table) >= self._limit and self._gone is not None:
                for dead in [k for k in list(table.keys()) if self._gone(k)]:
                    del table[dead]
            if key not in table and len(table) >= self._limit:
                if self._on_full == "evict":
                    table.popitem()  # this principal's least recently used entry
                else:
                    raise ResourceLimit(f"too many open {self._what} for this principal; "
                                        f"close some first", user=user,
                                        limit=self._limit_name, value=self._limit)
            table[key] = value

    def get(self, user: str, key: K) -> V | None:
        with self._lock:
            table = self._table(user, create=False)
            if table is None:
                return None
            value = table.get(key)
            if value is not None:
                table[key] = value  # renew the idle lifetime
            return value

    def pop(self, user: str, key: K) -> V | None:
        with self._lock:
            table = self._table(user, create=False)
            if table is None:
                return None
            value = table.pop(key, None)
            if not table:
                del self._tables[user]
            return value

    def count(self, user: str | None = None) -> int:
        with self._lock:
            tables = [self._tables.get(user)] if user is not None else list(self._tables.values())
            total = 0
            for t in tables:
                if t is not None:
                    t.expire()
                    total += len(t)
            return total


class Concurrency:
    def __init__(self, limit: int, max_queued: int = 256, poll_s: float = 0.1,
                 on_wait: Callable[[float], None] | None = None, *,
                 what: str = "statement", limit_name: str = "max_concurrent_queries",
                 queue_limit_name: str = "max_queued_queries", busy: str = "running"):
        self._limit, self._max_queued, self._poll_s = limit, max_queued, poll_s
        #: what waits ("statement", "DoPut stream") and the limits named in its errors
        self._what, self._limit_name = what, limit_name
        self._queue_limit_name, self._busy = queue_limit_name, busy
        self._on_wait = on_wait  # seconds a statement waited in the queue (metrics)
        self._running: dict[str, int] = {}
        self._queues: dict[str, deque[threading.Event]] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def slot(self, user: str, deadline: float | None = None) -> Iterator[None]:
        self.acquire(user, deadline)
        try:
            yield
        finally:
            self.release(user)

    def acquire(self, user: str, deadline: float | None = None,
                gone: Callable[[], bool] = lambda: False) -> float:
        """Take one of ``user``'s slots, waiting in its queue; returns the seconds waited."""
        with self._lock:
            queue = self._queues.get(user)
            n = self._running.get(user, 0)
            if n < self._limit and not queue:
                self._running[user] = n + 1
                granted = None  # a free slot: no event to wait on
            elif queue is not None and len(queue) >= self._max_queued:
                raise ResourceLimit(f"too many {self._what}s waiting for a slot for this "
                                    "principal; retry when some finished", user=user,
                                    limit=self._queue_limit_name, value=self._max_queued)
            else:
                granted = threading.Event()
                self._queues.setdefault(user, deque()).append(granted)
        if granted is None:
            if self._on_wait is not None:
                self._on_wait(0.0)
            return 0.0
        start = time.monotonic()
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if granted.wait(self._poll_s if left is None else
                                max(0.0, min(self._poll_s, left))):
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise QueryCancelled(
                        f"{self._what} timed out waiting for a slot: this principal's "
                        f"{self._what}s were all {self._busy}", reason="timeout", user=user,
                        limit=self._limit_name, value=self._limit,
                        waited_ms=round((time.monotonic() - start) * 1000))
                if gone():
                    raise QueryCancelled(f"{self._what} was cancelled while waiting for a "
                                         "slot", reason="cancelled")
        except BaseException:
            with self._lock:
                if granted.is_set():  # handed a slot just as we gave up: pass it on
                    self._release_locked(user)
                else:
                    self._queues[user].remove(granted)
                    if not self._queues[user]:
                        del self._queues[user]
            raise
        finally:
            if self._on_wait is not None:
                self._on_wait(time.monotonic() - start)
        return time.monotonic() - start

    def release(self, user: str) -> None:
        with self._lock:
            self._release_locked(user)

    def _release_locked(self, user: str) -> None:
        queue = self._queues.get(user)
        if queue:  # hand the slot to the oldest waiter: the running count stays
            queue.popleft().set()
            if not queue:
                del self._queues[user]
            return
        n = self._running.get(user, 0) - 1
        if n <= 0:
            self._running.pop(user, None)
        else:
            self._running[user] = n

    def count(self) -> int:
        with self._lock:
            return sum(self._running.values())

    def queued(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._queues.values())

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
  dropped first in both cases.
- ``Concurrency.slot(user)`` is a context manager holding one of the principal's
  ``limit`` statement slots, or raising ``ResourceLimit``.
- All methods are thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

from cachetools import TTLCache

from flightsrv.runtime import Clock
from flightsrv.server.status import ResourceLimit

K = TypeVar("K")
V = TypeVar("V")


class PerPrincipal(Generic[K, V]):
    def __init__(self, what: str, limit_name: str, limit: int, ttl_s: float, clock: Clock,
                 on_full: str = "raise"):
        self._what, self._limit_name, self._limit = what, limit_name, limit
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
    def __init__(self, limit: int):
        self._limit = limit
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def slot(self, user: str) -> Iterator[None]:
        self.acquire(user)
        try:
            yield
        finally:
            self.release(user)

    def acquire(self, user: str) -> None:
        with self._lock:
            n = self._running.get(user, 0)
            if n >= self._limit:
                raise ResourceLimit("too many statements running at once for this principal; "
                                    "retry when one finishes", user=user,
                                    limit="max_concurrent_queries", value=self._limit)
            self._running[user] = n + 1

    def release(self, user: str) -> None:
        with self._lock:
            n = self._running.get(user, 0) - 1
            if n <= 0:
                self._running.pop(user, None)
            else:
                self._running[user] = n

    def count(self) -> int:
        with self._lock:
            return sum(self._running.values())

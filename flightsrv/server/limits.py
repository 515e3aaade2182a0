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
- ``PerPrincipal(..., shared=...)``: the count of a principal's entries is the whole
  server's (``serve --workers N``: ``broker.SharedHolds``), while the entries stay in this
  process: every entry that goes (closed, expired, evicted, dead) gives its hold back, and
  ``sweep(user)`` drops expired and dead entries when another process needs the room.
- ``Concurrency`` is admission control: each principal has ``limit`` statement slots.
  ``acquire(user, deadline)`` takes a free one, or WAITS for one in that principal's FIFO
  queue (at most ``max_queued`` waiting; more is ``ResourceLimit`` naming
  ``max_queued_queries``) until a slot is handed to it, its ``deadline`` (monotonic
  seconds) passes (``QueryCancelled`` with ``reason=timeout`` naming
  ``max_concurrent_queries``) or ``gone()`` says its client left (``reason=cancelled``).
  A released slot goes straight to the head of the same principal's queue. Principals
  never share slots or queues, so one principal's flood delays nobody else; there is no
  cross-principal pool to schedule. ``slot(user)`` is the context-manager form.
  ``try_acquire(user)`` takes a free slot only if one is free now and none of that
  principal's statements waits (it never goes ahead of the queue), else returns False.
  ``Concurrency(..., what=..., limit_name=...)`` names another thing (the server's open
  DoPut streams, ``max_open_puts``: a stream over the limit waits in the same way, so
  ``executemany`` from many writers of one principal queues instead of being refused).
- ``SlotTable`` is that bookkeeping alone (taken slots and FIFO queues per principal, no
  lock, no waiting): ``Concurrency`` keeps one behind its lock, and the slot broker of
  ``serve --workers N`` (``server/broker.py``) keeps one for all the worker processes.
- All methods of ``PerPrincipal`` and ``Concurrency`` are thread-safe.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from cachetools import Cache, TTLCache

from flightsrv.errors import QueryCancelled
from flightsrv.runtime import Clock
from flightsrv.server.status import ResourceLimit

K = TypeVar("K")
V = TypeVar("V")
W = TypeVar("W")


class _Table(TTLCache):
    """A principal's TTLCache that reports every entry that leaves it, however (deleted,
    popped, evicted for room, expired), so that a shared count of holds is given back in
    one place. (``TTLCache.expire`` removes without ``__delitem__``; eviction and ``pop``
    go through it.)"""

    def __init__(self, maxsize: int, ttl: float, timer, dropped: Callable[[int], None]):
        super().__init__(maxsize, ttl, timer=timer)
        self._dropped = dropped
        #: keys kept without a hold of their own (a copy of an entry another worker holds)
        self.unheld: set = set()

    def __delitem__(self, key):
        # expired ones too: TTLCache removes those, then raises KeyError
        held = Cache.__contains__(self, key) and key not in self.unheld
        try:
            super().__delitem__(key)
        finally:
            self.unheld.discard(key)
            if held:
                self._dropped(1)

    def expire(self, time=None):
        gone = super().expire(time)
        held = 0
        for key, _ in gone:
            if key in self.unheld:
                self.unheld.discard(key)
            else:
                held += 1
        if held:
            self._dropped(held)
        return gone


class PerPrincipal(Generic[K, V]):
    def __init__(self, what: str, limit_name: str, limit: int, ttl_s: float, clock: Clock,
                 on_full: str = "raise", gone: Callable[[K], bool] | None = None,
                 shared=None):
        self._what, self._limit_name, self._limit = what, limit_name, limit
        self._gone = gone
        self._ttl = ttl_s
        self._timer = lambda: clock.now_ms() / 1000.0
        self._on_full = on_full
        self._tables: dict[str, _Table] = {}
        self._lock = threading.Lock()
        #: the whole server's count of entries (``serve --workers N``: ``broker.SharedHolds``,
        #: ``take(user)`` True / False when full / None when not shared any more, and
        #: ``give_back(user)``); None: this process's tables are the count
        self._shared = shared
        if shared is not None:
            shared.attach(self)  # the broker may ask this registry to sweep

    def _table(self, user: str, create: bool) -> _Table | None:
        table = self._tables.get(user)
        if table is None and create:
            # one more slot than the limit, so that TTLCache itself never evicts silently
            table = self._tables[user] = _Table(self._limit + 1, self._ttl, self._timer,
                                                lambda n: self._give_back(user, n))
        return table

    def _give_back(self, user: str, n: int) -> None:
        if self._shared is not None:
            for _ in range(n):
                self._shared.give_back(user)

    def _full(self, user: str) -> ResourceLimit:
        return ResourceLimit(f"too many open {self._what} for this principal; close some "
                             f"first", user=user, limit=self._limit_name, value=self._limit)

    def _drop_gone(self, table: _Table) -> int:
        if self._gone is None:
            return 0
        dead = [k for k in list(table.keys()) if self._gone(k)]
        for k in dead:
            del table[k]
        return len(dead)

    def add(self, user: str, key: K, value: V, *, held: bool = True) -> None:
        """Keep ``value`` under ``key`` for ``user``, counted against the limit.
        ``held=False`` (``serve --workers N``): a copy of an entry another worker made and
        counts for the whole server (a prepared statement used on a connection that
        reached this worker): kept here without a hold of its own, so one statement counts
        once however many workers run it."""
        with self._lock:
            table = self._table(user, create=True)
            table.expire()
            if key in table:
                table[key] = value
                return
            if self._shared is None:
                self._add_local(user, table, key, value)
                return
            if not held:
                table[key] = value
                table.unheld.add(key)
                return
        self._add_shared(user, key, value)

    def _add_local(self, user: str, table: _Table, key: K, value: V) -> None:
        if len(table) >= self._limit and self._gone is not None:
            self._drop_gone(table)
        if len(table) >= self._limit:
            if self._on_full == "evict":
                table.popitem()  # this principal's least recently used entry
            else:
                raise self._full(user)
        table[key] = value

    def _add_shared(self, user: str, key: K, value: V) -> None:
        """Take one of the server's holds for ``key`` (never under the lock: the answer
        may wait for other workers to sweep theirs), then keep it."""
        got = self._shared.take(user)
        if got is False:
            with self._lock:  # this worker's own dead entries first, as one server does
                table = self._table(user, create=True)  # (each gives its hold back)
                freed = self._drop_gone(table) + len(table.expire())
            got = self._shared.take(user) if freed else False
        with self._lock:
            table = self._table(user, create=True)
            if got is None:  # the broker is gone: count this worker's own
                self._add_local(user, table, key, value)
                return
            if not got:
                if not table:
                    del self._tables[user]
                raise self._full(user)
            if key in table:  # added meanwhile by another call: one hold is enough
                self._shared.give_back(user)
            table[key] = value

    def sweep(self, user: str) -> None:
        """Drop ``user``'s expired and dead entries now, giving their holds back (the
        broker asks every worker to when one of them finds the server's count full)."""
        with self._lock:
            table = self._table(user, create=False)
            if table is None:
                return
            table.expire()  # each entry dropped gives its hold back
            self._drop_gone(table)
            if not table:
                del self._tables[user]

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
            value = table.pop(key, None)  # gives its hold back
            if not table:
                del self._tables[user]
            return value

    def keys(self, user: str) -> list[K]:
        """``user``'s keys now (expired ones included until the table next expires)."""
        with self._lock:
            table = self._table(user, create=False)
            return [] if table is None else list(table.keys())

    def count(self, user: str | None = None) -> int:
        with self._lock:
            tables = [self._tables.get(user)] if user is not None else list(self._tables.values())
            total = 0
            for t in tables:
                if t is not None:
                    t.expire()
                    total += len(t)
            return total


#: what :meth:`SlotTable.take` did with a request
GRANTED, QUEUED, FULL = "granted", "queued", "full"


class SlotTable(Generic[W]):
    """The bookkeeping of per-principal slots, without locks or waiting: how many of each
    principal's slots are taken, and who waits for one, in order. ``Concurrency`` keeps one
    behind a lock for the threads of a process; ``broker.SlotBroker`` keeps one for the
    worker processes of ``serve --workers N`` (a waiter there is a worker's request)."""

    def __init__(self, limit: int, max_queued: int):
        self.limit, self.max_queued = limit, max_queued
        self._running: dict[str, int] = {}
        self._queues: dict[str, deque[W]] = {}

    def take(self, user: str, waiter: W) -> str:
        """A free slot of ``user``'s (GRANTED), or ``waiter`` at the end of its queue
        (QUEUED), or nothing: the queue holds ``max_queued`` already (FULL)."""
        queue = self._queues.get(user)
        n = self._running.get(user, 0)
        if n < self.limit and not queue:
            self._running[user] = n + 1
            return GRANTED
        if (len(queue) if queue else 0) >= self.max_queued:
            return FULL
        self._queues.setdefault(user, deque()).append(waiter)
        return QUEUED

    def try_take(self, user: str) -> bool:
        """A free slot of ``user``'s if one is free and nobody of ``user``'s waits; never
        queues."""
        n = self._running.get(user, 0)
        if n < self.limit and not self._queues.get(user):
            self._running[user] = n + 1
            return True
        return False

    def give_back(self, user: str) -> W | None:
        """One of ``user``'s slots is free: the oldest waiter it now belongs to (the count
        of taken slots stays), or None (one fewer taken)."""
        queue = self._queues.get(user)
        if queue:
            waiter = queue.popleft()
            if not queue:
                del self._queues[user]
            return waiter
        n = self._running.get(user, 0) - 1
        if n <= 0:
            self._running.pop(user, None)
        else:
            self._running[user] = n
        return None

    def withdraw(self, user: str, waiter: W) -> bool:
        """Take ``waiter`` out of ``user``'s queue; False if it is not there (granted)."""
        queue = self._queues.get(user)
        if not queue or waiter not in queue:
            return False
        queue.remove(waiter)
        if not queue:
            del self._queues[user]
        return True

    def waiting(self, user: str) -> int:
        queue = self._queues.get(user)
        return len(queue) if queue else 0

    def count(self) -> int:
        return sum(self._running.values())

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())


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
        self._table: SlotTable[threading.Event] = SlotTable(limit, max_queued)
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
        granted = threading.Event()
        with self._lock:
            taken = self._table.take(user, granted)
        if taken == FULL:
            raise self.queue_full(user)
        if taken == GRANTED:
            return self.waited(0.0)
        start = time.monotonic()
        try:
            self.wait(granted.wait, user, deadline, gone, start)
        except BaseException:
            with self._lock:
                if not self._table.withdraw(user, granted):
                    # handed a slot just as we gave up: pass it on
                    self._release_locked(user)
            self.waited(time.monotonic() - start)
            raise
        return self.waited(time.monotonic() - start)

    def try_acquire(self, user: str) -> bool:
        """One of ``user``'s slots if one is free now and no statement of ``user``'s waits
        for one (never ahead of the queue); False otherwise, without waiting."""
        with self._lock:
            return self._table.try_take(user)

    # -- shared with broker.SharedConcurrency: the waiting and its errors ----------------------

    def wait(self, wait: Callable[[float], bool], user: str, deadline: float | None,
             gone: Callable[[], bool], start: float) -> None:
        """Call ``wait(seconds)`` until it is true; raise when ``deadline`` passes or
        ``gone()`` says the client left (checked every ``poll_s``)."""
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if wait(self._poll_s if left is None else max(0.0, min(self._poll_s, left))):
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise QueryCancelled(
                    f"{self._what} timed out waiting for a slot: this principal's "
                    f"{self._what}s were all {self._busy}", reason="timeout", user=user,
                    limit=self._limit_name, value=self._limit,
                    waited_ms=round((time.monotonic() - start) * 1000))
            if gone():
                raise QueryCancelled(f"{self._what} was cancelled while waiting for a "
                                     "slot", reason="cancelled")

    def queue_full(self, user: str) -> ResourceLimit:
        return ResourceLimit(f"too many {self._what}s waiting for a slot for this "
                             "principal; retry when some finished", user=user,
                             limit=self._queue_limit_name, value=self._max_queued)

    def waited(self, seconds: float) -> float:
        if self._on_wait is not None:
            self._on_wait(seconds)
        return seconds

    def release(self, user: str) -> None:
        with self._lock:
            self._release_locked(user)

    def _release_locked(self, user: str) -> None:
        waiter = self._table.give_back(user)
        if waiter is not None:  # the oldest waiter's now: the running count stays
            waiter.set()

    def count(self) -> int:
        with self._lock:
            return self._table.count()

    def queued(self) -> int:
        with self._lock:
            return self._table.queued()

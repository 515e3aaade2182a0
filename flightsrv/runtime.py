"""Injected sources of time and identity, and the bounded cache for functions of text.

Core code (``flightsrv.store``, ``flightsrv.table``) never calls the wall clock,
``uuid.uuid4`` or a global RNG directly: it receives a ``Runtime``. Tests pass a
``Runtime.deterministic(seed)`` so that failure and concurrency tests replay.

``text_cache(maxsize, max_chars, max_key_chars)`` replaces ``functools.lru_cache`` for
functions of statement text (parse trees, tokens, guard verdicts, literals): it is bounded
by entries AND by the characters of the ``str`` arguments it keeps (``max_chars``), and
does not cache a call whose text is longer than ``max_key_chars``. What such a function
returns grows with its text (a parse tree of a 0.9 MB IN list took 270 MB), so bounding
the text bounds the values too; counting entries alone let six statements take 1.6 GB.
Inside ``with one_statement():`` (the engine's handling of one statement) a call too long
to cache is still computed once: its value is remembered until the block exits, so the
passes over one large statement (tokens read by the classifier, the parser and the
planner) share one result while no cache keeps it.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import functools
import os
import random
import threading
import time as _time
from collections import OrderedDict
from dataclasses import dataclass, field


class Clock:
    """Wall-clock milliseconds since the epoch, and sleeping."""

    def now_ms(self) -> int:
        return _time.time_ns() // 1_000_000

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    def now(self) -> _dt.datetime:
        return _dt.datetime.fromtimestamp(self.now_ms() / 1000, tz=_dt.timezone.utc)


class ManualClock(Clock):
    """A clock that only moves when told to (or by ``step_ms`` per reading)."""

    def __init__(self, start_ms: int = 1_700_000_000_000, step_ms: int = 1):
        self._now = start_ms
        self._step = step_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            self._now += self._step
            return self._now

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms

    def sleep(self, seconds: float) -> None:
        self.advance(int(seconds * 1000))


class IdSource:
    """Unique identifiers for objects and commits (128 random bits, hex)."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng
        self._lock = threading.Lock()

    def new_id(self) -> str:
        if self._rng is None:
            return os.urandom(16).hex()
        with self._lock:
            return f"{self._rng.getrandbits(128):032x}"


@dataclass
class Runtime:
    """Clock, ids and the RNG used for retry jitter. ``overlap_reads``: a head read on a
    remote store may probe for the next version while it reads the pointer (two requests
    at once, see ``TableLog.head``); a deterministic runtime makes every store call in
    order, one at a time, so a seeded run replays exactly."""

    clock: Clock = field(default_factory=Clock)
    ids: IdSource = field(default_factory=IdSource)
    rng: random.Random = field(default_factory=lambda: random.Random(os.urandom(8)))
    overlap_reads: bool = True

    @classmethod
    def deterministic(cls, seed: int, start_ms: int = 1_700_000_000_000) -> "Runtime":
        return cls(
            clock=ManualClock(start_ms),
            ids=IdSource(random.Random(seed)),
            rng=random.Random(seed ^ 0x5EED),
            overlap_reads=False,
        )


DEFAULT_RUNTIME = Runtime()


#: the values of calls too long to cache, remembered for one statement (see one_statement)
_statement_memo: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "flightsrv_statement_memo", default=None)


@contextlib.contextmanager
def one_statement():
    """Within the block, a :func:`text_cache` call whose text is too long to cache is
    computed once and its value kept until the block exits (nested blocks share the
    outermost one's memo). Nothing outlives the block: no cache keeps such a text."""
    if _statement_memo.get() is not None:
        yield
        return
    token = _statement_memo.set({})
    try:
        yield
    finally:
        _statement_memo.reset(token)


def text_cache(maxsize: int, max_chars: int = 1 << 20, max_key_chars: int = 64 << 10):
    """A thread-safe LRU decorator bounded by entries and by text; see the module
    docstring. Only positional calls are cached; ``cache_clear()`` empties it."""

    def decorate(fn):
        cache: OrderedDict = OrderedDict()
        lock = threading.Lock()
        total = [0]

        @functools.wraps(fn)
        def cached(*args, **kwargs):
            size = sum(len(a) for a in args if isinstance(a, str))
            if kwargs:
                return fn(*args, **kwargs)
            if size > max_key_chars:
                memo = _statement_memo.get()
                if memo is None:
                    return fn(*args)
                key = (cached, args)
                if key not in memo:
                    memo[key] = fn(*args)
                return memo[key]
            with lock:
                hit = cache.get(args)
                if hit is not None:
                    cache.move_to_end(args)
                    return hit[0]
            value = fn(*args)
            with lock:
                if args not in cache:
                    cache[args] = (value, size)
                    total[0] += size
                    while len(cache) > maxsize or total[0] > max_chars:
                        _, (_, gone) = cache.popitem(last=False)
                        total[0] -= gone
            return value

        def cache_clear() -> None:
            with lock:
                cache.clear()
                total[0] = 0

        def cache_chars() -> int:
            with lock:
                return total[0]

        cached.cache_clear = cache_clear
        cached.cache_chars = cache_chars
        return cached

    return decorate

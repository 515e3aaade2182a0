"""Injected sources of time and identity.

Core code (``flightsrv.store``, ``flightsrv.table``) never calls the wall clock,
``uuid.uuid4`` or a global RNG directly: it receives a ``Runtime``. Tests pass a
``Runtime.deterministic(seed)`` so that failure and concurrency tests replay.
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import threading
import time as _time
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
    """Clock, ids and the RNG used for retry jitter."""

    clock: Clock = field(default_factory=Clock)
    ids: IdSource = field(default_factory=IdSource)
    rng: random.Random = field(default_factory=lambda: random.Random(os.urandom(8)))

    @classmethod
    def deterministic(cls, seed: int, start_ms: int = 1_700_000_000_000) -> "Runtime":
        return cls(
            clock=ManualClock(start_ms),
            ids=IdSource(random.Random(seed)),
            rng=random.Random(seed ^ 0x5EED),
        )


DEFAULT_RUNTIME = Runtime()

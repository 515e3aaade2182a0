"""A byte-bounded, thread-safe LRU cache for what the statement path computes from a
statement's text (and the versions or schemas it pinned).

Bounded by bytes, not entries: every entry is charged its key text plus an estimate of its
value, and a text longer than :data:`MAX_CACHED_TEXT` is never cached (it would evict
everything else for one statement). A hit may only skip recomputing what is a pure function
of the key: callers put into the key everything the value depends on (the exact text, the
pinned table identities and versions or schemas), and every security check that is not such
a function still runs on every execution.
"""

from __future__ import annotations

import threading
from typing import Any, Hashable

from cachetools import LRUCache

#: texts longer than this are not cached (bytes of UTF-8, counted as characters)
MAX_CACHED_TEXT = 64 << 10
#: a fixed charge per entry for the key tuple, the entry and the LRU links
ENTRY_OVERHEAD = 256


class _Entry:
    __slots__ = ("size", "value")

    def __init__(self, value: Any, size: int):
        self.value = value
        self.size = size


class StatementCache:
    """``get(key)`` / ``put(key, value, size)`` under a lock; at most ``max_bytes`` of
    charged size held (least recently used entries evicted first)."""

    def __init__(self, max_bytes: int):
        self._cache: LRUCache = LRUCache(maxsize=max_bytes, getsizeof=lambda e: e.size)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            entry = self._cache.get(key)
        return None if entry is None else entry.value

    def put(self, key: Hashable, value: Any, text: str, size: int = 0) -> None:
        """Cache ``value`` for ``key`` (whose statement text is ``text``), charged
        ``len(text)`` + ``size`` + :data:`ENTRY_OVERHEAD`; a text over
        :data:`MAX_CACHED_TEXT`, or an entry over the whole bound, is not cached."""
        if len(text) > MAX_CACHED_TEXT:
            return
        charge = len(text) + size + ENTRY_OVERHEAD
        if charge > self._cache.maxsize:
            return
        with self._lock:
            self._cache[key] = _Entry(value, charge)

    @property
    def bytes(self) -> int:
        with self._lock:
            return int(self._cache.currsize)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

"""Ranged reads of one pinned object version, counted, with a cache of the spans fetched.

Every read is pinned to the ETag the splice was planned on (``get_range(etag=...)``), so a
plan never mixes two versions of the source. Near neighbours are merged into one GET
(``prefetch``); the counts become the plan's ``bytes_downloaded`` / ``get_requests``.
"""

from __future__ import annotations

from typing import Iterable

from flightsrv.errors import CorruptObject
from flightsrv.store.base import ObjectStore

COALESCE_GAP = 64 * 1024  # ranged GETs closer than this are merged


class RangedSource:
    """Ranged reads of ``key@etag`` (``size`` bytes). Raises ObjectNotFound,
    PreconditionFailed (the object changed), CorruptObject (a short read)."""

    def __init__(self, store: ObjectStore, key: str, etag: str, size: int):
        self.store, self.key, self.etag, self.size = store, key, etag, size
        self.bytes = 0
        self.requests = 0
        self._have: list[tuple[int, bytes]] = []

    def _fetch(self, start: int, end: int) -> bytes:
        data = self.store.get_range(self.key, start, end, etag=self.etag)
        self.requests += 1
        self.bytes += len(data)
        if len(data) != end - start:
            raise CorruptObject("short ranged read", key=self.key, start=start, end=end,
                                got=len(data))
        self._have.append((start, data))
        return data

    def _cached(self, start: int, end: int) -> bytes | None:
        for s, d in self._have:
            if s <= start and end <= s + len(d):
                return d[start - s : end - s]
        return None

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Fetch the ranges not cached yet, merging near neighbours into one GET each."""
        todo = sorted((s, e) for s, e in ranges if e > s and self._cached(s, e) is None)
        merged: list[list[int]] = []
        for s, e in todo:
            if merged and s <= merged[-1][1] + COALESCE_GAP:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        for s, e in merged:
            self._fetch(s, e)

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end), from the cache when a fetched span covers them."""
        if end <= start:
            return b""
        got = self._cached(start, end)
        return got if got is not None else self._fetch(start, end)

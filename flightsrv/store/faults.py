"""Fault injection by wrapping a real store (for tests and chaos runs).

``FaultyStore`` forwards every call to the wrapped store and, per a seeded plan, can:

- fail *before* a write (``StoreError``; nothing was written),
- fail *after* a write succeeded (``StoreError``; the caller cannot know it landed),
  at random (``fail_*_p``) or at the N-th matching write (``fail_before_at``/``fail_after_at``),
- crash the process at a named protocol step (``os._exit``), for crash-injection tests,
- add latency to every call,
- run a hook before a write of a matching key (e.g. sneak in a competing commit).

``IgnoresPreconditions`` models a store that accepts the headers and ignores them; the
self-check must refuse it.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from flightsrv.errors import StoreError
from flightsrv.store.base import ObjectStore, PutMode

# new_temp_file / write_temp_file only stage bytes outside the key space; adopt is the write
_WRITE_OPS = {"put", "put_file", "adopt", "delete", "complete_multipart", "upload_part",
              "upload_part_copy", "create_multipart"}


@dataclass
class FaultPlan:
    seed: int = 0
    fail_before_p: float = 0.0
    fail_after_p: float = 0.0
    latency_s: float = 0.0
    key_pattern: str = ".*"  # faults apply to keys matching this regex
    crash_at: int | None = None  # crash (os._exit(99)) at the N-th matching write, before it
    crash_after: int | None = None  # crash right after the N-th matching write succeeded
    fail_before_at: int | None = None  # StoreError instead of the N-th matching write
    fail_after_at: int | None = None  # StoreError after the N-th matching write landed
    before_write: Callable[[str, str], None] | None = None  # hook(op, key)
    log: list = field(default_factory=list)


class FaultyStore:
    def __init__(self, inner: ObjectStore, plan: FaultPlan):
        self.inner = inner
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.writes = 0
        self._pattern = re.compile(plan.key_pattern)

    def arrow_filesystem(self):
        return None  # every read goes through the protocol, where faults apply

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args, **kwargs):
            if self.plan.latency_s:
                time.sleep(self.plan.latency_s)
            key = str(args[0]) if args else ""
            if name not in _WRITE_OPS or not self._pattern.search(key):
                return attr(*args, **kwargs)
            self.writes += 1
            n = self.writes
            self.plan.log.append((name, key, kwargs.get("mode", PutMode.CREATE)))
            if self.plan.crash_at is not None and n == self.plan.crash_at:
                os._exit(99)
            if self.plan.before_write is not None:
                self.plan.before_write(name, key)
            if n == self.plan.fail_before_at:
                raise StoreError("injected failure before write", op=name, key=key, write=n)
            if self.rng.random() < self.plan.fail_before_p:
                raise StoreError("injected failure before write", op=name, key=key)
            result = attr(*args, **kwargs)
            if self.plan.crash_after is not None and n == self.plan.crash_after:
                os._exit(98)
            if n == self.plan.fail_after_at:
                raise StoreError("injected failure after a successful write", op=name, key=key,
                                 write=n)
            if self.rng.random() < self.plan.fail_after_p:
                raise StoreError("injected failure after a successful write", op=name, key=key)
            return result

        return call


class IgnoresPreconditions:
    """A store that accepts If-None-Match / If-Match and ignores them (turns every put into
    an OVERWRITE)."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key, data, *, mode=PutMode.CREATE, etag=None):
        return self.inner.put(key, data, mode=PutMode.OVERWRITE)


class CountingStore:
    """Counts requests per operation (for request budgets in tests and benchmarks)."""

    def __init__(self, inner: ObjectStore):
        self.inner = inner
        self.counts: dict[str, int] = {}
        self.keys: dict[str, list] = {}  # operation -> the keys it was called with, in order
        self.bytes_read = 0
        self.bytes_written = 0

    def reset(self) -> None:
        self.counts.clear()
        self.keys.clear()
        self.bytes_read = self.bytes_written = 0

    def arrow_filesystem(self):
        return None  # every read is counted

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args, **kwargs):
            self.counts[name] = self.counts.get(name, 0) + 1
            key = args[0] if args else kwargs.get("key")
            if isinstance(key, str):
                self.keys.setdefault(name, []).append(key)
            result = attr(*args, **kwargs)
            if name == "get":
                self.bytes_read += len(result[0])
            elif name == "get_range":
                self.bytes_read += len(result)
            elif name in ("put", "upload_part"):
                self.bytes_written += len(args[1] if len(args) > 1 else kwargs.get("data", b""))
            return result

        return call

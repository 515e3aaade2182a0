"""Process-wide observation hooks for code that must not import the server.

``flightsrv.table`` reports events here (a commit landed, a commit lost a race) and the
server's metrics module (``flightsrv.server.metrics``) subscribes to them. This module
imports nothing of flightsrv, so any layer may use it without breaking the one-way
dependencies (server -> engine -> sql/table -> store).

Contract:

- ``emit(event, **fields)`` calls every subscriber with ``(event, fields)``; a subscriber
  that raises is ignored (observation never fails the observed operation).
- ``subscribe(fn)`` returns an ``unsubscribe`` function.

Events:

- ``commit``           ``table``, ``operation``, ``version``, ``attempts``: a version landed.
- ``commit_conflict``  ``table``, ``operation``: a commit attempt lost the race for its version
  and will be retried (or, after the last attempt, the commit fails with CommitConflict).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Subscriber = Callable[[str, dict], None]

_lock = threading.Lock()
_subscribers: tuple[Subscriber, ...] = ()


def subscribe(fn: Subscriber) -> Callable[[], None]:
    global _subscribers
    with _lock:
        _subscribers = (*_subscribers, fn)

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            _subscribers = tuple(s for s in _subscribers if s is not fn)

    return unsubscribe


def emit(event: str, **fields) -> None:
    for fn in _subscribers:  # a tuple swapped atomically: no lock on the hot path
        try:
            fn(event, fields)
        except Exception:  # noqa: BLE001 - observation never fails the operation
            pass

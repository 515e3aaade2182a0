"""SIGINT/SIGTERM as a stop request, for the serving loops (``app.serve``, and the parent of
``serve --workers N`` in ``workers.supervise``)."""

from __future__ import annotations

import signal
import threading


class StopOnSignals:
    """While open, SIGINT and SIGTERM set ``stop`` and are recorded by name in ``received``;
    ``restore()`` puts the previous handlers back."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.stop = threading.Event()
        self.received: list[str] = []
        self._previous = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}

    def _on_signal(self, signum, _frame) -> None:
        self.received.append(signal.Signals(signum).name)
        self.stop.set()

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

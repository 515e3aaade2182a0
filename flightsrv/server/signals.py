"""SIGINT/SIGTERM as a stop request, for the serving loops (``app.serve``, and the parent of
``serve --workers N`` in ``workers.supervise``); ``follow_parent`` for that parent's
children (workers, relays, fronts), which must not outlive it."""

from __future__ import annotations

import ctypes
import os
import signal
import threading

#: set by the parent of ``serve --workers N`` in its children's environment: its pid
PARENT_ENV = "FLIGHTSRV_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


def follow_parent() -> None:
    """In a child of ``serve --workers N``: get SIGTERM when the parent dies, however it
    dies (Linux ``PR_SET_PDEATHSIG``; the child then drains and stops as on the parent's
    own SIGTERM), and exit at once if the parent is gone already. Without this a parent
    killed by SIGKILL (the OOM killer, ``kill -9``) left its workers and relays serving
    the port, and a new server could not bind it. Nothing outside such a child."""
    want = os.environ.get(PARENT_ENV)
    if not want:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl (not Linux): the parent's SIGTERM only
        pass
    if os.getppid() != int(want):  # died before prctl took effect
        raise SystemExit(1)


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

"""SIGINT/SIGTERM as a stop request, for the serving loops (``app.serve``, and the parent of
``serve --workers N`` in ``workers.supervise``); ``follow_parent`` for that parent's
children (workers, relays, fronts), which must not outlive it."""

from __future__ import annotations

import ctypes
import os
import signal
import time

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


class StopFlag:
    """``threading.Event``'s ``set``/``is_set``/``wait``, safe to set from a signal handler.

    A Python signal handler runs in the main thread between two bytecodes, and that thread
    may be inside ``Event.wait`` holding the event's (non-reentrant) lock at that moment:
    ``Event.set`` in the handler then waits for the lock forever (seen: a worker hung in
    ``StopOnSignals._on_signal`` after two SIGTERMs, its drain never began). ``set`` here
    takes no lock (one attribute store), and ``wait`` polls it."""

    POLL_S = 0.05

    def __init__(self):
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            left = self.POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.POLL_S, left))
        return self._set


class StopOnSignals:
    """While open, SIGINT and SIGTERM set ``stop`` (a ``StopFlag``) and are recorded by name
    in ``received``; ``restore()`` puts the previous handlers back."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.stop = StopFlag()
        self.received: list[str] = []
        self._previous = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}

    def _on_signal(self, signum, _frame) -> None:
        self.received.append(signal.Signals(signum).name)
        self.stop.set()

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

"""How many statements each worker of ``flightsrv serve --workers N`` is running, for the
background maintenance (on worker 0 only) to yield to the whole server's statements, not
only to worker 0's.

Each worker owns one file ``busy<index>`` in the server's private 0700 directory: 8 bytes,
its count of statements holding a slot, rewritten in place (``pwrite``) whenever it
changes. Worker 0 reads the others' files when it asks (:meth:`BusyBoard.others`, a few
times a second while maintenance waits). A worker that died leaves its last count until
its replacement starts and writes 0; maintenance waits at most its ``yield_s`` whatever
it reads, so a stale count delays it, never stops it.
"""

from __future__ import annotations

import os
import struct
import threading

_FORMAT = struct.Struct("<q")


class BusyBoard:
    def __init__(self, sockdir: str, index: int):
        self._dir, self._index = sockdir, index
        self._lock = threading.Lock()
        self._count = 0
        self._fd = os.open(os.path.join(sockdir, f"busy{index}"),
                           os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self._fd, _FORMAT.pack(0), 0)

    def add(self, n: int) -> None:
        """This worker runs ``n`` more statements (less, when negative)."""
        with self._lock:  # the file always ends with the last count written
            self._count += n
            if self._fd >= 0:
                os.pwrite(self._fd, _FORMAT.pack(self._count), 0)

    def others(self) -> int:
        """The statements the other workers run now (as they last wrote)."""
        total = 0
        for name in os.listdir(self._dir):
            if not name.startswith("busy") or name[4:] == str(self._index) \
                    or not name[4:].isdigit():
                continue
            try:
                fd = os.open(os.path.join(self._dir, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                raw = os.pread(fd, _FORMAT.size, 0)
            finally:
                os.close(fd)
            if len(raw) == _FORMAT.size:
                total += max(0, _FORMAT.unpack(raw)[0])
        return total

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class CountedSlots:
    """A server's statement slots (``limits.Concurrency`` or ``broker.SharedConcurrency``)
    whose taken slots are counted on a :class:`BusyBoard`; everything else is the inner
    object's."""

    def __init__(self, inner, board: BusyBoard):
        self._inner, self._board = inner, board

    def acquire(self, *args, **kwargs):
        got = self._inner.acquire(*args, **kwargs)
        self._board.add(1)
        return got

    def release(self, user: str) -> None:
        self._inner.release(user)
        self._board.add(-1)

    def __getattr__(self, name):
        return getattr(self._inner, name)

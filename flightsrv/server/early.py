"""A prepared query run from its bind: the state of one early run, without the server.

ADBC and JDBC execute a prepared query with parameters as three RPCs, back to back: DoPut
binds the values, GetFlightInfo returns a ticket, DoGet fetches the result. The values are
known at the bind, and a query has no side effects, so the server starts running it then
(``flight.FlightSqlServer``, "early runs"): DuckDB works while the client and the server
pass the ticket around, instead of after. The run is the statement, started sooner: it
holds one of the principal's slots (taken only if one is free and nobody of the principal
waits), runs under the statement's deadline and cancel, and pins its tables at the bind.

Contract:

- ``EarlyRun(params, st, deadline)``: a run of the statement ``st`` (the server's own
  record: slot, ``Call``, counters) for the bound batch ``params`` (by identity: a new bind
  is a new run). ``deadline``: the statement's own (monotonic seconds, or None), which
  the ``Call`` gets back once a DoGet claims the run; until then the ``Call``'s deadline is
  the claim deadline.
- The running side ends with ``ready(schema, head, reader, exhausted)`` (the first batches,
  read; ``exhausted``: they are the whole result) or ``fail(error)``; each returns False
  when the run was dropped meanwhile (the caller then ends it).
- ``claim()`` (DoGet): True if the run is still to be delivered (RUNNING or READY); it is
  then the caller's, ``wait()`` for its end and read ``error`` or the result. False: it
  was dropped (or claimed already); the caller runs the statement itself.
- ``drop()``: the run will not be delivered (its ``Call`` was cancelled: deadline, claim
  deadline, CancelFlightInfo, a new bind, a closed handle, shutdown). Returns True when the
  caller must end it now (it was READY); a RUNNING run is ended by its running side when
  it ends (``ready``/``fail`` return False). A claimed run is not dropped.
- A claimed run is delivered only if it read what a run started by the DoGet would read:
  the versions it pinned (``ExecInfo.read_set``) are the heads the engine's ``read_set``
  reads once the DoGet arrived, and the session's SET values are unchanged. Otherwise the
  claimed run is discarded and the DoGet runs the statement as for any ticket. Only
  queries whose text names every table they read (``engine.knows_reads``) run early.
- Thread-safe: one lock orders ``ready``/``fail``, ``claim`` and ``drop``.
"""

from __future__ import annotations

import threading

import pyarrow as pa

RUNNING, READY, CLAIMED, DROPPED = "running", "ready", "claimed", "dropped"


class EarlyRun:
    def __init__(self, params: pa.RecordBatch, st, deadline: float | None):
        self.params = params
        self.st = st
        self.deadline = deadline
        self.nonce: str | None = None  # the ticket it answers, once GetFlightInfo issued it
        self.settings: dict = {}  # the session's SET values the run ran with
        self.schema: pa.Schema | None = None
        self.head: list[pa.RecordBatch] = []
        self.reader: pa.RecordBatchReader | None = None
        self.exhausted = False
        self.error: BaseException | None = None
        self._state = RUNNING
        self._ended = threading.Event()
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        return self._state

    def ready(self, schema: pa.Schema, head: list[pa.RecordBatch],
              reader: pa.RecordBatchReader, exhausted: bool) -> bool:
        with self._lock:
            self.schema, self.head, self.reader, self.exhausted = schema, head, reader, exhausted
            dropped = self._state == DROPPED
            if not dropped and self._state == RUNNING:
                self._state = READY
        self._ended.set()
        return not dropped

    def fail(self, error: BaseException) -> bool:
        """The run failed with ``error`` (its DoGet's answer); False if it was dropped
        meanwhile (the caller then ends it)."""
        with self._lock:
            self.error = error
            dropped = self._state == DROPPED
            if self._state == RUNNING:
                self._state = READY  # ready to be delivered: as its error
        self._ended.set()
        return not dropped

    def claim(self) -> bool:
        with self._lock:
            if self._state in (RUNNING, READY):
                self._state = CLAIMED
                return True
            return False

    def drop(self) -> bool:
        with self._lock:
            was = self._state
            if was in (CLAIMED, DROPPED):
                return False
            self._state = DROPPED
            return was == READY

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the run has ended (within ``timeout`` seconds)."""
        return self._ended.wait(timeout)

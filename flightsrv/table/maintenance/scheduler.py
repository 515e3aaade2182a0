"""The background maintenance worker: one thread that visits a warehouse's tables and runs
the due tasks of :mod:`flightsrv.table.maintenance.auto` (docs/MAINTENANCE.md §Automatic
maintenance). The server starts one (``flightsrv serve``; ``--no-auto-maintenance`` turns
it off).

Contract:

- **One thread, one task at a time.** Every ``interval_s`` it runs a *tick*: first the
  tables this process committed to since the last tick (``telemetry`` ``commit`` events,
  its own maintenance commits excepted), then up to ``sweep_tables`` more in round-robin
  order of the warehouse listing, so writes of other processes (Spark jobs, other
  servers) are found within ``ceil(tables / sweep_tables)`` ticks. A table whose head
  version is the one it last looked at is not examined again.
- **Woken by commits.** A table that received ``wake_commits`` commits of this process
  since the last tick wakes the worker before the interval ends (0: never), but a tick
  so started begins at least ``min_gap_s`` after the previous one ended: a stream of small
  commits is compacted while its files are few (reads open every file), and the worker
  still ticks at most ``1 / min_gap_s`` times a second, its I/O still under the bucket.
- **Bounded I/O.** A token bucket of ``bytes_per_s``: a task starts only when the bucket
  is not in debt; what a run read and wrote is charged after it (so the long-run rate is
  at most ``bytes_per_s``, and one run is at most a table's ``auto_compact.max_bytes`` of
  input). ``max_runs_per_tick`` bounds the work of one tick.
- **Yields to foreground work.** Before each task it waits while ``busy()`` is true
  (statements running on the server), polling, for at most ``yield_s``; then it runs
  anyway, so a server that is never idle still gets maintained.
- **Failures are contained.** A task that raises is logged (``auto maintenance failed``,
  table, task, error class and message) and counted; the worker goes on with the next
  table, and the same table is tried again at a later tick (after a back-off of
  ``failure_backoff_ticks`` ticks). The worker thread never dies of a task's error.
- **Observable.** ``on_run(record)`` is called for each run with a :class:`RunRecord`
  (the server turns it into Prometheus counters), ``on_tick(n)`` after each tick.
  ``ticks`` counts finished ticks; ``wait_ticks(n, timeout)`` waits for ``n`` more;
  ``tick_now()`` wakes the worker at once (tests and operators need not sleep).
- ``stop()`` ends the thread after the run in progress (a run is not interrupted: its
  commit is all-or-nothing) and unsubscribes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from flightsrv import telemetry
from flightsrv.table.names import is_table_name
from flightsrv.table.maintenance.auto import TRIGGER_AUTO, AutoPolicy, TaskOutcome, due_tasks

log = logging.getLogger("flightsrv.maintenance")

DEFAULT_INTERVAL_S = 5.0
DEFAULT_BYTES_PER_S = 32 * 1024 ** 2
DEFAULT_YIELD_S = 10.0
DEFAULT_SWEEP_TABLES = 16
DEFAULT_MAX_RUNS_PER_TICK = 8
DEFAULT_WAKE_COMMITS = 16  # the default auto_compact.min_small_files
DEFAULT_MIN_GAP_S = 0.2
THREAD_NAME = "flightsrv-maintenance"


@dataclass
class RunRecord:
    """One task run, as the metrics see it: status is ``ok`` (a version committed),
    ``noop`` (nothing left to do when it ran: a racing writer got there first) or
    ``failed``."""

    task: str
    table: str
    status: str
    seconds: float
    outcome: TaskOutcome | None = None
    error: str | None = None


class MaintenanceScheduler:
    def __init__(self, warehouse, *, interval_s: float = DEFAULT_INTERVAL_S,
                 bytes_per_s: int = DEFAULT_BYTES_PER_S, yield_s: float = DEFAULT_YIELD_S,
                 busy: Callable[[], bool] | None = None, tasks=None,
                 sweep_tables: int = DEFAULT_SWEEP_TABLES,
                 max_runs_per_tick: int = DEFAULT_MAX_RUNS_PER_TICK,
                 failure_backoff_ticks: int = 3,
                 wake_commits: int = DEFAULT_WAKE_COMMITS,
                 min_gap_s: float = DEFAULT_MIN_GAP_S,
                 on_run: Callable[[RunRecord], None] | None = None,
                 on_tick: Callable[[int], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        if interval_s <= 0 or bytes_per_s <= 0:
            raise ValueError("interval_s and bytes_per_s must be positive")
        self.warehouse = warehouse
        self.interval_s = float(interval_s)
        self.bytes_per_s = int(bytes_per_s)
        self.yield_s = float(yield_s)
        self.busy = busy or (lambda: False)
        self.tasks = tasks  # None: the registry (auto.TASKS) as it is at each tick
        self.sweep_tables = max(0, int(sweep_tables))
        self.max_runs_per_tick = max(1, int(max_runs_per_tick))
        self.failure_backoff_ticks = max(0, int(failure_backoff_ticks))
        self.wake_commits = max(0, int(wake_commits))
        self.min_gap_s = max(0.0, float(min_gap_s))
        self._now = False  # tick_now(): the next tick skips min_gap_s
        self._last_tick_end = monotonic() - self.min_gap_s
        self.on_run = on_run
        self.on_tick = on_tick
        self._mono = monotonic
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self.ticks = 0
        # table -> commits since the last tick; bounded by the table count
        self._dirty: OrderedDict[str, int] = OrderedDict()
        self._dirty_lock = threading.Lock()
        self._seen: dict[str, int] = {}  # table -> head version last examined
        self._backoff: dict[str, int] = {}  # table -> tick before which it is skipped
        self._cursor = 0
        self._debt = 0.0  # bytes charged and not yet paid back by time
        self._debt_at = monotonic()
        self._thread: threading.Thread | None = None
        self._unsubscribe = telemetry.subscribe(self._on_event)

    # -- events ---------------------------------------------------------------------------
    def _on_event(self, event: str, fields: dict) -> None:
        if event != "commit" or threading.current_thread().name == THREAD_NAME:
            return
        name = fields.get("table")
        # a commit that may leave work (a small file, a DV object) counts toward an early
        # wake; CREATE and DROP leave none
        work = fields.get("operation") not in ("create", "drop")
        if isinstance(name, str):
            with self._dirty_lock:
                n = self._dirty[name] = self._dirty.get(name, 0) + work
                while len(self._dirty) > 10_000:  # names of tables; a bound all the same
                    self._dirty.popitem(last=False)
            if work and n == self.wake_commits:
                self._wake.set()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> MaintenanceScheduler:
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()
        log.info("auto maintenance started", extra={"fields": {
            "event": "maintenance_start", "interval_s": self.interval_s,
            "bytes_per_s": self.bytes_per_s, "yield_s": self.yield_s,
            "wake_commits": self.wake_commits, "min_gap_s": self.min_gap_s}})
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        self._unsubscribe()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def tick_now(self) -> None:
        """Start the next tick now instead of at the end of the interval."""
        self._now = True
        self._wake.set()

    def wait_ticks(self, n: int = 1, timeout: float = 60.0) -> bool:
        """Wait until ``n`` more ticks have finished; False when ``timeout`` passed."""
        deadline = self._mono() + timeout
        with self._cond:
            target = self.ticks + n
            while self.ticks < target:
                left = deadline - self._mono()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            now, self._now = self._now, False
            gap = self._last_tick_end + self.min_gap_s - self._mono()
            if not now and gap > 0 and self._stop.wait(gap):
                break
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the worker outlives any error
                log.warning("auto maintenance tick failed", extra={"fields": {
                    "event": "maintenance_tick_failed", "error_class": type(exc).__name__,
                    "error": str(exc)}})
            self._last_tick_end = self._mono()

    # -- one tick -------------------------------------------------------------------------
    def _candidates(self) -> list[str]:
        with self._dirty_lock:
            names = list(self._dirty)
            self._dirty.clear()
        if self.sweep_tables:
            try:
                listed = sorted(n for n in self.warehouse.store.list_prefixes("")
                                if is_table_name(n))
            except Exception as exc:  # noqa: BLE001 - a failed listing skips the sweep
                log.warning("auto maintenance: listing tables failed", extra={"fields": {
                    "event": "maintenance_list_failed", "error_class": type(exc).__name__,
                    "error": str(exc)}})
                listed = []
            if listed:
                start = self._cursor % len(listed)
                take = min(self.sweep_tables, len(listed))
                names += [listed[(start + i) % len(listed)] for i in range(take)]
                self._cursor = (start + take) % len(listed)
        return list(dict.fromkeys(names))

    def tick(self) -> list[RunRecord]:
        """Run one tick on the calling thread (the worker calls it; so may tests)."""
        records: list[RunRecord] = []
        try:
            for name in self._candidates():
                if self._stop.is_set() or len(records) >= self.max_runs_per_tick:
                    break
                if self._backoff.get(name, -1) > self.ticks:
                    continue
                try:
                    records += self._visit(name, self.max_runs_per_tick - len(records))
                except Exception as exc:  # noqa: BLE001 - one broken table stops no other
                    # its head reads but not what deciding needs (a damaged chunk): logged,
                    # and looked at again after the back-off, like a failed run
                    self._backoff[name] = self.ticks + 1 + self.failure_backoff_ticks
                    self._seen.pop(name, None)
                    log.warning("auto maintenance skipped a table", extra={"fields": {
                        "event": "maintenance_table_failed", "table": name,
                        "error_class": type(exc).__name__, "error": str(exc)}})
        finally:
            with self._cond:
                self.ticks += 1
                self._cond.notify_all()
            if self.on_tick is not None:
                self.on_tick(self.ticks)
        return records

    def _visit(self, name: str, max_runs: int) -> list[RunRecord]:
        try:
            table = self.warehouse.handle(name)
            head = table.log.head()
        except Exception:  # noqa: BLE001 - not a (readable) table: nothing to maintain
            return []
        if head is None or head.dropped:
            self._seen.pop(name, None)
            return []
        if self._seen.get(name) == head.version:
            return []
        records: list[RunRecord] = []
        policy = AutoPolicy.of(head)
        for task, reason in due_tasks(table, head, self.tasks):
            if len(records) >= max_runs or self._stop.is_set():
                return records  # not marked seen: the rest waits for the next tick
            self._throttle()
            rec = self._run(task, table, reason, policy)
            records.append(rec)
            if rec.status == "failed":
                self._backoff[name] = self.ticks + 1 + self.failure_backoff_ticks
                self._seen.pop(name, None)
                return records
        try:
            head = table.log.head()
            self._seen[name] = head.version if head is not None else -1
        except Exception:  # noqa: BLE001 - look again next tick
            self._seen.pop(name, None)
        return records

    def _throttle(self) -> None:
        """Wait until the byte bucket is out of debt and the server is idle (at most
        ``yield_s`` for the latter)."""
        now = self._mono()
        self._debt = max(0.0, self._debt - (now - self._debt_at) * self.bytes_per_s)
        self._debt_at = now
        if self._debt > 0:
            self._stop.wait(self._debt / self.bytes_per_s)
            self._debt, self._debt_at = 0.0, self._mono()
        deadline = self._mono() + self.yield_s
        while not self._stop.is_set() and self._mono() < deadline:
            try:
                if not self.busy():
                    return
            except Exception:  # noqa: BLE001 - an unanswerable busy() means "not busy"
                return
            self._stop.wait(0.05)

    def _run(self, task, table, reason: str, policy: AutoPolicy) -> RunRecord:
        t0 = self._mono()
        try:
            outcome = task.run(table, policy)
            outcome.reason = reason
            status = "ok" if outcome.committed_version is not None else "noop"
            rec = RunRecord(task.name, table.name, status, self._mono() - t0, outcome)
            self._debt += outcome.bytes_read + outcome.bytes_written
            log.info("auto maintenance", extra={"fields": {
                "event": "maintenance_run", "table": table.name, "task": task.name,
                "trigger": TRIGGER_AUTO, "reason": reason, "status": status,
                "version": outcome.committed_version,
                "files_rewritten": outcome.files_rewritten, "files_added": outcome.files_added,
                "bytes_read": outcome.bytes_read, "bytes_written": outcome.bytes_written,
                "seconds": round(rec.seconds, 3)}})
        except Exception as exc:  # noqa: BLE001 - logged and counted; the worker goes on
            rec = RunRecord(task.name, table.name, "failed", self._mono() - t0,
                            error=f"{type(exc).__name__}: {exc}")
            log.warning("auto maintenance failed", extra={"fields": {
                "event": "maintenance_failed", "table": table.name, "task": task.name,
                "error_class": type(exc).__name__, "error": str(exc)}})
        if self.on_run is not None:
            try:
                self.on_run(rec)
            except Exception:  # noqa: BLE001 - observation never fails the run
                pass
        return rec

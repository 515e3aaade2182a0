"""Automatic maintenance: the policy that decides when a table needs work, and the tasks
that do it (docs/MAINTENANCE.md §Automatic maintenance).

Contract:

- A **task** is an object with a ``name`` (a short identifier used in metrics, logs and
  the commit summary), ``due(table, head, policy) -> str | None`` (a reason when the head
  needs this task, else None; reads only the manifest it is given, no data) and
  ``run(table, policy) -> TaskOutcome`` (does the work through the one commit loop, and
  records ``trigger: auto`` and ``task: <name>`` in the summary of any version it commits).
  ``run`` may find nothing to do (``committed_version`` None): a racing writer got there
  first. A task never retries on its own; the next tick asks ``due`` again.
- :data:`TASKS` is the default registry, in the order they run: compaction of small files,
  then DV coalescing. :func:`register_task` adds one more (e.g. a flush of inlined rows);
  a task whose ``due`` answers for a table runs before the next task is asked.
- :func:`maintain` runs one pass over one table: every due task once, in order. The
  server's worker (:mod:`flightsrv.table.maintenance.scheduler`) and writers with
  ``maintain=True`` call it. It raises what a task raised (the caller decides whether that
  is fatal: the worker logs it and goes on).
- :class:`AutoPolicy` reads the table properties ``auto_compact`` (off: no task is due),
  ``auto_compact.min_small_files``, ``auto_compact.max_bytes``,
  ``auto_compact.min_dv_objects``, plus ``compact.small_file_fraction`` and
  ``target_file_size`` for what "small" means (the same threshold ``OPTIMIZE`` uses).

Safety is the compaction's (docs/MAINTENANCE.md §The commit, and the concurrency rule):
inputs are swapped for outputs in one commit validated against the head it lands on, a
delete that committed after the read is carried over onto the outputs, and a group whose
input vanished is dropped. Automatic runs add nothing to those rules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from flightsrv.table import properties as table_properties
from flightsrv.table.manifest import Manifest

log = logging.getLogger("flightsrv.maintenance")

#: the value of ``trigger`` in the summary of a version automatic maintenance committed
TRIGGER_AUTO = "auto"


@dataclass(frozen=True)
class AutoPolicy:
    """The automatic-maintenance settings of one table version (from its properties)."""

    enabled: bool
    min_small_files: int
    max_bytes: int
    min_dv_objects: int
    small_file_bytes: int  # a data file under this size is small

    @classmethod
    def of(cls, head: Manifest) -> AutoPolicy:
        props = head.properties
        target = table_properties.value(props, "target_file_size")
        frac = table_properties.value(props, "compact.small_file_fraction")
        return cls(enabled=table_properties.value(props, "auto_compact"),
                   min_small_files=table_properties.value(props,
                                                          "auto_compact.min_small_files"),
                   max_bytes=table_properties.value(props, "auto_compact.max_bytes"),
                   min_dv_objects=table_properties.value(props,
                                                         "auto_compact.min_dv_objects"),
                   small_file_bytes=int(target * frac))


@dataclass
class TaskOutcome:
    """What one task run did (the worker turns it into metrics)."""

    task: str
    table: str
    reason: str
    committed_version: int | None = None
    files_rewritten: int = 0
    files_added: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    dvs_coalesced: int = 0
    details: dict = field(default_factory=dict)


class MaintenanceTask(Protocol):
    name: str

    def due(self, table, head: Manifest, policy: AutoPolicy) -> str | None: ...

    def run(self, table, policy: AutoPolicy) -> TaskOutcome: ...


def _summary(task: str) -> dict:
    return {"trigger": TRIGGER_AUTO, "task": task}


def _outcome(task: str, table, reason: str, r) -> TaskOutcome:
    return TaskOutcome(task=task, table=table.name, reason=reason, committed_version=r.version,
                       files_rewritten=r.files_rewritten if r.version is not None else 0,
                       files_added=r.files_added if r.version is not None else 0,
                       bytes_read=r.bytes_rewritten if r.version is not None else 0,
                       bytes_written=r.bytes_written if r.version is not None else 0,
                       dvs_coalesced=r.dvs_coalesced,
                       details={"groups_aborted": r.groups_aborted,
                                "deletes_carried_over": r.deletes_carried_over})


#: size tiers of automatic compaction: a small file joins a run only while it is at most
#: this many times the bytes of the smaller files already taken (see :func:`tier`)
TIER_FACTOR = 2


def tier(sizes: list[int], budget: int) -> list[int]:
    """The sizes one automatic compaction takes from ``sizes`` (small files): smallest
    first, each while it is at most :data:`TIER_FACTOR` times the sum of those taken before
    it and the sum stays within ``budget``. Files of about one size merge together; a file
    that earlier runs merged waits until the newer ones add up to half its size, so each
    byte is rewritten about log(rows) times rather than at every run (the merged file of a
    stream of tiny commits was rewritten by each run), and a read meets a few tiers of
    files plus fewer than ``min_small_files`` new ones."""
    taken: list[int] = []
    total = 0
    for size in sorted(sizes):
        if total + size > budget or (taken and size > TIER_FACTOR * total):
            break
        taken.append(size)
        total += size
    return taken


class CompactSmallFiles:
    """Bin-pack small files (the ``OPTIMIZE`` code path), size-tiered (:func:`tier`), at
    most ``auto_compact.max_bytes`` of input per run. Delete-heavy files are left to
    ``OPTIMIZE`` (only fully deleted files go along, which costs no write); DVs are left to
    :class:`CoalesceDeletionVectors`."""

    name = "compact_small_files"

    @staticmethod
    def _small(head: Manifest, policy: AutoPolicy) -> list[int]:
        return [f.size for f in head.data_files if f.size < policy.small_file_bytes]

    def due(self, table, head: Manifest, policy: AutoPolicy) -> str | None:
        small = self._small(head, policy)
        if len(small) < policy.min_small_files:
            return None
        if len(tier(small, policy.max_bytes)) < 2:  # a run must merge 2+ files
            return None
        return (f"{len(small)} small files (under {policy.small_file_bytes} bytes; "
                f"threshold {policy.min_small_files})")

    def run(self, table, policy: AutoPolicy) -> TaskOutcome:
        # the tier of the head as it is now (the head ``due`` saw may have moved): the
        # compaction takes files under the largest one's size + 1, smallest first, within
        # the tier's bytes, which are exactly the tier's files
        taken = tier(self._small(table.log.head(), policy), policy.max_bytes)
        threshold, budget = (max(taken) + 1, sum(taken)) if len(taken) >= 2 else (0, 0)
        r = table.compact(min_deleted_fraction=1.0, small_file_threshold=threshold,
                          max_input_bytes=budget, coalesce_dvs=False,
                          extra_summary=_summary(self.name), report_overdue=False)
        return _outcome(self.name, table, "small files", r)


class CoalesceDeletionVectors:
    """Gather DVs spread over ``auto_compact.min_dv_objects`` or more tombstone objects into
    one (no data file is rewritten; the bitmaps are the same)."""

    name = "coalesce_dvs"

    def due(self, table, head: Manifest, policy: AutoPolicy) -> str | None:
        objects = {f.dv_object for f in head.data_files if f.dv_object}
        if len(objects) < policy.min_dv_objects:
            return None
        return f"DVs in {len(objects)} tombstone objects (threshold {policy.min_dv_objects})"

    def run(self, table, policy: AutoPolicy) -> TaskOutcome:
        r = table.compact(min_deleted_fraction=1.0, small_file_threshold=0, coalesce_dvs=True,
                          extra_summary=_summary(self.name), report_overdue=False)
        return _outcome(self.name, table, "dv objects", r)


#: the default tasks, in the order a pass runs them (see :func:`register_task`)
TASKS: list = [CompactSmallFiles(), CoalesceDeletionVectors()]


def register_task(task, *, before: str | None = None) -> None:
    """Add ``task`` to :data:`TASKS` (before the task named ``before``, else last). A task
    of the same name is replaced."""
    names = [t.name for t in TASKS]
    if task.name in names:
        TASKS[names.index(task.name)] = task
        return
    if before is not None and before in names:
        TASKS.insert(names.index(before), task)
    else:
        TASKS.append(task)


def due_tasks(table, head: Manifest, tasks=None) -> list[tuple[object, str]]:
    """The tasks ``head`` needs, with their reasons (none when ``auto_compact`` is off or
    the table is dropped)."""
    if head is None or head.dropped:
        return []
    policy = AutoPolicy.of(head)
    if not policy.enabled:
        return []
    out = []
    for task in (TASKS if tasks is None else tasks):
        reason = task.due(table, head, policy)
        if reason:
            out.append((task, reason))
    return out


def maintain(table, tasks=None) -> list[TaskOutcome]:
    """One maintenance pass over ``table``: each due task runs once, in order (each asked
    against the head as the previous task left it). Returns what ran."""
    done: list[TaskOutcome] = []
    for task in (TASKS if tasks is None else tasks):
        head = table.log.head()
        if head is None or head.dropped:
            break
        policy = AutoPolicy.of(head)
        if not policy.enabled:
            break
        reason = task.due(table, head, policy)
        if not reason:
            continue
        outcome = task.run(table, policy)
        outcome.reason = reason
        done.append(outcome)
        log.info("auto maintenance", extra={
            "table": table.name, "task": task.name, "reason": reason,
            "version": outcome.committed_version, "files_rewritten": outcome.files_rewritten,
            "files_added": outcome.files_added})
    return done

"""Group commit: concurrent appends to one table share one conditional write.

Every INSERT / ingest first writes its data files (in parallel, no coordination), then hands
them to :meth:`GroupCommitter.commit_files`. Per table, one caller at a time is the
*leader*: it takes every submission waiting at that moment and commits all their files with
one ``Table.commit_files`` call, which is one mutator through the one commit loop
(``flightsrv.table.commit``), re-run on conflicts like any other. Submissions that arrive
while the leader's write is in flight queue up; when it finishes, the first of them becomes
the next leader and commits the whole queue. So with N writers racing on one table the
store sees far fewer conditional manifest writes than N, and none of them loses its place
by retrying against the others. A group is released (its members return, the next leader
starts) the moment its version lands; the leader itself then moves the pointer, a hint that
the next commit's head read rolls forward past, unless it handed over to a queued group and
the pointer is within ``POINTER_LAG`` versions: that group's commit moves it further.

Contract:

- Every submission's files are in exactly one committed version, or its caller gets the
  exception the commit raised (the whole group shares the outcome).
- Submissions written against different table schemas are never grouped together; each
  group's commit re-checks the schema it was written against (``SchemaMismatch`` if the
  table changed meanwhile).
- Appends commute, so grouping changes version numbers, never contents. Deletes, DDL and
  maintenance are not grouped: each stays its own mutator and its own version.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Submission:
    files: list
    nbytes: int
    schema_key: str
    schema: dict
    table_uuid: str | None  # the table the files were written for
    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # this submission's caller must lead the next group
    finished: bool = False
    manifest: Any = None
    error: BaseException | None = None


@dataclass
class _Queue:
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiting: list = field(default_factory=list)
    busy: bool = False  # a leader is committing
    pointer_at: int | None = None  # the last version whose pointer write was not skipped
    owed: Any = None  # a landed version whose pointer write was left to a later group


#: a leader handing over to a queued group leaves the pointer write to it, while the pointer
#: stays within this many versions of this process's commits (the pointer is a hint, §3)
POINTER_LAG = 4


class GroupCommitter:
    """Batches concurrent append commits per table (see the module doc)."""

    def __init__(self, max_group: int = 256):
        self.max_group = max_group
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._lock = threading.Lock()
        self.commits = 0  # conditional commits made (for tests and metrics)
        self.submissions = 0

    def _queue(self, table) -> _Queue:
        key = (table.warehouse_uri, table.name)
        with self._lock:
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _Queue()
            return q

    def waiting(self, table) -> int:
        """Submissions queued behind the current leader (for tests)."""
        q = self._queue(table)
        with q.lock:
            return len(q.waiting)

    def append(self, table, data, *, expected_uuid: str | None = None, written_for=None):
        """Write ``data`` as new files of ``table`` and commit them with whatever else is
        waiting. Returns the committed manifest (None when ``data`` had no rows).
        ``expected_uuid``, ``written_for``: see ``Table.append``."""
        from flightsrv.table.table import check_incarnation

        head = table.head() if written_for is None else written_for
        check_incarnation(table.head() if written_for is not None else head, expected_uuid,
                          table.name)
        table.ensure_writable()
        files, nbytes, _rows = table.write_files(data, head=head)
        if not files:
            return None
        return self.commit_files(table, files, nbytes, head.schema, head.table_uuid)

    def commit_files(self, table, files: list, nbytes: int, schema: dict,
                     table_uuid: str | None = None):
        key = json.dumps([table_uuid, schema], sort_keys=True)
        sub = _Submission(list(files), nbytes, key, schema, table_uuid)
        q = self._queue(table)
        with q.lock:
            self.submissions += 1
            q.waiting.append(sub)
            if not q.busy:
                q.busy = True
                sub.lead = True
        if not sub.lead:
            sub.wake.wait()  # until our group committed, or we are to lead the next one
        if not sub.finished:
            self._lead(table, q)  # a leader is always the queue's first: it commits itself
        if sub.error is not None:
            raise sub.error
        return sub.manifest

    def _lead(self, table, q: _Queue) -> None:
        with q.lock:
            first = q.waiting[0]
            group = [s for s in q.waiting if s.schema_key == first.schema_key][: self.max_group]
            q.waiting = [s for s in q.waiting if s not in group]
        released = False

        owed = None

        def release(manifest, error) -> bool:
            """Hand the result to the group and the lead to the next submission: as soon
            as the version has landed (the pointer is a hint and the after-commit hooks
            are best effort, so waiters never wait for them), or when the commit failed.
            The next leader is woken first: it commits while the members wake up. Returns
            whether this leader moves the pointer: not when a queued group takes over and
            the pointer is within POINTER_LAG versions (that group's commit moves it past
            this one; a failed group with nobody after it moves it to what was left)."""
            nonlocal released, owed
            released = True
            if manifest is not None:
                with self._lock:
                    self.commits += 1
            advance = True
            with q.lock:
                nxt = q.waiting[0] if q.waiting else None
                if nxt is None:
                    q.busy = False
                else:
                    nxt.lead = True
                if manifest is not None:
                    if nxt is not None and q.pointer_at is not None and \
                            manifest.version - q.pointer_at < POINTER_LAG:
                        advance = False
                        q.owed = manifest
                    else:
                        q.pointer_at, q.owed = manifest.version, None
                elif nxt is None:
                    owed, q.owed = q.owed, None
            if nxt is not None:
                nxt.wake.set()  # wake it as the next leader
            for s in group:
                s.manifest, s.error, s.finished = manifest, error, True
                s.wake.set()
            return advance

        try:
            files = [f for s in group for f in s.files]
            extra = {"bytes_added": sum(s.nbytes for s in group)}
            if len(group) > 1:
                extra["group_commit"] = len(group)
            manifest = table.commit_files(files, operation="append", extra=extra,
                                          expected_schema=first.schema,
                                          expected_uuid=first.table_uuid,
                                          on_commit=lambda m: release(m, None))
            if not released:  # committed without the callback (no version made)
                release(manifest, None)
        except BaseException as exc:  # noqa: BLE001 - handed to every member of the group
            if not released:
                release(None, exc)
        if owed is not None:  # a skipped pointer write no later group will make
            table.log.advance_pointer(owed)


__all__ = ["GroupCommitter"]

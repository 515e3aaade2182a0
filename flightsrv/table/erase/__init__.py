"""Hard erasure: physically remove rows from data files (docs/ERASURE.md).

Layers, top to bottom:

- **Who decides which rows.** ``purge(table)`` (``Table.purge``, SQL ``PURGE t``): every row
  already marked deleted (DVs, deleted row groups). A ``DELETE`` with ``delete_mode =
  'splice'`` (SQL, ``Table.delete(where, mode="splice")``, Spark): the stored rows DuckDB
  finds for its WHERE (:mod:`flightsrv.engine.dml`). Both build a *positions plan* on a
  pinned snapshot.
- **The physical splice.** ``splice_positions(table, snapshot, plan)`` takes an
  already-decided plan ``{data file path: BitMap64 of row positions}`` and removes those rows
  (plus the dead rows of every row group it re-encodes anyway) in one commit. Per affected
  file F:
  1. build a new object under a new ``data/YYYY/MM/DD/HH/<id>.parquet`` key (``replace``):
     - **splice** (``flightsrv.table.splice``): re-encode only the touched row groups, copy
       every other byte inside the store (UploadPartCopy / ``copy_file_range``), new footer;
     - **rewrite**: read F's surviving rows and write them with ``DataFileWriter``, when the
       store needs equal part sizes (R2), the file is smaller than two minimum parts, or the
       splice engine refuses the file (``SpliceUnsupported``);
     - **drop**: no row survives, nothing is written;
  2. one commit swaps F for its replacement (``commit``). The mutator re-validates against
     each head: F gone from the head (compacted, spliced by someone else) → what was written
     is deleted and ``StalePlan`` is raised (``erase_positions`` re-plans on a new snapshot);
     rows deleted in the head but not removed (a concurrent DV delete) are carried to the new
     file as a DV at their shifted positions, so no delete is lost and no deleted row comes
     back.
- **Completion and proof** (``complete``, over ``flightsrv.table.erasure_check``): older
  versions still reach F. With ``expire=True`` the versions that reach an erased object or
  carry request text are expired, the objects deleted, and stale unreferenced objects swept;
  then the store is re-read and the result says ``erased`` only if nothing holding the rows is
  left. A certificate (``flightsrv.table.certificate``) records it under ``_erasures/``.

The commit summary names the path taken per file and the bytes downloaded, uploaded and
copied. The request is recorded only as its keyed fingerprint (``request_fingerprint``,
``flightsrv.table.fingerprint``), never as text or an unkeyed hash.

The package, one purpose per module:

- ``results``: what an erasure returns (``FileErasure``, ``ErasedObject``, ``PurgeResult``,
  ``ErasedCount``);
- ``replace``: the replacement object for one file (splice, rewrite or drop), written before
  the commit and discarded if it does not land;
- ``commit``: a positions plan → targets, and the commit mutator (``StalePlan``,
  ``MAX_REPLANS``);
- ``complete``: history, covered deletes, expire, sweep, verify, certify (the orphan grace);
- this module: the entry points ``splice_positions``, ``erase_positions``, ``purge``.
"""

from __future__ import annotations

from typing import Callable

from flightsrv.errors import CommitConflict, CorruptObject, ObjectNotFound
from flightsrv.table.commit import require_table
from flightsrv.table.deletes import dead_positions
from flightsrv.table.erase.commit import (  # noqa: F401
    MAX_REPLANS,
    StalePlan,
    _mutator,
    _Replan,
    _targets,
)
from flightsrv.table.erase.complete import (  # noqa: F401
    DEFAULT_ORPHAN_GRACE,
    ORPHAN_GRACE_PROPERTY,
    _finish,
    _history,
)
from flightsrv.table.erase.replace import _discard, _prepare, Replacement
from flightsrv.table.erase.results import (  # noqa: F401
    ErasedCount,
    ErasedObject,
    FileErasure,
    PurgeResult,
)

__all__ = ["ErasedCount", "ErasedObject", "FileErasure", "PurgeResult", "StalePlan",
           "erase_positions", "purge", "splice_positions"]


# -- entry points --------------------------------------------------------------------


def splice_positions(table, snapshot, plan: dict, *, fingerprint: str | None = None,
                     operation: str = "splice_delete", expire: bool = False, grace=None,
                     progress=None, certificate: bool | None = None, source: str = "python",
                     may_hold: Callable | None = None, all_dead: bool = False,
                     strict: bool = False) -> PurgeResult:
    """Physically delete already-decided rows in one commit, then complete and verify.

    Contract:

    - ``snapshot`` is the pinned ``Snapshot`` the rows were found on; ``plan`` maps the path
      of a data file *of that snapshot* to the row positions (0-based, physical: the file's
      own row order, counting rows a DV already hides) to remove, as a ``BitMap64`` (or
      anything ``BitMap64()`` accepts). Positions past the file's end (up to 2**64 - 1),
      positions that are not row numbers (negative, not integers), or a path not in the
      snapshot, raise ``ConfigurationError`` before anything is written.
    - Every planned row leaves the bytes, whether it was live or already deleted. So do the
      already-deleted rows of each row group that is re-encoded; other row groups keep their
      DV. ``rows_deleted`` counts the planned rows that were live in the head at commit time
      (a row deleted concurrently is not counted twice); ``rows_removed`` counts every row
      whose bytes left.
    - One commit (``operation``), whose summary records ``fingerprint`` as
      ``request_fingerprint`` and never any text. Deletes that land on a target file between
      ``snapshot`` and the commit are carried over to the replacement at shifted positions.
      If a target file is no longer in the head (rewritten concurrently), the objects this
      call wrote are deleted and ``StalePlan`` is raised: the caller re-plans on a new
      snapshot (``erase_positions`` does this for a plan-building function). ``strict``
      (a statement's plan of rows it found live): so is a planned row deleted in the head
      since ``snapshot`` (an UPDATE may have moved it; its new copy must be found too).
    - An empty plan commits nothing; completion and verification still run, so a repeated
      call with ``expire=True`` finishes an earlier erasure of the same rows.
    - Then, with ``expire``: versions that reach a replaced file, an earlier copy
      (``may_hold(manifest, data_file)`` narrows which history files count; default all,
      and no flightsrv caller passes one: it may only rule out what it proves) or
      request text are expired and those objects deleted; unreferenced objects older than
      ``grace`` (default: table property ``erasure.orphan_grace``, else 1 hour) are swept.
      The store is re-read (``erasure_check.verify``): ``result.status`` is ``"erased"`` only
      when nothing that still holds the rows is stored. ``certificate`` (None: when anything
      changed) stores a record under ``_erasures/``.
    """
    try:
        return _splice_positions(table, snapshot, plan, fingerprint=fingerprint,
                                 operation=operation, expire=expire, grace=grace,
                                 progress=progress, certificate=certificate, source=source,
                                 may_hold=may_hold, all_dead=all_dead, strict=strict)
    finally:
        if progress is not None and hasattr(progress, "finish"):
            progress.finish()


def _splice_positions(table, snapshot, plan: dict, *, fingerprint, operation, expire, grace,
                      progress, certificate, source, may_hold, all_dead,
                      strict: bool = False) -> PurgeResult:
    started = table.runtime.clock.now_ms()
    targets = _targets(table, snapshot, plan)
    if progress is not None and progress.total is None:
        progress.total = len(targets) or None
    result = PurgeResult(table.name, operation, None, read_version=snapshot.version,
                         table_uuid=snapshot.manifest.table_uuid, fingerprint=fingerprint,
                         source=source, head_before=snapshot.version, started_at_ms=started)
    erased: dict[str, str] = {}
    if targets:
        prepared: list[Replacement] = []
        out: dict = {}
        extra = {"request_fingerprint": fingerprint} if fingerprint else {}
        try:
            for t in targets:
                prepared.append(_prepare(table, snapshot, t))
                if progress is not None:
                    r = prepared[-1].report
                    progress.advance(1, f"{r.path} {r.old_path}")
            # fold: no chunk may keep the replaced file's entry (its statistics) behind the
            # root's overlay
            committed = table.commit(_mutator(table, snapshot, prepared, operation, extra,
                                              out, strict=strict), fold=True)
        except _Replan:
            _discard(table, prepared)
            raise StalePlan("a data file of the erasure plan was rewritten concurrently",
                            table=table.name, read_version=snapshot.version) from None
        except ObjectNotFound:
            _discard(table, prepared)
            if _left_head(table, targets):  # another erasure replaced it, then deleted it
                raise StalePlan("a data file of the erasure plan was erased concurrently",
                                table=table.name, read_version=snapshot.version) from None
            raise
        except BaseException:
            _discard(table, prepared)
            raise
        result.version = committed.version
        result.committed_at_ms = committed.created_at_ms
        result.head_before = committed.version - 1
        result.rows_deleted = out["newly_deleted"]
        result.rows_removed = out["rows_removed"]
        result.files = [p.report for p in prepared]
        erased.update({k: "dv" for k in out["old_dv_objects"]})
        erased.update({p.target.file.path: "data" for p in prepared})
        before = committed.version
    else:
        head = require_table(table.log.head(), table.name)
        result.head_before = head.version
        before = head.version + 1
    damaged = None
    try:
        erased = {**_history(table, before, may_hold), **erased}
    except CorruptObject as exc:  # an old version; the commit stands: reported, pending
        damaged = exc
    return _finish(table, result, erased, expire=expire, grace=grace, all_dead=all_dead,
                   certificate=certificate, damaged=damaged)


def _left_head(table, targets) -> bool:
    """Whether a target's data file is no longer in the table's head."""
    head = table.log.head()
    live = {f.path for f in head.data_files} if head is not None else set()
    return any(t.file.path not in live for t in targets)


def erase_positions(table, find: Callable, **kw) -> PurgeResult:
    """``splice_positions`` on a plan ``find(snapshot)`` builds, re-planned on a new
    snapshot (at most ``MAX_REPLANS`` times) while target files keep being rewritten."""
    kw = {"fingerprint": None, "operation": "splice_delete", "expire": False, "grace": None,
          "progress": None, "certificate": None, "source": "python", "may_hold": None,
          "all_dead": False, **kw}
    progress = kw["progress"]
    try:
        for _ in range(MAX_REPLANS):
            snap = table.snapshot()
            try:
                plan = find(snap)
            except ObjectNotFound:
                head = table.log.head()
                if head is not None and head.version != snap.version:
                    continue  # its deletion vectors went with a newer version: plan again
                raise
            try:
                return _splice_positions(table, snap, plan, **kw)
            except StalePlan:
                continue
    finally:
        if progress is not None and hasattr(progress, "finish"):
            progress.finish()
    raise CommitConflict("erasure re-planned too often: its files keep being rewritten",
                         table=table.name, operation=kw.get("operation", "splice_delete"),
                         attempts=MAX_REPLANS)


def purge(table, *, expire: bool = False, grace=None, progress=None,
          certificate: bool | None = None, source: str = "python") -> PurgeResult:
    """Physically remove every row already marked deleted (DVs, deleted row groups).

    With ``expire`` the table reaches the erased state from any starting state: the versions
    that reach a purged file, an earlier copy of any row (every data file older versions
    reference and the head does not) or request text are expired, their objects deleted,
    stale unreferenced objects swept, and the store re-read; see ``splice_positions``.
    Running it again when nothing is left to purge only re-verifies."""

    def find(snap) -> dict:
        return {f.path: dead_positions(table, f)
                for f in snap.manifest.data_files if f.dv is not None or f.deleted_row_groups}

    return erase_positions(table, find, operation="purge", expire=expire, grace=grace,
                           progress=progress, certificate=certificate, source=source,
                           all_dead=True)

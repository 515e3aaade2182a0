"""Vacuum: delete objects no retained version references (and, for the warehouse, prefixes that
hold no table)."""

from __future__ import annotations

from flightsrv.errors import CorruptObject, ObjectNotFound, StoreError
from flightsrv.table.maintenance.common import (
    DEFAULT_GRACE,
    VACUUM_PREFIXES,
    _overdue,
    _progress_finish,
    _progress_start,
    _seconds,
    log,
)
from flightsrv.table.maintenance.results import OrphanVacuumResult, VacuumResult
from flightsrv.table.manifest import Manifest, manifest_key

# ---------------------------------------------------------------------------------------
# vacuum


def _kind(key: str) -> str:
    return key.split("/", 1)[0]


def incarnation(table, head: Manifest) -> tuple[int, int | None]:
    """(first version of the head's incarnation, when the previous incarnation ended — was
    dropped or replaced — in ms, or None). A table dropped and created again, or replaced
    (CREATE OR REPLACE), is a new incarnation (a new ``table_uuid``); a dropped head is its
    own incarnation, holding no data."""
    start, first, v = head.version, head, head.version - 1
    while v >= 0:
        m = table.log.try_load(v)
        if m is None or m.table_uuid != head.table_uuid or m.dropped:
            break
        start, first, v = v, m, v - 1
    if head.dropped:
        return head.version, head.created_at_ms
    prev = table.log.try_load(start - 1) if start > 0 else None
    if prev is None:
        return start, None
    # a DROP ended the previous table; else the replacing commit itself did
    return start, (prev.created_at_ms if prev.dropped else first.created_at_ms)


def _retained_refs(table, grace_s: float = 0.0,
                   expired: frozenset[int] = frozenset()) -> tuple[set[str], int | None, int]:
    """Objects referenced by any retained version (oldest listed .. head), and that range.

    Versions of a dropped incarnation (before the last DROP) stop counting once the DROP is
    older than ``grace_s``: SQL can no longer reach them (time travel never crosses a DROP)
    and a reader pinned before the DROP has had the grace period to finish. ``expired``:
    versions counted as gone although their manifests are still listed (a dry run's
    expiry, which deletes nothing); never the head."""
    listed = table.log.versions()
    head = table.log.head()
    if head is None:
        return set(), None, -1
    _check_listing(table, listed, head.version)
    versions = [v for v in listed if v not in expired]
    start, dropped_ms = incarnation(table, head)
    now = table.runtime.clock.now_ms()
    old_gone = dropped_ms is not None and now - dropped_ms >= grace_s * 1000
    refs: set[str] = set()
    lo = versions[0] if versions else head.version
    for v in range(lo, head.version + 1):
        if (v < start and old_gone) or (v in expired and v != head.version):
            continue
        m = head if v == head.version else table.log.try_load(v)
        if m is not None:  # missing below the head: expired meanwhile
            refs |= m.referenced_keys()
    return refs, lo, head.version


def _check_listing(table, listed: list[int], head: int) -> None:
    """Refuse to vacuum on a manifest listing that cannot be the retained versions: what it
    does not show, vacuum would take for expired and delete the objects only those versions
    reference (time travel's). The listing was made before the head was read, so versions
    committed since may be missing from its end, never from its start or middle: expiry
    deletes oldest first, so the retained versions are one run ending at the head."""
    if head > 0 and (not listed or listed[0] > head):
        raise StoreError("the manifest listing does not show the head version: vacuum deletes "
                         "nothing (run it again)", table=table.name, head=head,
                         listed=len(listed))
    above = [v for v in listed if v > head]
    run = [v for v in listed if v <= head]
    have = set(run)
    missing = next((v for v in range(run[0], run[-1] + 1) if v not in have), None) \
        if run else None
    if above or missing is not None:
        gap = missing if missing is not None else head + 1
        raise CorruptObject("a manifest is missing from the version chain (a later version is "
                            "stored): vacuum deletes nothing; restore it from a backup",
                            table=table.name, key=f"{table.name}/{manifest_key(gap)}",
                            version=gap, head=head)


def _expire_dropped(table, grace_s: float, dry_run: bool) -> list[int]:
    """Delete the manifests of dropped incarnations once their DROP is older than the grace
    (oldest first, so the retained versions stay a contiguous run ending at the head)."""
    head = table.log.head()
    if head is None:
        return []
    start, dropped_ms = incarnation(table, head)
    now = table.runtime.clock.now_ms()
    if dropped_ms is None or now - dropped_ms < grace_s * 1000:
        return []
    gone = [v for v in table.log.versions() if v < start]
    if not dry_run:
        for v in gone:
            table.store.delete(manifest_key(v))
    return gone


def _scan_orphans(table, grace_s: float, expired: frozenset[int] = frozenset()):
    """(old orphans, young orphans, old uploads, refs, oldest, head) — listing first;
    ``expired`` as in ``_retained_refs``."""
    from flightsrv.table.mirror import MIRROR_PREFIXES
    from flightsrv.table.mirror import referenced as mirror_refs

    now = table.runtime.clock.now_ms()
    limit = now - int(grace_s * 1000)
    listing = [m for p in VACUUM_PREFIXES + MIRROR_PREFIXES for m in table.store.list(p)]
    uploads = list(table.store.list_multipart(""))
    # AFTER listing: sees commits that raced it
    refs, lo, hv = _retained_refs(table, grace_s, expired)
    if any(m.key.startswith(MIRROR_PREFIXES) for m in listing):
        refs |= mirror_refs(table)  # also after listing: a publish that raced it is seen
    old, young = [], []
    for m in listing:
        if m.key in refs:
            continue
        # unknown (0) or future modification times count as young
        (old if 0 < m.last_modified_ms <= limit else young).append((m, now))
    old_uploads = [(u, now) for u in uploads if 0 < u.initiated_ms <= limit]
    return old, young, old_uploads, refs, lo, hv


def _abort_upload(store, u, now: int, result, dry_run: bool, progress) -> None:
    """Abort one abandoned multipart upload (unless ``dry_run``) and record it."""
    if not dry_run:
        try:
            store.abort_multipart(u.key, u.upload_id)
        except ObjectNotFound:
            pass  # aborted or completed meanwhile
    result.uploads.append({"key": u.key, "upload_id": u.upload_id,
                           "age_s": (now - u.initiated_ms) / 1000})
    if progress is not None:
        progress.advance(1)


def vacuum(table, *, grace=DEFAULT_GRACE, dry_run: bool = False, progress=None,
           expired=()) -> VacuumResult:
    """Delete unreferenced objects older than ``grace`` and abort stale multipart uploads.

    Only keys under ``VACUUM_PREFIXES`` are candidates; manifests are removed by
    ``expire_snapshots``, never here. An object any retained version references is never
    deleted; an unreferenced object younger than ``grace`` is kept (a writer may be about to
    commit it), so ``grace`` must exceed the longest write-to-commit time of any writer.

    ``expired`` (dry runs only): versions to count as expired although their manifests
    still exist, the ``expired_versions`` of an ``expire_snapshots(dry_run=True)`` run just
    before, so that a dry ``VACUUM t RETAIN n VERSIONS`` reports what the real one would
    delete."""
    expired = frozenset(expired)
    if expired and not dry_run:
        from flightsrv.errors import ConfigurationError

        raise ConfigurationError("vacuum(expired=...) is for a dry run; expire the versions "
                                 "first", table=table.name)
    grace_s = _seconds(grace, "grace", table)
    old, young, uploads, refs, lo, hv = _scan_orphans(table, grace_s, expired)
    if old and not dry_run:
        # re-read the head: a commit after our reference read may name a listed object
        head = table.log.head()
        if head is not None and head.version != hv:
            for v in range(hv + 1, head.version + 1):
                m = table.log.try_load(v)
                if m is not None:
                    refs |= m.referenced_keys()
            old = [(m, now) for m, now in old if m.key not in refs]
    result = VacuumResult(table=table.name, dry_run=dry_run, grace_seconds=grace_s,
                          oldest_retained=lo, head_version=hv, referenced_objects=len(refs),
                          kept_young=len(young), kept_young_bytes=sum(m.size for m, _ in young))
    _progress_start(progress, len(old) + len(uploads) or None, " objects")
    try:
        for m, now in old:
            if not dry_run:
                table.store.delete(m.key)
            result.objects.append({"key": m.key, "kind": _kind(m.key), "size": m.size,
                                   "age_s": (now - m.last_modified_ms) / 1000})
            if progress is not None:
                progress.advance(1)
        for u, now in uploads:
            _abort_upload(table.store, u, now, result, dry_run, progress)
    finally:
        _progress_finish(progress)
    result.dropped_versions = _expire_dropped(table, grace_s, dry_run)
    head = table.log.head()
    result.erasures_overdue = (_overdue(table, result) if head is not None and not head.dropped
                               else [])
    log.info("vacuum", extra={"table": table.name, "dry_run": dry_run,
                              "objects": result.deleted_objects, "bytes": result.deleted_bytes})
    return result


def vacuum_orphan_prefixes(warehouse, *, grace=DEFAULT_GRACE, dry_run: bool = False,
                           progress=None) -> OrphanVacuumResult:
    """Delete the objects that prefixes *without a table* hold: a job that was creating table
    ``t`` and failed (or was killed) before its create committed leaves data files under
    ``t/data/`` that no table references and no table-level vacuum reaches.

    A prefix counts only when it is a valid table name and has no manifest at all (a dropped
    table still has its log: its own ``vacuum`` applies). Only keys under the table object
    prefixes (``data/``, ``tombstone/``) and unfinished multipart uploads are candidates,
    and only when older than ``grace``: a create in progress writes its files before its
    commit creates the table, so ``grace`` must exceed the longest write-to-commit time of
    any writer. Each prefix is checked again for a table right before its objects go.

    On a local store it also removes the temp files of killed writers older than ``grace``
    (``LocalStore.sweep_temp``); lock files stay."""
    from flightsrv.table.names import is_table_name

    grace_s = _seconds(grace, "grace", warehouse)
    if not dry_run:
        warehouse.ensure_writable()
    store = warehouse.store
    now = warehouse.runtime.clock.now_ms()
    limit = now - int(grace_s * 1000)
    result = OrphanVacuumResult(dry_run=dry_run, grace_seconds=grace_s)
    plan: list[tuple[str, list, list]] = []
    for name in store.list_prefixes(""):
        if not is_table_name(name) or _has_log(store, name):
            continue
        result.prefixes_checked += 1
        old, uploads = [], []
        for p in VACUUM_PREFIXES:
            for m in store.list(f"{name}/{p}"):
                if 0 < m.last_modified_ms <= limit:
                    old.append(m)
                else:  # unknown (0) or future modification times count as young
                    result.kept_young += 1
                    result.kept_young_bytes += m.size
        uploads = [u for u in store.list_multipart(f"{name}/") if 0 < u.initiated_ms <= limit]
        if old or uploads:
            plan.append((name, old, uploads))
    _progress_start(progress, sum(len(o) + len(u) for _, o, u in plan) or None, " objects")
    try:
        for name, old, uploads in plan:
            if not dry_run and _has_log(store, name):
                continue  # a create committed meanwhile: its files are a table's now
            result.prefixes.append(name)
            for m in old:
                if not dry_run:
                    store.delete(m.key)
                result.objects.append({"key": m.key, "kind": _kind(m.key.split("/", 1)[1]),
                                       "size": m.size,
                                       "age_s": (now - m.last_modified_ms) / 1000})
                if progress is not None:
                    progress.advance(1)
            for u in uploads:
                _abort_upload(store, u, now, result, dry_run, progress)
    finally:
        _progress_finish(progress)
    sweep = getattr(store, "sweep_temp", None)  # the local store's; S3 has no temp files
    if sweep is not None:
        result.temp_files, result.temp_bytes = sweep(limit, dry_run=dry_run)
    log.info("vacuum_orphans", extra={"dry_run": dry_run, "prefixes": len(result.prefixes),
                                      "objects": result.deleted_objects,
                                      "bytes": result.deleted_bytes})
    return result


def _has_log(store, name: str) -> bool:
    """Whether prefix ``name`` holds a table's log (a pointer or any manifest)."""
    from flightsrv.table.manifest import POINTER_KEY

    try:
        store.head(f"{name}/{POINTER_KEY}")
        return True
    except ObjectNotFound:
        pass
    return next(iter(store.list(f"{name}/manifest/")), None) is not None

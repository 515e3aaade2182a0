"""Snapshot expiry: delete manifests below a cutoff, keeping a contiguous suffix ending at the
head."""

from __future__ import annotations

import datetime as dt

from flightsrv.errors import ConfigurationError
from flightsrv.table.maintenance.common import log
from flightsrv.table.maintenance.results import ExpireResult
from flightsrv.table.manifest import manifest_key

# ---------------------------------------------------------------------------------------
# expiry


def _forget(tlog, version: int) -> None:
    """Drop an expired manifest from this process's TableLog cache, so time travel to it
    fails here at once (other processes' caches forget it as they evict)."""
    cache, lock = getattr(tlog, "_cache", None), getattr(tlog, "_lock", None)
    if cache is not None and lock is not None:
        with lock:
            cache.pop(version, None)


def _older_than_ms(table, older_than) -> int | None:
    from flightsrv.table.timestamps import parse_timestamp_ms

    if older_than is None:
        return None
    if isinstance(older_than, dt.timedelta):
        return table.runtime.clock.now_ms() - int(older_than.total_seconds() * 1000)
    return parse_timestamp_ms(older_than)


def expire_snapshots(table, *, older_than=None, retain_last: int = 1,
                     dry_run: bool = False) -> ExpireResult:
    """Delete the manifests of versions outside the retention window.

    Kept: the last ``retain_last`` versions (at least 1, so never the head) and, when
    ``older_than`` is given (datetime, ISO string, epoch ms, or a timedelta before now), every
    version committed at or after that time. Manifests are deleted oldest first, so the
    retained versions always form a contiguous run ending at the head."""
    if not isinstance(retain_last, int) or retain_last < 1:
        raise ConfigurationError("retain_last must be an integer >= 1 (the head is always "
                                 "retained)", table=table.name, retain_last=retain_last)
    cutoff_ms = _older_than_ms(table, older_than)
    head = table.head()
    cutoff = head.version - retain_last + 1
    if not dry_run:
        # the pointer must name a retained version: move it to the head first, and never
        # expire past wherever it is (a failed move leaves it lagging)
        table.log.advance_pointer(head)
        ptr, _ = table.log.read_pointer()
        if ptr is None or ptr.table_uuid != head.table_uuid:
            cutoff = 0  # readers without a usable pointer start from v0: keep everything
        else:
            cutoff = min(cutoff, ptr.version)
    listed = table.log.versions()
    versions = [v for v in listed if v < cutoff]
    if cutoff_ms is not None:
        # created_at is non-decreasing in version order: stop at the first young version
        for v in versions:
            m = table.log.try_load(v)
            if m is not None and m.created_at_ms >= cutoff_ms:
                cutoff = v
                break
        versions = [v for v in versions if v < cutoff]
    result = ExpireResult(table=table.name, dry_run=dry_run, head_version=head.version,
                          oldest_retained=min(v for v in listed + [head.version] if v >= cutoff),
                          expired_versions=versions)
    if dry_run:
        return result
    if versions:
        # a mirror publication queued by a commit of this very operation (a purge's splice)
        # reads the manifests about to go: let it land first (bounded), or it fails half way
        # and leaves a mirror naming the files the purge is erasing
        from flightsrv.table.mirror import publisher

        publisher.wait_idle(60)
    for v in versions:  # oldest first
        table.store.delete(manifest_key(v))
        _forget(table.log, v)
        result.manifests_deleted += 1
    oldest = table.log.oldest_readable()
    result.oldest_retained = head.version if oldest is None else oldest
    if versions:
        from flightsrv.errors import FlightsrvError
        from flightsrv.table.mirror import expire as expire_mirrors

        try:
            result.mirrors = expire_mirrors(table)
        except FlightsrvError as exc:  # the expiry stands; the next publish catches up
            result.mirror_error = str(exc)
            log.warning("expiring the mirrors failed", extra={"table": table.name,
                                                              "error": str(exc)})
    log.info("expire", extra={"table": table.name, "expired": len(versions),
                              "oldest_retained": result.oldest_retained})
    return result

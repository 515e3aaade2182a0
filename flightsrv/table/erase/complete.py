"""Completing an erasure, then proving and recording it (``flightsrv.table.erasure_check``,
``flightsrv.table.certificate``).

Older versions still reach a replaced file. ``_history`` adds the earlier copies of erased
rows (data files retained versions reference and the head does not); ``_covers`` names the
retained deletes whose rows were erased; ``_finish`` expires (with ``expire``) the versions
that reach an erased object or carry request text, deletes those objects and sweeps
unreferenced ones older than the grace (``_grace_ms``), re-reads the store, and stores a
certificate under ``_erasures/``.
"""

from __future__ import annotations

import datetime as dt
import logging

from flightsrv.errors import ConfigurationError, CorruptObject
from flightsrv.table import erasure_check as check
from flightsrv.table.commit import require_table
from flightsrv.table.erase.results import ErasedObject, PurgeResult
from flightsrv.table.manifest import Manifest

log = logging.getLogger("flightsrv.erase")

#: Unreferenced objects younger than this may be writes in flight: an erasure with expire
#: leaves them (and reports them). Table property ``erasure.orphan_grace`` overrides.
DEFAULT_ORPHAN_GRACE = dt.timedelta(hours=1)
ORPHAN_GRACE_PROPERTY = "erasure.orphan_grace"


def _grace_ms(table, grace) -> int:
    from flightsrv.table.erasure_status import parse_duration_ms

    if grace is None:
        prop = table.properties.get(ORPHAN_GRACE_PROPERTY)
        if prop is None:
            return int(DEFAULT_ORPHAN_GRACE.total_seconds() * 1000)
        return parse_duration_ms(prop, what=ORPHAN_GRACE_PROPERTY, table=table.name)
    if isinstance(grace, dt.timedelta):
        ms = int(grace.total_seconds() * 1000)
    elif isinstance(grace, (int, float)):
        ms = int(grace * 1000)
    else:
        raise ConfigurationError("grace must be a timedelta or seconds", table=table.name,
                                 got=type(grace).__name__)
    if ms < 0:
        raise ConfigurationError("grace must not be negative", table=table.name, seconds=ms / 1000)
    return ms


def _history(table, before: int, may_hold) -> dict[str, str]:
    """Data files of retained versions before ``before`` that the head no longer references
    and that may hold earlier copies of erased rows (e.g. rewritten away by a compaction):
    kind "history". ``may_hold(manifest, data_file)`` narrows them (None: all). Also every
    file whose entry a retained chunk keeps behind the overlay (``hidden_entries``, the head
    included: a DV delete that removed a whole file), whatever ``may_hold`` says: its data
    object may be gone, but the entry's statistics (an inlined file's rows) are stored until
    the versions listing it expire."""
    head = require_table(table.log.head(), table.name)
    current = head.referenced_keys()
    out = {}
    for m in check.retained(table):
        for p in check.hidden_entries(m):
            if p not in current:
                out.setdefault(p, "history")
        if m.version >= before:
            continue
        for f in m.data_files:
            if f.path not in current and f.path not in out and (
                    may_hold is None or may_hold(m, f)):
                out[f.path] = "history"
    return out


def _covers(table, manifests: list[Manifest], erased: set[str]) -> list[str]:
    """Fingerprints of the retained deletes whose rows sat in ``erased`` objects. Versions
    written before fingerprints existed carry the predicate text: it is fingerprinted here."""
    from flightsrv.table.fingerprint import fingerprint

    by_version = {m.version: m for m in manifests}
    out = []
    for m in manifests:
        fp = m.summary.get("request_fingerprint")
        text = m.summary.get("predicate")
        if fp is None and not isinstance(text, str):
            continue
        prev = by_version.get(m.version - 1)
        if prev is None:
            continue
        now = m.files_by_path()
        touched = {f.path for f in prev.data_files
                   if f.path not in now or now[f.path].deleted_rows > f.deleted_rows}
        if touched & erased:
            out.append(fp if fp is not None else fingerprint(table, text))
    return out


def _finish(table, result: PurgeResult, erased: dict[str, str], *, expire: bool, grace,
            all_dead: bool, certificate, damaged: CorruptObject | None = None) -> PurgeResult:
    """Complete (with ``expire``), verify and certify; fills ``result``.

    ``damaged``: a retained object that could not be read while planning the completion.
    Completion reads every retained version; when one does not parse, it stops there
    (what that version references is unknown, so nothing is expired or swept) and the
    erasure, whose commit stands, is reported ``pending`` naming the object, never as a
    failure that invites running it again."""
    grace_ms = _grace_ms(table, grace) if expire else None
    if damaged is None:
        try:
            _complete(table, result, erased, expire=expire, grace_ms=grace_ms)
        except CorruptObject as exc:
            damaged = exc
    if damaged is not None:
        log.warning("erasure not completed: a retained object does not parse",
                    extra={"table": table.name, "error": str(damaged)})
    result.verification = check.verify(table, erased, all_dead=all_dead, grace_ms=grace_ms)
    if damaged is not None:
        item = check.unreadable_item(table, damaged)
        if item["object"] not in {p["object"] for p in result.verification.pending}:
            result.verification.pending.append(item)
        result.verification.status = check.PENDING
    try:
        refs = check.references(table)
    except CorruptObject:
        refs = {}  # reported above (pending)
    absent = set(result.verification.erased_absent)
    result.objects = [_erased_object(key, kind, refs, absent)
                      for key, kind in sorted(erased.items())]
    head = table.log.head()
    result.head_after = head.version if head is not None else None
    changed = result.version is not None or result.expired_versions or result.deleted_objects \
        or result.redacted_version is not None
    if certificate or (certificate is None and changed):
        from flightsrv.table import certificate as cert

        result.certificate = cert.write(table, cert.build(
            table, result, cert_id=cert.new_id(table.runtime)))
    log.info("erasure", extra={"table": table.name, "operation": result.operation,
                               "version": result.version, "status": result.status,
                               "rows_removed": result.rows_removed,
                               "expired": len(result.expired_versions),
                               "deleted": len(result.deleted_objects)})
    return result


def _complete(table, result: PurgeResult, erased: dict[str, str], *, expire: bool,
              grace_ms: int | None) -> None:
    """The covered deletes, and with ``expire`` the clean head, expiry and sweep."""
    retained = check.retained(table)
    result.covers = _covers(table, retained, {k for k, v in erased.items() if v != "dv"})
    if not expire:
        return
    clean = check.clean_head(table)
    if clean is not None:
        result.redacted_version = clean.version
        retained = check.retained(table)
    head = require_table(table.log.head(), table.name)
    unclean = check.unclean_versions(retained, erased, head.version)
    if unclean:
        result.expired_versions = check.expire_through(table, max(unclean))
    result.deleted_objects, result.uploads_aborted = check.sweep(table, erased, grace_ms)


def _erased_object(key: str, kind: str, refs: dict, absent: set) -> ErasedObject:
    return ErasedObject(key, kind, tuple(refs.get(key, ())), key in absent)



"""Erasure certificates: one machine-readable record per erasure (docs/ERASURE.md
§Certificates).

A certificate is a JSON object stored once, with a conditional create, at
``<table>/_erasures/<id>.json``, where ``<id>`` is ``YYYYMMDDTHHMMSSmmmZ-<16 hex>`` (UTC, to
the millisecond, so keys list in time order). It names no personal data: the request appears
only as its keyed fingerprint
(``flightsrv.table.fingerprint``), objects by their random keys. Vacuum and expiry never
delete ``_erasures/``; dropping the table leaves them too.

Fields (``format_version`` 1):

=======================  ===================================================================
``id``, ``table``,       the certificate id, the table name and incarnation
``table_uuid``
``operation``            ``splice_delete`` | ``purge`` | ``delete_matching``
``source``               who asked: ``python`` | ``sql`` | ``cli`` | ``spark``
``request_fingerprint``  fingerprint of the request (null for a purge, which has none)
``covers``               fingerprints of the earlier deletes whose rows this erasure removed
``versions``             ``read`` (planned on), ``committed`` (its commit, or null),
                         ``before`` / ``after`` (head before and after), ``expired``
``rows_removed``         rows whose bytes left the data files; ``rows_deleted``: rows it hid
``objects_rewritten``    ``[{old, new: [...], path: splice|rewrite|drop, rows_removed}]``
``objects_deleted``      keys it deleted; ``uploads_aborted``
``verification``         what was re-read and found (``erasure_check.Verification``):
                         manifests with their matches, the pointer, listing counts, erased
                         objects confirmed absent, pending items; ``matches``
``status``               ``erased`` (verified, 0 matches, nothing pending) or ``pending``
``started_at``,          ISO 8601 UTC (and ``*_ms``)
``committed_at``,
``verified_at``
=======================  ===================================================================
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from flightsrv.errors import CorruptObject, ObjectNotFound
from flightsrv.store.base import PutMode

__all__ = ["PREFIX", "build", "list_certificates", "read", "write"]

PREFIX = "_erasures/"
FORMAT_VERSION = 1

log = logging.getLogger("flightsrv.erase")


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


def new_id(runtime) -> str:
    ms = runtime.clock.now_ms()
    t = dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)
    return f"{t:%Y%m%dT%H%M%S}{ms % 1000:03d}Z-{runtime.ids.new_id()[:16]}"


def build(table, result, *, cert_id: str) -> dict:
    """The certificate of a finished erasure (``erase.PurgeResult``)."""
    ver = result.verification
    return {
        "format_version": FORMAT_VERSION, "id": cert_id, "table": table.name,
        "table_uuid": result.table_uuid, "operation": result.operation,
        "source": result.source, "request_fingerprint": result.fingerprint,
        "covers": sorted(set(result.covers)),
        "versions": {"read": result.read_version, "committed": result.version,
                     "before": result.head_before, "after": result.head_after,
                     "redacted": result.redacted_version,
                     "expired": list(result.expired_versions)},
        "rows_removed": result.rows_removed, "rows_deleted": result.rows_deleted,
        "objects_rewritten": [{"old": f.old_path, "new": list(f.new_paths), "path": f.path,
                               "rows_removed": f.rows_removed} for f in result.files],
        "objects_deleted": sorted(result.deleted_objects),
        "uploads_aborted": sorted(result.uploads_aborted),
        "verification": ver.to_dict() if ver is not None else None,
        "status": result.status,
        "started_at": _iso(result.started_at_ms), "started_at_ms": result.started_at_ms,
        "committed_at": _iso(result.committed_at_ms),
        "committed_at_ms": result.committed_at_ms,
        "verified_at": _iso(ver.checked_at_ms if ver else None),
        "verified_at_ms": ver.checked_at_ms if ver else None,
    }


def write(table, record: dict) -> str:
    """Store ``record`` under ``_erasures/<id>.json`` (CREATE); returns the key."""
    key = f"{PREFIX}{record['id']}.json"
    table.store.put(key, json.dumps(record, sort_keys=True, separators=(",", ":")).encode(),
                    mode=PutMode.CREATE)
    return key


#: fields every reader of a certificate relies on, with their JSON types
_REQUIRED = {"id": str, "operation": str, "status": str, "versions": dict,
             "rows_removed": int, "objects_rewritten": list, "objects_deleted": list}
#: ``status`` of the record ``list_certificates`` gives for a certificate it cannot read
UNREADABLE = "unreadable"


def _parse(raw: bytes, key: str) -> dict:
    try:
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError(f"a JSON {type(d).__name__}, not an object")
        if int(d.get("format_version", 0)) > FORMAT_VERSION:
            raise ValueError(f"format_version {d['format_version']} is newer than this "
                             f"flightsrv reads ({FORMAT_VERSION})")
        for name, kind in _REQUIRED.items():
            if not isinstance(d.get(name), kind):
                raise ValueError(f"field {name} is missing or not a {kind.__name__}")
        return d
    except (ValueError, TypeError) as exc:
        raise CorruptObject("erasure certificate does not parse", key=key,
                            error=str(exc)) from None


def _id_ms(cert_id: str) -> int:
    """The start time an id (``YYYYMMDDTHHMMSSmmmZ-...``) names, in ms; 0 if it names none."""
    try:
        t = dt.datetime.strptime(cert_id[:15], "%Y%m%dT%H%M%S").replace(tzinfo=dt.timezone.utc)
        return int(t.timestamp()) * 1000 + int(cert_id[15:18])
    except ValueError:
        return 0


def list_certificates(table) -> list[dict]:
    """Every certificate of the table, oldest first (by start time, then id).

    A certificate that cannot be read (overwritten, truncated, written by a newer
    flightsrv) does not hide the others: it is listed as a record with ``status``
    ``"unreadable"``, its ``id`` and ``key``, ``operation`` ``"unknown"`` and the ``error``
    (what failed), and logged as a warning. A certificate is written once and never
    rewritten, so an unreadable one means the store was changed outside flightsrv."""
    out = []
    for m in table.store.list(PREFIX):
        if not m.key.endswith(".json"):
            continue
        try:
            raw, _ = table.store.get(m.key)
        except ObjectNotFound:
            continue
        try:
            out.append(_parse(raw, f"{table.name}/{m.key}"))
        except CorruptObject as exc:
            cert_id = m.key[len(PREFIX):-len(".json")]
            log.warning("unreadable erasure certificate",
                        extra={"table": table.name, "key": m.key, "error": str(exc)})
            out.append({"id": cert_id, "table": table.name, "key": m.key,
                        "operation": "unknown", "status": UNREADABLE, "error": str(exc),
                        "started_at_ms": _id_ms(cert_id)})
    out.sort(key=lambda c: (c.get("started_at_ms") or 0, c.get("id", "")))
    return out


def read(table, cert_id: str) -> dict:
    key = f"{PREFIX}{cert_id}.json"
    raw, _ = table.store.get(key)
    return _parse(raw, f"{table.name}/{key}")

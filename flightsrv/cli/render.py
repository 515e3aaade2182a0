"""How the CLI shows what format-level operations return: one function, ``result_rows``,
turns a result value (compaction, expiry, vacuum, stats, orphan vacuum, erasure, erasure
status, mirror publishing) into the
rows ``output.write_rows`` prints. The result types themselves only hold data and
``to_dict()`` (the JSON form the SQL answers and ``--format jsonl`` use)."""

from __future__ import annotations

import functools

from flightsrv.table.erase import PurgeResult
from flightsrv.table.erasure_status import ErasureStatus
from flightsrv.table.maintenance.results import (
    CompactResult,
    ExpireResult,
    OrphanVacuumResult,
    TableStats,
    VacuumResult,
)
from flightsrv.table.mirror.publisher import PublishResult


def _metric_rows(d: dict) -> list[dict]:
    return [{"metric": k, "value": v} for k, v in d.items() if not isinstance(v, (list, dict))]


def _overdue_rows(items: list | None, warnings: list = ()) -> list[dict]:
    """Rows naming deletions past their erasure deadline (VACUUM, OPTIMIZE), and the
    warnings of the result (None items: the deadlines could not be checked)."""
    rows = [{"metric": "warning", "value": w} for w in warnings]
    if items is None:
        return [{"metric": "erasures past deadline", "value": "unknown (see warning)"}] + rows
    if not items:
        return rows
    return [{"metric": "erasures past deadline", "value": len(items)}] + [
        {"metric": "erasure past deadline",
         "value": f"{i['object']} ({i['kind']}, "
                  f"{'copies of deleted' if i['rows'] is None else i['rows']} rows, "
                  f"{i['age_days']}d): "
                  f"{i['remedy']}"} for i in items] + rows


@functools.singledispatch
def result_rows(result) -> list[dict]:
    """Rows for the CLI table of ``result``: metric/value rows by default."""
    if isinstance(result, dict):
        return [{"key": k, "value": v} for k, v in result.items()]
    if hasattr(result, "to_dict"):
        return _metric_rows(result.to_dict())
    return [{"value": result}]


@result_rows.register
def _(result: CompactResult) -> list[dict]:
    d = result.to_dict()
    d.pop("erasures_overdue", None)  # the rows below say it (None: unknown, see warning)
    return _metric_rows(d) + _overdue_rows(result.erasures_overdue, result.warnings)


@result_rows.register
def _(result: ExpireResult) -> list[dict]:
    expired = result.expired_versions
    return [{"metric": "head_version", "value": result.head_version},
            {"metric": "oldest_retained", "value": result.oldest_retained},
            {"metric": "versions_expired", "value": len(expired)},
            {"metric": "expired_range",
             "value": f"{expired[0]}..{expired[-1]}" if expired else "-"},
            {"metric": "manifests_deleted", "value": result.manifests_deleted},
            {"metric": "dry_run", "value": result.dry_run}] + [
            {"metric": f"{fmt}_mirror_objects_deleted", "value": len(keys)}
            for fmt, keys in sorted(result.mirrors.items())]


def result_columns(result) -> tuple[str, ...] | None:
    """The columns of ``result_rows(result)`` when it has no rows (None: not a listing)."""
    if isinstance(result, VacuumResult) and result.dry_run:
        return ("would_delete", "kind", "bytes", "age_h")
    return None


@result_rows.register
def _(result: VacuumResult) -> list[dict]:
    overdue = _overdue_rows(result.erasures_overdue, result.warnings)
    if result.dry_run:
        return [{"would_delete": o["key"], "kind": o["kind"], "bytes": o["size"],
                 "age_h": round(o["age_s"] / 3600, 1)} for o in result.objects] + [
            {"would_delete": f"{u['key']} (multipart {u['upload_id'][:12]})",
             "kind": "upload", "bytes": "", "age_h": round(u["age_s"] / 3600, 1)}
            for u in result.uploads] + [
            {"would_delete": r["value"], "kind": r["metric"]} for r in overdue]
    by_kind: dict[str, list] = {}
    for o in result.objects:
        k = by_kind.setdefault(o["kind"], [0, 0])
        k[0] += 1
        k[1] += o["size"]
    out = [{"kind": k, "deleted": n, "bytes": b} for k, (n, b) in sorted(by_kind.items())]
    if result.uploads:
        out.append({"kind": "multipart upload", "deleted": len(result.uploads), "bytes": ""})
    out.append({"kind": "kept (younger than grace)", "deleted": result.kept_young,
                "bytes": result.kept_young_bytes})
    return out + [{"kind": r["metric"], "deleted": r["value"]} for r in overdue]


@result_rows.register
def _(result: TableStats) -> list[dict]:
    out = [{"metric": k, "value": v} for k, v in result.to_dict().items() if k != "reasons"]
    return out + [{"metric": f"why {r['action']}", "value": r["reason"]}
                  for r in result.reasons]


@result_rows.register
def _(result: OrphanVacuumResult) -> list[dict]:
    out = _metric_rows(result.to_dict())
    out.insert(2, {"metric": "prefixes", "value": ",".join(result.prefixes) or "-"})
    return out


@result_rows.register
def _(result: PurgeResult) -> list[dict]:
    """One row per file, per object that held erased bytes, per pending item, and a total
    row."""
    blank = {"path": "", "new": "", "rows_removed": "", "downloaded": "", "uploaded": "",
             "copied": ""}
    out = [{"kind": "file", "object": f.old_path, "path": f.path,
            "new": ",".join(f.new_paths) or "-", "rows_removed": f.rows_removed,
            "downloaded": f.bytes_downloaded, "uploaded": f.bytes_uploaded,
            "copied": f.bytes_copied, "status": f.reason or "ok"} for f in result.files]
    for o in result.objects:
        out.append({"kind": o.kind, "object": o.key, **blank,
                    "status": "deleted" if o.deleted else
                    "referenced by v" + ",".join(map(str, o.referenced_by))
                    if o.referenced_by else "unreferenced (vacuum removes it)"})
    ver = result.verification
    for p in (ver.pending if ver else []):
        out.append({"kind": "pending", "object": p["object"], **blank,
                    "status": f"{p['reason']}; {p['remedy']}"})
    if ver is not None:
        checked = (f"verified: {ver.objects_scanned} objects read, "
                   f"{sum(ver.listed.values())} listed, {ver.matches} matches")
    else:
        checked = "not verified"
    status = "erased" if result.complete else (
        "old versions still hold bytes" if result.retained_versions else "pending")
    if result.certificate:
        out.append({"kind": "certificate", "object": result.certificate, **blank,
                    "status": "stored"})
    committed = (f"version {result.version}" if result.version is not None else
                 "no new version" + (f" (read v{result.read_version})"
                                     if result.read_version is not None else ""))
    if result.redacted_version is not None:  # completion committed one of its own
        committed += f", redact version {result.redacted_version}"
    out.append({"kind": "total", "object": committed, **blank,
                "rows_removed": result.rows_removed,
                "downloaded": sum(f.bytes_downloaded for f in result.files),
                "uploaded": sum(f.bytes_uploaded for f in result.files),
                "copied": sum(f.bytes_copied for f in result.files),
                "status": f"{status} ({checked})"})
    return out


def _human(ms: int) -> str:
    s = max(0, ms) // 1000
    if s >= 86_400:
        return f"{s / 86_400:.1f}d"
    if s >= 3600:
        return f"{s / 3600:.1f}h"
    if s >= 60:
        return f"{s / 60:.0f}m"
    return f"{s}s"


@result_rows.register
def _(result: ErasureStatus) -> list[dict]:
    """One row per stored deletion (oldest first) with its age, deadline state and the
    command that removes its bytes."""
    if not result.items:
        return [{"kind": "-", "object": "no deleted rows are stored", "rows": "", "age": "",
                 "overdue": "", "remove_with": ""}]
    return [{"kind": i["kind"], "object": i["object"],
             "rows": "?" if i["rows"] is None else i["rows"],
             "age": ("≥" if i["age_is_lower_bound"] else "") + _human(i["age_ms"]),
             "overdue": "OVERDUE" if i["overdue"] else "",
             "versions": ",".join(map(str, i["versions"])) if i["versions"] else "",
             "requests": ",".join(i["requests"]) if i["requests"] else "",
             "remove_with": i["remedy"]} for i in result.items]


@result_rows.register
def _(result: PublishResult) -> list[dict]:
    out = []
    for f in result.formats:
        vs = result.published.get(f, [])
        lo, hi = result.mirror_versions.get(f, (None, None))
        out.append({"format": f, "published": len(vs),
                    "versions": f"{vs[0]}..{vs[-1]}" if vs else "-",
                    "mirror": f"{lo}..{hi}" if lo is not None else "-",
                    "location": result.locations.get(f, "")})
    return out

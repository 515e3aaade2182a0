"""Deletions whose bytes are still stored, and erasure deadlines (docs/ERASURE.md §Deadlines).

A DV delete hides rows at once, but their bytes stay until a purge (or a compaction) rewrites
the file, and older versions keep reaching them until they expire. ``erasure_status(table)``
lists every such place, oldest first, with its age and what will remove it:

=================  =====================================================================
kind               meaning, and what removes it
=================  =====================================================================
``dv``             a file of the head with deleted rows (DV or deleted row groups): the
                   rows are hidden but stored. ``PURGE t`` (or a compaction that picks the
                   file) rewrites it.
``retained``       a file the head no longer references, reachable through retained
                   versions, that held deleted rows when it left (a DV, or it left by a
                   delete, splice or drop), or whose rows a compaction or purge moved to
                   files from which rows were deleted since (it keeps a copy of them;
                   ``rows`` is then unknown, NULL). Expiring those versions and deleting
                   it removes it: ``PURGE t EXPIRE``, or expiry past them plus ``VACUUM``.
``unreferenced``   a ``data/`` object no retained version references (left by an expiry
                   without vacuum, or by a failed write); it may hold deleted rows.
                   ``VACUUM t`` after its grace period, or ``PURGE t EXPIRE``.
=================  =====================================================================

``age`` counts from the first retained version in which the rows were deleted (for
``unreferenced``: the object's modification time). When that version is the oldest retained
one, the deletion may be older: ``age_is_lower_bound`` is then true.

The table property ``erasure.deadline`` (default ``30d``; a number with ``d``, ``h``, ``m``
or ``s``, a bare number meaning days) is how long deleted bytes may stay. An item older than
that is *overdue*; ``VACUUM`` and ``OPTIMIZE`` report overdue items in their results.
Requests are named by their fingerprint (``request_fingerprint`` in the version summary); a
version written before fingerprints existed is flagged as holding request text instead.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field

from flightsrv.errors import ConfigurationError
from flightsrv.table.commit import require_table
from flightsrv.table.erasure_check import hidden_entries, retained, summary_traces

__all__ = ["DEADLINE_PROPERTY", "DEFAULT_DEADLINE", "ErasureStatus", "erasure_status",
           "overdue_erasures", "parse_duration_ms"]

DEADLINE_PROPERTY = "erasure.deadline"
DEFAULT_DEADLINE = "30d"
#: operations whose removal of a file deletes its rows (a compaction or purge only moves them)
_DELETING_OPS = frozenset({"delete", "splice_delete", "drop", "delete_matching", "merge",
                           "update", "overwrite", "replace"})
_UNITS = {"w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000,
          None: 86_400_000}


def parse_duration_ms(value, *, what: str, table: str | None = None) -> int:
    """``'4w'``, ``'30d'``, ``'12h'``, ``'90m'``, ``'3600s'`` or a bare number of days →
    milliseconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([wdhms])?\s*", str(value).lower())
    if not m:
        raise ConfigurationError(f"{what} must be a duration such as 4w, 30d, 12h, 90m or 3600s",
                                 table=table, value=value)
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).isoformat()


@dataclass
class ErasureStatus:
    table: str
    head_version: int
    deadline_ms: int
    checked_at_ms: int
    items: list = field(default_factory=list)  # dicts, oldest first (see ``_item``)

    @property
    def overdue(self) -> list[dict]:
        return [i for i in self.items if i["overdue"]]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"overdue": len(self.overdue)}


def _requests(m, prev) -> str | None:
    fp = m.summary.get("request_fingerprint")
    if fp:
        return f"v{m.version}:{fp}"
    if summary_traces(m):
        return f"v{m.version}:request text stored (PURGE ... EXPIRE removes it)"
    return None


def erasure_status(table, *, list_objects: bool = True) -> ErasureStatus:
    """Every place deleted rows' bytes are still stored (see the module docstring).
    ``list_objects=False`` skips the listing of unreferenced objects (manifests only)."""
    now = table.runtime.clock.now_ms()
    head = table.log.head()
    if head is None:
        require_table(head, table.name)
    deadline = parse_duration_ms(head.properties.get(DEADLINE_PROPERTY, DEFAULT_DEADLINE),
                                 what=DEADLINE_PROPERTY, table=table.name)
    manifests = retained(table)
    if not manifests or manifests[-1].version != head.version:
        manifests = [m for m in manifests if m.version < head.version] + [head]
    oldest = manifests[0].version
    by_version = {m.version: m for m in manifests}
    status = ErasureStatus(table.name, head.version, deadline, now)

    def item(kind, obj, rows, since_ms, lower, versions, requests, remedy):
        age = now - since_ms
        status.items.append({"kind": kind, "object": obj, "rows": rows, "since": _iso(since_ms),
                             "age_ms": age, "age_is_lower_bound": lower,
                             "overdue": age > deadline, "versions": versions,
                             "requests": sorted({r for r in requests if r}),
                             "remedy": remedy})

    # per path: versions referencing it, first version it had deleted rows, request names
    first_dead: dict[str, int] = {}
    last_ref: dict[str, int] = {}
    reqs: dict[str, list] = {}
    refs: dict[str, list[int]] = {}
    #: files whose rows a compaction or purge moved, to the files that version added
    moved_to: dict[str, set[str]] = {}
    deleted_by: dict[str, int] = {}  # files that left by a deleting operation, and when
    #: files whose entries chunks keep behind a retained root's overlay: first such version
    hidden: dict[str, int] = {}
    hidden_in: dict[str, list[int]] = {}
    for m in manifests:
        for path in hidden_entries(m):
            hidden.setdefault(path, m.version)
            hidden_in.setdefault(path, []).append(m.version)
        prev = by_version.get(m.version - 1)
        prev_files = prev.files_by_path() if prev else {}
        now_files = m.files_by_path()
        left = prev_files.keys() - now_files.keys()
        if m.operation in _DELETING_OPS:
            deleted_by.update(dict.fromkeys(left, m.version))
            for path in left:
                reqs.setdefault(path, []).append(_requests(m, prev))
        elif left:
            added = now_files.keys() - prev_files.keys()
            for path in left:
                moved_to.setdefault(path, set()).update(added)
        for f in m.data_files:
            refs.setdefault(f.path, []).append(m.version)
            last_ref[f.path] = m.version
            if f.deleted_rows and f.path not in first_dead:
                first_dead[f.path] = m.version
            pf = prev_files.get(f.path)
            if pf is not None and f.deleted_rows > pf.deleted_rows:
                reqs.setdefault(f.path, []).append(_requests(m, prev))
    head_files = {} if head.dropped else head.files_by_path()
    for path, f in head_files.items():
        if not f.deleted_rows:
            continue
        v = first_dead.get(path, head.version)
        item("dv", path, f.deleted_rows, by_version[v].created_at_ms, v == oldest and v > 0,
             [], reqs.get(path, []), f"PURGE {table.name}")
    for path, versions in refs.items():
        if path in head_files:
            continue
        lv = last_ref[path]
        entry = by_version[lv].files_by_path()[path]
        gone = by_version.get(lv + 1)
        rows = entry.deleted_rows
        if gone is not None and gone.operation in _DELETING_OPS:
            removed = [e.get("rows_removed", 0) for e in gone.summary.get("erase", [])
                       if e.get("file") == path]
            rows = max(rows, removed[0]) if removed else entry.rows
        if not rows:
            # its rows only moved (compaction, purge): it still holds a copy of every row
            # deleted since from the files they moved to
            copies = _descendants(path, moved_to)
            found = [v for d in copies for v in (first_dead.get(d), deleted_by.get(d))
                     if v is not None]
            if not found:
                continue
            v = min(found)  # the first version in which a row it copies was deleted
            item("retained", path, None, by_version[v].created_at_ms, v == oldest and v > 0,
                 versions, [r for d in copies for r in reqs.get(d, [])],
                 f"PURGE {table.name} EXPIRE (or expire versions <= {lv}, then VACUUM)")
            continue
        if path in first_dead:
            v = first_dead[path]
        elif gone is not None:
            v = gone.version
        else:
            v = lv
        item("retained", path, rows, by_version[v].created_at_ms, v == oldest and v > 0,
             versions, reqs.get(path, []),
             f"PURGE {table.name} EXPIRE (or expire versions <= {lv}, then VACUUM)")
    for path, v in hidden.items():
        if path in refs or path in head_files:
            continue  # judged above with the versions that reference it
        # no retained version references it: the entry a chunk keeps (statistics, an
        # inlined file's rows) is all that is left. Unless it left with deleted rows in no
        # deleting operation (a compaction moved them), they may be deleted rows'.
        m = by_version[v]
        was = m.data_files.was.get(path, (0, 0))
        if v != oldest and m.operation not in _DELETING_OPS and not was[1]:
            continue
        item("retained", path, None, m.created_at_ms, v == oldest and v > 0, hidden_in[path],
             [_requests(m, by_version.get(v - 1))],
             f"PURGE {table.name} EXPIRE (its entry stays in the manifest chunks of "
             f"versions {','.join(map(str, hidden_in[path]))})")
    if list_objects:
        known = set(refs)
        for m in table.store.list("data/"):
            if m.key in known:
                continue
            since = m.last_modified_ms if 0 < m.last_modified_ms <= now else now
            item("unreferenced", m.key, None, since, False, [], [],
                 f"VACUUM {table.name} (after its grace period) or PURGE {table.name} EXPIRE")
    status.items.sort(key=lambda i: (-i["age_ms"], i["object"]))
    return status


def _descendants(path: str, moved_to: dict[str, set[str]]) -> list[str]:
    """The files ``path``'s rows were moved to, and theirs in turn (each once)."""
    out, todo, seen = [], list(moved_to.get(path, ())), {path}
    while todo:
        d = todo.pop()
        if d in seen:
            continue
        seen.add(d)
        out.append(d)
        todo.extend(moved_to.get(d, ()))
    return out


def overdue_erasures(table) -> list[dict]:
    """The overdue items of ``erasure_status`` (manifests only, no listing), compactly, for
    the results of VACUUM and OPTIMIZE."""
    st = erasure_status(table, list_objects=False)
    return [{"object": i["object"], "kind": i["kind"], "rows": i["rows"],
             "age_days": round(i["age_ms"] / 86_400_000, 2), "remedy": i["remedy"]}
            for i in st.overdue]

"""What both mirrors share: the table's location URI, write-once puts that tolerate a racing
publisher, and the diff of two flightsrv versions (docs/INTEROP.md §Publishing)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from flightsrv.errors import PreconditionFailed
from flightsrv.store.base import PutMode
from flightsrv.table.manifest import DataFile, Manifest
from flightsrv.table.mirror.dvs import deletes_changed, has_deletes

FORMATS = ("delta", "iceberg")


def table_location(table) -> str:
    """Absolute URI of the table prefix (``file:///abs/wh/t`` or ``s3://bucket/prefix/t``):
    Iceberg file paths and Delta ``p`` deletion-vector paths must be absolute."""
    return f"{table.warehouse_uri.rstrip('/')}/{table.name}"


def digest(data: bytes, n: int = 16) -> str:
    return hashlib.sha256(data).hexdigest()[:n]


def put_once(store, key: str, data: bytes) -> bool:
    """CREATE ``key``; False if it exists already. Callers name auxiliary objects by their
    content (``digest``), so an existing key holds the same bytes, written by a racing
    publisher; commit points (a Delta commit, an Iceberg metadata file) are CREATEs whose
    loser re-reads the state and continues from it."""
    try:
        store.put(key, data, mode=PutMode.CREATE)
        return True
    except PreconditionFailed:
        return False


@dataclass
class Diff:
    """What changed between two flightsrv versions, by data file path."""

    added: list[DataFile] = field(default_factory=list)
    removed: list[DataFile] = field(default_factory=list)  # as in the older version
    #: files in both whose deletes changed: (old entry, new entry)
    redeleted: list[tuple[DataFile, DataFile]] = field(default_factory=list)

    @property
    def changed_files(self) -> int:
        return len(self.added) + len(self.removed) + len(self.redeleted)


def diff(prev: Manifest | None, cur: Manifest) -> Diff:
    """O(files) dictionary work over two manifests already in memory; everything written
    from it is O(changed files)."""
    d = Diff()
    old = prev.files_by_path() if prev is not None else {}
    seen = set()
    for f in cur.data_files:
        seen.add(f.path)
        o = old.get(f.path)
        if o is None:
            d.added.append(f)
        elif deletes_changed(o, f):
            d.redeleted.append((o, f))
    d.removed = [o for p, o in old.items() if p not in seen]
    return d


def incarnation(table, head: Manifest) -> int:
    """The first retained version of the head's incarnation (the same ``table_uuid``):
    mirrors start there. Versions before a DROP + CREATE are not published. Versions of one
    incarnation are a contiguous suffix, so this loads O(log versions) manifests."""
    versions = [v for v in table.log.versions() if v <= head.version] or [head.version]

    def same(v: int) -> bool:
        m = table.log.try_load(v)
        return m is not None and m.table_uuid == head.table_uuid

    if same(versions[0]):
        return versions[0]
    lo, hi = 0, len(versions) - 1  # versions[lo] differs, versions[hi] (the head) is same
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if same(versions[mid]):
            hi = mid
        else:
            lo = mid
    return versions[hi]


__all__ = ["FORMATS", "Diff", "diff", "digest", "has_deletes", "incarnation", "put_once",
           "table_location"]

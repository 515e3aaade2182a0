"""Publishing a table's versions as Delta Lake and Iceberg v3 mirrors (docs/INTEROP.md).

``publish(table, formats)`` brings each requested mirror up to the head: it reads only
flightsrv manifests (two per version: the diff) and the mirror's own newest state, and
writes metadata only — data files and DV objects are referenced in place, never copied.

``publish.formats`` (table property): after every commit, ``after_commit`` queues the table
on one background worker per process, which publishes it to its head. Best effort: the
commit has already happened, a failure is logged and the next publish catches up; the
worker thread is not a daemon, so a short-lived process (the CLI) finishes publishing
before it exits. ``wait_idle`` waits for the worker (tests, benchmarks).

Retention: ``expire(table, oldest)`` (called by ``expire_snapshots``) removes expired
versions from the mirrors; ``referenced(table)`` names the mirror objects a retained mirror
version needs, so vacuum deletes the rest (``MIRROR_PREFIXES``).

Concurrency: every mirror write is a CREATE; commit points (a Delta commit file, an Iceberg
metadata file) are won by exactly one publisher, and a loser re-reads the state and
continues from it. Auxiliary objects are named by their content, so racing publishers
write identical bytes or different keys, never a torn mirror.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import asdict, dataclass, field

from flightsrv.errors import ConfigurationError, TableNotFound
from flightsrv.table.manifest import Manifest
from flightsrv.table.mirror import delta as delta_mod
from flightsrv.table.mirror import iceberg as iceberg_mod
from flightsrv.table.mirror.common import FORMATS, incarnation, table_location
from flightsrv.table.mirror.delta import DeltaMirror
from flightsrv.table.mirror.iceberg import IcebergMirror, snapshot_id
from flightsrv.table.mirror.types import UnsupportedForMirror, map_schema

log = logging.getLogger("flightsrv.mirror")

PROPERTY = "publish.formats"
CHECKPOINT_PROPERTY = "publish.delta.checkpoint_interval"
#: key prefixes under a table that belong to the mirrors
MIRROR_PREFIXES = (delta_mod.LOG_PREFIX, delta_mod.DV_PREFIX, iceberg_mod.PREFIX)
MAX_ATTEMPTS = 10


def parse_formats(value) -> tuple[str, ...]:
    """``"delta"``, ``"iceberg"``, ``"all"``, ``"delta,iceberg"`` or a sequence of those."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        name = str(item).strip().lower()
        if not name:
            continue
        if name == "all":
            out += list(FORMATS)
        elif name in FORMATS:
            out.append(name)
        else:
            raise ConfigurationError("unknown publish format (use delta, iceberg or all)",
                                     format=item)
    return tuple(f for f in FORMATS if f in out)


@dataclass
class PublishResult:
    table: str
    head_version: int | None
    formats: list = field(default_factory=list)
    #: format -> versions written by this call
    published: dict = field(default_factory=dict)
    #: format -> oldest and newest version the mirror holds afterwards
    mirror_versions: dict = field(default_factory=dict)
    #: format -> what a reader opens (Delta: the table URI; Iceberg: the metadata file)
    locations: dict = field(default_factory=dict)
    expired: dict = field(default_factory=dict)  # format -> mirror objects removed
    changed_files: int = 0
    bytes_written: int = 0
    reset: list = field(default_factory=list)  # formats started over (new incarnation)

    def to_dict(self) -> dict:
        return asdict(self)


def _interval(head: Manifest) -> int:
    from flightsrv.table.properties import value

    return value(head.properties, CHECKPOINT_PROPERTY)


# -- Delta ----------------------------------------------------------------------------


def _publish_delta(table, head: Manifest, start: int, result: PublishResult, progress) -> None:
    dm = DeltaMirror(table)
    commits, _ = dm.listing()
    last = commits[-1] if commits else None
    if last is not None:
        info = dm.commit_info(last) or {}
        # a mirror ahead of this publisher's head (another publisher got further since it
        # read the head) is this table's too when its commit id is that version's: it is
        # up to date, never dropped and rewritten behind the other (that tore the log)
        mine = table.log.try_load(last)
        if (info.get("table_uuid") != head.table_uuid or mine is None
                or info.get("commit_id") != mine.commit_id or last < start):
            dm.drop()
            result.reset.append("delta")
            last = None
    commits, checkpoints = dm.listing()
    if commits and commits[0] > 0 and commits[0] not in checkpoints:
        first = table.log.try_load(commits[0])  # a publish died before its checkpoint
        if first is not None:
            dm.checkpoint(first)
    interval = _interval(head)
    done = []
    v = start if last is None else last + 1
    prev = None if last is None else table.log.load(last)
    features = None if last is None else dm.declared(last)
    while v <= head.version:
        m = table.log.load(v)
        with _naming_version(m, head):
            figures = dm.publish(prev, m, checkpoint_interval=interval,
                                 prev_features=features)
        features = figures["features"]
        result.bytes_written += figures["bytes"]
        result.changed_files += figures["changed_files"]
        done.append(v)
        if progress is not None:
            progress.advance(1, note=f"delta v{v}")
        prev, v = m, v + 1
    result.published["delta"] = done
    oldest = table.log.try_load(start)
    if oldest is not None:
        gone = dm.expire(oldest)
        if gone:
            result.expired["delta"] = gone
    commits, _ = dm.listing()
    result.mirror_versions["delta"] = (commits[0], commits[-1]) if commits else (None, None)
    result.locations["delta"] = table_location(table)


# -- Iceberg --------------------------------------------------------------------------


def _publish_iceberg(table, head: Manifest, start: int, result: PublishResult,
                     progress) -> None:
    im = IcebergMirror(table)
    mapped = map_schema(head.schema, ("iceberg",))
    result.published["iceberg"] = []
    for _ in range(MAX_ATTEMPTS):
        latest = im.latest()
        snapshots, prev, prev_list, buckets, next_row_id = [], None, [], 1, 0
        reset = latest is None
        if latest is not None:
            _, meta = latest
            props = meta.get("properties", {})
            last = int(props.get("flightsrv.version", -1))
            mine = table.log.try_load(last) if 0 <= last else None  # ahead too: see delta
            if props.get("flightsrv.table-uuid") != head.table_uuid or mine is None \
                    or last < start:
                reset = True
                result.reset.append("iceberg")
            else:
                snapshots = [s for s in meta.get("snapshots", [])
                             if int(s["summary"]["flightsrv.version"]) >= start]
                prev = mine
                current = next(s for s in meta["snapshots"]
                               if s["snapshot-id"] == meta["current-snapshot-id"])
                prev_list = im.read_list(current["manifest-list"])
                buckets = int(props.get("flightsrv.buckets", 1))
                next_row_id = int(meta.get("next-row-id", 0))
        if not reset and prev.version > head.version:
            break  # ahead of this publisher's head: another one got further, nothing to do
        expired = latest is not None and not reset and len(snapshots) != len(
            latest[1].get("snapshots", []))
        first = start if reset else prev.version + 1
        done = []
        for v in range(first, head.version + 1):
            m = table.log.load(v)
            with _naming_version(m, head):
                vm = mapped if m.schema_id == head.schema_id else \
                    map_schema(m.schema, ("iceberg",))
            snap = im.snapshot(prev, prev_list, buckets, m, vm, next_row_id)
            prev_list, buckets, next_row_id = snap["_list"], snap["_buckets"], \
                snap["_next_row_id"]
            result.changed_files += snap["_changed"]
            snapshots.append(snap)
            done.append(v)
            prev = m
            if progress is not None:
                progress.advance(1, note=f"iceberg v{v}")
        if not done and not expired:
            break  # up to date
        number = latest[0] + 1 if latest is not None else 0
        meta = im.metadata(head, mapped, snapshots, latest, buckets, next_row_id)
        if im.commit_metadata(number, meta):
            result.published["iceberg"] = done
            gone = _drop_old_metadata(im, number) if expired or reset else []
            if gone:
                result.expired["iceberg"] = gone
            break
        log.info("iceberg publish lost a race; retrying", extra={"table": table.name,
                                                                  "metadata": number})
    else:
        raise ConfigurationError("Iceberg publish kept losing races to other publishers",
                                 table=table.name, attempts=MAX_ATTEMPTS)
    latest = im.latest()
    if latest is not None:
        vs = [int(s["summary"]["flightsrv.version"]) for s in latest[1]["snapshots"]]
        result.mirror_versions["iceberg"] = (min(vs), max(vs)) if vs else (None, None)
        result.locations["iceberg"] = im.uri(iceberg_mod.metadata_key(latest[0]))


@contextlib.contextmanager
def _naming_version(m: Manifest, head: Manifest):
    """An older retained version's column type the format cannot hold (the head's is
    checked first): the refusal names that version and how to get past it."""
    try:
        yield
    except UnsupportedForMirror as exc:
        if m.version == head.version or "version" in exc.context:
            raise
        raise UnsupportedForMirror(
            f"{exc.message}; retained version {m.version} has that column type (the head "
            "does not): expire the versions before the change (VACUUM t RETAIN n VERSIONS, "
            "or flightsrv table expire), then publish", **exc.context,
            version=m.version) from None


def _drop_old_metadata(im: IcebergMirror, newest: int) -> list[str]:
    """Delete metadata files older than ``newest``: they list expired snapshots."""
    gone = []
    for meta in list(im.store.list(iceberg_mod.PREFIX)):
        n = iceberg_mod.metadata_number(meta.key)
        if n is not None and n < newest:
            im.store.delete(meta.key)
            gone.append(meta.key)
    return gone


# -- entry points ---------------------------------------------------------------------


def publish(table, formats=FORMATS, *, progress=None) -> PublishResult:
    """Bring the mirrors in ``formats`` up to the table's head (see the module docstring).
    A dropped table has its mirrors removed."""
    formats = parse_formats(formats)
    if not formats:
        raise ConfigurationError("nothing to publish: name a format (delta, iceberg, all)",
                                 table=table.name)
    head = table.log.head()
    if head is None:
        raise TableNotFound("no such table", table=table.name)
    result = PublishResult(table=table.name, head_version=head.version, formats=list(formats))
    table.ensure_writable()
    if head.dropped:
        for f in formats:
            gone = (DeltaMirror(table) if f == "delta" else IcebergMirror(table)).drop()
            if gone:
                result.expired[f] = gone
        return result
    map_schema(head.schema, formats)  # refuse unsupported types before writing anything
    start = incarnation(table, head)
    _refuse_inlined(table, start, head)
    if progress is not None:
        progress.total = None
        progress.unit = " versions"
    refused = None
    try:
        if "delta" in formats:
            try:
                _publish_delta(table, head, start, result, progress)
            except UnsupportedForMirror as exc:
                refused = exc  # a version Delta cannot express: Iceberg is still published
        if "iceberg" in formats:
            _publish_iceberg(table, head, start, result, progress)
    finally:
        if progress is not None and hasattr(progress, "finish"):
            progress.finish()
    if refused is not None:
        raise refused
    log.info("publish", extra={"table": table.name, "version": head.version,
                               "formats": ",".join(formats),
                               "changed_files": result.changed_files})
    return result


def _refuse_inlined(table, start: int, head: Manifest) -> None:
    """A Delta or Iceberg reader cannot read inlined rows (docs/PROTOCOL.md §18.7): refuse,
    before writing anything, to publish when a version to mirror reaches some."""
    for v in range(start, head.version + 1):
        m = table.log.try_load(v)
        if m is not None and m.inline[0]:
            raise ConfigurationError(
                "a version to publish holds inlined rows, which Delta and Iceberg readers "
                "cannot read: flush them (OPTIMIZE), then expire the versions before the "
                "flush (expire_snapshots), and publish again", table=table.name, version=v,
                inlined_files=m.inline[0])


def mirrors_present(table) -> list[str]:
    out = []
    if any(True for _ in table.store.list(delta_mod.LOG_PREFIX)):
        out.append("delta")
    if any(True for _ in table.store.list(iceberg_mod.PREFIX)):
        out.append("iceberg")
    return out


def expire(table, oldest: Manifest | None = None) -> dict:
    """Remove expired versions from every mirror present (called after
    ``expire_snapshots`` deleted manifests): the mirrors are brought up to the head, which
    starts them at the oldest retained version. Returns format -> removed keys."""
    present = mirrors_present(table)
    if not present:
        return {}
    return publish(table, present).expired


def referenced(table) -> set[str]:
    """Mirror keys a retained mirror version needs (vacuum keeps them)."""
    return DeltaMirror(table).referenced() | IcebergMirror(table).referenced()


def object_refs(table, key: str) -> set[str]:
    """Table keys (data files, DV files) that a mirror object makes readers read; empty for
    objects that name only other mirror objects (erasure verification)."""
    if key.startswith(delta_mod.LOG_PREFIX):
        return DeltaMirror(table).object_refs(key)
    if key.startswith(iceberg_mod.PREFIX):
        return IcebergMirror(table).object_refs(key)
    return set()


def is_mirror_key(key: str) -> bool:
    return key.startswith(MIRROR_PREFIXES)


def iceberg_snapshot_id(version: int) -> int:
    return snapshot_id(version)


# -- the after-commit hook and its worker ---------------------------------------------


class _Worker:
    """One publishing thread per process; tables are coalesced (a table queued twice is
    published once, to its head at that time)."""

    def __init__(self):
        self._lock = threading.Condition()
        self._pending: dict[int, tuple] = {}
        self._thread: threading.Thread | None = None
        self._busy = False

    def submit(self, table, formats, retire: bool = False) -> None:
        """Queue a publish of ``formats``; ``retire``: also remove the mirrors of a
        replaced incarnation that the new one does not publish."""
        with self._lock:
            key = id(table)
            old = self._pending.get(key)
            self._pending[key] = (table, tuple(sorted(set(formats) | set(old[1] if old
                                                                        else ()))),
                                  retire or bool(old and old[2]))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="flightsrv-publish",
                                                daemon=False)
                self._thread.start()
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._busy = False
                    self._lock.notify_all()
                    return
                _, (table, formats, retire) = self._pending.popitem()
                self._busy = True
            try:
                if retire:
                    retire_replaced(table, keep=formats)
                if formats:
                    publish(table, formats)
            except Exception as exc:  # noqa: BLE001 - best effort: log, never raise
                log.warning("publish after commit failed", extra={
                    "table": table.name, "formats": ",".join(formats), "error": str(exc)})

    def wait_idle(self, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True


_WORKER = _Worker()


def after_commit(table, m: Manifest) -> None:
    """The after-commit hook: queue a publish when the committed version has
    ``publish.formats`` (a drop: when its last live version had it). Never raises."""
    try:
        formats = parse_formats(m.properties.get(PROPERTY))
    except ConfigurationError as exc:
        log.warning("publish.formats is invalid", extra={"table": table.name,
                                                         "error": str(exc)})
        return
    if formats or m.operation == "replace":
        # a CREATE OR REPLACE: the replaced table's mirrors go (a new publish starts over)
        _WORKER.submit(table, formats, retire=m.operation == "replace")


def retire_replaced(table, keep=()) -> list[str]:
    """Remove the Delta and Iceberg mirrors at ``table``'s location that belong to another
    incarnation than its head (a CREATE OR REPLACE of a table that published them), except
    those of ``keep`` (the new incarnation publishes those: its publish starts them over).
    The replaced rows would otherwise stay readable there. Returns the keys deleted."""
    head = table.log.head()
    if head is None or head.dropped:
        return []
    gone: list[str] = []
    if "delta" not in keep:
        dm = DeltaMirror(table)
        commits, _ = dm.listing()
        if commits and (dm.commit_info(commits[-1]) or {}).get("table_uuid") != \
                head.table_uuid:
            gone += dm.drop()
    if "iceberg" not in keep:
        im = IcebergMirror(table)
        latest = im.latest()
        if latest is not None and latest[1].get("properties", {}).get(
                "flightsrv.table-uuid") != head.table_uuid:
            gone += im.drop()
    return gone


def wait_idle(timeout: float = 60.0) -> bool:
    """Wait until queued after-commit publishes are done (True) or ``timeout`` passes."""
    return _WORKER.wait_idle(timeout)

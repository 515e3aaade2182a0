"""The one commit loop (docs/PROTOCOL.md §Commit). Every write path goes through ``commit``.

Storage semantics live in ``TableLog``; manifest meaning lives in the mutators callers pass.

Linearization point: the ``If-None-Match: *`` create of ``manifest/v{N}.json``. Exactly one
writer creates version N; that write *is* the commit. Afterwards the writer moves the
``_latest_manifest`` pointer forward by compare-and-swap (``If-Match``). The pointer is a hint
that may lag (a writer can die between the two writes); readers roll forward from it by
probing ``v{N+1}``, ``v{N+2}``, ... until one is missing.

A mutator gets the current head manifest and returns the next one (or ``None`` for a no-op).
On a lost race the loop reloads the head and calls the mutator again, so a retry always
re-validates against the new head. Mutators raise to abort (e.g. ``CommitConflict`` when a
requirement no longer holds).

After-commit hooks (``TableLog.after_commit``) run once per committed version, after the
pointer update, with the committed manifest. They are best effort: the commit has happened,
so an exception from a hook is logged and never reaches the committer. (The table registers
its mirror publisher there; this module knows nothing about what hooks do.)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from cachetools import LRUCache

from flightsrv import telemetry
from flightsrv.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    CorruptObject,
    ObjectNotFound,
    PreconditionFailed,
    StoreError,
    TableNotFound,
    VersionNotFound,
)
from flightsrv.runtime import Runtime
from flightsrv.store.base import ObjectStore, PutMode
from flightsrv.table.chunks import ChunkStore, FileList, build
from flightsrv.table.manifest import POINTER_KEY, Manifest, Pointer, manifest_key, version_of_key

log = logging.getLogger("flightsrv.commit")

Mutator = Callable[[Manifest | None], Manifest | None]

MAX_ATTEMPTS = 30
BACKOFF_BASE_S = 0.005
BACKOFF_MAX_S = 0.5


#: head reads' probes for the next version, made while the pointer is read (remote stores)
_PROBES = ThreadPoolExecutor(max_workers=16, thread_name_prefix="flightsrv-head")


class TableLog:
    """Reads and writes one table's pointer and manifests. Manifests are cached (immutable),
    and so are the manifest chunks of format-2 versions (``self.chunks``)."""

    def __init__(self, store: ObjectStore, name: str, runtime: Runtime, cache_size: int = 64):
        self.store = store
        self.name = name
        self.runtime = runtime
        self.chunks = ChunkStore(store, name, runtime)
        self._cache: LRUCache[int, Manifest] = LRUCache(maxsize=cache_size)
        self._lock = threading.Lock()  # guards ``_cache`` and ``_uuid``
        self._uuid: str | None = None
        #: the pointer this log read last and its ETag (any thread's read): the first
        #: compare-and-swap of :meth:`advance_pointer` is made against it, with no GET
        self._seen_pointer: tuple[Pointer, str] | None = None
        #: the last head :meth:`_checked` found no gap after (checked once per head)
        self._gapless: int | None = None
        #: callables ``hook(manifest)`` run after each commit of this log (best effort)
        self.after_commit: list[Callable[[Manifest], None]] = []
        #: a head read overlaps its two requests (see :meth:`head`): on a remote store,
        #: where each is a round trip, unless the runtime replays store calls in order
        local = getattr(store, "local_path", lambda key: None)(POINTER_KEY) is not None
        self._overlap = runtime.overlap_reads and not local

    def run_after_commit(self, m: Manifest) -> None:
        for hook in list(self.after_commit):
            try:
                hook(m)
            except Exception as exc:  # noqa: BLE001 - a hook never fails the commit
                log.warning("after-commit hook failed", extra={"table": self.name,
                                                               "version": m.version,
                                                               "error": str(exc)})

    # -- reading -------------------------------------------------------------------
    def read_pointer(self) -> tuple[Pointer | None, str | None]:
        try:
            raw, meta = self.store.get(POINTER_KEY)
        except ObjectNotFound:
            return None, None
        ptr = Pointer.from_json(raw, key=f"{self.name}/{POINTER_KEY}")
        if meta.etag:
            self._seen_pointer = (ptr, meta.etag)
        return ptr, meta.etag

    def _cached(self, version: int) -> Manifest | None:
        with self._lock:
            return self._cache.get(version)

    def _remember(self, m: Manifest) -> None:
        with self._lock:
            if self._uuid is not None and m.table_uuid != self._uuid and m.version >= max(
                    self._cache, default=-1):
                self._cache.clear()  # the table was dropped and re-created elsewhere
            self._uuid = m.table_uuid
            self._cache[m.version] = m  # evicts the least recently used

    def try_load(self, version: int) -> Manifest | None:
        m = self._cached(version)
        if m is not None:
            return m
        key = manifest_key(version)
        try:
            raw, _ = self.store.get(key)
        except ObjectNotFound:
            return None
        m = Manifest.from_json(raw, key=f"{self.name}/{key}", chunks=self.chunks)
        if m.version != version:
            raise CorruptObject("manifest holds the wrong version", table=self.name, key=key,
                                expected=version, found=m.version)
        self._remember(m)
        return m

    def load(self, version: int) -> Manifest:
        m = self.try_load(version)
        if m is None:
            head = self.head()
            oldest = self.oldest_readable(head=head)
            if oldest is not None and head is not None and oldest < version < head.version:
                # inside the retained run (expiry deletes from the oldest up): damage
                raise self._gap(version)
            raise VersionNotFound(
                "version does not exist or was expired", table=self.name, version=version,
                oldest_retained=oldest,
            )
        return m

    def load_retained(self, version: int) -> Manifest:
        """:meth:`load`, and the version is still retained now: a manifest this process
        cached stays valid as long as its object exists, and an expired one (an erasure's
        PURGE ... EXPIRE deletes it) must not keep serving the rows it held, inlined ones
        included, from memory. One HEAD request when the manifest was cached."""
        cached = self._cached(version) is not None
        m = self.load(version)
        if cached:
            try:
                self.store.head(manifest_key(version))
            except ObjectNotFound:
                with self._lock:
                    self._cache.pop(version, None)
                raise VersionNotFound("version does not exist or was expired",
                                      table=self.name, version=version,
                                      oldest_retained=self.oldest_readable()) from None
        return m

    def head(self) -> Manifest | None:
        """The latest committed manifest: pointer, then roll forward. None: no table.

        On a remote store the probe for the version after the latest one this log knows
        is sent while the pointer is read, so a head read with no new commit costs one
        round trip, not two. The probe starts after this call did, so it sees every
        version created before the call (a commit is the create of its manifest); when
        the pointer is not past that known version, the probe's answer is the roll
        forward's first step.

        Damage is named, never read around (docs/PROTOCOL.md §7): a pointer naming a
        version whose manifest is missing, or a missing manifest with a later one stored
        (a gap in the version chain), is ``CorruptObject``; a lost pointer is recovered
        from the listed manifests (:meth:`_head_from_listing`)."""
        known = self._latest_known() if self._overlap else None
        probe = None
        if known is not None:
            try:
                probe = _PROBES.submit(self.try_load, known.version + 1)
            except RuntimeError:  # the interpreter is shutting down: read in order
                probe = None
        ptr, _ = self.read_pointer()
        if probe is not None and ptr is not None and ptr.table_uuid == known.table_uuid \
                and ptr.version <= known.version:
            nxt = probe.result()
            return self._checked(known) if nxt is None else self._roll_forward(nxt)
        if ptr is None:
            m = self.try_load(0)
            if m is None:
                return self._head_from_listing()
        else:
            if self._uuid is not None and ptr.table_uuid != self._uuid:
                with self._lock:
                    self._cache.clear()
            m = self._pointed(ptr)
        return self._roll_forward(m)

    def _pointed(self, ptr: Pointer) -> Manifest:
        """The manifest the pointer names. The pointer only ever names a committed,
        retained version (expiry moves it to the head before deleting anything below), so
        a missing one is damage, unless the pointer moved on since it was read (an expiry
        raced this read): then the new pointer is followed."""
        for _ in range(3):
            m = self.try_load(ptr.version)
            if m is not None:
                return m
            again, _ = self.read_pointer()
            if again is None or again == ptr:
                break
            ptr = again
        raise CorruptObject(
            "the pointer names a version whose manifest does not exist: restore the "
            "manifest, or the pointer from a backup", table=self.name,
            key=f"{self.name}/{POINTER_KEY}", version=ptr.version,
            missing=f"{self.name}/{manifest_key(ptr.version)}")

    def _head_from_listing(self) -> Manifest | None:
        """The head of a table whose pointer is missing and whose ``v0`` is gone (expired):
        the pointer is a hint (§3), so its loss must not hide the table (a CREATE would then
        start a new ``v0`` beside it, and a vacuum delete its files). The listed versions
        must be one contiguous run; the newest is loaded and rolled forward. None: no
        manifest is stored, no table. One LIST, only when both the pointer and ``v0`` are
        missing."""
        for _ in range(3):
            listed = self.versions()
            if not listed:
                return None
            lo, hi = listed[0], listed[-1]
            if len(listed) != hi - lo + 1:
                have = set(listed)
                raise self._gap(next(v for v in range(lo, hi) if v not in have))
            m = self.try_load(hi)
            if m is not None:
                return self._roll_forward(m)
            # gone since the listing: a DROP's vacuum or an erasure expired it; list again
        raise CorruptObject("a listed manifest cannot be read", table=self.name,
                            key=f"{self.name}/{manifest_key(hi)}", version=hi)

    def _roll_forward(self, m: Manifest) -> Manifest:
        """The last of ``m``, ``v{m+1}``, ``v{m+2}``, ... that exists."""
        while True:
            nxt = self.try_load(m.version + 1)
            if nxt is None:
                return self._checked(m)
            m = nxt

    def _checked(self, m: Manifest) -> Manifest:
        """``m``, whose next version is missing, as the head, unless ``v{m+2}`` is stored: a
        manifest is missing from the chain (lost or half restored) and reading on from ``m``
        would serve an old version, and a commit would fill the gap under a later version
        that does not hold it. One HEAD request the first time a version is the head."""
        if self._gapless == m.version:
            return m
        try:
            self.store.head(manifest_key(m.version + 2))
        except ObjectNotFound:
            self._gapless = m.version
            return m
        nxt = self.try_load(m.version + 1)  # a writer committed m+1 and m+2 meanwhile
        if nxt is not None:
            return self._roll_forward(nxt)
        raise self._gap(m.version + 1)

    def _gap(self, version: int) -> CorruptObject:
        return CorruptObject(
            "a manifest is missing from the version chain (a later version is stored): "
            "restore it from a backup", table=self.name,
            key=f"{self.name}/{manifest_key(version)}", version=version)

    def _latest_known(self) -> Manifest | None:
        """The newest manifest this log holds of the table's current incarnation."""
        with self._lock:
            if self._uuid is None or not self._cache:
                return None
            m = self._cache.get(max(self._cache))
        return m if m is not None and m.table_uuid == self._uuid else None

    def versions(self) -> list[int]:
        out = []
        for meta in self.store.list("manifest/"):
            v = version_of_key(meta.key)
            if v is not None:
                out.append(v)
        return sorted(out)

    def oldest_version(self) -> int | None:
        vs = self.versions()
        return vs[0] if vs else None

    def oldest_readable(self, versions: list[int] | None = None, *,
                        head: Manifest | None = None) -> int | None:
        """The oldest retained version time travel can read: of the table's current
        incarnation (a DROP or CREATE OR REPLACE starts a new one, whose versions follow
        the old ones', and time travel never crosses it). What errors name as
        ``oldest_retained``. ``versions``, ``head``: the listing and the head, if the
        caller has them. A few
        manifest reads (a binary search: the current incarnation's versions are a
        suffix); only on error and reporting paths."""
        vs = self.versions() if versions is None else versions
        head = self.head() if head is None else head
        if not vs or head is None:
            return vs[0] if vs else None
        lo, hi = 0, len(vs) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            m = self.try_load(vs[mid])
            if m is not None and m.table_uuid == head.table_uuid and not m.dropped:
                hi = mid
            else:
                lo = mid + 1
        return vs[lo]

    # -- writing -------------------------------------------------------------------
    def write_manifest(self, m: Manifest, base: Manifest | None = None, *,
                       fold: bool = False) -> Manifest:
        """The commit point. Raises PreconditionFailed if version ``m.version`` exists.

        Format 2: first writes the manifest chunks of ``m.data_files`` that ``base`` (the
        version ``m`` was made from) does not already have (CREATE under new keys; they are
        unreferenced until the root lands), then the root. Returns ``m`` with its file list
        as written (a ``FileList`` over the new root's chunks). ``fold``: no file entry may
        stay in a chunk behind the root's overlay (erasures)."""
        if m.format_version >= 2:
            files = m.data_files
            if not (isinstance(files, FileList) and files.chunks is self.chunks
                    and not files.tail and not (fold and files.overlay)):
                m = dataclasses.replace(m, data_files=build(
                    self.chunks, files, base.data_files if base is not None else None, m,
                    fold=fold))
        self.store.put(manifest_key(m.version), m.to_json(), mode=PutMode.CREATE)
        self._remember(m)
        return m

    def advance_pointer(self, m: Manifest) -> None:
        """Move the pointer forward to ``m`` by CAS; never backward. Best effort: a failure
        here leaves a lagging hint, which readers correct by rolling forward."""
        new = Pointer(m.version, m.table_uuid, m.commit_id, m.format_version)
        body = new.to_json()

        def swapped(meta) -> None:  # the pointer is now ``new``, under the ETag it got
            if getattr(meta, "etag", None):
                self._seen_pointer = (new, meta.etag)

        # the first swap is against the pointer as last read (by the commit's own head,
        # usually): if it is still that object, it is behind m and moves forward with no GET
        seen = self._seen_pointer
        known = seen if seen is not None and seen[0].version < m.version and \
            seen[0].table_uuid == m.table_uuid else None
        for _ in range(8):
            try:
                ptr, etag = known if known is not None else self.read_pointer()
                known = None  # moved or rewritten since: read it on the next try
                if ptr is None:
                    swapped(self.store.put(POINTER_KEY, body, mode=PutMode.CREATE))
                    return
                if ptr.version >= m.version and ptr.table_uuid == m.table_uuid:
                    return
                swapped(self.store.put(POINTER_KEY, body, mode=PutMode.IF_MATCH, etag=etag))
                return
            except PreconditionFailed:
                continue
            except StoreError as exc:
                log.warning("pointer update failed", extra={"table": self.name,
                                                            "version": m.version,
                                                            "error": str(exc)})
                return


def commit(
    tlog: TableLog,
    mutator: Mutator,
    *,
    runtime: Runtime,
    max_attempts: int = MAX_ATTEMPTS,
    before_write: Callable[[], None] | None = None,
    fold: bool = False,
    on_commit: Callable[[Manifest], bool | None] | None = None,
) -> Manifest | None:
    """Run ``mutator`` against the head and commit its result as the next version.

    Returns the committed manifest, or ``None`` when the mutator declined (no-op).
    ``fold``: write every changed file entry into its chunk (no root overlay; erasures).
    ``on_commit(m)``: called once the version has landed (its manifest created), before the
    pointer (a hint) moves and the after-commit hooks run; it must not raise (the group
    commit releases its waiters there). It returns False when a later commit, already under
    way, is to move the pointer instead (the pointer may lag, §3).
    Raises ``CommitConflict`` naming the table and versions when retries run out.
    """
    head = tlog.head()
    first_seen = head.version if head else None
    for attempt in range(1, max_attempts + 1):
        draft = mutator(head)
        if draft is None:
            return None
        version = 0 if head is None else head.version + 1
        now = runtime.clock.now_ms()
        if head is not None:
            now = max(now, head.created_at_ms)  # created_at never goes backward
        m = dataclasses.replace(
            draft, version=version, previous=None if head is None else head.version,
            commit_id=runtime.ids.new_id(), created_at_ms=now,
            table_uuid=draft.table_uuid or (head.table_uuid if head else runtime.ids.new_id()),
        )
        if before_write is not None:
            before_write()
        try:
            m = tlog.write_manifest(m, head, fold=fold)
        except PreconditionFailed:
            # someone's manifest holds the version: ours, when the create landed and its
            # reply was lost (the client's own retry then finds the object: 412), or
            # another writer's
            landed = _landed(tlog, version, m, runtime)
            if landed is None:
                telemetry.emit("commit_conflict", table=tlog.name, operation=m.operation)
                delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** min(attempt, 10)))
                runtime.clock.sleep(runtime.rng.uniform(0, delay))
                head = tlog.head()
                continue
            m = landed
        except StoreError:
            # Outcome unknown: did our manifest land? Check by commit id before retrying.
            landed = _landed(tlog, version, m, runtime)
            if landed is not None:
                m = landed
            else:
                head = tlog.head()
                continue
        if on_commit is None or on_commit(m) is not False:
            tlog.advance_pointer(m)
        telemetry.emit("commit", table=tlog.name, operation=m.operation, version=m.version,
                       attempts=attempt)
        log.info("commit", extra={"table": tlog.name, "version": m.version,
                                  "operation": m.operation, "attempts": attempt})
        tlog.run_after_commit(m)
        return m
    raise CommitConflict(
        "commit retries exhausted against concurrent writers", table=tlog.name,
        first_seen_version=first_seen, last_seen_version=head.version if head else None,
        attempts=max_attempts,
    )


def _landed(tlog: TableLog, version: int, m: Manifest, runtime: Runtime) -> Manifest | None:
    """The manifest at ``version`` when it is ``m`` (same commit id: the create landed);
    None when the version is another writer's or absent. When the store does not answer
    the check, the outcome is unknown: CommitOutcomeUnknown, not a failure a caller would
    retry (a retry could apply the write twice)."""
    for attempt in range(3):
        try:
            landed = tlog.try_load(version)
        except StoreError as exc:
            if attempt == 2:
                raise CommitOutcomeUnknown(
                    "the store did not answer whether the commit landed: the version may "
                    "hold this write; read the table's history (SHOW HISTORY) before "
                    "retrying it", table=tlog.name, version=version,
                    commit_id=m.commit_id, error=str(exc)) from None
            runtime.clock.sleep(BACKOFF_BASE_S * (2 ** attempt))
            continue
        return landed if landed is not None and landed.commit_id == m.commit_id else None
    return None


def require_table(m: Manifest | None, name: str) -> Manifest:
    if m is None or m.dropped:
        raise TableNotFound("no such table", table=name)
    return m

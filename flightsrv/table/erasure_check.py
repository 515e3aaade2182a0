"""Completing and verifying an erasure (docs/ERASURE.md §What "erased" means).

An erasure (``erase.splice_positions``, ``erase.purge``) first commits a version whose files no
longer hold the rows. This module then deals with everything *else* that may still hold them,
and proves the result by re-reading the store instead of trusting what the erasure did:

``finish(table, erased, expire=..., grace_ms=...)``
    With ``expire``: commits a clean head if the head's summary still carries request text
    or its chunks keep entries of files that left through the overlay,
    expires every version that references an erased object or carries such text (through
    ``maintenance.expire_snapshots``, so the retained versions stay a contiguous run ending
    at the head), deletes every erased object no retained version references, and deletes
    unreferenced objects under ``data/`` and ``tombstone/`` older than ``grace_ms`` (outputs
    of failed runs; a younger one may be a write in flight and is left, and reported; a
    grace of 0 removes them all, whatever their time: only safe with no writer running).
    Then ``verify``.

``verify(table, erased, all_dead=...)`` re-reads, from the store and not from caches:
    - the listing of every object under the table prefix, and the open multipart uploads;
    - every retained manifest (raw bytes, parsed) and the pointer.
    A manifest *matches* when it references an erased object, its summary carries request
    text (``TRACE_SUMMARY_KEYS``), or a chunk it references keeps the entry of a file that
    left through its overlay (``hidden_entries``: whatever this run erased, that entry's
    statistics or inlined rows may be deleted rows'); an erased object matches while it is
    still listed. Status
    ``erased`` needs 0 matches and nothing pending. Pending: an unreferenced ``data/`` object
    or upload younger than the grace (it may hold the rows), objects under a prefix this
    check does not know, and, for a purge (``all_dead``), rows deleted in the head after the
    purge planned (still stored behind a DV). The result says what was read.
    Manifest chunks (``chunks/``, format 2) are read literally: a chunk that lists an erased
    object (with its statistics) matches, whether a retained root references it or not.
    Mirror objects (``flightsrv.table.mirror``: ``_delta_log/``, ``_delta_dv/``,
    ``metadata/``) are read too: one *matches* when it makes readers read an erased object
    (a Delta ``add``, a live Iceberg manifest entry; both carry the file's statistics).
    ``sweep`` deletes unreferenced mirror objects that match; expiry has already removed the
    expired versions from the mirrors.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from flightsrv.errors import CorruptObject, ObjectNotFound
from flightsrv.table.chunks import CHUNK_PREFIX, ChunkStore
from flightsrv.table.commit import require_table
from flightsrv.table.manifest import POINTER_KEY, Manifest, Pointer, version_of_key
from flightsrv.table.mirror import MIRROR_PREFIXES, object_refs
from flightsrv.table.mirror import referenced as mirror_referenced

log = logging.getLogger("flightsrv.erase")

#: Summary keys that may hold request text (or an unkeyed, guessable hash of it). A version
#: whose summary has one is a trace: an erasure with ``expire`` expires it.
TRACE_SUMMARY_KEYS = frozenset({"predicate", "predicate_sha256", "where", "sql", "statement",
                                "filter"})
#: What the SQL layer records under ``statement``: the statement's kind, never its text
#: (``engine.params.kind_name``). Only another value there can be request text.
STATEMENT_KINDS = frozenset({"delete", "update", "merge", "insert", "create", "drop", "set",
                             "maintenance", "alter", "select"})
#: Prefixes under a table whose objects this module knows how to judge.
KNOWN_PREFIXES = ("data/", "tombstone/", "manifest/", "chunks/", "_erasures/", "_delta_log/",
                  "_delta_dv/", "metadata/")
ERASED, PENDING = "erased", "pending"


def summary_traces(m: Manifest) -> list[str]:
    """Summary keys of ``m`` that carry request text (a statement's kind is not text)."""
    return sorted(k for k, v in m.summary.items() if k in TRACE_SUMMARY_KEYS
                  and not (k == "statement" and v in STATEMENT_KINDS))


def hidden_entries(m: Manifest) -> list[str]:
    """Paths of files that left version ``m`` through its root's overlay: a chunk ``m``
    references still lists each one's entry (its statistics, an inlined file's rows), so
    the bytes of rows deleted with it may be stored there."""
    overlay = getattr(m.data_files, "overlay", None) or {}
    return sorted(p for p, o in overlay.items() if o is None)


def _load_raw(table, version: int, chunks=None) -> Manifest | None:
    """Read one manifest from the store, bypassing the cache (a re-read, not a belief);
    its chunks through ``chunks`` (a fresh ``ChunkStore`` per verification)."""
    from flightsrv.table.manifest import manifest_key

    key = manifest_key(version)
    try:
        raw, _ = table.store.get(key)
    except ObjectNotFound:
        return None
    if chunks is None:
        chunks = ChunkStore(table.store, table.name, table.runtime)
    return Manifest.from_json(raw, key=f"{table.name}/{key}", chunks=chunks)


def retained(table) -> list[Manifest]:
    """Every retained manifest, oldest first (cached reads)."""
    out = []
    for v in table.log.versions():
        m = table.log.try_load(v)
        if m is not None:
            out.append(m)
    return out


# -- verification --------------------------------------------------------------------


@dataclass
class Verification:
    """What the check read, what it found, and the resulting status."""

    status: str  # "erased" | "pending"
    checked_at_ms: int
    head_version: int | None
    manifests: list = field(default_factory=list)  # [{key, version, matches, traces?}]
    mirrors: list = field(default_factory=list)  # mirror objects read [{key, matches}]
    chunks: list = field(default_factory=list)  # manifest chunks listing erased objects
    pointer: dict | None = None  # {key, version, matches}
    listed: dict = field(default_factory=dict)  # prefix -> objects listed
    erased_absent: list = field(default_factory=list)  # erased keys confirmed gone
    erased_present: list = field(default_factory=list)  # erased keys still stored
    pending: list = field(default_factory=list)  # [{object, reason, remedy}]

    @property
    def matches(self) -> int:
        return (sum(m["matches"] for m in self.manifests) + len(self.erased_present)
                + (self.pointer or {}).get("matches", 0)
                + sum(m["matches"] for m in self.mirrors)
                + sum(m["matches"] for m in self.chunks))

    @property
    def objects_scanned(self) -> int:
        return len(self.manifests) + (1 if self.pointer else 0) + len(self.erased_absent) \
            + len(self.erased_present) + len(self.mirrors) + self.chunks_read

    chunks_read: int = 0  # manifest chunks read

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["matches"] = self.matches
        d["objects_scanned"] = self.objects_scanned
        return d


def verify(table, erased: dict[str, str], *, all_dead: bool, grace_ms: int | None) -> Verification:
    """Re-read the table's objects and decide whether the erasure is complete (see the
    module docstring). ``erased``: key -> kind of every object that held the erased rows.
    ``grace_ms`` None: unreferenced objects are pending whatever their age (no sweep ran)."""
    now = table.runtime.clock.now_ms()
    listing = list(table.store.list(""))
    uploads = list(table.store.list_multipart(""))
    v = Verification(status=PENDING, checked_at_ms=now, head_version=None)
    for m in listing:
        prefix = m.key.split("/", 1)[0] + "/" if "/" in m.key else m.key
        v.listed[prefix] = v.listed.get(prefix, 0) + 1
    stored = {m.key: m for m in listing}
    # DV objects hold row positions, never values: a shared one may stay referenced
    value_keys = {k for k, kind in erased.items() if kind != "dv"}
    # manifests: every listed one, read raw; the head may roll past the listing
    refs: set[str] = set()
    chunks = ChunkStore(table.store, table.name, table.runtime)  # this verification's reads
    versions = sorted(x for x in (version_of_key(k) for k in stored if k.startswith("manifest/"))
                      if x is not None)
    head = None
    probe = versions[-1] + 1 if versions else 0
    while True:  # roll forward from the listing: commits that landed meanwhile
        if _load_raw(table, probe, chunks) is None:
            break
        versions.append(probe)
        probe += 1
    for ver in versions:
        try:
            m = _load_raw(table, ver, chunks)
        except CorruptObject as exc:  # what it references is unknown: not checked
            v.pending.append(unreadable_item(table, exc, f"manifest/v{ver:020d}.json"))
            continue
        if m is None:
            continue  # expired while we looked
        head = m
        hits = sorted(m.literal_keys() & value_keys)
        traces = summary_traces(m)
        # whatever this run erased: an entry a chunk keeps behind the overlay may bound or
        # hold the rows of any delete (an earlier run may have deleted its data object)
        hidden = hidden_entries(m)
        entry = {"key": f"manifest/v{ver:020d}.json", "version": ver,
                 "matches": len(hits) + (1 if traces else 0)
                 + len(set(hidden) - set(hits))}
        if hits:
            entry["references"] = hits
        if traces:
            entry["traces"] = traces
        if hidden:
            entry["hidden"] = hidden
        v.manifests.append(entry)
        refs |= m.referenced_keys()
    v.head_version = head.version if head else None
    try:
        raw, _ = table.store.get(POINTER_KEY)
        ptr = Pointer.from_json(raw, key=f"{table.name}/{POINTER_KEY}")
        v.pointer = {"key": POINTER_KEY, "version": ptr.version, "matches": 0}
        if ptr.version not in versions:
            v.pending.append({"object": POINTER_KEY, "reason": "the pointer names version "
                              f"{ptr.version}, which is not retained", "remedy": "commit to "
                              "the table (the pointer moves forward)"})
    except ObjectNotFound:
        v.pointer = None
    for key in sorted(erased):
        if key in stored and key in value_keys:
            v.erased_present.append(key)
        elif key not in stored:
            v.erased_absent.append(key)
    _verify_mirrors(table, listing, value_keys, v)
    _verify_chunks(chunks, listing, value_keys, v)
    for m in listing:
        if m.key in refs or m.key in erased or m.key == POINTER_KEY:
            continue
        if m.key.startswith(("manifest/", CHUNK_PREFIX, "_erasures/", "tombstone/")
                            + MIRROR_PREFIXES):
            continue  # manifests and chunks are judged above; DV objects hold positions
        if m.key.startswith("data/"):
            if grace_ms is None:
                reason = "unreferenced data object (no sweep ran: an erasure without expire)"
                remedy = "PURGE ... EXPIRE or VACUUM"
            elif not _old(m.last_modified_ms, now, grace_ms):
                reason = ("unreferenced data object younger than the grace period (a write in "
                          "flight, or a failed run's output) may hold the rows")
                remedy = "run the erasure again after the grace period, or VACUUM"
            else:  # swept objects are gone; one left was written after the sweep listed
                reason = "unreferenced data object"
                remedy = "PURGE ... EXPIRE or VACUUM"
            v.pending.append({"object": m.key, "reason": reason, "remedy": remedy})
            continue
        v.pending.append({"object": m.key, "reason": "object under a prefix the erasure "
                          "check does not know; not checked", "remedy": "inspect it"})
    for u in uploads:
        if u.key.startswith("data/"):
            v.pending.append({"object": f"{u.key} (multipart upload)",
                              "reason": "open multipart upload may hold parts with the rows",
                              "remedy": "run the erasure again after the grace period, or "
                              "VACUUM"})
    if all_dead and head is not None and not head.dropped:
        dead = [f.path for f in head.data_files if f.dv is not None or f.deleted_row_groups]
        if dead:
            v.pending.append({"object": ",".join(dead[:5]) + (" ..." if len(dead) > 5 else ""),
                              "reason": f"{len(dead)} file(s) of the head have rows deleted "
                              "after this purge planned; their bytes are still stored",
                              "remedy": "PURGE again"})
    v.status = ERASED if v.matches == 0 and not v.pending else PENDING
    return v


def unreadable_item(table, exc: CorruptObject, key: str | None = None) -> dict:
    """The pending item of a retained object the check could not read (``exc``; ``key``
    relative to the table, else the one ``exc`` names)."""
    if key is None:
        key = str(exc.context.get("key") or "?").removeprefix(f"{table.name}/")
    return {"object": key,
            "reason": f"{exc}; not checked, so the erasure is not claimed",
            "remedy": "restore the object from a backup, or expire the versions up to it, "
                      "then run the erasure again"}


def chunk_lists(chunks: ChunkStore, key: str) -> set[str]:
    """The object keys one stored chunk lists, literally (a leaf: its files and DV
    objects; an index: its child chunks)."""
    try:
        raw, _ = chunks.store.get(key)
    except ObjectNotFound:
        return set()
    import orjson

    try:
        d = orjson.loads(raw)
    except ValueError:
        return set()
    out: set[str] = set()
    for f in d.get("files") or ():
        out.add(f.get("path"))
        dv = f.get("dv") or {}
        if dv.get("storage") == "object" and dv.get("path"):
            out.add(dv["path"])
    for c in d.get("chunks") or ():
        out.add(c.get("path"))
    return out


def _verify_chunks(chunks: ChunkStore, listing, value_keys: set[str], v: Verification) -> None:
    """Read every stored chunk; one matches when it lists an erased object."""
    for m in listing:
        if not m.key.startswith(CHUNK_PREFIX):
            continue
        v.chunks_read += 1
        hits = sorted(chunk_lists(chunks, m.key) & value_keys)
        if hits:
            v.chunks.append({"key": m.key, "matches": len(hits), "references": hits})


def _sweep_mirrors(table, value_keys: set[str]) -> list[str]:
    """Delete mirror objects no retained mirror version needs that make readers read an
    erased object (manifests of expired Iceberg snapshots, say)."""
    listing = [m for p in MIRROR_PREFIXES for m in table.store.list(p)]
    if not listing or not value_keys:
        return []
    keep = mirror_referenced(table)
    gone = []
    for m in listing:
        if m.key in keep:
            continue
        try:
            hit = object_refs(table, m.key) & value_keys
        except ObjectNotFound:
            continue
        if hit:
            table.store.delete(m.key)
            gone.append(m.key)
    return gone


def _verify_mirrors(table, listing, value_keys: set[str], v: Verification) -> None:
    """Read every mirror object; one matches when it makes readers read an erased object."""
    for m in listing:
        if not m.key.startswith(MIRROR_PREFIXES):
            continue
        try:
            hits = sorted(object_refs(table, m.key) & value_keys)
        except ObjectNotFound:
            continue  # removed while we looked (a racing publish or expiry)
        entry = {"key": m.key, "matches": len(hits)}
        if hits:
            entry["references"] = hits
        v.mirrors.append(entry)


# -- completion ----------------------------------------------------------------------


def unclean_versions(manifests: list[Manifest], erased: dict[str, str], below: int) -> list[int]:
    """Versions before ``below`` that reach an erased object or carry request text."""
    keys = {k for k, kind in erased.items() if kind != "dv"}
    return [m.version for m in manifests if m.version < below and (
        m.literal_keys() & keys or summary_traces(m))]


def clean_head(table) -> Manifest | None:
    """If the head's summary carries request text, or its chunks keep the entries of files
    that left through the overlay (``hidden_entries``: their statistics, an inlined file's
    rows), commit a version without them (same files, operation ``redact``, every leaf the
    overlay touches rewritten) so they can expire with the old head. Returns the new
    head."""
    head = require_table(table.log.head(), table.name)
    if not summary_traces(head) and not hidden_entries(head):
        return None

    def mutate(cur):
        cur = require_table(cur, table.name)
        hidden = hidden_entries(cur)
        if not summary_traces(cur) and not hidden:
            return None
        summary = {"rows_added": 0, "rows_deleted": 0, "files_added": 0, "files_removed": 0,
                   "redacted_version": cur.version}
        if hidden:
            summary["entries_folded"] = len(hidden)
        return dataclasses.replace(cur, operation="redact", summary=summary)

    return table.commit(mutate, fold=True)


def expire_through(table, newest: int) -> list[int]:
    """Expire every version up to ``newest`` (never the head) with ``expire_snapshots``."""
    head = require_table(table.log.head(), table.name)
    if newest >= head.version:
        newest = head.version - 1
    if newest < 0:
        return []
    result = table.expire_snapshots(retain_last=max(1, head.version - newest))
    log.info("expired versions holding erased rows or request text",
             extra={"table": table.name, "versions": len(result.expired_versions)})
    return list(result.expired_versions)


def references(table) -> dict[str, list[int]]:
    """key -> retained versions referencing it (re-listed after expiry)."""
    out: dict[str, list[int]] = {}
    for m in retained(table):
        for k in m.referenced_keys():
            out.setdefault(k, []).append(m.version)
    return out


def _old(modified_ms: int, now: int, grace_ms: int) -> bool:
    """Older than the grace period. An unknown (0) or future time counts as young, except
    with a grace of 0, which an operator passes to remove every unreferenced object."""
    return grace_ms == 0 or 0 < modified_ms <= now - grace_ms


def sweep(table, erased: dict[str, str], grace_ms: int) -> tuple[list[str], list[str]]:
    """Delete erased objects no retained version references, and unreferenced objects under
    ``data/`` and ``tombstone/`` older than ``grace_ms`` (and older multipart uploads).
    Lists before reading references, as vacuum does, so a commit that lands meanwhile
    protects its objects. Returns (deleted keys, aborted uploads)."""
    now = table.runtime.clock.now_ms()
    listing = [m for p in ("data/", "tombstone/", CHUNK_PREFIX) for m in table.store.list(p)]
    uploads = [u for u in table.store.list_multipart("") if u.key.startswith("data/")]
    refs = references(table)
    head = require_table(table.log.head(), table.name)  # a commit after the read above
    live = set(refs) | head.referenced_keys()
    deleted = []
    for key in sorted(erased):
        if key not in live:
            table.store.delete(key)
            deleted.append(key)
    done = set(deleted)
    value_keys = {k for k, kind in erased.items() if kind != "dv"}
    reader = ChunkStore(table.store, table.name, table.runtime)
    for m in listing:
        if m.key in live or m.key in done:
            continue
        # an unreferenced chunk listing an erased file can never be committed again (its
        # writer's attempt predates the erasure): it goes whatever its age
        if _old(m.last_modified_ms, now, grace_ms) or (
                m.key.startswith(CHUNK_PREFIX) and chunk_lists(reader, m.key) & value_keys):
            table.store.delete(m.key)
            deleted.append(m.key)
    deleted += _sweep_mirrors(table, {k for k, kind in erased.items() if kind != "dv"})
    aborted = []
    for u in uploads:
        if _old(u.initiated_ms, now, grace_ms):
            try:
                table.store.abort_multipart(u.key, u.upload_id)
            except ObjectNotFound:
                pass
            aborted.append(u.key)
    return deleted, aborted

"""Hierarchical manifests: the data-file list of a format-2 version as a tree of immutable
chunks (docs/PROTOCOL.md §4.3).

A version's root (``manifest/v{N}.json``) holds a short list of *chunk references*; a
reference names a write-once chunk object ``chunks/YYYY/MM/DD/HH/<id>.json`` and summarises
it (file count, rows, deleted rows, bytes, the range of ``added_version``, per-column
statistics over its files and per-partition-field summaries), so a reader can skip a whole
chunk without reading it. A *leaf* chunk (level 0) lists up to :data:`LEAF_MAX` data-file
entries; an *index* chunk (level L > 0) lists up to :data:`FANOUT` references of level L-1.
The logical file list of the version is the concatenation of its leaves, left to right.

Shape of the root list (kept by :func:`build`): levels never increase from left to right,
and the root holds at most :data:`ROOT_LEAVES` leaf references and :data:`ROOT_INDEX`
references of each higher level; the excess moves down into index chunks (the oldest refs
first). New entries at the end of the list form a binary counter: a fresh run of entries
absorbs the leaf before it while that leaf is not larger than the run, so appending one file
rewrites O(log LEAF_MAX) entries on average and the root stays O(levels) long. So a commit
writes the leaves whose entries changed, the index chunks above them, and the root: its
bytes do not grow with the table.

:class:`FileList` is the lazily loaded logical view (a ``Sequence[DataFile]``): iterating it
loads leaves through the table's :class:`ChunkStore` (parsed chunks cached by key: they are
immutable); ``files + (new, ...)`` shares every chunk and only remembers the new entries;
:meth:`FileList.select` walks the tree and loads only the chunks a filter keeps.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import orjson
from cachetools import FIFOCache, LRUCache

from flightsrv.errors import CorruptObject, ObjectNotFound
from flightsrv.table.datafile import INLINE_FORMAT, INLINE_PREFIX
from flightsrv.store.base import PutMode

CHUNK_PREFIX = "chunks/"
CHUNK_FORMAT = 2
LEAF_MAX = 256  # entries per leaf chunk
FANOUT = 64  # references per index chunk
ROOT_LEAVES = 16  # leaf references the root may hold
ROOT_INDEX = 32  # references of each higher level the root may hold
SMALL_LEAF = LEAF_MAX // 4  # a leaf this small is merged into a neighbouring rewrite
#: a leaf of at most this many entries is the binary counter's tail: its reference carries no
#: statistics or partition summary (it is rewritten soon; a reader reads it, one small GET)
TAIL_LEAF = LEAF_MAX // 2
ROOT_SETTLED = 2  # settled leaves the root holds before they move into an index chunk
_VALUES_MAX = 32  # distinct partition values a chunk summary lists (bucket pruning)

#: what chunk summaries need from the version being written: ``field_type(schema_id,
#: field_id)`` (a type JSON or None) and ``spec_by_id(spec_id)`` (a Manifest provides both)
Layout = object


# -- references ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkRef:
    """A reference to one chunk, with what a reader needs to skip it."""

    path: str
    level: int
    files: int
    rows: int  # physical rows of every file below
    deleted_rows: int
    bytes: int  # data-file bytes below
    added: tuple[int, int]  # min and max added_version below
    stats: dict = field(default_factory=dict)  # field id -> {min, max, nulls, nans, t}
    parts: dict = field(default_factory=dict)  # spec id -> [{lo, hi, nulls, values?}]
    children: int = 0  # entries (leaf) or references (index) in the chunk
    inline: tuple[int, int] = (0, 0)  # inlined files below and their physical rows (§18)

    @property
    def live_rows(self) -> int:
        return self.rows - self.deleted_rows

    def to_json(self) -> dict:
        out = {"path": self.path, "level": self.level, "files": self.files, "rows": self.rows,
               "bytes": self.bytes, "added": list(self.added), "children": self.children}
        if self.deleted_rows:
            out["deleted_rows"] = self.deleted_rows
        if self.stats:
            out["stats"] = self.stats
        if self.parts:
            out["parts"] = self.parts
        if self.inline[0]:
            out["inline"] = list(self.inline)
        return out

    @classmethod
    def from_json(cls, d: dict) -> "ChunkRef":
        return cls(path=d["path"], level=int(d["level"]), files=int(d["files"]),
                   rows=int(d["rows"]), deleted_rows=int(d.get("deleted_rows", 0)),
                   bytes=int(d.get("bytes", 0)), added=tuple(d.get("added", (0, 0))),
                   stats=d.get("stats") or {}, parts=d.get("parts") or {},
                   children=int(d.get("children", 0)),
                   inline=tuple(int(x) for x in d.get("inline", (0, 0))))


# -- statistics aggregation ------------------------------------------------------------

_INT = ("int8", "int16", "int32", "int64")
_UINT = ("uint8", "uint16", "uint32", "uint64")


def _family(t) -> tuple[str, int] | None:
    """(family, width rank) of a type JSON whose stats can be aggregated, else None."""
    if isinstance(t, str):
        if t in _INT:
            return "int", _INT.index(t)
        if t in _UINT:
            return "uint", _UINT.index(t)
        if t in ("float32", "float64"):
            return "float", t == "float64"
        if t in ("string", "large_string", "string_view"):
            return "string", 0
        if t == "bool":
            return "bool", 0
        if t in ("date32", "date64"):
            return "date", 0
        return None
    kind = t.get("type")
    if kind == "decimal":
        return f"decimal:{t['scale']}", t["precision"]
    if kind in ("timestamp", "time", "duration"):
        return f"{kind}:{t.get('unit')}:{t.get('tz')}", 0
    return None


def _key(family: str, v):
    if family.startswith("decimal"):
        try:
            return Decimal(v)
        except (InvalidOperation, TypeError):
            return None
    return v


def aggregate_stats(entries: list[tuple[dict, Callable[[int], object]]]) -> dict:
    """Chunk statistics from ``(stats, type_of(field id))`` per file (or per child chunk,
    whose ``t`` gives the type): per field id the smallest min, largest max, summed null
    and NaN counts (None when any part is unknown), and ``t``, the widest type whose
    encoding the values use. A field whose parts use different type families (a date
    widened to a timestamp) keeps counts only."""
    acc: dict[str, dict] = {}
    n = len(entries)
    for stats, type_of in entries:
        for fid, s in stats.items():
            a = acc.get(fid)
            t = s.get("t") if "t" in s else type_of(int(fid))
            fam = _family(t) if t is not None else None
            if a is None:
                a = acc[fid] = {"seen": 0, "fam": fam[0] if fam else None,
                                "rank": fam[1] if fam else 0, "t": t, "min": None,
                                "max": None, "lo_ok": True, "hi_ok": True, "nulls": 0,
                                "nans": 0}
            a["seen"] += 1
            if fam is None or a["fam"] is None or fam[0] != a["fam"]:
                a["fam"] = None
            elif fam[1] > a["rank"]:
                a["rank"], a["t"] = fam[1], t
            nulls = s.get("nulls")
            a["nulls"] = None if nulls is None or a["nulls"] is None else a["nulls"] + nulls
            nans = s.get("nans")
            a["nans"] = None if nans is None or a["nans"] is None else a["nans"] + nans
            if a["fam"] is None:
                continue
            lo, hi = s.get("min"), s.get("max")
            if lo is None:
                a["lo_ok"] = False
            elif a["lo_ok"]:
                k = _key(a["fam"], lo)
                if k is None:
                    a["lo_ok"] = False
                elif a["min"] is None or k < a["min"][0]:
                    a["min"] = (k, lo)
            if hi is None:
                a["hi_ok"] = False
            elif a["hi_ok"]:
                k = _key(a["fam"], hi)
                if k is None:
                    a["hi_ok"] = False
                elif a["max"] is None or k > a["max"][0]:
                    a["max"] = (k, hi)
    out = {}
    for fid, a in acc.items():
        missing = a["seen"] < n  # a part without stats for this field: unknown nulls
        entry: dict = {"nulls": None if missing else a["nulls"]}
        if a["nans"] is not None and not missing:
            entry["nans"] = a["nans"]
        if a["fam"] is not None and not missing:
            if a["lo_ok"] and a["min"] is not None:
                entry["min"] = a["min"][1]
            if a["hi_ok"] and a["max"] is not None:
                entry["max"] = a["max"][1]
            entry["t"] = a["t"]
        out[fid] = entry
    return out


_INT_RESULT = ("year", "month", "day", "hour", "void")


def _part_type(layout, spec: dict, k: int, schema_id: int):
    """The type JSON partition value ``k`` of ``spec`` is encoded with (in a file of
    ``schema_id``)."""
    pf = spec["fields"][k]
    t = pf["transform"]
    if t in _INT_RESULT or t.startswith("bucket["):
        return "int32"
    return layout.field_type(schema_id, pf["source_id"])


def aggregate_parts(items: list, layout=None) -> dict:
    """Per partition spec: per field ``lo``/``hi`` (partition values, ordered as values of
    ``t``, the type they are encoded with; absent when the parts disagree on it), ``nulls``
    (files with a NULL value; None: unknown), ``files`` (files of that spec) and ``values``
    (the distinct values, when at most a few). ``items``: ``DataFile``s (a leaf, with
    ``layout`` giving ``spec_by_id`` and ``field_type``) or child summaries (an index)."""
    acc: dict[str, list[dict]] = {}
    counts: dict[str, int] = {}

    def slots(sid: str, n: int) -> list[dict]:
        return acc.setdefault(sid, [dict(lo=None, hi=None, fam=None, t=None, mixed=False,
                                         nulls=0, values=set(), many=False)
                                    for _ in range(n)])

    def bound(a: dict, v, t) -> None:
        fam = _family(t) if t is not None else None
        if fam is None or (a["fam"] is not None and a["fam"] != fam[0]):
            a["mixed"] = True
            return
        if a["fam"] is None:
            a["fam"], a["t"] = fam[0], t
        elif fam[1] > (_family(a["t"]) or ("", 0))[1]:
            a["t"] = t
        k = _key(fam[0], v)
        if k is None:
            a["mixed"] = True
            return
        if a["lo"] is None or k < a["lo"][0]:
            a["lo"] = (k, v)
        if a["hi"] is None or k > a["hi"][0]:
            a["hi"] = (k, v)

    for item in items:
        if isinstance(item, dict):  # a child chunk's summary
            for sid, fields in item.items():
                cur = slots(sid, len(fields))
                counts[sid] = counts.get(sid, 0) + (int(fields[0].get("files", 0))
                                                    if fields else 0)
                for a, c in zip(cur, fields):
                    if c.get("t") is None and (c.get("lo") is not None or c.get("hi") is not None):
                        a["mixed"] = True
                    for v in (c.get("lo"), c.get("hi")):
                        if v is not None:
                            bound(a, v, c.get("t"))
                    if c.get("lo") is None and c.get("nulls") != c.get("files"):
                        a["mixed"] = True  # a child without bounds: unknown
                    a["nulls"] = None if a["nulls"] is None or c.get("nulls") is None \
                        else a["nulls"] + c["nulls"]
                    if "values" in c and not a["many"]:
                        a["values"].update(orjson.dumps(x) for x in c["values"])
                        if len(a["values"]) > _VALUES_MAX:
                            a["many"] = True
                    else:
                        a["many"] = True
            continue
        f = item
        if not f.partition:
            continue
        spec = layout.spec_by_id(f.spec_id)
        key = str(f.spec_id)
        cur = slots(key, len(f.partition))
        counts[key] = counts.get(key, 0) + 1
        for k, (a, v) in enumerate(zip(cur, f.partition)):
            if v is None:
                if a["nulls"] is not None:
                    a["nulls"] += 1
                continue
            bound(a, v, _part_type(layout, spec, k, f.schema_id))
            if not a["many"]:
                a["values"].add(orjson.dumps(v))
                if len(a["values"]) > _VALUES_MAX:
                    a["many"] = True
    out = {}
    for sid, fields in acc.items():
        res = []
        for a in fields:
            e = {"nulls": a["nulls"], "files": counts.get(sid, 0)}
            if not a["mixed"] and a["lo"] is not None:
                e.update(lo=a["lo"][1], hi=a["hi"][1], t=a["t"])
            if not a["many"]:
                e["values"] = sorted((orjson.loads(x) for x in a["values"]),
                                     key=lambda x: (isinstance(x, str), x))
            res.append(e)
        out[sid] = res
    return out


# -- the chunk store -------------------------------------------------------------------


class ChunkStore:
    """Reads and writes one table's chunks. Parsed chunks are cached by key (a chunk never
    changes), up to ``cache_chunks`` of them; ``cache_chunks=0`` re-reads every time (the
    erasure verification's "re-read, not a belief")."""

    def __init__(self, store, table: str, runtime=None, cache_chunks: int = 512):
        self.store = store
        self.table = table
        self.runtime = runtime
        self._size = cache_chunks
        # parsed chunks, least recently used evicted; keys_of memos, oldest evicted
        self._cache: LRUCache[str, tuple] = LRUCache(maxsize=cache_chunks)
        self._keys: FIFOCache[str, frozenset] = FIFOCache(maxsize=cache_chunks * 4)
        self._lock = threading.Lock()  # guards both caches
        self.reads = 0  # chunk objects read from the store (benchmarks, tests)
        self.writes = 0

    # -- reading ---------------------------------------------------------------------
    def load(self, ref: ChunkRef) -> tuple:
        """The chunk's entries: ``DataFile``s (a leaf) or ``ChunkRef``s (an index)."""
        with self._lock:
            hit = self._cache.get(ref.path)
            if hit is not None:
                return hit
        try:
            raw, _ = self.store.get(ref.path)
        except ObjectNotFound:
            raise ObjectNotFound("manifest chunk referenced by the table is missing",
                                 table=self.table, object=ref.path) from None
        self.reads += 1
        items = self.parse(raw, ref)
        self._remember(ref.path, items)
        return items

    def parse(self, raw: bytes, ref: ChunkRef) -> tuple:
        from flightsrv.table.datafile import file_from_json

        try:
            d = orjson.loads(raw)
            if int(d.get("format_version", 0)) > INLINE_FORMAT:
                raise CorruptObject("manifest chunk format is newer than this reader",
                                    table=self.table, key=ref.path,
                                    format_version=d.get("format_version"))
            level = int(d["level"])
            if level != ref.level:
                raise CorruptObject("manifest chunk has the wrong level", table=self.table,
                                    key=ref.path, expected=ref.level, found=level)
            if level == 0:
                items = tuple(file_from_json(f, 2) for f in d["files"])
            else:
                items = tuple(ChunkRef.from_json(c) for c in d["chunks"])
        except CorruptObject:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptObject("manifest chunk does not parse", table=self.table,
                                key=ref.path, error=str(exc)) from None
        n = len(items)
        if n != ref.children or (level == 0 and n != ref.files):
            raise CorruptObject("manifest chunk holds a different number of entries than "
                                "its reference says", table=self.table, key=ref.path,
                                expected=ref.children, found=n)
        return items

    def _remember(self, path: str, items: tuple) -> None:
        if not self._size:
            return
        with self._lock:
            self._cache[path] = items  # evicts the least recently used

    def entries(self, ref: ChunkRef) -> Iterator:
        """Every data-file entry below ``ref``, in order."""
        items = self.load(ref)
        if ref.level == 0:
            yield from items
        else:
            for child in items:
                yield from self.entries(child)

    def keys_of(self, ref: ChunkRef) -> frozenset:
        """Every object key ``ref`` makes a version reference: its chunks, their data files
        and deletion-vector objects (memoized by chunk key)."""
        with self._lock:
            hit = self._keys.get(ref.path)
        if hit is not None:
            return hit
        keys = {ref.path}
        if ref.level == 0:
            for f in self.load(ref):
                keys.add(f.path)
                if f.dv_object:
                    keys.add(f.dv_object)
        else:
            for child in self.load(ref):
                keys |= self.keys_of(child)
        out = frozenset(keys)
        if self._size:
            with self._lock:
                self._keys[ref.path] = out  # evicts the oldest
        return out

    # -- writing ---------------------------------------------------------------------
    def _key(self) -> str:
        t = dt.datetime.fromtimestamp(self.runtime.clock.now_ms() / 1000, tz=dt.timezone.utc)
        return f"{CHUNK_PREFIX}{t:%Y/%m/%d/%H}/{self.runtime.ids.new_id()}.json"

    def write_leaf(self, files: Sequence, layout) -> ChunkRef:
        from flightsrv.table.datafile import file_to_json

        inline = (sum(1 for f in files if f.inline is not None),
                  sum(f.rows for f in files if f.inline is not None))
        body = orjson.dumps({"format_version": INLINE_FORMAT if inline[0] else CHUNK_FORMAT,
                             "level": 0, "files": [file_to_json(f, 2) for f in files]})
        key = self._key()
        self.store.put(key, body, mode=PutMode.CREATE)
        self.writes += 1
        summarised = len(files) > TAIL_LEAF  # a tail leaf's reference has no summary (§14.2)
        ref = ChunkRef(
            path=key, level=0, files=len(files), rows=sum(f.rows for f in files),
            deleted_rows=sum(f.deleted_rows for f in files), bytes=sum(f.size for f in files),
            added=(min(f.added_version for f in files), max(f.added_version for f in files)),
            stats=aggregate_stats([(f.stats, lambda fid, s=f.schema_id: layout.field_type(s, fid))
                                   for f in files]) if summarised else {},
            parts=aggregate_parts(files, layout) if summarised else {}, children=len(files),
            inline=inline)
        self._remember(key, tuple(files))
        return ref

    def write_index(self, refs: Sequence[ChunkRef], level: int) -> ChunkRef:
        inline = (sum(r.inline[0] for r in refs), sum(r.inline[1] for r in refs))
        body = orjson.dumps({"format_version": INLINE_FORMAT if inline[0] else CHUNK_FORMAT,
                             "level": level, "chunks": [r.to_json() for r in refs]})
        key = self._key()
        self.store.put(key, body, mode=PutMode.CREATE)
        self.writes += 1
        ref = ChunkRef(
            path=key, level=level, files=sum(r.files for r in refs),
            rows=sum(r.rows for r in refs), deleted_rows=sum(r.deleted_rows for r in refs),
            bytes=sum(r.bytes for r in refs),
            added=(min(r.added[0] for r in refs), max(r.added[1] for r in refs)),
            stats=aggregate_stats([(r.stats, lambda fid: None) for r in refs]),
            parts=aggregate_parts([r.parts for r in refs]), children=len(refs), inline=inline)
        self._remember(key, tuple(refs))
        return ref


# -- the logical view ------------------------------------------------------------------


class FileList(Sequence):
    """The data files of a format-2 version, in order: the leaves below ``refs`` with the
    root's ``overlay`` applied (path -> replacing entry, or None: the file is gone; ``was``
    keeps the replaced entry's (rows, deleted_rows) so totals need no leaf), followed by
    ``tail`` (entries not yet written to chunks: a commit in the making)."""

    __slots__ = ("chunks", "refs", "tail", "overlay", "was")

    def __init__(self, chunks: ChunkStore | None, refs: Sequence[ChunkRef] = (),
                 tail: Sequence = (), overlay: dict | None = None, was: dict | None = None):
        self.chunks = chunks
        self.refs = tuple(refs)
        self.tail = tuple(tail)
        self.overlay = dict(overlay or {})
        self.was = dict(was or {})

    def _removed(self) -> int:
        return sum(1 for v in self.overlay.values() if v is None)

    def __len__(self) -> int:
        return sum(r.files for r in self.refs) - self._removed() + len(self.tail)

    def _apply(self, items) -> Iterator:
        ov = self.overlay
        if not ov:
            yield from items
            return
        for f in items:
            o = ov.get(f.path, f)
            if o is not None:
                yield o

    def _leaf_entries(self, ref: ChunkRef) -> Iterator:
        if ref.level == 0:
            yield from self._apply(self.chunks.load(ref))
        else:
            for child in self.chunks.load(ref):
                yield from self._leaf_entries(child)

    def __iter__(self) -> Iterator:
        for r in self.refs:
            yield from self._leaf_entries(r)
        yield from self.tail

    def __getitem__(self, i):
        if isinstance(i, slice) or self._removed():
            return tuple(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("file index out of range")
        for r in self.refs:
            if i < r.files:
                f = self._nth(r, i)
                return self.overlay.get(f.path, f)
            i -= r.files
        return self.tail[i]

    def _nth(self, ref: ChunkRef, i: int):
        items = self.chunks.load(ref)
        if ref.level == 0:
            return items[i]
        for child in items:
            if i < child.files:
                return self._nth(child, i)
            i -= child.files
        raise IndexError("file index out of range")

    def __add__(self, other):
        if isinstance(other, (tuple, list)):
            return FileList(self.chunks, self.refs, self.tail + tuple(other), self.overlay,
                            self.was)
        return tuple(self) + tuple(other)

    def __radd__(self, other):
        return tuple(other) + tuple(self)

    def __eq__(self, other) -> bool:
        if isinstance(other, FileList) and other.refs == self.refs and \
                other.tail == self.tail and other.overlay == self.overlay:
            return True
        try:
            return tuple(self) == tuple(other)
        except TypeError:
            return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"FileList(files={len(self)}, chunks={len(self.refs)}, "
                f"overlay={len(self.overlay)}, tail={len(self.tail)})")

    @property
    def rows(self) -> int:
        n = sum(r.rows for r in self.refs) + sum(f.rows for f in self.tail)
        for p, o in self.overlay.items():
            was = self.was.get(p, (0, 0))
            n += (o.rows if o is not None else 0) - was[0]
        return n

    @property
    def deleted_rows(self) -> int:
        n = sum(r.deleted_rows for r in self.refs) + sum(f.deleted_rows for f in self.tail)
        for p, o in self.overlay.items():
            was = self.was.get(p, (0, 0))
            n += (o.deleted_rows if o is not None else 0) - was[1]
        return n

    @property
    def live_rows(self) -> int:
        return self.rows - self.deleted_rows

    @property
    def inline(self) -> tuple[int, int]:
        """(inlined files, their physical rows) of the list, from the references' summaries
        (an overlay entry replaces an entry by one of the same path, so the same kind; a
        removed inlined entry subtracts its ``was`` rows)."""
        files = sum(r.inline[0] for r in self.refs)
        rows = sum(r.inline[1] for r in self.refs)
        for f in self.tail:
            if f.inline is not None:
                files, rows = files + 1, rows + f.rows
        for p, o in self.overlay.items():
            if o is None and p.startswith(INLINE_PREFIX):
                files, rows = files - 1, rows - self.was.get(p, (0, 0))[0]
        return files, rows

    def select(self, keep: Callable[[list[ChunkRef]], list[ChunkRef]] | None) -> list:
        """The files of the chunks ``keep`` allows, in list order. The tree is walked level
        by level: ``keep(refs)`` gets every reference of one level that survived so far
        and returns those that may hold wanted files (it may only drop references whose
        summaries rule them out). Only the kept chunks are read. With an overlay, ``keep``
        is not asked: an overlay entry (new deletes, a file removed) changes a chunk's files
        without changing its summary, whose bounds may then be the value of a row deleted
        since, and whether a chunk is skipped must never depend on a deleted row's value."""
        if self.overlay:
            keep = None
        leaves: list[tuple[int, tuple]] = []
        level: list[tuple[int, ChunkRef]] = []
        offset = 0
        for r in self.refs:
            level.append((offset, r))
            offset += r.files
        while level:
            if keep is not None:
                kept_ids = {id(r) for r in keep([r for _, r in level])}
                level = [(o, r) for o, r in level if id(r) in kept_ids]
            nxt: list[tuple[int, ChunkRef]] = []
            for o, r in level:
                items = self.chunks.load(r)
                if r.level == 0:
                    leaves.append((o, items))
                else:
                    for child in items:
                        nxt.append((o, child))
                        o += child.files
            level = nxt
        leaves.sort(key=lambda x: x[0])
        out = [f for _, items in leaves for f in self._apply(items)]
        out.extend(self.tail)
        return out

    def referenced_keys(self) -> set[str]:
        """Chunks, data files and DV objects this list needs (an overlaid entry's older
        state is not needed)."""
        keys: set[str] = set()
        if self.overlay:
            keys = self.chunk_paths()
            for f in self:
                keys.add(f.path)
                if f.dv_object:
                    keys.add(f.dv_object)
            return keys
        for r in self.refs:
            keys |= self.chunks.keys_of(r)
        for f in self.tail:
            keys.add(f.path)
            if f.dv_object:
                keys.add(f.dv_object)
        return keys

    def literal_keys(self) -> set[str]:
        """Every key the stored chunks and the overlay name, including entries the overlay
        hides (an erasure must not leave an erased file's statistics in any chunk)."""
        keys: set[str] = set()
        for r in self.refs:
            keys |= self.chunks.keys_of(r)
        for f in list(self.tail) + [o for o in self.overlay.values() if o is not None]:
            keys.add(f.path)
            if f.dv_object:
                keys.add(f.dv_object)
        return keys

    def chunk_paths(self) -> set[str]:
        """Every chunk key of the tree (reads the index chunks, not the leaves)."""
        out: set[str] = set()

        def walk(refs):
            for r in refs:
                out.add(r.path)
                if r.level > 0:
                    walk(self.chunks.load(r))

        walk(self.refs)
        return out

    def overlay_json(self) -> list[dict]:
        from flightsrv.table.datafile import file_to_json

        out = []
        for p, o in self.overlay.items():
            was = list(self.was.get(p, (0, 0)))
            out.append({"path": p, "removed": True, "was": was} if o is None
                       else {**file_to_json(o, 2), "was": was})
        return out

    @staticmethod
    def overlay_from_json(items) -> tuple[dict, dict]:
        from flightsrv.table.datafile import file_from_json

        overlay, was = {}, {}
        for d in items or ():
            d = dict(d)
            w = d.pop("was", (0, 0))
            was[d["path"]] = (int(w[0]), int(w[1]))
            overlay[d["path"]] = None if d.get("removed") else file_from_json(d, 2)
        return overlay, was


# -- building a tree -------------------------------------------------------------------

OVERLAY_MAX = 64  # entries the root may carry over its chunks
OVERLAY_MAX_BYTES = 48 * 1024


def _split(items: list, cap: int) -> list[list]:
    """``items`` in ceil(n / cap) consecutive pieces of nearly equal size."""
    if not items:
        return []
    k = -(-len(items) // cap)
    size, extra = divmod(len(items), k)
    out, i = [], 0
    for p in range(k):
        n = size + (1 if p < extra else 0)
        out.append(items[i:i + n])
        i += n
    return out


def _same(a, b) -> bool:
    return a is b or a == b


class _Leaf:
    """A base leaf kept in the new tree, with its overlay delta (path -> entry | None)."""

    __slots__ = ("ref", "index", "delta")

    def __init__(self, ref: ChunkRef, index: int, delta: dict):
        self.ref, self.index, self.delta = ref, index, delta


def _base_leaves(chunks: ChunkStore, refs) -> tuple[list[ChunkRef], dict[int, list]]:
    """Every leaf of a tree in order, and the subtrees starting at each leaf index as
    (ref, number of leaves), highest level first."""
    leaves: list[ChunkRef] = []
    starts: dict[int, list] = {}

    def walk(rs):
        for r in rs:
            lo = len(leaves)
            if r.level == 0:
                leaves.append(r)
            else:
                walk(chunks.load(r))
            starts.setdefault(lo, []).append((r, len(leaves) - lo))

    walk(refs)
    for v in starts.values():
        v.sort(key=lambda x: -x[0].level)
    return leaves, starts


def _run_append(out: list, entries: list) -> None:
    if not entries:
        return
    if out and isinstance(out[-1], list):
        out[-1].extend(entries)
    else:
        out.append(list(entries))


def _align(chunks: ChunkStore, new: Sequence, leaves: list[ChunkRef]) -> list:
    """``new`` as a list of ``_Leaf`` (a base leaf whose entries appear in order, some
    replaced or gone) and lists of other entries."""
    where: dict[str, tuple[int, int]] = {}
    raws = []
    for li, leaf in enumerate(leaves):
        items = chunks.load(leaf)
        raws.append(items)
        for pos, e in enumerate(items):
            where[e.path] = (li, pos)
    out: list = []
    moved: set[int] = set()  # leaves some of whose entries show up out of place
    i, n, next_leaf = 0, len(new), 0
    while i < n:
        e = new[i]
        hit = where.get(e.path)
        if hit is None or hit[0] < next_leaf:
            if hit is not None:
                moved.add(hit[0])
            _run_append(out, [e])
            i += 1
            continue
        li = hit[0]
        raw = raws[li]
        delta: dict = {}
        present: set[int] = set()
        last = -1
        j = i
        while j < n:
            h = where.get(new[j].path)
            if h is None or h[0] != li or h[1] <= last:
                break
            last = h[1]
            present.add(h[1])
            if not _same(new[j], raw[h[1]]):
                delta[raw[h[1]].path] = new[j]
            j += 1
        for pos, r in enumerate(raw):
            if pos not in present:
                delta[r.path] = None
        out.append(_Leaf(leaves[li], li, delta))
        next_leaf = li + 1
        i = j
    if not moved:
        return out
    out2: list = []  # a leaf whose entries moved is rewritten whole
    for item in out:
        if isinstance(item, _Leaf) and item.index in moved:
            _run_append(out2, _logical(chunks, item.ref, item.delta))
        elif isinstance(item, list):
            _run_append(out2, item)
        else:
            out2.append(item)
    return out2


def _delta_size(delta: dict) -> int:
    from flightsrv.table.datafile import file_to_json

    return sum(40 + (len(orjson.dumps(file_to_json(o, 2))) if o is not None else 0)
               for o in delta.values())


def _logical(chunks: ChunkStore, ref: ChunkRef, delta: dict) -> list:
    """A kept leaf's entries with its overlay delta applied."""
    return [f for f in (delta.get(x.path, x) for x in chunks.load(ref)) if f is not None]


def _fold(chunks: ChunkStore, items: list, fold: bool) -> list:
    """Keep the overlay within its limits: leaves with the largest deltas are rewritten
    (become runs of entries) until the rest fits; with ``fold`` every one of them. A leaf
    left with few live entries is rewritten too (merged with its neighbours)."""
    leaves = [x for x in items if isinstance(x, _Leaf) and x.delta]
    if not leaves:
        return items
    total = sum(len(x.delta) for x in leaves)
    size = sum(_delta_size(x.delta) for x in leaves)
    rewrite: set[int] = set()
    if fold:
        rewrite = {id(x) for x in leaves}
    elif total > OVERLAY_MAX or size > OVERLAY_MAX_BYTES:
        for x in sorted(leaves, key=lambda x: -len(x.delta)):
            if total <= OVERLAY_MAX // 2 and size <= OVERLAY_MAX_BYTES // 2:
                break
            rewrite.add(id(x))
            total -= len(x.delta)
            size -= _delta_size(x.delta)
    for x in leaves:
        gone = sum(1 for v in x.delta.values() if v is None)
        if x.ref.files >= SMALL_LEAF > x.ref.files - gone:
            rewrite.add(id(x))
    if not rewrite:
        return items
    out: list = []
    for item in items:
        if isinstance(item, _Leaf) and id(item) in rewrite:
            _run_append(out, _logical(chunks, item.ref, item.delta))
        elif isinstance(item, list):
            _run_append(out, item)
        else:
            out.append(item)
    return out


def _subtrees(items: list, starts: dict[int, list]) -> list:
    """Kept leaves as ``(ref, delta)``, where a run of kept leaves that makes up a whole
    base subtree becomes that subtree's reference (with the merged deltas)."""
    out: list = []
    i = 0
    while i < len(items):
        item = items[i]
        if not isinstance(item, _Leaf):
            out.append(item)
            i += 1
            continue
        for ref, span in starts.get(item.index, ()):
            run = items[i:i + span]
            if len(run) == span and all(isinstance(x, _Leaf) and x.index == item.index + k
                                        for k, x in enumerate(run)):
                merged: dict = {}
                for x in run:
                    merged.update(x.delta)
                out.append((ref, merged))
                i += span
                break
        else:  # unreachable: a leaf is at least its own subtree
            out.append((item.ref, item.delta))
            i += 1
    return out


def _pack(chunks: ChunkStore, segs: list, layout: Layout,
          inherited: dict | None = None) -> tuple[list[ChunkRef], dict, set]:
    """Turn runs of entries into leaves, merging small neighbouring leaves (the binary
    counter at the end of the list). ``segs``: (ref, overlay delta) pairs and lists of
    entries; a delta of None means "whatever of ``inherited`` applies". Returns (refs, the
    explicit deltas of the refs kept, the paths of absorbed leaves)."""
    out: list[tuple[ChunkRef, dict | None]] = []
    absorbed: set[str] = set()

    def logical(ref, delta):
        if delta is None:
            absorbed.update(f.path for f in chunks.load(ref))
            return _logical(chunks, ref, inherited or {})
        return _logical(chunks, ref, delta)

    i = 0
    while i < len(segs):
        s = segs[i]
        if isinstance(s, tuple):
            out.append(s)
            i += 1
            continue
        run = list(s)
        # the binary counter: a run absorbs the leaf before it while that leaf is not larger
        # (so an entry is rewritten O(log LEAF_MAX) times, not once per append until its
        # leaf holds SMALL_LEAF entries); a small leaf elsewhere is merged by _fold / below
        while out and out[-1][0].level == 0 and out[-1][0].files + len(run) <= LEAF_MAX and \
                out[-1][0].files <= len(run):
            run = logical(*out.pop()) + run
        nxt = segs[i + 1] if i + 1 < len(segs) else None
        if isinstance(nxt, tuple) and nxt[0].level == 0 and nxt[0].files < SMALL_LEAF and \
                nxt[0].files + len(run) <= LEAF_MAX:
            run += logical(*nxt)
            i += 1
        for piece in _split(run, LEAF_MAX):
            out.append((chunks.write_leaf(piece, layout), {}))
        i += 1
    overlay: dict = {}
    for _, delta in out:
        if delta:
            overlay.update(delta)
    return [r for r, _ in out], overlay, absorbed


def _settled(refs: list[ChunkRef]) -> tuple[int, int]:
    """``[lo, hi)``: the root's settled leaf references, those before the binary counter's
    tail (the trailing leaves of at most TAIL_LEAF entries, which a later append may still
    absorb; a larger leaf never is)."""
    lo = next((k for k, r in enumerate(refs) if r.level == 0), len(refs))
    hi = len(refs)
    while hi > lo and refs[hi - 1].files <= TAIL_LEAF:
        hi -= 1
    return lo, hi


def _normalize(chunks: ChunkStore, refs: list[ChunkRef]) -> list[ChunkRef]:
    """Restore the root shape: levels non-increasing left to right (a run of lower-level
    references before a higher one is packed into index chunks of its own); settled leaves
    join the level-1 index before them while it has room, or move into a new one when there
    are more than ROOT_SETTLED of them (so the root of a table fed by small appends holds
    its index references and the counter's tail, not a summarised reference per full leaf);
    and at most ROOT_LEAVES / ROOT_INDEX references per level (the oldest excess moves
    down)."""
    while True:
        for i in range(len(refs) - 1):
            if refs[i].level < refs[i + 1].level:
                lvl, j = refs[i].level, i
                while j > 0 and refs[j - 1].level == lvl:
                    j -= 1
                packed = [chunks.write_index(p, lvl + 1) for p in _split(refs[j:i + 1], FANOUT)]
                refs = refs[:j] + packed + refs[i + 1:]
                break
        else:
            lo, hi = _settled(refs)
            prev = refs[lo - 1] if lo > 0 else None
            if hi > lo and prev is not None and prev.level == 1 and prev.children < FANOUT:
                take = refs[lo:lo + min(FANOUT - prev.children, hi - lo)]
                joined = chunks.write_index(list(chunks.load(prev)) + take, 1)
                refs = refs[:lo - 1] + [joined] + refs[lo + len(take):]
                continue
            if hi - lo > ROOT_SETTLED:
                packed = [chunks.write_index(p, 1) for p in _split(refs[lo:hi], FANOUT)]
                refs = refs[:lo] + packed + refs[hi:]
                continue
            for lvl in sorted({r.level for r in refs}):
                at = [k for k, r in enumerate(refs) if r.level == lvl]
                cap = ROOT_LEAVES if lvl == 0 else ROOT_INDEX
                if len(at) <= cap:
                    continue
                start = at[0]
                move = refs[start:start + len(at) - cap // 2]
                new: list[ChunkRef] = []
                prev = refs[start - 1] if start > 0 else None
                if prev is not None and prev.level == lvl + 1 and prev.children < FANOUT:
                    kids = list(chunks.load(prev))
                    room = FANOUT - len(kids)
                    new.append(chunks.write_index(kids + move[:room], lvl + 1))
                    move = move[room:]
                    start -= 1
                new += [chunks.write_index(p, lvl + 1) for p in _split(move, FANOUT)]
                refs = refs[:start] + new + refs[at[0] + len(at) - cap // 2:]
                break
            else:
                return refs


def _was(chunks: ChunkStore, kept: list, inherited: dict) -> dict:
    """(rows, deleted_rows) of the raw entries the overlay entries of the ``kept``
    (ref, delta) pairs replace."""
    out = {}
    for ref, delta in kept:
        if not delta:
            continue
        missing = [p for p in delta if p not in inherited]
        raw = {f.path: f for f in chunks.entries(ref)} if missing else {}
        for p in delta:
            out[p] = inherited[p] if p in inherited else (raw[p].rows, raw[p].deleted_rows)
    return out


def build(chunks: ChunkStore, new: Sequence, base: Sequence | None, layout: Layout, *,
          fold: bool = False) -> "FileList":
    """Write the chunks of the file list ``new`` and return it as a ``FileList`` over them.

    Chunks of ``base`` (the version the change was made against) are kept wherever their
    entries are unchanged. A kept leaf whose entries were only replaced (the same file with
    new deletes) or removed records that in the root's overlay instead of being rewritten,
    as long as the overlay stays within ``OVERLAY_MAX`` entries / ``OVERLAY_MAX_BYTES``
    (beyond, the leaves with the largest changes are rewritten); ``fold`` rewrites every
    leaf the overlay touches (an erasure: no chunk may keep an erased file's entry). New
    entries form leaves where they stand; index chunks above changed leaves are rewritten."""
    same_store = isinstance(base, FileList) and base.chunks is chunks
    if isinstance(new, FileList) and new.chunks is chunks and not (fold and new.overlay):
        # an append: the chunks are the base's, only the tail is new
        segs: list = [(r, None) for r in new.refs]
        if new.tail:
            segs.append(list(new.tail))
        refs, _, absorbed = _pack(chunks, segs, layout, new.overlay)
        kept = {p: o for p, o in new.overlay.items() if p not in absorbed}
        return FileList(chunks, tuple(_normalize(chunks, refs)), (), kept,
                        {p: new.was[p] for p in kept if p in new.was})
    if same_store and base.refs and len(new):
        leaves, starts = _base_leaves(chunks, base.refs)
        items = _fold(chunks, _align(chunks, new, leaves), fold)
        segs = _subtrees(items, starts)
        refs, overlay, _ = _pack(chunks, segs, layout)
        kept = [s for s in segs if isinstance(s, tuple) and s[0] in refs]
        was = _was(chunks, kept, base.was)
        return FileList(chunks, tuple(_normalize(chunks, refs)), (), overlay, was)
    segs = [list(new)] if len(new) else []
    refs, _, _ = _pack(chunks, segs, layout)
    return FileList(chunks, tuple(_normalize(chunks, refs)))


def rebuild(chunks: ChunkStore, files: Sequence, layout: Layout) -> "FileList":
    """A fresh, compact tree of ``files`` (full leaves, no overlay): OPTIMIZE's repack."""
    files = list(files)
    leaves = [chunks.write_leaf(p, layout) for p in _split(files, LEAF_MAX)]
    return FileList(chunks, tuple(_normalize(chunks, leaves)))


def tree_shape(chunks: ChunkStore, refs: Sequence[ChunkRef]) -> dict:
    """Counts of chunks per level and leaf fill (table stats)."""
    per_level: dict[int, int] = {}
    leaf_entries = 0
    leaves = 0

    def walk(rs):
        nonlocal leaf_entries, leaves
        for r in rs:
            per_level[r.level] = per_level.get(r.level, 0) + 1
            if r.level == 0:
                leaves += 1
                leaf_entries += r.files
            else:
                walk(chunks.load(r))

    walk(refs)
    return {"chunks": sum(per_level.values()), "levels": max(per_level, default=-1) + 1,
            "leaves": leaves, "root_refs": len(refs),
            "leaf_fill": round(leaf_entries / (leaves * LEAF_MAX), 3) if leaves else 0.0}


__all__ = ["CHUNK_PREFIX", "ChunkRef", "ChunkStore", "FANOUT", "FileList", "LEAF_MAX",
           "aggregate_stats", "build", "rebuild", "tree_shape"]

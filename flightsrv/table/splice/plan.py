"""Plan a splice: the new object equal to ``key@etag`` minus some rows, as parts.

``rewrite_row_groups`` reads (pinned to the ETag) only the footer, the edited groups, the
page-index tail and any bytes needed to pad parts; it writes nothing. Its steps, in order:

1. ``_Edit.read``: the footer, the deletions per group, the file's layout;
2. ``_reencode_groups``: each edited group without its deleted rows (a group losing every
   row is dropped unread), and the tail of page indexes and bloom filters;
3. ``_lay_out_data``: the new data region: untouched spans copied and their offsets shifted,
   edited groups uploaded, dropped groups gone;
4. ``_blob_order`` and ``_build_tail``: the tail rebuilt in its original order (column
   indexes and blooms of untouched groups copied, offset indexes re-encoded with shifted
   ``PageLocation.offset``, edited groups' page indexes as pyarrow wrote them);
5. ``_new_footer``: ``FileMetaData.num_rows`` and ``RowGroup.ordinal`` updated, every other
   field re-encoded byte-exactly (``parquet_meta``);
6. ``parts.pack``: the segments cut into legal multipart parts (or a full rewrite).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from flightsrv.errors import ConfigurationError, CorruptObject
from flightsrv.store.base import ObjectStore
from flightsrv.table import parquet_meta as pm
from flightsrv.table.deletes import remap_positions
from flightsrv.table.parquet_meta import FMD, RG, TList, TStruct
from flightsrv.table.splice.errors import SpliceUnsupported
from flightsrv.table.splice.layout import (
    BLOB_FIELDS,
    Layout,
    blob_ref,
    footer_of,
    layout,
    set_blob,
    shift_data_offsets,
)
from flightsrv.table.splice.parts import Copy, Part, Upload, pack
from flightsrv.table.splice.reencode import NewGroup, reencode
from flightsrv.table.splice.source import RangedSource


@dataclass
class SplicePlan:
    """What ``assemble`` writes, and what the caller needs to know about it.

    ``removed[g]`` holds the old in-group positions deleted from old row group ``g``;
    ``group_map[g]`` is g's index in the new file (None if the group was dropped).
    """

    source_key: str
    source_etag: str
    source_size: int
    path: str  # "splice" or "rewrite"
    parts: list[Part]
    new_size: int
    old_num_rows: int
    new_num_rows: int
    footer: bytes
    removed: dict[int, np.ndarray]
    group_first_row: list[int]  # old file position of each old group's first row
    group_map: list[int | None]
    bytes_downloaded: int = 0
    get_requests: int = 0
    bytes_uploaded: int = 0
    bytes_copied: int = 0

    @property
    def num_parts(self) -> int:
        return len(self.parts)

    def removed_file_positions(self) -> np.ndarray:
        """All deleted rows as sorted old file positions (int64)."""
        arrs = [self.group_first_row[g] + p for g, p in sorted(self.removed.items())]
        return np.concatenate(arrs).astype(np.int64) if arrs else np.zeros(0, np.int64)

    def remap_positions(self, old_positions: Iterable[int] | np.ndarray) -> np.ndarray:
        """Old file positions → positions in the new file. Positions that were deleted by
        this splice are dropped; the others shift down by the deleted rows before them."""
        old = np.unique(np.asarray(old_positions, dtype=np.int64))
        return remap_positions(self.removed_file_positions(), old)

    def summary(self) -> dict:
        return {
            "path": self.path, "parts": self.num_parts, "new_size": self.new_size,
            "bytes_downloaded": self.bytes_downloaded, "get_requests": self.get_requests,
            "bytes_uploaded": self.bytes_uploaded, "bytes_copied": self.bytes_copied,
            "rows_removed": self.old_num_rows - self.new_num_rows,
        }


def rewrite_row_groups(
    store: ObjectStore,
    key: str,
    etag: str,
    size: int,
    deletions: Mapping[int, Iterable[int] | np.ndarray],
    *,
    force_rewrite: bool = False,
    data_page_size: int | None = None,
) -> SplicePlan:
    """Plan a new object equal to ``key@etag`` minus the given rows (the groups it
    re-encodes written with ``data_page_size``-byte data pages; None: pyarrow's default).

    ``deletions[g]`` holds row positions within row group ``g``. Reads (pinned to ``etag``)
    only the footer, the edited groups, the page-index tail and any bytes needed to pad
    parts to ``store.min_part_size``. Writes nothing: pass the plan to ``assemble``.

    Raises ConfigurationError (bad group or position), ObjectNotFound, PreconditionFailed
    (the object changed), CorruptObject, SpliceUnsupported (fall back to copy-on-write).
    """
    edit = _Edit.read(RangedSource(store, key, etag, size), deletions)
    new_groups, tail = _reencode_groups(edit, data_page_size)
    data = _lay_out_data(edit, new_groups)
    new_tail = _build_tail(edit, new_groups, data, tail, _blob_order(edit, new_groups, data))
    new_footer, new_rows = _new_footer(edit.fmd, edit.rgs, data.out_rgs)
    segments = data.segments + [Upload(new_tail + pm.footer_frame(new_footer))]
    new_size = data.end + len(new_tail) + len(new_footer) + 8

    src = edit.src
    parts, path = pack(store, segments, src, force_rewrite)
    plan = SplicePlan(
        source_key=key, source_etag=etag, source_size=size, path=path, parts=parts,
        new_size=new_size, old_num_rows=edit.fmd.get(FMD.NUM_ROWS), new_num_rows=new_rows,
        footer=new_footer, removed=edit.dels, group_first_row=edit.first_row,
        group_map=data.group_map, bytes_downloaded=src.bytes, get_requests=src.requests,
        bytes_uploaded=sum(p.size for p in parts if isinstance(p, Upload)),
        bytes_copied=sum(p.size for p in parts if isinstance(p, Copy)),
    )
    if sum(p.size for p in parts) != new_size:
        raise AssertionError(f"splice plan size mismatch {plan.summary()}")
    return plan


# -- step 1: what is edited ------------------------------------------------------------


@dataclass
class _Edit:
    """The source file as read, and the rows to remove from it."""

    src: RangedSource
    key: str
    fmd: TStruct
    rgs: list[TStruct]
    dels: dict[int, np.ndarray]  # group -> sorted in-group positions
    lay: Layout
    first_row: list[int]  # old file position of each group's first row

    @classmethod
    def read(cls, src: RangedSource, deletions: Mapping) -> _Edit:
        _footer, fmd, footer_start = footer_of(src)
        rgs = pm.row_groups(fmd)
        dels = _normalize(deletions, rgs, src.key)
        if not dels:
            raise ConfigurationError("no rows to delete", key=src.key)
        lay = layout(fmd, footer_start, src.key)
        first_row = list(np.cumsum([0] + [rg.get(RG.NUM_ROWS) for rg in rgs[:-1]]).tolist()) \
            if rgs else []
        return cls(src, src.key, fmd, rgs, dels, lay, first_row)


def _normalize(deletions: Mapping[int, Iterable[int]], rgs: list[TStruct], key: str
               ) -> dict[int, np.ndarray]:
    out = {}
    for g, pos in deletions.items():
        if not 0 <= g < len(rgs):
            raise ConfigurationError("row group out of range", key=key, group=g,
                                     groups=len(rgs))
        arr = np.unique(np.asarray(list(pos) if isinstance(pos, (set, frozenset)) else pos,
                                   dtype=np.int64))
        if arr.size == 0:
            continue
        n = rgs[g].get(RG.NUM_ROWS)
        if arr[0] < 0 or arr[-1] >= n:
            raise ConfigurationError("row position out of range", key=key, group=g,
                                     num_rows=n, min=int(arr[0]), max=int(arr[-1]))
        out[g] = arr
    return out


# -- step 2: re-encode the edited groups ------------------------------------------------


def _reencode_groups(edit: _Edit, data_page_size: int | None = None
                     ) -> tuple[dict[int, NewGroup | None], bytes]:
    """Each edited group re-encoded (None: it loses every row and is dropped unread), and
    the source's tail (page indexes, bloom filters), read in one pass of ranged GETs."""
    src, lay, rgs, dels = edit.src, edit.lay, edit.rgs, edit.dels
    footer_start = lay.footer_start
    whole = {g for g, removed in dels.items() if removed.size == rgs[g].get(RG.NUM_ROWS)}
    src.prefetch([lay.ranges[g] for g in dels if g not in whole]
                 + [(lay.data_end, footer_start)])
    new_groups: dict[int, NewGroup | None] = {}

    def read_header(off: int) -> bytes:  # a bloom filter header (≤ 32 bytes); usually cached
        return src.read(off, min(off + 32, footer_start))

    for g, removed in dels.items():
        if g in whole:
            new_groups[g] = None
            continue
        s, e = lay.ranges[g]
        new_groups[g] = reencode(edit.fmd, g, src.read(s, e), s, removed, edit.key,
                                 read_header, data_page_size)
    return new_groups, src.read(lay.data_end, footer_start)


# -- step 3: the data region ------------------------------------------------------------


@dataclass
class _Data:
    """The new file's data region."""

    segments: list[Copy | Upload]  # header, then one per surviving group
    end: int  # where the data region ends in the new file (the tail starts there)
    shift: dict[int, int]  # old group -> how far its offsets move
    out_rgs: list[TStruct]  # the new file's RowGroups, in order
    group_map: list[int | None]  # old group -> new index (None: dropped)
    new_rg_of: dict[int, TStruct] = field(default_factory=dict)  # old group -> new RowGroup


def _lay_out_data(edit: _Edit, new_groups: dict[int, NewGroup | None]) -> _Data:
    """Untouched spans are copied (their offsets shifted), edited groups uploaded at their
    new place, dropped groups left out."""
    lay, dels = edit.lay, edit.dels
    # the 4-byte magic rides with an upload rather than being copied on its own
    header: Copy | Upload = Copy(0, lay.header_end)
    if lay.header_end == 4 and 0 in dels:
        header = Upload(pm.MAGIC)
    data = _Data([header], lay.header_end, {}, [], [])
    for i, rg in enumerate(edit.rgs):
        s, e = lay.spans[i]
        if i not in dels:
            data.shift[i] = data.end - s
            new_rg = rg.copy()
            shift_data_offsets(new_rg, data.shift[i])
            data.segments.append(Copy(s, e))
            data.end += e - s
        elif new_groups[i] is None:
            data.group_map.append(None)
            continue
        else:
            ng = new_groups[i]
            new_rg = ng.rg
            data.shift[i] = data.end - ng.base  # temp-file offsets → new-file offsets
            shift_data_offsets(new_rg, data.shift[i])
            data.segments.append(Upload(ng.data))
            data.end += len(ng.data)
        data.group_map.append(len(data.out_rgs))
        data.out_rgs.append(new_rg)
    data.new_rg_of = {i: data.out_rgs[m] for i, m in enumerate(data.group_map) if m is not None}
    return data


# -- step 4: page indexes and bloom filters ---------------------------------------------


def _blob_order(edit: _Edit, new_groups: dict[int, NewGroup | None], data: _Data
                ) -> list[tuple[int, int, int, str]]:
    """The blobs the new tail holds, in the order to write them: (old offset, group,
    column, kind). Blobs of untouched groups that live inside a copied span are pointed at
    their moved bytes here and stay out of the tail; edited groups start with no blobs and
    get theirs where their old ones were (tail order), else at the end."""
    lay, rgs, dels, key = edit.lay, edit.rgs, edit.dels, edit.key
    footer_start = lay.footer_start
    tail_blobs: list[tuple[int, int, int, str]] = []  # (old offset, group, column, kind)
    pending: set[tuple[int, int, str]] = set()  # edited-group blobs still to place
    for i, rg in enumerate(rgs):
        for j, cc in enumerate(pm.columns(rg)):
            for kind in BLOB_FIELDS:
                ref = blob_ref(cc, kind)
                if ref is None:
                    continue
                off = ref[0]
                if i in dels:
                    if new_groups[i] is not None:
                        pending.add((i, j, kind))
                    continue
                if lay.data_end <= off < footer_start:
                    tail_blobs.append((off, i, j, kind))
                    continue
                home = lay.span_of(off)
                if home is None or home in dels or (kind == "oi" and data.shift[home]):
                    raise SpliceUnsupported("page index or bloom filter inside the data region",
                                            key=key, group=i, column=j, kind=kind, offset=off)
                set_blob(data.new_rg_of[i].get(RG.COLUMNS).items[j], kind,
                         off + data.shift[home], ref[1])
    for i in new_groups:  # edited groups: start with no blobs; placed below
        if new_groups[i] is not None:
            for cc in pm.columns(data.new_rg_of[i]):
                for kind in BLOB_FIELDS:
                    set_blob(cc, kind, None, None)
    old_pos = {}
    for i in new_groups:
        for j, cc in enumerate(pm.columns(rgs[i])):
            for kind in BLOB_FIELDS:
                ref = blob_ref(cc, kind)
                if ref is not None and (i, j, kind) in pending:
                    old_pos[(i, j, kind)] = ref[0]
    return sorted([(off, i, j, k) for off, i, j, k in tail_blobs]
                  + [(off if lay.data_end <= off < footer_start else footer_start, i, j, k)
                     for (i, j, k), off in old_pos.items()])


def _build_tail(edit: _Edit, new_groups: dict[int, NewGroup | None], data: _Data,
                tail: bytes, order: list[tuple[int, int, int, str]]) -> bytes:
    """The new tail's bytes, in ``order``; each new column chunk is pointed at its blob."""
    lay, rgs = edit.lay, edit.rgs
    new_tail = bytearray()
    tail_start = data.end
    for off, i, j, kind in order:
        cc_new = data.new_rg_of[i].get(RG.COLUMNS).items[j]
        if i in new_groups:
            blob = new_groups[i].blobs.get((j, kind))
            if blob is None:
                continue
            if kind == "oi":
                blob = pm.shift_offset_index(blob, data.shift[i])
        else:
            length = blob_ref(pm.columns(rgs[i])[j], kind)[1]
            rel = off - lay.data_end
            if length is None:  # bloom filter without a recorded length
                length = pm.bloom_filter_size(tail, rel)
            blob = tail[rel : rel + length]
            if len(blob) != length:
                raise CorruptObject("page index runs past the footer", key=edit.key, group=i,
                                    column=j, kind=kind, offset=off, length=length)
            if kind == "oi":
                blob = pm.shift_offset_index(blob, data.shift[i])
        recorded = blob_ref(cc_new, kind)
        set_blob(cc_new, kind, tail_start + len(new_tail),
                 len(blob) if kind != "bf" or (recorded and recorded[1] is not None)
                 or i in new_groups else None)
        new_tail += blob
    return bytes(new_tail)


# -- step 5: the footer -------------------------------------------------------------------


def _new_footer(fmd: TStruct, rgs: list[TStruct], out_rgs: list[TStruct]) -> tuple[bytes, int]:
    """The new footer's bytes and the new file's row count."""
    any_ordinal = any(rg.has(RG.ORDINAL) for rg in rgs)
    for n_, rg in enumerate(out_rgs):
        if any_ordinal:
            rg.set_int(RG.ORDINAL, n_, pm.I16)
        else:
            rg.remove(RG.ORDINAL)
    new_fmd = TStruct(dict(fmd.fields))
    new_rows = sum(rg.get(RG.NUM_ROWS) for rg in out_rgs)
    new_fmd.set_int(FMD.NUM_ROWS, new_rows)
    new_fmd.set(FMD.ROW_GROUPS, pm.LIST, TList(pm.STRUCT, out_rgs))
    return pm.encode(new_fmd), new_rows

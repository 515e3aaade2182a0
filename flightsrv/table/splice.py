"""Row-group splice: delete rows from a Parquet object by re-encoding only the row groups
that hold them and copying every other byte inside the store.

Design: /work/shared/seeds/001 ("Mutable atomic deletes with Parquet backed columnar tables
on S3"). The Parquet layout and footer fields follow the format spec
(https://github.com/apache/parquet-format, ``parquet.thrift``); part rules follow S3
multipart upload (https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPartCopy.html):
every part but the last is at least ``store.min_part_size`` bytes.

A source file is seen as::

    ["PAR1"][span 0][span 1]...[span n-1][tail: page indexes, blooms][footer][len]["PAR1"]

where span *i* runs from row group *i*'s first column chunk to row group *i+1*'s first chunk
(so bytes a writer interleaves after a group travel with it). The new file is::

    [header][span or re-encoded group]...[rebuilt tail][new footer][len]["PAR1"]

- A span whose group is untouched is copied server-side; every absolute offset that points
  into it (data/dictionary/index page offsets, ColumnChunk/RowGroup file offsets, bloom
  filters) moves by that span's shift.
- An edited group is decoded with pyarrow from its own byte range (a one-group file is built
  around those bytes with the original schema), the rows are dropped, and it is written
  again by pyarrow with the original per-column codec, dictionary choice, data-page version,
  statistics, page-index and bloom-filter settings. The physical schema pyarrow produces
  must equal the original's, or the splice refuses (``SpliceUnsupported``). Its column
  chunks and ``RowGroup`` struct are lifted from that file and rebased.
- A group that loses every row disappears; its bytes are not copied.
- The tail is downloaded and rebuilt in its original order: column indexes and bloom filters
  of untouched groups are copied, offset indexes are re-encoded with shifted
  ``PageLocation.offset``, edited groups get the page indexes pyarrow wrote for them.
- ``FileMetaData.num_rows`` and ``RowGroup.ordinal`` are updated; every other footer field
  is re-encoded byte-exactly (``parquet_meta``).

``rewrite_row_groups`` plans (it reads, re-encodes and packs parts; it writes nothing);
``assemble`` writes the plan to a new key with one multipart upload that is aborted on any
error. When the store demands equal part sizes (Cloudflare R2) or nothing would be copied
server-side, the plan is a full rewrite of the same bytes ("rewrite").
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flightsrv.errors import ConfigurationError, CorruptObject
from flightsrv.store.base import ObjectMeta, ObjectStore, PutMode
from flightsrv.table import parquet_meta as pm
from flightsrv.table.parquet_meta import CC, CMD, FMD, RG, SE, TList, TStruct

__all__ = [
    "Copy", "Upload", "SplicePlan", "SpliceUnsupported", "read_footer", "rewrite_row_groups",
    "assemble", "splice_delete", "plan_parts", "FOOTER_PROBE",
]

FOOTER_PROBE = 64 * 1024  # first GET reads this much from the end of the object
MAX_PART_SIZE = 5 * 1024**3  # S3 part limit
REWRITE_PART_SIZE = 8 * 1024**2  # equal part size for full rewrites
_COALESCE_GAP = 64 * 1024  # ranged GETs closer than this are merged


class SpliceUnsupported(ConfigurationError):
    """The file cannot be spliced faithfully (pyarrow cannot reproduce its physical schema,
    unusual layout, encryption). The caller should fall back to a copy-on-write rewrite."""


# -- parts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    """A part copied inside the store from source bytes [src_start, src_end)."""

    src_start: int
    src_end: int

    @property
    def size(self) -> int:
        return self.src_end - self.src_start


@dataclass(frozen=True)
class Upload:
    """A part whose bytes the client uploads."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


Part = Copy | Upload


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
        gone = self.removed_file_positions()
        keep = ~np.isin(old, gone, assume_unique=True)
        old = old[keep]
        return old - np.searchsorted(gone, old, side="left")

    def summary(self) -> dict:
        return {
            "path": self.path, "parts": self.num_parts, "new_size": self.new_size,
            "bytes_downloaded": self.bytes_downloaded, "get_requests": self.get_requests,
            "bytes_uploaded": self.bytes_uploaded, "bytes_copied": self.bytes_copied,
            "rows_removed": self.old_num_rows - self.new_num_rows,
        }


# -- reading -------------------------------------------------------------------------


class _Source:
    """Ranged reads of one pinned object version, counted, with a cache of fetched spans."""

    def __init__(self, store: ObjectStore, key: str, etag: str, size: int):
        self.store, self.key, self.etag, self.size = store, key, etag, size
        self.bytes = 0
        self.requests = 0
        self._have: list[tuple[int, bytes]] = []

    def _fetch(self, start: int, end: int) -> bytes:
        data = self.store.get_range(self.key, start, end, etag=self.etag)
        self.requests += 1
        self.bytes += len(data)
        if len(data) != end - start:
            raise CorruptObject("short ranged read", key=self.key, start=start, end=end,
                                got=len(data))
        self._have.append((start, data))
        return data

    def _cached(self, start: int, end: int) -> bytes | None:
        for s, d in self._have:
            if s <= start and end <= s + len(d):
                return d[start - s : end - s]
        return None

    def prefetch(self, ranges: Iterable[tuple[int, int]]) -> None:
        """Fetch the ranges not cached yet, merging near neighbours into one GET each."""
        todo = sorted((s, e) for s, e in ranges if e > s and self._cached(s, e) is None)
        merged: list[list[int]] = []
        for s, e in todo:
            if merged and s <= merged[-1][1] + _COALESCE_GAP:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        for s, e in merged:
            self._fetch(s, e)

    def read(self, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        got = self._cached(start, end)
        return got if got is not None else self._fetch(start, end)


def _read_footer(src: _Source) -> tuple[bytes, TStruct, int]:
    if src.size < 12:
        raise CorruptObject("object too small to be parquet", key=src.key, size=src.size)
    probe_start = max(0, src.size - FOOTER_PROBE)
    probe = src.read(probe_start, src.size)
    n = pm.parse_footer_tail(probe[-8:])
    footer_start = src.size - 8 - n
    if footer_start < 4:
        raise CorruptObject("footer length exceeds object", key=src.key, footer_len=n,
                            size=src.size)
    footer = src.read(footer_start, src.size - 8)
    try:
        fmd = pm.decode(footer)
    except CorruptObject as e:
        raise CorruptObject("undecodable parquet footer", key=src.key, why=e.message,
                            **e.context) from e
    if fmd.has(FMD.ENCRYPTION_ALGORITHM):
        raise SpliceUnsupported("parquet footer signing/encryption is not supported", key=src.key)
    return footer, fmd, footer_start


def read_footer(
    store: ObjectStore, key: str, etag: str, size: int | None = None
) -> tuple[bytes, TStruct, int]:
    """The footer bytes, its decoded ``FileMetaData`` tree and the footer's start offset.

    One ranged GET of the last 64 KiB; a second only if the footer is larger. ``size`` saves
    a HEAD when the caller knows it. Raises ObjectNotFound, PreconditionFailed (etag moved),
    CorruptObject (not parquet).
    """
    if size is None:
        size = store.head(key).size
    return _read_footer(_Source(store, key, etag, size))


# -- layout of the source file -------------------------------------------------------

_BLOB_FIELDS = {  # kind -> (struct level, offset field, length field)
    "ci": ("cc", CC.COLUMN_INDEX_OFFSET, CC.COLUMN_INDEX_LENGTH),
    "oi": ("cc", CC.OFFSET_INDEX_OFFSET, CC.OFFSET_INDEX_LENGTH),
    "bf": ("md", CMD.BLOOM_FILTER_OFFSET, CMD.BLOOM_FILTER_LENGTH),
}


def _blob_ref(cc: TStruct, kind: str) -> tuple[int, int | None] | None:
    level, fo, fl = _BLOB_FIELDS[kind]
    s = cc if level == "cc" else pm.meta(cc)
    off = s.get(fo)
    if off is None or off <= 0:
        return None
    return off, s.get(fl)


def _set_blob(cc: TStruct, kind: str, off: int | None, length: int | None) -> None:
    level, fo, fl = _BLOB_FIELDS[kind]
    s = cc if level == "cc" else pm.meta(cc)
    if off is None:
        s.remove(fo)
        s.remove(fl)
        return
    s.set_int(fo, off, pm.I64)
    if length is not None:
        s.set_int(fl, length, pm.I32)


def _shift_data_offsets(rg: TStruct, delta: int) -> None:
    """Move every absolute page offset of a row group by ``delta`` (blobs excluded)."""
    if delta == 0:
        return
    if (v := rg.get(RG.FILE_OFFSET)) is not None and v > 0:
        rg.set_int(RG.FILE_OFFSET, v + delta)
    for cc in pm.columns(rg):
        if (v := cc.get(CC.FILE_OFFSET)) is not None and v > 0:
            cc.set_int(CC.FILE_OFFSET, v + delta)
        md = pm.meta(cc)
        for f in (CMD.DATA_PAGE_OFFSET, CMD.INDEX_PAGE_OFFSET, CMD.DICTIONARY_PAGE_OFFSET):
            if (v := md.get(f)) is not None and v > 0:
                md.set_int(f, v + delta)


@dataclass
class _Layout:
    ranges: list[tuple[int, int]]  # chunk range per group
    spans: list[tuple[int, int]]
    header_end: int
    data_end: int
    footer_start: int

    def span_of(self, off: int) -> int | None:
        for i, (s, e) in enumerate(self.spans):
            if s <= off < e:
                return i
        return None


def _layout(fmd: TStruct, footer_start: int, key: str) -> _Layout:
    rgs = pm.row_groups(fmd)
    ranges = [pm.row_group_range(rg) for rg in rgs]
    for i, (s, e) in enumerate(ranges):
        if not 4 <= s <= e <= footer_start or (i and s < ranges[i - 1][1]):
            raise SpliceUnsupported("row groups overlap or are out of file order", key=key,
                                    group=i, start=s, end=e)
        for cc in pm.columns(rgs[i]):
            if cc.get(CC.FILE_PATH):
                raise SpliceUnsupported("column chunks in external files", key=key)
    spans = [(ranges[i][0], ranges[i + 1][0] if i + 1 < len(ranges) else ranges[i][1])
             for i in range(len(ranges))]
    header_end = ranges[0][0] if ranges else 4
    data_end = ranges[-1][1] if ranges else 4
    return _Layout(ranges, spans, header_end, data_end, footer_start)


# -- re-encoding one row group --------------------------------------------------------

_CODEC_TO_ARROW = {0: "none", 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd", 7: "lz4"}
_ENCODING_TO_ARROW = {5: "DELTA_BINARY_PACKED", 6: "DELTA_LENGTH_BYTE_ARRAY",
                      7: "DELTA_BYTE_ARRAY", 9: "BYTE_STREAM_SPLIT"}


@dataclass
class _NewGroup:
    data: bytes  # the column chunks, contiguous
    rg: TStruct  # RowGroup with offsets relative to ``data`` start minus ``base``
    base: int  # offset of ``data`` inside the temp file
    blobs: dict[tuple[int, str], bytes]  # (column, kind) -> page index / bloom bytes


def _page_header_facts(chunk: bytes) -> tuple[int | None, bool]:
    """(first data page type, CRC present) from the first page headers of a chunk."""
    pos = 0
    for _ in range(2):
        if pos >= len(chunk):
            break
        try:
            hdr, end = pm.decode_struct(chunk, pos)
        except CorruptObject:
            return None, False
        ptype = hdr.get(pm.PH.TYPE)
        if ptype != pm.PAGE_DICTIONARY:
            return ptype, hdr.has(pm.PH.CRC)
        pos = end + hdr.get(pm.PH.COMPRESSED_PAGE_SIZE)
    return None, False


def _mini_file(fmd: TStruct, rg: TStruct, rg_bytes: bytes, rg_start: int) -> bytes:
    """A valid one-group parquet file around ``rg_bytes`` (the group's chunk range)."""
    rg = rg.copy()
    _shift_data_offsets(rg, 4 - rg_start)
    for cc in pm.columns(rg):
        for kind in _BLOB_FIELDS:
            _set_blob(cc, kind, None, None)
    rg.remove(RG.ORDINAL)
    mini = TStruct(dict(fmd.fields))  # shallow: schema and metadata shared, not modified
    mini.set_int(FMD.NUM_ROWS, rg.get(RG.NUM_ROWS))
    mini.set(FMD.ROW_GROUPS, pm.LIST, TList(pm.STRUCT, [rg]))
    return pm.MAGIC + rg_bytes + pm.footer_frame(pm.encode(mini))


def _compact_dictionaries(table: pa.Table) -> pa.Table:
    """Rebuild dictionary columns so no dictionary keeps values of deleted rows."""
    cols = []
    for col in table.columns:
        if pa.types.is_dictionary(col.type):
            plain = col.cast(col.type.value_type)
            col = pc.dictionary_encode(plain).cast(col.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=table.schema)


def _bloom_ndv_for(num_bytes: int, fpp: float = 0.05) -> int:
    """An ndv for which parquet-cpp sizes a bloom filter to ``num_bytes`` (a power of two):
    it allocates ``-8·ndv / ln(1 - fpp^(1/8))`` bits rounded up to a power of two."""
    return max(1, int(-num_bytes * math.log(1 - fpp ** (1 / 8)) * 0.99))


def _writer_options(fmd: TStruct, rg: TStruct, rg_bytes: bytes, rg_start: int,
                    read=None) -> dict:
    compression, use_dict, encodings, stats, blooms = {}, [], {}, [], {}
    page_version, crc, page_index = None, False, False
    for cc in pm.columns(rg):
        md, path = pm.meta(cc), pm.path_of(cc)
        codec = md.get(CMD.CODEC)
        if codec not in _CODEC_TO_ARROW:
            raise SpliceUnsupported("codec not writable by pyarrow",
                                    codec=pm.CODEC_NAMES.get(codec, codec), column=path)
        compression[path] = _CODEC_TO_ARROW[codec]
        encs = set(md.get(CMD.ENCODINGS).items)
        if md.get(CMD.DICTIONARY_PAGE_OFFSET) or encs & {pm.ENC_PLAIN_DICTIONARY,
                                                         pm.ENC_RLE_DICTIONARY}:
            use_dict.append(path)
        else:
            special = [e for e in encs if e in _ENCODING_TO_ARROW]
            if special:
                encodings[path] = _ENCODING_TO_ARROW[special[0]]
        if md.has(CMD.STATISTICS):
            stats.append(path)
        if md.get(CMD.BLOOM_FILTER_OFFSET):
            ndv = max(1, md.get(CMD.NUM_VALUES))
            if read is not None:  # keep the old filter's size
                hdr, _ = pm.decode_struct(read(md.get(CMD.BLOOM_FILTER_OFFSET)), 0)
                ndv = _bloom_ndv_for(hdr.get(pm.BFH.NUM_BYTES))
            blooms[path] = {"ndv": ndv, "fpp": 0.05}
        if cc.get(CC.OFFSET_INDEX_OFFSET) or cc.get(CC.COLUMN_INDEX_OFFSET):
            page_index = True
        if page_version is None:
            s, e = pm.chunk_range(cc)
            page_version, crc = _page_header_facts(rg_bytes[s - rg_start : e - rg_start])
    schema = fmd.get(FMD.SCHEMA).items
    opts = dict(
        compression=compression,
        use_dictionary=use_dict,
        write_statistics=stats if stats else False,
        data_page_version="2.0" if page_version == pm.PAGE_DATA_V2 else "1.0",
        write_page_checksum=crc,
        write_page_index=page_index,
        use_deprecated_int96_timestamps=any(se.get(SE.TYPE) == pm.TYPE_INT96 for se in schema),
    )
    if encodings:
        opts["column_encoding"] = encodings
    if blooms:
        opts["bloom_filter_options"] = blooms
    return opts


def _schema_key(fmd: TStruct) -> bytes:
    """The physical schema minus the root's name (writers name the root differently)."""
    items = [se.copy() for se in fmd.get(FMD.SCHEMA).items]
    items[0].remove(SE.NAME)
    return pm.encode(TStruct({1: (pm.LIST, TList(pm.STRUCT, items))}))


def _reencode(fmd: TStruct, gi: int, rg_bytes: bytes, rg_start: int, removed: np.ndarray,
              key: str, read_header=None) -> _NewGroup | None:
    rg = pm.row_groups(fmd)[gi]
    n = rg.get(RG.NUM_ROWS)
    try:
        table = pq.ParquetFile(pa.BufferReader(_mini_file(fmd, rg, rg_bytes, rg_start))).read()
    except (pa.ArrowException, OSError) as e:
        raise CorruptObject("cannot decode row group", key=key, group=gi, error=str(e)) from e
    if table.num_rows != n:
        raise CorruptObject("row group decoded to wrong row count", key=key, group=gi,
                            expected=n, found=table.num_rows)
    keep = np.ones(n, dtype=bool)
    keep[removed] = False
    if not keep.any():
        return None
    table = _compact_dictionaries(table.filter(pa.array(keep)))
    opts = _writer_options(fmd, rg, rg_bytes, rg_start, read_header)
    want = _schema_key(fmd)
    tried = []
    for version in ("2.6", "2.4", "1.0"):
        for compliant in (True, False):
            buf = io.BytesIO()
            pq.write_table(table, buf, row_group_size=max(1, table.num_rows), version=version,
                           use_compliant_nested_type=compliant, **opts)
            out = buf.getvalue()
            tfmd = pm.decode(out[-8 - pm.parse_footer_tail(out[-8:]) : -8])
            if _schema_key(tfmd) == want and len(pm.row_groups(tfmd)) == 1:
                return _lift(out, tfmd, rg)
            tried.append(f"{version}/{compliant}")
    raise SpliceUnsupported("pyarrow cannot reproduce the file's physical schema", key=key,
                            group=gi, tried=",".join(tried))


def _lift(out: bytes, tfmd: TStruct, old_rg: TStruct) -> _NewGroup:
    rg = pm.row_groups(tfmd)[0]
    s, e = pm.row_group_range(rg)
    blobs: dict[tuple[int, str], bytes] = {}
    for j, cc in enumerate(pm.columns(rg)):
        for kind in _BLOB_FIELDS:
            ref = _blob_ref(cc, kind)
            if ref is None:
                continue
            off, length = ref
            if length is None:
                length = pm.bloom_filter_size(out, off)
            blobs[(j, kind)] = out[off : off + length]
            _set_blob(cc, kind, None, None)
    if old_rg.has(RG.SORTING_COLUMNS):  # deleting rows keeps a sort order
        rg.set(RG.SORTING_COLUMNS, pm.LIST, old_rg.get(RG.SORTING_COLUMNS))
    return _NewGroup(out[s:e], rg, s, blobs)


# -- part packing --------------------------------------------------------------------


def plan_parts(
    segments: Sequence[Copy | Upload], min_part: int, read=None, max_part: int = MAX_PART_SIZE
) -> list[Part]:
    """Pack the new file's segments (in order) into legal multipart parts.

    Every part but the last is ≥ ``min_part``. A copy too short to stand alone is
    downloaded (``read(start, end)``) into the neighbouring upload; an upload too short is
    topped up with the first bytes of the next copy when the rest of that copy still
    reaches ``min_part``. The last segment must be an Upload (the footer).
    """
    parts: list[Part] = []
    buf: list[bytes | tuple[int, int]] = []
    size = 0

    def flush() -> None:
        nonlocal buf, size
        pieces, merged = [], []
        for p in buf:  # merge adjacent source ranges into one read
            if isinstance(p, tuple) and merged and isinstance(merged[-1], tuple) \
                    and merged[-1][1] == p[0]:
                merged[-1] = (merged[-1][0], p[1])
            else:
                merged.append(p)
        for p in merged:
            pieces.append(read(*p) if isinstance(p, tuple) else p)
        parts.append(Upload(b"".join(pieces)))
        buf, size = [], 0

    merged_segs: list[Copy | Upload] = []
    for seg in segments:  # contiguous copies become one range
        prev = merged_segs[-1] if merged_segs else None
        if isinstance(seg, Copy) and isinstance(prev, Copy) and prev.src_end == seg.src_start:
            merged_segs[-1] = Copy(prev.src_start, seg.src_end)
        elif seg.size:
            merged_segs.append(seg)
    for seg in merged_segs:
        if isinstance(seg, Upload):
            if seg.size:
                buf.append(seg.data)
                size += seg.size
            continue
        s, e = seg.src_start, seg.src_end
        if e <= s:
            continue
        if buf and size < min_part:
            need = min_part - size
            if (e - s) - need >= min_part:
                buf.append((s, s + need))
                size += need
                flush()
                s += need
            else:
                buf.append((s, e))
                size += e - s
                continue
        elif buf:
            flush()
        length = e - s
        if length >= min_part:
            k = -(-length // max_part)
            step = -(-length // k)
            for a in range(s, e, step):
                parts.append(Copy(a, min(a + step, e)))
        else:
            buf.append((s, e))
            size += length
    if buf or not parts:
        flush()
    return parts


# -- planning ------------------------------------------------------------------------


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


def rewrite_row_groups(
    store: ObjectStore,
    key: str,
    etag: str,
    size: int,
    deletions: Mapping[int, Iterable[int] | np.ndarray],
    *,
    force_rewrite: bool = False,
) -> SplicePlan:
    """Plan a new object equal to ``key@etag`` minus the given rows.

    ``deletions[g]`` holds row positions within row group ``g``. Reads (pinned to ``etag``)
    only the footer, the edited groups, the page-index tail and any bytes needed to pad
    parts to ``store.min_part_size``. Writes nothing: pass the plan to ``assemble``.

    Raises ConfigurationError (bad group or position), ObjectNotFound, PreconditionFailed
    (the object changed), CorruptObject, SpliceUnsupported (fall back to copy-on-write).
    """
    src = _Source(store, key, etag, size)
    footer, fmd, footer_start = _read_footer(src)
    rgs = pm.row_groups(fmd)
    dels = _normalize(deletions, rgs, key)
    if not dels:
        raise ConfigurationError("no rows to delete", key=key)
    lay = _layout(fmd, footer_start, key)
    first_row = list(np.cumsum([0] + [rg.get(RG.NUM_ROWS) for rg in rgs[:-1]]).tolist()) \
        if rgs else []

    # one pass of ranged GETs: edited groups + the tail
    # a group losing every row is dropped without being read
    whole = {g for g, removed in dels.items() if removed.size == rgs[g].get(RG.NUM_ROWS)}
    src.prefetch([lay.ranges[g] for g in dels if g not in whole]
                 + [(lay.data_end, footer_start)])
    new_groups: dict[int, _NewGroup | None] = {}

    def read_header(off: int) -> bytes:  # a bloom filter header (≤ 32 bytes); usually cached
        return src.read(off, min(off + 32, footer_start))

    for g, removed in dels.items():
        if g in whole:
            new_groups[g] = None
            continue
        s, e = lay.ranges[g]
        new_groups[g] = _reencode(fmd, g, src.read(s, e), s, removed, key, read_header)
    tail = src.read(lay.data_end, footer_start)

    # lay out the data region
    # the 4-byte magic rides with an upload rather than being copied on its own
    header: Copy | Upload = Copy(0, lay.header_end)
    if lay.header_end == 4 and 0 in dels:
        header = Upload(pm.MAGIC)
    segments: list[Copy | Upload] = [header]
    pos = lay.header_end
    shift: dict[int, int] = {}
    out_rgs: list[TStruct] = []
    group_map: list[int | None] = []
    for i, rg in enumerate(rgs):
        s, e = lay.spans[i]
        if i not in dels:
            shift[i] = pos - s
            new_rg = rg.copy()
            _shift_data_offsets(new_rg, shift[i])
            segments.append(Copy(s, e))
            pos += e - s
        elif new_groups[i] is None:
            group_map.append(None)
            continue
        else:
            ng = new_groups[i]
            new_rg = ng.rg
            shift[i] = pos - ng.base  # temp-file offsets → new-file offsets
            _shift_data_offsets(new_rg, shift[i])
            segments.append(Upload(ng.data))
            pos += len(ng.data)
        group_map.append(len(out_rgs))
        out_rgs.append(new_rg)
    new_rg_of = {i: out_rgs[m] for i, m in enumerate(group_map) if m is not None}

    # page indexes and bloom filters
    tail_blobs: list[tuple[int, int, int, str]] = []  # (old offset, group, column, kind)
    pending: set[tuple[int, int, str]] = set()  # edited-group blobs still to place
    for i, rg in enumerate(rgs):
        for j, cc in enumerate(pm.columns(rg)):
            for kind in _BLOB_FIELDS:
                ref = _blob_ref(cc, kind)
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
                if home is None or home in dels or (kind == "oi" and shift[home]):
                    raise SpliceUnsupported("page index or bloom filter inside the data region",
                                            key=key, group=i, column=j, kind=kind, offset=off)
                _set_blob(new_rg_of[i].get(RG.COLUMNS).items[j], kind, off + shift[home],
                          ref[1])
    for i in new_groups:  # edited groups: start with no blobs; placed below
        if new_groups[i] is not None:
            for cc in pm.columns(new_rg_of[i]):
                for kind in _BLOB_FIELDS:
                    _set_blob(cc, kind, None, None)
    # edited groups' blobs go where their old ones were (tail order), else at the end
    old_pos = {}
    for i in new_groups:
        for j, cc in enumerate(pm.columns(rgs[i])):
            for kind in _BLOB_FIELDS:
                ref = _blob_ref(cc, kind)
                if ref is not None and (i, j, kind) in pending:
                    old_pos[(i, j, kind)] = ref[0]
    order = sorted([(off, i, j, k) for off, i, j, k in tail_blobs]
                   + [(off if lay.data_end <= off < footer_start else footer_start, i, j, k)
                      for (i, j, k), off in old_pos.items()])
    new_tail = bytearray()
    tail_start = pos
    for off, i, j, kind in order:
        cc_new = new_rg_of[i].get(RG.COLUMNS).items[j]
        if i in new_groups:
            blob = new_groups[i].blobs.get((j, kind))
            if blob is None:
                continue
            if kind == "oi":
                blob = pm.shift_offset_index(blob, shift[i])
        else:
            length = _blob_ref(pm.columns(rgs[i])[j], kind)[1]
            rel = off - lay.data_end
            if length is None:  # bloom filter without a recorded length
                length = pm.bloom_filter_size(tail, rel)
            blob = tail[rel : rel + length]
            if len(blob) != length:
                raise CorruptObject("page index runs past the footer", key=key, group=i,
                                    column=j, kind=kind, offset=off, length=length)
            if kind == "oi":
                blob = pm.shift_offset_index(blob, shift[i])
        recorded = _blob_ref(cc_new, kind)
        _set_blob(cc_new, kind, tail_start + len(new_tail),
                  len(blob) if kind != "bf" or (recorded and recorded[1] is not None)
                  or i in new_groups else None)
        new_tail += blob

    # footer
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
    new_footer = pm.encode(new_fmd)
    segments.append(Upload(bytes(new_tail) + pm.footer_frame(new_footer)))
    new_size = pos + len(new_tail) + len(new_footer) + 8

    parts, path = _pack(store, segments, src, force_rewrite)
    plan = SplicePlan(
        source_key=key, source_etag=etag, source_size=size, path=path, parts=parts,
        new_size=new_size, old_num_rows=fmd.get(FMD.NUM_ROWS), new_num_rows=new_rows,
        footer=new_footer, removed=dels, group_first_row=first_row, group_map=group_map,
        bytes_downloaded=src.bytes, get_requests=src.requests,
        bytes_uploaded=sum(p.size for p in parts if isinstance(p, Upload)),
        bytes_copied=sum(p.size for p in parts if isinstance(p, Copy)),
    )
    if sum(p.size for p in parts) != new_size:
        raise AssertionError(f"splice plan size mismatch {plan.summary()}")
    return plan


def _pack(store: ObjectStore, segments: list[Copy | Upload], src: _Source,
          force_rewrite: bool) -> tuple[list[Part], str]:
    min_part = int(getattr(store, "min_part_size", 0) or 0)
    if force_rewrite or getattr(store, "equal_part_sizes", False):
        # download everything, cut into equal parts (R2 requires equal non-last parts)
        src.prefetch([(s.src_start, s.src_end) for s in segments if isinstance(s, Copy)])
        whole = b"".join(src.read(s.src_start, s.src_end) if isinstance(s, Copy) else s.data
                         for s in segments)
        step = max(min_part, REWRITE_PART_SIZE)
        return [Upload(whole[a : a + step]) for a in range(0, len(whole), step)] or \
            [Upload(b"")], "rewrite"
    parts = plan_parts(segments, min_part, src.read)
    path = "splice" if any(isinstance(p, Copy) for p in parts) else "rewrite"
    return parts, path


# -- writing -------------------------------------------------------------------------


def assemble(store: ObjectStore, plan: SplicePlan, new_key: str) -> ObjectMeta:
    """Write ``plan`` to ``new_key`` (which must not exist) with one multipart upload.

    Copies are pinned to the source etag. Any failure aborts the upload and re-raises.
    Raises PreconditionFailed (``new_key`` exists or the source changed), StoreError,
    CorruptObject (the assembled object has the wrong size).
    """
    upload_id = store.create_multipart(new_key)
    try:
        done = []
        for n, part in enumerate(plan.parts, start=1):
            if isinstance(part, Copy):
                done.append(store.upload_part_copy(
                    new_key, upload_id, n, plan.source_key, part.src_start, part.src_end,
                    source_etag=plan.source_etag))
            else:
                done.append(store.upload_part(new_key, upload_id, n, part.data))
        meta = store.complete_multipart(new_key, upload_id, done, mode=PutMode.CREATE)
    except BaseException:
        try:
            store.abort_multipart(new_key, upload_id)
        except Exception:  # noqa: BLE001 - the original error matters more
            pass
        raise
    if meta.size != plan.new_size:
        raise CorruptObject("spliced object has the wrong size", key=new_key,
                            expected=plan.new_size, found=meta.size)
    return meta


def splice_delete(
    store: ObjectStore, key: str, etag: str, size: int,
    deletions: Mapping[int, Iterable[int] | np.ndarray], new_key: str,
) -> tuple[SplicePlan, ObjectMeta]:
    """``rewrite_row_groups`` then ``assemble``: the new object and how it was made."""
    plan = rewrite_row_groups(store, key, etag, size, deletions)
    return plan, assemble(store, plan, new_key)

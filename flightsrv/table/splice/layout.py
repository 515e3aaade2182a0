"""Where things are in a source Parquet file: its footer, each row group's span, and the
absolute offsets a moved span must shift.

Field ids follow ``parquet.thrift`` (https://github.com/apache/parquet-format). A source file
is seen as::

    ["PAR1"][span 0][span 1]...[span n-1][tail: page indexes, blooms][footer][len]["PAR1"]

where span *i* runs from row group *i*'s first column chunk to row group *i+1*'s first chunk
(so bytes a writer interleaves after a group travel with it). Page indexes and bloom
filters ("blobs") are addressed by absolute offsets in ``ColumnChunk`` (column and offset
index) and ``ColumnMetaData`` (bloom filter).
"""

from __future__ import annotations

from dataclasses import dataclass

from flightsrv.errors import CorruptObject
from flightsrv.store.base import ObjectStore
from flightsrv.table import parquet_meta as pm
from flightsrv.table.parquet_meta import CC, CMD, FMD, RG, TStruct
from flightsrv.table.splice.errors import SpliceUnsupported
from flightsrv.table.splice.source import RangedSource

FOOTER_PROBE = 64 * 1024  # first GET reads this much from the end of the object

BLOB_FIELDS = {  # kind -> (struct level, offset field, length field)
    "ci": ("cc", CC.COLUMN_INDEX_OFFSET, CC.COLUMN_INDEX_LENGTH),
    "oi": ("cc", CC.OFFSET_INDEX_OFFSET, CC.OFFSET_INDEX_LENGTH),
    "bf": ("md", CMD.BLOOM_FILTER_OFFSET, CMD.BLOOM_FILTER_LENGTH),
}


# -- the footer ----------------------------------------------------------------------


def footer_of(src: RangedSource) -> tuple[bytes, TStruct, int]:
    """The footer bytes, its decoded ``FileMetaData`` and its start offset, read through
    ``src`` (one probe of the last ``FOOTER_PROBE`` bytes, a second read only if the footer
    is larger). Raises CorruptObject (not parquet), SpliceUnsupported (encrypted)."""
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
    return footer_of(RangedSource(store, key, etag, size))


# -- offsets inside the footer --------------------------------------------------------


def blob_ref(cc: TStruct, kind: str) -> tuple[int, int | None] | None:
    """(offset, length or None) of a column chunk's page index or bloom filter, or None."""
    level, fo, fl = BLOB_FIELDS[kind]
    s = cc if level == "cc" else pm.meta(cc)
    off = s.get(fo)
    if off is None or off <= 0:
        return None
    return off, s.get(fl)


def set_blob(cc: TStruct, kind: str, off: int | None, length: int | None) -> None:
    """Point a column chunk's blob at ``off`` (and ``length`` if given); None removes it."""
    level, fo, fl = BLOB_FIELDS[kind]
    s = cc if level == "cc" else pm.meta(cc)
    if off is None:
        s.remove(fo)
        s.remove(fl)
        return
    s.set_int(fo, off, pm.I64)
    if length is not None:
        s.set_int(fl, length, pm.I32)


def shift_data_offsets(rg: TStruct, delta: int) -> None:
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


# -- spans ---------------------------------------------------------------------------


@dataclass
class Layout:
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


def layout(fmd: TStruct, footer_start: int, key: str) -> Layout:
    """The spans of ``fmd``'s row groups. Raises SpliceUnsupported (groups overlap or are out
    of file order, column chunks in external files)."""
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
    return Layout(ranges, spans, header_end, data_end, footer_start)

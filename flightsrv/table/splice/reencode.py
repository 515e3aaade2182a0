"""Re-encode one row group without some of its rows, as the original writer would have.

The group is decoded with pyarrow from its own byte range (a one-group file is built around
those bytes with the original schema), the rows are dropped, and it is written again by
pyarrow with the original per-column codec, dictionary choice, encodings, data-page
version, page checksums, statistics, page-index and bloom-filter settings. The physical
schema pyarrow produces must equal the original's, or the splice refuses
(``SpliceUnsupported``). Its column chunks and ``RowGroup`` struct are lifted from that
file (``NewGroup``) for the caller to rebase. Field ids and codes follow ``parquet.thrift``
(https://github.com/apache/parquet-format).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flightsrv.errors import CorruptObject
from flightsrv.table import parquet_meta as pm
from flightsrv.table.parquet_meta import CC, CMD, FMD, RG, SE, TList, TStruct
from flightsrv.table.splice.errors import SpliceUnsupported
from flightsrv.table.splice.layout import BLOB_FIELDS, blob_ref, set_blob, shift_data_offsets

_CODEC_TO_ARROW = {0: "none", 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd", 7: "lz4"}
_ENCODING_TO_ARROW = {5: "DELTA_BINARY_PACKED", 6: "DELTA_LENGTH_BYTE_ARRAY",
                      7: "DELTA_BYTE_ARRAY", 9: "BYTE_STREAM_SPLIT"}


@dataclass
class NewGroup:
    data: bytes  # the column chunks, contiguous
    rg: TStruct  # RowGroup with offsets relative to ``data`` start minus ``base``
    base: int  # offset of ``data`` inside the temp file
    blobs: dict[tuple[int, str], bytes]  # (column, kind) -> page index / bloom bytes


def reencode(fmd: TStruct, gi: int, rg_bytes: bytes, rg_start: int, removed: np.ndarray,
             key: str, read_header=None, data_page_size: int | None = None) -> NewGroup | None:
    """Row group ``gi`` (its chunk bytes ``rg_bytes``, starting at ``rg_start`` in the file)
    without the in-group positions ``removed``; None when no row is left.
    ``data_page_size``: the data page threshold to write with (the table's
    ``data_page_bytes``, so a point read still decodes one small page); None: pyarrow's.

    ``read_header(offset)`` returns the bytes of an old bloom filter's header, so the new
    filter keeps its size. Raises CorruptObject (the group does not decode to its row
    count), SpliceUnsupported (pyarrow cannot reproduce the physical schema or codec).
    """
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
    if data_page_size is not None:
        opts["data_page_size"] = data_page_size
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
    shift_data_offsets(rg, 4 - rg_start)
    for cc in pm.columns(rg):
        for kind in BLOB_FIELDS:
            set_blob(cc, kind, None, None)
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
    """``pq.write_table`` keyword arguments that reproduce how ``rg`` was written."""
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


def _lift(out: bytes, tfmd: TStruct, old_rg: TStruct) -> NewGroup:
    """The one row group of the file ``out`` as a ``NewGroup``, its blobs cut out."""
    rg = pm.row_groups(tfmd)[0]
    s, e = pm.row_group_range(rg)
    blobs: dict[tuple[int, str], bytes] = {}
    for j, cc in enumerate(pm.columns(rg)):
        for kind in BLOB_FIELDS:
            ref = blob_ref(cc, kind)
            if ref is None:
                continue
            off, length = ref
            if length is None:
                length = pm.bloom_filter_size(out, off)
            blobs[(j, kind)] = out[off : off + length]
            set_blob(cc, kind, None, None)
    if old_rg.has(RG.SORTING_COLUMNS):  # deleting rows keeps a sort order
        rg.set(RG.SORTING_COLUMNS, pm.LIST, old_rg.get(RG.SORTING_COLUMNS))
    return NewGroup(out[s:e], rg, s, blobs)

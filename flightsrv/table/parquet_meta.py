"""A generic Thrift compact-protocol codec for Parquet footers, plus the field ids we patch.

Parquet metadata (the footer ``FileMetaData``, ``OffsetIndex``, ``ColumnIndex``, page and
bloom-filter headers) is serialized with the Thrift *compact protocol*:
https://github.com/apache/thrift/blob/master/doc/specs/thrift-compact-protocol.md
Structs and field ids follow ``parquet.thrift`` from the Parquet format spec:
https://github.com/apache/parquet-format/blob/master/src/main/thrift/parquet.thrift

Contract:

- ``decode_struct(buf, pos)`` parses one struct into a ``TStruct`` (field id → ``(type,
  value)``), keeping every field, including ids this module does not know, in wire order.
- ``encode_struct(s)`` writes it back. For input written by a canonical Thrift encoder
  (Apache Thrift's C++/Java/Rust libraries: parquet-cpp, parquet-mr, arrow-rs) the output is
  byte-identical, so a decoded footer can be edited field by field and re-encoded without
  disturbing anything else.
- Malformed input raises ``CorruptObject`` with the byte position.

Nothing here knows about object stores; ``flightsrv.table.splice`` builds on it.
"""

from __future__ import annotations

import struct as _struct
from dataclasses import dataclass, field
from typing import Any, Iterator

from flightsrv.errors import CorruptObject

# -- compact protocol type codes ---------------------------------------------------------

STOP = 0
BOOL_TRUE = 1
BOOL_FALSE = 2
I8 = 3
I16 = 4
I32 = 5
I64 = 6
DOUBLE = 7
BINARY = 8
LIST = 9
SET = 10
MAP = 11
STRUCT = 12
UUID = 13

BOOL = BOOL_TRUE  # the type we store for a bool field; the wire nibble carries the value

_INT_TYPES = (I8, I16, I32, I64)


@dataclass
class TList:
    """A Thrift list or set. ``elem_type`` is the wire element type code (kept as read)."""

    elem_type: int
    items: list
    is_set: bool = False


@dataclass
class TMap:
    key_type: int
    val_type: int
    items: list  # [(key, value), ...] in wire order


@dataclass
class TStruct:
    """A decoded struct: ``fields[id] = (type, value)``; dict order is wire order."""

    fields: dict[int, tuple[int, Any]] = field(default_factory=dict)

    # -- access ------------------------------------------------------------------------
    def has(self, fid: int) -> bool:
        return fid in self.fields

    def get(self, fid: int, default: Any = None) -> Any:
        f = self.fields.get(fid)
        return default if f is None else f[1]

    def type_of(self, fid: int) -> int | None:
        f = self.fields.get(fid)
        return None if f is None else f[0]

    def set(self, fid: int, ttype: int, value: Any) -> None:
        """Set a field. A new id is inserted in ascending-id position (as Thrift writes)."""
        if fid in self.fields:
            self.fields[fid] = (ttype, value)
            return
        items = list(self.fields.items())
        idx = next((i for i, (k, _) in enumerate(items) if k > fid), len(items))
        items.insert(idx, (fid, (ttype, value)))
        self.fields = dict(items)

    def set_int(self, fid: int, value: int, ttype: int = I64) -> None:
        """Set an integer field, keeping the wire type if the field exists."""
        self.set(fid, self.type_of(fid) or ttype, int(value))

    def remove(self, fid: int) -> None:
        self.fields.pop(fid, None)

    def copy(self) -> "TStruct":
        """A deep copy (values are rebuilt, bytes are shared since they are immutable)."""
        return TStruct({k: (t, _deep_copy(v)) for k, (t, v) in self.fields.items()})

    def __iter__(self) -> Iterator[int]:
        return iter(self.fields)


def _deep_copy(v: Any) -> Any:
    if isinstance(v, TStruct):
        return v.copy()
    if isinstance(v, TList):
        return TList(v.elem_type, [_deep_copy(x) for x in v.items], v.is_set)
    if isinstance(v, TMap):
        return TMap(v.key_type, v.val_type, [(_deep_copy(a), _deep_copy(b)) for a, b in v.items])
    return v


# -- reader ------------------------------------------------------------------------------

_MAX_DEPTH = 64


class _Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | memoryview, pos: int, end: int):
        self.buf = buf
        self.pos = pos
        self.end = end

    def fail(self, what: str) -> CorruptObject:
        return CorruptObject("bad thrift compact data", check=what, pos=self.pos)

    def byte(self) -> int:
        if self.pos >= self.end:
            raise self.fail("truncated")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        result = 0
        shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise self.fail("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise self.fail("truncated binary")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def value(self, ttype: int, depth: int) -> Any:
        if ttype in (I16, I32, I64):
            return self.zigzag()
        if ttype == I8:
            b = self.byte()
            return b - 256 if b > 127 else b
        if ttype == BINARY:
            return self.take(self.varint())
        if ttype == STRUCT:
            return self.struct(depth + 1)
        if ttype in (LIST, SET):
            return self.list(ttype == SET, depth + 1)
        if ttype == MAP:
            return self.map(depth + 1)
        if ttype == DOUBLE:
            return _struct.unpack("<d", self.take(8))[0]
        if ttype in (BOOL_TRUE, BOOL_FALSE):  # container element: one byte
            return self.byte() == BOOL_TRUE
        if ttype == UUID:
            return self.take(16)
        raise self.fail(f"unknown type {ttype}")

    def struct(self, depth: int = 0) -> TStruct:
        if depth > _MAX_DEPTH:
            raise self.fail("nesting too deep")
        out: dict[int, tuple[int, Any]] = {}
        last = 0
        while True:
            h = self.byte()
            ttype = h & 0x0F
            if ttype == STOP:
                return TStruct(out)
            delta = h >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            if ttype in (BOOL_TRUE, BOOL_FALSE):
                out[fid] = (BOOL, ttype == BOOL_TRUE)
            else:
                out[fid] = (ttype, self.value(ttype, depth))

    def list(self, is_set: bool, depth: int) -> TList:
        h = self.byte()
        n = h >> 4
        et = h & 0x0F
        if n == 15:
            n = self.varint()
        if n > self.end - self.pos and et not in (BOOL_TRUE, BOOL_FALSE):
            # every element takes at least one byte
            raise self.fail("list size exceeds data")
        return TList(et, [self.value(et, depth) for _ in range(n)], is_set)

    def map(self, depth: int) -> TMap:
        n = self.varint()
        if n == 0:
            return TMap(0, 0, [])
        h = self.byte()
        kt, vt = h >> 4, h & 0x0F
        return TMap(kt, vt, [(self.value(kt, depth), self.value(vt, depth)) for _ in range(n)])


def decode_struct(
    buf: bytes | memoryview, pos: int = 0, end: int | None = None
) -> tuple[TStruct, int]:
    """Decode one struct starting at ``pos``; returns it and the position just past it."""
    r = _Reader(buf, pos, len(buf) if end is None else end)
    s = r.struct()
    return s, r.pos


def decode(buf: bytes | memoryview) -> TStruct:
    """Decode a buffer holding exactly one struct (trailing bytes are an error)."""
    s, end = decode_struct(buf)
    if end != len(buf):
        raise CorruptObject("trailing bytes after thrift struct", pos=end, size=len(buf))
    return s


# -- writer ------------------------------------------------------------------------------


def _w_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _w_zigzag(out: bytearray, n: int, bits: int) -> None:
    _w_varint(out, ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1))


_BITS = {I16: 16, I32: 32, I64: 64}


def _w_value(out: bytearray, ttype: int, v: Any) -> None:
    if ttype in _BITS:
        _w_zigzag(out, v, _BITS[ttype])
    elif ttype == I8:
        out.append(v & 0xFF)
    elif ttype == BINARY:
        if isinstance(v, str):
            v = v.encode()
        _w_varint(out, len(v))
        out += v
    elif ttype == STRUCT:
        _w_struct(out, v)
    elif ttype in (LIST, SET):
        n = len(v.items)
        if n < 15:
            out.append((n << 4) | v.elem_type)
        else:
            out.append(0xF0 | v.elem_type)
            _w_varint(out, n)
        for x in v.items:
            _w_value(out, v.elem_type, x)
    elif ttype == MAP:
        _w_varint(out, len(v.items))
        if v.items:
            out.append((v.key_type << 4) | v.val_type)
            for a, b in v.items:
                _w_value(out, v.key_type, a)
                _w_value(out, v.val_type, b)
    elif ttype == DOUBLE:
        out += _struct.pack("<d", v)
    elif ttype in (BOOL_TRUE, BOOL_FALSE):
        out.append(BOOL_TRUE if v else BOOL_FALSE)
    elif ttype == UUID:
        out += v
    else:
        raise ValueError(f"unknown thrift type {ttype}")


def _w_struct(out: bytearray, s: TStruct) -> None:
    last = 0
    for fid, (ttype, v) in s.fields.items():
        wire = (BOOL_TRUE if v else BOOL_FALSE) if ttype in (BOOL_TRUE, BOOL_FALSE) else ttype
        delta = fid - last
        if 0 < delta <= 15:
            out.append((delta << 4) | wire)
        else:
            out.append(wire)
            _w_zigzag(out, fid, 16)
        last = fid
        if wire not in (BOOL_TRUE, BOOL_FALSE):
            _w_value(out, ttype, v)
    out.append(STOP)


def encode_struct(s: TStruct) -> bytes:
    out = bytearray()
    _w_struct(out, s)
    return bytes(out)


encode = encode_struct


# -- parquet.thrift field ids ------------------------------------------------------------
# Only the ids flightsrv reads or patches; everything else passes through untouched.


class FMD:  # FileMetaData
    VERSION = 1
    SCHEMA = 2
    NUM_ROWS = 3
    ROW_GROUPS = 4
    KEY_VALUE_METADATA = 5
    CREATED_BY = 6
    COLUMN_ORDERS = 7
    ENCRYPTION_ALGORITHM = 8
    FOOTER_SIGNING_KEY_METADATA = 9


class SE:  # SchemaElement
    TYPE = 1
    TYPE_LENGTH = 2
    REPETITION_TYPE = 3
    NAME = 4
    NUM_CHILDREN = 5
    CONVERTED_TYPE = 6
    LOGICAL_TYPE = 10


class RG:  # RowGroup
    COLUMNS = 1
    TOTAL_BYTE_SIZE = 2
    NUM_ROWS = 3
    SORTING_COLUMNS = 4
    FILE_OFFSET = 5
    TOTAL_COMPRESSED_SIZE = 6
    ORDINAL = 7


class CC:  # ColumnChunk
    FILE_PATH = 1
    FILE_OFFSET = 2
    META_DATA = 3
    OFFSET_INDEX_OFFSET = 4
    OFFSET_INDEX_LENGTH = 5
    COLUMN_INDEX_OFFSET = 6
    COLUMN_INDEX_LENGTH = 7
    CRYPTO_METADATA = 8
    ENCRYPTED_COLUMN_METADATA = 9


class CMD:  # ColumnMetaData
    TYPE = 1
    ENCODINGS = 2
    PATH_IN_SCHEMA = 3
    CODEC = 4
    NUM_VALUES = 5
    TOTAL_UNCOMPRESSED_SIZE = 6
    TOTAL_COMPRESSED_SIZE = 7
    KEY_VALUE_METADATA = 8
    DATA_PAGE_OFFSET = 9
    INDEX_PAGE_OFFSET = 10
    DICTIONARY_PAGE_OFFSET = 11
    STATISTICS = 12
    ENCODING_STATS = 13
    BLOOM_FILTER_OFFSET = 14
    BLOOM_FILTER_LENGTH = 15
    SIZE_STATISTICS = 16


class OI:  # OffsetIndex
    PAGE_LOCATIONS = 1
    UNENCODED_BYTE_ARRAY_DATA_BYTES = 2


class PL:  # PageLocation
    OFFSET = 1
    COMPRESSED_PAGE_SIZE = 2
    FIRST_ROW_INDEX = 3


class PH:  # PageHeader
    TYPE = 1
    UNCOMPRESSED_PAGE_SIZE = 2
    COMPRESSED_PAGE_SIZE = 3
    CRC = 4


class BFH:  # BloomFilterHeader
    NUM_BYTES = 1


# enum values
PAGE_DATA, PAGE_INDEX, PAGE_DICTIONARY, PAGE_DATA_V2 = 0, 1, 2, 3
CODEC_NAMES = {
    0: "NONE", 1: "SNAPPY", 2: "GZIP", 3: "LZO", 4: "BROTLI", 5: "LZ4_HADOOP", 6: "ZSTD",
    7: "LZ4",  # LZ4_RAW: what pyarrow writes for compression="lz4"
}
ENC_PLAIN, ENC_PLAIN_DICTIONARY, ENC_RLE, ENC_BIT_PACKED, ENC_RLE_DICTIONARY = 0, 2, 3, 4, 8
ENCODING_NAMES = {
    0: "PLAIN", 2: "PLAIN_DICTIONARY", 3: "RLE", 4: "BIT_PACKED", 5: "DELTA_BINARY_PACKED",
    6: "DELTA_LENGTH_BYTE_ARRAY", 7: "DELTA_BYTE_ARRAY", 8: "RLE_DICTIONARY",
    9: "BYTE_STREAM_SPLIT",
}
TYPE_INT96 = 3

MAGIC = b"PAR1"
MAGIC_ENCRYPTED = b"PARE"


# -- footer helpers ----------------------------------------------------------------------


def parse_footer_tail(tail8: bytes) -> int:
    """From the last 8 bytes of a file, the footer length. Raises CorruptObject."""
    if len(tail8) != 8:
        raise CorruptObject("parquet file too short", size=len(tail8))
    if tail8[4:] == MAGIC_ENCRYPTED:
        raise CorruptObject("encrypted parquet footers are not supported", check="magic")
    if tail8[4:] != MAGIC:
        raise CorruptObject("not a parquet file", check="magic", found=tail8[4:].hex())
    return int.from_bytes(tail8[:4], "little")


def footer_frame(footer: bytes) -> bytes:
    """``footer`` + 4-byte little-endian length + ``PAR1``: the bytes that end a file."""
    return footer + len(footer).to_bytes(4, "little") + MAGIC


def row_groups(fmd: TStruct) -> list[TStruct]:
    v = fmd.get(FMD.ROW_GROUPS)
    return [] if v is None else v.items


def columns(rg: TStruct) -> list[TStruct]:
    return rg.get(RG.COLUMNS).items


def meta(cc: TStruct) -> TStruct:
    """The chunk's ColumnMetaData. Raises CorruptObject if it is absent (encrypted)."""
    md = cc.get(CC.META_DATA)
    if md is None:
        raise CorruptObject("column chunk without plain meta_data (encrypted?)")
    return md


def chunk_range(cc: TStruct) -> tuple[int, int]:
    """Absolute byte range [start, end) of a column chunk's pages."""
    md = meta(cc)
    data = md.get(CMD.DATA_PAGE_OFFSET)
    dic = md.get(CMD.DICTIONARY_PAGE_OFFSET)
    start = data
    # Some writers put 0 (or garbage) in dictionary_page_offset when there is no dictionary.
    if dic is not None and 0 < dic < data:
        start = dic
    return start, start + md.get(CMD.TOTAL_COMPRESSED_SIZE)


def row_group_range(rg: TStruct) -> tuple[int, int]:
    """Absolute byte range [start, end) covering all column chunks of a row group."""
    rs = [chunk_range(cc) for cc in columns(rg)]
    return min(r[0] for r in rs), max(r[1] for r in rs)


def path_of(cc: TStruct) -> str:
    return ".".join(p.decode() for p in meta(cc).get(CMD.PATH_IN_SCHEMA).items)


def page_locations(oi: TStruct) -> list[TStruct]:
    return oi.get(OI.PAGE_LOCATIONS).items


def shift_offset_index(raw: bytes, delta: int) -> bytes:
    """Re-encode an OffsetIndex with every PageLocation.offset moved by ``delta``."""
    oi = decode(raw)
    for pl in page_locations(oi):
        pl.set_int(PL.OFFSET, pl.get(PL.OFFSET) + delta)
    return encode_struct(oi)


def bloom_filter_size(buf: bytes, pos: int) -> int:
    """Total bytes of a bloom filter (header + bitset) that starts at ``pos`` in ``buf``."""
    hdr, end = decode_struct(buf, pos)
    return end - pos + hdr.get(BFH.NUM_BYTES)

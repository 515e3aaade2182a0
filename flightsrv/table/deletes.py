"""Deletion vectors: the set of deleted row positions of one data file.

Byte layout (docs/PROTOCOL.md §Deletion vectors), the same as Delta Lake's and Iceberg v3's
deletion-vector blobs (https://github.com/delta-io/delta/blob/master/PROTOCOL.md#deletion-vector-format):

    blob   = length:u32be  magic:4 bytes "D1 D3 39 64"  bitmap  crc32:u32be
    length = len(magic) + len(bitmap)
    crc32  = CRC-32 (zlib) of magic + bitmap
    bitmap = portable 64-bit roaring ("RoaringBitmapArray"): count:u64le, then per bucket
             key:u32le + a portable 32-bit roaring bitmap (pyroaring ``BitMap64.serialize``)

A DV *object* under ``tombstone/`` starts with a format byte ``0x01`` followed by one or more
blobs; a descriptor points at one blob by (offset, length), as in Delta. Small DVs are inlined
in the manifest as base64 of the same blob bytes.

Names say which way a mask points: ``deleted_positions`` are rows to drop, a ``keep_mask`` is
True for rows to keep.
"""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np
from pyroaring import BitMap64

from flightsrv.errors import CorruptObject, ObjectNotFound
from flightsrv.table.datafile import DataFile, DeletionVector, DVStorage  # noqa: F401

MAGIC = bytes.fromhex("D1D33964")
OBJECT_FORMAT_BYTE = b"\x01"
INLINE_LIMIT = 2048  # framed bytes up to this size are inlined in the manifest


def encode_blob(bitmap: BitMap64) -> bytes:
    """Frame a bitmap. Runs of consecutive positions are stored as run containers (a
    contiguous range of any length costs a few bytes), which the portable format allows."""
    bitmap = BitMap64(bitmap)
    bitmap.run_optimize()
    payload = MAGIC + bitmap.serialize()
    return struct.pack(">I", len(payload)) + payload + struct.pack(">I", zlib.crc32(payload))


def decode_blob(blob: bytes, *, where: str) -> BitMap64:
    """Validate and decode one framed blob; ``where`` names the object for errors."""
    if len(blob) < 12:
        raise CorruptObject("deletion vector truncated", object=where, check="size",
                            size=len(blob), minimum=12)
    (length,) = struct.unpack(">I", blob[:4])
    if length + 8 != len(blob):
        raise CorruptObject("deletion vector length mismatch", object=where, check="length",
                            declared=length + 8, actual=len(blob))
    payload = blob[4:4 + length]
    if payload[:4] != MAGIC:
        raise CorruptObject("deletion vector has the wrong magic", object=where, check="magic",
                            expected=MAGIC.hex(), found=payload[:4].hex())
    (crc,) = struct.unpack(">I", blob[4 + length:])
    actual = zlib.crc32(payload)
    if crc != actual:
        raise CorruptObject("deletion vector CRC mismatch", object=where, check="crc32",
                            expected=f"{crc:08x}", actual=f"{actual:08x}")
    try:
        return BitMap64.deserialize(payload[4:])
    except Exception as exc:  # pyroaring raises ValueError/RuntimeError variants
        raise CorruptObject("deletion vector bitmap does not deserialize", object=where,
                            check="bitmap", error=str(exc)) from None


def place(table, bitmaps: dict[str, BitMap64]) -> dict[str, DeletionVector | None]:
    """The one writer of deletion vectors: a descriptor per data file for one commit.

    An empty bitmap gets None (no DV). A bitmap whose framed blob is at most
    ``INLINE_LIMIT`` bytes is inlined in the manifest; the others go into ONE write-once
    object under ``tombstone/`` (written here, before the manifest that will name it; a
    commit retry writes a new one and vacuum removes the unreferenced), each descriptor
    pointing at its blob by (offset of the length field, blob length), as in a Delta DV
    file."""
    out: dict[str, DeletionVector | None] = {}
    large: list[tuple[str, bytes, int]] = []
    for path, bitmap in bitmaps.items():
        if not len(bitmap):
            out[path] = None
            continue
        blob = encode_blob(bitmap)
        if len(blob) <= INLINE_LIMIT:
            out[path] = DeletionVector(DVStorage.INLINE, len(bitmap),
                                       data=base64.b64encode(blob).decode())
        else:
            large.append((path, blob, len(bitmap)))
    if large:
        out.update(_write_object(table, large))
    return out


def _write_object(table, blobs: list[tuple[str, bytes, int]]) -> dict[str, DeletionVector]:
    import datetime as dt

    from flightsrv.store.base import PutMode

    t = dt.datetime.fromtimestamp(table.runtime.clock.now_ms() / 1000, tz=dt.timezone.utc)
    key = f"tombstone/{t:%Y/%m/%d/%H}/{table.runtime.ids.new_id()}.dv"
    body = bytearray(OBJECT_FORMAT_BYTE)
    out = {}
    for path, blob, card in blobs:
        out[path] = DeletionVector(DVStorage.OBJECT, card, path=key, offset=len(body),
                                   length=len(blob))
        body += blob
    table.store.put(key, bytes(body), mode=PutMode.CREATE)
    return out


def read_dv(store, dv: DeletionVector, *, table: str, data_file: str,
            version: int | None = None) -> BitMap64:
    """Load and validate the bitmap a descriptor points at. Errors name the table, the DV
    object and (when the caller knows it) the version read, like a data file's (§7): a
    missing object is ``ObjectNotFound``, damage ``CorruptObject``."""
    try:
        if dv.storage is DVStorage.INLINE:
            where = f"{table}/manifest inline DV of {data_file}"
            bitmap = decode_blob(base64.b64decode(dv.data or ""), where=where)
        elif dv.storage is DVStorage.OBJECT:
            where = f"{table}/{dv.path}@{dv.offset}+{dv.length}"
            try:
                blob = store.get_range(dv.path, dv.offset, dv.offset + dv.length)
            except ObjectNotFound:
                raise ObjectNotFound("deletion vector referenced by the manifest is missing",
                                     table=table, object=dv.path, version=version,
                                     file=data_file) from None
            bitmap = decode_blob(blob, where=where)
        else:
            raise CorruptObject("unknown deletion vector storage", table=table, file=data_file,
                                storage=dv.storage)
        if len(bitmap) != dv.cardinality:
            raise CorruptObject("deletion vector cardinality mismatch", object=where,
                                check="cardinality", expected=dv.cardinality,
                                actual=len(bitmap))
    except CorruptObject as exc:
        raise exc.with_context(table=table, version=version, file=data_file)
    return bitmap


def dead_positions(table, f, version: int | None = None) -> BitMap64:
    """Every deleted row position of data file ``f`` (a manifest entry): its deletion vector
    plus the rows of its deleted row groups. The one place that reads a file's deletion
    state; compaction, erasure and the DML commit all ask it. ``version``: the version ``f``
    was read from, named by errors."""
    dead = read_dv(table.store, f.dv, table=table.name, data_file=f.path, version=version) \
        if f.dv else BitMap64()
    for g in f.deleted_row_groups:
        start = f.row_group_offsets[g]
        dead.add_range(start, start + f.row_group_rows(g))
    return dead


def split_deleted(f: DataFile, dead: BitMap64) -> tuple[tuple[int, ...], BitMap64]:
    """How ``f``'s deleted positions ``dead`` are recorded: (row groups deleted whole, by
    metadata only; the remaining positions, for the deletion vector). A row group all of
    whose rows are dead is a deleted row group; its positions leave the bitmap."""
    rest = BitMap64(dead)
    groups = set(f.deleted_row_groups)
    for g in range(f.row_groups):
        start = f.row_group_offsets[g]
        end = start + f.row_group_rows(g)
        if g in groups or rest.range_cardinality(start, end) == end - start:
            groups.add(g)
            rest.remove_range(start, end)
    return tuple(sorted(groups)), rest


def remap_positions(removed: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Positions in a file after the rows at ``removed`` left it (a splice, or a rewrite that
    keeps row order): positions in ``removed`` vanish, the others shift down by the removed
    rows before them. Both arguments sorted unique int64 arrays; returns int64."""
    removed = np.asarray(removed, dtype=np.int64)
    old = np.asarray(old, dtype=np.int64)
    old = old[~np.isin(old, removed, assume_unique=True)]
    return old - np.searchsorted(removed, old, side="left")


def keep_mask(deleted_positions: np.ndarray, start: int, end: int) -> np.ndarray | None:
    """Boolean mask over rows [start, end): True = keep. None when nothing there is deleted.
    ``deleted_positions`` is sorted uint64."""
    lo = np.searchsorted(deleted_positions, start, side="left")
    hi = np.searchsorted(deleted_positions, end, side="left")
    if lo == hi:
        return None
    mask = np.ones(end - start, dtype=bool)
    mask[(deleted_positions[lo:hi] - start).astype(np.int64)] = False
    return mask

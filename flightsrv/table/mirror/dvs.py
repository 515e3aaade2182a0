"""The deletion vector a mirror publishes for one data file (docs/INTEROP.md §Deletion vectors).

A flightsrv file's deleted rows are its DV plus the rows of its ``deleted_row_groups``
(metadata-only deletes). Delta and Iceberg know only the DV, so:

- a file with a DV and no deleted row groups is published with **our DV blob**: Delta points
  at it in place (storage type ``p``: our object, our offset, ``sizeInBytes = length - 8``),
  or re-encodes an inline one as a Delta inline DV (Z85 of magic + bitmap, no length, no CRC);
  Iceberg copies the blob unchanged into a Puffin ``deletion-vector-v1`` blob;
- a file with deleted row groups gets a new blob of the union (our DV read and verified,
  plus the row-group ranges), encoded by ``flightsrv.table.deletes.encode_blob``.

Every blob copied or re-encoded is read through ``decode_blob`` first (length, magic, CRC),
so a mirror never republishes unverified bytes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from pyroaring import BitMap64

from flightsrv.errors import CorruptObject
from flightsrv.table.deletes import decode_blob, encode_blob
from flightsrv.table.manifest import DataFile, DVStorage

_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_TO_Z85 = str.maketrans(_B85, _Z85)


def z85(data: bytes) -> str:
    """ZeroMQ Z85 (https://rfc.zeromq.org/spec/32/) of ``data`` zero-padded to a multiple of
    4 bytes, as Delta inline DVs use it. Z85 is base85 with the same arithmetic as Python's
    ``base64.b85encode`` and another alphabet."""
    return base64.b85encode(data, pad=True).decode("ascii").translate(_TO_Z85)


def un_z85(text: str) -> bytes:
    return base64.b85decode(text.translate(str.maketrans(_Z85, _B85)))


@dataclass(frozen=True)
class MirrorDV:
    """What a mirror publishes for one file's deleted rows."""

    cardinality: int
    #: our DV object holding the blob in place (key relative to the table), or None
    object_key: str | None = None
    offset: int = 0
    length: int = 0  # framed blob length
    #: the framed blob, when it is in hand (inline DVs and unions)
    blob: bytes | None = None

    @property
    def in_place(self) -> bool:
        return self.object_key is not None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.blob or b"").hexdigest()[:32]


def has_deletes(f: DataFile) -> bool:
    return f.dv is not None or bool(f.deleted_row_groups)


def deletes_changed(old: DataFile, new: DataFile) -> bool:
    return old.dv != new.dv or old.deleted_row_groups != new.deleted_row_groups


def _read_blob(store, table: str, f: DataFile) -> bytes:
    dv = f.dv
    if dv.storage is DVStorage.INLINE:
        blob = base64.b64decode(dv.data or "")
        where = f"{table}/manifest inline DV of {f.path}"
    else:
        blob = store.get_range(dv.path, dv.offset, dv.offset + dv.length)
        where = f"{table}/{dv.path}@{dv.offset}+{dv.length}"
    bitmap = decode_blob(blob, where=where)
    if len(bitmap) != dv.cardinality:
        raise CorruptObject("deletion vector cardinality mismatch", object=where,
                            check="cardinality", expected=dv.cardinality, actual=len(bitmap))
    return blob


def mirror_dv(store, table: str, f: DataFile, *, need_blob: bool) -> MirrorDV | None:
    """The DV to publish for ``f`` (None: nothing deleted). With ``need_blob`` the framed
    bytes are always loaded (Iceberg copies them); otherwise an object DV stays in place."""
    if not has_deletes(f):
        return None
    if not f.deleted_row_groups:
        dv = f.dv
        if dv.storage is DVStorage.OBJECT and not need_blob:
            return MirrorDV(dv.cardinality, object_key=dv.path, offset=dv.offset,
                            length=dv.length)
        blob = _read_blob(store, table, f)
        if dv.storage is DVStorage.OBJECT:
            return MirrorDV(dv.cardinality, object_key=dv.path, offset=dv.offset,
                            length=dv.length, blob=blob)
        return MirrorDV(dv.cardinality, blob=blob)
    bitmap = BitMap64()
    if f.dv is not None:
        blob = _read_blob(store, table, f)
        bitmap = decode_blob(blob, where=f"{table}/DV of {f.path}")
    for g in f.deleted_row_groups:
        start = f.row_group_offsets[g]
        bitmap.add_range(start, start + f.row_group_rows(g))
    blob = encode_blob(bitmap)
    return MirrorDV(len(bitmap), blob=blob, length=len(blob))

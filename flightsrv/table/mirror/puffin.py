"""Puffin files holding deletion vectors (https://iceberg.apache.org/puffin-spec/).

Layout: ``PFA1`` magic, the blobs, then the footer: ``PFA1``, the footer payload (UTF-8 JSON,
uncompressed), its length as a little-endian int32, 4 flag bytes (all 0), ``PFA1``.

Each blob is a ``deletion-vector-v1`` blob: exactly flightsrv's framed DV bytes (length,
magic, portable 64-bit roaring bitmap, CRC), uncompressed, with the properties
``referenced-data-file`` and ``cardinality``; ``snapshot-id`` and ``sequence-number`` are -1
as the spec requires for DV blobs (they are inherited from the manifest entry).
"""

from __future__ import annotations

import json
import struct

MAGIC = b"PFA1"
#: the reserved field id of the ``_pos`` metadata column, which a DV blob covers
ROW_POSITION_FIELD = 2147483645


def build(blobs: list[tuple[str, bytes, int]]) -> tuple[bytes, list[tuple[int, int]]]:
    """A Puffin file of ``(referenced data file URI, framed DV blob, cardinality)``.
    Returns the bytes and the (offset, length) of each blob, in order."""
    body = bytearray(MAGIC)
    spans, meta = [], []
    for ref, blob, card in blobs:
        spans.append((len(body), len(blob)))
        meta.append({"type": "deletion-vector-v1", "fields": [ROW_POSITION_FIELD],
                     "snapshot-id": -1, "sequence-number": -1, "offset": len(body),
                     "length": len(blob),
                     "properties": {"referenced-data-file": ref, "cardinality": str(card)}})
        body += blob
    footer = json.dumps({"blobs": meta, "properties": {"created-by": "flightsrv"}},
                        separators=(",", ":")).encode()
    body += MAGIC + footer + struct.pack("<i", len(footer)) + b"\x00\x00\x00\x00" + MAGIC
    return bytes(body), spans


def referenced_files(data: bytes) -> list[str]:
    """The ``referenced-data-file`` of every blob (for erasure verification)."""
    if len(data) < 16 or data[:4] != MAGIC or data[-4:] != MAGIC:
        return []
    (n,) = struct.unpack("<i", data[-12:-8])
    footer = json.loads(data[-(n + 12):-12])
    return [b.get("properties", {}).get("referenced-data-file", "") for b in footer["blobs"]]

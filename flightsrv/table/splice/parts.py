"""The pieces of a new object and their packing into legal multipart parts.

Part rules follow S3 multipart upload
(https://docs.aws.amazon.com/AmazonS3/latest/API/API_UploadPartCopy.html): every part but
the last is at least ``store.min_part_size`` bytes and at most 5 GiB. A ``Copy`` is copied
inside the store from the source object; an ``Upload`` is bytes the client sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from flightsrv.store.base import ObjectStore

MAX_PART_SIZE = 5 * 1024**3  # S3 part limit
REWRITE_PART_SIZE = 8 * 1024**2  # equal part size for full rewrites


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


def pack(store: ObjectStore, segments: list[Copy | Upload], src, force_rewrite: bool
         ) -> tuple[list[Part], str]:
    """The parts for ``store`` and the path taken: "splice" when any part is a copy, else
    "rewrite". ``src`` (a ``RangedSource``) supplies the bytes of copies that are downloaded.

    When the store demands equal part sizes (Cloudflare R2) or ``force_rewrite`` is set,
    everything is downloaded and cut into equal parts.
    """
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

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
- An edited group is decoded with pyarrow from its own byte range and written again with
  the original settings (``reencode``); its column chunks and ``RowGroup`` are lifted from
  that file and rebased.
- A group that loses every row disappears; its bytes are not copied.
- The tail is downloaded and rebuilt in its original order; the footer is re-encoded
  byte-exactly except ``num_rows`` and the row groups (``parquet_meta``).

``rewrite_row_groups`` plans (it reads, re-encodes and packs parts; it writes nothing);
``assemble`` writes the plan to a new key with one multipart upload that is aborted on any
error. When the store demands equal part sizes (Cloudflare R2) or nothing would be copied
server-side, the plan is a full rewrite of the same bytes ("rewrite").

Rooms, one purpose each:

- ``source``: ranged reads of the pinned source version, counted and cached;
- ``layout``: the footer, each group's span, the offsets a moved span must shift;
- ``reencode``: one row group without some rows, as the original writer would have;
- ``parts``: ``Copy`` / ``Upload`` pieces packed into legal multipart parts;
- ``plan``: ``SplicePlan`` and ``rewrite_row_groups``, step by step;
- ``write``: ``assemble`` (one multipart upload) and ``splice_delete``;
- ``errors``: ``SpliceUnsupported``.
"""

from __future__ import annotations

from flightsrv.table.splice.errors import SpliceUnsupported
from flightsrv.table.splice.layout import FOOTER_PROBE, read_footer
from flightsrv.table.splice.parts import (
    MAX_PART_SIZE,
    REWRITE_PART_SIZE,
    Copy,
    Part,
    Upload,
    plan_parts,
)
from flightsrv.table.splice.plan import SplicePlan, rewrite_row_groups
from flightsrv.table.splice.write import assemble, splice_delete

__all__ = [
    "Copy", "Upload", "SplicePlan", "SpliceUnsupported", "read_footer", "rewrite_row_groups",
    "assemble", "splice_delete", "plan_parts", "FOOTER_PROBE", "Part", "MAX_PART_SIZE",
    "REWRITE_PART_SIZE",
]

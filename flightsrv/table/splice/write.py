"""Write a ``SplicePlan`` to a new key with one multipart upload, aborted on any error."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from flightsrv.errors import CorruptObject
from flightsrv.store.base import ObjectMeta, ObjectStore, PutMode
from flightsrv.table.splice.parts import Copy
from flightsrv.table.splice.plan import SplicePlan, rewrite_row_groups


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

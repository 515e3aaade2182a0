"""Proof, before the first write, that a store enforces the preconditions commits rely on.

Under a scratch key the check creates an object, then requires:
1. a second ``If-None-Match: *`` create of the same key answers 412;
2. an ``If-Match`` with the current ETag succeeds;
3. an ``If-Match`` with the previous (stale) ETag answers 412.
A store that accepts either stale write is refused with ``StoreUnsupported`` naming the store,
the failed check and the missing guarantee, because on it concurrent commits would silently
overwrite each other. ``flightsrv store check`` runs the full contract
(:mod:`flightsrv.store.contract`), concurrent race included.
"""

from __future__ import annotations

import contextlib

from flightsrv.errors import PreconditionFailed, StoreUnsupported
from flightsrv.store.base import ObjectStore, PutMode
from flightsrv.store.contract import GUARANTEES

SCRATCH_PREFIX = "_flightsrv_selfcheck/"


def verify_preconditions(store: ObjectStore, token: str) -> None:
    """Run the check under ``_flightsrv_selfcheck/<token>``; raise StoreUnsupported on failure."""
    key = SCRATCH_PREFIX + token
    try:
        first = store.put(key, f"selfcheck {token} 1".encode(), mode=PutMode.CREATE)
        try:
            store.put(key, f"selfcheck {token} dup".encode(), mode=PutMode.CREATE)
        except PreconditionFailed:
            pass
        else:
            raise StoreUnsupported(
                f"store lacks {GUARANTEES['if-none-match']}: it ignores If-None-Match (a "
                "duplicate create was accepted), so concurrent commits could overwrite each "
                "other; refusing to write (`flightsrv store check` runs the full contract)",
                store=store.uri, check="if-none-match", missing=GUARANTEES["if-none-match"],
                key=key,
            )
        second = store.put(key, f"selfcheck {token} 2".encode(), mode=PutMode.IF_MATCH,
                           etag=first.etag)
        try:
            store.put(key, f"selfcheck {token} 3".encode(), mode=PutMode.IF_MATCH,
                      etag=first.etag)
        except PreconditionFailed:
            pass
        else:
            raise StoreUnsupported(
                f"store lacks {GUARANTEES['if-match']}: it ignores If-Match (a write with a "
                "stale ETag was accepted), so concurrent commits could overwrite each other; "
                "refusing to write (`flightsrv store check` runs the full contract)",
                store=store.uri, check="if-match", missing=GUARANTEES["if-match"], key=key,
                stale_etag=first.etag,
                current_etag=second.etag,
            )
    finally:
        with contextlib.suppress(Exception):
            store.delete(key)


def ensure_checked(store: ObjectStore, token: str) -> None:
    """Run ``verify_preconditions`` once per store object."""
    if getattr(store, "_flightsrv_checked", False):
        return
    verify_preconditions(store, token)
    with contextlib.suppress(AttributeError):
        store._flightsrv_checked = True

"""Object stores: one protocol (``base.ObjectStore``), two backends chosen by URI.

``/path`` or ``file:///path`` → ``LocalStore``; ``s3://bucket/prefix`` → ``S3Store``.
"""

from __future__ import annotations

from urllib.parse import urlparse

from flightsrv.runtime import DEFAULT_RUNTIME, Runtime
from flightsrv.store.base import (
    CompletedPart,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PutMode,
    join_key,
)
from flightsrv.store.selfcheck import ensure_checked, verify_preconditions

__all__ = [
    "CompletedPart", "MultipartUpload", "ObjectMeta", "ObjectStore", "PutMode", "join_key",
    "open_store", "ensure_checked", "verify_preconditions",
]


def open_store(uri: str, runtime: Runtime = DEFAULT_RUNTIME) -> ObjectStore:
    """Open the backend for ``uri``. Raises ConfigurationError for unknown schemes."""
    from flightsrv.errors import ConfigurationError

    if uri.startswith("s3://"):
        from flightsrv.store.s3 import S3Store

        p = urlparse(uri)
        if not p.netloc:
            raise ConfigurationError("s3 URI needs a bucket", uri=uri)
        return S3Store(p.netloc, p.path.strip("/"))
    if uri.startswith("file://"):
        uri = urlparse(uri).path
    if "://" in uri:
        raise ConfigurationError("unsupported store URI scheme (use a path, file:// or s3://)",
                                 uri=uri)
    from flightsrv.store.local import LocalStore

    return LocalStore(uri, runtime)

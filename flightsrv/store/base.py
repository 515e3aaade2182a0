"""The ``ObjectStore`` protocol: the only way flightsrv touches storage.

Semantics follow the S3 API (https://docs.aws.amazon.com/AmazonS3/latest/API/),
including conditional writes (https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html).
Keys are ``/``-separated strings relative to the store's root; they never start with ``/``.

Contracts every backend keeps:

- ``put(key, data, mode=CREATE)`` succeeds only if ``key`` does not exist (If-None-Match: *),
  else raises ``PreconditionFailed``. Atomic: of N concurrent creators exactly one wins.
- ``put(key, data, mode=IF_MATCH, etag=e)`` replaces the object only if its current ETag is
  ``e`` (compare-and-swap), else ``PreconditionFailed``; ``ObjectNotFound`` if it is missing.
  A rewrite with identical bytes yields a *new* ETag on the local store; on S3 the ETag is
  the MD5, so callers must write unique bytes (flightsrv always does).
- ``put(key, data, mode=OVERWRITE)`` is an unconditional write.
- ``get``/``get_range`` raise ``ObjectNotFound``; with ``etag=`` they raise
  ``PreconditionFailed`` if the object changed, so a scan never mixes two versions of a key.
- ``list(prefix)`` yields ``ObjectMeta`` in key order, never temporary/partial objects.
- ``delete`` is idempotent (deleting a missing key is not an error).
- Multipart: ``create_multipart`` → ``upload_part``/``upload_part_copy`` → ``complete_multipart``
  (conditional on the destination not existing) or ``abort_multipart``. Part numbers start at 1.
  ``min_part_size`` is the smallest legal non-last part (5 MiB on S3, 0 locally).
- Transport errors that may succeed on retry raise ``StoreError``.
- ``arrow_filesystem()``: a ``pyarrow.fs.FileSystem`` and the path of key ``""`` in it,
  through which a reader may read objects natively (C++, parallel and coalesced ranged
  reads, no Python per byte), or None (the local store, whose readers open files by
  ``local_path``). Those reads carry no ETag precondition, so only keys that are immutable
  by protocol (data files: written once with CREATE under unique names, never rewritten)
  may be read through it, and the reader checks their size against the manifest. Wrappers
  that must see every read (fault injection, counting) answer None.

What a store offers beyond that is stated, not probed: ``capabilities``
(``StoreCapabilities``) says whether objects are files on this host (``local_files``). Only
then do ``new_temp_file``, ``write_temp_file`` and ``adopt`` (stage a large object and
install it without another copy) work; elsewhere they raise ``OperationUnsupported`` and the
caller takes the portable path (``put_file``, multipart). Every backend and wrapper answers
every method.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol, runtime_checkable


class PutMode(enum.Enum):
    CREATE = "create"  # If-None-Match: *
    IF_MATCH = "if_match"  # If-Match: <etag>
    OVERWRITE = "overwrite"


@dataclass(frozen=True)
class ObjectMeta:
    key: str
    size: int
    etag: str
    last_modified_ms: int = 0


@dataclass(frozen=True)
class MultipartUpload:
    key: str
    upload_id: str
    initiated_ms: int = 0


@dataclass(frozen=True)
class CompletedPart:
    part_number: int
    etag: str


@dataclass(frozen=True)
class StoreCapabilities:
    """What a backend offers beyond the calls every store answers usefully."""

    #: Objects are files on this host: ``new_temp_file`` / ``write_temp_file`` / ``adopt``
    #: stage an object and install it without copying it again.
    local_files: bool = False


#: The capabilities of a store that offers nothing beyond the common calls (S3).
PORTABLE = StoreCapabilities()
#: The capabilities of a local directory.
LOCAL_FILES = StoreCapabilities(local_files=True)


@runtime_checkable
class ObjectStore(Protocol):
    """One protocol, several backends (``local``, ``s3``; ``faults`` wraps either)."""

    uri: str
    min_part_size: int
    equal_part_sizes: bool
    capabilities: StoreCapabilities

    def get(self, key: str, *, etag: str | None = None) -> tuple[bytes, ObjectMeta]:
        """Whole object. Raises ObjectNotFound, PreconditionFailed (etag changed)."""
        ...

    def get_range(self, key: str, start: int, end: int, *, etag: str | None = None) -> bytes:
        """Bytes [start, end) of the object; a range past the end is clipped.
        Raises ObjectNotFound, PreconditionFailed (etag changed)."""
        ...

    def head(self, key: str) -> ObjectMeta:
        """Metadata only. Raises ObjectNotFound."""
        ...

    def put(
        self, key: str, data: bytes, *, mode: PutMode = PutMode.CREATE, etag: str | None = None
    ) -> ObjectMeta:
        """Write a whole object under ``mode``. Raises PreconditionFailed, ObjectNotFound
        (IF_MATCH on a missing key), StoreUnsupported (store failed its self-check)."""
        ...

    def put_file(self, key: str, path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        """Upload a local file (streamed; multipart on S3 for large files). CREATE or OVERWRITE."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Objects whose key starts with ``prefix``, in key order."""
        ...

    def delete(self, key: str) -> None:
        """Remove a key; missing keys are ignored."""
        ...

    def local_path(self, key: str) -> str | None:
        """A filesystem path for ``key`` if the backend is a local directory, else None."""
        ...

    def arrow_filesystem(self) -> tuple[object, str] | None:
        """A ``pyarrow.fs.FileSystem`` and the path of key ``""`` in it, or None (see the
        module docstring for which keys may be read through it)."""
        ...

    # -- staged files (``capabilities.local_files``) -------------------------------
    def new_temp_file(self) -> str:
        """A fresh path on the store's own filesystem to write a large object to, then
        ``adopt`` it. Raises OperationUnsupported without ``local_files``."""
        ...

    def write_temp_file(
        self, tmp_path: str, pieces: Iterable[bytes | tuple[int, int]], *, source_key: str,
        source_etag: str | None = None,
    ) -> None:
        """Write ``tmp_path`` (from ``new_temp_file``) in one pass from ``pieces`` in order:
        bytes are written as they are, a ``(start, end)`` range is copied from
        ``source_key`` inside the store (inside the kernel locally). The source is pinned to
        ``source_etag``. Raises ObjectNotFound, PreconditionFailed (the source changed),
        CorruptObject (a range past the source's end), OperationUnsupported without
        ``local_files``."""
        ...

    def adopt(self, key: str, tmp_path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        """Install a finished file from ``new_temp_file`` as ``key`` without copying it
        (CREATE or OVERWRITE); the file is consumed. Raises PreconditionFailed,
        OperationUnsupported without ``local_files``."""
        ...

    # -- multipart ---------------------------------------------------------------
    def create_multipart(self, key: str) -> str:
        """Start an upload to ``key``; returns the upload id."""
        ...

    def upload_part(self, key: str, upload_id: str, part_number: int, data: bytes) -> CompletedPart:
        ...

    def upload_part_copy(
        self,
        key: str,
        upload_id: str,
        part_number: int,
        source_key: str,
        start: int,
        end: int,
        *,
        source_etag: str | None = None,
    ) -> CompletedPart:
        """Copy source bytes [start, end) into the part, inside the store."""
        ...

    def complete_multipart(
        self, key: str, upload_id: str, parts: list[CompletedPart], *,
        mode: PutMode = PutMode.CREATE,
    ) -> ObjectMeta:
        """Assemble the parts. With CREATE, raises PreconditionFailed if ``key`` exists."""
        ...

    def abort_multipart(self, key: str, upload_id: str) -> None:
        ...

    def list_multipart(self, prefix: str = "") -> Iterator[MultipartUpload]:
        """Uploads started and neither completed nor aborted."""
        ...


def arrow_filesystem(store: ObjectStore) -> tuple[object, str] | None:
    """``store.arrow_filesystem()``: a native filesystem for immutable keys, or None."""
    return store.arrow_filesystem()


def join_key(*parts: str) -> str:
    """Join key segments with single slashes."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))

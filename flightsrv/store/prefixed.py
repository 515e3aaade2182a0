"""A view of an ``ObjectStore`` under a key prefix (how a table sees its warehouse).

All tables of a warehouse share one store object, so the local backend's per-key locks are
the same no matter which table or process touches a key.
"""

from __future__ import annotations

from typing import Iterator

from flightsrv.store.base import (
    CompletedPart,
    MultipartUpload,
    ObjectMeta,
    ObjectStore,
    PutMode,
    StoreCapabilities,
)


class PrefixedStore:
    def __init__(self, inner: ObjectStore, prefix: str):
        self.inner = inner
        self.prefix = prefix.strip("/") + "/"
        self.uri = inner.uri.rstrip("/") + "/" + self.prefix.rstrip("/")

    def __repr__(self) -> str:
        return f"PrefixedStore({self.uri!r})"

    @property
    def min_part_size(self) -> int:
        return self.inner.min_part_size

    @property
    def equal_part_sizes(self) -> bool:
        return self.inner.equal_part_sizes

    @property
    def capabilities(self) -> StoreCapabilities:
        return self.inner.capabilities

    def _k(self, key: str) -> str:
        return self.prefix + key

    def _m(self, m: ObjectMeta) -> ObjectMeta:
        return ObjectMeta(m.key[len(self.prefix):], m.size, m.etag, m.last_modified_ms)

    def get(self, key, *, etag=None):
        data, meta = self.inner.get(self._k(key), etag=etag)
        return data, self._m(meta)

    def get_range(self, key, start, end, *, etag=None) -> bytes:
        return self.inner.get_range(self._k(key), start, end, etag=etag)

    def head(self, key) -> ObjectMeta:
        return self._m(self.inner.head(self._k(key)))

    def put(self, key, data, *, mode=PutMode.CREATE, etag=None) -> ObjectMeta:
        return self._m(self.inner.put(self._k(key), data, mode=mode, etag=etag))

    def put_file(self, key, path, *, mode=PutMode.CREATE) -> ObjectMeta:
        return self._m(self.inner.put_file(self._k(key), path, mode=mode))

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        for m in self.inner.list(self._k(prefix)):
            yield self._m(m)

    def delete(self, key) -> None:
        self.inner.delete(self._k(key))

    def local_path(self, key):
        return self.inner.local_path(self._k(key))

    def arrow_filesystem(self):
        got = self.inner.arrow_filesystem()
        if got is None:
            return None
        fs, root = got
        return fs, root.rstrip("/") + "/" + self.prefix.rstrip("/")

    def new_temp_file(self) -> str:
        return self.inner.new_temp_file()

    def write_temp_file(self, tmp_path, pieces, *, source_key, source_etag=None) -> None:
        self.inner.write_temp_file(tmp_path, pieces, source_key=self._k(source_key),
                                   source_etag=source_etag)

    def adopt(self, key, tmp_path, *, mode=PutMode.CREATE) -> ObjectMeta:
        return self._m(self.inner.adopt(self._k(key), tmp_path, mode=mode))

    def create_multipart(self, key) -> str:
        return self.inner.create_multipart(self._k(key))

    def upload_part(self, key, upload_id, part_number, data) -> CompletedPart:
        return self.inner.upload_part(self._k(key), upload_id, part_number, data)

    def upload_part_copy(self, key, upload_id, part_number, source_key, start, end, *,
                         source_etag=None) -> CompletedPart:
        return self.inner.upload_part_copy(self._k(key), upload_id, part_number,
                                           self._k(source_key), start, end,
                                           source_etag=source_etag)

    def complete_multipart(self, key, upload_id, parts, *, mode=PutMode.CREATE) -> ObjectMeta:
        return self._m(self.inner.complete_multipart(self._k(key), upload_id, parts, mode=mode))

    def abort_multipart(self, key, upload_id) -> None:
        self.inner.abort_multipart(self._k(key), upload_id)

    def list_multipart(self, prefix: str = "") -> Iterator[MultipartUpload]:
        for u in self.inner.list_multipart(self._k(prefix)):
            yield MultipartUpload(u.key[len(self.prefix):], u.upload_id, u.initiated_ms)

    def list_prefixes(self, prefix: str = ""):
        return self.inner.list_prefixes(self._k(prefix))

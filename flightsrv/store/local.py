"""Local-directory backend of ``ObjectStore`` (the embedded default).

Objects are plain files under ``root`` so that the warehouse stays browsable and DuckDB or
pyarrow can read data files in place. Atomicity across processes on one host:

- CREATE writes a temp file, fsyncs it, then ``os.link``s it to the final name: ``link``
  fails with EEXIST if the key exists, so exactly one creator wins.
- IF_MATCH / OVERWRITE / delete take an exclusive ``fcntl.flock`` on a per-key lock file,
  compare the current ETag, ``os.replace`` the temp file over the key and fsync the directory.
- ETags are generation-based: ``<inode>-<mtime_ns>-<size>`` of the file. A rewrite under the
  lock gets an mtime later than the file it replaces (bumped when the clock has not moved on),
  so the ETags of one key never repeat and a stale If-Match never passes. If-Match writes
  compare the whole ETag.
- Readers open the file and check the ETag on the open descriptor (``fstat``): a concurrent
  replace swaps the directory entry, never the bytes behind an open descriptor. A pinned read
  compares size and mtime only (``_same_object``), so a warehouse copied with its timestamps
  (``cp -a``, ``shutil.copytree`` with ``copy2``, ``rsync -a``, ``tar``, which may keep whole
  seconds only) still reads by the ETags its manifests recorded: a copy changes every inode.
  Rewrites move the mtime forward, so a read pinned to an older version of a key still fails.

Temp files, locks and multipart state live under ``.flightsrv/`` and are never listed.
Opening a store creates nothing: the root and ``.flightsrv/`` are made by the first write,
so reading a path that holds no warehouse leaves no trace (``initialized`` tells whether a
write ever happened here).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from typing import Iterable, Iterator

from flightsrv.errors import (
    ConfigurationError,
    CorruptObject,
    ObjectNotFound,
    PreconditionFailed,
    StoreAccessDenied,
    StoreError,
)
from flightsrv.runtime import DEFAULT_RUNTIME, Runtime
from flightsrv.store.base import (
    LOCAL_FILES,
    CompletedPart,
    MultipartUpload,
    ObjectMeta,
    PutMode,
)

_META_DIR = ".flightsrv"
_COPY_CHUNK = 64 * 1024 * 1024
#: how often an install recreates a directory a concurrent delete pruned before giving up
_INSTALL_ATTEMPTS = 16


def _etag_of(st: os.stat_result) -> str:
    return f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'


def _mtime_size(etag: str) -> tuple[int, int] | None:
    """(mtime_ns, size) of a local ETag, or None if ``etag`` is not one."""
    parts = etag.strip('"').split("-")
    if len(parts) != 3:
        return None
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


#: mtime precisions a copy may truncate to (ns): GNU tar keeps whole seconds, others ms or µs
_COPY_PRECISIONS = (1_000, 1_000_000, 1_000_000_000)


def _same_object(st: os.stat_result, etag: str) -> bool:
    """Whether the file ``st`` is the object version ``etag`` named, for a pinned read.

    A copy of the store (``cp -a``, ``rsync -a``, ``tar``, a restored backup) gives every file
    a new inode and may truncate its mtime, so a pinned read ignores the inode and accepts the
    recorded mtime cut to a coarser precision; the size must match exactly. A rewrite of the
    key cannot pass: ``_install`` gives it an mtime later than the version it replaced."""
    if _etag_of(st) == etag:
        return True
    pinned = _mtime_size(etag)
    if pinned is None:
        return False
    mtime, size = pinned
    if st.st_size != size:
        return False
    return st.st_mtime_ns == mtime or any(st.st_mtime_ns == mtime - mtime % p
                                          for p in _COPY_PRECISIONS)


def _os_error(exc: OSError, key: str) -> StoreError | StoreAccessDenied:
    """An OS error on ``key`` as the store error a caller can act on, naming the key (relative
    to the store) and the OS's reason, never the server's absolute path that ``str(exc)``
    carries: a file or directory the server may not read or write is ``StoreAccessDenied``
    (an operator fixes the permissions), anything else (EIO, ENOSPC, ...) ``StoreError``."""
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, PermissionError):
        return StoreAccessDenied("the store refused access: fix the permissions of the "
                                 "object or its directory", key=key, error=reason)
    return StoreError("the store failed to access an object", key=key, error=reason)


@contextlib.contextmanager
def _os_errors(key: str):
    """Run an operation on ``key`` with its OS errors raised as store errors (``_os_error``).
    Errors the operation maps itself (a missing file is ``ObjectNotFound``) are not
    ``OSError`` by then."""
    try:
        yield
    except OSError as exc:
        raise _os_error(exc, key) from None


def _copy_range(src_fd: int, dst_fd: int, start: int, length: int) -> None:
    """Copy ``length`` bytes from ``src_fd`` at ``start`` to ``dst_fd``'s current position,
    inside the kernel where the OS allows (``copy_file_range``, then ``sendfile``)."""
    offset = start
    remaining = length
    while remaining > 0:
        n = min(remaining, _COPY_CHUNK)
        try:
            copied = os.copy_file_range(src_fd, dst_fd, n, offset)
        except OSError:
            copied = os.sendfile(dst_fd, src_fd, offset, n)
        if copied <= 0:
            raise StoreError("short copy: source ended early", offset=offset, remaining=remaining)
        offset += copied
        remaining -= copied


class LocalStore:
    """``ObjectStore`` over a directory. See the module docstring for the guarantees."""

    min_part_size = 0
    equal_part_sizes = False
    capabilities = LOCAL_FILES

    def __init__(self, root: str, runtime: Runtime = DEFAULT_RUNTIME):
        self.root = os.path.abspath(root)
        self.uri = "file://" + self.root
        self.runtime = runtime
        self._meta = os.path.join(self.root, _META_DIR)
        self._meta_ready = False

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    @property
    def initialized(self) -> bool:
        """Whether a write ever happened under this root (its ``.flightsrv/`` exists)."""
        return os.path.isdir(self._meta)

    # -- helpers -----------------------------------------------------------------
    def _meta_dir(self, sub: str) -> str:
        """``.flightsrv/<sub>``, created (with the root) on first use by a write."""
        if not self._meta_ready:
            if os.path.exists(self.root) and not os.path.isdir(self.root):
                raise ConfigurationError("the store root is a file, not a directory",
                                         store=self.uri)
            try:
                for name in ("tmp", "locks", "mpu"):
                    os.makedirs(os.path.join(self._meta, name), exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise ConfigurationError("the store root is not a directory (a file is in the "
                                         "way)", store=self.uri) from None
            self._meta_ready = True
        return os.path.join(self._meta, sub)

    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/") or key.startswith(_META_DIR):
            raise ValueError(f"invalid object key: {key!r}")
        return os.path.join(self.root, key)

    def local_path(self, key: str) -> str:
        return self._path(key)

    def arrow_filesystem(self) -> None:
        return None  # readers open data files in place by ``local_path``

    def _tmp_path(self) -> str:
        return os.path.join(self._meta_dir("tmp"), self.runtime.ids.new_id())

    @contextlib.contextmanager
    def _lock(self, key: str):
        """An exclusive lock on ``key`` across threads and processes: ``flock`` of a lock
        file named after it, which the holder unlinks as the last step of its critical
        section, so no lock file outlives its use (one per key ever deleted or swapped
        would pile up). A waiter that locked a file unlinked meanwhile holds nothing: it
        sees the path gone or naming another file, and locks again."""
        path = os.path.join(self._meta_dir("locks"), hashlib.sha1(key.encode()).hexdigest())
        while True:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    held = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    held = False
            except BaseException:
                os.close(fd)
                raise
            if held:
                break
            os.close(fd)  # (releases the lock of the unlinked file)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _meta_of(self, key: str, st: os.stat_result) -> ObjectMeta:
        return ObjectMeta(key, st.st_size, _etag_of(st), st.st_mtime_ns // 1_000_000)

    @staticmethod
    def _fsync_dir(path: str) -> None:
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_tmp(self, data: bytes) -> str:
        tmp = self._tmp_path()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:  # a failed or interrupted write leaves nothing behind
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp

    def _install(self, key: str, tmp: str, mode: PutMode, etag: str | None) -> ObjectMeta:
        """Move a finished temp file to ``key`` under ``mode``. Consumes ``tmp``."""
        path = self._path(key)
        try:
            if mode is PutMode.CREATE:
                try:
                    self._into_dir(tmp, path, os.link)
                except FileExistsError:
                    raise PreconditionFailed(
                        "object exists (If-None-Match: *)", store=self.uri, key=key
                    ) from None
                self._fsync_dir(path)
                return self._meta_of(key, os.stat(path))
            with self._lock(key):
                try:
                    old = os.stat(path)
                except FileNotFoundError:
                    old = None
                if mode is PutMode.IF_MATCH:
                    if old is None:
                        raise ObjectNotFound("If-Match on a missing object", store=self.uri,
                                             key=key)
                    if _etag_of(old) != etag:
                        raise PreconditionFailed(
                            "stale If-Match", store=self.uri, key=key, expected=etag,
                            found=_etag_of(old),
                        )
                new = os.stat(tmp)
                if old is not None and new.st_mtime_ns <= old.st_mtime_ns:
                    # the ETags of a key never repeat, and pinned reads (which ignore the
                    # inode, see ``_same_object``) of the old version fail
                    os.utime(tmp, ns=(new.st_atime_ns, old.st_mtime_ns + 1))
                self._into_dir(tmp, path, os.replace)
                self._fsync_dir(path)
                return self._meta_of(key, os.stat(path))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    @staticmethod
    def _into_dir(tmp: str, path: str, move) -> None:
        """``move(tmp, path)`` (link or replace) with ``path``'s directory created first. A
        concurrent ``delete`` of the last object in a directory prunes it (and its emptied
        parents); if it does so between the ``makedirs`` and the move, or inside
        ``makedirs``, the call fails with ENOENT (or EEXIST from ``makedirs`` finding a
        directory gone that it saw) although ``tmp`` is there: make the directory again and
        retry. EEXIST from the move itself is the caller's (an object is there)."""
        for attempt in range(_INSTALL_ATTEMPTS):
            last = attempt == _INSTALL_ATTEMPTS - 1
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except (FileNotFoundError, FileExistsError):
                if last:
                    raise
                continue
            try:
                move(tmp, path)
                return
            except FileNotFoundError:
                if last or not os.path.exists(tmp):
                    raise

    # -- reads -------------------------------------------------------------------
    def _open_checked(self, key: str, etag: str | None):
        try:
            f = open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError):  # a file in the key's path: none
            raise ObjectNotFound("no such object", store=self.uri, key=key) from None
        except OSError as exc:
            raise _os_error(exc, key) from None
        st = os.fstat(f.fileno())
        if etag is not None and not _same_object(st, etag):
            f.close()
            raise PreconditionFailed(
                "object changed since it was pinned", store=self.uri, key=key, expected=etag,
                found=_etag_of(st),
            )
        return f, st

    def get(self, key: str, *, etag: str | None = None) -> tuple[bytes, ObjectMeta]:
        f, st = self._open_checked(key, etag)
        with f, _os_errors(key):
            return f.read(), self._meta_of(key, st)

    def get_range(self, key: str, start: int, end: int, *, etag: str | None = None) -> bytes:
        f, _ = self._open_checked(key, etag)
        with f, _os_errors(key):
            return os.pread(f.fileno(), max(0, end - start), start)

    def head(self, key: str) -> ObjectMeta:
        try:
            return self._meta_of(key, os.stat(self._path(key)))
        except (FileNotFoundError, NotADirectoryError):  # a file in the key's path: none
            raise ObjectNotFound("no such object", store=self.uri, key=key) from None
        except OSError as exc:
            raise _os_error(exc, key) from None

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, base) if base else self.root
        found: list[ObjectMeta] = []

        def failed(exc: OSError) -> None:
            # a directory that is gone (or a file in the prefix's path) holds nothing; any
            # other error fails the listing: a listing that silently left a directory out
            # would make maintenance take the objects under it for absent (vacuum then
            # deletes what the versions it did not see reference)
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
                return
            rel = os.path.relpath(exc.filename or start, self.root).replace(os.sep, "/")
            raise _os_error(exc, prefix if rel == "." else rel + "/")

        for dirpath, dirnames, filenames in os.walk(start, onerror=failed):
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
            if rel_dir == "":
                dirnames[:] = [d for d in dirnames if d != _META_DIR]
            for name in filenames:
                key = f"{rel_dir}/{name}" if rel_dir else name
                if not key.startswith(prefix):
                    continue
                try:
                    found.append(self._meta_of(key, os.stat(os.path.join(dirpath, name))))
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise _os_error(exc, key) from None
        found.sort(key=lambda m: m.key)
        return iter(found)

    # -- writes ------------------------------------------------------------------
    def put(
        self, key: str, data: bytes, *, mode: PutMode = PutMode.CREATE, etag: str | None = None
    ) -> ObjectMeta:
        if mode is PutMode.IF_MATCH and etag is None:
            raise ValueError("IF_MATCH needs an etag")
        with _os_errors(key):
            return self._install(key, self._write_tmp(bytes(data)), mode, etag)

    def put_file(self, key: str, path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        tmp = self._tmp_path()
        try:
            shutil.copyfile(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return self._install(key, tmp, mode, None)

    def new_temp_file(self) -> str:
        """A path on the store's filesystem to write a large object to before ``adopt``."""
        return self._tmp_path()

    def write_temp_file(
        self, tmp_path: str, pieces: Iterable[bytes | tuple[int, int]], *, source_key: str,
        source_etag: str | None = None,
    ) -> None:
        """Write ``tmp_path`` in one pass: bytes as they are, ``(start, end)`` ranges of
        ``source_key`` copied inside the kernel (``_copy_range``). The source is pinned on
        the open descriptor, so a concurrent replace cannot mix versions."""
        src, st = self._open_checked(source_key, source_etag)
        with src, open(tmp_path, "wb", buffering=0) as dst:
            for piece in pieces:
                if not isinstance(piece, tuple):
                    view = memoryview(piece)
                    while view:
                        view = view[dst.write(view):]
                    continue
                start, end = piece
                if start < 0 or start > end or end > st.st_size:
                    raise CorruptObject("source ended inside a copied range", key=source_key,
                                        offset=start, end=end, size=st.st_size)
                _copy_range(src.fileno(), dst.fileno(), start, end - start)

    def adopt(self, key: str, tmp_path: str, *, mode: PutMode = PutMode.CREATE) -> ObjectMeta:
        """Install a finished file from ``new_temp_file`` as ``key`` without copying it."""
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        return self._install(key, tmp_path, mode, None)

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not self.initialized and not os.path.lexists(path):
            return  # nothing was ever written here: deleting must not create .flightsrv/
        with _os_errors(key), self._lock(key):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        # prune now-empty directories, best effort
        d = os.path.dirname(path)
        while d != self.root and d.startswith(self.root):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)

    def sweep_temp(self, before_ms: int, *, dry_run: bool = False) -> tuple[int, int]:
        """Remove temp files (``.flightsrv/tmp/``) last modified before ``before_ms``: the
        partial writes of killed writers, which no key names and nothing else removes.
        (A live writer's temp file is younger: every write moves its mtime, and it is
        installed right after its last one; ``before_ms`` must leave a writer that time,
        as vacuum's grace does.) Returns (files, bytes) removed, or that would be with
        ``dry_run``. Lock files (``.flightsrv/locks/``) are removed by their holders
        (:meth:`_lock`)."""
        root = os.path.join(self._meta, "tmp")
        files = size = 0
        try:
            names = os.listdir(root)
        except FileNotFoundError:  # nothing was ever written here
            return 0, 0
        except OSError as exc:
            raise _os_error(exc, f"{_META_DIR}/tmp/") from None
        for name in names:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                if not (0 < st.st_mtime_ns // 1_000_000 < before_ms) or \
                        not os.path.isfile(path):
                    continue
                if not dry_run:
                    os.unlink(path)
            except FileNotFoundError:  # installed or removed meanwhile
                continue
            except OSError as exc:
                raise _os_error(exc, f"{_META_DIR}/tmp/{name}") from None
            files, size = files + 1, size + st.st_size
        return files, size

    # -- multipart ---------------------------------------------------------------
    def _mpu_dir(self, upload_id: str) -> str:
        if not upload_id.isalnum():
            raise ValueError(f"invalid upload id {upload_id!r}")
        return os.path.join(self._meta_dir("mpu"), upload_id)

    def create_multipart(self, key: str) -> str:
        self._path(key)
        upload_id = self.runtime.ids.new_id()
        d = self._mpu_dir(upload_id)
        os.makedirs(d)
        with open(os.path.join(d, "upload.json"), "w") as f:
            json.dump({"key": key, "initiated_ms": self.runtime.clock.now_ms()}, f)
        return upload_id

    def _part_path(self, key: str, upload_id: str, part_number: int) -> str:
        d = self._mpu_dir(upload_id)
        try:
            with open(os.path.join(d, "upload.json")) as f:
                info = json.load(f)
        except FileNotFoundError:
            raise ObjectNotFound("no such multipart upload", store=self.uri, key=key,
                                 upload_id=upload_id) from None
        if info["key"] != key:
            raise ValueError(f"upload {upload_id} belongs to {info['key']}, not {key}")
        if not 1 <= part_number <= 10000:
            raise ValueError(f"part number {part_number} out of range 1..10000")
        return os.path.join(d, f"part-{part_number:05d}")

    def upload_part(self, key: str, upload_id: str, part_number: int, data: bytes) -> CompletedPart:
        path = self._part_path(key, upload_id, part_number)
        with open(path, "wb") as f:
            f.write(data)
        return CompletedPart(part_number, _etag_of(os.stat(path)))

    def upload_part_copy(
        self, key: str, upload_id: str, part_number: int, source_key: str, start: int, end: int,
        *, source_etag: str | None = None,
    ) -> CompletedPart:
        path = self._part_path(key, upload_id, part_number)
        src, st = self._open_checked(source_key, source_etag)
        with src:
            if end > st.st_size or start < 0 or start > end:
                raise ValueError(
                    f"copy range [{start}, {end}) outside {source_key} of {st.st_size} bytes"
                )
            with open(path, "wb") as dst:
                _copy_range(src.fileno(), dst.fileno(), start, end - start)
        return CompletedPart(part_number, _etag_of(os.stat(path)))

    def complete_multipart(
        self, key: str, upload_id: str, parts: list[CompletedPart], *,
        mode: PutMode = PutMode.CREATE,
    ) -> ObjectMeta:
        tmp = self._tmp_path()
        with open(tmp, "wb") as out:
            for part in parts:
                path = self._part_path(key, upload_id, part.part_number)
                st = os.stat(path)
                if _etag_of(st) != part.etag:
                    raise PreconditionFailed("part changed", key=key, part=part.part_number)
                with open(path, "rb") as src:
                    _copy_range(src.fileno(), out.fileno(), 0, st.st_size)
            out.flush()
            os.fsync(out.fileno())
        meta = self._install(key, tmp, mode, None)
        shutil.rmtree(self._mpu_dir(upload_id), ignore_errors=True)
        return meta

    def abort_multipart(self, key: str, upload_id: str) -> None:
        shutil.rmtree(self._mpu_dir(upload_id), ignore_errors=True)

    def list_multipart(self, prefix: str = "") -> Iterator[MultipartUpload]:
        root = os.path.join(self._meta, "mpu")
        out = []
        try:
            ids = sorted(os.listdir(root))
        except FileNotFoundError:  # nothing was ever written here
            return iter(out)
        for upload_id in ids:
            try:
                with open(os.path.join(root, upload_id, "upload.json")) as f:
                    info = json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            if info["key"].startswith(prefix):
                out.append(MultipartUpload(info["key"], upload_id, info["initiated_ms"]))
        return iter(out)

    def list_prefixes(self, prefix: str = "") -> list[str]:
        """Immediate 'subdirectories' under ``prefix`` (like S3 ListObjects with Delimiter)."""
        base = os.path.join(self.root, prefix) if prefix else self.root
        try:
            names = sorted(os.listdir(base))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise _os_error(exc, prefix) from None
        return [n for n in names if n != _META_DIR and os.path.isdir(os.path.join(base, n))]

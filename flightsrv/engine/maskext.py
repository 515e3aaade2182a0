"""The deletion-mask extension: flightsrv's deletion vectors applied inside DuckDB's scan.

``native/fsrv_mask.c`` is a DuckDB extension written against DuckDB's C extension API
(v1.2.0 headers vendored in ``native/``, which DuckDB 2.0.1 accepts). It registers
:data:`SLOTS` scalar functions ``__fsrv_live_<k>``: ``(BIGINT position) -> BOOLEAN``, true
unless the position is set in slot ``k``'s bitmap of deleted positions, and
``(UBIGINT file_index, BIGINT position) -> BOOLEAN`` for a slot holding the bitmaps of the
files of one ``read_parquet`` list (false for a file index it holds none for). A vector of
consecutive positions is read eight rows per bitmap byte, 64 rows with no deleted row as one
run of trues. Nothing else: no table function, no setting, no file or network access, and
no SQL function that writes a slot.

Build (:func:`path`): at first use, with the system C compiler (``$CC`` or ``cc``), into a
private cache directory (``$FLIGHTSRV_CACHE_DIR`` or ``~/.cache/flightsrv``, ``maskext/``,
mode 0700, owned by this user) under a name keyed by the SHA-256 of the source, the headers,
the DuckDB version and platform (a file built there before, by CI or an image build, needs no
compiler at run time). flightsrv's own code appends the 512-byte metadata footer
DuckDB's loader checks (platform, C API version, ABI ``C_STRUCT``, an empty signature). The
file's digest is recorded beside it and checked again before every load.

Load (:func:`connect`): on the engine's warehouse connection only, created with
``allow_unsigned_extensions`` (a setting DuckDB accepts only at connection creation), before
the connection is locked; ``enable_external_access=false`` and ``lock_configuration=true``
follow as before, so no later LOAD or INSTALL can run, and user SQL never reaches LOAD or
INSTALL (the front end refuses them). If the compiler, the build or the load fails, the
engine logs it once and reads files with deleted rows as before (the masked Arrow scan).
``FLIGHTSRV_MASK_EXTENSION=off`` (or the engine's ``mask_extension=False``) forces that.

Slots (:class:`Slots`): the server hands bitmaps over through the exported C symbol
``fsrv_mask_set_files`` (ctypes), never through SQL text. A slot holds the masks of one
deletion state of one file or of a few small files read together (keyed by the files and
their deletion vectors' identities, which never change for a key); a statement pins the
slots it reads until it ends, and only unpinned slots are rewritten, least recently used
first. When every slot is pinned, the statement's files are read by the Arrow scan instead.
User SQL cannot call ``__fsrv_live_<k>``: it is not on the allow-list
(:mod:`flightsrv.sql.allowed_functions`), and the guard refuses every other name.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections import OrderedDict

import duckdb
import numpy as np

log = logging.getLogger("flightsrv.engine.maskext")

NAME = "fsrv_mask"
SLOTS = 1024
#: at most this many bytes of bitmaps held in the slots (a 10M-row file's mask is 1.25 MB)
MAX_BYTES = 256 << 20
FUNCTION_PREFIX = "__fsrv_live_"
#: the C API version the vendored headers are (DuckDB 2.0.1 loads C API v1.x extensions)
CAPI_VERSION = "v1.2.0"
FOOTER_SIZE = 512
_NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
_SOURCES = ("fsrv_mask.c", "duckdb.h", "duckdb_extension.h")
ENV = "FLIGHTSRV_MASK_EXTENSION"
#: compiler flags (part of the cache key: a change rebuilds)
CFLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-std=c99")


class Unavailable(Exception):
    """The extension cannot be built or loaded here (the reason is the message)."""


def footer(platform: str, capi_version: str = CAPI_VERSION,
           extension_version: str = "flightsrv") -> bytes:
    """The 512 bytes DuckDB's loader reads at the end of an extension file: eight 32-byte
    fields stored last-first (magic "4", platform, C API version, extension version, ABI
    type, three unused), then a 256-byte signature (empty: the file is unsigned)."""
    fields = [b"4", platform.encode(), capi_version.encode(), extension_version.encode(),
              b"C_STRUCT", b"", b"", b""]
    for f in fields:
        if len(f) > 32:
            raise ValueError(f"metadata field longer than 32 bytes: {f!r}")
    out = b"".join(f.ljust(32, b"\0") for f in reversed(fields)) + b"\0" * 256
    assert len(out) == FOOTER_SIZE
    return out


def _platform() -> str:
    con = duckdb.connect(":memory:")
    try:
        return con.execute("PRAGMA platform").fetchone()[0]
    finally:
        con.close()


def _source_key(platform: str) -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        with open(os.path.join(_NATIVE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    h.update(f"{duckdb.__version__}\0{platform}\0{SLOTS}\0{' '.join(CFLAGS)}".encode())
    return h.hexdigest()[:24]


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _private_dir(root: str) -> str:
    d = os.path.join(root, "maskext")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise Unavailable(f"cache directory is not private to this user: {d}")
    return d


def cache_root() -> str:
    return os.environ.get("FLIGHTSRV_CACHE_DIR") or \
        os.path.join(os.path.expanduser("~"), ".cache", "flightsrv")


def build(root: str | None = None) -> str:
    """The path of the built extension (building it if needed); raises :class:`Unavailable`."""
    for name in _SOURCES:
        if not os.path.exists(os.path.join(_NATIVE, name)):
            raise Unavailable(f"missing source {name}")
    platform = _platform()
    d = _private_dir(root or cache_root())
    # DuckDB requires the file's base name to be the entry point's prefix (fsrv_mask_init_c_api)
    sub = os.path.join(d, _source_key(platform))
    os.makedirs(sub, mode=0o700, exist_ok=True)
    path = os.path.join(sub, f"{NAME}.duckdb_extension")
    digest_path = path + ".sha256"
    if os.path.exists(path) and os.path.exists(digest_path):
        return path  # built before (by CI or the image build): no compiler needed now
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise Unavailable(f"no C compiler ({compiler}) on PATH")
    fd, tmp = tempfile.mkstemp(dir=sub, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        cmd = [compiler, *CFLAGS, f"-DFSRV_MASK_SLOTS={SLOTS}", "-I", _NATIVE,
               os.path.join(_NATIVE, "fsrv_mask.c"), "-o", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            raise Unavailable(f"compiler failed to run: {e}") from None
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["(no output)"]
            first = next((x for x in lines if "error" in x), lines[0])
            raise Unavailable(f"compile failed: {first}")
        with open(tmp, "ab") as f:
            f.write(footer(platform))
        digest = _digest(tmp)
        os.replace(tmp, path)
        with open(digest_path + ".tmp", "w") as f:
            f.write(digest)
        os.replace(digest_path + ".tmp", digest_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def enabled(option: bool | None = None) -> bool:
    if option is not None:
        return option
    return os.environ.get(ENV, "").lower() not in ("0", "off", "false", "no")


class Slots:
    """The process's mask slots (one extension file, shared by every database that loaded
    it): key -> slot, pins, least recently used reuse, at most ``max_bytes`` of bitmaps.
    Thread-safe."""

    def __init__(self, lib: ctypes.CDLL, count: int, max_bytes: int = MAX_BYTES):
        self._set = lib.fsrv_mask_set_files
        self._set.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p,
                              ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
        self._set.restype = ctypes.c_int
        self._lock = threading.Lock()
        self._by_key: OrderedDict = OrderedDict()  # key -> slot, least recently used first
        self._key_of: dict[int, object] = {}
        self._pins = [0] * count
        self._free = list(range(count - 1, -1, -1))
        self._bytes = [0] * count
        self._max_bytes = max_bytes
        self.held_bytes = 0

    def _evict(self, slot: int) -> None:
        del self._by_key[self._key_of.pop(slot)]
        self._set(slot, 0, None, 0, None, None)  # frees the bitmaps
        self.held_bytes -= self._bytes[slot]
        self._bytes[slot] = 0

    def acquire(self, key, bitmap) -> int | None:
        """A pinned slot holding the mask ``key`` (``bitmap()`` is called only when it is
        not loaded: (uint8 array, nbits) for one file, read by ``__fsrv_live_<k>(position)``,
        or a list of them for the files of one ``read_parquet`` list, read by
        ``__fsrv_live_<k>(file_index, position)``), or None when every slot is pinned or the
        unpinned ones do not free enough bytes for it."""
        with self._lock:
            slot = self._by_key.get(key)
            if slot is not None:
                self._by_key.move_to_end(key)
                self._pins[slot] += 1
                return slot
            masks = bitmap()
            if isinstance(masks, tuple):
                masks = [masks]
            parts = [np.ascontiguousarray(b, dtype=np.uint8) for b, _ in masks]
            nbits = np.array([int(n) for _, n in masks], dtype=np.uint64)
            offsets = np.zeros(len(parts) + 1, dtype=np.uint64)
            np.cumsum([p.nbytes for p in parts], out=offsets[1:])
            bits = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
            if bits.nbytes > self._max_bytes:
                return None
            unpinned = [s for s in self._by_key.values() if self._pins[s] == 0]  # LRU first
            if not self._free and not unpinned:
                return None
            if self.held_bytes + bits.nbytes - sum(self._bytes[s] for s in unpinned) > \
                    self._max_bytes:
                return None
            for s in unpinned:
                if self._free and self.held_bytes + bits.nbytes <= self._max_bytes:
                    break
                self._evict(s)
                self._free.append(s)
            slot = self._free.pop()
            rc = self._set(slot, len(parts), bits.ctypes.data, bits.nbytes,
                           offsets.ctypes.data, nbits.ctypes.data)
            if rc != 0:
                self._free.append(slot)
                raise MemoryError(f"mask slot {slot} could not be written ({rc})")
            self._by_key[key] = slot
            self._key_of[slot] = key
            self._bytes[slot] = bits.nbytes
            self.held_bytes += bits.nbytes
            self._pins[slot] += 1
            return slot

    def release(self, slots) -> None:
        with self._lock:
            for s in slots:
                self._pins[s] -= 1

    def drop(self, slot: int) -> None:
        """Unpin ``slot`` and, when no statement pins it any more, free it now (a mask used
        once, such as a read by position, should not push reusable masks out)."""
        with self._lock:
            self._pins[slot] -= 1
            if self._pins[slot] == 0 and slot in self._key_of:
                self._evict(slot)
                self._free.append(slot)


_state_lock = threading.Lock()
_state: dict = {}  # "path", "slots", or "error"


def _load_state() -> dict:
    with _state_lock:
        if not _state:
            try:
                path = build()
                lib = ctypes.CDLL(path)  # the same handle DuckDB's dlopen of this path gets
                count = int(lib.fsrv_mask_slots())
                _state.update(path=path, slots=Slots(lib, count), count=count)
            except (Unavailable, OSError, AttributeError) as e:
                _state["error"] = str(e)
        return _state


_logged = set()


def _log_once(msg: str) -> None:
    with _state_lock:
        if msg in _logged:
            return
        _logged.add(msg)
    log.warning("deletion-mask extension unavailable, files with deleted rows are read by "
                "the masked Arrow scan: %s", msg)


def connect(option: bool | None = None):
    """(connection, slots): a new in-memory DuckDB connection with the mask extension loaded
    (not yet locked), or (None, None) when it is disabled or unavailable (logged once)."""
    if not enabled(option):
        return None, None
    state = _load_state()
    if "error" in state:
        _log_once(state["error"])
        return None, None
    try:
        con = open_with(state["path"])
    except Unavailable as e:
        _log_once(str(e))
        return None, None
    return con, state["slots"]


def open_with(path: str):
    """A new in-memory DuckDB connection (not yet locked) with the extension file ``path``
    loaded, after checking it against its recorded digest; raises :class:`Unavailable`."""
    try:
        with open(path + ".sha256") as f:
            expected = f.read().strip()
        if _digest(path) != expected:
            raise Unavailable(f"extension file does not match its digest: {path}")
        con = duckdb.connect(":memory:", config={"allow_unsigned_extensions": "true"})
        try:
            con.execute("LOAD " + "'" + path.replace("'", "''") + "'")
        except duckdb.Error:
            con.close()
            raise
    except (OSError, duckdb.Error) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Unavailable(f"extension did not load: {first}") from None
    return con


def bitmap_of(rows: int, positions: np.ndarray | None, ranges) -> tuple[np.ndarray, int]:
    """The deleted-positions bitmap of a file of ``rows`` rows: bit p (little-endian within
    a byte) set for each deleted position and for every row of each (start, count) range."""
    dead = np.zeros(rows, dtype=bool)
    if positions is not None and len(positions):
        dead[positions] = True
    for start, count in ranges:
        dead[start:start + count] = True
    return np.packbits(dead, bitorder="little"), rows


def function(slot: int) -> str:
    return f"{FUNCTION_PREFIX}{int(slot)}"


def main() -> int:
    """``python -m flightsrv.engine.maskext``: build the extension now (CI, image builds) and
    print its path, or say why it is unavailable (exit 0 either way: the server falls back)."""
    try:
        print(build())
    except Unavailable as e:
        print(f"deletion-mask extension unavailable (the Arrow scan will be used): {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The deletion-mask extensions: flightsrv's deletion vectors applied inside DuckDB's scan.

Two kinds, the first that builds and loads is used:

- ``"scan"`` (``native/fsrv_scan.cpp``, DuckDB's C++ API): a table function ``__fsrv_scan``
  that is DuckDB's ``read_parquet`` with one more named parameter, ``fsrv_slot``; each file's
  mask becomes the deletion filter of DuckDB's Parquet reader, which drops deleted rows per
  vector before it evaluates any pushed-down filter or decodes the other columns. C++
  extensions have no stable ABI, so it is compiled against the headers of the exact DuckDB
  release installed (taken from that release's source distribution on the package index,
  checked against its published SHA-256, :func:`headers`) and linked against the loaded
  ``_duckdb`` module; it is checked by a self-test in a separate process before it is used.
- ``"filter"`` (``native/fsrv_mask.c``, DuckDB's stable C extension API), described below: a
  scalar function DuckDB evaluates on ``file_row_number``.

``FLIGHTSRV_MASK_EXTENSION`` (or the engine's ``mask_extension``): ``scan`` or ``filter``
forces one kind, ``off`` neither (the masked Arrow scan), unset or ``auto`` the first of the
two that is available. Both kinds share the slot interface below (``fsrv_mask_set_files``).

The ``"filter"`` kind:

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

import contextlib
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

from flightsrv.runtime import DEFAULT_RUNTIME, Clock

log = logging.getLogger("flightsrv.engine.maskext")

NAME = "fsrv_mask"
#: the C++ kind's file name (DuckDB calls its entry point ``fsrv_scan_duckdb_cpp_init``)
SCAN_NAME = "fsrv_scan"
#: the table function of the C++ kind
SCAN_FUNCTION = "__fsrv_scan"
KINDS = ("scan", "filter")
SLOTS = 1024
#: at most this many bytes of bitmaps held in the slots (a 10M-row file's mask is 1.25 MB)
MAX_BYTES = 256 << 20
FUNCTION_PREFIX = "__fsrv_live_"
#: the C API version the vendored headers are (DuckDB 2.0.1 loads C API v1.x extensions)
CAPI_VERSION = "v1.2.0"
FOOTER_SIZE = 512
_NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
_SOURCES = ("fsrv_mask.c", "fsrv_slots.h", "duckdb.h", "duckdb_extension.h")
ENV = "FLIGHTSRV_MASK_EXTENSION"
#: compiler flags (part of the cache key: a change rebuilds)
CFLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-std=c99")
#: the C++ kind's flags: DuckDB's release builds define NDEBUG (its header assertions are off)
CXXFLAGS = ("-std=c++17", "-O2", "-DNDEBUG", "-shared", "-fPIC", "-fvisibility=hidden")
#: where the headers of an installed DuckDB release come from when
#: ``FLIGHTSRV_DUCKDB_INCLUDE`` names no directory holding them: its source distribution on
#: the package index (``PIP_INDEX_URL`` or PyPI), checked against the SHA-256 below for the
#: release constraints.txt pins (else against the index's own published digest)
INCLUDE_ENV = "FLIGHTSRV_DUCKDB_INCLUDE"
SDIST_SHA256 = {
    "2.0.1": "5b3f493140e35b75298ee0fc606d98e3065e8601e64fe81b09326de7a6fd68e0",
}
_INCLUDE_MEMBER = "external/duckdb/src/include/"
#: after a failed download of the headers, no new attempt for this long (a later
#: ``python -m flightsrv.engine.maskext`` retries at once)
FETCH_RETRY_SECONDS = 6 * 3600


class Unavailable(Exception):
    """The extension cannot be built or loaded here (the reason is the message)."""


class FetchFailed(Unavailable):
    """DuckDB's headers could not be fetched (the network or the index): not retried at once."""


def footer(platform: str, capi_version: str = CAPI_VERSION,
           extension_version: str = "flightsrv", abi: str = "C_STRUCT") -> bytes:
    """The 512 bytes DuckDB's loader reads at the end of an extension file: eight 32-byte
    fields stored last-first (magic "4", platform, C API version, extension version, ABI
    type, three unused), then a 256-byte signature (empty: the file is unsigned). For
    ``abi="CPP"`` the version field is the DuckDB release the file was built for (DuckDB loads
    a C++ extension only into that release)."""
    fields = [b"4", platform.encode(), capi_version.encode(), extension_version.encode(),
              abi.encode(), b"", b"", b""]
    for f in fields:
        if len(f) > 32:
            raise ValueError(f"metadata field longer than 32 bytes: {f!r}")
    out = b"".join(f.ljust(32, b"\0") for f in reversed(fields)) + b"\0" * 256
    assert len(out) == FOOTER_SIZE
    return out


def _ask(sql: str) -> str:
    con = duckdb.connect(":memory:")
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def _platform() -> str:
    return _ask("PRAGMA platform")


def _release() -> str:
    """The DuckDB release a C++ extension must name (``v2.0.1``): what its loader compares."""
    return _ask("SELECT library_version FROM pragma_version()")


def _duckdb_module() -> str:
    """The loaded ``_duckdb`` module, which the C++ kind links against (its C++ symbols)."""
    import _duckdb

    return os.path.realpath(_duckdb.__file__)


def _sources(kind: str) -> tuple[str, ...]:
    return ("fsrv_scan.cpp", "fsrv_slots.h") if kind == "scan" else _SOURCES


def _source_key(platform: str, kind: str = "filter") -> str:
    h = hashlib.sha256()
    for name in _sources(kind):
        with open(os.path.join(_NATIVE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    h.update(f"{duckdb.__version__}\0{platform}\0{SLOTS}\0{' '.join(CFLAGS)}".encode())
    if kind == "scan":
        module = _duckdb_module()
        h.update(f"\0{module}\0{os.stat(module).st_size}\0{' '.join(CXXFLAGS)}".encode())
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


def _index_get(url: str, accept: str | None = None, timeout: float = 20):
    import ssl
    import urllib.request

    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    context = ssl.create_default_context(cafile=cafile if cafile and os.path.exists(cafile)
                                         else None)
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.urlopen(req, timeout=timeout, context=context)


def _sdist(version: str) -> tuple[str, str]:
    """(URL, SHA-256) of DuckDB ``version``'s source distribution on the package index."""
    import json
    import re
    import urllib.parse

    index = (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")
    page = f"{index}/duckdb/"
    name = f"duckdb-{version}.tar.gz"
    with _index_get(page, "application/vnd.pypi.simple.v1+json, text/html;q=0.5") as r:
        kind = r.headers.get("Content-Type", "")
        body = r.read().decode("utf-8", "replace")
    if "json" in kind:
        for f in json.loads(body).get("files", []):
            if f.get("filename") == name:
                return urllib.parse.urljoin(page, f["url"]), f.get("hashes", {}).get("sha256", "")
    else:
        for href in re.findall(r'href="([^"]+)"', body):
            if href.split("#")[0].rsplit("/", 1)[-1] == name:
                digest = href.split("#sha256=", 1)[1] if "#sha256=" in href else ""
                return urllib.parse.urljoin(page, href.split("#")[0]), digest
    raise Unavailable(f"the package index has no {name} (for DuckDB's C++ headers)")


def headers(root: str | None = None, clock: Clock = DEFAULT_RUNTIME.clock) -> str:
    """A directory holding the C++ headers of the installed DuckDB release (``duckdb.hpp``):
    ``$FLIGHTSRV_DUCKDB_INCLUDE``, or the release's source distribution unpacked (only its
    ``src/include``) in the private cache, downloaded once from the package index and checked
    against :data:`SDIST_SHA256` (or the index's digest for another release). Raises
    :class:`Unavailable`."""
    given = os.environ.get(INCLUDE_ENV)
    if given:
        if not os.path.isfile(os.path.join(given, "duckdb.hpp")):
            raise Unavailable(f"{INCLUDE_ENV} holds no duckdb.hpp: {given}")
        return given
    version = duckdb.__version__
    d = os.path.join(_private_dir(root or cache_root()), f"duckdb-{version}-include")
    if os.path.exists(os.path.join(d, ".complete")):
        return os.path.join(d, "include")
    # a failed fetch is not retried for a while: an offline server must not wait on the
    # network at every start
    failed = d + ".failed"
    try:
        if clock.now_ms() / 1000 - os.stat(failed).st_mtime < FETCH_RETRY_SECONDS:
            with open(failed) as f:
                raise Unavailable(f.read().strip() + f" (not retried before {failed} is "
                                  f"{FETCH_RETRY_SECONDS // 3600} h old)")
    except FileNotFoundError:
        pass
    try:
        with _locked(d + ".lock"):  # one download at a time (pytest's workers)
            if os.path.exists(os.path.join(d, ".complete")):
                return os.path.join(d, "include")
            return _fetch_headers(version, d)
    except Unavailable as e:
        if isinstance(e, FetchFailed):
            with open(failed, "w") as f:
                f.write(str(e))
        raise


def _fetch_headers(version: str, d: str) -> str:
    import tarfile

    try:
        url, published = _sdist(version)
    except (OSError, ValueError) as e:
        raise FetchFailed(f"DuckDB's headers could not be fetched from the package index: {e}"
                          ) from None
    expected = SDIST_SHA256.get(version) or published
    if not expected:
        raise Unavailable(f"no SHA-256 to check DuckDB {version}'s source distribution against")
    tmp = tempfile.mkdtemp(dir=os.path.dirname(d), prefix=".headers-")
    try:
        archive = os.path.join(tmp, "sdist.tar.gz")
        h = hashlib.sha256()
        try:
            with _index_get(url, timeout=120) as r, open(archive, "wb") as out:
                for block in iter(lambda: r.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
        except OSError as e:
            raise FetchFailed(f"DuckDB's source distribution could not be downloaded: {e}"
                              ) from None
        if h.hexdigest() != expected:
            raise Unavailable(f"DuckDB {version}'s source distribution does not match its "
                              f"SHA-256 ({h.hexdigest()} != {expected})")
        dest = os.path.join(tmp, "include")
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar:
                top, _, rest = m.name.partition("/")
                if not rest.startswith(_INCLUDE_MEMBER) or not m.isfile():
                    continue
                rel = rest[len(_INCLUDE_MEMBER):]
                parts = rel.split("/")
                if not rel or rel.startswith("/") or ".." in parts:
                    continue
                target = os.path.join(dest, *parts)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                src = tar.extractfile(m)
                with open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
        os.unlink(archive)
        if not os.path.isfile(os.path.join(dest, "duckdb.hpp")):
            raise Unavailable(f"DuckDB {version}'s source distribution holds no C++ headers")
        open(os.path.join(tmp, ".complete"), "w").close()
        try:
            os.rename(tmp, d)
        except OSError:  # another process got there first
            if not os.path.exists(os.path.join(d, ".complete")):
                raise
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(d + ".failed"):
        os.unlink(d + ".failed")
    return os.path.join(d, "include")


def _compile(kind: str, out: str, root: str | None) -> None:
    if kind == "scan":
        compiler = os.environ.get("CXX") or "c++"
        if shutil.which(compiler) is None:
            raise Unavailable(f"no C++ compiler ({compiler}) on PATH")
        include = headers(root)
        cmd = [compiler, *CXXFLAGS, f"-DFSRV_MASK_SLOTS={SLOTS}", "-I", _NATIVE, "-I", include,
               os.path.join(_NATIVE, "fsrv_scan.cpp"), "-o", out, _duckdb_module()]
    else:
        compiler = os.environ.get("CC") or "cc"
        if shutil.which(compiler) is None:
            raise Unavailable(f"no C compiler ({compiler}) on PATH")
        cmd = [compiler, *CFLAGS, f"-DFSRV_MASK_SLOTS={SLOTS}", "-I", _NATIVE,
               os.path.join(_NATIVE, "fsrv_mask.c"), "-o", out]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"compiler failed to run: {e}") from None
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        first = next((x for x in lines if "error" in x), lines[0])
        raise Unavailable(f"compile failed: {first}")


def build(root: str | None = None, kind: str = "filter") -> str:
    """The path of the built extension of ``kind`` (building it if needed; the ``"scan"``
    kind must also pass :func:`self_test` in a separate process first); raises
    :class:`Unavailable`."""
    if kind not in KINDS:
        raise ValueError(f"unknown mask extension kind {kind!r}")
    for name in _sources(kind):
        if not os.path.exists(os.path.join(_NATIVE, name)):
            raise Unavailable(f"missing source {name}")
    platform = _platform()
    d = _private_dir(root or cache_root())
    # DuckDB requires the file's base name to be the entry point's prefix
    # (fsrv_mask_init_c_api, fsrv_scan_duckdb_cpp_init)
    sub = os.path.join(d, _source_key(platform, kind))
    os.makedirs(sub, mode=0o700, exist_ok=True)
    path = os.path.join(sub, f"{SCAN_NAME if kind == 'scan' else NAME}.duckdb_extension")
    digest_path = path + ".sha256"
    if os.path.exists(path) and os.path.exists(digest_path):
        return path  # built before (by CI or the image build): no compiler needed now
    with _locked(os.path.join(sub, ".lock")):  # one build at a time (pytest's workers)
        if os.path.exists(path) and os.path.exists(digest_path):
            return path
        _build_into(kind, root, platform, sub, path, digest_path)
    return path


@contextlib.contextmanager
def _locked(lock_path: str):
    import fcntl

    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _build_into(kind: str, root: str | None, platform: str, sub: str, path: str,
                digest_path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=sub, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        _compile(kind, tmp, root)
        with open(tmp, "ab") as f:
            f.write(footer(platform, _release(), abi="CPP") if kind == "scan"
                    else footer(platform))
        if kind == "scan":
            # the file must carry the base name DuckDB derives its entry point from
            trial = os.path.join(sub, f".trial-{os.getpid()}", f"{SCAN_NAME}.duckdb_extension")
            os.makedirs(os.path.dirname(trial), mode=0o700, exist_ok=True)
            try:
                shutil.copyfile(tmp, trial)
                _self_test_in_subprocess(trial)
            finally:
                shutil.rmtree(os.path.dirname(trial), ignore_errors=True)
        digest = _digest(tmp)
        os.replace(tmp, path)
        with open(digest_path + ".tmp", "w") as f:
            f.write(digest)
        os.replace(digest_path + ".tmp", digest_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _self_test_in_subprocess(path: str) -> None:
    import sys

    code = "import sys; from flightsrv.engine.maskext import self_test; self_test(sys.argv[1])"
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True,
                              text=True, timeout=300, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"self-test failed to run: {e}") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or \
            [f"exit status {proc.returncode}"]
        raise Unavailable(f"self-test failed: {lines[-1]}")


def self_test(path: str) -> None:
    """Load the ``"scan"`` extension at ``path`` into a fresh DuckDB and check it reads what
    the masks say: two files of small row groups, masks with single rows, whole words and a
    whole row group deleted; count, sums, virtual columns, a pushed filter, a file without
    deletes, the mask functions, and the refusals (no slot, a file the slot has no mask for). Raises
    AssertionError (or DuckDB's error) on any difference. Run in a separate process by
    :func:`build`: a C++ extension that does not match the loaded DuckDB may crash it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        n = 10_000
        paths, masks = [], []
        rng = np.random.default_rng(33)
        for i in range(3):
            ids = np.arange(i * n, (i + 1) * n, dtype=np.int64)
            p = os.path.join(tmp, f"f{i}.parquet")
            pq.write_table(pa.table({"id": ids, "v": ids * 3}), p, row_group_size=1500)
            dead = np.zeros(n, dtype=bool)
            if i == 0:
                dead[rng.choice(n, 700, replace=False)] = True
                dead[1500:3000] = True  # a whole row group
                dead[4096:4096 + 128] = True  # whole bitmap words
            elif i == 2:
                dead[::2] = True
            # i == 1: no deleted row, an empty mask
            paths.append(p)
            masks.append((dead, ids))
        lib = ctypes.CDLL(path)
        slots = Slots(lib, int(lib.fsrv_mask_slots()), kind="scan")
        slot = slots.acquire(("self-test",), lambda: [
            bitmap_of(n, np.flatnonzero(dead), []) if dead.any() else (np.zeros(0, np.uint8), 0)
            for dead, _ in masks])
        con = duckdb.connect(":memory:", config={"allow_unsigned_extensions": "true"})
        con.execute("LOAD '" + path.replace("'", "''") + "'")
        files = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
        call = f"{SCAN_FUNCTION}({files}, fsrv_slot := {slot})"
        live_ids = np.concatenate([ids[~dead] for dead, ids in masks])
        got = con.execute(f"SELECT count(*), sum(id), sum(v) FROM {call}").fetchone()
        assert got == (len(live_ids), int(live_ids.sum()), int(live_ids.sum() * 3)), got
        got = con.execute(f"SELECT count(*) FROM {call}").fetchone()[0]
        assert got == len(live_ids), got
        rows = con.execute(f"SELECT id, file_index, file_row_number FROM {call} "
                           "ORDER BY id").fetchall()
        want = [(int(x), int(x) // n, int(x) % n) for x in live_ids]
        assert rows == want, "virtual columns differ"
        got = con.execute(f"SELECT count(*) FROM {call} WHERE id BETWEEN 1000 AND 25000"
                          ).fetchone()[0]
        assert got == int(((live_ids >= 1000) & (live_ids <= 25000)).sum()), got
        # the mask functions over the same slot (a point read's form)
        got = con.execute(f"SELECT count(*), sum(id) FROM read_parquet({files}) WHERE "
                          f"{function(slot)}(file_index, file_row_number)").fetchone()
        assert got == (len(live_ids), int(live_ids.sum())), got
        for bad in (f"{SCAN_FUNCTION}({files})", f"{SCAN_FUNCTION}({files}, fsrv_slot := "
                    f"{(slot + 1) % SLOTS})"):
            try:
                con.execute(f"SELECT count(*) FROM {bad}").fetchone()
            except duckdb.Error:
                continue
            raise AssertionError(f"read without a mask: {bad}")
        con.close()
        slots.drop(slot)


def kinds(option: bool | str | None = None) -> tuple[str, ...]:
    """The extension kinds to try, in order, for the engine option ``option`` (True or None:
    as ``FLIGHTSRV_MASK_EXTENSION`` says, by default both; False: none; a kind: that one)."""
    if option is False:
        return ()
    if isinstance(option, str):
        choice = option.lower()
    else:
        choice = os.environ.get(ENV, "").lower()
    if choice in ("0", "off", "false", "no"):
        return () if option is None or isinstance(option, str) else KINDS
    if choice in KINDS:
        return (choice,)
    return KINDS


def enabled(option: bool | str | None = None) -> bool:
    return bool(kinds(option))


class Slots:
    """The process's mask slots (one extension file, shared by every database that loaded
    it): key -> slot, pins, least recently used reuse, at most ``max_bytes`` of bitmaps.
    Thread-safe."""

    def __init__(self, lib: ctypes.CDLL, count: int, max_bytes: int = MAX_BYTES,
                 kind: str = "filter"):
        #: which extension holds the slots: "scan" (the mask is the Parquet reader's deletion
        #: filter, read through :data:`SCAN_FUNCTION`) or "filter" (the mask functions)
        self.kind = kind
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
_states: dict[str, dict] = {}  # kind -> "path", "slots", or "error"


def _load_state(kind: str) -> dict:
    with _state_lock:
        state = _states.setdefault(kind, {})
        if not state:
            try:
                path = build(kind=kind)
                lib = ctypes.CDLL(path)  # the same handle DuckDB's dlopen of this path gets
                count = int(lib.fsrv_mask_slots())
                state.update(path=path, slots=Slots(lib, count, kind=kind), count=count)
            except (Unavailable, OSError, AttributeError) as e:
                state["error"] = str(e)
        return state


_logged = set()


def _log_once(msg: str, fallback: str = "the masked Arrow scan") -> None:
    with _state_lock:
        if msg in _logged:
            return
        _logged.add(msg)
    log.warning("deletion-mask extension unavailable, files with deleted rows are read by "
                "%s: %s", fallback, msg)


def connect(option: bool | str | None = None):
    """(connection, slots): a new in-memory DuckDB connection with the first mask extension
    of :func:`kinds` that builds and loads (not yet locked), or (None, None) when none is
    enabled or available (each reason logged once)."""
    tried = kinds(option)
    for i, kind in enumerate(tried):
        state = _load_state(kind)
        error = state.get("error")
        if error is None:
            try:
                return open_with(state["path"]), state["slots"]
            except Unavailable as e:
                error = str(e)
        fallback = f"the {tried[i + 1]!r} mask extension" if i + 1 < len(tried) \
            else "the masked Arrow scan"
        _log_once(f"{kind!r} kind: {error}", fallback)
    return None, None


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


class Mask:
    """A pinned slot as the SQL that reads through it. With the ``"scan"`` kind
    (``in_scan``) :meth:`read` reads the files with the mask applied by the Parquet reader
    (``in_reader=False`` asks for a plain ``read_parquet`` instead, the mask then applied by
    :attr:`function`, which that kind registers too); with the ``"filter"`` kind the files are
    read by ``read_parquet`` and :attr:`function` is the mask function to evaluate on
    ``file_row_number`` (and ``file_index``)."""

    __slots__ = ("slot", "in_scan")

    def __init__(self, slot: int, in_scan: bool):
        self.slot = int(slot)
        self.in_scan = bool(in_scan)

    @property
    def function(self) -> str:
        return function(self.slot)

    def read(self, paths: list[str], options: str, in_reader: bool = True) -> str:
        """The table function call reading ``paths`` (SQL string literals) with ``options``
        (read_parquet's named parameters): ``__fsrv_scan`` with this slot's masks when the
        ``"scan"`` kind holds it and ``in_reader``, else ``read_parquet`` (the caller applies
        :attr:`function`)."""
        files = f"[{', '.join(paths)}], {options}"
        if self.in_scan and in_reader:
            return f"{SCAN_FUNCTION}({files}, fsrv_slot := {self.slot})"
        return f"read_parquet({files})"

    def __repr__(self) -> str:
        return f"Mask({self.slot}, in_scan={self.in_scan})"


def main() -> int:
    """``python -m flightsrv.engine.maskext``: build both extension kinds now (CI, image
    builds) and print their paths, or say why one is unavailable (exit 0 either way: the
    server falls back to the next kind, then to the Arrow scan)."""
    try:  # asked for explicitly: an earlier failed download of the headers is retried now
        marker = os.path.join(_private_dir(cache_root()), f"duckdb-{duckdb.__version__}-include")
        if os.path.exists(marker + ".failed"):
            os.unlink(marker + ".failed")
    except (Unavailable, OSError):
        pass
    for kind in KINDS:
        try:
            print(f"{kind}: {build(kind=kind)}")
        except Unavailable as e:
            print(f"{kind}: deletion-mask extension unavailable (the server falls back): {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

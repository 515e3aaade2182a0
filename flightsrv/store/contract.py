"""The conditional-write contract flightsrv's commits rely on, as checks a user runs against
their store (``flightsrv store check``).

Every check writes only under one scratch prefix, ``_flightsrv_storecheck/<token>/``, and
``run_contract`` deletes what it wrote (and aborts its multipart uploads) before it returns.
Each check gives a verdict and, when it fails, the guarantee that is missing. All of them are
required: a store that fails any one cannot carry flightsrv's commits safely.

- ``if-none-match``: ``PutObject If-None-Match: *`` creates a new key and answers 412 on an
  existing one (table creation, version files).
- ``if-match``: ``PutObject If-Match`` succeeds with the current ETag and answers 412 with a
  stale one, and fails (412 or 404) on a missing key (the commit pointer's CAS).
- ``ranged-get``: a ranged GET returns exactly those bytes; with a stale ``If-Match`` it
  answers 412 (reads pinned to one object version).
- ``multipart-copy``: a multipart upload built with ``UploadPartCopy`` + ``CopySourceRange``
  holds the right bytes (deletes splice row groups out of a file this way).
- ``multipart-if-none-match``: ``CompleteMultipartUpload If-None-Match: *`` answers 412 on an
  existing key (large files are created, never overwritten).
- ``list-paging``: ListObjectsV2 returns every key across pages (vacuum, listing tables).
- ``cas-race``: threads increment one counter with ``If-Match`` read-modify-write; every
  increment that the store acknowledged must be in the final value (no lost updates).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Callable

from flightsrv.errors import FlightsrvError, ObjectNotFound, PreconditionFailed
from flightsrv.store.base import ObjectStore, PutMode

SCRATCH_PREFIX = "_flightsrv_storecheck/"
PART = 5 * 1024 * 1024  # S3's minimum size of a non-last part

GUARANTEES = {
    "if-none-match": "conditional create (PutObject If-None-Match: *)",
    "if-match": "compare-and-swap (PutObject If-Match)",
    "ranged-get": "ranged and conditional ranged GET (Range + If-Match)",
    "multipart-copy": "multipart upload with UploadPartCopy + CopySourceRange",
    "multipart-if-none-match": "conditional multipart create "
                               "(CompleteMultipartUpload If-None-Match: *)",
    "list-paging": "ListObjectsV2 paging",
    "cas-race": "atomic If-Match under concurrent writers (no lost updates)",
}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    guarantee: str = ""
    figures: dict = field(default_factory=dict)


@dataclass
class Report:
    store: str
    checks: list[Check]

    @property
    def safe(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def missing(self) -> list[str]:
        return [c.guarantee for c in self.checks if not c.ok]

    def as_dict(self) -> dict:
        return {"store": self.store, "safe": self.safe, "missing": self.missing,
                "checks": [asdict(c) for c in self.checks]}


class _Failed(Exception):
    """One step of a check broke the contract."""


def _expect_412(what: str, fn) -> None:
    try:
        fn()
    except PreconditionFailed:
        return
    raise _Failed(f"{what} was accepted (expected 412 Precondition Failed)")


def _check_if_none_match(store, base):
    key = base + "create"
    store.put(key, b"first", mode=PutMode.CREATE)
    _expect_412("a second If-None-Match: * PUT of an existing key",
                lambda: store.put(key, b"second", mode=PutMode.CREATE))
    body, _ = store.get(key)
    if body != b"first":
        raise _Failed(f"the existing key was overwritten (holds {body[:20]!r})")
    return "new key created; existing key refused with 412", {}


def _check_if_match(store, base):
    key = base + "cas"
    first = store.put(key, b"v1", mode=PutMode.CREATE)
    second = store.put(key, b"v2", mode=PutMode.IF_MATCH, etag=first.etag)
    _expect_412("an If-Match PUT with a stale ETag",
                lambda: store.put(key, b"v3", mode=PutMode.IF_MATCH, etag=first.etag))
    body, meta = store.get(key)
    if body != b"v2" or meta.etag != second.etag:
        raise _Failed(f"a stale If-Match write changed the object (holds {body[:20]!r})")
    try:
        store.put(base + "cas-missing", b"x", mode=PutMode.IF_MATCH, etag=first.etag)
    except (PreconditionFailed, ObjectNotFound):
        pass
    else:
        raise _Failed("an If-Match PUT of a missing key was accepted (expected 412 or 404)")
    return "current ETag accepted; stale ETag and missing key refused", {}


def _check_ranged_get(store, base):
    key = base + "range"
    data = bytes(range(256)) * 16
    first = store.put(key, data, mode=PutMode.CREATE)
    got = store.get_range(key, 100, 1100)
    if got != data[100:1100]:
        raise _Failed(f"a ranged GET of bytes 100-1099 returned {len(got)} wrong bytes")
    got = store.get_range(key, 5, 50, etag=first.etag)
    if got != data[5:50]:
        raise _Failed("a ranged GET with the current If-Match returned wrong bytes")
    store.put(key, data[::-1], mode=PutMode.IF_MATCH, etag=first.etag)
    _expect_412("a ranged GET with a stale If-Match",
                lambda: store.get_range(key, 0, 10, etag=first.etag))
    return "bytes exact; stale If-Match refused with 412", {}


def _multipart_copy(store, base, source, size):
    key = base + "spliced"
    upload = store.create_multipart(key)
    try:
        parts = [store.upload_part_copy(key, upload, 1, source, 0, PART),
                 store.upload_part_copy(key, upload, 2, source, PART + 7, size)]
        store.complete_multipart(key, upload, parts, mode=PutMode.CREATE)
    except BaseException:
        with contextlib.suppress(Exception):
            store.abort_multipart(key, upload)
        raise
    return key


def _source(store, base):
    size = PART + 4096
    data = (bytes(range(251)) * (size // 251 + 1))[:size]
    key = base + "source"
    store.put(key, data, mode=PutMode.CREATE)
    return key, data


def _check_multipart_copy(store, base):
    source, data = _source(store, base)
    key = _multipart_copy(store, base, source, len(data))
    body, _ = store.get(key)
    want = data[:PART] + data[PART + 7:]
    if body != want:
        raise _Failed(f"the copied object holds {len(body)} bytes, {len(want)} expected, "
                      "or wrong bytes")
    return f"{len(want)} bytes from two ranged part copies, exact", {}


def _check_multipart_if_none_match(store, base):
    key = base + "spliced"
    try:
        store.head(key)
    except ObjectNotFound:
        store.put(key, b"existing", mode=PutMode.CREATE)
    before, _ = store.get(key)
    upload = store.create_multipart(key)
    try:
        part = store.upload_part(key, upload, 1, b"replacement")
        _expect_412("CompleteMultipartUpload with If-None-Match: * on an existing key",
                    lambda: store.complete_multipart(key, upload, [part], mode=PutMode.CREATE))
    finally:
        with contextlib.suppress(Exception):
            store.abort_multipart(key, upload)
    after, _ = store.get(key)
    if after != before:
        raise _Failed("the existing key was overwritten by the multipart upload")
    return "existing key refused with 412", {}


def _check_list_paging(store, base):
    prefix = base + "list/"
    names = [f"{prefix}k{i:02d}" for i in range(7)]
    for n in names:
        store.put(n, b"", mode=PutMode.CREATE)
    pages = None
    client = getattr(store, "client", None)
    if client is not None and hasattr(store, "bucket"):
        full = store._k(prefix)
        got, token, pages = [], None, 0
        while True:
            kw = {"Bucket": store.bucket, "Prefix": full, "MaxKeys": 3}
            if token:
                kw["ContinuationToken"] = token
            r = store._call("LIST", prefix, client.list_objects_v2, **kw)
            pages += 1
            got += [store._unk(o["Key"]) for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                break
            token = r.get("NextContinuationToken")
            if not token or pages > 10:
                raise _Failed("a truncated page carried no continuation token"
                              if not token else "paging did not end")
    else:
        got = [m.key for m in store.list(prefix)]
    if sorted(got) != names:
        raise _Failed(f"listed {len(got)} keys of {len(names)}, or wrong ones")
    return (f"{len(names)} keys over {pages} pages of 3" if pages else
            f"{len(names)} keys"), {"pages": pages}


def _check_cas_race(store, base, threads: int, increments: int):
    key = base + "counter"
    store.put(key, b"0", mode=PutMode.CREATE)
    acknowledged = [0] * threads
    conflicts = [0] * threads
    errors: list[str] = []
    max_tries = 200 * threads  # bounded: a store that never lets a writer through fails

    def worker(t: int) -> None:
        try:
            for i in range(increments):
                for _ in range(max_tries):
                    body, meta = store.get(key)
                    n = int(body.split(b" ")[0])
                    try:  # the thread and step make every write's bytes (and ETag) unique
                        store.put(key, f"{n + 1} {t} {i}".encode(), mode=PutMode.IF_MATCH,
                                  etag=meta.etag)
                    except PreconditionFailed:
                        conflicts[t] += 1
                        continue
                    acknowledged[t] += 1
                    break
                else:
                    raise _Failed(f"thread {t} never won a CAS in {max_tries} tries")
        except Exception as exc:  # noqa: BLE001 - reported as the check's result
            errors.append(str(exc))

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    if errors:
        raise _Failed(errors[0])
    body, _ = store.get(key)
    final = int(body.split(b" ")[0])
    total = sum(acknowledged)
    figures = {"threads": threads, "increments": total, "final": final,
               "lost_updates": total - final, "conflicts": sum(conflicts)}
    if final != total:
        raise _Failed(f"{total - final} lost updates: {total} acknowledged increments, "
                      f"counter is {final}", figures)
    return (f"{threads} threads x {increments} increments: 0 lost updates, "
            f"{sum(conflicts)} conflicts retried"), figures


def run_contract(store: ObjectStore, token: str, *, threads: int = 8, increments: int = 25,
                 on_check: Callable[[int, int, Check], None] | None = None,
                 on_start: Callable[[int, int, str], None] | None = None) -> Report:
    """Run every check under ``_flightsrv_storecheck/<token>/`` and clean up after them."""
    base = f"{SCRATCH_PREFIX}{token}/"
    steps = [
        ("if-none-match", _check_if_none_match),
        ("if-match", _check_if_match),
        ("ranged-get", _check_ranged_get),
        ("multipart-copy", _check_multipart_copy),
        ("multipart-if-none-match", _check_multipart_if_none_match),
        ("list-paging", _check_list_paging),
        ("cas-race", lambda s, b: _check_cas_race(s, b, threads, increments)),
    ]
    checks: list[Check] = []
    try:
        for i, (name, fn) in enumerate(steps, 1):
            if on_start:
                on_start(i, len(steps), name)
            figures: dict = {}
            try:
                detail, figures = fn(store, base)
                ok = True
            except _Failed as exc:
                ok = False
                detail = exc.args[0]
                if len(exc.args) > 1:
                    figures = exc.args[1]
            except FlightsrvError as exc:
                if i == 1:  # the first plain PUT failed: configuration (credentials, bucket,
                    raise   # endpoint), not a missing guarantee; one error line, exit 1
                ok, detail = False, f"the store answered an error: {exc}"
            check = Check(name, ok, detail, GUARANTEES[name], figures)
            checks.append(check)
            if on_check:
                on_check(i, len(steps), check)
    finally:
        cleanup(store, base)
    return Report(store.uri, checks)


def cleanup(store: ObjectStore, base: str) -> None:
    """Delete every object and abort every multipart upload under ``base``."""
    with contextlib.suppress(Exception):
        for upload in list(store.list_multipart(base)):
            with contextlib.suppress(Exception):
                store.abort_multipart(upload.key, upload.upload_id)
    with contextlib.suppress(Exception):
        for meta in list(store.list(base)):
            with contextlib.suppress(Exception):
                store.delete(meta.key)

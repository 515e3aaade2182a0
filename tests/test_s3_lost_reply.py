"""A CREATE whose object landed on S3 but whose reply was lost (the store answered 500
after storing it, or the connection dropped): the S3 client retries the PUT, and the retry
meets the object it wrote (412). The store must report the write as done when the object
holds exactly the bytes (for a multipart upload, the parts) it was writing, and refuse as
before when it holds anything else: an INSERT must not fail because a reply was lost, and
no write may pass over another writer's object (docs/S3.md, retries). Through HTTP to
moto, with a forwarder that loses chosen replies."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.errors import PreconditionFailed
from flightsrv.store import PutMode, open_store
from support import HttpForwarder
from tests.conftest import BUCKET

pytestmark = pytest.mark.s3

_ERROR = (500, [("Content-Type", "application/xml")],
          b"<Error><Code>InternalError</Code><Message>We encountered an internal error. "
          b"Please try again.</Message></Error>")


class _LoseReplies(HttpForwarder):
    """Forwards everything; the reply to the next ``lose`` request whose method and path
    match (``method``, a substring of the path) is replaced by a 500 once the store acted."""

    def __init__(self, upstream: str):
        super().__init__(upstream)
        self.rules: list[list] = []  # [method, fragment, how many left]
        self.lost: list[tuple[str, str, int]] = []  # (method, path, upstream status)

    def lose(self, method: str, fragment: str, times: int = 1) -> None:
        self.rules.append([method, fragment, times])

    def returned(self, method, path, reply):
        for rule in self.rules:
            if rule[2] > 0 and method == rule[0] and rule[1] in path:
                rule[2] -= 1
                self.lost.append((method, path, reply[0]))
                return _ERROR
        return reply


@pytest.fixture
def proxied(s3_server, monkeypatch, request):
    with _LoseReplies(s3_server.endpoint) as fwd:
        monkeypatch.setenv("AWS_ENDPOINT_URL", fwd.endpoint)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
        yield fwd, f"s3://{BUCKET}/lost-{request.node.name[-24:].strip('[]')}"


def test_a_create_whose_reply_was_lost_is_done(proxied):
    fwd, uri = proxied
    store = open_store(uri)
    fwd.lose("PUT", "/k")
    meta = store.put("k", b"one", mode=PutMode.CREATE)
    assert fwd.lost == [("PUT", fwd.lost[0][1], 200)]  # the first PUT landed, its reply lost
    body, got = store.get("k")
    assert body == b"one" and meta.etag == got.etag and meta.size == 3


def test_a_lost_reply_never_passes_over_another_object(proxied):
    fwd, uri = proxied
    store = open_store(uri)
    store.put("k", b"one", mode=PutMode.CREATE)
    fwd.lose("PUT", "/k")  # the 412 itself is lost, the retry meets "one" again
    with pytest.raises(PreconditionFailed):
        store.put("k", b"two", mode=PutMode.CREATE)
    assert [s for _, _, s in fwd.lost] == [412]
    assert store.get("k")[0] == b"one"
    # a plain 412 (no retry) stays a 412 even when the bytes are the same: only the
    # client's own retry tells that the object may be this write's
    with pytest.raises(PreconditionFailed):
        store.put("k", b"one", mode=PutMode.CREATE)


def test_a_multipart_create_whose_reply_was_lost_is_done(proxied):
    fwd, uri = proxied
    store = open_store(uri)
    upload = store.create_multipart("big")
    parts = [store.upload_part("big", upload, 1, b"a" * (5 * 1024 * 1024)),
             store.upload_part("big", upload, 2, b"b" * 1000)]
    fwd.lose("POST", "uploadId=")
    meta = store.complete_multipart("big", upload, parts, mode=PutMode.CREATE)
    assert len(fwd.lost) == 1 and fwd.lost[0][2] == 200
    assert meta.size == 5 * 1024 * 1024 + 1000 and meta.etag == store.head("big").etag
    # another upload's object under that key is not this one's
    other = store.create_multipart("big")
    p = [store.upload_part("big", other, 1, b"c" * 10)]
    fwd.lose("POST", "uploadId=")
    with pytest.raises(PreconditionFailed):
        store.complete_multipart("big", other, p, mode=PutMode.CREATE)
    store.abort_multipart("big", other)
    assert store.get("big")[0][:1] == b"a"


def test_an_append_whose_data_file_reply_was_lost_commits_once(proxied):
    fwd, uri = proxied
    wh = Warehouse.open(uri)
    t = wh.create_table("t", pa.schema([("k", pa.int64())]))
    fwd.lose("PUT", "/data/")
    t.append(pa.table({"k": pa.array(range(5), pa.int64())}))
    assert len(fwd.lost) == 1 and fwd.lost[0][2] == 200
    fwd.lose("PUT", "/manifest/")  # a small table's deletion vector is in the manifest
    assert t.delete("k = 3") == 1
    assert [p.split("/")[4] for _, p, _ in fwd.lost] == ["data", "manifest"]
    assert [s for _, _, s in fwd.lost] == [200, 200]
    fresh = Warehouse.open(uri).table("t")
    assert sorted(fresh.scan().read_all().column("k").to_pylist()) == [0, 1, 2, 4]

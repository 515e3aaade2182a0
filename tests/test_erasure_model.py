"""Model test of erasure (issue 16): random sequences of appends, DV and splice deletes, purges
with and without ``expire``, compactions, expiries, failed runs (fault-injected store) and
concurrent readers, on the local store and on S3 (moto).

Every row carries a unique marker value. After every successful ``purge(expire=True)`` the
whole warehouse is scanned (each Parquet file decoded, every manifest and DV read, plus the raw
bytes of every object, certificates and the key object included): none of the deleted rows'
markers may be anywhere, and the purge must say ``erased``. The table's rows always equal the
model's. A failing example prints ``replay: seed=... ops=...``.

``FLIGHTSRV_ERASURE_EXAMPLES`` raises the number of examples (the ``slow`` test runs more).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightsrv import Warehouse
from flightsrv.errors import ObjectNotFound, StoreError, VersionNotFound
from flightsrv.runtime import IdSource, ManualClock, Runtime
from flightsrv.store.faults import FaultPlan, FaultyStore
from flightsrv.table.chunks import ChunkStore
from flightsrv.table.deletes import read_dv
from flightsrv.table.manifest import Manifest

SCHEMA = pa.schema([("id", pa.int64()), ("marker", pa.string())])

FAULTABLE = ["append", "dv", "splice", "purge", "purge_expire", "compact"]
OP = st.one_of(
    st.tuples(st.just("append"), st.integers(20, 300)),
    st.tuples(st.just("dv"), st.integers(2, 7), st.integers(0, 6)),
    st.tuples(st.just("splice"), st.integers(0, 999), st.integers(1, 120)),
    st.tuples(st.just("purge"), st.booleans()),
    st.tuples(st.just("compact"), st.sampled_from([0.0, 0.3])),
    st.tuples(st.just("expire"), st.integers(1, 3)),
    st.tuples(st.just("fail"), st.sampled_from(FAULTABLE), st.integers(1, 8), st.booleans()),
    st.tuples(st.just("reader"),),
)


class Model:
    def __init__(self, uri: str, seed: int):
        self.seed = seed
        self.rt = Runtime(clock=ManualClock(int(time.time() * 1000)),
                          ids=IdSource(random.Random(seed)), rng=random.Random(seed))
        self.wh = Warehouse.open(uri, self.rt)
        self.t = self.wh.create_table("m", SCHEMA, {"compression": "none",
                                                    "row_group_bytes": 1024})
        self.next_id = 0
        self.live: dict[int, str] = {}
        self.deleted: set[str] = set()  # markers of rows that were live, then deleted
        self.readers: list = []
        self.purged_clean = 0

    def marker(self, i: int) -> str:
        return f"mk{self.seed:x}x{i:06d}y"

    # -- operations (on a given table view, so a faulty store can be used) -------------
    def rows(self, n: int) -> pa.Table:
        ids = list(range(self.next_id, self.next_id + n))
        return pa.table({"id": ids, "marker": [self.marker(i) for i in ids]}, schema=SCHEMA)

    def run(self, table, op) -> None:
        kind = op[0]
        if kind == "append":
            data = self.rows(op[1])
            self.next_id += op[1]
            table.append(data)
        elif kind == "dv":
            m, k = op[1], op[2] % op[1]
            table.delete(f"id % {m} = {k}")
        elif kind == "splice":
            lo = op[1] % max(1, self.next_id)
            table.delete(f"id >= {lo} AND id < {lo + op[2]}", mode="splice")
        elif kind == "purge":
            r = table.purge(expire=op[1], grace=0)
            if op[1]:
                assert r.complete, r.verification.pending
                self.purged_clean += 1
        elif kind == "purge_expire":
            r = table.purge(expire=True, grace=0)
            assert r.complete, r.verification.pending
        elif kind == "compact":
            table.compact(min_deleted_fraction=op[1])
        elif kind == "expire":
            table.expire_snapshots(retain_last=op[1])

    def expected_after(self, op) -> set[int] | None:
        """Live ids after ``op`` succeeds (None: unchanged)."""
        kind = op[0]
        if kind == "dv":
            m, k = op[1], op[2] % op[1]
            return {i for i in self.live if i % m != k}
        if kind == "splice":
            lo = op[1] % max(1, self.next_id)
            return {i for i in self.live if not lo <= i < lo + op[2]}
        return None

    def apply(self, after: set[int]) -> None:
        for i in set(self.live) - after:
            self.deleted.add(self.live.pop(i))

    def step(self, op) -> None:
        if op[0] == "reader":
            self.start_reader()
            return
        if op[0] == "fail":
            self.failed_run(op[1], op[2], op[3])
        else:
            before_next = self.next_id
            after = self.expected_after(op)
            self.run(self.t, op)
            if op[0] == "append":
                self.live.update({i: self.marker(i) for i in range(before_next, self.next_id)})
            if after is not None:
                self.apply(after)
        self.check_rows()
        if op[0] == "purge" and op[1]:
            self.check_no_deleted_marker_stored()
        self.join_readers()

    def failed_run(self, kind: str, nth: int, after_write: bool) -> None:
        """``kind`` on a store that fails its ``nth`` write (before it, or after it landed).
        The table must be either as before or as after the operation; the model follows."""
        plan = FaultPlan(**{"fail_after_at" if after_write else "fail_before_at": nth})
        store = FaultyStore(self.wh.store, plan)
        view = Warehouse(store, self.rt).table("m")
        op = {"append": ("append", 40), "dv": ("dv", 3, nth % 3),
              "splice": ("splice", nth * 37, 60), "purge": ("purge", False),
              "purge_expire": ("purge_expire",), "compact": ("compact", 0.0)}[kind]
        before = set(self.live)
        before_next = self.next_id
        after = self.expected_after(op)
        try:
            self.run(view, op)
            failed = False
        except StoreError:
            failed = True
        actual = set(self.t.to_table(columns=["id"])["id"].to_pylist())
        if kind == "append":
            new = set(range(before_next, self.next_id))
            assert actual in (before, before | new), (kind, failed)
            if actual == before | new:
                self.live.update({i: self.marker(i) for i in new})
        elif after is not None:
            assert actual in (before, after), (kind, failed)
            self.apply(actual)
        else:
            assert actual == before, (kind, failed)

    def start_reader(self) -> None:
        snap = self.t.snapshot()
        want = sorted(self.live)
        box: dict = {}
        go = threading.Event()

        def read():
            go.set()
            try:
                box["ids"] = sorted(snap.to_table(columns=["id"])["id"].to_pylist())
            except (ObjectNotFound, VersionNotFound) as exc:  # its files were erased
                box["error"] = exc

        th = threading.Thread(target=read)
        th.start()
        go.wait()
        self.readers.append((th, box, want))

    def join_readers(self) -> None:
        for th, box, want in self.readers:
            th.join(60)
            assert not th.is_alive()
            assert "error" in box or box["ids"] == want, "a pinned reader saw other rows"
        self.readers.clear()

    def check_rows(self) -> None:
        got = self.t.to_table(columns=["id", "marker"])
        assert sorted(got["id"].to_pylist()) == sorted(self.live)
        assert self.t.count_rows() == len(self.live)
        assert set(got["marker"].to_pylist()) == set(self.live.values())

    def check_no_deleted_marker_stored(self) -> None:
        if not self.deleted:
            return
        store = self.wh.store
        seen = []
        for meta in store.list(""):
            raw = store.get(meta.key)[0]
            text = raw.decode("latin-1")
            hits = [m for m in self.deleted if m in text]
            assert not hits, f"{meta.key} holds deleted markers {hits[:3]} (raw bytes)"
            if meta.key.endswith(".parquet"):
                t = pq.read_table(pa.BufferReader(raw))
                values = set(t["marker"].to_pylist())
                assert not values & self.deleted, f"{meta.key} holds deleted rows"
            elif "/manifest/" in meta.key:
                m = Manifest.from_json(raw, key=meta.key, chunks=ChunkStore(self.t.store, "m"))
                blob = json.dumps(m.summary) + json.dumps([f.stats for f in m.data_files])
                assert not any(x in blob for x in self.deleted), meta.key
                for f in m.data_files:  # every DV this manifest names decodes
                    if f.dv is not None:
                        read_dv(self.t.store, f.dv, table="m", data_file=f.path)
            seen.append(meta.key)
        assert any("/manifest/" in k for k in seen)


def run_model(uri: str, seed: int, ops) -> Model:
    m = Model(uri, seed)
    try:
        m.step(("append", 300))
        m.step(("append", 200))
        for op in ops:
            m.step(op)
        m.step(("purge", True))  # every sequence ends erased
        assert m.purged_clean >= 1
    except BaseException:
        print(f"replay: seed={seed} ops={[('append', 300), ('append', 200), *ops]}")
        raise
    finally:
        m.join_readers()
    return m


EXAMPLES = int(os.environ.get("FLIGHTSRV_ERASURE_EXAMPLES", "12"))


def _settings(n):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@_settings(EXAMPLES)
@given(seed=st.integers(0, 2**31), ops=st.lists(OP, min_size=2, max_size=10))
def test_erasure_model_local(tmp_path, seed, ops):
    run_model(str(tmp_path / uuid.uuid4().hex), seed, ops)


@pytest.mark.s3
@_settings(max(3, EXAMPLES // 4))
@given(seed=st.integers(0, 2**31), ops=st.lists(OP, min_size=2, max_size=6))
def test_erasure_model_s3(s3_uri, seed, ops):
    run_model(f"{s3_uri}/{uuid.uuid4().hex[:8]}", seed, ops)


@pytest.mark.slow
@_settings(EXAMPLES * 8)
@given(seed=st.integers(0, 2**31), ops=st.lists(OP, min_size=4, max_size=20))
def test_erasure_model_local_long(tmp_path, seed, ops):
    run_model(str(tmp_path / uuid.uuid4().hex), seed, ops)


def test_erasure_model_fixed_sequence(local_uri):
    """One sequence that surely hits every path, whatever hypothesis draws."""
    m = run_model(local_uri, 7, [
        ("dv", 5, 1), ("reader",), ("purge", False), ("append", 100), ("splice", 10, 50),
        ("compact", 0.0), ("dv", 3, 2), ("fail", "purge_expire", 3, False), ("reader",),
        ("purge", True), ("append", 50), ("dv", 2, 0), ("expire", 1),
        ("fail", "compact", 1, True), ("fail", "splice", 2, True), ("purge", True),
        ("fail", "dv", 2, False), ("fail", "append", 1, True),
    ])
    assert m.deleted and m.purged_clean >= 3

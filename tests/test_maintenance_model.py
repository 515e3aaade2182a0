"""Model test: random sequences of append, delete, compaction (plain, sorted, racing a
delete), snapshot expiry and vacuum against an in-memory reference, on the local store and
on S3 (moto). Every read equals the model; no object a retained version references is ever
deleted; time travel to an expired version names the oldest retained one."""

from __future__ import annotations

import datetime as dt
import itertools
import random
import time
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import Hook

from flightsrv import Warehouse
from flightsrv.errors import VersionNotFound
from flightsrv.runtime import IdSource, ManualClock, Runtime

SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.int64()), ("val", pa.float64())])
HOUR_MS = 3_600_000

PREDICATES = [
    (lambda k: f"grp = {k % 5}", lambda k: lambda r: r["grp"] == k % 5),
    (lambda k: f"id % 3 = {k % 3}", lambda k: lambda r: r["id"] % 3 == k % 3),
    (lambda k: f"id BETWEEN {k} AND {k + 60}", lambda k: lambda r: k <= r["id"] <= k + 60),
    (lambda k: f"val < {k % 50}", lambda k: lambda r: r["val"] < k % 50),
]
pred = st.tuples(st.integers(0, len(PREDICATES) - 1), st.integers(0, 300))

op = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 120)),
    st.tuples(st.just("delete"), pred),
    st.tuples(st.just("compact"), st.sampled_from(["default", "all", "sort"])),
    st.tuples(st.just("compact_racing_delete"), pred),
    st.tuples(st.just("compact_racing_file_delete"), st.integers(0, 10**6)),
    st.tuples(st.just("expire"), st.integers(1, 3)),
    st.tuples(st.just("vacuum"), st.just(0)),
    st.tuples(st.just("time_travel"), st.integers(0, 10**6)),
)


def key(rows):
    return sorted(rows, key=lambda r: r["id"])


def retained_refs(t) -> set[str]:
    refs = set()
    for v in t.log.versions():
        for f in t.log.load(v).data_files:
            refs.add(f.path)
            if f.dv is not None and f.dv.storage == "object":
                refs.add(f.dv.path)
    return refs


def existing(t) -> set[str]:
    return {m.key for p in ("data/", "tombstone/") for m in t.store.list(p)}


def run_model(uri: str, ops, seed: int = 0) -> None:
    rt = Runtime(clock=ManualClock(int(time.time() * 1000)), ids=IdSource(random.Random(seed)),
                 rng=random.Random(seed))
    wh = Warehouse.open(uri, rt)
    table = wh.create_table("m", SCHEMA, {"row_group_bytes": 1024})
    # an independent writer (own manifest cache, own clock) sharing the store's client
    rival = Warehouse(wh.store, Runtime()).table("m")
    model: list[dict] = []
    history = {0: []}
    next_id = itertools.count()

    def delete(t, p, k):
        sql, ref = PREDICATES[p][0](k), PREDICATES[p][1](k)
        gone = [r for r in model if ref(r)]
        assert t.delete(sql) == len(gone), sql
        return [r for r in model if not ref(r)]

    for o in ops:
        kind = o[0]
        if kind == "append":
            new = [{"id": i, "grp": (i * 7) % 5, "val": float((i * 13) % 97)}
                   for i in (next(next_id) for _ in range(o[1]))]
            table.append(pa.Table.from_pylist(new, schema=SCHEMA))
            model = model + new
        elif kind == "delete":
            model = delete(table, *o[1])
        elif kind == "compact":
            kw = {"all": {"min_deleted_fraction": 0.0}, "sort": {"sort_by": ["val", "id"]}}
            table.compact(**kw.get(o[1], {}))
        elif kind == "compact_racing_delete":
            after = {}

            def race(o=o, after=after):
                after["rows"] = delete(rival, *o[1])

            r = table.compact(min_deleted_fraction=0.0, progress=Hook(race))
            if "rows" not in after:  # nothing to compact: no read happened; delete serially
                after["rows"] = delete(table, *o[1])
            elif r.version is not None:
                history[r.version - 1] = after["rows"]
            model = after["rows"]
        elif kind == "compact_racing_file_delete":
            # a delete that empties one whole data file (its id range, which may take rows
            # of other files too) while compaction runs: the group that read the file
            # carries it over as deleted (files_emptied) rather than aborting
            after = {}

            def race(o=o, after=after, model=model):
                head = rival.head()
                if not head.data_files:
                    after["rows"] = model
                    return
                f = head.data_files[o[1] % len(head.data_files)]
                bounds = head.column_stats(f, "id")
                lo, hi = bounds["min"], bounds["max"]
                gone = [r for r in model if lo <= r["id"] <= hi]
                assert rival.delete(f"id BETWEEN {lo} AND {hi}") == len(gone)
                after["rows"] = [r for r in model if not lo <= r["id"] <= hi]

            r = table.compact(min_deleted_fraction=0.0, progress=Hook(race))
            if "rows" in after:
                if r.version is not None:
                    history[r.version - 1] = after["rows"]
                model = after["rows"]
        elif kind == "expire":
            r = table.expire_snapshots(retain_last=o[1])
            for v in r.expired_versions:
                history.pop(v, None)
            oldest = min(table.log.versions())
            if oldest > 0:
                with pytest.raises(VersionNotFound, match=f"oldest_retained={oldest}"):
                    table.snapshot(version=oldest - 1)
        elif kind == "vacuum":
            refs = retained_refs(table)
            rt.clock.advance(HOUR_MS)
            r = table.vacuum(grace=dt.timedelta(0))
            gone = {x["key"] for x in r.objects}
            assert not gone & refs, "vacuum deleted a referenced object"
            assert refs <= existing(table)
            assert existing(table) == refs  # grace 0, no writers: nothing unreferenced left
            oldest = min(table.log.versions())
            if oldest in history:
                assert key(table.to_table(version=oldest).to_pylist()) == key(history[oldest])
        elif kind == "time_travel":
            vs = sorted(v for v in history if v in set(table.log.versions()))
            v = vs[o[1] % len(vs)]
            assert key(table.to_table(version=v).to_pylist()) == key(history[v]), v
        head = table.head()
        history[head.version] = list(model)
        assert key(table.to_table().to_pylist()) == key(model), o
        assert table.count_rows() == len(model)
    assert key(Warehouse(wh.store).table("m").to_table().to_pylist()) == key(model)


def settings_(n):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@settings_(20)
@given(st.lists(op, min_size=3, max_size=10))
def test_model_local(tmp_path, ops):
    run_model(str(tmp_path / uuid.uuid4().hex), ops)


@settings_(8)
@given(st.lists(op, min_size=3, max_size=8))
def test_model_s3(s3_uri, ops):
    run_model(f"{s3_uri}/{uuid.uuid4().hex[:8]}", ops)


def test_model_fixed_sequence(local_uri):
    """One sequence that surely hits every path, whatever hypothesis draws."""
    run_model(local_uri, [
        ("append", 100), ("append", 50), ("delete", (1, 0)), ("compact_racing_delete", (0, 2)),
        ("append", 30), ("delete", (2, 10)), ("compact", "sort"), ("time_travel", 3),
        ("expire", 2), ("vacuum", 0), ("delete", (3, 20)), ("compact", "all"),
        ("expire", 1), ("vacuum", 0), ("time_travel", 0),
    ])

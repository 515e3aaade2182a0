"""DuckEngine internals that clients only see indirectly: group commit of concurrent appends
and coalescing of small result batches."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from pyarrow import flight

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.engine.stream import coalesce as _coalesce
from flightsrv.errors import (
    CommitConflict,
    CorruptObject,
    ObjectNotFound,
    SqlError,
    TableExists,
)
from flightsrv.server.status import to_flight_error
from flightsrv.store import open_store
from flightsrv.store.faults import FaultPlan, FaultyStore

SCHEMA = pa.schema([("id", pa.int64()), ("who", pa.string())])


def _holding_first_write(tmp_path, matches, pattern):
    """A warehouse with table ``g`` whose first write (after the table's creation) of a key
    that ``matches`` waits until ``gate`` is set; ``held`` then names that key."""
    gate, armed, held = threading.Event(), [], []

    def hold_first(op, key):
        if armed and matches(key) and not held:
            held.append(key)
            assert gate.wait(30)

    plan = FaultPlan(before_write=hold_first, key_pattern=pattern)
    wh = Warehouse(FaultyStore(open_store(str(tmp_path / "wh")), plan))
    wh.create_table("g", SCHEMA)
    armed.append(True)
    return wh, gate, held


def test_concurrent_inserts_share_one_commit(tmp_path):
    """The first INSERT's manifest write is held until three more INSERTs queue behind it;
    those three then land in one version together."""
    wh, gate, held = _holding_first_write(tmp_path, lambda key: "/manifest/v" in key,
                                          "manifest/v")
    engine = DuckEngine(wh)
    errors, counts = [], {}

    def insert(i):
        try:
            counts[i] = engine.execute_update(
                f"INSERT INTO g VALUES ({i}, 'w{i}'), ({i + 100}, 'w{i}')", Session(f"s{i}"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    first = threading.Thread(target=insert, args=(0,))
    first.start()
    while not held:  # the first commit is in flight
        first.join(0.01)
    others = [threading.Thread(target=insert, args=(i,)) for i in (1, 2, 3)]
    for t in others:
        t.start()
    table = wh.table("g")
    while engine.committer.waiting(table) < 3:
        assert all(t.is_alive() for t in others), errors
        first.join(0.01)
    gate.set()
    for t in [first, *others]:
        t.join(30)
    assert not errors, errors
    assert counts == {0: 2, 1: 2, 2: 2, 3: 2}
    history = table.history()
    assert [h["operation"] for h in history[:2]] == ["append", "append"]
    assert history[0].get("group_commit") == 3 and history[0]["rows_added"] == 6
    assert history[1]["rows_added"] == 2 and "group_commit" not in history[1]
    assert (engine.committer.commits, engine.committer.submissions) == (2, 4)
    got = table.to_table().sort_by("id")
    assert got["id"].to_pylist() == [0, 1, 2, 3, 100, 101, 102, 103]
    engine.close()


def test_group_commit_releases_at_the_commit_point(tmp_path):
    """A group's callers return, and the next group commits, as soon as its version lands:
    nobody waits for the previous leader's pointer write (a hint; issue 35's tail). The first
    INSERT's pointer write is held; a second INSERT commits and returns meanwhile, and the
    pointer still only moves forward."""
    wh, gate, held = _holding_first_write(tmp_path, lambda key: key.endswith(
        "_latest_manifest"), "_latest_manifest")
    engine = DuckEngine(wh)
    done = {}

    def insert(i):
        done[i] = engine.execute_update(f"INSERT INTO g VALUES ({i}, 'w{i}')", Session(f"s{i}"))

    first = threading.Thread(target=insert, args=(1,))
    first.start()
    while not held:  # the first version landed; its pointer write is in flight
        first.join(0.01)
    second = threading.Thread(target=insert, args=(2,))
    second.start()
    second.join(30)
    try:
        assert not second.is_alive() and done.get(2) == 1 and 1 not in done
        table = wh.table("g")
        assert sorted(table.to_table()["id"].to_pylist()) == [1, 2]
    finally:
        gate.set()
        first.join(30)
    assert done == {1: 1, 2: 1}
    ptr, _ = wh.table("g").log.read_pointer()
    assert ptr.version == wh.table("g").head().version
    assert engine.committer.commits == 2
    engine.close()


def test_group_commit_leaves_the_pointer_to_the_queued_group(tmp_path):
    """A leader that hands over to a queued group skips its own pointer write (the queued
    group's commit moves the pointer past it, PROTOCOL.md §6 step 5): one pointer write
    fewer, and the pointer ends at the head."""
    gate, armed, held, pointer_puts = threading.Event(), [], [], []

    def hook(op, key):
        if key.endswith("_latest_manifest"):
            pointer_puts.append(key)
        if armed and "/manifest/v" in key and not held:
            held.append(key)
            assert gate.wait(30)

    wh = Warehouse(FaultyStore(open_store(str(tmp_path / "wh")),
                               FaultPlan(before_write=hook)))
    wh.create_table("g", SCHEMA)
    engine = DuckEngine(wh)
    engine.execute_update("INSERT INTO g VALUES (0, 'w0')", Session("s0"))  # moves it
    pointer_puts.clear()
    armed.append(True)
    threads = [threading.Thread(target=engine.execute_update,
                                args=(f"INSERT INTO g VALUES ({i}, 'w{i}')", Session(f"s{i}")))
               for i in (1, 2)]
    threads[0].start()
    while not held:  # the first commit's root write is held
        threads[0].join(0.01)
    threads[1].start()
    table = wh.table("g")
    while engine.committer.waiting(table) < 1:
        threads[0].join(0.01)
    gate.set()
    for t in threads:
        t.join(30)
    head = wh.table("g").head()
    assert head.version == 3 and len(pointer_puts) == 1, pointer_puts
    ptr, _ = wh.table("g").log.read_pointer()
    assert ptr.version == head.version
    assert sorted(wh.table("g").to_table()["id"].to_pylist()) == [0, 1, 2]
    engine.close()


def test_group_commit_without_contention_is_one_commit_each(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    engine = DuckEngine(wh)
    s = Session("s")
    engine.execute_update("CREATE TABLE t (a BIGINT)", s)
    for i in range(3):
        assert engine.execute_update(f"INSERT INTO t VALUES ({i})", s) == 1
    assert engine.execute_update("INSERT INTO t SELECT 1 WHERE false", s) == 0
    assert [h["rows_added"] for h in wh.table("t").history()][:3] == [1, 1, 1]
    assert engine.committer.commits == 3
    engine.close()


def test_selective_query_streams_coalesced_batches(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("big", SCHEMA, {"row_group_bytes": "32768"})
    n = 200_000
    ids = pa.array(range(n), pa.int64())
    t.append(pa.table({"id": ids, "who": pa.array(["x"] * n)}, schema=SCHEMA))
    engine = DuckEngine(wh, batch_size=8192, min_batch_rows=8192)
    plain = DuckEngine(wh, batch_size=8192, min_batch_rows=1)
    sql = "SELECT id FROM big WHERE id % 50 = 0"
    got = engine.execute_query(sql, Session("s")).reader
    sizes = [b.num_rows for b in got]
    raw = [b.num_rows for b in plain.execute_query(sql, Session("s")).reader]
    assert sum(sizes) == sum(raw) == n // 50
    assert all(s >= 8192 for s in sizes[:-1])
    assert len(sizes) < len(raw)
    engine.close()
    plain.close()


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.integers(0, 40), max_size=30), hs.integers(1, 50))
def test_coalesce_keeps_rows_and_order(sizes, min_rows):
    start, batches = 0, []
    for n in sizes:
        batches.append(pa.record_batch({"x": pa.array(range(start, start + n), pa.int64())}))
        start += n
    out = list(_coalesce(iter(batches), min_rows, 1 << 30))
    assert [v for b in out for v in b["x"].to_pylist()] == list(range(start))
    assert all(b.num_rows >= min_rows for b in out[:-1])
    assert all(b.num_rows for b in out)
    if batches and batches[0].num_rows >= min_rows:  # big enough: passed on, not copied
        assert out[0] is batches[0]


@pytest.mark.parametrize(("error", "flight_error"), [
    (CommitConflict("commit retries exhausted", table="t", attempts=30),
     flight.FlightUnavailableError),
    (CorruptObject("deletion vector CRC mismatch", object="t/tombstone/x.bin"),
     flight.FlightInternalError),
    (ObjectNotFound("no such key", key="t/data/x.parquet"), flight.FlightInternalError),
    (TableExists("table already exists", table="t"), pa.ArrowInvalid),
])
def test_error_mapping_keeps_class_name_and_context(error, flight_error):
    got = to_flight_error(error, statement="SELECT 1")
    assert isinstance(got, flight_error)
    assert str(got).startswith(type(error).__name__ + ":")
    assert all(f"{k}={v}" in str(got) for k, v in error.context.items())


@pytest.mark.parametrize("error, limit", [
    (SqlError("Out of Memory Error: failed to allocate data of size 1.4 GiB"), True),
    (MemoryError(), True),
    # the statement's own text in the message is not the engine running out of memory
    (SqlError("Conversion Error: Could not convert string 'Allocation failure' to INT32"),
     False),
    (SqlError("Invalid Input Error: Out of Memory Error: Allocation failure"), False),
])
def test_only_running_out_of_memory_is_the_memory_limit(error, limit):
    got = to_flight_error(error, statement="SELECT 1")
    assert ("limit=memory_limit" in str(got)) == limit
    assert isinstance(got, flight.FlightUnavailableError if limit else pa.ArrowInvalid)


@pytest.mark.parametrize("max_bytes", [1, 64])
def test_coalesce_flushes_at_byte_limit(max_bytes):
    batches = [pa.record_batch({"x": pa.array([i] * 4, pa.int64())}) for i in range(5)]
    out = list(_coalesce(iter(batches), 1000, max_bytes))
    assert sum(b.num_rows for b in out) == 20
    assert len(out) == (5 if max_bytes == 1 else 3)

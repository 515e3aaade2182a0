"""Views kept between statements (issue 32): a query whose relations read data files by path
and nothing else runs on a kept cursor that still holds views of the same bodies, so a
repeated point query registers nothing; what is kept never outlives what it means (a
delete or an append is a new body; a relation with deleted rows is never kept), a
cancelled or failed statement's cursors are closed, and the kept cursors are bounded in
number and in bytes of view text."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.engine.api import Cancel
from flightsrv.errors import QueryCancelled

N = 1000
PER_FILE = 250
POINT = "SELECT * FROM items WHERE id = ?"


def _items(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64()),
                     "grp": pa.array([f"g{i % 5}" for i in range(lo, hi)])})


@pytest.fixture
def wh(tmp_path):
    w = Warehouse.open(str(tmp_path / "wh"))
    t = w.create_table("items", _items(0, 1).schema)
    for lo in range(0, N, PER_FILE):  # four files, ids sorted: a point query keeps one
        t.append(_items(lo, lo + PER_FILE))
    return w


@pytest.fixture
def engine(wh):
    e = DuckEngine(wh, mask_extension=False)
    yield e
    e.close()


def _param(v) -> pa.RecordBatch:
    return pa.record_batch([pa.array([v], pa.int64())], names=["0"])


def _point(engine, v, session=None) -> list:
    return engine.execute_query(POINT, session or Session("s"), _param(v)).reader \
        .read_all().to_pylist()


def _catalog(engine) -> list[tuple[int, int]]:
    """(cursor id, catalog version) of each idle kept cursor: a CREATE or DROP on one
    raises its version."""
    return sorted((id(k), k.cur._catalog_version()) for k in engine._views._idle)


def test_a_repeated_point_query_registers_nothing(engine):
    for v in (0, 300, 600, 900, 5):  # one body per file
        assert _point(engine, v) == [{"id": v, "grp": f"g{v % 5}"}]
    before = _catalog(engine)
    assert 1 <= len(before) <= engine._views.max_cursors
    for v in (1, 301, 601, 901, 7, 250, 999):  # every file's view is still kept
        assert _point(engine, v) == [{"id": v, "grp": f"g{v % 5}"}]
    assert _catalog(engine) == before


def test_a_kept_view_never_reads_a_deleted_row(engine, wh):
    assert _point(engine, 42) == [{"id": 42, "grp": "g2"}]
    wh.table("items").delete("id = 42")
    assert _point(engine, 42) == []
    assert _point(engine, 43) == [{"id": 43, "grp": "g3"}]
    # the file with the deleted row is read with its mask on a cursor that is not kept
    for k in engine._views._idle:
        assert all("__fsrv" not in body for body in k.views.values())
    wh.table("items").append(_items(N, N + 10))  # a new version and a new file
    assert _point(engine, N + 3) == [{"id": N + 3, "grp": f"g{(N + 3) % 5}"}]
    assert _point(engine, 42) == []


def test_a_new_version_is_a_new_body(engine, wh):
    assert _point(engine, 10) == [{"id": 10, "grp": "g0"}]
    # replaced rows: a new file under a new key, the old one hidden by a deletion vector
    s = Session("w")
    engine.execute_update("UPDATE items SET grp = 'new' WHERE id = 10", s)
    assert _point(engine, 10) == [{"id": 10, "grp": "new"}]
    assert _point(engine, 11) == [{"id": 11, "grp": "g1"}]


def test_a_cancelled_statement_keeps_no_cursor(engine):
    _point(engine, 1)
    idle = len(engine._views._idle)
    cancel = Cancel()
    result = engine.execute_query(POINT, Session("s"), _param(2), cancel=cancel)
    cancel.cancel()
    with pytest.raises(QueryCancelled):
        result.reader.read_all()
    assert len(engine._views._idle) == idle - 1  # the one it took was closed
    assert _point(engine, 2) == [{"id": 2, "grp": "g2"}]


def test_a_failed_statement_keeps_no_cursor(engine):
    _point(engine, 1)
    idle = len(engine._views._idle)
    with pytest.raises(Exception, match="(?i)divi|zero|range"):
        engine.execute_query("SELECT CAST(1 / (id - id) AS INTEGER) FROM items "
                             "WHERE id = ?", Session("s"), _param(3)).reader.read_all()
    assert len(engine._views._idle) <= idle


def test_kept_cursors_are_bounded_in_number_and_bytes(engine, wh):
    engine._views.max_cursors = 2
    for v in (0, 300, 600, 900, 0, 300, 600, 900):
        assert _point(engine, v) == [{"id": v, "grp": f"g{v % 5}"}]
        assert len(engine._views._idle) <= 2
    small = DuckEngine(wh, mask_extension=False)
    small._views.max_bytes = 10  # no view text fits: a cursor that holds one is closed
    try:
        for v in (1, 700, 1):
            assert _point(small, v) == [{"id": v, "grp": f"g{v % 5}"}]
            assert all(k.size <= 10 for k in small._views._idle)
    finally:
        small.close()
    engine.close()  # a cursor handed back after close is closed, not kept
    assert not engine._views._idle


def test_concurrent_statements_share_the_kept_cursors(engine):
    import concurrent.futures as cf

    engine._views.max_cursors = 4
    ids = [(t * 37 + k * 211) % N for t in range(8) for k in range(15)]
    with cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda v: _point(engine, v), ids))
    assert got == [[{"id": v, "grp": f"g{v % 5}"}] for v in ids]
    assert len(engine._views._idle) <= 4


def test_results_match_a_fresh_engine_whatever_was_kept(wh):
    """Statements over the same and over different tables and columns, interleaved, on a
    kept engine and on one that keeps nothing: the same rows."""
    t2 = wh.create_table("other", _items(0, 1).schema)
    t2.append(_items(0, 50))
    statements = [
        (POINT, 5), ("SELECT grp FROM items WHERE id = ?", 5),
        ("SELECT id FROM other WHERE id = ?", 7), (POINT, 700),
        ("SELECT a.id, b.grp FROM items a JOIN other b ON a.id = b.id WHERE a.id = ?", 8),
        ("SELECT count(*) AS n FROM items WHERE id >= ?", 100), (POINT, 5),
    ]
    kept = DuckEngine(wh, mask_extension=False)
    plain = DuckEngine(wh, mask_extension=False)
    plain._views.max_cursors = 0
    try:
        for sql, v in statements * 2:
            a = kept.execute_query(sql, Session("s"), _param(v)).reader.read_all()
            b = plain.execute_query(sql, Session("s"), _param(v)).reader.read_all()
            assert a.to_pylist() == b.to_pylist(), sql
        assert not plain._views._idle
    finally:
        kept.close()
        plain.close()

"""What the statement path keeps between statements (issue 32): a repeated prepare of the
same text over the same table schemas recomputes nothing; what it keeps follows the tables
(a new head is read by every execution, a changed schema is described anew); the caches are
bounded by bytes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.engine import plancache
from flightsrv.sql import binder
from flightsrv.sql import plan as sqlplan

N = 1000
ITEMS = pa.table({"id": pa.array(range(N), pa.int64()),
                  "grp": pa.array([f"g{i % 5}" for i in range(N)])})
POINT = "SELECT * FROM items WHERE id = ?"


@pytest.fixture
def wh(tmp_path):
    w = Warehouse.open(str(tmp_path / "wh"))
    w.create_table("items", ITEMS.schema).append(ITEMS)
    return w


@pytest.fixture
def engine(wh):
    e = DuckEngine(wh)
    yield e
    e.close()


def _param(v) -> pa.RecordBatch:
    return pa.record_batch([pa.array([v])], names=["0"])


def _counting(monkeypatch, module, name) -> list:
    calls: list = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_repeated_prepare_binds_and_plans_nothing(engine, monkeypatch):
    s = Session("s")
    first = engine.prepare(POINT, s)
    first_bound = engine.prepare(POINT, s, _param(5))  # GetFlightInfo after DoPut's bind
    binds = _counting(monkeypatch, binder, "bind")
    plans = _counting(monkeypatch, sqlplan, "plan_query")
    for v in (1, 2, 3):
        again = engine.prepare(POINT, s)
        bound = engine.prepare(POINT, s, _param(v))
        assert again.dataset_schema == first.dataset_schema == bound.dataset_schema \
            == first_bound.dataset_schema
        assert again.parameter_schema == first.parameter_schema
        assert again.parameter_schema.field(0).type == pa.int64()
    assert (len(binds), len(plans)) == (0, 0)


def test_a_parameter_that_types_a_result_column_is_described_once_per_type(engine,
                                                                         monkeypatch):
    """``SELECT ? AS v ...``: the result schema follows the bound value's type (a DoPut
    binding an integer, then a string, then a decimal); values of a type already seen are
    not described again (a new value each execution, as an ORM's ``select(literal(x))``
    sends), and an untyped NULL is a type of its own."""
    import decimal

    s = Session("s")
    sql = "SELECT ? AS v, count(*) AS n FROM items"

    def schema(v, t=None):
        return engine.prepare(sql, s, pa.record_batch([pa.array([v], t)], names=["0"])
                              ).dataset_schema.field("v").type

    assert schema(5) == pa.int64()
    binds = _counting(monkeypatch, binder, "bind")
    for v in (6, 7, 8):
        assert schema(v) == pa.int64()
    assert binds == []
    described = []
    for v, t, want in (("x", None, pa.string()), (decimal.Decimal("1.50"), pa.decimal128(9, 2),
                                                   pa.decimal128(9, 2)),
                       (1.5, None, pa.float64())):
        before = len(binds)
        assert schema(v, t) == want
        described.append(len(binds) > before)
        before = len(binds)
        assert schema(v, t) == want  # the same type again: kept
        assert len(binds) == before
    assert described == [True, True, True]
    before = len(binds)
    assert schema(None) != pa.int64()
    assert len(binds) > before


def test_what_a_prepare_keeps_follows_the_tables(engine, wh):
    s = Session("s")
    before = engine.prepare(POINT, s)
    assert before.dataset_schema.names == ["id", "grp"]
    engine.execute_update("ALTER TABLE items ADD COLUMN note VARCHAR", s)
    assert engine.prepare(POINT, s).dataset_schema.names == ["id", "grp", "note"]
    # the same name, another table: parameter types are those of the new one
    engine.execute_update("CREATE OR REPLACE TABLE items (id VARCHAR, grp VARCHAR)", s)
    now = engine.prepare(POINT, s)
    assert now.parameter_schema.field(0).type == pa.string()
    assert now.dataset_schema.field("id").type == pa.string()


def test_every_execution_reads_the_head(engine):
    s = Session("s")

    def point(v):
        engine.prepare(POINT, s)
        engine.prepare(POINT, s, _param(v))
        return engine.execute_query(POINT, s, _param(v)).reader.read_all().to_pylist()

    assert point(7) == [{"id": 7, "grp": "g2"}]
    assert point(N + 1) == []
    engine.execute_update(f"INSERT INTO items VALUES ({N + 1}, 'new')", s)
    assert point(N + 1) == [{"id": N + 1, "grp": "new"}]
    engine.execute_update("DELETE FROM items WHERE id = 7", s)
    assert point(7) == []
    # time travel still reads its own version
    old = "SELECT count(*) AS n FROM items AT (VERSION => 1) WHERE id = ?"
    assert engine.execute_query(old, s, _param(7)).reader.read_all().column("n")[0].as_py() == 1


def test_the_statement_cache_is_bounded_by_bytes():
    cache = plancache.StatementCache(max_bytes=20_000)
    for i in range(500):
        text = f"SELECT {i} FROM t" + " " * 100
        cache.put(text, i, text, size=50)
    assert 0 < cache.bytes <= 20_000
    assert len(cache) < 500
    assert cache.get("SELECT 499 FROM t" + " " * 100) == 499  # the most recent stays
    long = "x" * (plancache.MAX_CACHED_TEXT + 1)
    cache.put(long, 1, long)
    assert cache.get(long) is None


def test_a_long_statement_is_described_but_not_kept(engine):
    s = Session("s")
    ids = ", ".join(str(i) for i in range(20_000))
    sql = f"SELECT id FROM items WHERE id IN ({ids})"
    assert len(sql) > plancache.MAX_CACHED_TEXT
    held = engine._prepared.bytes
    assert engine.prepare(sql, s).dataset_schema.names == ["id"]
    assert engine._prepared.bytes == held
    engine.prepare(POINT, s)
    assert engine._prepared.bytes > held


def test_a_repeated_execution_plans_nothing_but_is_still_guarded(engine, monkeypatch):
    from flightsrv.engine import guard

    s = Session("s")
    assert engine.execute_query(POINT, s, _param(3)).reader.read_all().num_rows == 1
    binds = _counting(monkeypatch, binder, "bind")
    plans = _counting(monkeypatch, sqlplan, "plan_query")
    checks = _counting(monkeypatch, guard, "verify")
    for v in (4, 5, -1, None):
        got = engine.execute_query(POINT, s, _param(pa.scalar(v, pa.int64()))).reader.read_all()
        assert got.column("id").to_pylist() == ([v] if v is not None and v >= 0 else [])
    # only the NULL is a new key (parameter validity: it makes no pruning hint)
    assert (len(binds), len(plans)) == (1, 1)
    assert len(checks) == 4


QUERIES = [
    ("SELECT * FROM items WHERE id = ?", [[5], [-3], [999], [10**6]]),
    ("SELECT id FROM items WHERE id < ? AND grp = ?", [[50, "g1"], [900, "g3"], [-1, "g0"]]),
    ("SELECT count(*) AS n FROM items WHERE id BETWEEN ? AND ?", [[10, 20], [700, 20], [0, 999]]),
    ("SELECT id FROM items WHERE id IN (?, 800, ?) ORDER BY id", [[1, 2], [800, 999], [5, 5]]),
    ("SELECT a.id FROM items a JOIN items b ON a.id = b.id WHERE a.id = ? AND b.id >= ?",
     [[10, 0], [900, 901], [500, 400]]),
    ("SELECT id FROM items WHERE (id) = ? OR grp = 'g4' ORDER BY id LIMIT 3", [[2], [7]]),
]


@pytest.mark.parametrize("sql,runs", QUERIES)
def test_a_kept_plan_reads_and_prunes_as_a_fresh_one(tmp_path, sql, runs):
    """Differential: the same statements on an engine that keeps plans (warmed with other
    values) and on fresh engines: same rows, same files and row groups skipped."""
    w = Warehouse.open(str(tmp_path / "wh"))
    t = w.create_table("items", ITEMS.schema, {"row_group_bytes": "2048"})
    for a in range(0, N, 250):  # 4 files, each with a few row groups
        t.append(ITEMS.slice(a, 250))
    kept = DuckEngine(w)
    s = Session("s")

    def run(engine, values):
        batch = pa.record_batch([pa.array([v]) for v in values],
                                names=[str(i) for i in range(len(values))])
        r = engine.execute_query(sql, s, batch)
        rows = r.reader.read_all().to_pylist()
        i = r.info
        return rows, (i.files_scanned, i.files_pruned, i.row_groups_pruned)

    try:
        run(kept, runs[0])
        assert len(kept._plans)  # the first execution kept its plan
        for values in runs:
            fresh = DuckEngine(w)
            try:
                assert run(kept, values) == run(fresh, values)
            finally:
                fresh.close()
    finally:
        kept.close()


@pytest.mark.parametrize("in_scan", [True, False])
def test_a_point_read_runs_once_per_execution_and_never_to_describe(engine, monkeypatch,
                                                                    in_scan):
    """A table with deleted rows, a point query: ADBC's prepare, prepare with the bound
    values, execute read its files once in all. With the deletion-mask extension the
    statement reads them itself (``LISTED_IN_SCAN``); without it (or with that off) the
    prefetch reads them ahead of the statement, which then reads no file."""
    import flightsrv.engine.duck as duck

    s = Session("s")
    engine.execute_update("DELETE FROM items WHERE id = 11", s)
    monkeypatch.setattr(duck, "LISTED_IN_SCAN", in_scan)
    in_scan = in_scan and engine.mask_slots is not None
    prefetches = _counting(monkeypatch, duck, "_prefetch")
    reads: list = []  # DuckDB runs that read a data file
    real = duck.run_to_arrow
    monkeypatch.setattr(duck, "run_to_arrow", lambda cur, text, **k: (
        reads.append(1) if "read_parquet(" in text or "__fsrv_scan(" in text else None)
        or real(cur, text, **k))
    for v in (10, 11, 12):
        engine.prepare(POINT, s)
        engine.prepare(POINT, s, _param(v))
        assert len(reads) == (v - 10)
        got = engine.execute_query(POINT, s, _param(v)).reader.read_all()
        assert got.column("id").to_pylist() == ([] if v == 11 else [v])
        assert len(reads) == v - 9
        assert len(prefetches) == (0 if in_scan else v - 9)


@pytest.mark.parametrize("sql, params", [
    ("SELECT (SELECT max(id) FROM items) FROM items WHERE id < 3", None),
    ("SELECT id IN (SELECT id FROM items) AS x, (SELECT count(*) FROM items i2 "
     "WHERE i2.id < items.id) FROM items WHERE id < 3", None),
    ("SELECT (SELECT max(grp) FROM items WHERE id = ?), id FROM items WHERE id = ?", [4, 5]),
])
def test_a_kept_plan_names_columns_as_the_first_execution(engine, sql, params):
    """A repeated query runs its kept plan, which must keep the relations' public names:
    DuckDB names a scalar subquery's column after its text, and the text it runs reads
    ``FROM __fsrv_r1 AS items``. Found by the slow differential test (seed 730384849): the
    second execution of a statement named its column ``(SELECT max(d) FROM __fsrv_r1 AS
    t)``, the first ``(SELECT max(d) FROM t)``, as DuckDB does."""
    import duckdb

    s = Session("s")
    batch = None if params is None else pa.record_batch(
        [pa.array([v]) for v in params], names=[str(i) for i in range(len(params))])
    names = [engine.execute_query(sql, s, batch).reader.read_all().column_names
             for _ in range(3)]
    duck = duckdb.connect()
    duck.register("items", ITEMS)
    want = duck.execute(sql, params).to_arrow_table().column_names if params else \
        duck.sql(sql).to_arrow_table().column_names
    assert names == [want] * 3
    assert not any("__fsrv" in n for n in names[0])


"""An INSERT whose rows DuckDB shaped for its pinned version, while ALTER TABLE adds, drops
or renames a column before the INSERT commits: appends commute with schema changes
(docs/PROTOCOL.md §14.3), so the rows commit under the schema they were written with and
the new column reads its default. They were checked against the newer head's columns and
refused with SchemaMismatch ("incoming columns do not match"): found in session 29 by a
concurrency run of INSERTs beside ALTERs; here the ALTER is made to land at that moment."""

from __future__ import annotations

import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session


@pytest.fixture
def engine(tmp_path):
    e = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    yield e
    e.close()


@pytest.mark.parametrize("alter", [
    "ALTER TABLE t ADD COLUMN c BIGINT DEFAULT 7",
    "ALTER TABLE t DROP COLUMN other",
    "ALTER TABLE t RENAME COLUMN other TO renamed",
])
@pytest.mark.parametrize("insert", [
    "INSERT INTO t (k, v) VALUES (2, 20)",
    "INSERT INTO t (k, v) SELECT 2, 20",
    "INSERT INTO t BY NAME SELECT 20 AS v, 2 AS k",
])
def test_an_insert_commits_when_a_column_changed_after_it_pinned(engine, monkeypatch,
                                                                 alter, insert):
    s = Session("s")
    engine.execute_update("CREATE TABLE t (k BIGINT, v BIGINT, other VARCHAR)", s)
    engine.execute_update("INSERT INTO t VALUES (1, 10, 'x')", s)
    writes = engine._writes
    real = type(writes).append
    fired = []

    def append(self, table, data, *args, **kw):
        if not fired:  # the rows are shaped: another statement changes the columns now
            fired.append(1)
            engine.execute_update(alter, Session("other"))
        return real(self, table, data, *args, **kw)

    monkeypatch.setattr(type(writes), "append", append)
    assert engine.execute_update(insert, s) == 1
    assert fired
    got = engine.execute_query("SELECT * FROM t ORDER BY k", s).reader.read_all().to_pylist()
    assert [r["k"] for r in got] == [1, 2] and [r["v"] for r in got] == [10, 20]
    if "ADD COLUMN" in alter:
        assert [r["c"] for r in got] == [7, 7]  # the default, for rows written before it
    elif "RENAME" in alter:
        assert [r["renamed"] for r in got] == ["x", None]
    else:
        assert "other" not in got[0]

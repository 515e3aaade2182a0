"""Time travel as Delta, Iceberg, Spark and Trino spell it (``VERSION AS OF n``, ``FOR
SYSTEM_TIME AS OF '...'``) is read as DuckDB's ``AT (...)`` clause (sql/asof.py), and only
where it is that clause: never inside a string, a quoted name or a comment, never a column
aliased ``of``."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flightsrv import Warehouse
from flightsrv.engine import DuckEngine, Session
from flightsrv.errors import SqlError
from flightsrv.sql.asof import canonical


@pytest.mark.parametrize("text, want", [
    ("SELECT * FROM t VERSION AS OF 1", "SELECT * FROM t AT (VERSION => 1)"),
    ("SELECT * FROM t FOR VERSION AS OF 12 AS x", "SELECT * FROM t AT (VERSION => 12) AS x"),
    ("SELECT * FROM t AS x for system_version as of 3", "SELECT * FROM t AS x AT (VERSION => 3)"),
    ("SELECT * FROM t TIMESTAMP AS OF '2026-01-01'",
     "SELECT * FROM t AT (TIMESTAMP => '2026-01-01')"),
    ("SELECT * FROM t FOR SYSTEM_TIME AS OF TIMESTAMP '2026-01-01 10:00:00'",
     "SELECT * FROM t AT (TIMESTAMP => '2026-01-01 10:00:00')"),
    ('SELECT * FROM "t" VERSION AS OF 3 JOIN main.u FOR VERSION AS OF 4 USING (id)',
     'SELECT * FROM "t" AT (VERSION => 3) JOIN main.u AT (VERSION => 4) USING (id)'),
])
def test_time_travel_clauses_become_at_clauses(text, want):
    assert canonical(text) == want


@pytest.mark.parametrize("text", [
    "SELECT version AS of FROM t",  # a column aliased "of"
    "SELECT 'x VERSION AS OF 1' FROM t",
    'SELECT "t VERSION AS OF 1" FROM t',
    "SELECT * FROM t -- VERSION AS OF 1",
    "SELECT * FROM t /* VERSION AS OF 1 */",
    "SELECT * FROM t VERSION AS OF 1.5",  # not a version number: DuckDB's error
    "SELECT * FROM t VERSION AS OF ?",
    "SELECT * FROM t TIMESTAMP AS OF now()",
    "SELECT * FROM t VERSION AS OF 'abc",  # unreadable text is DuckDB's to refuse
])
def test_anything_else_is_left_as_written(text):
    assert canonical(text) == text


@pytest.mark.parametrize("text, want", [
    ("TABLE t", "SELECT * FROM t"),
    ("(TABLE t) UNION ALL table u", "(SELECT * FROM t) UNION ALL SELECT * FROM u"),
    ("WITH x AS (TABLE t) TABLE x", "WITH x AS (SELECT * FROM t) SELECT * FROM x"),
    ("CREATE TABLE c AS TABLE t", "CREATE TABLE c AS SELECT * FROM t"),
    ("TABLE t VERSION AS OF 2", "SELECT * FROM t AT (VERSION => 2)"),
    ("INSERT INTO t BY POSITION SELECT 1", "INSERT INTO t  SELECT 1"),
    ("INSERT INTO t (a, b) by position VALUES (1, 2)", "INSERT INTO t (a, b)  VALUES (1, 2)"),
    # other TABLE keywords, BY elsewhere, strings: unchanged
    ("CREATE TABLE t (a INT)", None), ("DROP TABLE IF EXISTS t", None),
    ("SUMMARIZE TABLE t", None), ("TRUNCATE TABLE t", None), ("ALTER TABLE t DROP c", None),
    ("SELECT * FROM t ORDER BY position", None), ("SELECT 'TABLE t'", None),
    ("SELECT a FROM t GROUP BY POSITION", None),
])
def test_duckdb_shorthands_take_their_long_spelling(text, want):
    """``TABLE t`` is DuckDB's ``SELECT * FROM t``; an INSERT's ``BY POSITION`` its default
    (found in session 28: ``TABLE t`` failed with a syntax error at an ``AS`` the user never
    wrote, ``BY POSITION`` with sqlglot's)."""
    assert canonical(text) == (text if want is None else want)


def test_shorthands_and_drop_if_exists_run(tmp_path):
    e = DuckEngine(Warehouse.open(str(tmp_path / "wh")))
    s = Session("s")
    try:
        e.execute_update("CREATE TABLE t (a INT, b VARCHAR)", s)
        assert e.execute_update("INSERT INTO t BY POSITION SELECT 1, 'x'", s) == 1
        assert e.execute_update("INSERT INTO t (b, a) BY POSITION VALUES ('y', 2)", s) == 1
        assert e.execute_query("TABLE t ORDER BY a", s).reader.read_all().to_pylist() == \
            [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
        assert e.execute_update("CREATE TABLE c AS TABLE t", s) == 2
        # a name no table can have exists nowhere: IF EXISTS is a no-op, as in DuckDB
        for name in ('"Weird Tab"', '"1abc"', "nothere"):
            assert e.execute_update(f"DROP TABLE IF EXISTS {name}", s) == 0
        with pytest.raises(Exception, match="no such table"):
            e.execute_update('DROP TABLE "Weird Tab"', s)
    finally:
        e.close()


def test_a_delta_style_query_reads_the_version_it_names(tmp_path):
    wh = Warehouse.open(str(tmp_path / "wh"))
    t = wh.create_table("t", pa.schema([("id", pa.int64())]))
    t.append(pa.table({"id": pa.array(range(10), pa.int64())}))
    v = t.head().version
    t.delete("id < 4")
    e = DuckEngine(wh)
    s = Session("s")

    def count(sql):
        return e.execute_query(sql, s).reader.read_all().column(0)[0].as_py()

    try:
        assert count("SELECT count(*) FROM t") == 6
        assert count(f"SELECT count(*) FROM t VERSION AS OF {v}") == 10
        assert count("SELECT count(*) FROM t TIMESTAMP AS OF '2999-01-01T00:00:00Z'") == 6
        assert count(f"SELECT count(*) FROM t AS a FOR VERSION AS OF {v} "
                     f"JOIN t AS b USING (id)") == 6
        # a time before the table's first version
        with pytest.raises(Exception, match="no retained version at or before that time"):
            count("SELECT count(*) FROM t TIMESTAMP AS OF '2000-01-01T00:00:00Z'")
        with pytest.raises(SqlError, match="target of DELETE is always the latest"):
            e.execute_update(f"DELETE FROM t VERSION AS OF {v} WHERE id = 5", s)
        # the prepared form keeps the version it names
        p = e.prepare(f"SELECT count(*) FROM t VERSION AS OF {v}", s)
        assert count(p.sql) == 10
    finally:
        e.close()
